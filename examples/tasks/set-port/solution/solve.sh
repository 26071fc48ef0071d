#!/bin/sh
set -e
patch -p1 < "${SOLUTION_DIR:-/solution}/app.conf.patch"
