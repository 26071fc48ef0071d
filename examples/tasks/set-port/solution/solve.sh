#!/bin/sh
set -e
patch -p1 < /solution/app.conf.patch
