#!/usr/bin/env bash
# Whole-system Atari throughput: `flotilla train examples/configs/pong_impala.toml --actors N` for N = 1, 2, 4
# (STEPS agent steps each, no evaluation during training), with the batch-assembly thread on and off
# ([learner] assemble_ahead), printing a Markdown table of frames/s (4 emulator frames per agent step,
# wall-clock training time) and where the learner's time went.
#   bash scripts/bench_impala.sh [STEPS [--set key=value ...]]      (default 30720)
# CONFIG (default examples/configs/pong_impala.toml) and ACTORS (default "1 2 4") pick another run, e.g. DQN's
# replay sampling on and off the update thread:
#   CONFIG=examples/configs/pong_dqn.toml ACTORS=2 bash scripts/bench_impala.sh 16384 --set algorithm.learning_starts=2000
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-30720}"; shift || true
config="${CONFIG:-examples/configs/pong_impala.toml}"
bash scripts/setup.sh >/dev/null 2>&1
cargo build --release -p flotilla-cli >/dev/null 2>&1
bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/flotilla"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "| actors | assemble ahead | agent steps | train s | frames/s | learner in updates | assembling batches | learner waiting |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
for n in ${ACTORS:-1 2 4}; do
for ahead in on off; do
  out="$("$bin" train "$config" --actors "$n" --set "run.total_env_steps=$steps" \
    --set eval.interval_steps=100000000 --set eval.episodes=1 --set "learner.assemble_ahead=$ahead" "$@" \
    --out "$scratch/run${n}_$ahead" 2>/dev/null)"
  secs="$(sed -n 's/.* env steps in \([0-9.]*\) s$/\1/p' <<<"$out")"
  done_steps="$(sed -n 's/.* for \([0-9]*\) env steps in .*/\1/p' <<<"$out")"
  if [ "$ahead" = on ]; then
    busy="$(sed -n 's/learner time: \([0-9]*\) % in updates, \([0-9]*\) % waiting for the next batch; batch assembly .* took \([0-9.]*\) % on its own thread.*/\1 % | \3 % (own thread) | \2 %/p' <<<"$out")"
  else
    busy="$(sed -n 's/learner time: \([0-9]*\) % in updates (of which \([0-9.]*\) % assembling batches), \([0-9]*\) % waiting.*/\1 % | \2 % (in updates) | \3 %/p' <<<"$out")"
  fi
  fps="$(python3 -c "print(f'{4 * $done_steps / $secs:.0f}')")"
  echo "| $n | $ahead | $done_steps | $secs | $fps | $busy |"
done
done
