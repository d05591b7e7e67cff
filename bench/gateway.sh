#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gateway.sh — the gateway benchmark: `bash bench/gateway.sh`.
#
# Measures, side by side in one run, everything on 127.0.0.1:
#   direct          wrk → a trivial nginx upstream (return 201 '{"ok":true}')
#   nginx proxy     wrk → nginx proxy_pass (keep-alive pool) → the upstream
#   idem record     wrk → idem serve, route layers [record] → the upstream
#   idem lock+rec   wrk → idem serve, route layers [lock, record] → the upstream
#   idem states     wrk → idem serve, route layers [record] with states: (each
#                   key's one move, NEW to the body's amount "1.00") → the upstream
# idem with unique keys, with a duplicate-heavy mix (FRESH_PCT% fresh keys, the
# rest replays of keys executed before the run) and with replays only. Then it
# prints a markdown table with the ratios to nginx and the targets, and writes
# it to bench/results/gateway-latest.md.
#
# Every request is the same POST /refunds {"refund_no":"<key>","amount":"1.00"}
# from the same wrk script (bench/wrk/gateway.lua) for every target.
#
# Environment (defaults in brackets):
#   IDEM_GW_ROUNDS [3]           rounds: each measures every run once, in
#                                turn; each run's row is its median round, and
#                                the targets are the medians of their rounds
#   IDEM_GW_SECONDS [10]         duration of each measurement
#   IDEM_GW_CONNECTIONS [64]     wrk connections (-c)
#   IDEM_GW_THREADS [2]          wrk threads (-t)
#   IDEM_GW_NGINX_WORKERS [1]    worker_processes of each nginx (a number or auto)
#   IDEM_GW_SEED_KEYS [1000]     keys executed before the mix and replay runs
#   IDEM_GW_FRESH_PCT [10]       fresh keys in the mix run, percent
#   IDEM_GW_ACCESS_LOG [off]     idem serve's access_log: off, or file (JSON
#                                lines to a file in the run's directory):
#                                run the replays with each to see its cost
#   IDEM_GW_RUNS [all]           comma-separated subset of: direct, proxy,
#                                record-unique, record-mix, record-replay,
#                                lock-unique, lock-mix, states-unique, states-mix
#   TMPDIR [/tmp]                where the temp dir (and idem's SQLite file) go:
#                                must be a real disk, not tmpfs
#   IDEM_GW_OUT [bench/results/gateway-latest.md]  where the table goes
#   IDEM_GW_RAW [none]           also write the raw figures there, as JSON
# Open loop (bench/latency.sh sets the first):
#   IDEM_GW_OPEN_LOOP [0]        1: after the closed-loop rounds, measure
#                                latency at a fixed rate with idem-open-loop
#                                (bench/open_loop.c): each request due at a
#                                time fixed in advance, its latency from then
#   IDEM_GW_OPEN_RUNS [direct,proxy,record-unique,lock-unique]  those runs
#   IDEM_GW_OPEN_RATE_PCT [25]   the rate: this percent of the nginx proxy's
#                                closed-loop req/s (its median round), so
#                                IDEM_GW_RUNS must include proxy, unless
#   IDEM_GW_OPEN_RATE [none]     a rate in req/s is given instead
#   IDEM_GW_OPEN_SECONDS [IDEM_GW_SECONDS]  counted seconds of each, after a
#                                second of warm-up at the same rate
#   IDEM_GW_OPEN_THREADS [1]     idem-open-loop threads; -c is IDEM_GW_CONNECTIONS
# For bench/distributed.sh, idem serve can run on the distributed store:
#   IDEM_GW_STORE [embedded]     or distributed: Redis + PostgreSQL, at
#   IDEM_GW_REDIS, IDEM_GW_POSTGRES  these URLs (servers someone else runs)
#   IDEM_GW_INSTANCES [1]        idem serve instances sharing that store, each
#                                with its own wrk: -c and -t split evenly
#   IDEM_GW_STORE_PIDS [none]    the main process ids of the store's servers
#                                (with their children), to show their CPU
#                                apart from the rest
# For bench/growth.sh:
#   IDEM_GW_DB [none]            the embedded store's SQLite file: every idem
#                                serve opens this one, kept as it is, instead
#                                of a fresh file per run
#   IDEM_GW_UNIQUE_KEYS [ordered]  or scattered: each unique key starts with
#                                8 random hex digits, so that a run's keys
#                                spread over the key index as random ids do,
#                                instead of following each other
# Needs wrk, nginx, curl and the build dependencies. Takes about 2.3 minutes
# a round on a 2-core VM: 7 minutes with the default 3 rounds.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${IDEM_GW_SECONDS:-10}
rounds=${IDEM_GW_ROUNDS:-3}
conns=${IDEM_GW_CONNECTIONS:-64}
wthreads=${IDEM_GW_THREADS:-2}
nginx_workers=${IDEM_GW_NGINX_WORKERS:-1}
access_log=${IDEM_GW_ACCESS_LOG:-off}
[[ $access_log == off || $access_log == file ]] ||
    { echo "bench/gateway.sh: IDEM_GW_ACCESS_LOG is off or file, not $access_log" >&2; exit 2; }
