#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A PostgreSQL primary with a streaming standby on 127.0.0.1, for the
# failover tests and benchmarks: both in a temp dir of their own, on ports
# the caller gives, so nothing of the machine's is touched.
#
#   scripts/pg_standby.sh start DIR PRIMARY_PORT STANDBY_PORT sync|async
#   scripts/pg_standby.sh kill-primary DIR   (SIGKILL of the primary's postmaster)
#   scripts/pg_standby.sh promote DIR        (pg_ctl promote -w of the standby)
#   scripts/pg_standby.sh stop DIR
#
# start prints the libpq URL that names both servers and asks for the one
# that takes writes (target_session_attrs=read-write), as an application
# in front of a Patroni or pg_auto_failover pair would be given, and writes
# it to DIR/url. sync: the standby is synchronous (synchronous_standby_names
# = '*', synchronous_commit = on: a commit is acknowledged once the standby
# has flushed it); async: it is not (a commit is acknowledged once the
# primary has flushed it, and a failover can lose it). The settings are made
# after the base backup, so the promoted standby does not itself wait for a
# standby it does not have. As root, the clusters belong to "postgres".
set -euo pipefail

cmd=${1:?usage: pg_standby.sh start|kill-primary|promote|stop DIR [PRIMARY_PORT STANDBY_PORT sync|async]}
dir=${2:?pg_standby.sh: missing DIR}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

psql_at() { # port sql
  "$pgbin/psql" -X -q -At -h 127.0.0.1 -p "$1" -U idem -d postgres -c "$2"
}

start_server() { # data port
  local data=$1 port=$2 pg; pg=$(cat "$dir/pair.dir")
  if ! as_pg "$pgbin/pg_ctl" -D "$data" -l "$data.log" -w -t 60 \
      -o "-p $port -k $pg -c listen_addresses=127.0.0.1" start >/dev/null; then
    echo "pg_standby.sh: PostgreSQL did not start on port $port:" >&2
    cat "$data.log" >&2
    return 1
  fi
}

stop_all() {
  [ -f "$dir/pair.dir" ] || return 0
  local pg; pg=$(cat "$dir/pair.dir")
  for data in "$pg/primary" "$pg/standby"; do
    [ -f "$data/postmaster.pid" ] || continue
    as_pg "$pgbin/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
  done
  rm -rf "$pg"
  rm -f "$dir/pair.dir"
}

case "$cmd" in
start)
  p1=${3:?pg_standby.sh: missing PRIMARY_PORT}
  p2=${4:?pg_standby.sh: missing STANDBY_PORT}
  mode=${5:?pg_standby.sh: missing sync|async}
  [ "$mode" = sync ] || [ "$mode" = async ] ||
    { echo "pg_standby.sh: the mode is sync or async, not $mode" >&2; exit 2; }
  [ -n "$pgbin" ] || { echo "pg_standby.sh: PostgreSQL is not installed" >&2; exit 1; }
  mkdir -p "$dir"
  stop_all
  pg=$(mktemp -d "${TMPDIR:-/tmp}/idem-pgpair.XXXXXX")
  chmod 755 "$pg"
  echo "$pg" >"$dir/pair.dir"
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$pg"; fi
  as_pg "$pgbin/initdb" -D "$pg/primary" -U idem -A trust --no-sync -E UTF8 >/dev/null
  as_pg tee -a "$pg/primary/postgresql.conf" >/dev/null <<'CONF'
wal_level = replica
max_wal_senders = 10
hot_standby = on
wal_sender_timeout = 10s
wal_receiver_timeout = 10s
wal_receiver_status_interval = 1s
CONF
  start_server "$pg/primary" "$p1"
  "$pgbin/createdb" -h 127.0.0.1 -p "$p1" -U idem idem
  as_pg "$pgbin/pg_basebackup" -h 127.0.0.1 -p "$p1" -U idem -D "$pg/standby" -R \
    -X stream -c fast
  start_server "$pg/standby" "$p2"
  if [ "$mode" = sync ]; then
    psql_at "$p1" "ALTER SYSTEM SET synchronous_standby_names = '*'"
    psql_at "$p1" "ALTER SYSTEM SET synchronous_commit = on"
    psql_at "$p1" "SELECT pg_reload_conf()" >/dev/null
  fi
  want=async
  [ "$mode" = sync ] && want=sync
  for _ in $(seq 200); do
    [ "$(psql_at "$p1" "SELECT sync_state FROM pg_stat_replication" 2>/dev/null)" = "$want" ] &&
      break
    sleep 0.05
  done
  got=$(psql_at "$p1" "SELECT state || ' ' || sync_state FROM pg_stat_replication")
  [ "$got" = "streaming $want" ] ||
    { echo "pg_standby.sh: the standby is '$got', not 'streaming $want'" >&2; exit 1; }
  echo "$p1" >"$dir/primary.port"
  echo "$p2" >"$dir/standby.port"
  url="postgresql://idem@127.0.0.1:$p1,127.0.0.1:$p2/idem?target_session_attrs=read-write"
  echo "$url" >"$dir/url"
  echo "$url"
  ;;
kill-primary)
  pg=$(cat "$dir/pair.dir")
  pid=$(head -1 "$pg/primary/postmaster.pid")
  kill -9 "$pid"
  # Its children notice its death and exit by themselves; its port is
  # closed at once (the process may stay a zombie of whoever reaps it).
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$(cat "$dir/primary.port")") 2>/dev/null || break
    sleep 0.01
  done
  ;;
promote)
  pg=$(cat "$dir/pair.dir")
  as_pg "$pgbin/pg_ctl" -D "$pg/standby" -w -t 60 promote >/dev/null
  [ "$(psql_at "$(cat "$dir/standby.port")" "SELECT pg_is_in_recovery()")" = f ] ||
    { echo "pg_standby.sh: the standby is still in recovery" >&2; exit 1; }
  ;;
stop) stop_all ;;
*) echo "pg_standby.sh: unknown command $cmd" >&2; exit 2 ;;
esac
