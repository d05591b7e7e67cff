#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# test_run.sh IDEM embedded|distributed [REDIS_URL POSTGRES_URL] — idem run
# on a real store: an embedded SQLite file in a temp dir, or the suite's
# Redis and PostgreSQL. Each case's keys are new (a suffix of this run's
# own), since the distributed store outlives the test.
#
#   storm      20 invocations started at once: the command ran once, and
#              all 20 print its stdout and exit with its status
#   kill9      idem run killed with SIGKILL: its command dies with it, the
#              processes a shell script of it started too; the next
#              invocation is busy (75) until the lease is over, then takes
#              over with a higher IDEM_EPOCH
#   lost       the claim taken from under a running command (its epoch
#              moved on in the store): the command is stopped, exit 70,
#              nothing stored
#   failure    a non-zero exit is stored; --exit-done; --retry-on-failure
#   stop       SIGTERM passed on to the command; stopped, the key is released
#   stall      our stdout a FIFO nobody reads: the command's output waits
#              (back-pressure, in bounded memory), the lease is still
#              renewed, and a second invocation after the lease would have
#              lapsed does not run the command; once read, all of it comes
#   grace      the claim lost under a command that ignores SIGTERM: killed
#              after its 10 s grace, exit 70
#   outage     (embedded) the store locked by another process for longer
#              than the lease: the command is stopped, exit 70
#   timeout    `timeout` sends SIGTERM to idem run and to its process
#              group: the command gets exactly one; the key is released
#   hup        SIGHUP passed on, with its grace; the key is released
#   tail       the last 64 KiB of stdout, exactly, for a later invocation
#   codes      65 for a record not idem run's, 78 for a bad configuration
#   usage      bad --key, --space, options: 64 and what is wrong
set -u
idem=$1 kind=$2 redis=${3:-} pg=${4:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-run.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
run_id="$(date +%s)-$$"
failures=0

if [ "$kind" = embedded ]; then
  printf 'storage: { kind: embedded, path: %s/idem.db }\n' "$tmp" >"$tmp/idem.yaml"
  # The record's epoch, moved on as a takeover would.
  bump_epoch() { sqlite3 "$tmp/idem.db" ".timeout 5000" \
    "UPDATE idem_record SET epoch = epoch + 1 WHERE space = '$1' AND key = '$2'"; }
  # A result not idem run's, as a route's record would hold.
  foreign_result() { sqlite3 "$tmp/idem.db" ".timeout 5000" \
    "UPDATE idem_record SET result = X'7b7d' WHERE space = '$1' AND key = '$2'"; }
else
  printf 'storage: { kind: distributed, redis: "%s", postgres: "%s" }\n' "$redis" "$pg" \
    >"$tmp/idem.yaml"
  bump_epoch() { psql -X -q -At "$pg" \
    -c "UPDATE idem_record SET epoch = epoch + 1 WHERE space = '$1' AND key = '$2'"; }
  foreign_result() { psql -X -q -At "$pg" \
    -c "UPDATE idem_record SET result = '\\x7b7d' WHERE space = '$1' AND key = '$2'"; }
fi
cfg=$tmp/idem.yaml

fail() { echo "FAIL [$kind] $case: $*"; failures=$((failures + 1)); }
check() { # check WHAT GOT WANT
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}
# wait_for FILE: up to 10 s for it to exist and hold something.
wait_for() {
  for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done
  fail "$1 never appeared"
  return 1
}
alive() { kill -0 "$1" 2>/dev/null; }

# ---- storm ----
case=storm
key="storm-$run_id"
cat >"$tmp/job.sh" <<EOF
#!/bin/sh
echo ran >>"$tmp/storm.count"
sleep 1
echo "settled day 2026-12-02, epoch \$IDEM_EPOCH"
exit 5
EOF
chmod +x "$tmp/job.sh"
mkdir "$tmp/storm"
spids=()
for i in $(seq 20); do
  ( "$idem" run -c "$cfg" -s settlement -k "$key" --wait 60s -- "$tmp/job.sh" \
      >"$tmp/storm/$i.out" 2>"$tmp/storm/$i.err"
    echo $? >"$tmp/storm/$i.rc" ) &
  spids+=($!)
done
wait "${spids[@]}"
check "times the command ran" "$(wc -l <"$tmp/storm.count" | tr -d ' ')" 1
want=$(cat "$tmp/storm/1.out")
case "$want" in "settled day 2026-12-02, epoch "[0-9]*) ;; *) fail "stdout: '$want'" ;; esac
for i in $(seq 20); do
  check "invocation $i's exit status" "$(cat "$tmp/storm/$i.rc")" 5
  check "invocation $i's stdout" "$(cat "$tmp/storm/$i.out")" "$want"
