#!/usr/bin/env bash
# Idem on the embedded default, from a fresh Debian 12 machine: installs the
# dependencies, builds, and runs the refund storm example — 100 concurrent
# duplicates of one refund against a SQLite file, then a late retry.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target refund_storm >/dev/null
db=${1:-${TMPDIR:-/tmp}/idem-refund-storm.db}
rm -f "$db" "$db-wal" "$db-shm"
./build/refund_storm "$db"
