#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_doc_sh.sh IDEM REFUND_SERVICE SOURCE_DIR DOC... — the docs' shell
# examples run as written, and their links lead somewhere.
#
# For each page, a fresh example refund service (examples/refund_service.c)
# and `idem serve -c examples/idem.yaml` in front of it, as ./run.sh starts
# them, on the embedded store in a directory of this test; then the page's
# ```sh blocks, top to bottom in one bash -eu, as a reader would type them
# into one terminal. They run in a directory holding the repository's
# examples/, scripts/ and docs/ and the build as ./build, with the built idem
# first on PATH; the ports the docs name (8080 for idem, 9000 for the
# service) are moved to free ones.
#
# A line "#> TEXT" after a command is what it prints: the command's output
# (stdout and stderr) must hold TEXT. A block after a line
# "<!-- not tested: WHY -->" is skipped, and counted: installs, builds,
# system services. What a block starts in the background (a job of that
# bash) is stopped when the page ends.
#
# Every relative link of a page ([text](path)) must name a file or
# directory of the repository.
set -euo pipefail
idem=$1 service=$2 src=$3; shift 3
tmp=$(mktemp -d)
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap 'stop; rm -rf "$tmp"' EXIT

# A port bound by nothing now, from 28000-32767: below the kernel's
# ephemeral range (32768 up), where the other tests' port-0 listeners and
# every client connection take theirs, and above the fixed ports of the
# tests' services (21xxx-27xxx: RabbitMQ's, Redis', PostgreSQL's).
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((28000 + RANDOM % 4768))
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2; exit 1
}
p_idem=$(free_port) p_svc=$(free_port) p_naive=$(free_port) p_idem2=$(free_port)
[ "$p_idem" != "$p_svc" ] || p_svc=$((p_idem + 1))
[ "$p_naive" != "$p_idem" ] && [ "$p_naive" != "$p_svc" ] || p_naive=$((p_svc + 1))
while [ "$p_idem2" = "$p_idem" ] || [ "$p_idem2" = "$p_svc" ] || [ "$p_idem2" = "$p_naive" ]; do
  p_idem2=$((p_idem2 + 1))
done
# 9001 is the docs' naive service, and 8081 a second idem serve, which a
# block starts itself.
ports() { sed -e "s/\(localhost\|127\.0\.0\.1\):8080/\1:$p_idem/g" \
              -e "s/\(localhost\|127\.0\.0\.1\):8081/\1:$p_idem2/g" \
              -e "s/\(localhost\|127\.0\.0\.1\):9000/\1:$p_svc/g" \
              -e "s/\(localhost\|127\.0\.0\.1\):9001/\1:$p_naive/g"; }

wait_listening() { # log file
  for _ in $(seq 100); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "$1 never said it was listening:"; cat "$1"; exit 1
}
# Start $service and idem serve for a page, each on port 0, the port it
# took read from its log: nothing else can take a port between its choice
# and its bind. The page's script is written with those ports afterwards.
port_in() { sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$1" | head -1; }
start() { # state dir
  mkdir -p "$1"
  "$service" --listen "127.0.0.1:0" --db "$1/refunds.db" >"$1/service.log" 2>&1 &
  pids+=($!)
  wait_listening "$1/service.log"
  p_svc=$(port_in "$1/service.log")
  ports <"$src/examples/idem.yaml" >"$1/idem.yaml"
  "$idem" serve -c "$1/idem.yaml" --db "$1/idem.db" --listen 127.0.0.1:0 >"$1/idem.log" 2>&1 &
  pids+=($!)
  wait_listening "$1/idem.log"
  p_idem=$(port_in "$1/idem.log")
  [ -n "$p_svc" ] && [ -n "$p_idem" ] || { echo "$1: no port in the logs"; exit 1; }
}

mkdir -p "$tmp/bin"
ln -s "$idem" "$tmp/bin/idem"

# A block as script: a command followed by "#>" lines runs with its output
# caught and checked, the rest as it is.
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

blocks=0 skipped=0 links=0 pages=0
for doc in "$@"; do
  rel=${doc#"$src"/}
  dir=$(dirname "$doc")
  # The links first: [text](path), path relative to the page.
  while IFS= read -r link; do
    links=$((links + 1))
    target=$(cd "$dir" && realpath -m -- "${link%%#*}")
    case $target in
    "$(realpath "$src")"/*) ;;
    *) echo "$rel: the link ($link) leads out of the repository"; exit 1 ;;
    esac
    [ -e "$target" ] || { echo "$rel: the link ($link) names no file"; exit 1; }
  done < <(grep -o '](\([^)]*\))' "$doc" | sed 's/^](//; s/)$//' |
           grep -v '^[a-z]*:\|^#' || true)

  page=$tmp/$(echo "$rel" | tr / _)
  mkdir -p "$page/blocks"
  awk -v dir="$page/blocks" '
    /^<!-- not tested: / { skip = 1; next }
    /^```sh$/ { n++; out = sprintf("%s/%02d-%d%s", dir, n, FNR, skip ? ".skip" : ".sh"); inb = 1; next }
    /^```$/ && inb { inb = 0; skip = 0; close(out); next }
    inb { print > out; next }
    /./ { skip = 0 }' "$doc"
  n_skip=$(find "$page/blocks" -name '*.skip' | wc -l)
  skipped=$((skipped + n_skip))
  ls "$page/blocks"/*.sh >/dev/null 2>&1 || continue
  pages=$((pages + 1))
  start "$page/state" # before the script, which is written with its ports
  {
    echo 'set -eu'
    # What a block started in the background ends with the page.
    echo 'trap '"'"'kill $(jobs -p) 2>/dev/null || true'"'"' EXIT'
    echo "__o=$page/cmd.out"
    echo '__expect() { case $__out in *"$1"*) ;; *) echo "expected in the output: $1"; exit 1;; esac; }'
    for f in "$page/blocks"/*.sh; do
      line=$(basename "$f" .sh); line=${line#*-}
      echo "echo '--- $rel:$line'"
      ports <"$f" | to_script
      blocks=$((blocks + 1))
    done
  } >"$page/script.sh"
  mkdir -p "$page/run"
  ln -s "$src/examples" "$src/scripts" "$src/docs" "$page/run/"
  ln -s "$(dirname "$idem")" "$page/run/build"
  if ! (cd "$page/run" && PATH="$tmp/bin:$PATH" timeout 200 bash "$page/script.sh") \
        >"$page/out" 2>&1; then
    at=$(grep -- '^--- ' "$page/out" | tail -1); at=${at#--- }
    echo "FAIL $at: the block there did not run as written:"
    sed 's/^/  | /' "$page/blocks/"*"-${at##*:}.sh"
    echo "  output:"; sed -n "/^--- ${at//\//\\/}\$/,\$p" "$page/out" | sed '1d; s/^/  > /'
    echo "  idem's log:"; tail -5 "$page/state/idem.log" | sed 's/^/  > /'
    exit 1
  fi
  stop
  echo "ok   $rel: $(grep -c -- '^--- ' "$page/out") blocks"
done
[ "$blocks" -gt 0 ] || { echo "no sh block in $*"; exit 1; }
echo "$blocks sh blocks of $pages pages ran as written ($skipped marked not tested);" \
     "$links links lead to files of the repository"
