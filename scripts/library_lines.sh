#!/usr/bin/env bash
# The algorithms crate's library lines at a git revision (default HEAD), tests excluded: every .rs file under
# algorithms/src cut at its first `#[cfg(test)]` (test modules end the files here; a file under `#![cfg(test)]`,
# or declared as `#[cfg(test)] mod NAME;` by its parent, is all test). Prints all such lines and the code lines
# among them (no blank lines, no `//`, `///` or `//!` comment lines).
#
#   bash scripts/library_lines.sh [REV]
set -euo pipefail
rev="${1:-HEAD}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
total=0
code=0
files=$(git ls-tree -r --name-only "$rev" algorithms/src | grep '\.rs$')
# Files their parent declares under `#[cfg(test)]`: `dir/NAME.rs` for `mod NAME;` in dir/mod.rs or dir/lib.rs.
test_only=$(for f in $files; do
  case "$f" in */mod.rs|*/lib.rs) dir=${f%/*};; *) continue;; esac
  git show "$rev:$f" | awk -v dir="$dir" '/^#\[cfg\(test\)\]$/ { t = 1; next }
    t && /^(pub(\(crate\))? )?mod [a-z_0-9]+;$/ { sub(/^.*mod /, ""); sub(/;$/, ""); print dir "/" $0 ".rs" } { t = 0 }'
done)
for f in $files; do
  if printf '%s\n' "$test_only" | grep -qx "$f"; then continue; fi
  lib=$( (git show "$rev:$f" || true) | awk '/#!?\[cfg\(test\)\]/ { exit } { print }')
  total=$((total + $(printf '%s\n' "$lib" | wc -l)))
  code=$((code + $(printf '%s\n' "$lib" | grep -v '^[[:space:]]*$' | grep -cv '^[[:space:]]*//' || true)))
done
echo "$rev: $total library lines, $code of them code"
