#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, from a fresh Debian 12 machine: installs the
# dependencies, builds with warnings as errors, runs every test with ctest,
# then builds again with AddressSanitizer and UndefinedBehaviorSanitizer and
# runs every test once more.
#
#   ./test.sh            everything
#   ./test.sh --quick    the plain build only
set -euo pipefail
cd "$(dirname "$0")"

scripts/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)
run_suite() { # build-dir, extra cmake flags...
  local dir=$1; shift
  cmake -S . -B "$dir" -DIDEM_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  (cd "$dir" && ctest --output-on-failure -j"$jobs")
}

echo "== build and test (-Werror)"
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo

if [ "${1:-}" != "--quick" ]; then
  echo "== build and test under AddressSanitizer + UndefinedBehaviorSanitizer"
  # A leak exits 23, never 1: idem verify exits 1 for a failed scenario.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=exitcode=23 \
    UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON
fi
