#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_mq_consumer.sh MQ_CONSUMER AMQP_URL sqlite|postgres [POSTGRES_URL] —
# examples/mq_consumer against the suite's RabbitMQ: 300 refunds, each
# published 3 times in three shuffled rounds, and 5 poison refunds (an
# amount the refund table refuses), consumed by two consumers at once on
# one database. Each refund must be in the table exactly once, and each
# poison one in the dead-letter queue after 3 failed attempts.
set -eu
consumer=$1 url=$2 kind=$3 pg=${4:-}
refunds=300 poison=5 max=3
q="idem.example.$kind.$$" dlq="idem.example.$kind.$$.dead"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-mq.XXXXXX")
cleanup() {
  amqp-delete-queue -u "$url" -q "$q" >/dev/null 2>&1 || true
  amqp-delete-queue -u "$url" -q "$dlq" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ "$kind" = sqlite ]; then
  db="--sqlite $tmp/refunds.db"
  sql() { sqlite3 "$tmp/refunds.db" "$1"; }
else
  db="--postgres $pg"
  sql() { psql -X -q -At "$pg" -c "$1"; }
  # The other tests' tables of these names, from an earlier run.
  sql "SET client_min_messages = warning; DROP TABLE IF EXISTS refund, idem_inbox_msg"
fi

amqp-declare-queue -u "$url" -q "$q" -d >/dev/null
amqp-declare-queue -u "$url" -q "$dlq" -d >/dev/null
{
  for round in 1 2 3; do
    seq "$refunds" | shuf | sed 's/.*/R-& 10.00/'
    [ "$round" = 2 ] && seq "$poison" | sed 's/.*/P-& -1.00/'
  done
} >"$tmp/messages"
amqp-publish -u "$url" -r "$q" -p -l <"$tmp/messages"

fail() { echo "FAIL: $*"; tail -n 5 "$tmp/err1" "$tmp/err2"; exit 1; }
start=$(date +%s)
pids=
for n in 1 2; do
  # shellcheck disable=SC2086
  "$consumer" --amqp "$url" --queue "$q" --dead-letter "$dlq" $db --max-attempts "$max" \
    --idle-exit 3000 >"$tmp/out$n" 2>"$tmp/err$n" &
  pids="$pids $!"
done
for pid in $pids; do wait "$pid" || fail "a consumer exited with status $?"; done
echo "two consumers took $(($(date +%s) - start)) s (3 of them idle, to exit)"
cat "$tmp/out1" "$tmp/out2"

# mq_consumer: processed N, duplicates D, failed F, dead-lettered X
total() { sed -n "s/.* $1 \([0-9]*\).*/\1/p" "$tmp/out1" "$tmp/out2" | awk '{ s += $1 } END { print s + 0 }'; }
[ "$(total processed)" = "$refunds" ] || fail "processed $(total processed), not $refunds"
[ "$(total duplicates)" = $((2 * refunds)) ] || fail "duplicates $(total duplicates)"
[ "$(total failed)" = $((poison * max)) ] || fail "failed $(total failed), not $((poison * max))"
[ "$(total dead-lettered)" = "$poison" ] || fail "dead-lettered $(total dead-lettered)"

got=$(sql "SELECT count(*) || ' ' || count(DISTINCT refund_no) FROM refund")
[ "$got" = "$refunds $refunds" ] || fail "refund rows (all, distinct): $got"
got=$(sql "SELECT count(*) FROM refund WHERE refund_no LIKE 'P-%'")
[ "$got" = 0 ] || fail "$got poison refunds were written"
got=$(sql "SELECT count(*) FROM idem_inbox_msg WHERE state = 'DEAD' AND attempts = $max")
[ "$got" = "$poison" ] || fail "$got poison messages DEAD after $max attempts"
got=$(sql "SELECT count(*) FROM idem_inbox_msg WHERE state = 'DONE'")
[ "$got" = "$refunds" ] || fail "$got refunds DONE"

if amqp-get -u "$url" -q "$q" >/dev/null 2>&1; then fail "messages left in $q"; fi
: >"$tmp/dead"
# Each body ends with the newline amqp-publish -l kept.
while amqp-get -u "$url" -q "$dlq" >>"$tmp/dead" 2>/dev/null; do :; done
seq "$poison" | sed 's/.*/P-& -1.00/' >"$tmp/want"
grep . "$tmp/dead" | sort | diff - "$tmp/want" >/dev/null ||
  fail "dead-letter queue: $(tr '\n' ',' <"$tmp/dead"), not the $poison poison refunds"
echo "mq_consumer ($kind): $refunds refunds once each, $poison poison dead-lettered after $max attempts"
