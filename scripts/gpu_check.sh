#!/usr/bin/env bash
# Runs on a lent GPU machine (device tool, `carry: [".gpu"]`, after `bash scripts/gpu_bundle.sh` here). Writes a
# summary to $OUT/gpu_check.md and the runs' metrics to $OUT/runs.tar.xz. Sections, in this order (by default
# cnn,pong,population: ~8 min; or a comma-separated selection as the first argument):
#   cnn      the Nature-CNN PPO update's samples/s on the GPU, Flotilla f32 and bf16 against PyTorch f32, bf16
#            and fp16 autocast (flotilla-bench-atari --device cuda; alone on the GPU, so the times count)
#   pong     the whole system on Atari: `pong_fast.toml` on CUDA with ale-py's emulator threads on every core
#            (the bundle's own Python 3.11 with ale-py, Gymnasium and NumPy), 16 and 64 envs for ~70 s each;
#            agent steps/s and frames/s from each run's metrics.csv
#   population  2,048 CartPole PPO members (`cartpole_ppo.toml`, 100 K env steps each) in one lockstep group on
#            CUDA: one batched acting pass over the joint batch of 16,384 envs per step, one batched update per
#            rollout (goal: 100 K steps each in <= 60 s); wall-clock, the members' final training returns
#   acting   256 members for 10 K steps each, acting batched and acting alone (`population.batched_acting`)
#   profile  where a 2,048-member population's seconds go on the GPU: the batched update's and acting pass's
#            phases timed with a device wait at each (`FLOTILLA_PROFILE_UPDATE=1`, 3 K env steps each; f32
#            matmuls, then cuBLAS allowed TF32 by TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), then Nsight Systems (`nsys`,
#            where the image has it) over 3 K env steps each; its CUDA API, kernel and memcpy summaries (calls,
#            syncs, launches per second) into the report, the whole profile into $OUT (~3 min)
#   learn    the MLP algorithms on CUDA with their example configs, and populations whose updates take the
#            batched libtorch programs, all at once (so their seconds are shared and only indicative)
#   continuous  SAC and its population, PPO Pendulum with [normalize], and `algorithm.bf16` on CUDA (ignored
#            there by construction: a run with bf16 = true must equal the f32 run bit for bit; 2,000-2,900
#            gradient steps each), all at once (~5 min: SAC's population of 3 takes the longest)
#   resume   exact resume on CUDA: SAC, and PPO with observation and reward normalisation (one go vs
#            --stop-at then --resume: the saved weights must be byte-identical)
#   bash scripts/gpu_check.sh [cnn,pong,population,acting,profile,learn,continuous,resume]
# A dry run here, on the CPU, of the pong, population and acting sections' plumbing at a small scale (the local
# release binary, the cache venv's Python): GPU_CHECK_SMOKE=1 bash scripts/gpu_check.sh pong,population,acting
set -uo pipefail
cd "$(dirname "$0")/.."
sections=",${1:-cnn,pong,population},"
out=${OUT:-/tmp/gpu-out}
smoke=${GPU_CHECK_SMOKE:-}
runs=/tmp/gpu/runs
rm -rf "$runs"
mkdir -p "$out" "$runs"
report="$out/gpu_check.md"
if [[ -n $smoke ]]; then
  source scripts/release_bin.sh
  bin=$release_bin device=cpu py=
  scale() { echo "$2"; }  # the smoke run's numbers
  echo "# GPU check SMOKE RUN on the CPU $(date -u +%FT%TZ): sections ${sections//,/ }" > "$report"
else
  tar -C /tmp/gpu -xJf .gpu/bundle.tar.xz
  tl=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH="$tl:/tmp/gpu/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export FLOTILLA_PEERS_DIR=$PWD/tests/peers FLOTILLA_TORCH_PYTHON=python3
  bin=/tmp/gpu/bundle/flotilla device=cuda py=/tmp/gpu/bundle/py
  scale() { echo "$1"; }  # the device's numbers
  {
    echo "# GPU check $(date -u +%FT%TZ): sections ${sections//,/ }"
    nvidia-smi -L
    python3 -c 'import torch; print("device torch", torch.__version__)'
    # NVIDIA's containers set the first to 1 (f32 matmuls on TF32 tensor cores): what "f32" meant in this run.
    echo "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE-unset}" \
      "NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE-unset}"
    echo "libraries the binary cannot find:"; ldd "$bin" | grep 'not found' || echo "(none)"
  } > "$report" 2>&1
fi
cfg=examples/configs

