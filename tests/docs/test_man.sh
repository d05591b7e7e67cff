#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_man.sh IDEM SOURCE_DIR MAN_DIR — each command's --help and its manual
# page come from one file, docs/man/NAME.txt: `idem help CMD` and
# `idem CMD --help` print exactly its text, every page (idem.yaml(5)
# included) is read by man(1) without a warning, and each command's page
# tells its exit status.
set -eu
idem=$1 src=$2 man=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
n=0
for txt in "$src"/docs/man/*.txt; do
  page=$(basename "$txt" .txt)
  cmd=${page#idem}; cmd=${cmd#-}
  tail -n +3 "$txt" >"$tmp/want"
  if [ -z "$cmd" ]; then
    "$idem" help >"$tmp/help"; "$idem" --help >"$tmp/dash"
  else
    "$idem" help "$cmd" >"$tmp/help"; "$idem" "$cmd" --help >"$tmp/dash"
  fi
  for got in help dash; do
    cmp -s "$tmp/want" "$tmp/$got" || {
      echo "$page: idem's --help is not docs/man/$page.txt:"; diff "$tmp/want" "$tmp/$got"; exit 1; }
  done
  grep -q '^Exit status:' "$txt" || { echo "$page: no 'Exit status:' paragraph"; exit 1; }
  [ -f "$man/$page.1" ] || { echo "$page: $man/$page.1 was not made"; exit 1; }
  MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l "$man/$page.1" >"$tmp/out" 2>"$tmp/err"
  [ ! -s "$tmp/err" ] || { echo "$page.1: man warns:"; cat "$tmp/err"; exit 1; }
  for section in NAME SYNOPSIS DESCRIPTION 'EXIT STATUS'; do
    grep -q "^$section" "$tmp/out" || { echo "$page.1: no $section section"; exit 1; }
  done
  n=$((n + 1))
done
# A command's help is reachable by name, and a name that is none is refused.
if "$idem" help no-such-command >/dev/null 2>&1; then
  echo "idem help no-such-command exited 0"; exit 1
fi
MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l "$man/idem.yaml.5" >"$tmp/out" 2>"$tmp/err"
[ ! -s "$tmp/err" ] || { echo "idem.yaml.5: man warns:"; cat "$tmp/err"; exit 1; }
# The page is configuration.md: every field of its top-level table is in it.
for field in listen admin_listen api_keys storage routes consumers limits; do
  grep -Eq "^       $field( |\$)" "$tmp/out" || {
    echo "idem.yaml.5: the field $field is not in the page"; exit 1; }
done
[ "$n" -ge 4 ] || { echo "only $n pages in $src/docs/man"; exit 1; }
echo "$n command pages and idem.yaml(5): help and page agree, man reads them cleanly"
