#!/bin/sh
set -e
cp "${SOLUTION_DIR:-/solution}/median.js" median.js
