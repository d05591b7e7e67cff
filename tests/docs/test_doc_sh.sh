#!/usr/bin/env bash
# test_doc_sh.sh IDEM REFUND_SERVICE SOURCE_DIR DOC... — every ```sh block of
# the given docs runs as written against a running daemon: the example
# refund service (examples/refund_service.c) and `idem serve -c
# examples/idem.yaml` in front of it, as ./run.sh starts them, on the
# embedded store in a directory of this test.
#
# A block runs with bash -eu in a directory holding the repository's
# examples/, scripts/ and docs/ and the build as ./build, with the built idem
# first on PATH. A line "#> TEXT" after a command is its expected output:
# the command's output (stdout and stderr) must hold TEXT. The ports the
# docs name (8080 for idem, 9000 for the service) are moved to free ones.
# A block preceded by a "<!-- not tested: WHY -->" line is skipped (and
# counted): installs, builds and system services.
set -euo pipefail
idem=$1 service=$2 src=$3; shift 3
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Two free ports: bound by nothing now.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 30000))
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2; exit 1
}
p_idem=$(free_port) p_svc=$(free_port)
[ "$p_idem" != "$p_svc" ] || p_svc=$((p_idem + 1))
ports() { sed -e "s/\(localhost\|127\.0\.0\.1\):8080/\1:$p_idem/g" \
              -e "s/\(localhost\|127\.0\.0\.1\):9000/\1:$p_svc/g"; }

wait_listening() { # log file
  for _ in $(seq 100); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 never said it was listening:"; cat "$1"; exit 1
}
mkdir -p "$tmp/run" "$tmp/bin" "$tmp/blocks"
"$service" --listen "127.0.0.1:$p_svc" --db "$tmp/refunds.db" >"$tmp/service.log" 2>&1 &
pids+=($!)
wait_listening "$tmp/service.log"
ports <"$src/examples/idem.yaml" >"$tmp/idem.yaml"
"$idem" serve -c "$tmp/idem.yaml" --db "$tmp/idem.db" >"$tmp/idem.log" 2>&1 &
pids+=($!)
wait_listening "$tmp/idem.log"

ln -s "$src/examples" "$src/scripts" "$src/docs" "$tmp/run/"
ln -s "$(dirname "$idem")" "$tmp/run/build"
ln -s "$idem" "$tmp/bin/idem"

# Each block as a script: a command followed by "#>" lines runs with its
# output caught and checked, the rest as it is.
to_script() {
  awk -v q="'" '
    function flush_cmd() {
      if (cmd == "") return
      if (n) {
        # A group, not a subshell: what the command sets stays set.
        print "{\n" cmd "} >\"$__o\" 2>&1 || { __rc=$?; cat \"$__o\"; " \
              "echo \"exit status $__rc\"; exit 1; }"
        print "__out=$(cat \"$__o\"); cat \"$__o\""
        for (i = 1; i <= n; i++) {
          e = want[i]; gsub(q, q "\\" q q, e)
          print "__expect " q e q
        }
      } else {
        printf "%s", cmd
      }
      cmd = ""; n = 0
    }
    /^#> / { want[++n] = substr($0, 4); next }
    { if (n) flush_cmd(); cmd = cmd $0 "\n" }
    END { flush_cmd() }'
}

blocks=0 skipped=0
for doc in "$@"; do
  rel=${doc#"$src"/}
  awk -v dir="$tmp/blocks" -v base="$(echo "$rel" | tr / _)" '
    /^<!-- not tested: / { skip = 1; next }
    /^```sh$/ { n++; out = sprintf("%s/%s-%02d-%d%s", dir, base, n, FNR, skip ? ".skip" : ".sh"); inb = 1; next }
    /^```$/ && inb { inb = 0; skip = 0; close(out); next }
    inb { print > out; next }
    /./ { skip = 0 }' "$doc"
done
for f in "$tmp/blocks"/*; do
  [ -e "$f" ] || continue
  name=$(basename "$f"); name=${name%.*}
  if [[ $f == *.skip ]]; then skipped=$((skipped + 1)); continue; fi
  blocks=$((blocks + 1))
  {
    echo 'set -eu'
    echo "__o=$tmp/cmd.out"
    echo '__expect() { case $__out in *"$1"*) ;; *) echo "expected in the output: $1"; exit 1;; esac; }'
    ports <"$f" | to_script
  } >"$tmp/script.sh"
  if ! (cd "$tmp/run" && PATH="$tmp/bin:$PATH" timeout 120 bash "$tmp/script.sh") \
        >"$tmp/out" 2>&1; then
    echo "FAIL $name (the block at line ${name##*-} of its doc):"
    sed 's/^/  | /' "$f"
    echo "  output:"; sed 's/^/  > /' "$tmp/out"
    echo "  idem's log:"; tail -20 "$tmp/idem.log" | sed 's/^/  > /'
    exit 1
  fi
  echo "ok   $name"
done
[ "$blocks" -gt 0 ] || { echo "no sh block in $*"; exit 1; }
echo "$blocks sh blocks ran as written, $skipped marked not tested"
