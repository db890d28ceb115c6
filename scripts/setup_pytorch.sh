#!/usr/bin/env bash
# PyTorch for the export check (cli/tests/export.rs runs tests/python/export_check.py): torch, safetensors and
# numpy pinned in tests/python/requirements-pytorch.txt, in a venv of their own under the cache. Idempotent: when
# the venv's copy of the requirements file equals the pinned one nothing is installed; a lock keeps two runs (two
# clones, CI and a developer) from installing into the same venv at once. Prints the venv's python.
#   bash scripts/setup_pytorch.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
venv="$cache/pytorch-venv"
req="tests/python/requirements-pytorch.txt"
stamp="$venv/.requirements-pytorch.txt"
mkdir -p "$cache"
exec 9>"$cache/pytorch-venv.lock"
flock 9
if [[ -f "$stamp" ]] && cmp -s "$stamp" "$req" && [[ -x "$venv/bin/python" ]]; then
  echo "pytorch: ok ($venv)" >&2
else
  echo "pytorch: installing $req into $venv (the full torch wheel, ~3 GB, once)" >&2
  rm -f "$stamp"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  # Fail here, not in the tests, if the wheel cannot be imported.
  "$venv/bin/python" -c 'import torch, safetensors, numpy'
  cp "$req" "$stamp"
  echo "pytorch: installed into $venv" >&2
fi
echo "$venv/bin/python"
