#!/usr/bin/env bash
# The Pong learning run BENCHMARKS.md reports: PPO (examples/configs/pong_ppo.toml) for 2.5 M agent steps = 10 M
# frames on this machine's CPU, evaluated on 8 whole games every 250 K frames (about 85 minutes on 2 Zen 4 cores
# with --set algorithm.cnn.bf16=true, the measured seed-1 run; f32 takes ~1.7x as long). bf16 only pays on a CPU
# with AVX512-BF16: where libtorch emulates it (e.g. Zen 3) it was > 8x slower than f32, and the learner warns.
# --stop-at N (agent steps) ends the run early with the 10 M-frame schedules.
#   bash scripts/pong_run.sh [SEED] [EXTRA --set ARGS...]
# Writes the run directory and the log under ~/.cache/flotilla/runs/ (outside the clone); prints the eval curve
# (scripts/eval_curve.py) when done.
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-1}"; shift || true
bash scripts/setup.sh >/dev/null
cargo build --release -p flotilla-cli >/dev/null
bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/flotilla"
runs="${HOME}/.cache/flotilla/runs"
mkdir -p "$runs"
out="$runs/pong_ppo_seed${seed}_$(date +%Y%m%d_%H%M%S)"
echo "run directory: $out (log: $out.log)"
"$bin" train examples/configs/pong_ppo.toml --set "run.seed=${seed}" "$@" --out "$out" >"$out.log" 2>&1
python3 scripts/eval_curve.py "$out/metrics.csv" | tee -a "$out.log"