# Runs "name|config|extra arguments" jobs at once on the GPU, then appends each log's tail to the report.
run_jobs() {
  local pids=() job name config extra
  for job in "$@"; do
    IFS='|' read -r name config extra <<< "$job"
    # shellcheck disable=SC2086
    (timeout "${GPU_CHECK_SECONDS:-300}" "$bin" train "$config" --set run.device=cuda --set run.torch_threads=1 \
       --out "$runs/$name" $extra > "$runs/$name.log" 2>&1; echo "exit $?" >> "$runs/$name.log") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for job in "$@"; do
    name=${job%%|*}
    { echo; echo "## $name"; echo '```'; grep -v '^\s*$' "$runs/$name.log" | tail -6; echo '```'; } >> "$report"
  done
}

# Whether two runs saved the same weights, byte for byte.
same_weights() {
  if cmp -s "$runs/$1/model.safetensors" "$runs/$2/model.safetensors"; then
    echo "- $1 and $2: model.safetensors byte-identical" >> "$report"
  else
    echo "- $1 and $2: model.safetensors DIFFER (or one is missing)" >> "$report"
  fi
}

if [[ $sections == *,cnn,* ]]; then
  { echo; echo "## cnn: flotilla-bench-atari --only learner --device cuda"; } >> "$report"
  timeout 150 /tmp/gpu/bundle/flotilla-bench-atari --only learner --device cuda --rounds 3 >> "$report" 2>&1 \
    || echo "cnn bench exit $?" >> "$report"
fi

# Agent steps/s between the first and the last row of a run's metrics.csv (its own train_secs: collection and
# updates, no evaluation), and the frames/s they are (4 frames per step).
rate() {
  python3 - "$1" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if len(rows) < 2:
    sys.exit(f"{len(rows)} metrics rows: too few for a rate")
a, b = rows[0], rows[-1]
steps = int(b["env_steps"]) - int(a["env_steps"])
secs = float(b["train_secs"]) - float(a["train_secs"])
print(f"{steps} agent steps in {secs:.1f} s (after the first row): {steps / secs:,.0f} agent steps/s, "
      f"{4 * steps / secs:,.0f} frames/s")
PY
}

if [[ $sections == *,pong,* ]]; then
  { echo; echo "## pong: pong_fast.toml on $device, ale-py on $(nproc) emulator threads (~70 s each)"; } >> "$report"
  # The bundle's own Python on the device (its Python is 3.12, the binary's 3.11); the cache venv's here.
  pyenv=(env)
  [[ -n $py ]] && pyenv=(env -u PYTHONPATH PYTHONHOME=$py FLOTILLA_PYTHON=$py/bin/python)
  for envs in 16 64; do
    name=pong-$envs
    # 4 minibatches of each rollout, as pong_fast's 8 envs take.
    timeout "$(scale 75 45)" "${pyenv[@]}" "$bin" train $cfg/pong_fast.toml \
      --set run.device=$device --set env.num_envs=$envs --set algorithm.batch_size=$((128 * envs / 4)) \
      --set env.kwargs.num_threads="$(nproc)" --set run.total_env_steps=100000000 \
      --set eval.interval_steps=1000000000 --set metrics.log_interval_steps=$(scale 4096 1024) --out "$runs/$name" \
      > "$runs/$name.log" 2>&1
    { echo "- $envs envs (exit $? at the time limit): $(rate "$runs/$name/metrics.csv" 2>&1)";
      grep -E "error|Error" "$runs/$name.log" | head -3; } >> "$report"
  done
fi

