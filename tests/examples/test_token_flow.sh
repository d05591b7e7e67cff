#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_token_flow.sh IDEM REFUND_SERVICE SOURCE_DIR — the front-end token
# flow of examples/, run: the refund service and `idem serve -c
# examples/idem.yaml` in front of it (on free ports, as ./run.sh starts
# them), then
#   - the refund form (GET /, through Idem) and its script (GET /app.js),
#     checked to load nothing from elsewhere and to call what they must,
#     and the flow they run done with curl, step by step as the script does
#     it: a token, the submit, the submit again (a replay), the spent token
#     on another refund (409 token_spent with examples/idem.yaml's
#     localised detail, 请刷新后重试);
#   - the form in headless Chromium, where it is installed, clicked through
#     as a user would (tests/examples/drive_page.py);
#   - each client of examples/clients/ whose toolchain is here (python3;
#     javac and java; go), which must print the replay and the spent token;
#     a client without its toolchain is skipped, saying so.
set -euo pipefail
idem=$1 service=$2 src=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-flow.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- idem log"; tail -n 20 "$tmp/idem.log"; exit 1; }

wait_listening() { # log file
  for _ in $(seq 100); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 never said it was listening:"; cat "$1"; exit 1
}

# Both on port 0, the port each took read from its log: no port is drawn
# before it is bound, so no other test can take it in between.
port_in() { sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$1" | head -1; }
"$service" --listen "127.0.0.1:0" --db "$tmp/refunds.db" >"$tmp/service.log" 2>&1 &
pids+=($!)
wait_listening "$tmp/service.log"
p_svc=$(port_in "$tmp/service.log")
sed -e "s/127\.0\.0\.1:9000/127.0.0.1:$p_svc/g" <"$src/examples/idem.yaml" >"$tmp/idem.yaml"
"$idem" serve -c "$tmp/idem.yaml" --db "$tmp/idem.db" --listen 127.0.0.1:0 >"$tmp/idem.log" 2>&1 &
idem_pid=$!
pids+=($idem_pid)
wait_listening "$tmp/idem.log"
p_idem=$(port_in "$tmp/idem.log")
[ -n "$p_svc" ] && [ -n "$p_idem" ] || fail "no port in the logs"
base=http://127.0.0.1:$p_idem
executions() { curl -fsS "http://127.0.0.1:$p_svc/stats" | sed -E 's/.*"executions":([0-9]+).*/\1/'; }

# ---- the page and its script, through Idem ----
curl -fsS -D "$tmp/page.h" "$base/" -o "$tmp/page.html" || fail "GET / through idem"
grep -qi '^content-type: text/html' "$tmp/page.h" || fail "the page is not text/html"
grep -qi "^content-security-policy: default-src 'self'" "$tmp/page.h" ||
  fail "the page has no same-origin Content-Security-Policy"
grep -q '<script src="/app.js"></script>' "$tmp/page.html" || fail "the page does not load /app.js"
grep -q '<form id="refund">' "$tmp/page.html" || fail "the page has no refund form"
if grep -Eq '(src|href)="(https?:)?//' "$tmp/page.html"; then fail "the page loads from elsewhere"; fi
curl -fsS -D "$tmp/app.h" "$base/app.js" -o "$tmp/app.js" || fail "GET /app.js through idem"
grep -qi '^content-type: text/javascript' "$tmp/app.h" || fail "the script is not text/javascript"
for want in "fetch('/_idem/v1/tokens'" "scene: 'refund'" "fetch('/refunds'" "'Idem-Token': token" \
            "urn:idem:token_spent" "a.json.detail" "Idempotent-Replayed" "newToken();"; do
  grep -qF "$want" "$tmp/app.js" || fail "the script lacks $want"
done
if grep -q 'innerHTML\|https\?://' "$tmp/app.js"; then fail "the script writes HTML or calls elsewhere"; fi
if command -v node >/dev/null; then
  node --check "$tmp/app.js" || fail "the script does not parse"
else
  echo "skipped: node --check of the script (no node here)"
fi

# ---- the flow the script runs, with curl ----
hdr=(-H 'Content-Type: application/json' -H 'X-Subject: web')
before=$(executions)
issued=$(curl -sS "${hdr[@]}" -d '{"scene":"refund"}' "$base/_idem/v1/tokens")
token=$(printf '%s' "$issued" | sed -nE 's/.*"token":"([^"]+)".*/\1/p')
[ -n "$token" ] || fail "no token: $issued"
submit() { # refund_no, output file [amount]
  curl -sS -D "$2.h" -o "$2" "${hdr[@]}" -H "Idem-Token: $token" \
       -d "{\"refund_no\":\"$1\",\"amount\":\"${3:-1.00}\"}" "$base/refunds"
}
# A bad amount: store_statuses: [2xx, 409] keeps no 400, the token is given
# back, and the corrected refund goes through with it.
submit R-web-1 "$tmp/bad" 1,00
grep -q '^HTTP/1.1 400' "$tmp/bad.h" || fail "bad amount: $(head -1 "$tmp/bad.h") $(cat "$tmp/bad")"
if grep -qi '^idempotency-key-expires' "$tmp/bad.h"; then fail "a 400 not kept says it is"; fi
submit R-web-1 "$tmp/first"
grep -q '^HTTP/1.1 201' "$tmp/first.h" || fail "submit: $(head -1 "$tmp/first.h") $(cat "$tmp/first")"
grep -qi '^idempotency-key-expires: ' "$tmp/first.h" || fail "submit: no Idempotency-Key-Expires"
if grep -qi '^idempotent-replayed' "$tmp/first.h"; then fail "the first submit is marked replayed"; fi
submit R-web-1 "$tmp/again"
grep -q '^HTTP/1.1 201' "$tmp/again.h" || fail "again: $(head -1 "$tmp/again.h")"
grep -qi '^idempotent-replayed: true' "$tmp/again.h" || fail "again: not a replay"
cmp -s "$tmp/first" "$tmp/again" || fail "the replay's body is not the first answer's"
submit R-web-2 "$tmp/spent"
grep -q '^HTTP/1.1 409' "$tmp/spent.h" || fail "spent token: $(head -1 "$tmp/spent.h")"
grep -qF '"type":"urn:idem:token_spent"' "$tmp/spent" || fail "spent token: $(cat "$tmp/spent")"
grep -qF '"detail":"请刷新后重试 (refresh the page and try again)"' "$tmp/spent" ||
  fail "spent token: not examples/idem.yaml's detail: $(cat "$tmp/spent")"
[ $(($(executions) - before)) -eq 1 ] || fail "the flow executed $(($(executions) - before)) times"
echo "page: the form, its script and their flow: one execution, a replay, token_spent localised"

# ---- the page in a browser, where Chromium is installed ----
if command -v chromium >/dev/null && command -v python3 >/dev/null; then
  python3 "$src/tests/examples/drive_page.py" chromium "$base/" \
    "请刷新后重试 (refresh the page and try again)" >"$tmp/browser.out" 2>&1 ||
    fail "the form in Chromium: $(cat "$tmp/browser.out")"
  echo "browser: ran"; sed 's/^/  | /' "$tmp/browser.out"
else
  echo "skipped: the form in a browser (no chromium, or no python3, here)"
fi

# ---- the clients ----
check_client() { # name, output file
  grep -q '^again: 201 replayed=true ' "$2" || fail "$1: no replay in: $(cat "$2")"
  grep -qF 'spent token: 409 urn:idem:token_spent: 请刷新后重试' "$2" ||
    fail "$1: no token_spent in: $(cat "$2")"
  echo "$1: ran"; sed 's/^/  | /' "$2"
}
ran=0
if command -v python3 >/dev/null; then
  python3 "$src/examples/clients/python/refund_client.py" "$base" py R-py-1 >"$tmp/py.out" 2>&1 ||
    fail "python client: $(cat "$tmp/py.out")"
  check_client python "$tmp/py.out"; ran=$((ran + 1))
else
  echo "skipped: the Python client (no python3 here)"
fi
if command -v javac >/dev/null && command -v java >/dev/null; then
  javac -d "$tmp/java" "$src/examples/clients/java/RefundClient.java" >"$tmp/javac.out" 2>&1 ||
    fail "javac: $(cat "$tmp/javac.out")"
  java -cp "$tmp/java" RefundClient "$base" java R-java-1 >"$tmp/java.out" 2>&1 ||
    fail "java client: $(cat "$tmp/java.out")"
  check_client java "$tmp/java.out"; ran=$((ran + 1))
else
  echo "skipped: the Java client (no javac and java here)"
fi
if command -v go >/dev/null; then
  (cd "$src/examples/clients/go" &&
   GOCACHE="$tmp/gocache" GOPATH="$tmp/gopath" \
     go run main.go "$base" go R-go-1) >"$tmp/go.out" 2>&1 || fail "go client: $(cat "$tmp/go.out")"
  check_client go "$tmp/go.out"; ran=$((ran + 1))
else
  echo "skipped: the Go client (no go here)"
fi
echo "$ran clients ran"

# The daemon stops cleanly after all of it (under ASan: without a report).
kill -TERM "$idem_pid"
status=0
wait "$idem_pid" || status=$?
[ "$status" -eq 0 ] || fail "idem serve exited with status $status on SIGTERM"
