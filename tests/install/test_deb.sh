#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_deb.sh BUILD_DIR — `cpack -G DEB` in the build directory makes the
# three packages Debian would split the project into, and each holds what a
# user installs it for: idem (the command, the manual pages, the systemd
# unit and the deployment kit), libidem0 (the shared library) and
# libidem-dev (its headers, the static library, idem.pc and the CMake
# package); the unit runs the command where the package puts it; each
# package has its copyright file and changelog; idem's two files in /etc
# are conffiles, its starter configuration loads, and its maintainer
# scripts enable and start the unit through deb-systemd-helper; lintian
# finds no error.
set -eu
build=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "$*"; exit 1; }
(cd "$build" && cpack -G DEB -B "$tmp" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; exit 1; }
for pkg in idem libidem0 libidem-dev; do
  deb=$(ls "$tmp"/${pkg}_*.deb 2>/dev/null) || fail "no $pkg package: $(ls "$tmp")"
  dpkg-deb -f "$deb" Package | grep -qx "$pkg" || fail "$deb is not named $pkg"
  dpkg-deb -c "$deb" | awk '{ print $6 }' >"$tmp/$pkg.files"
  mkdir -p "$tmp/root-$pkg"
  dpkg-deb -x "$deb" "$tmp/root-$pkg"
  # Each package: its copyright file (Debian's machine-readable format,
  # Apache-2.0 for all) and its changelog, the package's version first.
  doc="$tmp/root-$pkg/usr/share/doc/$pkg"
  head -n 1 "$doc/copyright" |
    grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
    fail "$pkg: the copyright file is not in Debian's machine-readable format"
  grep -qx 'License: Apache-2.0' "$doc/copyright" || fail "$pkg: the copyright file is not Apache-2.0"
  [ -f "$doc/LICENSE" ] || fail "$pkg: no LICENSE"
  version=$(dpkg-deb -f "$deb" Version)
  zcat "$doc/changelog.gz" | head -n 1 | grep -qF "idem ($version)" ||
    fail "$pkg: the changelog's first entry is not version $version"
done
# Libraries on the multiarch path, as Debian keeps them.
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
has() { # package file...
  pkg=$1; shift
  for f in "$@"; do grep -qxF "$f" "$tmp/$pkg.files" || fail "$pkg has no $f"; done
}
has idem ./usr/bin/idem ./usr/share/man/man1/idem.1.gz ./usr/share/man/man1/idem-serve.1.gz \
  ./usr/share/man/man1/idem-consume.1.gz ./usr/share/man/man1/idem-verify.1.gz \
  ./usr/share/man/man5/idem.yaml.5.gz ./usr/lib/systemd/system/idem.service \
  ./usr/share/doc/idem/deploy/idem.yaml ./usr/share/doc/idem/deploy/credentials.conf \
  ./usr/share/doc/idem/deploy/idem-dashboard.json ./usr/share/doc/idem/deploy/idem-alerts.yml \
  ./usr/share/doc/idem/NOTICE ./etc/idem/idem.yaml ./etc/logrotate.d/idem
# The docs the manual pages cite ("docs/consumers.md") are there.
for page in $(zcat "$tmp"/root-idem/usr/share/man/man1/*.gz | grep -o 'docs/[a-z-]*\.md' | sort -u); do
  has idem "./usr/share/doc/idem/$page"
done
has libidem0 ./usr/lib/$ma/libidem.so.0
has libidem-dev ./usr/lib/$ma/libidem.so ./usr/lib/$ma/libidem.a ./usr/include/idem.h \
  ./usr/include/idem/version.h ./usr/lib/$ma/pkgconfig/idem.pc \
  ./usr/lib/$ma/cmake/idem/idemConfig.cmake
# Nothing in two packages at once (dpkg would refuse to install both).
cat "$tmp"/*.files | grep -v '/$' | sort | uniq -d >"$tmp/twice"
[ ! -s "$tmp/twice" ] || fail "in two packages: $(cat "$tmp/twice")"
# The dependencies dpkg-shlibdeps found, and the dev package's on the library.
deps=$(dpkg-deb -f "$tmp"/idem_*.deb Depends)
for lib in libsqlite3-0 libpq5 libhiredis libevent-2.1 libjansson4 libyaml-0-2 librabbitmq4 libssl3; do
  echo "$deps" | grep -q "$lib" || fail "idem's Depends has no $lib: $deps"
done
dpkg-deb -f "$tmp"/libidem0_*.deb Depends | grep -q libsqlite3-0 ||
  fail "libidem0 does not depend on SQLite"
dpkg-deb -f "$tmp"/libidem-dev_*.deb Depends | grep -qF "libidem0 (= $version)" ||
  fail "libidem-dev does not depend on libidem0 of its version"
# The files in /etc are conffiles: an upgrade keeps an administrator's.
dpkg-deb -e "$tmp"/idem_*.deb "$tmp/control-idem"
[ "$(sort "$tmp/control-idem/conffiles")" = "$(printf '/etc/idem/idem.yaml\n/etc/logrotate.d/idem')" ] ||
  fail "idem's conffiles: $(cat "$tmp/control-idem/conffiles")"
# The unit is enabled and started as dh_installsystemd does it.
grep -q 'deb-systemd-helper enable idem.service' "$tmp/control-idem/postinst" ||
  fail "idem's postinst does not enable the unit through deb-systemd-helper"
grep -q 'deb-systemd-invoke "$action" idem.service' "$tmp/control-idem/postinst" ||
  fail "idem's postinst does not start the unit"
grep -q 'deb-systemd-helper purge idem.service' "$tmp/control-idem/postrm" ||
  fail "idem's postrm does not forget the unit on purge"
dpkg-deb -f "$tmp"/idem_*.deb Depends | grep -q 'init-system-helpers' ||
  fail "idem does not depend on init-system-helpers (deb-systemd-helper)"
# Unpacked, the command runs and its page reads; the unit runs it at /usr/bin.
root="$tmp/root-idem"
"$root/usr/bin/idem" version | grep -q '^idem [0-9]' || fail "the packaged idem does not run"
MANWIDTH=80 man -l "$root/usr/share/man/man1/idem-serve.1.gz" | grep -q '^EXIT STATUS' ||
  fail "the packaged idem-serve(1) does not read"
grep -q '^ExecStart=/usr/bin/idem serve ' "$root/usr/lib/systemd/system/idem.service" ||
  fail "the packaged unit does not run /usr/bin/idem"
# The unit's configuration, as installed, loads: the service starts as
# installed, without a secret (a LoadCredential= of a missing file would
# fail it: none is in the unit).
out=$("$root/usr/bin/idem" serve -t -c "$root/etc/idem/idem.yaml" 2>&1) ||
  fail "the packaged /etc/idem/idem.yaml does not load: $out"
grep -q '^LoadCredential=' "$root/usr/lib/systemd/system/idem.service" &&
  fail "the packaged unit loads credentials a fresh install does not have"
# lintian, Debian's own check: no error (its warnings are explained in
# deploy/README.md).
command -v lintian >/dev/null || fail "lintian is not installed (scripts/install-deps.sh installs it)"
lintian --fail-on error --tag-display-limit 0 "$tmp"/*.deb >"$tmp/lintian" 2>&1 ||
  fail "lintian: $(grep -v 'root privileges' "$tmp/lintian")"
grep -v 'root privileges' "$tmp/lintian" | sed 's/^/lintian: /'
for pkg in idem libidem0 libidem-dev; do
  echo "$pkg: $(wc -l <"$tmp/$pkg.files") entries"
done
