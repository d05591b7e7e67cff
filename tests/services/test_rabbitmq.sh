#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_rabbitmq.sh SERVICES_SH STATE_DIR AMQP_PORT — the RabbitMQ the
# message consumers are tested against: scripts/services.sh starts a node
# of its own on loopback, a durable queue keeps a persistent message across
# a restart of the node, and the stop leaves no process behind.
set -eu
services=$1 state=$2 port=$3
"$services" rabbitmq-start "$state" "$port" >/dev/null
trap '"$services" rabbitmq-stop "$state"' EXIT
url="amqp://guest:guest@127.0.0.1:$port/%2f"
amqp-declare-queue -u "$url" -q idem.smoke -d >/dev/null
amqp-publish -u "$url" -r idem.smoke -p -b "one-$$"
"$services" rabbitmq-restart "$state"
got=$(amqp-get -u "$url" -q idem.smoke)
[ "$got" = "one-$$" ] || { echo "after a restart the queue gave '$got', not one-$$"; exit 1; }
if amqp-get -u "$url" -q idem.smoke >/dev/null 2>&1; then
  echo "the message was delivered twice without a redelivery"; exit 1
fi
pid=$(cat "$state/rabbitmq/server.pid")
trap - EXIT
"$services" rabbitmq-stop "$state"
if kill -0 "$pid" 2>/dev/null; then echo "the node ($pid) outlived the stop"; exit 1; fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "something still listens on $port"; exit 1
fi
echo "rabbitmq: started, a persistent message kept across a restart, stopped"
