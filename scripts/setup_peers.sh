#!/usr/bin/env bash
# Optional peers for the benchmarks (not needed to build or test): EnvPool in its own venv under the cache.
# Idempotent: re-runs are a no-op once tests/peers/requirements-envpool.txt is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/peers-venv"
stamp="$venv/.requirements-envpool.txt"
if [[ -f "$stamp" ]] && cmp -s "$stamp" tests/peers/requirements-envpool.txt; then
  echo "peers: ok ($venv)" >&2
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q -r tests/peers/requirements-envpool.txt
cp tests/peers/requirements-envpool.txt "$stamp"
echo "peers: installed EnvPool into $venv" >&2
