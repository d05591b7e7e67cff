#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_run_demo.sh SOURCE_DIR — the README's first command, `./run.sh
# --demo`, as a reader runs it: in a copy of the repository's files (so it
# builds its own ./build, not the one under test), on the ports the README
# names (127.0.0.1:8080 and :9000, which nothing else of the suite binds).
# The demo's second payment callback must be the first one's replay, and
# the service must have executed it once.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/idem"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z | tar -C "$src" --null -T - -cf - | tar -C "$tmp/idem" -xf -
else
  tar -C "$src" --exclude='./build*' -cf - . | tar -C "$tmp/idem" -xf -
fi
out=$(cd "$tmp/idem" && IDEM_DEMO_DIR="$tmp/state" ./run.sh --demo 2>&1) || {
  echo "./run.sh --demo failed:"; echo "$out"; exit 1; }
fail() { echo "FAIL: $*"; echo "--- its output:"; echo "$out"; exit 1; }
second=$(printf '%s\n' "$out" | sed -n '/attempt 2/,/the service/p')
printf '%s\n' "$second" | grep -qi '^Idempotent-Replayed: true' ||
  fail "the second callback was not a replay"
printf '%s\n' "$out" | grep -q '"payment_executions":1[,}]' ||
  fail "the service did not execute the payment exactly once"
printf '%s\n' "$out" | grep -q 'Idem is in front of the refund service' ||
  fail "the demo did not print what to try"
echo "ok: ./run.sh --demo: one execution, its replay"
