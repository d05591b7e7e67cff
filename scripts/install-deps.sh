#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install what Idem needs to build, test and benchmark, from Debian 12's
# archive. Runs apt-get as root (directly, or through sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config      # toolchain
  libsqlite3-dev sqlite3                # embedded store
  libhiredis-dev libpq-dev              # distributed store: Redis, PostgreSQL
  postgresql                            # distributed tests (server, pgbench)
  libssl-dev openssl                    # SHA-256, CSPRNG; openssl(1) makes API keys
  libevent-dev libjansson-dev libyaml-dev  # idem serve: event loop, JSON, YAML
  libcmocka-dev                         # tests
  curl                                  # system tests
  python3 python3-yaml                  # docs/openapi.yaml's test
  man-db                                # the manual pages' test (man --warnings)
  systemd logrotate                     # deploy/: systemd-analyze verify of the unit; logrotate
  file dpkg-dev lintian                 # cpack -G DEB (its shlibdeps) in install.deb, checked
  podman runc debootstrap               # install.container: the image, on a bookworm of its own
  redis-server redis-tools redis-sentinel  # distributed tests, failover, redis-benchmark
  rabbitmq-server librabbitmq-dev amqp-tools  # the message consumers and their tests
  prometheus                            # promtool: the metrics' and alert rules' tests
  chromium nodejs                       # the console's test: a browser, and its driver
  default-jdk-headless golang-go        # the token flow's Java and Go clients, run by its test
  git                                   # the run.sh demo's test copies the tree's files
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
echo "installing: ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
