#!/usr/bin/env bash
# The host side of a large lockstep population: CartPole PPO members (`cartpole_ppo.toml --population N` on one
# worker thread, batched acting) on the CPU, their joint env batch stepped and observed on one thread
# (`population.step_threads=1`) against the automatic count (the cores), rounds interleaved. From the group's
# own profile (the "one joint env batch:" log lines, the run's last segment left out: it holds the final
# checkpoints), milliseconds per lockstep step of acting, stepping the envs and observing; and the process's
# wall-clock seconds (start-up, member run directories, the final evaluation and saves included).
#
#   bash scripts/bench_lockstep.sh [MEMBERS (2048)] [ENV STEPS EACH (528)] [ROUNDS (2)]
#
# OLD_BIN=/path/to/flotilla adds an older binary's run (its default stepping) to every round, e.g. one built at
# an earlier commit. Run directories go under /tmp/flotilla-bench-lockstep. Nothing else should be running.
set -euo pipefail
cd "$(dirname "$0")/.."
members=${1:-2048}
steps=${2:-528}
rounds=${3:-2}
source scripts/release_bin.sh
dir=/tmp/flotilla-bench-lockstep
rm -rf "$dir"
mkdir -p "$dir"
variants=("one thread|$release_bin|--set population.step_threads=1" "automatic|$release_bin|")
if [[ -n ${OLD_BIN:-} ]]; then
  variants=("older binary|$OLD_BIN|" "${variants[@]}")
fi
echo "| round | stepping | acting ms/step | stepping envs ms/step | observing ms/step | process s |"
echo "|---:|---|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for variant in "${variants[@]}"; do
    IFS='|' read -r label bin extra <<< "$variant"
    out="$dir/r$round-${label// /_}"
    started=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$bin" train examples/configs/cartpole_ppo.toml --population "$members" --set population.threads=1 \
      --set population.batched_acting=true --set run.device=cpu --set run.torch_threads=1 \
      --set run.total_env_steps="$steps" --set eval.interval_steps=1000000000 --set eval.episodes=1 \
      --set metrics.log_interval_steps=1000000000 $extra --out "$out" > "$out.log" 2>&1
    wall=$(echo "$(date +%s.%N) - $started" | bc)
    python3 - "$out.log" "$round" "$label" "$wall" <<'PY'
import re, sys
log, round_, label, wall = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
phases, at, per_env = {}, 0, 8
segments = []
for line in open(log):
    m = re.search(r"one joint env batch: (.*)", line)
    if m:
        parts = dict((name.strip(), float(secs)) for secs, name in re.findall(r"([0-9.]+) s ([a-z ,]+?)(?:,(?= [0-9])|$)", m.group(1)))
        segments.append([parts, None])
    m = re.search(r"population ([0-9]+)/[0-9]+ env steps", line)
    if m and segments and segments[-1][1] is None:
        steps = int(m.group(1))
        segments[-1][1] = (steps - at) // per_env
        at = steps
used = [s for s in segments[:-1] if s[1]]
steps = sum(s[1] for s in used)
total = lambda name: sum(s[0].get(name, 0.0) for s in used) * 1000 / max(steps, 1)
print(f"| {round_} | {label} | {total('acting'):.2f} | {total('stepping envs'):.2f} | {total('observing'):.2f} | {wall:.1f} |")
PY
  done
done
echo
echo "$members members × 8 CartPole envs, $steps env steps each, acting batched on the CPU; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
