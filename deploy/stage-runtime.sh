#!/usr/bin/env bash
# Copies what the flotilla binary needs at run time into a root directory for the container image's run stage:
#   bash deploy/stage-runtime.sh BINARY ROOT
# ROOT/usr/local/bin/flotilla; every shared library `ldd BINARY` resolves inside the cache ($FLOTILLA_CACHE,
# default ~/.cache/flotilla), at the same path, since the binary's rpath names it (libtorch_cpu, libc10, libgomp and
# the two CUDA runtime libraries the CPU wheel links; for a CUDA libtorch the whole torch/lib and nvidia/ trees,
# because CUDA loads more of them with dlopen than ldd can see); and the Python venv the binary embeds.
# Libraries outside the cache (libc, libstdc++, libpython3.11) come from the run stage's Debian packages.
set -euo pipefail
bin="$1"
root="$2"
cache="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
cache="$(realpath "$cache")"
install -D -m 0755 "$bin" "$root/usr/local/bin/flotilla"
libs="$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')"
if grep -q 'not found' <<<"$(ldd "$bin")"; then
  echo "stage-runtime: $bin has unresolved libraries:" >&2
  ldd "$bin" | grep 'not found' >&2
  exit 1
fi
cuda=0
for lib in $libs; do
  # Normalise torch/lib/../../nvidia/... without resolving symlinks: the loader looks libraries up by these names.
  path="$(realpath -s "$lib")"
  case "$path" in
    "$cache"/*)
      mkdir -p "$root$(dirname "$path")"
      cp -L "$path" "$root$path"
      [[ "$(basename "$path")" == libtorch_cuda.so ]] && cuda=1
      ;;
  esac
done
if [[ $cuda == 1 ]]; then
  torch_lib="$(dirname "$(realpath -s "$(grep -m1 '/libtorch_cuda.so$' <<<"$libs")")")"
  for dir in "$torch_lib" "$(realpath -s "$torch_lib/../../nvidia")"; do
    mkdir -p "$root$dir"
    cp -a "$dir/." "$root$dir/"
  done
fi
mkdir -p "$root$cache"
cp -a "$cache/venv" "$root$cache/venv"
echo "stage-runtime: $(find "$root" -type f | wc -l) files, $(du -sh "$root" | cut -f1) in $root" >&2
find "$root" -name '*.so*' -type f -not -path '*/venv/*' -printf '  %P\n' | sort >&2
