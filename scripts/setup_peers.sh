#!/usr/bin/env bash
# Optional peers for the benchmarks (not needed to build or test): EnvPool in its own venv under the cache, and
# with --torch also PyTorch (the full wheel, ~3 GB, for the learner comparison). Idempotent: a requirements file
# already installed (its copy in the venv is the same) is skipped.
#   bash scripts/setup_peers.sh [--torch]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/peers-venv"
wanted=(envpool)
[[ "${1:-}" == "--torch" ]] && wanted+=(torch)
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
for name in "${wanted[@]}"; do
  req="tests/peers/requirements-$name.txt"
  stamp="$venv/.requirements-$name.txt"
  if [[ -f "$stamp" ]] && cmp -s "$stamp" "$req"; then
    echo "peers: $name ok ($venv)" >&2
    continue
  fi
  "$venv/bin/pip" install -q -r "$req"
  cp "$req" "$stamp"
  echo "peers: installed $name into $venv" >&2
done
