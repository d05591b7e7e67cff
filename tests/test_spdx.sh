#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_spdx.sh SOURCE_DIR — every source file of Idem says its licence in its
# first three lines (SPDX-License-Identifier: Apache-2.0), and LICENSE is
# the Apache License 2.0. Source files: C, shell, Python, JavaScript, CSS,
# HTML, Go, Java, Lua, CMake, and the configuration files a package ships;
# not the docs, the fuzz corpora or generated files.
set -eu
cd "$1"
grep -q 'Apache License' LICENSE && grep -q 'Version 2.0, January 2004' LICENSE ||
  { echo "LICENSE is not the Apache License 2.0"; exit 1; }
if [ -d .git ] || [ -f .git ]; then
  list() { git ls-files; }
else
  list() { find . -type f ! -path './build*' ! -path './.git/*' | sed 's|^\./||'; }
fi
missing=$(list | grep -v '^fuzz/corpus/' | grep -v '^docs/' |
  grep -E '\.(c|h|sh|py|js|css|html|go|java|lua|yaml|yml|service|in)$|(^|/)CMakeLists\.txt$|^deploy/logrotate/idem$' |
  while IFS= read -r f; do
    head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"
  done)
if [ -n "$missing" ]; then
  echo "without an SPDX-License-Identifier: Apache-2.0 line in their first three lines:"
  echo "$missing"
  exit 1
fi
echo "every source file names its licence"
