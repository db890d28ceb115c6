#!/usr/bin/env bash
# A long learning run in the background that survives the session that started it: the run directory has a fixed
# name under ~/.cache/flotilla/runs/ (outside the clone), the run checkpoints every CHECKPOINT steps, and calling
# the script again with the same NAME resumes it from its last checkpoint (bit for bit on the CPU, docs/cli.md)
# instead of starting over. It runs a copy of the release binary, so rebuilding the workspace meanwhile does not
# touch it, at `nice 10`, so foreground work on the machine keeps priority.
#   bash scripts/long_run.sh NAME CONFIG [--set key=value ...]
# e.g.
#   bash scripts/long_run.sh sac_halfcheetah_s1 examples/configs/halfcheetah_sac.toml --set run.torch_threads=1
#   bash scripts/long_run.sh ppo_halfcheetah_norm_s1 examples/configs/halfcheetah_ppo.toml
# Writes RUN_DIR, RUN_DIR.log (appended to by every segment) and RUN_DIR.done with the wall seconds of each
# segment; when the run is done it plots the eval curve to RUN_DIR/eval.png and prints it (flotilla plot).
# FLOTILLA_CHECKPOINT_STEPS (default 50000) sets the checkpoint interval of a fresh run. FLOTILLA_BIN names
# the binary a fresh run copies (default: a release build of the clone, made here); a caller that starts many
# runs builds once and passes it, so that no run rebuilds the shared target dir while something else uses it.
# One invocation per NAME at a time: a second, while the first runs, is refused (a lock on RUN_DIR.lock).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash scripts/long_run.sh NAME CONFIG [--set key=value ...]" >&2; exit 2; }
name="$1"; config="$2"; shift 2
case "$name" in */*|.*|"") echo "long_run.sh: NAME must be a plain directory name, got '$name'" >&2; exit 2;; esac
[ -f "$config" ] || { echo "long_run.sh: no config file $config" >&2; exit 2; }
runs="${HOME}/.cache/flotilla/runs"
mkdir -p "$runs/bin"
out="$runs/$name"
exec 9>"$out.lock"
flock -n 9 || { echo "long_run.sh: $name is running already (another process holds $out.lock)" >&2; exit 2; }
if [[ -n ${FLOTILLA_BIN:-} ]]; then
  [ -x "$FLOTILLA_BIN" ] || { echo "long_run.sh: FLOTILLA_BIN=$FLOTILLA_BIN is not an executable" >&2; exit 2; }
  release_bin=$FLOTILLA_BIN
else
  source scripts/release_bin.sh
fi
if [ -e "$out.done" ]; then
  echo "long_run.sh: $name is done ($out.done); remove it and $out to run it again" >&2
  exit 0
fi
# One binary per run: a resumed segment runs the binary the run started with.
bin="$runs/bin/$name"
if [ ! -x "$bin" ]; then
  cp "$release_bin" "$bin.tmp" && mv "$bin.tmp" "$bin"
fi
start=$(date +%s)
if [ -f "$out/checkpoint.safetensors" ]; then
  echo "== $(date -u +%FT%TZ) resuming $out" >>"$out.log"
  nice -n 10 "$bin" train --resume "$out" >>"$out.log" 2>&1
else
  rm -rf "$out"
  echo "== $(date -u +%FT%TZ) starting $name: $config $*" >>"$out.log"
  nice -n 10 "$bin" train "$config" --out "$out" \
    --set "checkpoint.interval_steps=${FLOTILLA_CHECKPOINT_STEPS:-50000}" "$@" >>"$out.log" 2>&1
fi
echo "segment_wall_secs $(( $(date +%s) - start ))" >>"$out.segments"
cat "$out.segments" >"$out.done.tmp" && mv "$out.done.tmp" "$out.done"
"$bin" plot "$out" --metric eval/mean_return --out "$out/eval.png" >>"$out.log" 2>&1 || true
frameskip=1
case "$config" in *pong*|*atari*|*breakout*) frameskip=4;; esac
python3 scripts/eval_curve.py "$out/metrics.csv" --frameskip "$frameskip" | tee -a "$out.log"
