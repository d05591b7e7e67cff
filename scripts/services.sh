#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Start and stop the Redis and PostgreSQL servers that Idem's distributed
# store is tested and benchmarked against: on 127.0.0.1 only, data in a temp
# dir, on ports of our own, so nothing of the machine's is touched.
#
#   scripts/services.sh start STATE_DIR [REDIS_PORT] [PG_PORT]
#   scripts/services.sh stop  STATE_DIR
#   scripts/services.sh redis-stop|redis-start STATE_DIR   (fault tests)
#   scripts/services.sh pg-stop|pg-start STATE_DIR
#   scripts/services.sh pg-stop-immediate STATE_DIR   (as in a crash: no
#                                     checkpoint, recovery at the next start)
#   scripts/services.sh up STATE_DIR      (start whichever is not running)
#   scripts/services.sh rabbitmq-start STATE_DIR [AMQP_PORT]
#   scripts/services.sh rabbitmq-stop|rabbitmq-restart STATE_DIR
#
# RabbitMQ, for the message consumers, is started apart (it takes some ten
# seconds): a node of its own (named after STATE_DIR's port), its own epmd,
# cookie, data and log in STATE_DIR/rabbitmq, on 127.0.0.1 only; AMQP on
# AMQP_PORT (default 26672), the Erlang distribution on AMQP_PORT-5000,
# epmd on AMQP_PORT-4999 and rabbitmqctl on the next eight: below Linux's
# ephemeral range (32768 up), where any client's outgoing connection could
# hold them (AMQP_PORT must be above 5010). rabbitmq-start writes STATE_DIR/rabbitmq/env
# with IDEM_TEST_AMQP, its URL.
#
# start writes STATE_DIR/env with IDEM_TEST_REDIS and IDEM_TEST_PG, the two
# URLs, and prints them. Defaults: Redis 26379, PostgreSQL 25432. PostgreSQL
# refuses to run as root, so as root its cluster belongs to the "postgres"
# user that Debian's package creates.
set -euo pipefail

cmd=${1:?usage: services.sh start|stop|redis-stop|redis-start|pg-stop|pg-stop-immediate|pg-start STATE_DIR [REDIS_PORT PG_PORT]}
state=${2:?services.sh: missing STATE_DIR}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

redis_start() {
  local port; port=$(cat "$state/redis.port")
  redis-server --port "$port" --bind 127.0.0.1 --dir "$state/redis" \
    --save "" --appendonly no --daemonize yes --pidfile "$state/redis/redis.pid" \
    --logfile "$state/redis/redis.log" >/dev/null
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  echo "services.sh: redis-server did not answer on port $port" >&2
  cat "$state/redis/redis.log" >&2
  return 1
}

redis_stop() {
  local pidf="$state/redis/redis.pid"
  [ -f "$pidf" ] || return 0
  local pid; pid=$(cat "$pidf")
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  rm -f "$pidf"
}

# The cluster lives in a dir of its own under $TMPDIR (named in
# STATE_DIR/pg.dir): as root it belongs to "postgres", who may not be allowed
# into STATE_DIR's parents.
pg_start() {
  local port pg; port=$(cat "$state/pg.port"); pg=$(cat "$state/pg.dir")
  if ! as_pg "$pgbin/pg_ctl" -D "$pg/data" -l "$pg/pg.log" -w -t 60 \
      -o "-p $port -k $pg -c listen_addresses=127.0.0.1" start >/dev/null; then
    echo "services.sh: PostgreSQL did not start on port $port:" >&2
    cat "$pg/pg.log" >&2
    return 1
  fi
}

# A port something already listens on: say so, rather than fail obscurely.
port_free() { # port name
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "services.sh: 127.0.0.1:$1 is in use; pick another $2 port" \
         "(cmake -DIDEM_TEST_${2^^}_PORT=...)" >&2
    return 1
  fi
}

pg_stop() {
  [ -f "$state/pg.dir" ] || return 0
  local pg; pg=$(cat "$state/pg.dir")
  [ -f "$pg/data/postmaster.pid" ] || return 0
  as_pg "$pgbin/pg_ctl" -D "$pg/data" -m "${1:-fast}" -w -t 60 stop >/dev/null || true
}

# RabbitMQ: everything of the node's own in $state/rabbitmq, given through
# the environment (the package's rabbitmq-server wrapper would switch to
# the rabbitmq user and its HOME, whose cookie is not ours).
rabbit_env() {
  local r="$state/rabbitmq" port; port=$(cat "$r/port")
  export HOME="$r" RABBITMQ_NODENAME="idem$port@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT=$((port - 5000)) \
    ERL_EPMD_PORT=$((port - 4999)) RABBITMQ_MNESIA_BASE="$r/mnesia" RABBITMQ_LOG_BASE="$r/log" \
    RABBITMQ_CONFIG_FILE="$r/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$r/enabled_plugins" \
    RABBITMQ_CONF_ENV_FILE="$r/rabbitmq-env.conf" RABBITMQ_PID_FILE="$r/rabbitmq.pid" \
    RABBITMQ_CTL_DIST_PORT_MIN=$((port - 4998)) RABBITMQ_CTL_DIST_PORT_MAX=$((port - 4990))
}

