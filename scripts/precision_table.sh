#!/usr/bin/env bash
# Does the Nature CNN in bf16 learn Pong as it does in f32? `examples/configs/pong_fast.toml` (its schedule: clip
# range and learning rate annealed over 9 M frames) on SEEDS in VARIANTS — `bf16` (the default where the CPU has
# AVX512-BF16) and `f32` — each run on one torch thread and one emulator thread, JOBS at a time (default: one
# per core), through scripts/long_run.sh: in the background,
# checkpointed, and resumed where it was cut off when this script is called again (finished runs are skipped).
# The runs are untimed (they share the machine): what counts is each curve against frames. Finished runs'
# configs and metrics go to docs/benchmarks/precision-table/; the table (per seed and variant: the first
# evaluation ≥ +18 and its frames, whether every later evaluation stays ≥ +18 and the lowest after it, the best
# and the last) is printed and written to docs/benchmarks/precision-table/README.md.
#   SEEDS="1 2 3 4 5 6" VARIANTS="bf16 f32" setsid nohup bash scripts/precision_table.sh > LOG 2>&1 &
#   bash scripts/precision_table.sh --table      # only the table, from the runs finished so far
# STEPS=N cuts every run to N agent steps (a smoke check, or a shorter study; the schedules anneal over N then).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${SEEDS:-1 2 3 4 5 6}"
variants="${VARIANTS:-bf16 f32}"
jobs="${JOBS:-$(nproc)}"
steps=()
if [[ -n "${STEPS:-}" ]]; then
  [[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "precision_table.sh: STEPS must be a positive integer, got '$STEPS'" >&2; exit 2; }
  steps=(--set "run.total_env_steps=$STEPS")
fi
runs="${HOME}/.cache/flotilla/runs"
table=docs/benchmarks/precision-table

for v in $variants; do
  case "$v" in bf16|f32) ;; *) echo "precision_table.sh: unknown variant '$v' (bf16 or f32)" >&2; exit 2;; esac
done
for s in $seeds; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "precision_table.sh: seeds are integers, got '$s'" >&2; exit 2; }
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "precision_table.sh: JOBS must be a positive integer, got '$jobs'" >&2; exit 2; }

if [[ "${1:-}" != "--table" ]]; then
  source scripts/release_bin.sh   # build once, before the runs start copying the binary
  for s in $seeds; do
    for v in $variants; do
      while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
      bf16=false; [[ $v == bf16 ]] && bf16=true
      bash scripts/long_run.sh "precision_${v}_s${s}" examples/configs/pong_fast.toml --set "algorithm.cnn.bf16=$bf16" \
        --set "run.seed=${s}" --set run.torch_threads=1 --set env.kwargs.num_threads=1 "${steps[@]}" >/dev/null 2>&1 &
    done
  done
  wait
fi

mkdir -p "$table"
for s in $seeds; do
  for v in $variants; do
    name="precision_${v}_s${s}"
    if [ -e "$runs/$name.done" ]; then
      cp "$runs/$name/config.toml" "$table/${name}.config.toml"
      cp "$runs/$name/metrics.csv" "$table/${name}.metrics.csv"
    fi
  done
done
python3 - "$table" "$runs" "$seeds" "$variants" <<'EOF' | tee "$table/README.md"
import csv, os, sys
table, runs, seeds, variants = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
print("# bf16 against f32 on `pong_fast.toml`: the precision table\n")
print("Written by `scripts/precision_table.sh` (one torch and one emulator thread a run; untimed). Frames = 4 × agent")
print("steps; each evaluation is the mean of 8 whole games.\n")
print("| seed | variant | state | first ≥ +18 (frames) | held after it (lowest) | best | last (frames) |")
print("|---:|---|---|---:|---|---:|---:|")
for s in seeds:
    for v in variants:
        name = f"precision_{v}_s{s}"
        done = os.path.exists(f"{runs}/{name}.done")
        path = f"{table}/{name}.metrics.csv" if done else f"{runs}/{name}/metrics.csv"
        if not os.path.exists(path):
            print(f"| {s} | {v} | not run | | | | |")
            continue
        evals = [(int(r["env_steps"]) * 4, float(r["eval/mean_return"])) for r in csv.DictReader(open(path)) if r.get("eval/mean_return")]
        if not evals:
            print(f"| {s} | {v} | {'done' if done else 'running'} | | | | |")
            continue
        first = next((i for i, (_, e) in enumerate(evals) if e >= 18), None)
        reached = "not reached" if first is None else f"{evals[first][1]:+.1f} ({evals[first][0] / 1e6:.2f} M)"
        after = [e for _, e in evals[first + 1:]] if first is not None else []
        held = "" if first is None else ("yes" if all(e >= 18 for e in after) else "no") + (f" ({min(after):+.1f})" if after else " (none after)")
        best = max(e for _, e in evals)
        print(f"| {s} | {v} | {'done' if done else 'running'} | {reached} | {held} | {best:+.1f} | {evals[-1][1]:+.1f} ({evals[-1][0] / 1e6:.2f} M) |")
EOF
