#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run.sh — the one benchmark command: `bash bench/run.sh`.
#
# Builds idem-bench in Release (build-bench/), starts a private redis-server
# on loopback, measures the references (redis-benchmark SET NX PX and EVALSHA
# compare-and-delete; SQLite one transaction per INSERT) and Idem's token,
# lock and durable record layers, then prints a markdown table of each Idem
# figure against its reference and target, and writes it to
# bench/results/latest.md (raw figures: bench/results/latest.json).
#
# The gateway (idem serve against nginx) has its own command, bench/gateway.sh,
# and so has the distributed store (Redis + PostgreSQL, against redis-benchmark
# and pgbench running Idem's own scripts and statements): bench/distributed.sh.
# See bench/README.md.
#
# Environment: IDEM_BENCH_SECONDS (default 3) per measurement,
# IDEM_BENCH_THREADS (default 1,8,64), TMPDIR for the SQLite files and Redis.
# Needs the build dependencies (scripts/install-deps.sh) and redis-server +
# redis-tools. Takes about a minute on two cores.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${IDEM_BENCH_SECONDS:-3}
threads=${IDEM_BENCH_THREADS:-1,8,64}
requests=200000
clients=50

missing=()
for cmd in redis-server redis-cli redis-benchmark cmake; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if ((${#missing[@]})); then
    echo "bench/run.sh: missing: ${missing[*]}" >&2
    echo "install with: sudo apt-get install -y redis-server redis-tools cmake" \
         "(or run scripts/install-deps.sh)" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench.XXXXXX")
redis_pid=
cleanup() {
    if [[ -n $redis_pid ]]; then
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build -------------------------------------------------------------------
echo "== building idem-bench (Release, build-bench/)" >&2
if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
       cmake --build build-bench -j"$(nproc)" --target idem-bench; } >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    echo "bench/run.sh: build failed" >&2
    exit 1
fi
bench=build-bench/bench/idem-bench

fstype=$(df --output=fstype "$work" 2>/dev/null | tail -n 1 || stat -f -c %T "$work")
if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
    echo "bench/run.sh: warning: $work is on $fstype: fsync costs nothing there, so" \
         "the durable figures mean little; set TMPDIR to a directory on a disk" >&2
fi

# ---- redis references -----------------------------------------------------------
start_redis() {
    local tries port
    for ((tries = 0; tries < 10; tries++)); do
        port=$((20000 + RANDOM % 40000))
        # Something already answers there: try another.
        if (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --daemonize no --dir "$work" --logfile "$work/redis.log" &
        redis_pid=$!
        for _ in $(seq 50); do
            if [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; then
                redis_port=$port
                return 0
            fi
            kill -0 "$redis_pid" 2>/dev/null || break # lost the port: retry
            sleep 0.1
        done
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        redis_pid=
    done
    echo "bench/run.sh: could not start redis-server; its log:" >&2
    cat "$work/redis.log" >&2 || true
    exit 1
}

# Run redis-benchmark on one command; print its requests per second.
redis_rps() {
    local out rps
    out=$(redis-benchmark -h 127.0.0.1 -p "$redis_port" -c "$clients" -n "$requests" \
        -q -r 1000000 "$@" | tr '\r' '\n')
    rps=$(printf '%s\n' "$out" | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
    if [[ -z $rps ]]; then
        printf 'bench/run.sh: no requests/s in redis-benchmark output for %s:\n%s\n' \
            "$*" "$out" >&2
        exit 1
    fi
    echo "$rps"
}

start_redis
echo "== redis-server $(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/') on 127.0.0.1:$redis_port" >&2
set_nx=$(redis_rps SET key:__rand_int__ v NX PX 30000)
echo "redis SET NX PX          $set_nx requests/s" >&2
script="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
sha=$(redis-cli -h 127.0.0.1 -p "$redis_port" SCRIPT LOAD "$script")
if [[ ! $sha =~ ^[0-9a-f]{40}$ ]]; then
    echo "bench/run.sh: SCRIPT LOAD answered: $sha" >&2
    exit 1
fi
evalsha=$(redis_rps EVALSHA "$sha" 1 key:__rand_int__ v)
echo "redis EVALSHA cmp-and-del $evalsha requests/s" >&2
redis_version=$(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/')
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
redis_pid=

# ---- idem-bench ----------------------------------------------------------------
echo "== idem-bench --threads $threads --seconds $seconds --dir $work ($fstype)" >&2
"$bench" --threads "$threads" --seconds "$seconds" --dir "$work" --json >"$work/idem.json"

# ---- the table -----------------------------------------------------------------
mkdir -p bench/results
cp "$work/idem.json" bench/results/latest.json
awk -v set_nx="$set_nx" -v evalsha="$evalsha" -v redis_version="$redis_version" \
    -v host="$(uname -n)" -v cores="$(nproc)" -v kernel="$(uname -r)" \
    -v date="$(date -u '+%Y-%m-%d %H:%M UTC')" -v fstype="$fstype" \
    -v clients="$clients" -v requests="$requests" '
function field(line, k,    m) {
    if (!match(line, "\"" k "\":(\"[^\"]*\"|[^,}]*)")) return ""
    m = substr(line, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
    gsub(/"/, "", m)
    return m
}
function commas(x,    s, neg) {
    s = sprintf("%.0f", x)
    neg = s ~ /^-/; if (neg) s = substr(s, 2)
    while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]([,]|$)/, ",&", s)
    return (neg ? "-" : "") s
}
function us(x) { return x >= 100 ? sprintf("%.0f", x) : sprintf("%.2f", x) }
function ratio(a, b) { return b > 0 ? sprintf("%.1f×", a / b) : "n/a" }
/"idem_version"/ { idem_version = field($0, "idem_version"); sqlite_version = field($0, "sqlite_version"); secs = field($0, "seconds") }
/"workload"/ {
    n++
    w[n] = field($0, "workload"); t[n] = field($0, "threads") + 0
    ops[n] = field($0, "ops_per_s") + 0; p50[n] = field($0, "p50_us") + 0
    p99[n] = field($0, "p99_us") + 0; wpc[n] = field($0, "writes_per_commit") + 0
    if (t[n] > tmax) tmax = t[n]
    if (w[n] == "sqlite-baseline" && ops[n] > sqlite_best) { sqlite_best = ops[n]; sqlite_best_t = t[n] }
}
END {
    redis_ref = set_nx > evalsha ? set_nx : evalsha
    printf "# Idem benchmark\n\n"
    printf "%s · %s · %d cores · Linux %s · idem %s · SQLite %s · Redis %s · %s s per measurement · SQLite files on %s\n\n",
        date, host, cores, kernel, idem_version, sqlite_version, redis_version, secs, fstype
    printf "## References\n\n| reference | ops/s |\n|---|---:|\n"
    printf "| Redis `SET key v NX PX 30000` (redis-benchmark, %d clients, %s requests, loopback) | %s |\n", clients, commas(requests), commas(set_nx)
    printf "| Redis `EVALSHA` compare-and-delete (same) | %s |\n", commas(evalsha)
    for (i = 1; i <= n; i++) if (w[i] == "sqlite-baseline")
        printf "| SQLite autocommit INSERT, WAL, synchronous=FULL, %d thread%s | %s |\n", t[i], t[i] == 1 ? "" : "s", commas(ops[i])
    printf "\n## Layers 1 and 2: in-memory tokens and locks vs Redis (target ≥ 10× both)\n\n"
    printf "| Idem operation | threads | ops/s | p50 µs | p99 µs | × SET NX | × EVALSHA | target met |\n"
    printf "|---|---:|---:|---:|---:|---:|---:|:---:|\n"
    for (i = 1; i <= n; i++) {
        if (w[i] == "token") name = "token issue + consume"
        else if (w[i] == "lock") name = "lock acquire + release"
        else continue
        met = ops[i] >= 10 * redis_ref ? "yes" : "**no**"
        printf "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, t[i], commas(ops[i]),
            us(p50[i]), us(p99[i]), ratio(ops[i], set_nx), ratio(ops[i], evalsha), met
    }
    printf "\n## Layer 3: durable records vs SQLite one transaction per INSERT (target ≥ 4× at %d threads)\n\n", tmax
    printf "Reference: the best SQLite rate above, %s inserts/s at %d thread%s.\n\n", commas(sqlite_best), sqlite_best_t, sqlite_best_t == 1 ? "" : "s"
    printf "| Idem operation | threads | ops/s | p50 µs | p99 µs | writes/fsync | × SQLite | target met |\n"
    printf "|---|---:|---:|---:|---:|---:|---:|:---:|\n"
    for (i = 1; i <= n; i++) {
        if (w[i] != "record") continue
        met = t[i] != tmax ? "–" : (ops[i] >= 4 * sqlite_best ? "yes" : "**no**")
        printf "| record begin + complete | %d | %s | %s | %s | %.1f | %s | %s |\n", t[i],
            commas(ops[i]), us(p50[i]), us(p99[i]), wpc[i], ratio(ops[i], sqlite_best), met
    }
    printf "\nOne op: token = issue + consume; lock = acquire + release; record = begin (NEW) +\n"
    printf "complete (COMPLETED), two durable writes. See bench/README.md.\n"
}' "$work/idem.json" >bench/results/latest.md

echo >&2
cat bench/results/latest.md
echo >&2
echo "written to bench/results/latest.md and bench/results/latest.json" >&2
