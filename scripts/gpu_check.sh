#!/usr/bin/env bash
# Runs on a lent GPU machine (device tool, `carry: [".gpu"]`, after `bash scripts/gpu_bundle.sh` here): trains
# each algorithm on CUDA with its example config (shortened budgets), and populations whose updates take the
# batched libtorch programs on the GPU, all at once; writes a summary to $OUT/gpu_check.md and the runs' metrics
# to $OUT/runs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /tmp/gpu
tar -C /tmp/gpu -xJf .gpu/bundle.tar.xz
tl=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$tl:/tmp/gpu/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=/tmp/gpu/bundle/flotilla
runs=/tmp/gpu/runs
mkdir -p "$runs"
{
  echo "# GPU check $(date -u +%FT%TZ)"
  nvidia-smi -L
  python3 -c 'import torch; print("device torch", torch.__version__)'
  echo "libraries the binary cannot find:"; ldd "$bin" | grep 'not found' || echo "(none)"
} > "$out/gpu_check.md" 2>&1
cfg=examples/configs
# name | config | extra arguments
jobs=(
  "ppo|$cfg/cartpole_ppo.toml|"
  "a2c|$cfg/cartpole_a2c.toml|--set run.total_env_steps=200000"
  "dqn|$cfg/cartpole_dqn.toml|"
  "td3|$cfg/pendulum_td3.toml|"
  "ddpg|$cfg/pendulum_ddpg.toml|"
  "ppo-pop4|$cfg/cartpole_ppo.toml|--population 4 --set population.threads=1"
  "a2c-pop4|$cfg/cartpole_a2c.toml|--population 4 --set population.threads=1 --set run.total_env_steps=200000"
  "dqn-pop4|$cfg/cartpole_dqn.toml|--population 4 --set population.threads=1"
  "td3-pop3|$cfg/pendulum_td3.toml|--population 3 --set population.threads=1 --set run.total_env_steps=8000"
)
pids=()
for job in "${jobs[@]}"; do
  IFS='|' read -r name config extra <<< "$job"
  # shellcheck disable=SC2086
  (timeout "${GPU_CHECK_SECONDS:-420}" "$bin" train "$config" --set run.device=cuda --set run.torch_threads=1 \
     --out "$runs/$name" $extra > "$runs/$name.log" 2>&1; echo "exit $?" >> "$runs/$name.log") &
  pids+=($!)
done
wait "${pids[@]}"
for job in "${jobs[@]}"; do
  name=${job%%|*}
  {
    echo; echo "## $name"; echo '```'
    grep -v '^\s*$' "$runs/$name.log" | tail -6
    echo '```'
  } >> "$out/gpu_check.md"
done
nvidia-smi --query-gpu=name,memory.used --format=csv >> "$out/gpu_check.md" 2>&1
tar -C /tmp/gpu -cJf "$out/runs.tar.xz" --exclude='*.safetensors' --exclude='events.out*' runs
cat "$out/gpu_check.md"
