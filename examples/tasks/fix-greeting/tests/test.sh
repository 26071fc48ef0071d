#!/bin/sh
# Exit 0 when greet.sh greets properly, 1 otherwise.
out=$(sh ./greet.sh world)
if [ "$out" = "Hello, world!" ]; then echo "ok: $out"; exit 0; fi
echo "expected 'Hello, world!', got '$out'"; exit 1