seed_keys=${IDEM_GW_SEED_KEYS:-1000}
fresh_pct=${IDEM_GW_FRESH_PCT:-10}
runs=${IDEM_GW_RUNS:-all}
out_md=${IDEM_GW_OUT:-bench/results/gateway-latest.md}
out_raw=${IDEM_GW_RAW:-}
store=${IDEM_GW_STORE:-embedded}
redis_url=${IDEM_GW_REDIS:-}
pg_url=${IDEM_GW_POSTGRES:-}
instances=${IDEM_GW_INSTANCES:-1}
store_pids=${IDEM_GW_STORE_PIDS:-}
db_file=${IDEM_GW_DB:-}
unique_keys=${IDEM_GW_UNIQUE_KEYS:-ordered}
open_loop=${IDEM_GW_OPEN_LOOP:-0}
open_runs=${IDEM_GW_OPEN_RUNS:-direct,proxy,record-unique,lock-unique}
open_rate_pct=${IDEM_GW_OPEN_RATE_PCT:-25}
open_rate=${IDEM_GW_OPEN_RATE:-}
open_seconds=${IDEM_GW_OPEN_SECONDS:-$seconds}
open_threads=${IDEM_GW_OPEN_THREADS:-1}
open_all="direct proxy record-unique lock-unique"
open_runs=${open_runs//,/ }
all_runs="direct proxy record-unique record-mix record-replay lock-unique lock-mix states-unique states-mix"
[[ $runs == all ]] && runs=$all_runs
runs=${runs//,/ }

die() { echo "bench/gateway.sh: $*" >&2; exit 1; }
for v in seconds rounds conns wthreads seed_keys fresh_pct instances; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
done
((seed_keys >= 100)) || die "IDEM_GW_SEED_KEYS must be at least 100"
((rounds % 2 == 1)) || die "IDEM_GW_ROUNDS must be odd, so that a median is one round's figure (got $rounds)"
((fresh_pct <= 100)) || die "IDEM_GW_FRESH_PCT must be 1..100"
[[ $nginx_workers == auto || $nginx_workers =~ ^[1-9][0-9]*$ ]] ||
    die "IDEM_GW_NGINX_WORKERS must be a number or auto"
for r in $runs; do
    [[ " $all_runs " == *" $r "* ]] || die "unknown run '$r' in IDEM_GW_RUNS (known: $all_runs)"
done
[[ $open_loop == 0 || $open_loop == 1 ]] || die "IDEM_GW_OPEN_LOOP is 0 or 1 (got '$open_loop')"
if ((open_loop)); then
    for v in open_rate_pct open_seconds open_threads; do
        [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
    done
    ((open_threads <= conns)) || die "IDEM_GW_OPEN_THREADS must not exceed IDEM_GW_CONNECTIONS"
    for r in $open_runs; do
        [[ " $open_all " == *" $r "* ]] ||
            die "unknown run '$r' in IDEM_GW_OPEN_RUNS (known: $open_all)"
    done
    if [[ -n $open_rate ]]; then
        [[ $open_rate =~ ^[0-9]+$ && $open_rate -gt 0 ]] ||
            die "IDEM_GW_OPEN_RATE must be a positive integer (req/s), got '$open_rate'"
    else
        [[ " $runs " == *" proxy "* ]] ||
            die "the open-loop rate is a share of the proxy's closed-loop rate: IDEM_GW_RUNS must include proxy, or set IDEM_GW_OPEN_RATE"
    fi
fi
[[ $unique_keys == ordered || $unique_keys == scattered ]] ||
    die "IDEM_GW_UNIQUE_KEYS is ordered or scattered (got '$unique_keys')"
[[ -z $db_file || $store == embedded ]] || die "IDEM_GW_DB is for the embedded store"
[[ -z $db_file || $db_file == /* ]] || die "IDEM_GW_DB must be an absolute path"
case $store in
embedded) ((instances == 1)) || die "IDEM_GW_INSTANCES > 1 needs IDEM_GW_STORE=distributed" ;;
distributed)
    [[ -n $redis_url && -n $pg_url ]] ||
        die "IDEM_GW_STORE=distributed needs IDEM_GW_REDIS and IDEM_GW_POSTGRES (URLs)" ;;
*) die "IDEM_GW_STORE must be embedded or distributed (got '$store')" ;;
esac
((conns % instances == 0)) ||
    die "IDEM_GW_CONNECTIONS ($conns) must split evenly across $instances instances"
for g in $store_pids; do
    [[ $g =~ ^[1-9][0-9]*$ ]] || die "IDEM_GW_STORE_PIDS: '$g' is not a process id"
done

missing=() pkgs=()
for pair in wrk:wrk nginx:nginx-light curl:curl cmake:cmake; do
    if ! command -v "${pair%%:*}" >/dev/null 2>&1 &&
        ! [[ ${pair%%:*} == nginx && -x /usr/sbin/nginx ]]; then
        missing+=("${pair%%:*}")
        pkgs+=("${pair#*:}")
    fi
done
if ((${#missing[@]})); then
    # What the benchmark needs beside the project's own: Debian's packages.
    echo "bench/gateway.sh: installing ${pkgs[*]}" >&2
    as_root=()
    ((EUID == 0)) || as_root=(sudo)
    "${as_root[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
            --no-install-recommends "${pkgs[@]}" >/dev/null ||
        die "could not install ${pkgs[*]} (apt-get install -y ${pkgs[*]})"
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-gw.XXXXXX")
# The admin listener's key for the health counters: made for this run.
IDEM_BENCH_KEY=$(openssl rand -hex 32)
export IDEM_BENCH_KEY
declare -A admin_socket # by idem's main port
pgids=() # process groups we started (each server is a session leader)
stop_group() { # pgid: TERM, wait up to 10 s, then KILL
    local g=$1 i
    kill -TERM -- "-$g" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        kill -0 -- "-$g" 2>/dev/null || return 0
        sleep 0.1
    done
    echo "bench/gateway.sh: process group $g did not stop in 10 s; killing it" >&2
    kill -KILL -- "-$g" 2>/dev/null || true
}
cleanup() {
    local g
    for g in "${pgids[@]}"; do stop_group "$g"; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build -------------------------------------------------------------------
echo "== building idem (Release, build-bench/)" >&2
if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
       cmake --build build-bench -j"$(nproc)" --target idem_cli idem-open-loop \
           idem-fsync-time; } >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    die "build failed"
fi
idem_bin=$PWD/build-bench/idem
open_bin=$PWD/build-bench/bench/idem-open-loop

fstype=$(df --output=fstype "$work" 2>/dev/null | tail -n 1 || stat -f -c %T "$work")
if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
    echo "bench/gateway.sh: warning: $work is on $fstype: fsync costs nothing there, so" \
         "the idem figures mean little; set TMPDIR to a directory on a disk" >&2
fi

# ---- helpers -----------------------------------------------------------------
# Ports to listen on: below the kernel's ephemeral range when there is room
# (an outgoing connection may hold any port in it), else anywhere.
read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
if ((eph_lo > 12000)); then port_lo=10000 port_n=$((eph_lo - 10000)); else port_lo=20000 port_n=40000; fi
port_free() { ! (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() { # sets picked_port
    local p tries
    for ((tries = 0; tries < 50; tries++)); do
        p=$((port_lo + RANDOM % port_n))
        if port_free "$p" && [[ " $used_ports " != *" $p "* ]]; then
            used_ports+=" $p"
            picked_port=$p
            return 0
        fi
    done
    die "no free port found"
}
used_ports=""

# Start "$@" in its own session (so its whole process group can be stopped);
# sets started_pid.
start_bg() {
    local log=$1
    shift
    setsid "$@" </dev/null >"$log" 2>&1 &
    started_pid=$!
    pgids+=("$started_pid")
}

# run_wait OUT TIMES cmd...: run cmd in its own session (so that a signal to
# this script stops it at once: bash runs traps only between foreground
# commands, but during `wait`), output to OUT, its user and system CPU seconds
# to TIMES; returns its status.
run_wait() {
    run_bg "$@"
    wait_bg "$bg_pid"
}
run_bg() { # as run_wait, but returns at once; sets bg_pid
    local out=$1 times=$2
    shift 2
    setsid bash -c 'TIMEFORMAT="%U %S"; time "$@" 2>&1' run_wait "$@" </dev/null >"$out" \
        2>"$times" &
    bg_pid=$!
    pgids+=("$bg_pid")
}
wait_bg() { # pid: its exit status
    local rc=0
    wait "$1" || rc=$?
    forget_group "$1"
    return "$rc"
}

# wait_http URL METHOD LOG PID: until URL answers 2xx (10 s). Returns 1 if
# the server exited (lost its port to someone else, say): the caller retries.
wait_http() {
    local url=$1 method=$2 log=$3 pid=$4 i code
    for ((i = 0; i < 100; i++)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -X "$method" --max-time 2 "$url" || true)
        [[ $code == 2* ]] && return 0
        if ! kill -0 "$pid" 2>/dev/null || [[ $(ps -o stat= -p "$pid" 2>/dev/null) == Z* ]]; then
            wait "$pid" 2>/dev/null || true
            forget_group "$pid"
            return 1
        fi
        sleep 0.1
    done
    cat "$log" >&2 || true
    die "$url did not answer in 10 s (last status $code)"
}

forget_group() { # pgid: no longer ours to stop
    local g keep=()
    for g in "${pgids[@]}"; do [[ $g == "$1" ]] || keep+=("$g"); done
    pgids=("${keep[@]}")
}

# group_ticks PGID..., tree_ticks PID..., machine_ticks, clk_tck.
source bench/cpu.sh
source bench/report.sh

# Context switches (voluntary + involuntary) of every thread of the processes "$@".
proc_ctxsw() {
    local p
    for p in "$@"; do cat /proc/"$p"/task/*/status; done 2>/dev/null |
        awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ { t += $2 } END { print t + 0 }'
}

nginx_temp_paths() { # the temp paths of the modules this nginx has, in dir $1
    local d=$1 v
    v=$("$nginx_bin" -V 2>&1)
    echo "    client_body_temp_path $d/client_body;"
    [[ $v == *--without-http_proxy_module* ]] || echo "    proxy_temp_path $d/proxy;"
    [[ $v == *--without-http_fastcgi_module* ]] || echo "    fastcgi_temp_path $d/fastcgi;"
    [[ $v == *--without-http_uwsgi_module* ]] || echo "    uwsgi_temp_path $d/uwsgi;"
    [[ $v == *--without-http_scgi_module* ]] || echo "    scgi_temp_path $d/scgi;"
}

# start_nginx NAME TEMPLATE [UPSTREAM_PORT]: sets started_pid and
# started_port; a few tries, each on a new port.
start_nginx() {
    local tries
    for ((tries = 0; tries < 5; tries++)); do
        pick_port
        started_port=$picked_port
        start_nginx_on "$1" "$2" "$started_port" "${3:-}" && return 0
        echo "bench/gateway.sh: nginx ($1) could not start on port $started_port; another" >&2
    done
    cat "$work/$1/error.log" >&2 || true
    die "nginx ($1) did not start; its log is above"
}
start_nginx_on() {
    local name=$1 tpl=$2 port=$3 uport=${4:-} d=$work/$1 user_line=
    mkdir -p "$d"
    : >"$d/error.log"
    # As root, nginx's workers would switch to `nobody`, who cannot enter
    # the private temp dir: keep them as the current user.
    ((EUID == 0)) && user_line="user $(id -un) $(id -gn);"
    local temp
    temp=$(nginx_temp_paths "$d")
    awk -v user="$user_line" -v workers="$nginx_workers" -v dir="$d" -v port="$port" \
        -v uport="$uport" -v temp="$temp" '
        { gsub(/@USER@/, user); gsub(/@WORKERS@/, workers); gsub(/@DIR@/, dir)
          gsub(/@UPSTREAM_PORT@/, uport); gsub(/@PORT@/, port); gsub(/@TEMP_PATHS@/, temp)
          print }' "$tpl" >"$d/nginx.conf"
    "$nginx_bin" -t -q -p "$d" -e "$d/error.log" -c "$d/nginx.conf" 2>"$d/test.log" || {
        cat "$d/test.log" "$d/error.log" >&2 2>/dev/null || true
        die "nginx ($name) rejected its configuration $d/nginx.conf"
    }
    start_bg "$d/stderr.log" "$nginx_bin" -p "$d" -e "$d/error.log" -c "$d/nginx.conf"
    wait_http "http://127.0.0.1:$port/refunds" POST "$d/error.log" "$started_pid"
}

# The text of a YAML double-quoted scalar.
yaml_quote() { local v=${1//\\/\\\\}; printf '"%s"' "${v//\"/\\\"}"; }
# $1 made safe as the replacement of sed's s|...|...|.
sed_repl() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# start_idem DIR LAYERS: sets started_pid and idem_port; a few tries, each
# on a new port and (embedded store) with a new SQLite file.
start_idem() {
    local d=$1 layers=$2 states=${3:-} tries storage
    mkdir -p "$d"
    for ((tries = 0; tries < 5; tries++)); do
        pick_port
        idem_port=$picked_port
        if [[ -n $db_file ]]; then
            storage="{ kind: embedded, path: $(yaml_quote "$db_file") }"
        elif [[ $store == embedded ]]; then
            rm -f "$d"/idem.db*
            storage="{ kind: embedded, path: $d/idem.db }"
        else
            storage="{ kind: distributed, redis: $(yaml_quote "$redis_url"), postgres: $(yaml_quote "$pg_url") }"
        fi
        sed -e "s|@PORT@|$idem_port|" -e "s|@STORAGE@|$(sed_repl "$storage")|" \
            -e "s|@DIR@|$(sed_repl "$d")|" \
            -e "s|@ACCESS_LOG@|$([[ $access_log == off ]] && echo off || sed_repl "$d/access.log")|" \
            -e "s|@UPSTREAM_PORT@|$upstream_port|" -e "s|@LAYERS@|$layers|" \
            bench/gateway/idem.yaml.in >"$d/idem.yaml"
        # The states runs: the route's machine, each key's one move from NEW
        # to the state its body names (the amount: "1.00").
        [[ -z $states ]] || printf '%s\n' "    states:" "      field: { json: amount }" \
            "      initial: NEW" "      transitions: { NEW: [\"1.00\"] }" >>"$d/idem.yaml"
        admin_socket[$idem_port]=$d/idem-admin.sock
        start_bg "$d/idem.log" "$idem_bin" serve -c "$d/idem.yaml"
        wait_http "http://127.0.0.1:$idem_port/_idem/v1/health" GET "$d/idem.log" \
            "$started_pid" && return 0
        echo "bench/gateway.sh: idem serve could not start on port $idem_port:" \
             "$(tail -n 1 "$d/idem.log")" >&2
    done
    cat "$d/idem.log" >&2 || true
    die "idem serve did not start; its log is above"
}

stop_idem() { # pid: SIGTERM (drains), and the exit status must be 0
    local pid=$1 rc=0
    stop_group "$pid"
    wait "$pid" 2>/dev/null || rc=$?
    forget_group "$pid"
    return "$rc"
}

# health PORT...: the counters as "name=value ..." lines, summed over the
# instances on those ports.
health() {
    local j p
    for p in "$@"; do
        j=$(curl -s --max-time 10 --unix-socket "${admin_socket[$p]}" \
              -H "Authorization: Bearer $IDEM_BENCH_KEY" "http://idem/_idem/v1/health") ||
            die "health on :$p failed"
        [[ $j == *'"status":"ok"'* ]] || die "health on :$p is not ok: $j"
        grep -o '"[a-z_0-9]*":[0-9][0-9]*' <<<"$j" | tr -d '"' | tr ':' '='
    done | awk -F= '!($1 in s) { k[++n] = $1 } { s[$1] += $2 }
                    END { for (i = 1; i <= n; i++) print k[i] "=" s[k[i]] }'
}
hget() { # hget "health output" name
    sed -n "s/^$2=//p" <<<"$1" | head -n 1
}

# wrk_run NAME MODE URL...: runs the client, one per URL, all at once, the
# connections and threads (in the open loop, the rate too) split evenly
# between them; leaves the result line's fields in res_<field> (summed over
# the clients; latencies: the largest of theirs, an upper bound of the
# combined percentile), the client's output in $work/NAME[.K].wrk, and the
# CPU seconds it used in wrk_cpu. The client: wrk with the script (closed
# loop), or idem-open-loop at open_rate_now req/s when phase is open.
wrk_run() {
    local name=$1 mode=$2 n=$(($# - 2)) k=0 url tag c t line lines="" bgs=() tags=()
    local tagline=GWRESULT sampleline=GWSAMPLE
    shift 2
    c=$((conns / n)) t=$((wthreads / n))
    ((t >= 1)) || t=1
    if [[ $phase == open ]]; then
        tagline=OLRESULT sampleline=OLSAMPLE t=$((open_threads / n))
        ((t >= 1)) || t=1
    fi
    for url in "$@"; do
        k=$((k + 1)) tag=$name
        ((n == 1)) || tag=$name.$k
        if [[ $phase == open ]]; then
            # Fixed-rate: each request's latency from the time it was due.
            run_bg "$work/$tag.wrk" "$work/$tag.time" timeout --foreground \
                $((open_seconds + 60)) "$open_bin" --url "$url" \
                --rate "$(awk -v r="$open_rate_now" -v n="$n" 'BEGIN { printf "%.1f", r / n }')" \
                --seconds "$open_seconds" --warmup 1 --connections "$c" --threads "$t" \
                --timeout-ms 5000 --prefix "$tag-$$-$RANDOM$RANDOM"
        else
            run_bg "$work/$tag.wrk" "$work/$tag.time" timeout --foreground $((seconds + 60)) wrk \
                -t "$t" -c "$c" -d "${seconds}s" --latency --timeout 5s -s bench/wrk/gateway.lua \
                "$url" -- "$mode" "$tag-$$-$RANDOM$RANDOM" "$seed_keys" "$fresh_pct" "$seed_prefix"
        fi
        bgs+=("$bg_pid") tags+=("$tag")
    done
    wrk_cpu=0 res_sample="" res_parts=""
    for k in "${!bgs[@]}"; do
        tag=${tags[k]}
        wait_bg "${bgs[k]}" || { cat "$work/$tag.wrk" >&2; die "the client failed for $tag"; }
        wrk_cpu=$(awk -v s="$wrk_cpu" '{ printf "%.2f", s + $1 + $2 }' "$work/$tag.time")
        line=$(grep "^$tagline" "$work/$tag.wrk") ||
            { cat "$work/$tag.wrk" >&2; die "no result from the client for $tag"; }
        lines+=$line$'\n'
        res_parts+="$(sed 's/.* rps=\([0-9.]*\).*/\1/' <<<"$line") "
        [[ -n $res_sample ]] ||
            res_sample=$(sed -n "s/^$sampleline //p" "$work/$tag.wrk" | head -n 1)
    done
    if ((n > 1)); then
        line=$(awk '{ for (i = 2; i <= NF; i++) {
                          f = substr($i, 1, index($i, "=") - 1); v = substr($i, index($i, "=") + 1) + 0
                          if (!(f in s)) k[++m] = f
                          if (f ~ /_us$/ || f == "seconds") { if (v > s[f]) s[f] = v } else s[f] += v } }
                     END { printf "RESULT"
                           for (i = 1; i <= m; i++)
                               printf (k[i] ~ /^(rps|seconds|rate)$/ ? " %s=%.1f" : " %s=%d"), k[i], s[k[i]]
                           print "" }' <<<"$lines")
    fi
    for kv in ${line#*RESULT }; do
        printf -v "res_${kv%%=*}" '%s' "${kv#*=}"
    done
}

# seed PORT: execute $seed_prefix-0..$seed_prefix-(SEED_KEYS-1) once each. The wrk script
# stops its thread once done, but wrk itself runs for all of -d.
seed() {
    local port=$1 out=$work/seed-$1.wrk
    run_wait "$out" /dev/null timeout --foreground 120 wrk -t 1 -c 8 -d "$((2 + seed_keys / 1000))s" \
        --timeout 10s -s bench/wrk/gateway.lua "http://127.0.0.1:$port/refunds" -- seed unused \
        "$seed_keys" 0 "$seed_prefix" || { cat "$out" >&2; die "seeding failed"; }
    local h
    h=$(health "$port")
    [[ $(hget "$h" executions) == "$seed_keys" && $(hget "$h" in_flight_409) == 0 ]] ||
        die "seeding: $(hget "$h" executions) executions and $(hget "$h" in_flight_409)" \
            "409s, expected $seed_keys and 0; wrk said: $(cat "$out")"
}

# ---- results -----------------------------------------------------------------
declare -A R # R[run.field]
record_result() { # run, then the res_* and the extras
    local run=$1 f
    for f in requests rps p50_us p99_us max_us replayed errors_connect errors_read \
        errors_write errors_timeout; do
        local v="res_$f"
        R[$run.$f]=${!v:-0}
    done
    # The open loop's: p99.9, service time (sent → answered), lag (due →
    # sent), the rate asked for, and every answer, the warm-up's included.
    for f in p999_us svc_p50_us svc_p99_us svc_p999_us lag_p50_us lag_p99_us rate answered; do
        local v="res_$f"
        [[ -z ${!v:-} ]] || R[$run.$f]=${!v}
    done
    local s=""
    for v in ${!res_status_*}; do s+="${v#res_status_}:${!v} "; done
    R[$run.statuses]=${s% }
    R[$run.sample]=${res_sample:-}
    R[$run.rps_parts]=${res_parts% }
    R[$run.wrk_cpu]=$wrk_cpu
    unset "${!res_@}"
}

cpu_pct() { # ticks → percent of one core over the run (cpu_secs long)
    awk -v t="$1" -v hz="$clk_tck" -v s="$cpu_secs" 'BEGIN { printf "%.0f", t / hz / s * 100 }'
}

# ---- the servers -------------------------------------------------------------
start_nginx upstream bench/nginx/upstream.conf.in
upstream_pgid=$started_pid upstream_port=$started_port
start_nginx proxy bench/nginx/proxy.conf.in "$upstream_port"
proxy_pgid=$started_pid proxy_port=$started_port
nginx_version=$("$nginx_bin" -v 2>&1 | sed 's|.*nginx/||')
wrk_version=$( (wrk -v 2>&1 || true) | sed -n '1s/^wrk \([^ ]*\).*/\1/p')
idem_version=$("$idem_bin" --version 2>/dev/null | awk '{print $NF}' || true)
echo "== nginx $nginx_version upstream :$upstream_port, proxy :$proxy_port" \
     "(worker_processes $nginx_workers); wrk $wrk_version -t$wthreads -c$conns" \
     "-d${seconds}s; temp dir $work ($fstype)" >&2

# The disk's own durable write, for reference: PostgreSQL's pg_test_fsync
# (one 8 kB write and fdatasync, 1 s, alone) on the temp dir's disk. It stops
# after that figure (about 3 s); skipped when it is not installed.
fsync_us=""
if [[ $store == embedded ]]; then
    ptf=$(ls /usr/lib/postgresql/*/bin/pg_test_fsync 2>/dev/null | tail -n 1 || true)
    if [[ -n $ptf ]]; then
        echo "-- the disk: $ptf -s 1, its one-8kB-write fdatasync" >&2
        fsync_us=$("$ptf" -s 1 -f "$work/pg_test_fsync.probe" 2>/dev/null |
            awk '/^ *fdatasync / { print $(NF - 1); exit }' || true)
        rm -f "$work/pg_test_fsync.probe"
    fi
fi

problems=() # anything unexpected, for the report
notes=()    # expected by the configuration, but worth saying

run_one() {
    local kind=$1 run=$1 url mode layers="" states="" d u0 u1 p0 p1 i0 i1 s0=0 s1=0 h0 h1 f kv k cl=wrk
    # The open loop's figures are kept apart, as open-RUN.
    [[ $phase == closed ]] || run=open-$kind cl=idem-open-loop
    local pids=() ports=() urls=() dirs=()
    case $kind in
    direct) url="http://127.0.0.1:$upstream_port/refunds" mode=unique ;;
    proxy) url="http://127.0.0.1:$proxy_port/refunds" mode=unique ;;
    record-*) layers="[record]" mode=${kind#record-} ;;
    lock-*) layers="[lock, record]" mode=${kind#lock-} ;;
    states-*) layers="[record]" states=1 mode=${kind#states-} ;;
    esac
    local wmode=$mode
    [[ $mode != unique || $unique_keys == ordered ]] || wmode=scatter
    # The seed keys: a store shared by several runs needs new ones each time.
    seed_prefix=seed
    [[ $store == embedded ]] || seed_prefix="seed-$run-$$-$RANDOM"
    urls=("${url:-}")
    if [[ -n $layers ]]; then
        urls=()
        for ((k = 1; k <= instances; k++)); do
            d=$work/$run
            ((instances == 1)) || d=$work/$run/$k
            start_idem "$d" "$layers" "$states"
            pids+=("$started_pid") ports+=("$idem_port") dirs+=("$d")
            urls+=("http://127.0.0.1:$idem_port/refunds")
        done
        # Seeding through one instance executes the keys for all of them.
        [[ $mode == unique ]] || seed "${ports[0]}"
        h0=$(health "${ports[@]}")
    fi
    if [[ $phase == open ]]; then
        echo "-- $run: $cl at $open_rate_now req/s → ${urls[*]}" >&2
    else
        echo "-- $run: wrk $mode → ${urls[*]}" >&2
    fi
    u0=$(group_ticks "$upstream_pgid") p0=$(group_ticks "$proxy_pgid") i0=0
    local x0=0 x1=0 m0 m1 w0 w1
    [[ -n $layers ]] && i0=$(group_ticks "${pids[@]}") x0=$(proc_ctxsw "${pids[@]}")
    [[ -z $store_pids ]] || s0=$(tree_ticks $store_pids)
    m0=$(machine_ticks) w0=$(date +%s%N)
    wrk_run "$run" "$wmode" "${urls[@]}"
    m1=$(machine_ticks) w1=$(date +%s%N)
    # CPU shares are of the client's whole run (the open loop's warm-up and
    # last answers included), not of the counted seconds only.
    cpu_secs=$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
    u1=$(group_ticks "$upstream_pgid") p1=$(group_ticks "$proxy_pgid") i1=0
    [[ -n $layers ]] && i1=$(group_ticks "${pids[@]}") x1=$(proc_ctxsw "${pids[@]}")
    [[ -z $store_pids ]] || s1=$(tree_ticks $store_pids)
    R[$run.idem_cpu_us]=0 R[$run.ctxsw]=0
    record_result "$run"
    R[$run.cpu_upstream]=$(cpu_pct $((u1 - u0)))
    R[$run.cpu_proxy]=$(cpu_pct $((p1 - p0)))
    R[$run.cpu_idem]=$(cpu_pct $((i1 - i0)))
    R[$run.cpu_store]=$(cpu_pct $((s1 - s0)))
    R[$run.cpu_wrk]=$(awk -v c="${R[$run.wrk_cpu]}" -v s="$cpu_secs" 'BEGIN { printf "%.0f", c / s * 100 }')
    # The rest of the machine: kernel threads (loopback softirqs, the disk)
    # and anything else running. Much of it means a noisy measurement.
    R[$run.cpu_other]=$(($(cpu_pct $((m1 - m0))) - R[$run.cpu_wrk] - R[$run.cpu_upstream] - \
        R[$run.cpu_proxy] - R[$run.cpu_idem] - R[$run.cpu_store]))
    ((R[$run.cpu_other] >= 0)) || R[$run.cpu_other]=0
    if ((R[$run.cpu_other] > 30)); then
        notes+=("$run: $((R[$run.cpu_other]))% of a core went to other processes or kernel threads during the measurement: its figures may be low")
    fi
    if [[ -n $layers ]]; then
        h1=$(health "${ports[@]}")
        for f in requests executions replays in_flight_409 mismatches store_errors \
            upstream_unknown commits committed_ops commit_us conflicts takeovers; do
            R[$run.h_$f]=$(($(hget "$h1" "$f") - $(hget "$h0" "$f")))
        done
        # Per request idem handled: CPU time, and thread context switches.
        R[$run.idem_cpu_us]=$(awk -v t=$((i1 - i0)) -v hz="$clk_tck" -v n="${R[$run.h_requests]}" \
            'BEGIN { printf "%.0f", (n > 0 ? t / hz * 1e6 / n : 0) }')
        R[$run.ctxsw]=$(awk -v x=$((x1 - x0)) -v n="${R[$run.h_requests]}" \
            'BEGIN { printf "%.1f", (n > 0 ? x / n : 0) }')
        for k in "${!pids[@]}"; do
            local who="idem serve" log=${dirs[k]}/idem.log
            ((instances == 1)) || who="idem serve #$((k + 1))"
            if ! stop_idem "${pids[k]}"; then
                problems+=("$run: $who did not exit 0 on SIGTERM")
            fi
            if grep -v -e 'idem: .*draining' -e 'idem: stopped (0 requests' -e 'listening' \
                -e 'idem: admin: API key bench (scope read) in use' "$log" | grep -q .; then
                problems+=("$run: $who logged: $(head -c 600 "$log" | tr '\n' '|')")
            fi
        done
    fi
    # Every answer must be 201, nothing else; no socket errors. One exception,
    # a note rather than a problem: with the lock layer, a duplicate that
    # arrives while another request holds its key's lock is answered 409
    # (in_flight: reject) even when the key's record is already DONE.
    local st=${R[$run.statuses]} bad="" n409=0
    for kv in $st; do
        case ${kv%%:*} in
        201) ;;
        409) n409=${kv#*:} ;;
        *) bad+="$kv " ;;
        esac
    done
    if ((n409)); then
        if [[ $kind == lock-* && $mode != unique ]]; then
            notes+=("$run: $n409 answers 409 to duplicates of keys already DONE: the lock is taken before the record is read, and a concurrent duplicate holds it. First one: ${R[$run.sample]}")
        else
            bad+="409:$n409 "
        fi
    fi
    [[ -z $bad ]] || problems+=("$run: unexpected answers (status:count) $bad; first: ${R[$run.sample]}")
    for f in connect read write timeout; do
        [[ ${R[$run.errors_$f]} == 0 ]] || problems+=("$run: $cl $f errors: ${R[$run.errors_$f]}")
    done
    if [[ -n $layers ]]; then
        # rq: the answers the client read (the open loop's warm-up included).
        local ex=${R[$run.h_executions]} rp=${R[$run.h_replays]} rq=${R[$run.answered]:-${R[$run.requests]}}
        local hr=${R[$run.h_requests]} c409=${R[$run.h_in_flight_409]} mm=${R[$run.h_mismatches]}
        case $mode in
        unique) ((rp == 0)) || problems+=("$run: $rp replays with unique keys") ;;
        replay) ((ex == 0)) || problems+=("$run: $ex executions in a replay-only run") ;;
        esac
        # idem saw every answer wrk counted, plus at most one per connection
        # cut off at the end; each was an execution, a replay or a 409.
        ((hr >= rq && hr <= rq + conns)) ||
            problems+=("$run: idem counted $hr gateway requests, $cl $rq answers")
        ((ex + rp + c409 + mm == hr)) ||
            problems+=("$run: executions $ex + replays $rp + 409s $c409 + mismatches $mm != requests $hr")
        ((${R[$run.replayed]} <= rp)) || problems+=("$run: $cl saw ${R[$run.replayed]} replays, idem counted $rp")
        ((c409 >= n409)) || problems+=("$run: $cl saw $n409 409s, idem counted $c409")
        for f in store_errors upstream_unknown conflicts takeovers; do
            ((${R[$run.h_$f]} == 0)) || problems+=("$run: health $f = ${R[$run.h_$f]}")
        done
    fi
    printf '   %s req/s  p50 %s µs  p99 %s µs  statuses %s\n' "${R[$run.rps]}" \
        "${R[$run.p50_us]}" "${R[$run.p99_us]}" "${R[$run.statuses]}" >&2
}

# keep_round RUN ROUND NPROBLEMS NNOTES: the run's figures, kept apart as
# R[RUN@ROUND.field]; what it added to problems and notes names the round.
keep_round() {
    local run=$1 round=$2 i k
    for k in "${!R[@]}"; do
        [[ $k == "$run".* ]] && R[$run@$round.${k#"$run".}]=${R[$k]}
    done
    ((rounds > 1)) || return 0
    for ((i = $3; i < ${#problems[@]}; i++)); do problems[i]="round $round: ${problems[i]}"; done
    for ((i = $4; i < ${#notes[@]}; i++)); do notes[i]="round $round: ${notes[i]}"; done
}
# median VALUE...: the middle value (the count is odd).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[(NR + 1) / 2] }'; }
# per_round FORMULA RUN.FIELD RUN.FIELD: FORMULA of a and b (awk, to two
# decimals) in each round, each from that round's own measurements.
per_round() {
    local f=$1 a=$2 b=$3 r
    for ((r = 1; r <= rounds; r++)); do
        awk -v a="${R[${a%%.*}@$r.${a#*.}]}" -v b="${R[${b%%.*}@$r.${b#*.}]}" \
            "BEGIN { printf \"%.2f\\n\", $f }"
    done
}

phase=closed
for ((round = 1; round <= rounds; round++)); do
    ((rounds == 1)) || echo "== round $round of $rounds" >&2
    for run in $runs; do
        np=${#problems[@]} nn=${#notes[@]}
        run_one "$run"
        keep_round "$run" "$round" "$np" "$nn"
    done
done
# Each run's figures in R[run.field] become those of its median round by
# req/s: every figure in its row comes from that one measurement, but for
# the ratio to the proxy, the median of the rounds' own ratios.
for run in $runs; do
    pairs=()
    for ((round = 1; round <= rounds; round++)); do pairs+=("${R[$run@$round.rps]} $round"); done
    mid=$(printf '%s\n' "${pairs[@]}" | sort -g | awk '{ r[NR] = $2 } END { print r[(NR + 1) / 2] }')
    for k in "${!R[@]}"; do
        [[ $k == "$run@$mid".* ]] && R[$run.${k#"$run@$mid".}]=${R[$k]}
    done
    R[$run.round]=$mid
done

# Formats, for the notes and the tables.
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
commas() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]([,]|$)/, ",&", s); print s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else printf "n/a" }'; }
have() { [[ -n ${R[$1.rps]:-} ]]; }

# ---- the open loop -------------------------------------------------------------
# At a fixed rate, a share of what the nginx proxy answered closed-loop (its
# median round), each target in turn, in rounds as above. First the disk's
# own durable write where the SQLite file lives, for the target.
fsync_line=""
if ((open_loop)); then
    echo "-- the disk: idem-fsync-time $work, 1000 × (4 KiB write + fdatasync)" >&2
    fsync_line=$("$PWD/build-bench/bench/idem-fsync-time" "$work" 1000) ||
        die "idem-fsync-time failed"
    for kv in ${fsync_line#FSYNCRESULT }; do R[fsync.${kv%%=*}]=${kv#*=}; done
    open_rate_now=$open_rate open_rate_how="IDEM_GW_OPEN_RATE"
    if [[ -z $open_rate ]]; then
        open_rate_now=$(awk -v r="${R[proxy.rps]}" -v p="$open_rate_pct" 'BEGIN { printf "%d", r * p / 100 }')
        open_rate_how="$open_rate_pct% of the nginx proxy's closed-loop $(commas "${R[proxy.rps]}") req/s"
        ((open_rate_now > 0)) || die "the proxy's closed-loop rate is 0: no open-loop rate"
    fi
    phase=open
    for ((round = 1; round <= rounds; round++)); do
        echo "== open loop at $open_rate_now req/s ($open_rate_how), round $round of $rounds" >&2
        for run in $open_runs; do
            np=${#problems[@]} nn=${#notes[@]}
            run_one "$run"
            # Due requests that wait long for a free connection: the target
            # answers slower than the rate, and its latency is that queue's.
            if ((R[open-$run.lag_p99_us] > 50000)); then
                notes+=("open-$run: requests waited $(ms "${R[open-$run.lag_p99_us]}") ms (p99) for a free connection: it did not keep up with $open_rate_now req/s, and its latency is mostly that queue")
            fi
            keep_round "open-$run" "$round" "$np" "$nn"
        done
    done
    # Each open run's row: its median round by p99.
    for run in $open_runs; do
        pairs=()
        for ((round = 1; round <= rounds; round++)); do pairs+=("${R[open-$run@$round.p99_us]} $round"); done
        mid=$(printf '%s\n' "${pairs[@]}" | sort -g | awk '{ r[NR] = $2 } END { print r[(NR + 1) / 2] }')
        for k in "${!R[@]}"; do
            [[ $k == "open-$run@$mid".* ]] && R[open-$run.${k#"open-$run@$mid".}]=${R[$k]}
        done
        R[open-$run.round]=$mid
    done
fi
for n in upstream proxy; do
    if [[ -s $work/$n/error.log ]]; then
        problems+=("nginx $n logged: $(head -c 600 "$work/$n/error.log" | tr '\n' '|')")
    fi
done

# ---- the table -----------------------------------------------------------------

describe() {
    local who=idem
    [[ $store == embedded ]] || who="idem ×$instances ($store)"
    case $1 in
    direct) echo "direct: wrk → nginx upstream" ;;
    proxy) echo "nginx proxy_pass (keepalive 64) → upstream" ;;
    record-unique) echo "$who [record], unique keys" ;;
    record-mix) echo "$who [record], $((100 - fresh_pct))% replays / $fresh_pct% fresh" ;;
    record-replay) echo "$who [record], replays only" ;;
    lock-unique) echo "$who [lock, record], unique keys" ;;
    lock-mix) echo "$who [lock, record], $((100 - fresh_pct))% replays / $fresh_pct% fresh" ;;
    states-unique) echo "$who [record] with states, unique keys" ;;
    states-mix) echo "$who [record] with states, $((100 - fresh_pct))% replays / $fresh_pct% fresh" ;;
    esac
}

no_userinfo() { sed -E 's|//[^@/]*@|//|' <<<"$1"; }
where="SQLite file on $fstype" cpu_cols="wrk / upstream / proxy / idem / rest" commit_what="SQLite commit"
if [[ $store != embedded ]]; then
    where="store distributed: $(no_userinfo "$redis_url") + $(no_userinfo "$pg_url"), $instances idem serve instance(s) sharing it, each with a wrk of its own (-c $((conns / instances)))"
    commit_what="PostgreSQL transaction"
fi
[[ -z $store_pids ]] || cpu_cols="wrk / upstream / proxy / idem / store / rest"
[[ -z $db_file ]] || where+=" $db_file, kept across runs (IDEM_GW_DB)"
[[ $unique_keys == ordered ]] || where+=" · unique keys scattered: 8 random hex digits first"

met() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { ok = op == ">=" ? v >= t : v <= t; print ok ? "yes" : "**no**" }'; }
target_row() { # LABEL UNIT TARGET OP FORMULA A-FIELD B-FIELD: a row over the rounds
    local label=$1 unit=$2 t=$3 op=$4 f=$5 a=$6 b=$7 v vals hit=0 sym=≥
    [[ $op == ">=" ]] || sym=≤
    vals=($(per_round "$f" "$a" "$b"))
    for v in "${vals[@]}"; do
        [[ $(met "$v" "$t" "$op") == yes ]] && hit=$((hit + 1))
    done
    v=$(median "${vals[@]}")
    printf '| %s | %s%s | %s %s%s | %s | %s | %d of %d |\n' "$label" "$v" "$unit" \
        "$sym" "$t" "$unit" "$(met "$v" "$t" "$op")" "${vals[*]}" "$hit" "$rounds"
}

# open_table: the open loop's section of the table.
open_table() {
    local run pc fs99 tgt
    printf '## Open loop: latency at a fixed rate, %s req/s (%s)\n\n' \
        "$(commas "$open_rate_now")" "$open_rate_how"
    printf 'idem-open-loop (bench/open_loop.c), %d keep-alive connections, %d thread(s): request i is due at\n' \
        "$conns" "$open_threads"
    printf 'start + i / rate, whatever became of the others, and goes out on the first idle connection; its latency\n'
    printf 'runs from that due time to the end of its answer (coordinated omission corrected). %d s counted after\n' \
        "$open_seconds"
    printf '1 s of warm-up at the same rate; unique keys. "added": the run'"'"'s percentile minus direct'"'"'s, the\n'
    printf 'median of the rounds'"'"' own. "service": sent → answered, what a closed-loop client would time; "lag":\n'
    printf 'due → sent, the wait for an idle connection (or for the client).'
    ((rounds == 1)) || printf ' Each row is its run'"'"'s median round by p99.'
    printf '\n\n'
    printf '| run | answered req/s | rate ÷ its closed-loop req/s | p50 ms | p99 ms | p99.9 ms | max ms | added p50 / p99 / p99.9 ms | service p99 ms | lag p99 ms | statuses | CPU %% of a core (client / upstream / proxy / idem / rest) | idem executions |\n'
    printf '|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|\n'
    for run in $open_all; do
        have "open-$run" || continue
        local o=open-$run added="–" ex="–" load="–"
        # Above 1, the target cannot answer that fast: requests queue.
        have "$run" && load=$(ratio "$open_rate_now" "${R[$run.rps]}")
        if [[ $run != direct ]] && have open-direct; then
            added=""
            for pc in p50_us p99_us p999_us; do
                added+="$(median $(per_round "(a - b) / 1000" "$o.$pc" "open-direct.$pc")) / "
            done
            added=${added% / }
        fi
        [[ $run == direct || $run == proxy ]] || ex=$(commas "${R[$o.h_executions]}")
        local what
        what=$(describe "$run")
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s / %s / %s | %s |\n' \
            "${what/wrk →/idem-open-loop →}" "$(commas "${R[$o.rps]}")" "$load" "$(ms "${R[$o.p50_us]}")" \
            "$(ms "${R[$o.p99_us]}")" "$(ms "${R[$o.p999_us]}")" "$(ms "${R[$o.max_us]}")" \
            "$added" "$(ms "${R[$o.svc_p99_us]}")" "$(ms "${R[$o.lag_p99_us]}")" \
            "${R[$o.statuses]// /, }" "${R[$o.cpu_wrk]}" "${R[$o.cpu_upstream]}" \
            "${R[$o.cpu_proxy]}" "${R[$o.cpu_idem]}" "${R[$o.cpu_other]}" "$ex"
    done
    fs99=$(ms "${R[fsync.p99_us]}")
    local t50 t99
    t50=$(awk -v f="${R[fsync.p50_us]}" 'BEGIN { printf "%.2f", 2 * f / 1000 + 0.3 }')
    t99=$(awk -v f="${R[fsync.p99_us]}" 'BEGIN { printf "%.2f", 2 * f / 1000 + 1 }')
    printf '\nThe disk where idem'"'"'s SQLite file lives (%s, `idem-fsync-time`: 1000 × a 4 KiB write + `fdatasync`,\n' "$fstype"
    printf 'measured before the open-loop runs): p50 %s ms, p99 %s ms, max %s ms. An execution waits for two\n' \
        "$(ms "${R[fsync.p50_us]}")" "$fs99" "$(ms "${R[fsync.max_us]}")"
    printf 'durable writes. Targets: the p50 idem adds over direct ≤ 2 × the disk'"'"'s p50 + 0.3 ms = %s ms; the\n' "$t50"
    printf 'p99 it adds ≤ what the nginx proxy adds + 2 × the disk'"'"'s p99 + 1 ms, that is idem'"'"'s p99 − the\n'
    printf 'proxy'"'"'s p99 ≤ %s ms (each round'"'"'s own figures).\n\n' "$t99"
    printf '| figure | value | target | met | each round | met in |\n|---|---:|---:|:---:|---|---:|\n'
    for run in record-unique lock-unique; do
        have "open-$run" && have open-direct || continue
        target_row "$(describe "$run"): p50 added over direct, open loop" " ms" "$t50" "<=" \
            "(a - b) / 1000" "open-$run.p50_us" open-direct.p50_us
        have open-proxy || continue
        target_row "$(describe "$run"): p99 over the nginx proxy's, open loop" " ms" "$t99" "<=" \
            "(a - b) / 1000" "open-$run.p99_us" open-proxy.p99_us
    done
    if ((rounds > 1)); then
        printf '\np99 ms in each round (open loop):\n\n| run |'
        for ((r = 1; r <= rounds; r++)); do printf ' round %d |' "$r"; done
        printf '\n|---|'
        for ((r = 1; r <= rounds; r++)); do printf -- '---:|'; done
        printf '\n'
        for run in $open_all; do
            have "open-$run" || continue
            what=$(describe "$run")
            printf '| %s |' "${what/wrk →/idem-open-loop →}"
            for ((r = 1; r <= rounds; r++)); do printf ' %s |' "$(ms "${R[open-$run@$r.p99_us]}")"; done
            printf '\n'
        done
    fi
    printf '\n'
}

out=$out_md
mkdir -p "$(dirname "$out")"
{
    if ((open_loop)); then
        printf '# Idem gateway latency benchmark: open loop, and closed loop beside it\n\n'
    else
        printf '# Idem gateway benchmark\n\n'
    fi
    printf '%s · %s · %d cores · Linux %s · idem %s · nginx %s (worker_processes %s) · wrk %s `-t%s -c%s -d%ss --latency` · %s\n\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$(nproc)" "$(uname -r)" \
        "${idem_version:-?}" "$nginx_version" "$nginx_workers" "$wrk_version" "$wthreads" \
        "$conns" "$seconds" "$where"
    if ((open_loop)); then
        printf 'Everything on 127.0.0.1, load generators included: the servers, wrk and idem-open-loop share the %d cores.\n' "$(nproc)"
    else
        printf 'Everything on 127.0.0.1, load generator included: the servers and wrk share the %d cores.\n' "$(nproc)"
    fi
    printf 'Every request: `POST /refunds {"refund_no":"<key>","amount":"1.00"}`; the upstream answers `201 {"ok":true}`.\n'
    if ((rounds > 1)); then
        printf '%d rounds, each measuring every run once, in turn; each row is its run'"'"'s median round by req/s.\n' "$rounds"
    fi
    printf '\n'
    if ((open_loop)); then
        open_table
        printf '## Closed loop (wrk), in the same run\n\n'
        printf 'wrk `-t%s -c%s -d%ss`: each connection sends its next request when the last answer is in.\n\n' \
            "$wthreads" "$conns" "$seconds"
    fi
    printf '| run | req/s | × nginx proxy | p50 ms | p99 ms | max ms | idem executions | idem replays | statuses | CPU %% of a core (%s) | idem CPU µs / req | idem context switches / req |\n' "$cpu_cols"
    printf '|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|\n'
    for run in $all_runs; do
        have "$run" || continue
        ex="–" rp="–" cu="–" cx="–"
        if [[ $run != direct && $run != proxy ]]; then
            ex=$(commas "${R[$run.h_executions]}") rp=$(commas "${R[$run.h_replays]}")
            cu=${R[$run.idem_cpu_us]} cx=${R[$run.ctxsw]}
        fi
        px="–"
        have proxy && px="$(median $(per_round "a / b" "$run.rps" proxy.rps))×"
        cpu_idem=${R[$run.cpu_idem]}
        [[ -z $store_pids ]] || cpu_idem+=" / ${R[$run.cpu_store]}"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s / %s / %s | %s | %s |\n' \
            "$(describe "$run")" "$(commas "${R[$run.rps]}")" "$px" "$(ms "${R[$run.p50_us]}")" \
            "$(ms "${R[$run.p99_us]}")" "$(ms "${R[$run.max_us]}")" "$ex" "$rp" \
            "${R[$run.statuses]// /, }" "${R[$run.cpu_wrk]}" "${R[$run.cpu_upstream]}" \
            "${R[$run.cpu_proxy]}" "$cpu_idem" "${R[$run.cpu_other]}" "$cu" "$cx"
    done
    # Each target figure is computed within each round (a ratio then compares
    # measurements a minute apart, not ten), and judged at its median.
    printf '\n## Targets\n\n'
    if ((rounds > 1)); then
        printf 'Each figure is computed within each round, from that round'"'"'s measurements; the value is\n'
        printf 'the median over the %d rounds, and "met" judges that median (as the × nginx proxy column).\n\n' "$rounds"
    fi
    printf '| figure | value | target | met | each round | met in |\n|---|---:|---:|:---:|---|---:|\n'
    if have record-unique && have proxy; then
        target_row "idem [record] unique keys / nginx proxy, req/s" "×" 0.5 ">=" "a / b" \
            record-unique.rps proxy.rps
    fi
    if have record-mix && have proxy; then
        target_row "idem [record] $((100 - fresh_pct))% replays / nginx proxy, req/s" "×" 1.0 ">=" \
            "a / b" record-mix.rps proxy.rps
    fi
    if have record-unique && have direct; then
        target_row "idem [record] unique keys: p99 added over direct, $conns connections" " ms" 2 "<=" \
            "(a - b) / 1000" record-unique.p99_us direct.p99_us
    fi
    if ((rounds > 1)); then
        printf '\nreq/s in each round (each run'"'"'s row in the first table is its median round):\n\n| run |'
        for ((r = 1; r <= rounds; r++)); do printf ' round %d |' "$r"; done
        printf '\n|---|'
        for ((r = 1; r <= rounds; r++)); do printf -- '---:|'; done
        printf '\n'
        for run in $all_runs; do
            have "$run" || continue
            printf '| %s |' "$(describe "$run")"
            for ((r = 1; r <= rounds; r++)); do printf ' %s |' "$(commas "${R[$run@$r.rps]}")"; done
            printf '\n'
        done
    fi
    printf '\nFor reference, not targets (p99 added: the median of the rounds'"'"' own; operations and time per commit:\n'
    printf 'from each run'"'"'s median round):\n\n| figure | value |\n|---|---:|\n'
    for run in proxy record-mix record-replay lock-unique lock-mix states-unique states-mix; do
        have "$run" && have direct || continue
        printf '| %s: p99 added over direct | %s ms |\n' "$(describe "$run")" \
            "$(median $(per_round "(a - b) / 1000" "$run.p99_us" direct.p99_us))"
    done
    for run in record-unique record-mix lock-unique lock-mix states-unique states-mix; do
        have "$run" || continue
        printf '| %s: store operations per %s (`committed_ops / commits`) | %s |\n' "$(describe "$run")" "$commit_what" \
            "$(awk -v o="${R[$run.h_committed_ops]}" -v c="${R[$run.h_commits]}" 'BEGIN { if (c > 0) printf "%.1f", o / c; else printf "n/a" }')"
        printf '| %s: mean time of a %s, from its first statement to durable (`commit_us / commits`) | %s ms |\n' "$(describe "$run")" "$commit_what" \
            "$(awk -v u="${R[$run.h_commit_us]}" -v c="${R[$run.h_commits]}" 'BEGIN { if (c > 0) printf "%.2f", u / c / 1000; else printf "n/a" }')"
    done
    if [[ -n $fsync_us ]]; then
        printf '| the disk alone: one 8 kB write + `fdatasync` (`pg_test_fsync -s 1`); an idem request waits for two durable writes | %s ms |\n' \
            "$(awk -v u="$fsync_us" 'BEGIN { printf "%.2f", u / 1000 }')"
    fi
    printf '\nidem executions / replays: deltas of `GET /_idem/v1/health` `gateway` counters over the\n'
    if [[ $store == embedded ]]; then
        printf 'measurement (a fresh idem serve and SQLite file per run; the mix and replay runs first execute\n'
    else
        printf 'measurement, summed over the instances (fresh ones per run, on the shared store, which keeps\n'
        printf 'every earlier run'"'"'s records; latencies: the larger of the wrk processes'"'"' figures, an upper\n'
        printf 'bound of the combined percentile; the mix and replay runs first execute, through one instance,\n'
    fi
    printf '%d seed keys, not counted). The token layer is not measured here (each request would need a\n' "$seed_keys"
    printf 'fresh token from the JSON API): `bash bench/run.sh` measures it. See bench/README.md.\n'
    print_notes_and_problems
} >"$out"

# The raw figures, for bench/distributed.sh: one object per run.
json_str() { # a JSON string literal
    local v=${1//\\/\\\\}
    v=${v//\"/\\\"}
    v=${v//$'\t'/ }
    printf '"%s"' "${v//$'\n'/ }"
}
if [[ -n $out_raw ]]; then
    {
        printf '{"bench":"gateway","store":"%s","instances":%d,"connections":%d,"wrk_threads":%d,"seconds":%d,"rounds":%d,"seed_keys":%d,"fresh_pct":%d,"idem_version":%s,"nginx_version":%s,"wrk_version":%s,"runs":{' \
            "$store" "$instances" "$conns" "$wthreads" "$seconds" "$rounds" "$seed_keys" \
            "$fresh_pct" "$(json_str "${idem_version:-}")" "$(json_str "$nginx_version")" \
            "$(json_str "$wrk_version")"
        sep=""
        for run in $all_runs $(for r in $open_all; do echo "open-$r"; done); do
            have "$run" || continue
            printf '%s\n  "%s":{"description":%s' "$sep" "$run" "$(json_str "$(describe "${run#open-}")")"
            sep=","
            for f in round requests rps p50_us p99_us max_us p999_us svc_p50_us svc_p99_us \
                svc_p999_us lag_p50_us lag_p99_us rate answered replayed errors_connect errors_read \
                errors_write errors_timeout wrk_cpu cpu_wrk cpu_upstream cpu_proxy cpu_idem \
                cpu_store cpu_other idem_cpu_us ctxsw h_requests h_executions h_replays \
                h_in_flight_409 h_mismatches h_store_errors h_upstream_unknown h_commits \
                h_committed_ops h_commit_us h_conflicts h_takeovers; do
                # The health counters (h_*) as idem_*, apart from wrk's figures.
                [[ -n ${R[$run.$f]:-} ]] && printf ',"%s":%s' "${f/#h_/idem_}" "${R[$run.$f]}"
            done
            # Each round's req/s and p99, in round order (for bench/growth.sh).
            each_rps="" each_p99=""
            for ((r = 1; r <= rounds; r++)); do
                each_rps+="${R[$run@$r.rps]} " each_p99+="${R[$run@$r.p99_us]} "
            done
            printf ',"statuses":%s,"wrk_rps_each":%s,"rps_each_round":%s,"p99_us_each_round":%s}' \
                "$(json_str "${R[$run.statuses]}")" "$(json_str "${R[$run.rps_parts]}")" \
                "$(json_str "${each_rps% }")" "$(json_str "${each_p99% }")"
        done
        printf '\n}'
        ((open_loop)) && printf ',"open_rate":%s,"fsync_4k":{"p50_us":%s,"p99_us":%s,"max_us":%s}' \
            "$open_rate_now" "${R[fsync.p50_us]}" "${R[fsync.p99_us]}" "${R[fsync.max_us]}"
        printf ',"notes":['
        sep=""
        for p in "${notes[@]}"; do printf '%s%s' "$sep" "$(json_str "$p")"; sep=","; done
        printf '],"problems":['
        sep=""
        for p in "${problems[@]}"; do printf '%s%s' "$sep" "$(json_str "$p")"; sep=","; done
        printf ']}\n'
    } >"$out_raw"
fi

echo >&2
cat "$out"
echo >&2
echo "written to $out${out_raw:+ and $out_raw}" >&2
if ((${#problems[@]})); then
    echo "bench/gateway.sh: ${#problems[@]} problem(s) seen; see the end of the table" >&2
fi
