#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/consume.sh — the consumer benchmark: `bash bench/consume.sh`.
#
# Measures, side by side in one run, messages/s of draining a preloaded
# queue (or stream) through a trivial HTTP handler:
#   plain   bench/plain_consumer.c: prefetch 64, POST each body to the
#           handler on one keep-alive connection, ack; no deduplication
#   idem    `idem consume` on its embedded store (a SQLite file, durable
#           records): the same prefetch and handler, key { json: id }
# on RabbitMQ and Redis Streams, with unique keys and with 90% duplicates
# (10% of the keys, each published 10 times, interleaved). Every message is
# {"id":"k-<n>","amount":"1.00"} (a duplicate is the same body again); the handler is the nginx of
# bench/gateway.sh (bench/nginx/upstream.conf.in: 201 {"ok":true}). Then it
# prints a markdown table with the ratios and the targets and writes it to
# bench/results/consume-latest.md.
#
# Each measurement: publish N messages to a fresh queue (stream), wait
# until the broker holds them all, start the consumer, and time from its
# start until every message is acked: the plain consumer exits then (after
# a synchronous command behind its last ack); idem's metrics say so
# (N received, none in flight; polled every 50 ms). Then the queue must be
# empty once the consumer is gone, and idem's N executed or duplicates.
#
# Environment (defaults in brackets):
#   IDEM_MQ_MESSAGES [20000]   messages per measurement (N), a multiple of 10
#   IDEM_MQ_ROUNDS [3]         rounds, each measuring every run once, in turn;
#                              a row shows its median round (odd: one round's)
#   IDEM_MQ_PREFETCH [64]      prefetch of both consumers
#   IDEM_MQ_RUNS [all]         comma-separated subset of: amqp-unique,
#                              amqp-dup, redis-unique, redis-dup
#   IDEM_MQ_AMQP_PORT [29672], IDEM_MQ_REDIS_PORT [29379],
#   IDEM_MQ_PG_PORT [29432]    the servers scripts/services.sh starts
#                              (PostgreSQL comes with Redis there; unused)
#   IDEM_MQ_HANDLER_PORT [29900]  the handler's nginx
#   TMPDIR [/tmp]              the temp dir (idem's SQLite file): a disk,
#                              not tmpfs
#   IDEM_MQ_OUT [bench/results/consume-latest.md]  where the table goes
# Needs RabbitMQ, Redis, PostgreSQL (for services.sh), nginx and the build
# dependencies: it installs what is missing from Debian's packages. Takes
# about a minute a round on a 2-core VM, plus RabbitMQ's start.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
n_msgs=${IDEM_MQ_MESSAGES:-20000}
rounds=${IDEM_MQ_ROUNDS:-3}
prefetch=${IDEM_MQ_PREFETCH:-64}
runs=${IDEM_MQ_RUNS:-all}
amqp_port=${IDEM_MQ_AMQP_PORT:-29672}
redis_port=${IDEM_MQ_REDIS_PORT:-29379}
pg_port=${IDEM_MQ_PG_PORT:-29432}
handler_port=${IDEM_MQ_HANDLER_PORT:-29900}
out_md=${IDEM_MQ_OUT:-bench/results/consume-latest.md}
all_runs="amqp-unique amqp-dup redis-unique redis-dup"
[[ $runs == all ]] && runs=$all_runs
runs=${runs//,/ }

die() { echo "bench/consume.sh: $*" >&2; exit 1; }
for v in n_msgs rounds prefetch amqp_port redis_port pg_port handler_port; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
done
((n_msgs % 10 == 0)) || die "IDEM_MQ_MESSAGES must be a multiple of 10"
((rounds % 2 == 1)) || die "IDEM_MQ_ROUNDS must be odd, so that a median is one round's figure"
((prefetch <= 65535)) || die "IDEM_MQ_PREFETCH must be at most 65535"
for r in $runs; do
    [[ " $all_runs " == *" $r "* ]] || die "unknown run '$r' in IDEM_MQ_RUNS (known: $all_runs)"
done

# ---- what it needs -----------------------------------------------------------
# The project's dependencies (RabbitMQ, Redis and PostgreSQL among them) from
# scripts/install-deps.sh, which does nothing when all are there; nginx
# beside them, as bench/gateway.sh installs it.
bash scripts/install-deps.sh >&2 || die "scripts/install-deps.sh failed"
if ! command -v nginx >/dev/null 2>&1 && ! [[ -x /usr/sbin/nginx ]]; then
    echo "bench/consume.sh: installing nginx-light" >&2
    as_root=()
    ((EUID == 0)) || as_root=(sudo)
    "${as_root[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
            --no-install-recommends nginx-light >/dev/null ||
        die "could not install nginx-light (apt-get install -y nginx-light)"
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-mq.XXXXXX")
# Two state dirs: services.sh start clears its dir, RabbitMQ's state included.
svc=$work/services svc_mq=$work/rabbitmq
# The admin listener's key for the metrics: made for this run.
IDEM_BENCH_KEY=$(openssl rand -hex 32)
export IDEM_BENCH_KEY
pgids=() # process groups we started (each a session leader)
services_up=""
stop_pgid() { # TERM the group; KILL it should its leader (our child) outlive 10 s
    local g=$1 guard
    kill -TERM -- "-$g" 2>/dev/null || return 0
    { sleep 10; kill -KILL -- "-$g" 2>/dev/null; } &
    guard=$!
    wait "$g" 2>/dev/null || true
    kill "$guard" 2>/dev/null || true
}
forget_pgid() {
    local g keep=()
    for g in "${pgids[@]}"; do [[ $g == "$1" ]] || keep+=("$g"); done
    pgids=("${keep[@]}")
}
cleanup() {
    local g
    for g in "${pgids[@]}"; do stop_pgid "$g"; done
    [[ $services_up != *rabbitmq* ]] || bash scripts/services.sh rabbitmq-stop "$svc_mq" || true
    [[ $services_up != *redis* ]] || bash scripts/services.sh stop "$svc" || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build -------------------------------------------------------------------
echo "== building idem and idem-plain-consumer (Release, build-bench/)" >&2
if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
       cmake --build build-bench -j"$(nproc)" --target idem_cli idem-plain-consumer; } \
       >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    die "build failed"
fi
idem_bin=$PWD/build-bench/idem
plain_bin=$PWD/build-bench/bench/idem-plain-consumer
idem_version=$("$idem_bin" --version 2>/dev/null | awk '{print $NF}' || true)

fstype=$(df --output=fstype "$work" 2>/dev/null | tail -n 1 || stat -f -c %T "$work")
if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
    echo "bench/consume.sh: warning: $work is on $fstype: fsync costs nothing there, so" \
         "the idem figures mean little; set TMPDIR to a directory on a disk" >&2
fi

source bench/cpu.sh # group_ticks, machine_ticks, clk_tck

# ---- the servers -------------------------------------------------------------
echo "== RabbitMQ on :$amqp_port, Redis on :$redis_port (scripts/services.sh, in $work)" >&2
services_up+=" rabbitmq"
bash scripts/services.sh rabbitmq-start "$svc_mq" "$amqp_port" >"$work/rabbitmq.log" 2>&1 ||
    { cat "$work/rabbitmq.log" >&2; die "RabbitMQ did not start"; }
services_up+=" redis"
bash scripts/services.sh start "$svc" "$redis_port" "$pg_port" >"$work/redis.log" 2>&1 ||
    { cat "$work/redis.log" >&2; die "Redis (and PostgreSQL) did not start"; }
amqp_url="amqp://guest:guest@127.0.0.1:$amqp_port/%2f"
redis_url="redis://127.0.0.1:$redis_port/0"
# The brokers' servers (the shell wrapper of RabbitMQ's, with its children;
# Redis), for the CPU they took.
broker_pids="$(cat "$svc_mq/rabbitmq/server.pid") $(cat "$svc/redis/redis.pid")"
rabbit_version=$(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null | sed 's/-.*//' || true)
redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')

# The handler: bench/gateway.sh's trivial nginx upstream.
h=$work/handler
mkdir -p "$h"
user_line=
# As root, nginx's workers would switch to `nobody`, who cannot enter the
# private temp dir: keep them as the current user.
((EUID == 0)) && user_line="user $(id -un) $(id -gn);"
temp="    client_body_temp_path $h/client_body;"
for m in proxy fastcgi uwsgi scgi; do
    [[ $("$nginx_bin" -V 2>&1) == *--without-http_${m}_module* ]] || temp+=" ${m}_temp_path $h/$m;"
done
awk -v user="$user_line" -v dir="$h" -v port="$handler_port" -v temp="$temp" '
    { gsub(/@USER@/, user); gsub(/@WORKERS@/, 1); gsub(/@DIR@/, dir); gsub(/@PORT@/, port)
      gsub(/@TEMP_PATHS@/, temp); print }' bench/nginx/upstream.conf.in >"$h/nginx.conf"
setsid "$nginx_bin" -p "$h" -e "$h/error.log" -c "$h/nginx.conf" </dev/null >"$h/stderr.log" 2>&1 &
handler_pgid=$!
pgids+=("$handler_pgid")
handler_url="http://127.0.0.1:$handler_port/handle"
for ((i = 0; ; i++)); do
    curl -s -o /dev/null "http://127.0.0.1:$handler_port/_nginx_status" && break
    ((i < 100)) || { cat "$h/error.log" "$h/stderr.log" >&2; die "nginx did not start on :$handler_port"; }
    sleep 0.1
done
nginx_version=$("$nginx_bin" -v 2>&1 | sed 's|.*nginx/||')
# The handler's requests served so far; this read is one of them.
handler_requests() {
    curl -s "http://127.0.0.1:$handler_port/_nginx_status" | awk 'NR == 3 { print $3 }'
}

# ---- one measurement ----------------------------------------------------------
problems=() notes=()
declare -A R # R[run@round.field]
now() { date +%s.%N; }
# CPU ticks so far: the machine's (busy), the brokers', the handler's.
cpu_snap() { echo "$(machine_ticks) $(tree_ticks $broker_pids) $(group_ticks "$handler_pgid")"; }
# cpu_keep KEY WHO SNAP0 SNAP1 CONSUMER_TICKS: R[KEY.WHO_cpu_us] (the
# consumer's CPU per message), R[KEY.WHO_broker_us] (the brokers' per
# message) and R[KEY.WHO_rest] (percent of a core that went to anything
# else: other processes, kernel threads) over R[KEY.WHO_s].
cpu_keep() {
    local k=$1 who=$2 c=$5 m0 b0 h0 m1 b1 h1
    read -r m0 b0 h0 <<<"$3"
    read -r m1 b1 h1 <<<"$4"
    R[$k.${who}_cpu_us]=$(awk -v t="$c" -v hz="$clk_tck" -v n="$n_msgs" 'BEGIN { printf "%.0f", t / hz * 1e6 / n }')
    R[$k.${who}_broker_us]=$(awk -v t=$((b1 - b0)) -v hz="$clk_tck" -v n="$n_msgs" 'BEGIN { printf "%.0f", t / hz * 1e6 / n }')
    R[$k.${who}_rest]=$(awk -v t=$((m1 - m0 - (b1 - b0) - (h1 - h0) - c)) -v hz="$clk_tck" -v s="${R[$k.${who}_s]}" \
        'BEGIN { r = t / hz / s * 100; printf "%.0f", (r > 0 ? r : 0) }')
    if ((R[$k.${who}_rest] > 30)); then
        notes+=("$k: $who: ${R[$k.${who}_rest]}% of a core went to other processes or kernel threads: its figure may be low")
    fi
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# source_args RUN NAME: the plain consumer's flags for the run's queue or stream.
source_args() {
    case $1 in
    amqp-*) echo "--amqp $amqp_url --queue $2" ;;
    redis-*) echo "--redis $redis_url --stream $2" ;;
    esac
}