# A population of CartPole PPO members on CUDA in one lockstep group: "name|members|env steps|extra settings".
population() {
  local name members steps extra
  IFS='|' read -r name members steps extra <<< "$1"
  local started=$SECONDS
  # shellcheck disable=SC2086
  timeout "$2" "$bin" train $cfg/cartpole_ppo.toml --population "$members" --set population.threads=1 \
    --set run.device=$device --set run.torch_threads=1 --set run.total_env_steps="$steps" \
    --set eval.interval_steps=1000000000 --set eval.episodes=1 --set metrics.log_interval_steps=$((steps / 10)) \
    $extra --out "$runs/$name" > "$runs/$name.log" 2>&1
  local code=$? wall=$((SECONDS - started))
  {
    echo "- $name: $members members x $steps env steps ($extra): exit $code, $wall s wall-clock in all"
    python3 - "$runs/$name/members" "$members" <<'PY'
import csv, glob, os, sys
dirs = sorted(glob.glob(os.path.join(sys.argv[1], "*")))
n = int(sys.argv[2])
last = []
for d in dirs:
    try:
        rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
    except OSError:
        continue
    if rows:
        last.append(rows[-1])
if not last:
    sys.exit("  no metrics rows")
steps = min(int(r["env_steps"]) for r in last)
# A member's train_secs is its 1/N share of the group's lockstep seconds (collection and updates).
lockstep = sum(float(r["train_secs"]) for r in last)
ret = sorted(float(r["charts/episodic_return"]) for r in last if r.get("charts/episodic_return"))
print(f"  {len(last)}/{n} members logged, all at >= {steps} env steps; the group's lockstep seconds "
      f"{lockstep:.1f} ({n * steps / lockstep:,.0f} member env steps/s)")
if ret:
    print(f"  last logged training return: median {ret[len(ret) // 2]:.0f}, "
          f"{sum(r >= 475 for r in ret)}/{len(ret)} >= 475")
PY
    grep -E "final returns mean|error|Error|panicked" "$runs/$name.log" | head -3 | sed 's/^/  /'
    # Where the group's seconds went, summed over its logged splits (acting, envs, updates, bookkeeping).
    grep -oE "[0-9.]+ s [a-z ,]+" "$runs/$name.log" | grep -vE "s wall" | awk -F' s ' '
      { sub(/[, ]+$/, "", $2); secs[$2] += $1; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
      END { if (n) { printf "  seconds by part:"; for (i = 1; i <= n; i++) printf " %s %.1f;", order[i], secs[order[i]]; print "" } }'
    # The group's progress over time (the log's own timestamps).
    grep -E "population [0-9]+/[0-9]+ env steps" "$runs/$name.log" | sed -n '1p;$p' | cut -c1-140 | sed 's/^/  /'
  } >> "$report" 2>&1
}

if [[ $sections == *,population,* ]]; then
  { echo; echo "## population: 2,048 CartPole PPO members on $device, batched acting and updates"; } >> "$report"
  population "pop2048|$(scale 2048 32)|$(scale 100000 5120)|" 200
fi

if [[ $sections == *,acting,* ]]; then
  { echo; echo "## acting: 256 members, one batched acting pass against each member's own"; } >> "$report"
  population "pop256-batched|$(scale 256 16)|$(scale 10000 2560)|--set population.batched_acting=true" 80
  population "pop256-alone|$(scale 256 16)|$(scale 10000 2560)|--set population.batched_acting=false" 80
fi

if [[ $sections == *,profile,* ]]; then
  # The batched update's and acting pass's phases, each ended by a device wait (FLOTILLA_PROFILE_UPDATE=1: no
  # profiler needed; the waits cost a little, so this run is not the timed one): 3 K env steps each, ~4 K on the
  # CPU smoke run.
  # Twice: f32 matmuls as libtorch runs them by default (IEEE), then with cuBLAS allowed TF32 tensor cores
  # (libtorch's own TORCH_ALLOW_TF32_CUBLAS_OVERRIDE, what PyTorch's `allow_tf32` sets; tch has no call for it):
  # whether the update's 16 ms per gradient step is the batched f32 GEMMs. Each run's seconds summed.
  { echo; echo "## profile: 2,048 CartPole PPO members, the batched update's and acting pass's phases (device waits at each)"; } >> "$report"
  for variant in "f32|0" "tf32|1"; do
    IFS='|' read -r name tf32 <<< "$variant"
    echo "- $name matmuls (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=$tf32):" >> "$report"
    # shellcheck disable=SC2086
    TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=$tf32 FLOTILLA_PROFILE_UPDATE=1 timeout 120 "$bin" train \
      $cfg/cartpole_ppo.toml --population "$(scale 2048 16)" --set population.threads=1 --set run.device=$device \
      --set run.torch_threads=1 --set run.total_env_steps="$(scale 3000 512)" \
      --set eval.interval_steps=1000000000 --set metrics.log_interval_steps=1000000000 \
      --set algorithm.fused_cpu=false --set population.batched_acting=true \
      --out "$runs/phases-$name" > "$runs/phases-$name.log" 2>&1 ||
      echo "  phase-timed run: exit $?" >> "$report"
    # Summed over the run's segments (the group logs each segment's split and phases).
    python3 - "$runs/phases-$name.log" >> "$report" <<'PY'
import re, sys
kinds = {"one joint env batch": "group", "batched update and acting phases": "phases"}
sums = {k: {} for k in kinds.values()}
for line in open(sys.argv[1], errors="replace"):
    for marker, kind in kinds.items():
        if marker in line:
            for secs, name in re.findall(r"([0-9.]+) s (.+?)(?=, [0-9.]+ s |$)", line.split(marker, 1)[1].split(": ", 1)[1].strip()):
                sums[kind][name.strip()] = sums[kind].get(name.strip(), 0.0) + float(secs)
for kind, parts in sums.items():
    if parts:
        print(f"  {kind}: " + ", ".join(f"{s:.3f} s {n}" for n, s in parts.items()))
PY
  done
  { echo; echo "## profile: 2,048 CartPole PPO members under Nsight Systems"; } >> "$report"
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -z $nsys || -n $smoke ]]; then
    echo "- no nsys on this machine (or a smoke run): not profiled" >> "$report"
  else
    # shellcheck disable=SC2086
    timeout 150 "$nsys" profile --trace=cuda,osrt --sample=none --cpuctxsw=none --force-overwrite=true \
      --output "$out/pop2048" "$bin" train $cfg/cartpole_ppo.toml --population 2048 --set population.threads=1 \
      --set run.device=cuda --set run.torch_threads=1 --set run.total_env_steps=3000 \
      --set eval.interval_steps=1000000000 --set metrics.log_interval_steps=1000 --out "$runs/profile" \
      > "$runs/profile.log" 2>&1 || echo "- nsys profile: exit $?" >> "$report"
    grep -E "one joint env batch" "$runs/profile.log" | tail -2 | cut -c1-220 | sed 's/^/  /' >> "$report"
    for r in cuda_api_sum cuda_gpu_kern_sum cuda_gpu_mem_time_sum; do
      { echo; echo "### $r"; echo '```'; timeout 60 "$nsys" stats --report "$r" --format csv "$out/pop2048.nsys-rep" \
          2>&1 | head -25 | cut -c1-220; echo '```'; } >> "$report"
    done
  fi