rabbit_start() {
  local r="$state/rabbitmq"
  rabbit_env
  epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 -daemon
  /usr/lib/rabbitmq/bin/rabbitmq-server >"$r/server.out" 2>&1 &
  echo $! >"$r/server.pid"
  # await_startup gives up at once while the node is not up to be asked.
  for _ in $(seq 120); do
    if /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBITMQ_NODENAME" -q await_startup \
        >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$(cat "$r/server.pid")" 2>/dev/null || break
    sleep 0.5
  done
  echo "services.sh: RabbitMQ did not start on port $RABBITMQ_NODE_PORT:" >&2
  tail -20 "$r/server.out" >&2
  return 1
}

rabbit_stop() {
  local r="$state/rabbitmq"
  [ -f "$r/port" ] || return 0
  rabbit_env
  /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBITMQ_NODENAME" -q stop >/dev/null 2>&1 || true
  if [ -f "$r/server.pid" ]; then
    local pid; pid=$(cat "$r/server.pid")
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$r/server.pid"
  fi
}

# The epmd started for the node, stopped last (nothing else uses its port).
rabbit_epmd_stop() {
  [ -f "$state/rabbitmq/port" ] || return 0
  rabbit_env
  epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
}

case "$cmd" in
rabbitmq-start)
  amqp_port=${3:-26672}
  [ "$amqp_port" -gt 5010 ] 2>/dev/null ||
    { echo "services.sh: the AMQP port must be above 5010 (got $amqp_port)" >&2; exit 2; }
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] ||
    { echo "services.sh: rabbitmq-server is not installed" >&2; exit 1; }
  mkdir -p "$state"
  [ -d "$state/rabbitmq" ] && { rabbit_stop; rabbit_epmd_stop; rm -rf "$state/rabbitmq"; }
  port_free "$amqp_port" amqp
  mkdir -p "$state/rabbitmq/log" "$state/rabbitmq/mnesia"
  echo "$amqp_port" >"$state/rabbitmq/port"
  echo '[].' >"$state/rabbitmq/enabled_plugins"
  : >"$state/rabbitmq/rabbitmq-env.conf"
  : >"$state/rabbitmq/rabbitmq.conf" # the environment says it all
  od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$state/rabbitmq/.erlang.cookie"
  chmod 0400 "$state/rabbitmq/.erlang.cookie"
  rabbit_start
  echo "IDEM_TEST_AMQP=amqp://guest:guest@127.0.0.1:$amqp_port/%2f" >"$state/rabbitmq/env"
  cat "$state/rabbitmq/env"
  ;;
rabbitmq-stop) rabbit_stop; rabbit_epmd_stop; rm -rf "$state/rabbitmq" ;;
rabbitmq-restart) rabbit_stop; rabbit_start ;;
start)
  redis_port=${3:-26379}
  pg_port=${4:-25432}
  [ -n "$pgbin" ] || { echo "services.sh: PostgreSQL is not installed" >&2; exit 1; }
  command -v redis-server >/dev/null || { echo "services.sh: redis-server is not installed" >&2; exit 1; }
  # A previous run that was killed may have left its servers behind.
  [ -d "$state" ] && "$0" stop "$state"
  port_free "$redis_port" redis
  port_free "$pg_port" pg
  [ -f "$state/pg.dir" ] && rm -rf "$(cat "$state/pg.dir")"
  rm -rf "$state"
  mkdir -p "$state/redis"
  pg=$(mktemp -d "${TMPDIR:-/tmp}/idem-pg.XXXXXX")
  chmod 755 "$pg"
  echo "$pg" >"$state/pg.dir"
  echo "$redis_port" >"$state/redis.port"
  echo "$pg_port" >"$state/pg.port"
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$pg"; fi
  redis_start
  as_pg "$pgbin/initdb" -D "$pg/data" -U idem -A trust --no-sync -E UTF8 >/dev/null
  pg_start
  "$pgbin/createdb" -h 127.0.0.1 -p "$pg_port" -U idem idem
  {
    echo "IDEM_TEST_REDIS=redis://127.0.0.1:$redis_port/0"
    echo "IDEM_TEST_PG=postgresql://idem@127.0.0.1:$pg_port/idem"
  } >"$state/env"
  cat "$state/env"
  ;;
stop)
  [ -d "$state" ] || exit 0
  redis_stop
  pg_stop
  if [ -f "$state/pg.dir" ]; then rm -rf "$(cat "$state/pg.dir")"; rm -f "$state/pg.dir"; fi
  ;;
up)
  redis-cli -p "$(cat "$state/redis.port")" ping 2>/dev/null | grep -q PONG || redis_start
  "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$(cat "$state/pg.port")" || pg_start
  ;;
redis-stop) redis_stop ;;
redis-start) redis_start ;;
pg-stop) pg_stop ;;
pg-start) pg_start ;;
pg-stop-immediate) pg_stop immediate ;;
*) echo "services.sh: unknown command $cmd" >&2; exit 2 ;;
esac