# metric TEXT NAME: the value of idem_consumer_NAME in the metrics TEXT.
metric() { awk -v n="idem_consumer_$2{" 'index($0, n) == 1 { print $2; exit }' <<<"$1"; }

measure_plain() { # RUN ROUND QUEUE
    local run=$1 round=$2 q=$3 k=$1@$2 t0 t1 s0 s1 h0 h1 left line
    h0=$(handler_requests) s0=$(cpu_snap) t0=$(now)
    # shellcheck disable=SC2046 # the flags are words
    setsid bash -c 'TIMEFORMAT="%U %S"; time "$@"' plain "$plain_bin" consume \
        $(source_args "$run" "$q") --group plain --handler "$handler_url" --count "$n_msgs" \
        --prefetch "$prefetch" </dev/null >"$work/$k.plain" 2>"$work/$k.plain.time" &
    local pid=$!
    pgids+=("$pid")
    wait "$pid" || { cat "$work/$k.plain" "$work/$k.plain.time" >&2; die "$k: the plain consumer failed"; }
    t1=$(now) s1=$(cpu_snap) h1=$(handler_requests)
    forget_pgid "$pid"
    line=$(grep '^PLAIN' "$work/$k.plain") || die "$k: no result from the plain consumer"
    R[$k.plain_s]=$(secs "$t0" "$t1")
    R[$k.plain_calls]=$((h1 - h0 - 1))
    R[$k.plain_acked]=$(sed 's/.* acked=\([0-9]*\).*/\1/' <<<"$line")
    cpu_keep "$k" plain "$s0" "$s1" \
        "$(awk -v hz="$clk_tck" '{ printf "%.0f", ($1 + $2) * hz }' "$work/$k.plain.time")"
    # shellcheck disable=SC2046
    left=$("$plain_bin" depth $(source_args "$run" "$q") --group plain)
    [[ $left == 0 ]] || problems+=("$k: plain: $left messages left in $q after the run")
}