fi

if [[ $sections == *,learn,* ]]; then
  run_jobs \
    "ppo|$cfg/cartpole_ppo.toml|" \
    "a2c|$cfg/cartpole_a2c.toml|--set run.total_env_steps=200000" \
    "dqn|$cfg/cartpole_dqn.toml|" \
    "td3|$cfg/pendulum_td3.toml|" \
    "ddpg|$cfg/pendulum_ddpg.toml|" \
    "ppo-pop4|$cfg/cartpole_ppo.toml|--population 4 --set population.threads=1" \
    "a2c-pop4|$cfg/cartpole_a2c.toml|--population 4 --set population.threads=1 --set run.total_env_steps=200000" \
    "dqn-pop4|$cfg/cartpole_dqn.toml|--population 4 --set population.threads=1" \
    "td3-pop3|$cfg/pendulum_td3.toml|--population 3 --set population.threads=1 --set run.total_env_steps=8000"
fi

if [[ $sections == *,continuous,* ]]; then
  short="--set run.total_env_steps=3000 --set eval.interval_steps=1500"
  run_jobs \
    "sac|$cfg/pendulum_sac.toml|" \
    "sac-pop3|$cfg/pendulum_sac.toml|--population 3 --set population.threads=1 --set run.total_env_steps=8000" \
    "ppo-pendulum-normalize|$cfg/pendulum_ppo.toml|--set normalize.obs=true --set normalize.reward=true" \
    "sac-bf16|$cfg/pendulum_sac.toml|$short --set algorithm.bf16=true" \
    "sac-f32|$cfg/pendulum_sac.toml|$short --set algorithm.bf16=false" \
    "td3-bf16|$cfg/pendulum_td3.toml|$short --set algorithm.learning_starts=1000 --set algorithm.bf16=true" \
    "td3-f32|$cfg/pendulum_td3.toml|$short --set algorithm.learning_starts=1000 --set algorithm.bf16=false"
  { echo; echo "## bf16 on CUDA (ignored: the same weights as f32)"; } >> "$report"
  same_weights sac-bf16 sac-f32
  same_weights td3-bf16 td3-f32
fi

if [[ $sections == *,resume,* ]]; then
  { echo; echo "## resume on CUDA (one go vs --stop-at then --resume)"; } >> "$report"
  # name | config | stop at | settings
  for job in \
    "sac|$cfg/pendulum_sac.toml|777|run.total_env_steps=1500 eval.interval_steps=750" \
    "ppo-normalize|$cfg/pendulum_ppo.toml|1000|run.total_env_steps=4096 eval.interval_steps=2048 normalize.obs=true normalize.reward=true"; do
    IFS='|' read -r name config stop sets <<< "$job"
    args=(train "$config" --set run.device=cuda --set run.torch_threads=1)
    for s in $sets; do args+=(--set "$s"); done
    {
      timeout 120 "$bin" "${args[@]}" --out "$runs/resume-$name-one" \
        && timeout 120 "$bin" "${args[@]}" --out "$runs/resume-$name-two" --stop-at "$stop" \
        && timeout 120 "$bin" train --resume "$runs/resume-$name-two"
    } > "$runs/resume-$name.log" 2>&1 || echo "- resume $name: exit $? ($(tail -1 "$runs/resume-$name.log"))" >> "$report"
    same_weights "resume-$name-one" "resume-$name-two"
  done
fi

[[ -z $smoke ]] && nvidia-smi --query-gpu=name,memory.used --format=csv >> "$report" 2>&1
tar -C /tmp/gpu -cJf "$out/runs.tar.xz" --exclude='*.safetensors' --exclude='events.out*' runs
cat "$report"
