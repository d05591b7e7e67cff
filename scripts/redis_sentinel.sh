#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A Redis master, its replica and three Sentinels on 127.0.0.1, for the
# failover tests: all in DIR, on ports the caller gives, nothing kept on
# disk (--save "").
#
#   scripts/redis_sentinel.sh start DIR MASTER_PORT REPLICA_PORT S1 S2 S3
#   scripts/redis_sentinel.sh kill-master DIR   (SIGKILL of the master)
#   scripts/redis_sentinel.sh master DIR        (prints the port the sentinels name)
#   scripts/redis_sentinel.sh stop DIR
#
# The master is known to the sentinels as "idem"; start prints the URL
# that names the three sentinels, redis-sentinel://127.0.0.1:S1,...,/idem,
# and writes it to DIR/url. The sentinels judge the master down after one
# second and fail over within five (down-after-milliseconds 1000,
# failover-timeout 5000).
set -euo pipefail

cmd=${1:?usage: redis_sentinel.sh start|kill-master|master|stop DIR [MASTER_PORT REPLICA_PORT S1 S2 S3]}
dir=${2:?redis_sentinel.sh: missing DIR}

server() { # name port [args...]
  local name=$1 port=$2
  shift 2
  mkdir -p "$dir/$name"
  echo "$port" >"$dir/$name/port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$name" --save "" \
    --appendonly no --daemonize yes --pidfile "$dir/$name/pid" \
    --logfile "$dir/$name/log" "$@" >/dev/null
}

sentinel_master() { # sentinel port: the port it names for the master
  redis-cli -p "$1" SENTINEL get-master-addr-by-name idem 2>/dev/null | sed -n 2p
}

stop_all() {
  for pidf in "$dir"/*/pid; do
    [ -f "$pidf" ] || continue
    kill -9 "$(cat "$pidf")" 2>/dev/null || true
    rm -f "$pidf"
  done
}

case "$cmd" in
start)
  m=${3:?missing MASTER_PORT}; r=${4:?missing REPLICA_PORT}
  s1=${5:?missing S1}; s2=${6:?missing S2}; s3=${7:?missing S3}
  command -v redis-sentinel >/dev/null ||
    { echo "redis_sentinel.sh: redis-sentinel is not installed" >&2; exit 1; }
  mkdir -p "$dir"
  stop_all
  server master "$m"
  server replica "$r" --replicaof 127.0.0.1 "$m"
  i=0
  for s in "$s1" "$s2" "$s3"; do
    i=$((i + 1))
    mkdir -p "$dir/sentinel$i"
    cat >"$dir/sentinel$i/sentinel.conf" <<CONF
port $s
bind 127.0.0.1
dir $dir/sentinel$i
daemonize yes
pidfile $dir/sentinel$i/pid
logfile $dir/sentinel$i/log
sentinel monitor idem 127.0.0.1 $m 2
sentinel down-after-milliseconds idem 1000
sentinel failover-timeout idem 5000
sentinel parallel-syncs idem 1
CONF
    redis-sentinel "$dir/sentinel$i/sentinel.conf" >/dev/null
  done
  # Ready once every sentinel knows the replica and the two others.
  for _ in $(seq 300); do
    ready=0
    for s in "$s1" "$s2" "$s3"; do
      info=$(redis-cli -p "$s" SENTINEL master idem 2>/dev/null | tr '\n' ' ')
      case "$info" in
      *"num-slaves 1 "*"num-other-sentinels 2 "*) ready=$((ready + 1)) ;;
      esac
    done
    [ "$ready" = 3 ] && break
    sleep 0.1
  done
  [ "$ready" = 3 ] ||
    { echo "redis_sentinel.sh: the sentinels did not all see the replica and each other" >&2
      exit 1; }
  echo "$m" >"$dir/master.port"
  url="redis-sentinel://127.0.0.1:$s1,127.0.0.1:$s2,127.0.0.1:$s3/idem"
  echo "$s1" >"$dir/sentinel.port"
  echo "$url" >"$dir/url"
  echo "$url"
  ;;
kill-master)
  port=$(sentinel_master "$(cat "$dir/sentinel.port")")
  for name in master replica; do
    [ "$(cat "$dir/$name/port")" = "$port" ] && [ -f "$dir/$name/pid" ] || continue
    kill -9 "$(cat "$dir/$name/pid")"
    rm -f "$dir/$name/pid"
  done
  ;;
master) sentinel_master "$(cat "$dir/sentinel.port")" ;;
stop) stop_all ;;
*) echo "redis_sentinel.sh: unknown command $cmd" >&2; exit 2 ;;
esac
