#!/bin/sh
# The hidden test uses its own data, so hard-coding the answer does not pass.
printf 'name,n\na,10\nb,20\nc,12\n' > /tmp/hidden.csv
out=$(sh ./sum.sh /tmp/hidden.csv)
if [ "$out" = "42" ]; then echo "ok: $out"; exit 0; fi
echo "expected 42, got '$out'"; exit 1
