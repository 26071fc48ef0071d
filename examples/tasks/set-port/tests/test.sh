#!/bin/sh
fail() { echo "$1"; exit 1; }
grep -qx 'port = 8080' app.conf || fail "port is not 8080"
grep -qx 'log_level = info' app.conf || fail "log_level is not info"
grep -qx 'name = demo' app.conf || fail "name changed"
grep -qx 'workers = 4' app.conf || fail "workers changed"
[ "$(wc -l < app.conf)" -eq 5 ] || fail "lines were added or removed"
echo ok