done
# And a later one, with nothing running: the same, at once.
out=$("$idem" run -c "$cfg" -s settlement -k "$key" -- "$tmp/job.sh" 2>/dev/null)
check "a later invocation's exit status" $? 5
check "a later invocation's stdout" "$out" "$want"
check "times the command ran, after it" "$(wc -l <"$tmp/storm.count" | tr -d ' ')" 1

# ---- kill9 ----
case=kill9
key="kill9-$run_id"
cat >"$tmp/long.sh" <<EOF
#!/bin/sh
echo \$\$ >"$tmp/child.\$IDEM_EPOCH"
echo \$IDEM_EPOCH >>"$tmp/epochs"
if [ ! -e "$tmp/second" ]; then
  sleep 60 &
  echo \$! >"$tmp/grandchild"
  wait
fi
echo "done at epoch \$IDEM_EPOCH"
EOF
chmod +x "$tmp/long.sh"
"$idem" run -c "$cfg" -s jobs -k "$key" --lease 8s -- "$tmp/long.sh" >/dev/null \
  2>"$tmp/kill9.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/epochs"; then
  e1=$(head -1 "$tmp/epochs")
  wait_for "$tmp/child.$e1"
  wait_for "$tmp/grandchild"
  child=$(cat "$tmp/child.$e1") grandchild=$(cat "$tmp/grandchild")
  kill -9 "$runner"
  wait "$runner" 2>/dev/null
  for _ in $(seq 100); do alive "$child" || alive "$grandchild" || break; sleep 0.05; done
  if alive "$child"; then
    fail "the command outlived idem run's SIGKILL"
    kill -9 "$child"
  fi
  if alive "$grandchild"; then
    fail "a process the command started outlived idem run's SIGKILL"
    kill -9 "$grandchild"
  fi
  touch "$tmp/second"
  # Within the lease: the key is held by the dead run's claim.
  "$idem" run -c "$cfg" -s jobs -k "$key" --lease 8s -- "$tmp/long.sh" >/dev/null \
    2>"$tmp/busy.err"
  check "within the lease, exit status" $? 75
  grep -q "running elsewhere" "$tmp/busy.err" ||
    fail "no 'running elsewhere': $(cat "$tmp/busy.err")"
  out=$("$idem" run -c "$cfg" -s jobs -k "$key" --lease 8s --wait 30s -- "$tmp/long.sh" \
          2>"$tmp/takeover.err")
  check "the takeover's exit status" $? 0
  e2=$(sed -n 2p "$tmp/epochs")
  [ -n "$e2" ] && [ "$e2" -gt "$e1" ] || fail "IDEM_EPOCH: first $e1, then '$e2'"
  check "the takeover's stdout" "$out" "done at epoch $e2"
  check "times it started" "$(wc -l <"$tmp/epochs" | tr -d ' ')" 2
fi

# ---- lost ----
case=lost
key="lost-$run_id"
cat >"$tmp/lost.sh" <<EOF
#!/bin/sh
trap 'echo stopped >"$tmp/lost.term"; kill \$!; exit 143' TERM
echo started >"$tmp/lost.started"
sleep 60 & wait
EOF
chmod +x "$tmp/lost.sh"
"$idem" run -c "$cfg" -s jobs -k "$key" --lease 9s -- "$tmp/lost.sh" >/dev/null \
  2>"$tmp/lost.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/lost.started"; then
  bump_epoch jobs "$key"
  wait "$runner"
  check "exit status once the claim is lost" $? 70
  grep -q "is lost (CONFLICT)" "$tmp/lost.err" || fail "stderr: $(cat "$tmp/lost.err")"
  check "the command was stopped" "$(cat "$tmp/lost.term" 2>/dev/null)" stopped
  # Nothing stored: the record is still PROCESSING under the bumped epoch.
  "$idem" run -c "$cfg" -s jobs -k "$key" -- true 2>/dev/null
  check "the next invocation, within the lease" $? 75
