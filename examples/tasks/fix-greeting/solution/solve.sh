#!/bin/sh
set -e
sed -i 's/Helo, \$1"/Hello, $1!"/' greet.sh
