#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/distributed.sh — Idem on the distributed store against the servers'
# own benchmark tools, side by side in one run: `bash bench/distributed.sh`.
#
# Builds idem-bench, idem and two helpers in Release (build-bench/), starts a
# private Redis and PostgreSQL with scripts/services.sh (temp dir, ports of
# their own, stopped on exit) and measures, everything on 127.0.0.1:
#
#   1. Redis. redis-benchmark -c 64 running Idem's own Lua scripts (printed by
#      idem-redis-scripts from lib/store/redis.c, SCRIPT LOAD, then EVALSHA):
#      token_put, token_consume, lock_acquire, lock_release, without
#      pipelining and with -P 16, on a keyspace the size of Idem's own run;
#      and idem-bench at 64 threads on the distributed store: token issue and
#      consume (apart, and as one issue + consume), lock acquire + release;
#      and the same consume and lock pair with the asynchronous calls
#      (idem-bench --async): 256 in flight on one event loop, and 128 on
#      each of two loops (threads).
#   2. PostgreSQL. pgbench -c 32 -j 2 running Idem's own two writes of a
#      begin + complete (printed by idem-pg-statements from
#      lib/store/postgres.c): INSERT ... ON CONFLICT DO NOTHING on a fresh
#      key, then UPDATE ... WHERE state = 'PROCESSING' AND epoch = ..., each
#      its own transaction, on Idem's own table; and idem-bench's record
#      workload (begin + complete) at 32 threads.
#   3. The gateway. bench/gateway.sh twice, in front of its trivial nginx
#      upstream with its wrk script: two `idem serve` on the distributed
#      store sharing Redis and PostgreSQL (one wrk -c 32 each, summed), then
#      one `idem serve` on the embedded store (wrk -c 64).
#
# Then it prints a markdown table of each Idem figure, its reference, the
# ratio and the target, and writes it to bench/results/distributed.md (raw
# figures: bench/results/distributed.json). See bench/README.md.
#
# Environment (defaults in brackets):
#   IDEM_DIST_SECONDS [3]        each idem-bench window on Redis
#   IDEM_DIST_PG_SECONDS [5]     pgbench -T, and the idem-bench record window
#   IDEM_DIST_GW_SECONDS [8]     each gateway measurement
#   IDEM_DIST_GW_ROUNDS [1]      bench/gateway.sh's IDEM_GW_ROUNDS
#   IDEM_DIST_KV_THREADS [64]    idem-bench threads = redis-benchmark -c
#   IDEM_DIST_PG_THREADS [32]    idem-bench threads = pgbench -c
#   IDEM_DIST_PIPELINE [16]      redis-benchmark -P of the reference
#   IDEM_DIST_ASYNC [256]        asynchronous calls in flight, in all, for
#                                idem-bench --async (on one loop, and split
#                                over two)
#   IDEM_DIST_REDIS_PORT [26410], IDEM_DIST_PG_PORT [25460]
#   IDEM_DIST_GW_RUNS [record-unique,record-mix,lock-unique]  gateway.sh run
#                                names, or none
#   TMPDIR [/tmp]                PostgreSQL's data and the temp dir: a disk,
#                                not tmpfs
# Needs PostgreSQL 15 (postgresql), redis-server and redis-tools, wrk, nginx,
# curl and the build dependencies. Takes about three minutes on two cores.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${IDEM_DIST_SECONDS:-3}
pg_seconds=${IDEM_DIST_PG_SECONDS:-5}
gw_seconds=${IDEM_DIST_GW_SECONDS:-8}
gw_rounds=${IDEM_DIST_GW_ROUNDS:-1}
kv_threads=${IDEM_DIST_KV_THREADS:-64}
pg_threads=${IDEM_DIST_PG_THREADS:-32}
pipeline=${IDEM_DIST_PIPELINE:-16}
async_n=${IDEM_DIST_ASYNC:-256}
redis_port=${IDEM_DIST_REDIS_PORT:-26410}
pg_port=${IDEM_DIST_PG_PORT:-25460}
gw_runs=${IDEM_DIST_GW_RUNS:-record-unique,record-mix,lock-unique}
kv_target=0.8 pg_target=1.5 async_target=0.9