idem_metrics() { # DIR
    curl -s --max-time 10 --unix-socket "$1/idem-admin.sock" \
        -H "Authorization: Bearer $IDEM_BENCH_KEY" http://idem/metrics
}

measure_idem() { # RUN ROUND QUEUE
    local run=$1 round=$2 q=$3 k=$1@$2 d=$work/$1@$2.idem src t0 t1 s0 s1 h0 h1 c0 c1 m="" c
    mkdir -p "$d"
    case $run in
    amqp-*) src="{ amqp: \"$amqp_url\", queue: $q, prefetch: $prefetch }" ;;
    redis-*) src="{ redis_stream: \"$redis_url\", stream: $q, group: idem }" ;;
    esac
    sed -e "s|@DIR@|$d|g" -e "s|@SOURCE@|$src|" -e "s|@HANDLER@|$handler_url|" \
        bench/consume/idem.yaml.in >"$d/idem.yaml"
    h0=$(handler_requests) s0=$(cpu_snap) t0=$(now)
    setsid "$idem_bin" consume -c "$d/idem.yaml" </dev/null >"$d/idem.log" 2>&1 &
    local pid=$!
    pgids+=("$pid")
    # Done when every message is received and none is held: each was
    # acked (after its record was durable) or dead-lettered.
    local deadline=$((SECONDS + 300))
    for ((;;)); do
        # One curl and one awk a poll: the polling shares the cores too.
        if [[ -S $d/idem-admin.sock ]] && m=$(idem_metrics "$d") &&
            awk -v n="$n_msgs" '/^idem_consumer_received_total\{/ { r = $2 }
                /^idem_consumer_in_flight\{/ { f = $2 } END { exit !(r == n && f == 0) }' <<<"$m"; then
            break
        fi
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$d/idem.log" >&2; die "$k: idem consume exited"; }
        ((SECONDS < deadline)) ||
            { tail -n 20 "$d/idem.log" >&2; die "$k: idem did not finish in 300 s: $m"; }
        sleep 0.05
    done
    t1=$(now) c1=$(group_ticks "$pid") s1=$(cpu_snap) h1=$(handler_requests)
    R[$k.idem_s]=$(secs "$t0" "$t1")
    R[$k.idem_calls]=$((h1 - h0 - 1))
    R[$k.idem_executed]=$(metric "$m" executed_total)
    R[$k.idem_duplicates]=$(metric "$m" duplicates_total)
    cpu_keep "$k" idem "$s0" "$s1" "$c1"
    for c in retried dead_lettered store_waits reconnects; do
        c0=$(metric "$m" "${c}_total")
        [[ ${c0:-0} == 0 ]] || problems+=("$k: idem_consumer_${c}_total = $c0")
    done
    kill -TERM "$pid"
    wait "$pid" || problems+=("$k: idem consume did not exit 0 on SIGTERM")
    forget_pgid "$pid"
    if grep -v -e 'idem: consuming' -e 'declared queue' -e 'made group' -e 'connected to' -e 'draining' \
        -e 'idem: stopped' -e 'API key bench (scope read) in use' "$d/idem.log" | grep -q .; then
        problems+=("$k: idem logged: $(head -c 600 "$d/idem.log" | tr '\n' '|')")
    fi
    # shellcheck disable=SC2046
    c0=$("$plain_bin" depth $(source_args "$run" "$q") --group idem)
    [[ $c0 == 0 ]] || problems+=("$k: idem: $c0 messages left in $q after the run")
}

