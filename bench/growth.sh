#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/growth.sh — what idem serve's unique-key requests cost as the records
# pile up: `bash bench/growth.sh`.
#
# For each store (embedded: one SQLite file; distributed: a private Redis and
# PostgreSQL started with scripts/services.sh), and each size (10k, 1M, 10M
# records already stored):
#   1. fill the store to that size with finished records, written straight
#      into idem's own table (the schema idem made when it opened the store),
#      each a copy of a real one the gateway finished (its result, its state,
#      SUCCEEDED; its own key, fingerprint, owner and times), in batches of
#      100k: the sqlite3 CLI, one transaction; PostgreSQL, INSERT ... SELECT
#      over generate_series;
#   2. measure with bench/gateway.sh (closed loop, wrk): the nginx proxy and
#      idem [record] with unique keys, in rounds, idem serve on that store.
# The sizes grow in place (1M is the 10k store topped up, and so on): the
# records a measurement adds stay, and "records" is the count at its start.
# Then it prints a markdown table and writes it to
# bench/results/growth-latest.md. Target: idem's req/s falls by at most
# 1.3× from the smallest size to the largest. See bench/README.md.
#
# Environment (defaults in brackets):
#   IDEM_GROWTH_SIZES [10000,1000000,10000000]  records at each point
#   IDEM_GROWTH_STORES [embedded,distributed]
#   IDEM_GROWTH_SECONDS [10]     each gateway measurement
#   IDEM_GROWTH_ROUNDS [3]       gateway.sh rounds per point (odd)
#   IDEM_GROWTH_KEYS [scattered] or ordered: the requests' keys (gateway.sh's
#                                IDEM_GW_UNIQUE_KEYS); scattered ones land
#                                all over the key index, as random ids do,
#                                ordered ones next to each other
#   IDEM_GROWTH_QUICK [0]        1: sizes 10000,100000, one round of 3 s, to
#                                check the script, not to quote
#   IDEM_GROWTH_REDIS_PORT [26420], IDEM_GROWTH_PG_PORT [25470]
#   IDEM_GROWTH_OUT [bench/results/growth-latest.md]
#   TMPDIR [/tmp]                where the stores live: a disk, not tmpfs,
#                                with room for them (checked first; sizes
#                                that do not fit are left out, and the table
#                                says so)
# Needs what bench/gateway.sh needs, sqlite3, and for the distributed store
# PostgreSQL 15 and Redis. With the defaults, about 20 minutes on two cores
# (the 10M preloads take most of it) and some 7 GB of disk at the most.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/report.sh
quick=${IDEM_GROWTH_QUICK:-0}
if [[ $quick == 1 ]]; then
    sizes=${IDEM_GROWTH_SIZES:-10000,100000} rounds=${IDEM_GROWTH_ROUNDS:-1}
    seconds=${IDEM_GROWTH_SECONDS:-3}
else
    sizes=${IDEM_GROWTH_SIZES:-10000,1000000,10000000} rounds=${IDEM_GROWTH_ROUNDS:-3}
    seconds=${IDEM_GROWTH_SECONDS:-10}
fi
stores=${IDEM_GROWTH_STORES:-embedded,distributed}
keys=${IDEM_GROWTH_KEYS:-scattered}
redis_port=${IDEM_GROWTH_REDIS_PORT:-26420}
pg_port=${IDEM_GROWTH_PG_PORT:-25470}
out_md=${IDEM_GROWTH_OUT:-bench/results/growth-latest.md}
target=1.3
batch=100000
# Disk per record, with room to spare: about 330 B in the SQLite file, 500
# B in PostgreSQL with its indexes, and its WAL of the load, up to 8 GB, on
# top (the stores one after the other, each removed after its sizes).
bytes_per_record=1600

die() { echo "bench/growth.sh: $*" >&2; exit 1; }
say() { echo "$*" >&2; }
sizes=${sizes//,/ } stores=${stores//,/ }
for v in seconds rounds redis_port pg_port; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v must be a positive integer (got '${!v}')"
done
((rounds % 2 == 1)) || die "IDEM_GROWTH_ROUNDS must be odd (got $rounds)"
[[ $keys == scattered || $keys == ordered ]] || die "IDEM_GROWTH_KEYS is scattered or ordered"
prev=0
for n in $sizes; do
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 200 && n > prev && n <= 1000000000)) ||
        die "IDEM_GROWTH_SIZES: increasing counts from 200 up (got '$n' after $prev)"
    prev=$n