die() { echo "bench/distributed.sh: $*" >&2; exit 1; }
say() { echo "$*" >&2; }
section() { say "== $* ($((SECONDS / 60))m$((SECONDS % 60))s)"; }
for v in seconds pg_seconds gw_seconds gw_rounds kv_threads pg_threads pipeline redis_port pg_port; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
done
((redis_port != 26379 && pg_port != 25432)) ||
    die "ports 26379 and 25432 belong to the test suite; pick others"

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
missing=()
for cmd in cmake redis-server redis-cli redis-benchmark wrk curl; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
[[ -n $pgbin && -x $pgbin/pgbench ]] || missing+=(pgbench)
if ((${#missing[@]})); then
    say "bench/distributed.sh: missing: ${missing[*]}"
    say "install with: sudo apt-get install -y postgresql redis-server redis-tools wrk nginx-light curl cmake"
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-dist.XXXXXX")
svc=$work/services
services_up=0
cleanup() {
    if ((services_up)); then
        bash scripts/services.sh stop "$svc" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# tree_ticks PID..., machine_ticks, clk_tck.
source bench/cpu.sh
source bench/report.sh

# ---- build -------------------------------------------------------------------
say "== building idem-bench, idem and the helpers (Release, build-bench/)"
if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
       cmake --build build-bench -j"$(nproc)" --target idem-bench idem-redis-scripts \
           idem-pg-statements idem_cli; } >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    die "build failed"
fi
bench=build-bench/bench/idem-bench
scripts=build-bench/bench/idem-redis-scripts
statements=build-bench/bench/idem-pg-statements

fstype=$(df --output=fstype "$work" 2>/dev/null | tail -n 1 || stat -f -c %T "$work")
if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
    say "bench/distributed.sh: warning: $work is on $fstype, and PostgreSQL's data with it:" \
        "fsync costs nothing there; set TMPDIR to a directory on a disk"
fi

# ---- the servers -------------------------------------------------------------
port_free() { ! (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Should something listen there already, services.sh's readiness check would
# take it for ours, and this script would flush someone else's data: refuse.
port_free "$redis_port" || die "something listens on 127.0.0.1:$redis_port; set IDEM_DIST_REDIS_PORT"
port_free "$pg_port" || die "something listens on 127.0.0.1:$pg_port; set IDEM_DIST_PG_PORT"
services_up=1
bash scripts/services.sh start "$svc" "$redis_port" "$pg_port" >"$work/services.log" 2>&1 ||
    { cat "$work/services.log" >&2; die "scripts/services.sh start failed"; }
redis_url=$(sed -n 's/^IDEM_TEST_REDIS=//p' "$svc/env")
pg_url=$(sed -n 's/^IDEM_TEST_PG=//p' "$svc/env")
redis_pid=$(<"$svc/redis/redis.pid")
pg_pid=$(head -n 1 "$(<"$svc/pg.dir")/data/postmaster.pid")
redis_version=$(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/')
pg_version=$("$pgbin/postgres" --version | awk '{ print $3 }')
rcli() { redis-cli -h 127.0.0.1 -p "$redis_port" "$@"; }
psql_c() { "$pgbin/psql" -X -q -At -h 127.0.0.1 -p "$pg_port" -U idem -d idem -v ON_ERROR_STOP=1 -c "$1"; }
say "== Redis $redis_version on :$redis_port (pid $redis_pid), PostgreSQL $pg_version on :$pg_port" \
    "(pid $pg_pid, data on $fstype); temp dir $work"

# ---- measuring ---------------------------------------------------------------
declare -A V     # every figure, by name; written out as JSON at the end
problems=() notes=()

# run_timed OUT cmd...: cmd's stdout to OUT, its stderr to OUT.err (shown on
# failure); leaves the CPU it used (user + sys, seconds) in client_cpu.
run_timed() {
    local out=$1 rc=0 TIMEFORMAT="%U %S"
    shift
    { time "$@" >"$out" 2>"$out.err"; } 2>"$work/time" || rc=$?
    if ((rc)); then
        cat "$out.err" >&2
        return "$rc"
    fi
    client_cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$work/time")
}

# cpu_begin; ...; cpu_end NAME: V[NAME.cpu_redis|cpu_pg|cpu_client|cpu_rest],
# percent of one core over the wall time between them; the client's from
# client_cpu. "rest": everything else the machine ran (kernel threads for
# loopback and the disk, and any other process).
cpu_begin() {
    c_t0=$(date +%s%N) c_m0=$(machine_ticks)
    c_r0=$(tree_ticks "$redis_pid") c_p0=$(tree_ticks "$pg_pid")
}
cpu_end() {
    local name=$1 t1 m1 r1 p1
    t1=$(date +%s%N) m1=$(machine_ticks)
    r1=$(tree_ticks "$redis_pid") p1=$(tree_ticks "$pg_pid")
    read -r V[$name.cpu_redis] V[$name.cpu_pg] V[$name.cpu_client] V[$name.cpu_rest] < <(
        awk -v t=$((t1 - c_t0)) -v hz="$clk_tck" -v m=$((m1 - c_m0)) -v r=$((r1 - c_r0)) \
            -v p=$((p1 - c_p0)) -v c="${client_cpu:-0}" 'BEGIN {
            s = t / 1e9; pr = r / hz / s * 100; pp = p / hz / s * 100; pc = c / s * 100
            rest = m / hz / s * 100 - pr - pp - pc
            printf "%.0f %.0f %.0f %.0f\n", pr, pp, pc, (rest < 0 ? 0 : rest) }')
    if [[ ${V[$name.cpu_rest]} -gt 30 ]]; then
        notes+=("$name: ${V[$name.cpu_rest]}% of a core went to other processes or kernel threads: its figure may be low")
    fi
}

# A field of idem-bench's JSON line for WORKLOAD in FILE.
ib_field() {
    sed -n "s/.*\"workload\":\"$2\",.*\"$3\":\([0-9.]*\).*/\1/p" "$1" | head -n 1
}

# idem_kv WORKLOAD: idem-bench on the distributed store, Redis flushed first;
# each workload is a run of its own, so that the CPU figures are its own.
idem_kv() {
    local wl=$1 f=$work/idem-$1.json
    rcli FLUSHDB >/dev/null
    say "-- idem-bench $wl, $kv_threads threads, ${seconds}s"
    cpu_begin
    run_timed "$f" "$bench" --store distributed --redis "$redis_url" --postgres "$pg_url" \
        --threads "$kv_threads" --seconds "$seconds" --workloads "$wl" --json ||
        die "idem-bench $wl failed"
    cpu_end "idem.$wl"
    sed 's/^/   /' "$f.err" >&2
    local note
    note=$(sed -n 's/.*"workload":"\([^"]*\)".*"note":"\([^"]*\)".*/\1: \2/p' "$f")
    [[ -z $note ]] || notes+=("idem-bench $note")
}

# idem_kv_async WORKLOAD LOOPS: idem-bench --async on LOOPS event loops (one
# thread each), async_n calls in flight in all; its JSON is
# idem-WORKLOAD-asyncLOOPS.json.
idem_kv_async() {
    local wl=$1 loops=$2 f=$work/idem-$1-async$2.json
    rcli FLUSHDB >/dev/null
    say "-- idem-bench $wl --async $((async_n / loops)), $loops loop(s), ${seconds}s"
    cpu_begin
    run_timed "$f" "$bench" --store distributed --redis "$redis_url" --postgres "$pg_url" \
        --threads "$loops" --async $((async_n / loops)) --seconds "$seconds" --workloads "$wl" \
        --json || die "idem-bench $wl --async failed"
    cpu_end "idem.$wl-async$loops"
    sed 's/^/   /' "$f.err" >&2
    local note
    note=$(sed -n 's/.*"workload":"\([^"]*\)".*"note":"\([^"]*\)".*/\1: \2/p' "$f")
    [[ -z $note ]] || notes+=("idem-bench --async, $loops loop(s), $note")
}

# ---- 1. Redis ------------------------------------------------------------------
section "1. Redis: Idem's Lua scripts under redis-benchmark, and idem-bench"
# A short first run: the backends exist, the schema is made, the connections
# are warm.
if ! "$bench" --store distributed --redis "$redis_url" --postgres "$pg_url" --threads 4 \
    --seconds 0.5 --workloads lock,record >"$work/warmup.log" 2>&1; then
    cat "$work/warmup.log" >&2
    if grep -q "not built yet" "$work/warmup.log"; then
        die "the distributed store's backends are not built yet (lib/store/redis.c," \
            "lib/store/postgres.c are stubs): nothing to measure"
    fi
    die "idem-bench on the distributed store failed (above)"
fi
for wl in token-consume token lock; do idem_kv "$wl"; done
for loops in 1 2; do
    for wl in token-consume lock; do idem_kv_async "$wl" "$loops"; done
done

# The scripts Idem runs, as it loads them: their SHA1 must be cached in Redis
# already, by Idem's own SCRIPT LOAD, so the texts are byte for byte its own.
declare -A SHA
for s in token_put token_consume lock_acquire lock_release; do
    "$scripts" "$s" >"$work/$s.lua" || die "idem-redis-scripts has no script $s"
    SHA[$s]=$(sha1sum <"$work/$s.lua" | cut -c1-40)
    [[ $(rcli SCRIPT EXISTS "${SHA[$s]}") == 1 ]] ||
        die "script $s (sha1 ${SHA[$s]}) is not the one Idem loaded into Redis"
    [[ $(rcli -x SCRIPT LOAD <"$work/$s.lua") == "${SHA[$s]}" ]] || die "SCRIPT LOAD $s failed"
done

# The keyspace: as big as Idem's own run made it (Redis on a small VM slows
# down markedly as it grows), and requests as many as Idem made.
issued=$(ib_field "$work/idem-token-consume.json" token-issue ops)
locked=$(ib_field "$work/idem-lock.json" lock ops)
n_put=$((issued > 20000 ? issued : 20000))
n_lock=$((locked > 20000 ? locked : 20000))
now_ms=$(date +%s%3N)
ttl=30000 until=$((now_ms + 30000))
tok20=AbCdEfGhIjKlMnOpQrSt # token text: 20 letters + 12 digits = 32, as long
tok32=${tok20}UvWxYz012345 # as Idem's base64url tokens

# Idem's KEYS and ARGV for each script, as lib/store/redis.c builds them:
# numkeys, keys, args; @R@ is a number, __rand_int__ in a benchmark. Should
# redis.c change them, the full-path check below says so.
#   token_put      KEYS token, queue, expiries  ARGV subject, token, ttl, cap, now, until
#   token_consume  KEYS token, queue, expiries  ARGV subject, token, key, now
#   lock_acquire   KEYS lock, fence             ARGV owner, ttl, now, seed, until
#   lock_release   KEYS lock                    ARGV owner, now
tq="idem:{checkout}:tq:user-@R@" te="idem:{checkout}:te:user-@R@" tk="idem:{checkout}:tok:${tok20}@R@"
args_put=(3 "$tk" "$tq" "$te" user-@R@ "${tok20}@R@" "$ttl" 16 "$now_ms" "$until")
args_fill_tokens=(3 "$tk" "$tq" "$te" user-bench "$tok32" "$ttl" 16 "$now_ms" "$until")
args_consume=(3 "$tk" "$tq" "$te" user-bench "$tok32" order-@R@ "$now_ms")
args_acquire=(2 "idem:{bench}:lock:order-@R@" "idem:{bench}:fence" user-7 "$ttl" "$now_ms" "${now_ms}000" "$until")
args_release=(1 "idem:{bench}:lock:order-@R@" user-7 "$now_ms")

# fill SCRIPT N ARGS...: run SCRIPT once for each @R@ from 0 to N - 1 (as
# redis-benchmark writes __rand_int__: 12 digits; at most one @R@ in an
# argument), pipelined: the keyspace a consume or a release then draws
# from, made by Idem's own scripts.
fill() {
    local s=$1 n=$2
    shift 2
    awk -v sha="${SHA[$s]}" -v n="$n" 'BEGIN {
        m = ARGC + 1; a[1] = "EVALSHA"; a[2] = sha
        for (k = 1; k < ARGC; k++) a[k + 2] = ARGV[k]
        # The command in the protocol, cut where the numbers go.
        fixed = "*" m "\r\n"; nv = 0
        for (k = 1; k <= m; k++) {
            p = index(a[k], "@R@")
            if (!p) { fixed = fixed "$" length(a[k]) "\r\n" a[k] "\r\n"; continue }
            head[++nv] = fixed "$" (length(a[k]) + 9) "\r\n" substr(a[k], 1, p - 1)
            fixed = substr(a[k], p + 3) "\r\n"
        }
        for (i = 0; i < n; i++) {
            d = sprintf("%012d", i)
            for (v = 1; v <= nv; v++) printf "%s%s", head[v], d
            printf "%s", fixed
        }
        exit }' "$@" | rcli --pipe >"$work/fill.log" 2>&1 ||
        { cat "$work/fill.log" >&2; die "filling Redis with $s failed"; }
    grep -q "errors: 0," "$work/fill.log" || { cat "$work/fill.log" >&2; die "filling Redis with $s failed"; }
}

# A command's count in INFO commandstats.
calls() { rcli INFO commandstats | sed -n "s/^cmdstat_$1:calls=\([0-9]*\),.*/\1/p" | head -n 1; }

# rb NAME SCRIPT P N KEYSPACE FULLCMD FILL ARGS...: one redis-benchmark run
# on a fresh keyspace (FILL: "SCRIPT N args-array-name", or -); sets
# V[NAME.rps|p50_ms|n|keys_before|full]: requests/s, p50, requests, keys in
# Redis, and the share of calls that took the script's full path, counted by
# FULLCMD, a command only that path runs.
rb() {
    local name=$1 s=$2 p=$3 n=$4 r=$5 full=$6 filling=$7 out rps st
    shift 7
    rcli FLUSHDB >/dev/null
    if [[ $filling != - ]]; then
        local fs fn fa
        read -r fs fn fa <<<"$filling"
        local -n fargs=$fa
        fill "$fs" "$fn" "${fargs[@]}"
    fi
    rcli CONFIG RESETSTAT >/dev/null
    V[$name.keys_before]=$(rcli DBSIZE)
    say "-- redis-benchmark -c $kv_threads -P $p -n $n -r $r EVALSHA $s (${V[$name.keys_before]} keys)"
    cpu_begin
    run_timed "$work/$name.rb" redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$kv_threads" \
        -P "$p" -n "$n" -r "$r" -q EVALSHA "${SHA[$s]}" "${@//@R@/__rand_int__}" ||
        die "redis-benchmark failed"
    cpu_end "$name"
    out=$(tr '\r' '\n' <"$work/$name.rb")
    rps=$(sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' <<<"$out" | tail -n 1)
    [[ -n $rps ]] || die "no requests/s in redis-benchmark's output: $out"
    V[$name.rps]=$rps V[$name.n]=$n V[$name.keyspace]=$r
    V[$name.p50_ms]=$(sed -n 's/.*p50=\([0-9.]*\) msec.*/\1/p' <<<"$out" | tail -n 1)
    st=$(rcli INFO commandstats |
        sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*failed_calls=\([0-9]*\).*/\1 \2/p')
    # With -P, each client sends whole batches: a few more than -n.
    read -r sent failed <<<"$st"
    ((${sent:-0} >= n && ${sent:-0} <= n + kv_threads * p && ${failed:-1} == 0)) ||
        problems+=("$name: EVALSHA calls and failures: '$st', expected $n (a few more with -P) and 0")
    V[$name.calls]=$sent
    V[$name.full]=$(awk -v f="$(calls "$full")" -v n="$sent" 'BEGIN { printf "%.2f", f / n }')
    if awk -v f="${V[$name.full]}" 'BEGIN { exit !(f < 0.5) }'; then
        problems+=("$name: only ${V[$name.full]} of the calls took $s's full path: do the KEYS and ARGV in bench/distributed.sh still match lib/store/redis.c?")
    fi
    say "   $rps requests/s, full path ${V[$name.full]}"
}

for p in 1 "$pipeline"; do
    # Fresh random tokens of fresh random subjects: every call stores one.
    rb "put.P$p" token_put "$p" "$n_put" 1000000000 set - "${args_put[@]}"
    # redis-benchmark draws each __rand_int__ apart, so the token and its
    # subject's queue are two draws: a call spends a token when both are
    # still untouched; N / 3 calls on N tokens: about three in four do.
    rb "consume.P$p" token_consume "$p" $((n_put / 3)) "$n_put" set \
        "token_put $n_put args_fill_tokens" "${args_consume[@]}"
    # Fresh keys: every call takes a new lock (and a fence).
    rb "acquire.P$p" lock_acquire "$p" "$n_lock" 1000000000 incr - "${args_acquire[@]}"
    # N / 3 calls on N held locks: about six in seven release one.
    rb "release.P$p" lock_release "$p" $((n_lock / 3)) "$n_lock" del \
        "lock_acquire $n_lock args_acquire" "${args_release[@]}"
done
rcli FLUSHDB >/dev/null

# ---- 2. PostgreSQL --------------------------------------------------------------
section "2. PostgreSQL: Idem's INSERT and UPDATE under pgbench, and idem-bench record"
# pg_sql NAME TYPES VAR...: Idem's statement NAME with each $i replaced by the
# pgbench variable VAR[i] cast to its type (NULL: a NULL of that type, which
# pgbench cannot pass). TYPES is what the mapping was written for.
pg_sql() {
    local name=$1 want=$2 types
    shift 2
    types=$("$statements" --types "$name") || die "idem-pg-statements has no statement $name"
    [[ $types == "$want" ]] ||
        die "$name now takes parameters '$types', not '$want': update its variables in bench/distributed.sh"
    "$statements" "$name" | awk -v types="$types" -v vars="$*" '
        BEGIN { split(vars, v, " ") }
        { s = $0; o = ""
          while (match(s, /\$[0-9]+/)) {
              i = substr(s, RSTART + 1, RLENGTH - 1) + 0; t = substr(types, i, 1)
              ty = t == "t" ? "text" : t == "b" ? "bytea" : t == "i" ? "bigint" : "boolean"
              o = o substr(s, 1, RSTART - 1) (v[i] == "NULL" ? "NULL" : ":" v[i]) "::" ty
              s = substr(s, RSTART + RLENGTH) }
          print o s ";" }'
}
# A begin + complete of Idem's: its first epoch is the clock, the fingerprint
# a SHA-256, the result idem-bench's {"status":"ok"}, retention 24 h.
{
    echo '\set n :n + 1'
    echo '\set key :client_id * 1000000000000 + :n'
    pg_sql idem_rec_insert ttbitii space key fp now owner lease now
    pg_sql idem_rec_cas tttitiobiitiib space key done now NULL zero yes result expires now \
        processing now zero NULL
} >"$work/pair.sql"
pg_vars=(-D n=0 -D space=pgbench -D "fp=\\x$(printf 'pgbench' | sha256sum | cut -c1-64)"
    -D owner=user-7 -D now="$now_ms" -D lease=$((now_ms + 30000)) -D done=SUCCEEDED -D zero=0
    -D yes=true -D "result=\\x$(printf '{"status":"ok"}' | od -An -tx1 | tr -d ' \n')"
    -D expires=$((now_ms + 86400000)) -D processing=PROCESSING)

# Transactions committed (read-only ones too), WAL fsyncs, and index scans of
# idem_record (one per statement that looks a key up) so far. A backend
# reports its counts as it exits at the latest, which may trail the client's
# exit: read until two readings 0.3 s apart agree (3 s at most).
pg_stat() {
    local q="SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = 'idem') || ' ' ||
        (SELECT wal_sync FROM pg_stat_wal) || ' ' ||
        (SELECT coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'idem_record')"
    local a b i
    a=$(psql_c "$q")
    for ((i = 0; i < 10; i++)); do
        sleep 0.3
        b=$(psql_c "$q")
        # Our own query commits a transaction too: compare the rest.
        [[ ${a#* } == "${b#* }" ]] && break
        a=$b
    done
    echo "$b"
}
pg_rates() { # NAME SECONDS PAIRS "before" "after": V[NAME.xacts_s|fsyncs_s|scans_per_pair]
    local a b c d e f
    read -r a b c <<<"$4"
    read -r d e f <<<"$5"
    V[$1.xacts_s]=$(awk -v x=$((d - a)) -v s="$2" 'BEGIN { printf "%.0f", x / s }')
    V[$1.fsyncs_s]=$(awk -v x=$((e - b)) -v s="$2" 'BEGIN { printf "%.0f", x / s }')
    V[$1.scans_per_pair]=$(awk -v x=$((f - c)) -v n="$3" 'BEGIN { printf "%.1f", (n > 0 ? x / n : 0) }')
}

say "-- pgbench -c $pg_threads -j 2 -T $pg_seconds -M prepared, Idem's INSERT + UPDATE"
s0=$(pg_stat)
cpu_begin
run_timed "$work/pgbench.out" "$pgbin/pgbench" -h 127.0.0.1 -p "$pg_port" -U idem -n \
    -M prepared -c "$pg_threads" -j 2 -T "$pg_seconds" -f "$work/pair.sql" "${pg_vars[@]}" idem ||
    die "pgbench failed; its script was: $(cat "$work/pair.sql")"
cpu_end pgbench
s1=$(pg_stat)
V[pgbench.tps]=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.out")
V[pgbench.latency_ms]=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$work/pgbench.out")
V[pgbench.processed]=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.out")
pg_rates pgbench "$pg_seconds" "${V[pgbench.processed]:-0}" "$s0" "$s1"
V[pgbench.failed]=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$work/pgbench.out")
[[ -n ${V[pgbench.tps]} && -n ${V[pgbench.processed]} ]] ||
    die "no tps in pgbench's output: $(cat "$work/pgbench.out")"
# Every pair made its row and finished it: the UPDATE's conditions matched.
read -r rows done_rows <<<"$(psql_c "SELECT count(*) || ' ' || count(*) FILTER (WHERE state = 'SUCCEEDED') FROM idem_record WHERE space = 'pgbench'")"
V[pgbench.rows]=$rows V[pgbench.succeeded]=$done_rows
processed=${V[pgbench.processed]} failed=${V[pgbench.failed]:-0}
((done_rows >= processed && rows - done_rows <= pg_threads)) ||
    problems+=("pgbench: $rows rows, $done_rows SUCCEEDED, for $processed pairs")
((failed == 0)) || problems+=("pgbench: $failed failed transactions")
say "   ${V[pgbench.tps]} pairs/s"

say "-- idem-bench record, $pg_threads threads, ${pg_seconds}s"
s0=$(pg_stat)
cpu_begin
run_timed "$work/idem-record.json" "$bench" --store distributed --redis "$redis_url" \
    --postgres "$pg_url" --threads "$pg_threads" --seconds "$pg_seconds" --workloads record --json ||
    die "idem-bench record failed"
cpu_end idem.record
s1=$(pg_stat)
pg_rates idem.record "$pg_seconds" "$(ib_field "$work/idem-record.json" record ops)" "$s0" "$s1"
sed 's/^/   /' "$work/idem-record.json.err" >&2

# ---- 3. the gateway ------------------------------------------------------------
if [[ $gw_runs != none ]]; then
    section "3. The gateway: two idem serve on the distributed store, one on the embedded one"
    gw() { # KIND: bench/gateway.sh's table and raw figures in $work/gw-KIND.*
        local kind=$1 env=(IDEM_GW_SECONDS="$gw_seconds" IDEM_GW_RUNS="$gw_runs"
            IDEM_GW_ROUNDS="$gw_rounds" IDEM_GW_OUT="$work/gw-$1.md" IDEM_GW_RAW="$work/gw-$1.json")
        [[ $kind == embedded ]] || env+=(IDEM_GW_STORE=distributed IDEM_GW_REDIS="$redis_url"
            IDEM_GW_POSTGRES="$pg_url" IDEM_GW_INSTANCES=2
            IDEM_GW_STORE_PIDS="$redis_pid $pg_pid")
        env "${env[@]}" bash bench/gateway.sh >/dev/null || die "bench/gateway.sh ($kind) failed"
    }
    gw distributed
    gw embedded
fi

# ---- the table -----------------------------------------------------------------
commas() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]([,]|$)/, ",&", s); print s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "0" }'; }
met() { awk -v r="$1" -v t="$2" 'BEGIN { print (r >= t ? "yes" : "**no**") }'; }
both() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", 1 / (1 / a + 1 / b) }'; } # one after the other
pct() { awk -v f="$1" 'BEGIN { printf "%.0f%%", f * 100 }'; }
gwf() { # KIND RUN FIELD: a figure of gateway.sh's raw JSON
    sed -n "s/^  \"$2\":{.*\"$3\":\([0-9.]*\).*/\1/p" "$work/gw-$1.json" 2>/dev/null | head -n 1
}
us_ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }

P=$pipeline
for wl in token-issue token-consume token lock record; do
    run=$wl # the idem-bench run that reported it
    [[ $wl == token-issue ]] && run=token-consume
    for k in ops_per_s p50_us p99_us ops elapsed_s writes_per_commit; do
        V[idem.$wl.$k]=$(ib_field "$work/idem-$run.json" "$wl" "$k")
    done
done
for loops in 1 2; do
    for wl in token-consume lock; do
        for k in ops_per_s p50_us p99_us ops elapsed_s; do
            V[idem.$wl-async$loops.$k]=$(ib_field "$work/idem-$wl-async$loops.json" "$wl-async" "$k")
        done
    done
done
idem_version=$(sed -n 's/.*"idem_version":"\([^"]*\)".*/\1/p' "$work/idem-lock.json")
# Which code was measured: the commit, and the library's files changed since.
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain -- lib include 2>/dev/null | awk '{ print $2 }' | tr '\n' ' ')
git_dirty=${git_dirty% }
V[ref.put]=${V[put.P$P.rps]}
V[ref.consume]=${V[consume.P$P.rps]}
V[ref.token]=$(both "${V[put.P$P.rps]}" "${V[consume.P$P.rps]}")
V[ref.lock]=$(both "${V[acquire.P$P.rps]}" "${V[release.P$P.rps]}")

mkdir -p bench/results
out=bench/results/distributed.md
{
    printf '# Idem on the distributed store: Redis + PostgreSQL\n\n'
    printf '%s · %s · %d cores · Linux %s · idem %s (git %s%s) · Redis %s · PostgreSQL %s · PostgreSQL data on %s\n\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$(nproc)" "$(uname -r)" \
        "$idem_version" "$git_rev" "${git_dirty:+, uncommitted changes in $git_dirty}" \
        "$redis_version" "$pg_version" "$fstype"
    printf 'Everything on 127.0.0.1, on %d cores shared by the load generators (idem-bench, redis-benchmark,\n' "$(nproc)"
    printf 'pgbench, wrk), Redis, PostgreSQL, nginx and idem serve: read the CPU columns next to each figure.\n\n'

    printf '## Targets\n\n'
    printf '| Idem figure | ops/s | reference | ops/s | ratio | target | met |\n|---|---:|---|---:|---:|---:|:---:|\n'
    row() { # label idem ref-label ref target
        local r
        r=$(ratio "$2" "$4")
        printf '| %s | %s | %s | %s | %s× | ≥ %s× | %s |\n' "$1" "$(commas "$2")" "$3" "$(commas "$4")" "$r" "$5" "$(met "$r" "$5")"
    }
    row "token consume, $kv_threads threads" "${V[idem.token-consume.ops_per_s]}" \
        "\`token_consume\`, redis-benchmark -c $kv_threads -P $P" "${V[ref.consume]}" "$kv_target"
    row "token issue, $kv_threads threads" "${V[idem.token-issue.ops_per_s]}" \
        "\`token_put\`, -P $P" "${V[ref.put]}" "$kv_target"
    row "token issue + consume, $kv_threads threads" "${V[idem.token.ops_per_s]}" \
        "\`token_put\` then \`token_consume\`, -P $P" "${V[ref.token]}" "$kv_target"
    row "lock acquire + release, $kv_threads threads" "${V[idem.lock.ops_per_s]}" \
        "\`lock_acquire\` then \`lock_release\`, -P $P" "${V[ref.lock]}" "$kv_target"
    for loops in 1 2; do
        inf="$((async_n / loops)) in flight on each of $loops loop(s)"
        [[ $loops == 1 ]] && inf="$async_n in flight on 1 loop"
        row "token consume, asynchronous, $inf" "${V[idem.token-consume-async$loops.ops_per_s]}" \
            "\`token_consume\`, -P $P" "${V[ref.consume]}" "$async_target"
        row "lock acquire + release, asynchronous, $inf" "${V[idem.lock-async$loops.ops_per_s]}" \
            "\`lock_acquire\` then \`lock_release\`, -P $P" "${V[ref.lock]}" "$async_target"
    done
    row "record begin + complete, $pg_threads threads" "${V[idem.record.ops_per_s]}" \
        "pgbench -c $pg_threads -j 2, the same INSERT then UPDATE" "${V[pgbench.tps]}" "$pg_target"
    printf '\nOne Idem op is one call (issue, consume) or a pair (issue + consume, acquire + release, begin +\n'
    printf 'complete); a pair'"'"'s reference is the two scripts one after the other, 1 / (1/a + 1/b). Every\n'
    printf 'Idem call is checked (CONSUMED, ACQUIRED with a growing fence, RELEASED, NEW, COMPLETED).\n'

    printf '\n## 1. Redis: Idem'"'"'s Lua scripts under redis-benchmark -c %d\n\n' "$kv_threads"
    printf '| script (EVALSHA) | requests | keys in Redis | -P 1 req/s | -P %d req/s | full path (-P 1 / -P %d) | CPU %% at -P %d (Redis / redis-benchmark / rest) |\n' "$P" "$P" "$P"
    printf '|---|---:|---:|---:|---:|---:|---|\n'
    for s in put consume acquire release; do
        case $s in
        put) lbl="\`token_put\`: fresh token, fresh subject" ;;
        consume) lbl="\`token_consume\`: a token of $(commas "$n_put") issued" ;;
        acquire) lbl="\`lock_acquire\`: fresh key" ;;
        release) lbl="\`lock_release\`: a lock of $(commas "$n_lock") held" ;;
        esac
        k=$s.P$P
        printf '| %s | %s | %s | %s | %s | %s / %s | %s / %s / %s |\n' "$lbl" "$(commas "${V[$k.n]}")" \
            "$(commas "${V[$k.keys_before]}")" "$(commas "${V[$s.P1.rps]}")" "$(commas "${V[$k.rps]}")" \
            "$(pct "${V[$s.P1.full]}")" "$(pct "${V[$k.full]}")" "${V[$k.cpu_redis]}" \
            "${V[$k.cpu_client]}" "${V[$k.cpu_rest]}"
    done
    printf '\n| Idem, idem-bench --store distributed, %d threads | ops/s | p50 ms | p99 ms | CPU %% (Redis / idem-bench / rest) |\n' "$kv_threads"
    printf '|---|---:|---:|---:|---|\n'
    for wl in token-issue token-consume token lock token-consume-async1 lock-async1 \
        token-consume-async2 lock-async2; do
        case $wl in
        token-issue) lbl="token issue (a subject per token)"; cw=token-consume ;;
        token-consume) lbl="token consume (the tokens just issued)"; cw=token-consume ;;
        token) lbl="token issue + consume (a subject per thread)"; cw=token ;;
        lock) lbl="lock acquire + release"; cw=lock ;;
        token-consume-async*) lbl="token consume, --async $((async_n / ${wl: -1})) on ${wl: -1} loop(s)"
            cw=$wl ;;
        lock-async*) lbl="lock acquire + release, --async $((async_n / ${wl: -1})) on ${wl: -1} loop(s)"
            cw=$wl ;;
        esac
        printf '| %s | %s | %s | %s | %s / %s / %s |\n' "$lbl" "$(commas "${V[idem.$wl.ops_per_s]}")" \
            "$(us_ms "${V[idem.$wl.p50_us]}")" "$(us_ms "${V[idem.$wl.p99_us]}")" \
            "${V[idem.$cw.cpu_redis]}" "${V[idem.$cw.cpu_client]}" "${V[idem.$cw.cpu_rest]}"
    done
    printf '\nThe scripts are printed from lib/store/redis.c by idem-redis-scripts and checked to be the ones\n'
    printf 'Idem loaded (SCRIPT EXISTS). redis-benchmark draws every `__rand_int__` apart, so a consume or\n'
    printf 'release names a random token (lock) of a keyspace filled beforehand by Idem'"'"'s own token_put\n'
    printf '(lock_acquire), as large as Idem'"'"'s own run made it; "full path" is the share of calls that spent\n'
    printf 'a token, acquired a fresh lock or released a held one (from INFO commandstats), the rest took a\n'
    printf 'cheaper path (already spent, not held), which flatters the reference. But Idem spends its\n'
    printf 'tokens in the order it issued them, and redis-benchmark draws them at random over the whole\n'
    printf 'keyspace, which costs Redis more as the keyspace grows: read the consume ratio with both in\n'
    printf 'mind. Token issue and consume share their CPU figures (one idem-bench run, two windows).\n'
    printf 'The --async runs make the calls on event loops (a thread each), each with a Redis connection of\n'
    printf 'its own, the next call started from the last one'"'"'s callback; their consumes spend tokens issued\n'
    printf 'by blocking calls from 32 threads per loop in a first window, and may run out early.\n'

    printf '\n## 2. PostgreSQL: the INSERT and UPDATE of a begin + complete\n\n'
    V[pgbench.write_xacts_s]=$(awk -v t="${V[pgbench.tps]}" 'BEGIN { printf "%.0f", 2 * t }')
    V[idem.record.write_xacts_s]=$(awk -v o="${V[idem.record.ops_per_s]}" -v w="${V[idem.record.writes_per_commit]}" \
        'BEGIN { printf "%.0f", (w > 0 ? 2 * o / w : 0) }')
    printf '| run | pairs/s | latency | writes per transaction | write transactions/s | all transactions/s | WAL fsyncs/s | key lookups per pair | CPU %% (PostgreSQL / client / rest) |\n|---|---:|---|---:|---:|---:|---:|---:|---|\n'
    printf '| pgbench -c %d -j 2 -M prepared, each statement its own transaction | %s | %s ms average | 1 | %s | %s | %s | %s | %s / %s / %s |\n' \
        "$pg_threads" "$(commas "${V[pgbench.tps]}")" "${V[pgbench.latency_ms]}" \
        "$(commas "${V[pgbench.write_xacts_s]}")" "$(commas "${V[pgbench.xacts_s]}")" \
        "$(commas "${V[pgbench.fsyncs_s]}")" "${V[pgbench.scans_per_pair]}" "${V[pgbench.cpu_pg]}" \
        "${V[pgbench.cpu_client]}" "${V[pgbench.cpu_rest]}"
    printf '| Idem record begin + complete, %d threads | %s | p50 %s ms, p99 %s ms | %.1f | %s | %s | %s | %s | %s / %s / %s |\n' \
        "$pg_threads" "$(commas "${V[idem.record.ops_per_s]}")" \
        "$(us_ms "${V[idem.record.p50_us]}")" "$(us_ms "${V[idem.record.p99_us]}")" \
        "${V[idem.record.writes_per_commit]}" "$(commas "${V[idem.record.write_xacts_s]}")" \
        "$(commas "${V[idem.record.xacts_s]}")" "$(commas "${V[idem.record.fsyncs_s]}")" \
        "${V[idem.record.scans_per_pair]}" "${V[idem.record.cpu_pg]}" "${V[idem.record.cpu_client]}" \
        "${V[idem.record.cpu_rest]}"
    printf '\nThe statements are printed from lib/store/postgres.c by idem-pg-statements, their parameters\n'
    printf 'turned into pgbench variables of the same types (owner, NULL in a complete, as a NULL literal),\n'
    printf 'on Idem'"'"'s own table (%s rows made, %s finished). Idem batches concurrent writes into one\n' \
        "$(commas "${V[pgbench.rows]}")" "$(commas "${V[pgbench.succeeded]}")"
    printf 'transaction, and may read besides (a peek before a begin, the row of a write that was not\n'
    printf 'made): "key lookups per pair" (index scans of idem_record, pg_stat_user_tables) and "all\n'
    printf 'transactions" (read-only ones too, pg_stat_database) show what it did; WAL fsyncs from\n'
    printf 'pg_stat_wal.\n'

    if [[ $gw_runs != none ]]; then
        printf '\n## 3. The gateway: two idem serve on the distributed store vs one on the embedded store\n\n'
        printf 'wrk → idem serve → trivial nginx upstream, `POST /refunds`, bench/gateway.sh'"'"'s pieces; %d wrk\n' 64
        printf 'connections in all: two wrk -c 32, one per distributed instance, summed; one wrk -c 64 for the\n'
        printf 'embedded instance. %ss per run.\n\n' "$gw_seconds"
        printf '| run | 2 × distributed req/s | 1 × embedded req/s | ratio | p50 / p99 ms, distributed | p50 / p99 ms, embedded | CPU %% distributed (wrk / upstream / idem / Redis+PostgreSQL / rest) | CPU %% embedded (wrk / upstream / idem / rest) |\n'
        printf '|---|---:|---:|---:|---|---|---|---|\n'
        for run in ${gw_runs//,/ }; do
            d=$(gwf distributed "$run" rps) e=$(gwf embedded "$run" rps)
            [[ -n $d && -n $e ]] || continue
            V[gw.$run.distributed]=$d V[gw.$run.embedded]=$e
            printf '| %s | %s | %s | %s× | %s / %s | %s / %s | %s / %s / %s / %s / %s | %s / %s / %s / %s |\n' \
                "$(sed -n "s/^  \"$run\":{\"description\":\"idem \([^\"]*\)\".*/\1/p" "$work/gw-embedded.json")" \
                "$(commas "$d")" "$(commas "$e")" "$(ratio "$d" "$e")" \
                "$(us_ms "$(gwf distributed "$run" p50_us)")" "$(us_ms "$(gwf distributed "$run" p99_us)")" \
                "$(us_ms "$(gwf embedded "$run" p50_us)")" "$(us_ms "$(gwf embedded "$run" p99_us)")" \
                "$(gwf distributed "$run" cpu_wrk)" "$(gwf distributed "$run" cpu_upstream)" \
                "$(gwf distributed "$run" cpu_idem)" "$(gwf distributed "$run" cpu_store)" \
                "$(gwf distributed "$run" cpu_other)" "$(gwf embedded "$run" cpu_wrk)" \
                "$(gwf embedded "$run" cpu_upstream)" "$(gwf embedded "$run" cpu_idem)" \
                "$(gwf embedded "$run" cpu_other)"
        done
        printf '\nNo target; the token layer is not measured (each request would need its own token first, which\n'
        printf 'wrk cannot chain). Distributed latencies are the larger of the two wrk processes'"'"' figures.\n'
        for kind in distributed embedded; do
            sed -n '/^## \(Notes\|Problems seen in this run\)/,$p' "$work/gw-$kind.md" >"$work/gw-$kind.tail"
            while IFS= read -r line; do
                case $line in
                "## Notes"*) what=notes ;;
                "## Problems"*) what=problems ;;
                "- "*) if [[ $what == notes ]]; then notes+=("gateway ($kind): ${line#- }"); else problems+=("gateway ($kind): ${line#- }"); fi ;;
                esac
            done <"$work/gw-$kind.tail"
        done
    fi
    print_notes_and_problems
    printf '\nSee bench/README.md.\n'
} >"$out"