run_one() { # RUN ROUND
    local run=$1 round=$2 k=$1@$2 unique=$n_msgs q
    [[ $run == *-dup ]] && unique=$((n_msgs / 10))
    R[$k.unique]=$unique
    # A queue (stream) of its own for each consumer: both start from N.
    # Which goes first alternates from round to round, so that a drift of
    # the machine's speed during a round favours neither.
    local order="plain idem"
    ((round % 2)) || order="idem plain"
    for who in $order; do
        q=bench.$run.$round.$who.$$
        "$plain_bin" publish $(source_args "$run" "$q") --count "$n_msgs" --unique "$unique" ||
            die "$k: publishing to $q failed"
        "measure_$who" "$run" "$round" "$q"
    done
    local c
    for c in plain_calls plain_acked; do
        [[ ${R[$k.$c]} == "$n_msgs" ]] || problems+=("$k: plain ${c#plain_} ${R[$k.$c]}, expected $n_msgs")
    done
    (( ${R[$k.idem_executed]} + ${R[$k.idem_duplicates]} == n_msgs )) ||
        problems+=("$k: idem executed ${R[$k.idem_executed]} + duplicates ${R[$k.idem_duplicates]} != $n_msgs")
    for c in idem_calls idem_executed; do
        [[ ${R[$k.$c]} == "$unique" ]] || problems+=("$k: idem ${c#idem_} ${R[$k.$c]}, expected $unique (one per key)")
    done
    R[$k.plain_rate]=$(awk -v n="$n_msgs" -v s="${R[$k.plain_s]}" 'BEGIN { printf "%.0f", n / s }')
    R[$k.idem_rate]=$(awk -v n="$n_msgs" -v s="${R[$k.idem_s]}" 'BEGIN { printf "%.0f", n / s }')
    R[$k.ratio]=$(awk -v a="${R[$k.idem_rate]}" -v b="${R[$k.plain_rate]}" 'BEGIN { printf "%.2f", a / b }')
    printf '   %-13s plain %6s msg/s (%ss)  idem %6s msg/s (%ss)  %s×  handler calls %s / %s\n' \
        "$k" "${R[$k.plain_rate]}" "${R[$k.plain_s]}" "${R[$k.idem_rate]}" "${R[$k.idem_s]}" \
        "${R[$k.ratio]}" "${R[$k.plain_calls]}" "${R[$k.idem_calls]}" >&2
}