fi

# ---- failure ----
case=failure
key="fail-$run_id"
out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c 'echo broke; exit 3' 2>/dev/null)
check "a failing command's status" $? 3
out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c 'echo again; exit 0' 2>/dev/null)
check "replayed failure's status" $? 3
check "replayed failure's stdout" "$out" broke
out=$("$idem" run -c "$cfg" -s jobs -k "$key" --exit-done 0 -- sh -c 'echo again' 2>/dev/null)
check "--exit-done 0's status" $? 0
check "--exit-done 0's stdout" "$out" broke
key="retry-$run_id"
"$idem" run -c "$cfg" -s jobs -k "$key" --retry-on-failure -- sh -c 'echo one; exit 4' \
  >/dev/null 2>&1
check "--retry-on-failure's first status" $? 4
out=$("$idem" run -c "$cfg" -s jobs -k "$key" --retry-on-failure -- sh -c 'echo two' 2>/dev/null)
check "the run after a released failure" "$? $out" "0 two"
out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c 'echo three' 2>/dev/null)
check "the run after its success" "$? $out" "0 two"
key="noexec-$run_id"
"$idem" run -c "$cfg" -s jobs -k "$key" -- "$tmp/no-such-command" 2>"$tmp/noexec.err"
check "a command not found" $? 127
out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- echo found 2>/dev/null)
check "the run after a command not found" "$? $out" "0 found"

# ---- stop ----
case=stop
key="stop-$run_id"
cat >"$tmp/stop.sh" <<EOF
#!/bin/sh
trap 'echo term >"$tmp/stop.term"; kill \$!; exit 9' TERM
echo up >"$tmp/stop.up"
sleep 60 & wait
EOF
chmod +x "$tmp/stop.sh"
"$idem" run -c "$cfg" -s jobs -k "$key" -- "$tmp/stop.sh" >/dev/null 2>"$tmp/stop.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/stop.up"; then
  kill -TERM "$runner"
  wait "$runner"
  check "the status of a command stopped by SIGTERM" $? 9
  check "the SIGTERM passed on" "$(cat "$tmp/stop.term" 2>/dev/null)" term
  out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- echo next 2>/dev/null)
  check "the run after a stopped one (released)" "$? $out" "0 next"
fi

# ---- stall ----
case=stall
key="stall-$run_id"
mkfifo "$tmp/stall.fifo"
exec 9<>"$tmp/stall.fifo" # held open, never read: a reader that stalled
# 128 MiB of output: far more than the pipe, and than idem run may buffer
# (what it holds stays under 64 MiB, a sanitizer's own memory included).
"$idem" run -c "$cfg" -s jobs -k "$key" --lease 3s -- sh -c \
  "echo ran >>'$tmp/stall.count'; head -c 134217728 /dev/zero; echo end" \
  >"$tmp/stall.fifo" 2>"$tmp/stall.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/stall.count"; then
  # Well past the 3 s lease: a loop blocked in a write would let it lapse.
  sleep 8
  alive "$runner" || fail "the first invocation ended: $(cat "$tmp/stall.err")"
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$runner/status" 2>/dev/null)
  [ -n "$rss" ] && [ "$rss" -lt 65536 ] || fail "the first invocation holds '$rss' KiB"
  "$idem" run -c "$cfg" -s jobs -k "$key" --lease 3s -- sh -c "echo ran >>'$tmp/stall.count'" \
    >/dev/null 2>"$tmp/stall2.err"
  check "a second invocation while the first's stdout stalls" $? 75
  check "times the command ran, stdout stalled" "$(wc -l <"$tmp/stall.count" | tr -d ' ')" 1
  cat "$tmp/stall.fifo" >"$tmp/stall.out" 9>&- &
  reader=$!
  exec 9>&-
  wait "$runner"
  check "the first invocation's status, once read" $? 0
  wait "$reader"
  check "the bytes passed on" "$(wc -c <"$tmp/stall.out" | tr -d ' ')" 134217732
  "$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c "echo ran >>'$tmp/stall.count'" \
    >/dev/null 2>&1
  check "a later invocation's status" $? 0
  check "times the command ran, after it" "$(wc -l <"$tmp/stall.count" | tr -d ' ')" 1