# ---- the raw figures -------------------------------------------------------------
json_str() {
    local v=${1//\\/\\\\}
    v=${v//\"/\\\"}
    v=${v//$'\t'/ }
    printf '"%s"' "${v//$'\n'/ }"
}
json_val() { [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?$ ]] && printf '%s' "$1" || json_str "$1"; }
{
    printf '{"bench":"distributed","date":%s,"host":%s,"cores":%d,"kernel":%s,' \
        "$(json_str "$(date -u '+%Y-%m-%dT%H:%M:%SZ')")" "$(json_str "$(uname -n)")" "$(nproc)" \
        "$(json_str "$(uname -r)")"
    printf '"idem_version":%s,"git":%s,"git_uncommitted":%s,' "$(json_str "$idem_version")" \
        "$(json_str "$git_rev")" "$(json_str "$git_dirty")"
    printf '"redis_version":%s,"postgres_version":%s,"fstype":%s,' "$(json_str "$redis_version")" \
        "$(json_str "$pg_version")" "$(json_str "$fstype")"
    printf '"config":{"seconds":%d,"pg_seconds":%d,"gw_seconds":%d,"kv_threads":%d,"pg_threads":%d,"pipeline":%d},\n' \
        "$seconds" "$pg_seconds" "$gw_seconds" "$kv_threads" "$pg_threads" "$pipeline"
    printf '"figures":{'
    sep=""
    while IFS= read -r k; do
        printf '%s\n  %s:%s' "$sep" "$(json_str "$k")" "$(json_val "${V[$k]}")"
        sep=","
    done < <(printf '%s\n' "${!V[@]}" | sort)
    printf '\n},\n"idem_bench":['
    sep=""
    for wl in token-consume token lock record token-consume-async1 lock-async1 \
        token-consume-async2 lock-async2; do
        printf '%s\n%s' "$sep" "$(cat "$work/idem-$wl.json")"
        sep=","
    done
    printf '],\n"pgbench_script":%s,\n' "$(json_str "$(cat "$work/pair.sql")")"
    for kind in distributed embedded; do
        printf '"gateway_%s":%s,\n' "$kind" "$(cat "$work/gw-$kind.json" 2>/dev/null || echo null)"
    done
    printf '"notes":['
    sep=""
    for p in "${notes[@]}"; do printf '%s%s' "$sep" "$(json_str "$p")"; sep=","; done
    printf '],"problems":['
    sep=""
    for p in "${problems[@]}"; do printf '%s%s' "$sep" "$(json_str "$p")"; sep=","; done
    printf ']}\n'
} >bench/results/distributed.json

say ""
cat "$out"
say ""
say "written to $out and bench/results/distributed.json"
if ((${#problems[@]})); then
    say "bench/distributed.sh: ${#problems[@]} problem(s) seen; see the end of the table"
fi
