#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_deb.sh BUILD_DIR — `cpack -G DEB` in the build directory makes the
# idem package, and it holds what a user installs it for: the command, the
# library, its headers, idem.pc and the CMake package, the manual pages and
# the systemd unit, with the unit running the command where the package
# puts it and the dependencies dpkg-shlibdeps found.
set -eu
build=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "$*"; exit 1; }
(cd "$build" && cpack -G DEB -B "$tmp" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; exit 1; }
deb=$(ls "$tmp"/idem_*.deb)
dpkg-deb -I "$deb" >"$tmp/info"
grep -q '^ Package: idem$' "$tmp/info" || fail "the package is not named idem: $(cat "$tmp/info")"
for lib in libsqlite3-0 libpq5 libhiredis libevent-2.1 libjansson4 libyaml-0-2 librabbitmq4 libssl3; do
  grep '^ Depends:' "$tmp/info" | grep -q "$lib" || fail "Depends has no $lib: $(grep Depends "$tmp/info")"
done
dpkg-deb -c "$deb" | awk '{ print $6 }' >"$tmp/files"
for f in ./usr/bin/idem ./usr/lib/libidem.so.0 ./usr/lib/libidem.a ./usr/include/idem.h \
         ./usr/include/idem/version.h ./usr/lib/pkgconfig/idem.pc \
         ./usr/lib/cmake/idem/idemConfig.cmake \
         ./usr/share/man/man1/idem.1.gz ./usr/share/man/man1/idem-serve.1.gz \
         ./usr/share/man/man1/idem-consume.1.gz ./usr/share/man/man1/idem-verify.1.gz \
         ./usr/share/man/man5/idem.yaml.5.gz ./usr/lib/systemd/system/idem.service \
         ./usr/share/doc/idem/changelog.gz \
         ./usr/share/doc/idem/deploy/idem.yaml ./usr/share/doc/idem/deploy/logrotate-idem \
         ./usr/share/doc/idem/deploy/idem-dashboard.json \
         ./usr/share/doc/idem/deploy/idem-alerts.yml ./usr/share/doc/idem/copyright \
         ./usr/share/doc/idem/LICENSE ./usr/share/doc/idem/NOTICE; do
  grep -qxF "$f" "$tmp/files" || fail "the package has no $f"
done
# Unpacked, the command runs and its page reads; the unit runs it at /usr/bin.
dpkg-deb -x "$deb" "$tmp/root"
# The copyright file is Debian's machine-readable format, Apache-2.0 for all.
head -n 1 "$tmp/root/usr/share/doc/idem/copyright" |
  grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
  fail "the copyright file is not in Debian's machine-readable format"
grep -qx 'License: Apache-2.0' "$tmp/root/usr/share/doc/idem/copyright" ||
  fail "the copyright file does not say Apache-2.0"
"$tmp/root/usr/bin/idem" version | grep -q '^idem [0-9]' || fail "the packaged idem does not run"
MANWIDTH=80 man -l "$tmp/root/usr/share/man/man1/idem-serve.1.gz" | grep -q '^EXIT STATUS' ||
  fail "the packaged idem-serve(1) does not read"
grep -q '^ExecStart=/usr/bin/idem serve ' "$tmp/root/usr/lib/systemd/system/idem.service" ||
  fail "the packaged unit does not run /usr/bin/idem"
# The changelog's version is the package's.
version=$(dpkg-deb -f "$deb" Version)
zcat "$tmp/root/usr/share/doc/idem/changelog.gz" | head -n 1 | grep -qF "idem ($version)" ||
  fail "the changelog's first entry is not version $version"
# lintian, Debian's own check: no error (its warnings are explained in
# deploy/README.md).
if command -v lintian >/dev/null; then
  lintian --fail-on error --tag-display-limit 0 "$deb" >"$tmp/lintian" 2>&1 ||
    fail "lintian: $(grep -v 'root privileges' "$tmp/lintian")"
  grep -v 'root privileges' "$tmp/lintian" | sed 's/^/lintian: /'
else
  fail "lintian is not installed (scripts/install-deps.sh installs it)"
fi
echo "$(basename "$deb"): $(wc -l <"$tmp/files") entries, $(grep '^ Depends:' "$tmp/info")"
