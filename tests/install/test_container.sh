#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_container.sh BUILD_DIR SOURCE_DIR — deploy/container/Dockerfile
# builds an image that runs idem: on a Debian bookworm made here with
# debootstrap from the machine's own Debian mirror (apt's sources), in
# place of debian:bookworm-slim, so that nothing comes from elsewhere, with
# the idem package `cpack -G DEB` makes in BUILD_DIR. The image runs idem
# as a user of its own; the gateway answers its health on a port of the
# test's; the container stops cleanly. Installing the package there also
# runs its maintainer scripts for real: the unit ends up enabled. podman keeps everything of the
# test's under a temp dir (its own storage root), which goes at the end.
#
# Run where the test suite runs (a VM that may itself be sandboxed), podman
# is given what works everywhere: runc (crun refuses a host whose cgroups
# are in hybrid mode), the vfs storage driver (no overlay mount needed),
# and limits on open files and processes below the ones podman lowers its
# own to (its default of a million open files is refused without
# CAP_SYS_RESOURCE).
set -eu
build=$1 src=$2
tmp=$(mktemp -d)
pm() {
  podman --root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs \
    --cgroup-manager cgroupfs --runtime runc "$@"
}
limits="--ulimit nofile=16384:16384 --ulimit nproc=16384:16384"
cleanup() {
  pm rm -f -t 0 idem-test >/dev/null 2>&1 || true
  pm rmi -a -f >/dev/null 2>&1 || true
  rm -rf "$tmp" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "$*"; exit 1; }
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install-deps.sh installs it)"
done
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list)
[ -n "$mirror" ] || fail "no Debian mirror in apt's sources"

# The base: Debian bookworm, its smallest variant, imported as an image.
debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
  { tail -20 "$tmp/debootstrap.log"; fail "debootstrap failed"; }
tar -C "$tmp/root" -c . | pm import - localhost/idem-test-base:bookworm >/dev/null
rm -rf "$tmp/root"

# The context: the packages and the Dockerfile's own files.
mkdir "$tmp/ctx"
(cd "$build" && cpack -G DEB -B "$tmp/deb" >"$tmp/cpack.log" 2>&1) ||
  { cat "$tmp/cpack.log"; fail "cpack failed"; }
cp "$tmp"/deb/idem_*.deb "$src"/deploy/container/* "$tmp/ctx/"
pm build $limits --network host --build-arg BASE=localhost/idem-test-base:bookworm \
  -t localhost/idem-test:latest "$tmp/ctx" >"$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log"; fail "podman build failed"; }

# It runs idem, not as root.
version=$(pm run --rm $limits localhost/idem-test:latest version)
echo "$version" | grep -q '^idem [0-9]' || fail "the image's idem: $version"
who=$(pm run --rm $limits --entrypoint /usr/bin/id localhost/idem-test:latest -un)
[ "$who" = idem ] || fail "the image runs as $who, not idem"
# The package's postinst ran there, as on a host: the unit enabled
# through deb-systemd-helper (which systemd, had the image one, would
# start), the conffiles in /etc.
pm run --rm $limits --entrypoint /bin/sh localhost/idem-test:latest -c \
  'test -L /etc/systemd/system/multi-user.target.wants/idem.service &&
   test -f /etc/idem/idem.yaml && test -f /etc/logrotate.d/idem' ||
  fail "the package's postinst did not enable idem.service, or its conffiles are missing"

# The daemon, on a port of the test's: its health, then a clean stop.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pm run -d $limits --name idem-test --network host localhost/idem-test:latest \
  serve -c /etc/idem/container.yaml --listen "127.0.0.1:$port" >/dev/null
ok=
for _ in $(seq 100); do
  if curl -fsS "http://127.0.0.1:$port/_idem/v1/health" >"$tmp/health" 2>/dev/null; then
    ok=1; break
  fi
  sleep 0.1
done
[ -n "$ok" ] || { pm logs idem-test; fail "the container's idem did not answer its health"; }
grep -q '"status":"ok"' "$tmp/health" || fail "health: $(cat "$tmp/health")"
pm stop -t 10 idem-test >/dev/null
status=$(pm inspect idem-test --format '{{.State.ExitCode}}')
[ "$status" = 0 ] || { pm logs idem-test; fail "idem in the container exited $status"; }
pm logs idem-test 2>&1 | grep -q 'stopped' || fail "no clean stop in the container's log"
echo "container: built on debootstrap's bookworm, $version runs as idem, health ok, stopped cleanly"
