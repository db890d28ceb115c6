#!/usr/bin/env bash
# The algorithms crate's library lines at a git revision (default HEAD), tests excluded: every .rs file under
# algorithms/src cut at its first `#[cfg(test)]` (test modules end the files here; a file under `#![cfg(test)]` is all test). Prints all such lines and
# the code lines among them (no blank lines, no `//`, `///` or `//!` comment lines).
#
#   bash scripts/library_lines.sh [REV]
set -euo pipefail
rev="${1:-HEAD}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
total=0
code=0
for f in $(git ls-tree -r --name-only "$rev" algorithms/src | grep '\.rs$'); do
  lib=$( (git show "$rev:$f" || true) | awk '/#!?\[cfg\(test\)\]/ { exit } { print }')
  total=$((total + $(printf '%s\n' "$lib" | wc -l)))
  code=$((code + $(printf '%s\n' "$lib" | grep -v '^[[:space:]]*$' | grep -cv '^[[:space:]]*//' || true)))
done
echo "$rev: $total library lines, $code of them code"
