#!/usr/bin/env bash
# Fresh-machine setup for Flotilla. Idempotent; everything heavy is cached outside the clone
# (in $FLOTILLA_CACHE, default ~/.cache/flotilla) so CI and later sessions reuse it.
#
# Installs
#   * libtorch 2.13.0 (the version tch 0.26 pins) from the PyPI `torch` wheel:
#       - CPU set (default): torch without its Python deps + the two CUDA runtime libs
#         libtorch_cpu.so links against (~540 MB download, ~30 s);
#       - full CUDA set when FLOTILLA_CUDA=1 or when `nvidia-smi` sees a GPU (~2.7 GB, ~2 min).
#   * a Python venv (scripts/requirements-venv.txt): gymnasium and ale-py (the env bridge, reference data from
#     scripts/gym_reference.py) and TensorBoard's event reader (tests of run directories' event files).
#   * .cargo/config.toml in this clone (git-ignored) pointing tch at that libtorch, adding its rpath to
#     every binary, and putting the cargo target dir in the cache, so plain `cargo build` / `cargo test`
#     work with no variables to export.
set -euo pipefail

TORCH_VERSION=2.13.0
CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
mkdir -p "$CACHE"

want_cuda=0
if [[ "${FLOTILLA_CUDA:-}" == 1 ]] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  want_cuda=1
fi

# Concurrent runs (two clones set up at once) wait for each other instead of racing on the cache.
exec 9>"$CACHE/.setup.lock"
flock 9

install_torch() {  # $1 = target dir, rest = pip args
  local dir="$1"; shift
  if [[ -f "$dir/.complete" ]]; then return; fi
  echo "setup: installing libtorch $TORCH_VERSION into $dir" >&2
  rm -rf "$dir.partial"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$dir.partial" "$@"
  rm -rf "$dir" && mv "$dir.partial" "$dir" && touch "$dir/.complete"
}

if [[ $want_cuda == 1 ]]; then
  TORCH_DIR="$CACHE/torch-$TORCH_VERSION-cuda"
  install_torch "$TORCH_DIR" "torch==$TORCH_VERSION"
else
  TORCH_DIR="$CACHE/torch-$TORCH_VERSION-cpu"
  install_torch "$TORCH_DIR" --no-deps "torch==$TORCH_VERSION" \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85"
fi
LIBTORCH="$TORCH_DIR/torch"

VENV="$CACHE/venv"
REQUIREMENTS="$ROOT/scripts/requirements-venv.txt"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup: creating Python venv in $VENV" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
# Installed requirements are stamped with a copy of the file: a changed file installs again, an unchanged one
# costs nothing.
if ! cmp -s "$REQUIREMENTS" "$VENV/.requirements.txt"; then
  echo "setup: installing scripts/requirements-venv.txt into $VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/.requirements.txt.partial" && mv "$VENV/.requirements.txt.partial" "$VENV/.requirements.txt"
fi

mkdir -p "$ROOT/.cargo" "$CACHE/target"
config="$ROOT/.cargo/config.toml"
new_config="# Written by scripts/setup.sh; do not edit (re-run the script instead).
[env]
LIBTORCH = \"$LIBTORCH\"
FLOTILLA_PYTHON = \"$VENV/bin/python\"
# pyo3 (the envs-python bridge) builds against, embeds and links this interpreter.
PYO3_PYTHON = \"$VENV/bin/python\"

[build]
target-dir = \"$CACHE/target\"
# Doc tests link libtorch too (they take rustdocflags, not the target rustflags below).
rustdocflags = [\"-C\", \"link-arg=-Wl,-rpath,$LIBTORCH/lib\"]

[target.'cfg(target_os = \"linux\")']
# libtorch is loaded from the cache at run time: bake its path into every binary and test.
rustflags = [\"-C\", \"link-arg=-Wl,-rpath,$LIBTORCH/lib\"]
"
if [[ ! -f "$config" ]] || [[ "$(cat "$config")" != "$new_config" ]]; then
  printf '%s' "$new_config" > "$config.tmp" && mv "$config.tmp" "$config"
fi
# The target dir is shared by every clone on this machine, and cargo decides whether a workspace crate is stale
# by comparing its source files' mtimes with the last build. Coming from another clone (e.g. CI's), files older
# than that build would be taken as up to date and its artifacts reused: touch them once after a switch.
if [[ "$(cat "$CACHE/last-checkout" 2>/dev/null)" != "$ROOT" ]]; then
  (cd "$ROOT" && git ls-files -z 2>/dev/null | xargs -0 -r touch -c)
  printf '%s' "$ROOT" > "$CACHE/last-checkout"
fi
echo "setup: ok (libtorch: $LIBTORCH, venv: $VENV)" >&2
