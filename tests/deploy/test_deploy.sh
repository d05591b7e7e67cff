#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_deploy.sh IDEM SOURCE_DIR MAN_DIR — the deployment kit of deploy/ is
# one that works together:
#  - systemd-analyze verify accepts deploy/systemd/idem.service without a
#    word (a copy whose commands are the built idem, its man pages found in
#    MAN_DIR: verify checks both exist);
#  - deploy/idem.yaml is a configuration idem serve --check accepts, given
#    the credentials the unit loads, and each path it names is one the unit
#    makes: its credentials, state_dir, the access log's LogsDirectory; its
#    admin listener on loopback, where Prometheus scrapes it.
set -eu
idem=$1 src=$2 man=$3
unit=$src/deploy/systemd/idem.service
creds_conf=$src/deploy/systemd/credentials.conf
yaml=$src/deploy/idem.yaml
starter=$src/deploy/debian/idem.yaml
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "$*"; exit 1; }

# systemd-analyze verify finds man pages with man(1): a tree of its own.
mkdir -p "$tmp/man/man1" "$tmp/man/man5" "$tmp/unit"
cp "$man"/*.1 "$tmp/man/man1/"; cp "$man"/*.5 "$tmp/man/man5/"
sed "s|/usr/bin/idem |$idem |" "$unit" >"$tmp/unit/idem.service"
grep -q "^ExecStart=$idem serve" "$tmp/unit/idem.service" || fail "no ExecStart=/usr/bin/idem in $unit"
if ! out=$(cd "$tmp" && MANPATH="$tmp/man" SYSTEMD_LOG_LEVEL=notice \
           systemd-analyze verify "$tmp/unit/idem.service" 2>&1) || [ -n "$out" ]; then
  fail "systemd-analyze verify: $out"
fi

# What the unit must have.
for want in 'Type=exec' 'ExecReload=/bin/kill -HUP $MAINPID' 'DynamicUser=yes' \
            'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' \
            'MemoryDenyWriteExecute=yes' 'SystemCallFilter=@system-service'; do
  grep -qxF "$want" "$unit" || fail "$unit: no $want"
done
grep -q '^LimitNOFILE=[0-9]' "$unit" || fail "$unit: no LimitNOFILE"
grep -q '^RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6$' "$unit" ||
  fail "$unit: RestrictAddressFamilies is not AF_UNIX AF_INET AF_INET6"

# The file's paths are the unit's.
dir() { sed -n "s/^$1=//p" "$unit"; }
state=$(dir StateDirectory) runtime=$(dir RuntimeDirectory) logs=$(dir LogsDirectory)
# The admin listener on loopback, where Prometheus on the host scrapes it.
grep -q "^admin_listen: 127\.0\.0\.1:[0-9]*$" "$yaml" || fail "admin_listen is not on loopback"
grep -q "^state_dir: /var/lib/$state\$" "$yaml" || fail "state_dir is not /var/lib/$state"
grep -q "to: /var/log/$logs/" "$yaml" || fail "the access log is not in /var/log/$logs"
creds=$(grep -o '/run/credentials/idem.service/[a-z-]*' "$yaml" | sort -u)
[ -n "$creds" ] || fail "$yaml reads no credential"
for c in $creds; do
  name=${c##*/}
  grep -q "^LoadCredential=$name:" "$creds_conf" ||
    fail "$yaml reads $name, which the unit's drop-in credentials.conf does not load"
done
grep -v '^ *#' "$yaml" | grep -q '://[^ /]*:[^ /@]*@' && fail "$yaml holds a password"
# The drop-in, beside the unit, is one systemd takes with it.
mkdir -p "$tmp/unit/idem.service.d"
cp "$creds_conf" "$tmp/unit/idem.service.d/"
if ! out=$(cd "$tmp" && MANPATH="$tmp/man" SYSTEMD_LOG_LEVEL=notice \
           systemd-analyze verify "$tmp/unit/idem.service" 2>&1) || [ -n "$out" ]; then
  fail "systemd-analyze verify, with credentials.conf: $out"
fi
# The package's starter: the unit's paths, no secret, and it loads as is.
grep -q "^admin_listen: unix:/run/$runtime/" "$starter" || fail "$starter: admin_listen not in /run/$runtime"
grep -q "path: /var/lib/$state/" "$starter" || fail "$starter: its store is not in /var/lib/$state"
grep -q "to: /var/log/$logs/" "$starter" || fail "$starter: the access log is not in /var/log/$logs"
grep -v '^ *#' "$starter" | grep -q 'env:\|file:' && fail "$starter reads a secret: the service would not start as installed"
out=$("$idem" serve -c "$starter" --check 2>&1) || fail "idem serve --check $starter: $out"

# idem serve --check on it, the credentials being files of this test.
mkdir "$tmp/cred"
for c in $creds; do
  case ${c##*/} in
  redis-url) echo 'redis://idem:pw-in-a-file@127.0.0.1:6379/0' ;;
  postgres-url) echo 'postgresql://idem:pw-in-a-file@127.0.0.1:5432/idem' ;;
  *) openssl rand -hex 32 ;;
  esac >"$tmp/cred/${c##*/}"
done
chmod 0400 "$tmp/cred"/*
sed "s|/run/credentials/idem.service|$tmp/cred|" "$yaml" >"$tmp/idem.yaml"
out=$("$idem" serve -c "$tmp/idem.yaml" --check 2>&1) || fail "idem serve --check: $out"
echo "$out"
# ... and without them it is refused, naming the file it could not read.
if out=$(sed "s|/run/credentials/idem.service|$tmp/none|" "$yaml" >"$tmp/bad.yaml" &&
         "$idem" serve -c "$tmp/bad.yaml" --check 2>&1); then
  fail "idem serve --check took a file whose credentials are missing"
fi
echo "$out" | grep -q "$tmp/none/" || fail "the refusal does not name the file: $out"
# -T checks it the same way and prints it: no credential's text, each by
# the file it is read from, and the printed file printed again is the same.
"$idem" serve -T -c "$tmp/idem.yaml" >"$tmp/dump.yaml" 2>"$tmp/dump.err" ||
  fail "idem serve -T: $(cat "$tmp/dump.err")"
grep -q "is valid" "$tmp/dump.err" || fail "idem serve -T did not check: $(cat "$tmp/dump.err")"
for c in "$tmp/cred"/*; do
  grep -qF "$(cat "$c")" "$tmp/dump.yaml" && fail "idem serve -T printed the text of $c"
done
grep -q "file: \"$tmp/cred/" "$tmp/dump.yaml" || fail "idem serve -T names no credential file"
"$idem" serve -T -c "$tmp/dump.yaml" 2>/dev/null | cmp -s - "$tmp/dump.yaml" ||
  fail "idem serve -T of its own output differs"
# -t is --check, as nginx -t is; -V says the version, as idem version does.
out=$("$idem" serve -t -c "$tmp/idem.yaml" 2>&1) || fail "idem serve -t: $out"
echo "$out" | grep -q "is valid" || fail "idem serve -t did not check: $out"
want=$("$idem" version | sed 's/^idem //')
[ "$("$idem" serve --version)" = "idem serve $want" ] || fail "idem serve --version"
[ "$("$idem" consume -V)" = "idem consume $want" ] || fail "idem consume -V"
echo "idem.service verified; deploy/idem.yaml valid with the unit's credentials"