done
for s in $stores; do
    [[ $s == embedded || $s == distributed ]] || die "unknown store '$s' in IDEM_GROWTH_STORES"
done
((redis_port != 26379 && pg_port != 25432)) ||
    die "ports 26379 and 25432 belong to the test suite; pick others"
command -v sqlite3 >/dev/null || die "needs sqlite3 (apt-get install -y sqlite3)"
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [[ " $stores " == *" distributed "* ]]; then
    [[ -n $pgbin ]] && command -v redis-server >/dev/null ||
        die "the distributed store needs PostgreSQL and Redis (apt-get install -y postgresql redis-server redis-tools)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-growth.XXXXXX")
svc=$work/services services_up=0
cleanup() {
    ((services_up)) && bash scripts/services.sh stop "$svc" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fstype=$(df --output=fstype "$work" 2>/dev/null | tail -n 1)
[[ $fstype != tmpfs && $fstype != ramfs ]] ||
    say "bench/growth.sh: warning: $work is on $fstype: fsync costs nothing there; set TMPDIR to a disk"

# Room: the largest store at a time (each store is removed before the next).
notes=()
avail=$(df --output=avail -B1 "$work" | tail -n 1)
kept=""
for n in $sizes; do
    if ((n * bytes_per_record < avail)); then
        kept+="$n "
    else
        notes+=("$n records left out: they would take about $((n * bytes_per_record / 1000000000)) GB, and $((avail / 1000000000)) GB are free under ${TMPDIR:-/tmp}")
    fi
done
sizes=${kept% }
[[ -n $sizes ]] || die "no size fits in the free space under ${TMPDIR:-/tmp}: ${notes[*]}"
for n in "${notes[@]}"; do say "bench/growth.sh: $n"; done

# gw NAME VAR=VALUE...: bench/gateway.sh with those settings; its table and
# raw figures in $work/NAME.md and .json, its log in .log.
gw() {
    local name=$1
    shift
    if ! env IDEM_GW_OUT="$work/$name.md" IDEM_GW_RAW="$work/$name.json" "$@" \
        bash bench/gateway.sh >"$work/$name.log" 2>&1; then
        cat "$work/$name.log" >&2
        die "bench/gateway.sh failed ($name)"
    fi
    if grep -q '^## Problems' "$work/$name.md"; then
        problems+=("$name: $(sed -n '/^## Problems/,$p' "$work/$name.md" | sed 1,2d | tr '\n' ' ')")
    fi
}
problems=()

# raw FILE RUN FIELD: a field of a run in gateway.sh's raw JSON.
raw() {
    sed -n "s/^ *\"$2\":{.*\"$3\":\"\{0,1\}\([^\",]*\)\"\{0,1\}[,}].*/\1/p" "$1" | head -n 1
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[(NR + 1) / 2] }'; }

# The records' times. The preloaded ones were created over the 12 hours
# before the run, spread evenly by number (the largest size decides the
# spacing), so none expires during it (24 h retention) and the newest are
# the run's own.
max_size=${sizes##* }
now_ms=$(($(date +%s%N) / 1000000))
base_ms=$((now_ms - 12 * 3600 * 1000))
step_us=$((12 * 3600 * 1000 * 1000 / max_size)) # µs between two preloaded records

# ---- filling a store -----------------------------------------------------------
# Record i (from 1) gets the key "<8 hex digits>-refund-<i, 12 digits>", the
# hex digits a hash of i so that the keys spread over the index as the
# scattered request keys do; its fingerprint is random (as a body's
# SHA-256), its owner the template's with ".<i>", its epoch and times those
# of a record created at base + i * step. All else is the template's: a
# record the gateway finished (SUCCEEDED, its stored answer).

# sqlite_fill DB FROM TO: records FROM..TO, in one transaction.
sqlite_fill() {
    local db=$1 from=$2 to=$3 a b
    {
        # No journal for the load (a crash would ruin the file; it is a
        # benchmark's), no fsync, a cache that holds the key index: as fast
        # as the file takes rows. idem sets WAL and synchronous=FULL again
        # at its next open; WAL is restored here all the same.
        printf 'PRAGMA journal_mode=DELETE;\nPRAGMA synchronous=OFF;\nPRAGMA cache_size=-1000000;\n'
        printf "CREATE TEMP TABLE tpl AS SELECT * FROM idem_record WHERE state = 'SUCCEEDED' AND key LIKE 'seed-%%' LIMIT 1;\n"
        printf "SELECT CASE WHEN count(*) = 1 THEN 'template ok' ELSE 'no template' END FROM tpl;\n"
        printf 'BEGIN;\n'
        for ((a = from; a <= to; a += batch)); do
            b=$((a + batch - 1))
            ((b <= to)) || b=$to
            cat <<EOF
WITH RECURSIVE n(i) AS (SELECT $a UNION ALL SELECT i + 1 FROM n WHERE i < $b),
  r AS (SELECT i, $base_ms + i * $step_us / 1000 AS c FROM n)
INSERT INTO idem_record (space, key, fingerprint, state, epoch, owner, lease_until, result,
                         created_ms, updated_ms, expires_ms)
SELECT t.space, printf('%08x-refund-%012d', (r.i * 2654435761) % 4294967296, r.i),
       randomblob(32), t.state, r.c, t.owner || '.' || r.i, t.lease_until, t.result,
       r.c, r.c + (t.updated_ms - t.created_ms), r.c + (t.expires_ms - t.created_ms)
FROM r, tpl t;
EOF
        done
        printf 'COMMIT;\nPRAGMA journal_mode=WAL;\n'
    } | sqlite3 -bail "$db" >"$work/fill.out" 2>&1 || { cat "$work/fill.out" >&2; die "sqlite3 fill failed"; }
    grep -q 'template ok' "$work/fill.out" || die "no finished seed record to copy in $db"
    # The load wrote without fsync: gigabytes may still wait in the page
    # cache, and the first checkpoint's fsync during the measurement would
    # write them all out (a p99 of 157 ms at 10M instead of about 20). A
    # store that old is on the disk; so is this one before it is measured
    # (as CHECKPOINT does for PostgreSQL in pg_fill).
    sync "$db"
}

psql_c() {
    "$pgbin/psql" -X -q -At -h 127.0.0.1 -p "$pg_port" -U idem -d idem -v ON_ERROR_STOP=1 -c "$1"
}

# pg_fill FROM TO: records FROM..TO, a statement (a transaction) per batch.
pg_fill() {
    local from=$1 to=$2 a b
    # During the load only, no checkpoint before 8 GB of WAL: after each, the
    # first change to every page of the key index (random keys: nearly all
    # of them) writes the whole page to the WAL again, which made the load
    # several times slower. The measurement runs with the defaults.
    psql_c "ALTER SYSTEM SET max_wal_size = '8GB'" >/dev/null
    psql_c "ALTER SYSTEM SET checkpoint_timeout = '1h'" >/dev/null
    psql_c "SELECT pg_reload_conf()" >/dev/null
    for ((a = from; a <= to; a += batch)); do
        b=$((a + batch - 1))
        ((b <= to)) || b=$to
        psql_c "SET synchronous_commit = off;
WITH t AS (SELECT * FROM idem_record WHERE state = 'SUCCEEDED' AND key LIKE 'seed-%' LIMIT 1),
     r AS (SELECT i, $base_ms + i * $step_us / 1000 AS c FROM generate_series($a::bigint, $b) AS i)
INSERT INTO idem_record (space, key, fingerprint, state, epoch, owner, lease_until, result,
                         created_ms, updated_ms, expires_ms)
SELECT t.space, lpad(to_hex((r.i * 2654435761) % 4294967296), 8, '0') || '-refund-' || lpad(r.i::text, 12, '0'),
       sha256(('fp' || r.i)::bytea), t.state, r.c, t.owner || '.' || r.i, t.lease_until, t.result,
       r.c, r.c + (t.updated_ms - t.created_ms), r.c + (t.expires_ms - t.created_ms)
FROM r, t" >/dev/null || die "PostgreSQL fill failed"
    done
    # What a table of that age would have had from autovacuum: statistics,
    # a visibility map; and its dirty pages out before the measurement.
    psql_c "VACUUM (ANALYZE) idem_record" >/dev/null
    psql_c "ALTER SYSTEM RESET max_wal_size" >/dev/null
    psql_c "ALTER SYSTEM RESET checkpoint_timeout" >/dev/null
    psql_c "SELECT pg_reload_conf()" >/dev/null
    psql_c "CHECKPOINT" >/dev/null
}

count_records() { # store: the number of records
    if [[ $1 == embedded ]]; then
        sqlite3 "$db" 'SELECT count(*) FROM idem_record'
    else
        psql_c 'SELECT count(*) FROM idem_record'
    fi
}
store_bytes() { # store: the bytes its records take on disk
    if [[ $1 == embedded ]]; then
        du -cb "$db"* | tail -n 1 | cut -f1
    else
        psql_c "SELECT pg_total_relation_size('idem_record')"
    fi
}

# ---- measuring -------------------------------------------------------------------
declare -A F # F[store.size.field]
say "== sizes: $sizes; stores: $stores; $rounds round(s) of ${seconds}s; keys $keys; in $work ($fstype)"
for store in $stores; do
    gwenv=(IDEM_GW_UNIQUE_KEYS="$keys")
    if [[ $store == embedded ]]; then
        db=$work/idem.db
        gwenv+=(IDEM_GW_DB="$db")
    else
        port_free() { ! (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
        port_free "$redis_port" || die "something listens on 127.0.0.1:$redis_port; set IDEM_GROWTH_REDIS_PORT"
        port_free "$pg_port" || die "something listens on 127.0.0.1:$pg_port; set IDEM_GROWTH_PG_PORT"
        services_up=1
        bash scripts/services.sh start "$svc" "$redis_port" "$pg_port" >"$work/services.log" 2>&1 ||
            { cat "$work/services.log" >&2; die "scripts/services.sh start failed"; }
        redis_pid=$(<"$svc/redis/redis.pid")
        pg_pid=$(head -n 1 "$(<"$svc/pg.dir")/data/postmaster.pid")
        gwenv+=(IDEM_GW_STORE=distributed
            IDEM_GW_REDIS="$(sed -n 's/^IDEM_TEST_REDIS=//p' "$svc/env")"
            IDEM_GW_POSTGRES="$(sed -n 's/^IDEM_TEST_PG=//p' "$svc/env")"
            IDEM_GW_STORE_PIDS="$redis_pid $pg_pid")
    fi
    # idem makes its schema and finishes 100 records: the template.
    say "== $store: idem serve opens the store and finishes 100 records"
    gw "$store-template" "${gwenv[@]}" IDEM_GW_RUNS=record-replay IDEM_GW_SEED_KEYS=100 \
        IDEM_GW_SECONDS=1 IDEM_GW_ROUNDS=1
    last=0 # the last preloaded record's number
    for size in $sizes; do
        have=$(count_records "$store")
        if ((have < size)); then
            say "-- $store: filling from $have to $size records"
            t0=$(date +%s%N)
            if [[ $store == embedded ]]; then
                sqlite_fill "$db" $((last + 1)) $((last + size - have))
            else
                pg_fill $((last + 1)) $((last + size - have))
            fi
            t1=$(date +%s%N)
            F[$store.$size.fill_rate]=$(awk -v n=$((size - have)) -v t=$((t1 - t0)) \
                'BEGIN { printf "%.0f", n / (t / 1e9) }')
            last=$((last + size - have))
        fi
        F[$store.$size.start]=$(count_records "$store")
        F[$store.$size.bytes]=$(store_bytes "$store")
        say "-- $store: ${F[$store.$size.start]} records ($((F[$store.$size.bytes] / 1000000)) MB); measuring"
        gw "$store-$size" "${gwenv[@]}" IDEM_GW_RUNS=proxy,record-unique IDEM_GW_SECONDS="$seconds" \
            IDEM_GW_ROUNDS="$rounds"
        F[$store.$size.end]=$(count_records "$store")
        j=$work/$store-$size.json
        for f in rps p99_us p50_us rps_each_round p99_us_each_round; do
            F[$store.$size.$f]=$(raw "$j" record-unique "$f")
        done
        F[$store.$size.proxy_each]=$(raw "$j" proxy rps_each_round)
        read -ra a <<<"${F[$store.$size.rps_each_round]}"
        read -ra b <<<"${F[$store.$size.proxy_each]}"
        ratios=()
        for i in "${!a[@]}"; do
            ratios+=("$(awk -v x="${a[i]}" -v y="${b[i]}" 'BEGIN { printf "%.3f", (y > 0 ? x / y : 0) }')")
        done
        F[$store.$size.ratio]=$(median "${ratios[@]}")
        say "   ${F[$store.$size.rps]} req/s, p99 ${F[$store.$size.p99_us]} µs," \
            "${F[$store.$size.ratio]}× the proxy"
    done
    if [[ $store == embedded ]]; then
        rm -f "$db"*
    else
        bash scripts/services.sh stop "$svc" >/dev/null 2>&1 || true
        services_up=0
    fi
done

# ---- the table -------------------------------------------------------------------
commas() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]([,]|$)/, ",&", s); print s }'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }
first=${sizes%% *} largest=${sizes##* }
mkdir -p "$(dirname "$out_md")"
{
    printf '# Idem gateway: cost as the records grow\n\n'
    printf '%s · %s · %d cores · Linux %s · %s · %d round(s) of %d s per point · keys %s\n\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(uname -n)" "$(nproc)" "$(uname -r)" \
        "$(sed -n 's/^[0-9].* · idem \([^ ]*\) · .*/idem \1/p' "$work/${stores%% *}-$first.md" | head -n 1)" \
        "$rounds" "$seconds" "$keys"
    printf 'Each point: bench/gateway.sh (closed loop, wrk `-t2 -c64`) against the nginx proxy and idem\n'
    printf '[record] with unique keys, idem serve on a store already holding that many finished records\n'
    printf '(copies of one the gateway finished, written into its table directly; see bench/README.md).\n'
    printf 'req/s and p99: the median round'"'"'s; × proxy: the median of the rounds'"'"' own ratios.\n\n'
    printf '| store | records at start | at end | on disk | idem req/s | each round | × nginx proxy | p50 ms | p99 ms | req/s ÷ first size'"'"'s | fill rate |\n'
    printf '|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n'
    for store in $stores; do
        for size in $sizes; do
            k=$store.$size
            printf '| %s | %s | %s | %s MB | %s | %s | %s× | %s | %s | %s | %s |\n' "$store" \
                "$(commas "${F[$k.start]}")" "$(commas "${F[$k.end]}")" \
                "$(commas $((F[$k.bytes] / 1000000)))" "$(commas "${F[$k.rps]}")" \
                "${F[$k.rps_each_round]}" "$(div "${F[$k.ratio]}" 1)" "$(ms "${F[$k.p50_us]}")" \
                "$(ms "${F[$k.p99_us]}")" "$(div "${F[$k.rps]}" "${F[$store.$first.rps]}")" \
                "${F[$k.fill_rate]:+$(commas "${F[$k.fill_rate]}") rec/s}"
        done
    done
    printf '\n## Target\n\n'
    printf 'Slowdown from %s to %s records: the first size'"'"'s req/s over the largest'"'"'s (≤ %s×). The\n' \
        "$(commas "$first")" "$(commas "$largest")" "$target"
    printf 'same over the × proxy figures takes out what the machine did meanwhile (the proxy does not\n'
    printf 'depend on the records); p99 grows by the factor beside it.\n\n'
    printf '| store | slowdown, req/s | target | met | slowdown, × proxy | p99 growth |\n|---|---:|---:|:---:|---:|---:|\n'
    for store in $stores; do
        sd=$(div "${F[$store.$first.rps]}" "${F[$store.$largest.rps]}")
        printf '| %s | %s× | ≤ %s× | %s | %s× | %s× |\n' "$store" "$sd" "$target" \
            "$(awk -v v="$sd" -v t="$target" 'BEGIN { print (v <= t ? "yes" : "**no**") }')" \
            "$(div "${F[$store.$first.ratio]}" "${F[$store.$largest.ratio]}")" \
            "$(div "${F[$store.$largest.p99_us]}" "${F[$store.$first.p99_us]}")"
    done
    print_notes_and_problems
} >"$out_md"
echo >&2
cat "$out_md"
echo >&2
echo "written to $out_md" >&2
