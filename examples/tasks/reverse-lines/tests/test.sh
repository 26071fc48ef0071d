#!/bin/sh
printf 'b\nc\na\n' > /tmp/in.txt
[ -f reverse.sh ] || { echo "reverse.sh is missing"; exit 1; }
out=$(sh ./reverse.sh /tmp/in.txt | tr '\n' ' ')
if [ "$out" = "a c b " ]; then echo ok; exit 0; fi
echo "expected 'a c b ', got '$out'"; exit 1
