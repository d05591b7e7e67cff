#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_install.sh BUILD_DIR SOURCE_DIR — install Idem from BUILD_DIR into a
# temp prefix, then build tests/install/consumer.c against it twice, with
# pkg-config (idem.pc) and with CMake (find_package(idem CONFIG), idem::idem),
# and run both. Either way it must work wherever the prefix is.
set -eu
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/elsewhere/prefix" # not the prefix it was configured with
cmake --install "$build" --prefix "$prefix" >/dev/null
# A sanitized libidem wants its consumers built the same way.
san=
grep -q '^IDEM_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" && san="-fsanitize=address,undefined"
pc=$(find "$prefix" -name idem.pc)
[ -n "$pc" ] || { echo "no idem.pc under $prefix"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")

PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs idem >"$tmp/flags"
case $(cat "$tmp/flags") in
*"$prefix"*) ;;
*) echo "idem.pc does not point into $prefix: $(cat "$tmp/flags")"; exit 1 ;;
esac
# shellcheck disable=SC2046
cc $san -o "$tmp/by-pkg-config" "$src/tests/install/consumer.c" $(cat "$tmp/flags")
LD_LIBRARY_PATH="$libdir" "$tmp/by-pkg-config"

cmake -S "$src/tests/install" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="$san" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cmake-build/consumer"
echo "installed idem: built and ran with pkg-config and with find_package"
