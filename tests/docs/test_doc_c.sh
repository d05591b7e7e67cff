#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_doc_c.sh DOC SOURCE — every ```c block of DOC stands in
# SOURCE word for word, so the code a page shows is the code the suite runs.
set -eu
doc=$1 src=$2
awk -v doc="$doc" '
  FNR == NR { src = src $0 "\n"; next }
  /^```c$/ { inblock = 1; block = ""; start = FNR; next }
  inblock && /^```$/ {
    inblock = 0; blocks++
    if (index(src, block) == 0) { printf "%s:%d: this block is not in the source\n", doc, start; bad = 1 }
    next
  }
  inblock { block = block $0 "\n" }
  END {
    if (!blocks) { printf "%s: no ```c block\n", doc; exit 1 }
    if (bad) exit 1
    printf "%s: %d blocks, each in the source\n", doc, blocks
  }
' "$src" "$doc"
