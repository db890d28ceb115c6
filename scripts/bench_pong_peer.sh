#!/usr/bin/env bash
# Pong training speed, side by side in one run: `flotilla train examples/configs/pong_fast.toml` against the
# CleanRL-style PyTorch + EnvPool peer (tests/peers/ppo_atari_envpool.py: the same PPO, the same hyperparameters,
# 8 envs), STEPS agent steps each (default 40,960 = 40 rollouts), ROUNDS rounds interleaved (default 2). Flotilla
# in its default precision (bf16 where the CPU has it natively) and in f32; the peer in f32 (CleanRL's precision)
# and under PyTorch's bf16 CPU autocast, its f32 run twice: with glibc's default malloc (as CleanRL runs) and
# under the malloc setting Flotilla's trainer gives itself (`flotilla_learner::ALLOCATOR_TUNABLES`, read from
# learner/src/allocator.rs), so the allocator's share of the gap shows. Both use every core (Flotilla:
# torch_threads = 2 and two ale-py threads, as pong_fast.toml says; the peer: torch's default threads and one
# EnvPool thread, CleanRL's defaults). Prints agent steps/s per run, start-up excluded on both sides (Flotilla's
# `train_secs`).
# Run it with nothing else on the machine.
#   bash scripts/setup_peers.sh --torch && bash scripts/bench_pong_peer.sh [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-40960}"
rounds="${2:-2}"
cache="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
peer="$cache/peers-venv/bin/python"
[ -x "$peer" ] || { echo "bench_pong_peer.sh: no peers venv; run: bash scripts/setup_peers.sh --torch" >&2; exit 2; }
source scripts/release_bin.sh
bin="$release_bin"
tunables=$(sed -n 's/^pub const ALLOCATOR_TUNABLES: &str = "\(.*\)";$/\1/p' learner/src/allocator.rs)
[ -n "$tunables" ] || { echo "bench_pong_peer.sh: no ALLOCATOR_TUNABLES in learner/src/allocator.rs" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "pong speed, $steps agent steps per run, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# Train Flotilla for $steps agent steps into $work/NAME with extra --set arguments; prints "agent steps/s (s)".
# A failed run prints its log and stops the bench (the EXIT trap would delete it).
flotilla_run() {
  local out="$work/$1" secs
  shift
  if ! "$bin" train examples/configs/pong_fast.toml --out "$out" --set "run.total_env_steps=$steps" \
    --set eval.interval_steps=100000000 --set eval.episodes=1 "$@" >"$out.log" 2>&1; then
    echo "bench_pong_peer.sh: flotilla train failed:" >&2; cat "$out.log" >&2; exit 1
  fi
  secs=$(grep -o 'for [0-9]* env steps in [0-9.]* s' "$out.log" | awk '{print $6}')
  [ -n "$secs" ] || { echo "bench_pong_peer.sh: no timing line in the log:" >&2; cat "$out.log" >&2; exit 1; }
  echo "$(python3 -c "print(round($steps / $secs))") agent steps/s ($secs s)"
}
for round in $(seq 1 "$rounds"); do
  speed=$(flotilla_run "flotilla-$round")
  bf16=$(grep -o 'bf16 = [a-z]*' "$work/flotilla-$round/config.toml" | head -1)
  echo "round $round | flotilla pong_fast.toml ($bf16) | $speed"
  # The same in f32, CleanRL's precision.
  speed=$(flotilla_run "flotilla-f32-$round" --set algorithm.cnn.bf16=false)
  echo "round $round | flotilla pong_fast.toml (f32) | $speed"
  echo "round $round | peer f32 | $("$peer" tests/peers/ppo_atari_envpool.py "$steps")"
  echo "round $round | peer f32, Flotilla's malloc setting | $(GLIBC_TUNABLES="$tunables" "$peer" \
    tests/peers/ppo_atari_envpool.py "$steps")"
  echo "round $round | peer bf16 autocast | $("$peer" tests/peers/ppo_atari_envpool.py "$steps" --bf16)"
done
