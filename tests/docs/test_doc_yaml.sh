#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_doc_yaml.sh IDEM DOC... — every ```yaml block of the given docs is a
# configuration idem accepts: `idem serve --check` (or `idem consume
# --check` for one with consumers: and no routes:) exits 0 on it. A doc
# example that stops parsing fails here, not in a reader's hands. And
# each is printed back (-T), the printed file accepted and printed again
# to the same text: every example is a round trip of the printer too.
set -eu
idem=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
n=0
for doc in "$@"; do
  awk -v dir="$tmp" -v base="$(basename "$doc" .md)" '
    /^```yaml$/ { n++; out = sprintf("%s/%s-%d.yaml", dir, base, n); inb = 1; next }
    /^```$/ && inb { inb = 0; close(out); next }
    inb { print > out }' "$doc"
done
# A secret an example takes from the environment ({ env: NAME }) is set
# as a user would set it, when the test's environment does not: a
# Standard Webhooks secret (whsec_ and base64), which every scheme takes,
# for a WeChat Pay APIv3 key its 32 bytes, for a Redis or PostgreSQL URL a
# URL.
for name in $(cat "$tmp"/*.yaml 2>/dev/null | grep -o 'env: *[A-Za-z_][A-Za-z0-9_]*' |
              sed 's/env: *//' | sort -u); do
  value=whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWo=
  case $name in
  *APIV3*) value=0123456789abcdef0123456789abcdef ;;
  *REDIS*) value=redis://127.0.0.1:6379/0 ;; # a URL idem serve --check reads as one
  *POSTGRES*|*PG_URL*) value=postgresql://idem@127.0.0.1:5432/idem ;;
  esac
  eval "[ -n \"\${$name:-}\" ]" || export "$name=$value"
done
# A public key an example names (file: /etc/idem/x.pem) is made as the
# provider would hand it over, and the example pointed at it.
for f in "$tmp"/*.yaml; do
  [ -e "$f" ] || continue
  for pem in $(grep -o 'file: *[^ ,}]*\.pem' "$f" | sed 's/file: *//' | sort -u); do
    [ -e "$pem" ] && continue
    made="$tmp/$(basename "$pem")"
    [ -e "$made" ] ||
      openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 2>/dev/null |
        openssl pkey -pubout -out "$made"
    sed -i "s|$pem|$made|g" "$f"
  done
done
for f in "$tmp"/*.yaml; do
  [ -e "$f" ] || continue
  n=$((n + 1))
  cmd=serve
  if grep -q '^consumers:' "$f" && ! grep -q '^routes:' "$f"; then cmd=consume; fi
  if ! out=$(cd "$tmp" && "$idem" "$cmd" --check -c "$f" 2>&1); then
    echo "$(basename "$f"): idem $cmd --check refused it: $out"; sed 's/^/  | /' "$f"; exit 1
  fi
  if ! out=$(cd "$tmp" && "$idem" "$cmd" -T -c "$f" 2>&1 >"$f.dump") ||
     ! out=$(cd "$tmp" && "$idem" "$cmd" -T -c "$f.dump" 2>&1 >"$f.dump2"); then
    echo "$(basename "$f"): idem $cmd -T: $out"; sed 's/^/  | /' "$f.dump"; exit 1
  fi
  if ! cmp -s "$f.dump" "$f.dump2"; then
    echo "$(basename "$f"): printed back (-T), then printed again, it differs:"
    diff "$f.dump" "$f.dump2" | sed 's/^/  | /'; exit 1
  fi
done
[ "$n" -gt 0 ] || { echo "no yaml blocks in $*"; exit 1; }
echo "$n yaml blocks accepted"
