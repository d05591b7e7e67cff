#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/signature.sh — what checking a signed callback costs:
# `bash bench/signature.sh`.
#
# Builds idem-signature-bench in Release (build-bench/) and measures, on one
# thread, the CPU time of one signature check per scheme (signature: on a
# route or consumer, docs/callbacks.md) against OpenSSL's one-shot
# HMAC-SHA256 of the same body, the least a check can cost; writes the
# table to bench/results/signature-latest.md.
#
# Environment: IDEM_SIG_SECONDS (default 2) per case, IDEM_SIG_BODY_BYTES
# (default 1024): the size of the signed body. Needs the build dependencies
# (scripts/install-deps.sh). Takes about fifteen seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${IDEM_SIG_SECONDS:-2}
body=${IDEM_SIG_BODY_BYTES:-1024}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== building idem-signature-bench (Release, build-bench/)" >&2
if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
       cmake --build build-bench -j"$(nproc)" --target idem-signature-bench; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "bench/signature.sh: build failed" >&2
    exit 1
fi
out=bench/results/signature-latest.md
{
    echo "# Signed callbacks: the CPU of one check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC') · $(uname -n) · $(nproc) cores · $(uname -r) ·" \
         "$(openssl version 2>/dev/null || echo OpenSSL) · a ${body}-byte body, ${seconds} s per case"
    echo
    build-bench/bench/idem-signature-bench --seconds "$seconds" --body-bytes "$body"
} >"$out"
cat "$out"
echo "written to $out" >&2
