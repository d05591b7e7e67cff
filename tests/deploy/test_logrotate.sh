#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_logrotate.sh IDEM SOURCE_DIR — deploy/logrotate/idem rotates a
# running idem serve's access log: logrotate moves the file away, its
# postrotate's SIGUSR1 makes the daemon open the path again, and the
# requests after it are in the new file, those before in the old one. The
# snippet runs as written, but for its paths and its postrotate's
# systemctl, which here is a kill of this test's daemon.
set -eu
idem=$1 src=$2
tmp=$(mktemp -d)
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
fail() { echo "$*"; [ ! -f "$tmp/idem.out" ] || cat "$tmp/idem.out"; exit 1; }
mkdir "$tmp/log"
cat >"$tmp/idem.yaml" <<YAML
listen: 127.0.0.1:0
access_log: { to: $tmp/log/access.log, format: json }
YAML
"$idem" serve -c "$tmp/idem.yaml" --db "$tmp/idem.db" >"$tmp/idem.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/idem.out" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/idem.out" | head -1)
[ -n "$port" ] || fail "idem serve did not say where it listens"

lines() { if [ -f "$1" ]; then grep -c "$2" "$1" || true; else echo 0; fi; }
get() { curl -s -o /dev/null -H "X-Request-Id: $1" "http://127.0.0.1:$port/_idem/v1/health"; }
wait_line() { # file, text
  for _ in $(seq 50); do [ "$(lines "$1" "$2")" -ge 1 ] && return 0; sleep 0.1; done
  fail "$2 never reached $1"
}
get before-rotation
wait_line "$tmp/log/access.log" before-rotation

sed -e "s|/var/log/idem/access.log|$tmp/log/access.log|" \
    -e "s|systemctl kill .*|kill -USR1 $pid|" "$src/deploy/logrotate/idem" >"$tmp/logrotate.conf"
grep -q "kill -USR1 $pid" "$tmp/logrotate.conf" || fail "no postrotate line to replace"
logrotate -f -s "$tmp/logrotate.state" "$tmp/logrotate.conf" || fail "logrotate failed"
[ -f "$tmp/log/access.log.1" ] || fail "logrotate did not move the log to access.log.1"

get after-rotation
wait_line "$tmp/log/access.log" after-rotation
[ "$(lines "$tmp/log/access.log" before-rotation)" -eq 0 ] || fail "the new file has the old lines"
[ "$(lines "$tmp/log/access.log.1" before-rotation)" -eq 1 ] || fail "access.log.1 lost its line"
[ "$(lines "$tmp/log/access.log.1" after-rotation)" -eq 0 ] ||
  fail "the daemon kept writing to the moved file"
mode=$(stat -c %a "$tmp/log/access.log")
[ "$mode" = 600 ] || fail "the reopened log is mode $mode, not 600"
echo "logrotate moved the access log; after SIGUSR1 the daemon writes a new one (mode $mode)"