fi
exec 9>&-

# ---- grace ----
case=grace
key="grace-$run_id"
cat >"$tmp/grace.sh" <<EOF
#!/bin/sh
trap 'echo term >>"$tmp/grace.term"' TERM
echo \$\$ >"$tmp/grace.pid"
while :; do sleep 0.2; done
EOF
chmod +x "$tmp/grace.sh"
"$idem" run -c "$cfg" -s jobs -k "$key" --lease 9s -- "$tmp/grace.sh" >/dev/null \
  2>"$tmp/grace.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/grace.pid"; then
  started=$SECONDS
  bump_epoch jobs "$key"
  wait "$runner"
  check "exit status once the claim is lost, SIGTERM ignored" $? 70
  took=$((SECONDS - started))
  [ "$took" -ge 9 ] || fail "killed after $took s, before its 10 s grace"
  check "the SIGTERM it ignored" "$(cat "$tmp/grace.term" 2>/dev/null)" term
  grep -q "did not stop within 10 s" "$tmp/grace.err" || fail "stderr: $(cat "$tmp/grace.err")"
  alive "$(cat "$tmp/grace.pid")" && fail "the command outlived its grace"
fi

# ---- outage ----
if [ "$kind" = embedded ]; then
  case=outage
  key="outage-$run_id"
  cat >"$tmp/outage.sh" <<EOF
#!/bin/sh
trap 'echo term >>"$tmp/outage.term"; exit 143' TERM
echo up >"$tmp/outage.up"
while :; do sleep 0.2; done
EOF
  chmod +x "$tmp/outage.sh"
  "$idem" run -c "$cfg" -s jobs -k "$key" --lease 3s -- "$tmp/outage.sh" >/dev/null \
    2>"$tmp/outage.err" &
  runner=$!
  pids+=($runner)
  if wait_for "$tmp/outage.up"; then
    # Another process holds the file's write lock for longer than the lease.
    sqlite3 "$tmp/idem.db" ".timeout 20000" "BEGIN EXCLUSIVE" ".system sleep 15" "COMMIT" &
    holder=$!
    pids+=($holder)
    wait "$runner"
    check "exit status once the store is away for longer than the lease" $? 70
    grep -q "is lost (" "$tmp/outage.err" || fail "stderr: $(cat "$tmp/outage.err")"
    check "the command was stopped" "$(cat "$tmp/outage.term" 2>/dev/null)" term
    wait "$holder"
  fi
fi

# ---- timeout ----
case=timeout
key="timeout-$run_id"
# timeout sends SIGTERM to idem run, then to its own process group, which
# idem run is in. The command is not (its process group is its own, its
# grandparent being idem run), and gets one SIGTERM, passed on. Each one
# it gets interrupts its `wait` at once and is written down, and it waits
# 2 s more for a second one.
timeout -k 60 5 "$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c "
  trap 'echo TERM >>\"$tmp/timeout.term\"' TERM
  runner=\$(ps -o ppid= -p \$PPID)
  echo \$(ps -o pgid= -p \$\$) \$(ps -o pgid= -p \$runner) >\"$tmp/timeout.groups\"
  sleep 30 & p=\$!
  wait \$p
  sleep 2 & q=\$!
  while kill -0 \$q 2>/dev/null; do wait \$q; done
  kill \$p; exit 3" >/dev/null 2>"$tmp/timeout.err"
check "timeout's status" $? 124
if [ -s "$tmp/timeout.groups" ]; then
  read -r mine runners <"$tmp/timeout.groups"
  [ "$mine" != "$runners" ] || fail "the command is in idem run's process group ($mine)"
else
  fail "the command never started: $(cat "$tmp/timeout.err")"
fi
check "the SIGTERMs the command got" "$(cat "$tmp/timeout.term" 2>/dev/null)" TERM
out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- echo next 2>/dev/null)
check "the run after a timed-out one (released)" "$? $out" "0 next"

