#!/usr/bin/env bash
# The Pong learning run BENCHMARKS.md reports: PPO (examples/configs/pong_ppo.toml) for 2.5 M agent steps = 10 M
# frames on this machine's CPU, evaluated on 8 whole games every 250 K frames (about 85 minutes on 2 Zen 4 cores
# with --set algorithm.cnn.bf16=true, the measured seed-1 run; f32 takes ~1.7x as long). bf16 only pays on a CPU
# with AVX512-BF16: where libtorch emulates it (e.g. Zen 3) it was > 8x slower than f32, and the learner warns.
#   bash scripts/pong_run.sh [SEED] [--set key=value ...]
# A scripts/long_run.sh run named pong_ppo_s<SEED>: under ~/.cache/flotilla/runs/ (outside the clone),
# checkpointed, resumed by calling this again; prints the eval curve (scripts/eval_curve.py) when done.
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-1}"; shift || true
exec bash scripts/long_run.sh "pong_ppo_s${seed}" examples/configs/pong_ppo.toml --set "run.seed=${seed}" "$@"
