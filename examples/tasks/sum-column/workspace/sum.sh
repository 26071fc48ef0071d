#!/bin/sh
# Sum of column 2 of a CSV file with a header line.
awk -F, 'NR > 2 { total += $2 } END { print total + 0 }' "$1"
