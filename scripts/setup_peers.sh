#!/usr/bin/env bash
# Optional peers for the benchmarks (not needed to build or test), in venvs under the cache:
#   peers-venv      EnvPool (always); with --torch PyTorch (the full wheel, ~3 GB, for the learner comparison);
#                   with --sb3 Stable-Baselines3 and the same torch (tests/peers/sb3_zoo.py)
#   peers-jax-venv  with --jax: JAX on the CPU, Flax, Optax, gymnax (tests/peers/jax_ppo.py); a venv of its own
#                   because jax 0.10 needs numpy>=2 and EnvPool 0.8.4 numpy<2
# Idempotent: a requirements file already installed (its copy in the venv is the same) is skipped.
#   bash scripts/setup_peers.sh [--torch] [--sb3] [--jax]
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
venv="$cache/peers-venv"
jax_venv="$cache/peers-jax-venv"
wanted=(envpool)
jax=0
for arg in "$@"; do
  case "$arg" in
    --torch) wanted+=(torch) ;;
    --sb3) wanted+=(sb3) ;;
    --jax) jax=1 ;;
    *) echo "usage: bash scripts/setup_peers.sh [--torch] [--sb3] [--jax]" >&2; exit 2 ;;
  esac
done

install() { # install VENV NAME: tests/peers/requirements-NAME.txt into VENV unless its stamp matches
  local venv="$1" name="$2"
  local req="tests/peers/requirements-$name.txt" stamp="$1/.requirements-$2.txt"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  if [[ -f "$stamp" ]] && cmp -s "$stamp" "$req"; then
    echo "peers: $name ok ($venv)" >&2
    return
  fi
  "$venv/bin/pip" install -q -r "$req"
  cp "$req" "$stamp"
  echo "peers: installed $name into $venv" >&2
}

for name in "${wanted[@]}"; do install "$venv" "$name"; done
if (( jax )); then install "$jax_venv" jax; fi