# ---- hup ----
case=hup
key="hup-$run_id"
cat >"$tmp/hup.sh" <<EOF
#!/bin/sh
trap 'echo hup >>"$tmp/hup.log"; sleep 1; echo cleaned >>"$tmp/hup.log"; exit 9' HUP
echo up >"$tmp/hup.up"
while :; do sleep 0.1; done
EOF
chmod +x "$tmp/hup.sh"
"$idem" run -c "$cfg" -s jobs -k "$key" -- "$tmp/hup.sh" >/dev/null 2>"$tmp/hup.err" &
runner=$!
pids+=($runner)
if wait_for "$tmp/hup.up"; then
  kill -HUP "$runner"
  wait "$runner"
  check "the status of a command stopped by SIGHUP" $? 9
  # It got the signal once, and the time to clean up before it exited.
  check "what the command did on SIGHUP" "$(tr '\n' ' ' <"$tmp/hup.log" 2>/dev/null)" \
    "hup cleaned "
  out=$("$idem" run -c "$cfg" -s jobs -k "$key" -- echo next 2>/dev/null)
  check "the run after a hung-up one (released)" "$? $out" "0 next"
fi

# ---- tail ----
case=tail
key="tail-$run_id"
gen="i=0; while [ \$i -lt 3000 ]; do printf '%040d\n' \$i; i=\$((i + 1)); done"
"$idem" run -c "$cfg" -s jobs -k "$key" -- sh -c "$gen" >"$tmp/tail.first" 2>/dev/null
check "the first run's stdout, bytes" "$(wc -c <"$tmp/tail.first" | tr -d ' ')" 123000
"$idem" run -c "$cfg" -s jobs -k "$key" -- false >"$tmp/tail.later" 2>"$tmp/tail.err"
check "the replay's status" $? 0
tail -c 65536 "$tmp/tail.first" | cmp -s - "$tmp/tail.later" ||
  fail "the replay is not the last 64 KiB ($(wc -c <"$tmp/tail.later") bytes)"

# ---- codes ----
case=codes
key="foreign-$run_id"
"$idem" run -c "$cfg" -s jobs -k "$key" -- true 2>/dev/null
foreign_result jobs "$key"
"$idem" run -c "$cfg" -s jobs -k "$key" -- true 2>"$tmp/foreign.err"
check "a record not idem run's" $? 65
grep -q "holds no result of idem run" "$tmp/foreign.err" || fail "stderr: $(cat "$tmp/foreign.err")"
printf 'storage: { kind: nowhere }\n' >"$tmp/bad.yaml"
"$idem" run -c "$tmp/bad.yaml" -s jobs -k "$key" -- true 2>"$tmp/config.err"
check "a configuration that does not load" $? 78
grep -q "bad.yaml" "$tmp/config.err" || fail "stderr: $(cat "$tmp/config.err")"

# ---- usage ----
case=usage
expect64() { # expect64 WHAT NEEDLE ARGS...
  local what=$1 needle=$2
  shift 2
  "$idem" run -c "$cfg" "$@" >/dev/null 2>"$tmp/usage.err"
  check "$what: status" $? 64
  grep -qF -- "$needle" "$tmp/usage.err" || fail "$what: stderr: $(cat "$tmp/usage.err")"
}
uk="usage-$run_id"
expect64 "a space with a blank" "not a key space" -s "two words" -k "$uk" -- true
expect64 "a space of 65 bytes" "not a key space" -s "$(printf 'a%.0s' $(seq 65))" -k "$uk" -- true
expect64 "a key of 256 bytes" "longer than 255" -s jobs -k "$(printf 'k%.0s' $(seq 256))" -- true
expect64 "a key with a newline" "control character" -s jobs -k "$(printf 'a\nb')" -- true
expect64 "an empty key" "--key:" -s jobs -k "" -- true
expect64 "no space" "--space is needed" -k "$uk" -- true
expect64 "no command" "no command" -s jobs -k "$uk"
expect64 "a lease of 0" "--lease 0" -s jobs -k "$uk" --lease 0 -- true
expect64 "--exit-done 256" "--exit-done 256" -s jobs -k "$uk" --exit-done 256 -- true
expect64 "an unknown option" "--bogus" -s jobs -k "$uk" --bogus -- true
# Nothing of those ran or was stored.
out=$("$idem" run -c "$cfg" -s jobs -k "$uk" -- echo ok 2>/dev/null)
check "the key after the refusals" "$? $out" "0 ok"

if [ "$failures" -ne 0 ]; then
  echo "test_run [$kind]: $failures failures"
  exit 1
fi
echo "test_run [$kind]: every case passed"
