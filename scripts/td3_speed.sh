#!/usr/bin/env bash
# DDPG and TD3 on Pendulum-v1: the host Adam + Polyak steps (`fused_cpu = true`) against libtorch's
# (`fused_cpu = false`), one torch thread pinned to core 1, runs interleaved (fused, libtorch, fused, libtorch) so
# load drifts hit both alike. 14 K env steps = 10 K random warm-up + 4 K updates. Prints process wall seconds and
# the final evaluation. Run directories go to /tmp. (BENCHMARKS.md "A2C and DDPG/TD3 on the fused paths".)
#   bash scripts/td3_speed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin flotilla
bin="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla/target}/release/flotilla"
for algo in td3 ddpg; do
  for mode in true false true false; do
    d=$(mktemp -d -u "/tmp/speed-$algo-$mode-XXXX")
    start=$(date +%s.%N)
    taskset -c 1 "$bin" train "examples/configs/pendulum_$algo.toml" --set run.torch_threads=1 \
      --set run.total_env_steps=14000 --set "algorithm.fused_cpu=$mode" --out "$d" > "$d.log" 2>&1
    end=$(date +%s.%N)
    echo "$algo fused_cpu=$mode: $(echo "$end - $start" | bc) s wall; $(grep -i 'evaluation return' "$d.log")"
  done
done
