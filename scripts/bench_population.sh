#!/usr/bin/env bash
# Populations benchmark: Flotilla populations against Stable-Baselines3 and JAX PPO peers (PPO speed on one and
# two cores, DQN, A2C's fused CPU update vs libtorch and SB3, SAC/TD3/DDPG in bf16 and f32 vs SB3, PBT vs a plain
# sweep), as markdown tables. Every measurement is a taskset-pinned child process.
#
#   bash scripts/bench_population.sh [--peers] [--suite speed|dqn|qrdqn|a2c|sac|td3|ddpg|continuous|pbt|all] [--quick]
#
# FLOTILLA_BENCH_ROUNDS (default 2): interleaved rounds of the sac/td3/ddpg suites.
#
# --peers first installs the peers (bash scripts/setup_peers.sh --sb3 --jax; skipped when unchanged). Other
# arguments go to flotilla-bench-population. The tables are teed to $HOME/logs/bench-population-DATE.md; run
# directories go under $FLOTILLA_BENCH_DIR (default /tmp/flotilla-bench-population).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla/target}"
args=()
for arg in "$@"; do
  if [[ $arg == --peers ]]; then
    bash scripts/setup_peers.sh --sb3 --jax
  else
    args+=("$arg")
  fi
done
cargo build --release --bin flotilla --bin flotilla-bench-population
mkdir -p "$HOME/logs"
log="$HOME/logs/bench-population-$(date +%Y%m%d-%H%M%S).md"
echo "writing $log" >&2
"$CARGO_TARGET_DIR/release/flotilla-bench-population" "${args[@]}" | tee "$log"
