#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/latency.sh — the gateway's latency as users feel it: `bash bench/latency.sh`.
#
# bench/gateway.sh in its open-loop mode, in one run, everything on
# 127.0.0.1:
#   1. closed loop (wrk, as gateway.sh): direct, nginx proxy, idem [record]
#      and [lock, record] with unique keys; the proxy's req/s sets the rate;
#   2. the disk's durable write where idem's SQLite file lives:
#      idem-fsync-time, 1000 × (4 KiB write + fdatasync), p50 / p99;
#   3. open loop at a quarter of the proxy's rate (idem-open-loop,
#      bench/open_loop.c: each request due at a time fixed in advance, its
#      latency from then): the same four targets, p50 / p99 / p99.9, and
#      what idem adds over direct at each; targets: idem's p50 added ≤ 2 ×
#      the disk's p50 + 0.3 ms, its p99 ≤ the proxy's + 2 × the disk's p99
#      + 1 ms.
# The table goes to bench/results/latency-latest.md, the closed-loop figures
# of the same run beside the open-loop ones. See bench/README.md.
#
# Environment: every IDEM_GW_* knob of bench/gateway.sh (IDEM_GW_ROUNDS,
# IDEM_GW_SECONDS, IDEM_GW_CONNECTIONS, the open loop's IDEM_GW_OPEN_*),
# with these defaults here:
#   IDEM_GW_RUNS [direct,proxy,record-unique,lock-unique]
#   IDEM_GW_OUT [bench/results/latency-latest.md]
#   IDEM_LAT_QUICK [0]   1: one round of 3 s a measurement (about a minute),
#                        to check the script, not to quote
# Takes about 3.5 minutes with the defaults (3 rounds, 10 s a measurement).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ${IDEM_LAT_QUICK:-0} == 1 ]]; then
    export IDEM_GW_ROUNDS=${IDEM_GW_ROUNDS:-1} IDEM_GW_SECONDS=${IDEM_GW_SECONDS:-3}
fi
export IDEM_GW_OPEN_LOOP=1
export IDEM_GW_RUNS=${IDEM_GW_RUNS:-direct,proxy,record-unique,lock-unique}
export IDEM_GW_OUT=${IDEM_GW_OUT:-bench/results/latency-latest.md}
exec bash bench/gateway.sh
