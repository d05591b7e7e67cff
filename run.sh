#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Idem's main job on the embedded default, from a fresh Debian 12 machine:
# installs the dependencies, builds, starts the example refund service on
# 127.0.0.1:9000 and `idem serve` in front of it on 127.0.0.1:8080 (records
# in a SQLite file), then prints what to try with curl. Ctrl-C stops both.
#
#   ./run.sh              serve until Ctrl-C
#   ./run.sh --demo       serve, send a few requests to show a replay, stop
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" --target idem_cli refund_service >/dev/null

state=${IDEM_DEMO_DIR:-${TMPDIR:-/tmp}/idem-demo}
mkdir -p "$state"
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
trap 'exit 0' INT TERM

wait_ready() { # file
  for _ in $(seq 100); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "run.sh: $1 never said it was listening" >&2; cat "$1" "${1%.out}.err" >&2; exit 1
}

./build/refund_service --listen 127.0.0.1:9000 --db "$state/refunds.db" \
  >"$state/refund_service.out" 2>"$state/refund_service.err" &
pids+=($!)
wait_ready "$state/refund_service.out"
./build/idem serve -c examples/idem.yaml --db "$state/idem.db" \
  >"$state/idem.out" 2>"$state/idem.err" &
pids+=($!)
wait_ready "$state/idem.out"
cat "$state/idem.out"

no="R-$(date +%s)"
sed -e "s|@NO@|$no|g" -e "s|@STATE@|$state|g" <<'MSG'

Idem is in front of the refund service. Try it:

  # a refund needs a one-time token (layer 1), then runs once however often it is sent
  token=$(curl -s -X POST localhost:8080/_idem/v1/tokens -H 'X-Subject: alice' \
          -d '{"scene":"refund"}' | sed -E 's/.*"token":"([^"]+)".*/\1/')
  curl -si -X POST localhost:8080/refunds -H 'X-Subject: alice' -H "Idem-Token: $token" \
       -d '{"refund_no":"@NO@","amount":"100.00"}'
  # ...send that again: Idempotent-Replayed: true, the same body

  # the payment routes share one key space: a callback and a re-push execute once
  curl -si -X POST localhost:8080/callbacks/payment -d '{"serial_no":"CH-1","amount":"42.00"}'
  curl -si -X POST localhost:8080/admin/payments/repush -d '{"serial_no":"CH-1","amount":"42.00"}'

  curl -s localhost:9000/stats          # how often the service really executed
  curl -s localhost:8080/_idem/v1/health

  # the same flow in a browser: the refund form, which gets its token on load
  http://127.0.0.1:8080/

Logs and data: @STATE@
MSG

if [ "${1:-}" = "--demo" ]; then
  for i in 1 2; do
    echo "--- POST /callbacks/payment, attempt $i"
    curl -si -X POST localhost:8080/callbacks/payment -d "{\"serial_no\":\"CH-$no\",\"amount\":\"42.00\"}"
    echo
  done
  echo "--- the service's own count:"
  curl -s localhost:9000/stats; echo
  exit 0
fi
echo "Ctrl-C to stop."
wait