echo "== $n_msgs messages a measurement, prefetch $prefetch, $rounds round(s); temp dir $work ($fstype)" >&2
for ((round = 1; round <= rounds; round++)); do
    echo "-- round $round of $rounds" >&2
    for run in $runs; do run_one "$run" "$round"; done
done
[[ ! -s $h/error.log ]] || problems+=("nginx logged: $(head -c 600 "$h/error.log" | tr '\n' '|')")

# ---- the table ------------------------------------------------------------------
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[(NR + 1) / 2] }'; }
commas() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]([,]|$)/, ",&", s); print s }'; }
describe() {
    case $1 in
    amqp-unique) echo "RabbitMQ, unique keys" ;;
    amqp-dup) echo "RabbitMQ, 90% duplicates" ;;
    redis-unique) echo "Redis Streams, unique keys" ;;
    redis-dup) echo "Redis Streams, 90% duplicates" ;;
    esac
}
section() { # TITLE ITEM...: the items as a list under that heading; nothing without items
    local title=$1
    shift
    (($#)) || return 0
    printf '\n## %s\n\n' "$title"
    printf -- '- %s\n' "$@"
}
mkdir -p "$(dirname "$out_md")"
{
    printf '# Idem consumer benchmark\n\n'
    printf '%s · %s · %d cores · Linux %s · idem %s · RabbitMQ %s · Redis %s · nginx %s · %s messages a measurement · prefetch %s · SQLite file on %s\n\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$(nproc)" "$(uname -r)" \
        "${idem_version:-?}" "${rabbit_version:-?}" "$redis_version" "$nginx_version" \
        "$(commas "$n_msgs")" "$prefetch" "$fstype"
    printf 'Everything on 127.0.0.1: broker, consumer and handler share the %d cores. Each measurement\n' "$(nproc)"
    printf 'drains a preloaded queue (stream) of its own, timed from the consumer'"'"'s start to its last ack;\n'
    printf 'msg/s = messages / that time. The handler (nginx) answers `201 {"ok":true}`.\n'
    ((rounds == 1)) || printf '%d rounds; each ratio is the median of the rounds'"'"' own ratios, each rate its median.\n' "$rounds"
    printf '\n| run | plain msg/s | idem msg/s | idem / plain | target | met | handler calls plain / idem | idem executed / duplicates | consumer CPU µs / msg plain / idem | broker CPU µs / msg plain / idem | rest of the machine %% plain / idem |\n'
    printf '|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|\n'
    for run in $all_runs; do
        [[ " $runs " == *" $run "* ]] || continue
        pr=() ir=() ra=()
        for ((r = 1; r <= rounds; r++)); do
            pr+=("${R[$run@$r.plain_rate]}") ir+=("${R[$run@$r.idem_rate]}") ra+=("${R[$run@$r.ratio]}")
        done
        ratio=$(median "${ra[@]}") target=0.7
        [[ $run == *-dup ]] && target=2
        met=$(awk -v v="$ratio" -v t="$target" 'BEGIN { print (v >= t ? "yes" : "**no**") }')
        # The other figures: the round whose ratio is the median.
        for ((r = 1; r <= rounds; r++)); do [[ ${R[$run@$r.ratio]} == "$ratio" ]] && break; done
        k=$run@$r
        printf '| %s | %s | %s | %s× | ≥ %s× | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s |\n' \
            "$(describe "$run")" "$(commas "$(median "${pr[@]}")")" "$(commas "$(median "${ir[@]}")")" \
            "$ratio" "$target" "$met" "$(commas "${R[$k.plain_calls]}")" "$(commas "${R[$k.idem_calls]}")" \
            "$(commas "${R[$k.idem_executed]}")" "$(commas "${R[$k.idem_duplicates]}")" \
            "${R[$k.plain_cpu_us]}" "${R[$k.idem_cpu_us]}" "${R[$k.plain_broker_us]}" \
            "${R[$k.idem_broker_us]}" "${R[$k.plain_rest]}" "${R[$k.idem_rest]}"
    done
    if ((rounds > 1)); then
        printf '\nEach round (plain / idem msg/s, ratio):\n\n| run |'
        for ((r = 1; r <= rounds; r++)); do printf ' round %d |' "$r"; done
        printf '\n|---|'
        for ((r = 1; r <= rounds; r++)); do printf -- '---:|'; done
        printf '\n'
        for run in $all_runs; do
            [[ " $runs " == *" $run "* ]] || continue
            printf '| %s |' "$(describe "$run")"
            for ((r = 1; r <= rounds; r++)); do
                printf ' %s / %s, %s× |' "$(commas "${R[$run@$r.plain_rate]}")" \
                    "$(commas "${R[$run@$r.idem_rate]}")" "${R[$run@$r.ratio]}"
            done
            printf '\n'
        done
    fi
    printf '\nHandler calls: requests nginx served during the measurement (its stub_status); idem must\n'
    printf 'call it once per key (N with unique keys, N/10 with 90%% duplicates), the plain consumer once\n'
    printf 'per message. CPU µs / msg: the consumer process'"'"'s own (user + system), and RabbitMQ'"'"'s and\n'
    printf 'Redis'"'"'s servers'"'"' together. Rest of the machine: percent of a core that went to neither\n'
    printf 'them, the consumer nor the handler (other processes, kernel threads: loopback, the disk).\n'
    printf 'The other figures of a row are from the round whose ratio is the median. See bench/README.md.\n'
    section Notes "${notes[@]}"
    section "Problems seen in this run" "${problems[@]}"
} >"$out_md"

echo >&2
cat "$out_md"
echo >&2
echo "written to $out_md" >&2
if ((${#problems[@]})); then
    echo "bench/consume.sh: ${#problems[@]} problem(s) seen; see the end of the table" >&2
fi
