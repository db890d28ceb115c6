#!/usr/bin/env bash
# The 10-seed table of BENCHMARKS.md ("Example configs over 10 seeds"): each example config trained as a
# population of 10 (seeds 1..10), then `flotilla report` on each (CartPole ≥ 475; Pendulum ≥ −200, a threshold
# Gymnasium does not set). Run directories and reports go to OUT (default ~/logs/seed-table), outside the clone.
#   bash scripts/seed_table.sh [OUT] [CONFIG_NAME ...]     # names like cartpole_ppo; default: all five
# With SB3=1 each config's algorithm also runs in Stable-Baselines3 with RL Zoo's hyperparameters on the same seeds
# (tests/peers/sb3_zoo.py, 2 processes; install with bash scripts/setup_peers.sh --sb3): OUT/NAME.sb3.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$HOME/logs/seed-table}"
shift || true
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(cartpole_ppo cartpole_a2c cartpole_dqn pendulum_ddpg pendulum_td3)
seeds="${SEEDS:-10}"
cargo build --release --bin flotilla
bin="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla/target}/release/flotilla"
mkdir -p "$out"
for name in "${names[@]}"; do
  dir="$out/$name"
  if [[ ! -f "$dir/population_state.json" ]]; then
    rm -rf "$dir"
    "$bin" train "examples/configs/$name.toml" --population "$seeds" --out "$dir" > "$out/$name.log" 2>&1
  elif ! grep -q "population of" "$out/$name.log" 2>/dev/null; then
    "$bin" train --resume "$dir" >> "$out/$name.log" 2>&1
  fi
  threshold=()
  [[ $name == pendulum_* ]] && threshold=(--threshold -200)
  "$bin" report "$dir" "${threshold[@]}" > "$out/$name.report.txt"
  "$bin" report "$dir" "${threshold[@]}" --json > "$out/$name.report.json"
  echo "$name: $(grep -E '^all' "$out/$name.report.txt" || tail -1 "$out/$name.report.txt")"
  if [[ -n "${SB3:-}" && ! -s "$out/$name.sb3.jsonl" ]]; then
    python="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/peers-venv/bin/python"
    taskset -c 0,1 "$python" tests/peers/sb3_zoo.py --algo "${name#*_}" --seeds $(seq 1 "$seeds") --procs 2 \
      --threads 1 > "$out/$name.sb3.jsonl.tmp" 2> "$out/$name.sb3.err"
    mv "$out/$name.sb3.jsonl.tmp" "$out/$name.sb3.jsonl"
    echo "$name (SB3): $(grep -c '"final_return"' "$out/$name.sb3.jsonl") seeds in $out/$name.sb3.jsonl"
  fi
done
