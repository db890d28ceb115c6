#!/usr/bin/env bash
# Does the Nature CNN in bf16 learn Pong as it does in f32? `examples/configs/pong_fast.toml` (its schedule: clip
# range and learning rate annealed over 9 M frames) on SEEDS in VARIANTS — `bf16` (the default where the CPU has
# AVX512-BF16) and `f32` — each run on one torch thread and one emulator thread, JOBS at a time (default: one
# per core), through scripts/long_run.sh: in the background,
# checkpointed, and resumed where it was cut off when this script is called again (finished runs are skipped).
# The runs are untimed (they share the machine): what counts is each curve against frames. Finished runs'
# configs and metrics go to docs/benchmarks/precision-table/NAME/ (run directories `flotilla report` reads); the
# table (per seed and variant, from `flotilla report --threshold 18`: the frames of the first evaluation ≥ +18,
# whether every later evaluation stays ≥ +18 and the lowest after it, where it settled, the best and the last) is
# printed and written to docs/benchmarks/precision-table/README.md.
#   SEEDS="1 2 3 4 5 6" VARIANTS="bf16 f32" setsid nohup bash scripts/precision_table.sh > LOG 2>&1 &
#   bash scripts/precision_table.sh --table      # only the table, from the runs so far (FLOTILLA_BIN=BINARY: no build)
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

cleanup=()   # removed on exit, however it comes
trap 'rm -rf "${cleanup[@]}"' EXIT
# `report` for the table, and the runs' binary: FLOTILLA_BIN where given (e.g. `--table` beside a build that must
# not be disturbed), else a release build of the clone.
if [[ -n ${FLOTILLA_BIN:-} ]]; then
  [ -x "$FLOTILLA_BIN" ] || { echo "precision_table.sh: FLOTILLA_BIN=$FLOTILLA_BIN is not an executable" >&2; exit 2; }
  release_bin=$FLOTILLA_BIN
else
  source scripts/release_bin.sh
fi
if [[ "${1:-}" != "--table" ]]; then
  # Built once and frozen: every run this call starts copies this one (a rebuild meanwhile changes nothing), and
  # no run rebuilds the shared target dir while a build or a test elsewhere is using it.
  export FLOTILLA_BIN="$runs/bin/precision_table.$$"
  cleanup+=("$FLOTILLA_BIN")   # the runs copy it when they start
  cp "$release_bin" "$FLOTILLA_BIN.tmp" && mv "$FLOTILLA_BIN.tmp" "$FLOTILLA_BIN"
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

# One `flotilla report` per run (a finished run from its copy here, a running one from the cache), then the
# rows formatted from its JSON: every number in the table is report's.
mkdir -p "$table"
reports=$(mktemp -d)
cleanup+=("$reports")
rows=() paired=() seeds_done=() done_runs=() all_runs=()
for s in $seeds; do
  finished=()   # this seed's runs finished in every variant so far
  for v in $variants; do
    name="precision_${v}_s${s}"
    dir="$runs/$name" state=running
    if [ -e "$runs/$name.done" ]; then
      mkdir -p "$table/$name"
      for f in config.toml metrics.csv; do
        cp "$runs/$name/$f" "$table/$name/$f.tmp" && mv "$table/$name/$f.tmp" "$table/$name/$f"
      done
      dir="$table/$name" state=done
      finished+=("$dir") done_runs+=("$v:$dir")
    fi
    json=-
    if [ -f "$dir/config.toml" ]; then
      all_runs+=("$v:$dir")
      json="$reports/$name.json"
      "$release_bin" report "$dir" --threshold 18 --json >"$json"
    else
      state="not run"
    fi
    rows+=("$s" "$v" "$state" "$json")
  done
  if (( ${#finished[@]} == $(wc -w <<< "$variants") )); then
    seeds_done+=("$s") paired+=("${finished[@]}")
  fi
done
# The curves of the seeds finished in every variant, each variant as one line: the mean over those seeds
# (`flotilla plot --group`, a ± std band across them; plot writes atomically).
if (( ${#paired[@]} > 0 )); then
  "$release_bin" plot "${paired[@]}" --group --out "$table/curves.png" >/dev/null
fi
# The first variant against the second (unpaired: no two runs share a trajectory), `flotilla report X
# --against Y`'s probability of improvement and IQM difference with reached/held counts: over the finished
# runs at their last evaluation, and over every run past half the schedule (running ones too) as of there.
read -r -a vs <<< "$variants"
half=$(( ${STEPS:-2250000} / 2 ))
versus() {  # versus OUT RUNS [report options]: OUT, or - where a variant has no run to compare
  local out=$1 r x=() y=()
  local -n runs=$2
  for r in "${runs[@]}"; do
    case "$r" in "${vs[0]}:"*) x+=("${r#*:}");; "${vs[1]}:"*) y+=("${r#*:}");; esac
  done
  if (( ${#vs[@]} == 2 && ${#x[@]} > 0 && ${#y[@]} > 0 )) \
    && "$release_bin" report "${x[@]}" --against "${y[@]}" --threshold 18 "${@:3}" --json >"$out" 2>/dev/null; then
    echo "$out"
  else
    echo -
  fi
}
final=$(versus "$reports/final.json" done_runs)
midway=$(versus "$reports/midway.json" all_runs --at "$half")
python3 - "${seeds_done[*]:-}" "$final" "$midway" "${vs[0]}" "${vs[1]:-}" "${rows[@]}" >"$table/README.md.tmp" <<'EOF'
import json, sys
print("# bf16 against f32 on `pong_fast.toml`: the precision table\n")
print("Written by `scripts/precision_table.sh` from `flotilla report --threshold 18` on each run (one torch and one")
print("emulator thread a run; untimed). Frames = 4 × agent steps; each evaluation is the mean of 8 whole games.")
print("Held: every evaluation after the first ≥ +18 stays ≥ +18 (the lowest of them); settled: the first evaluation")
print("from which every one to the run's last is ≥ +18. Finished runs: `NAME/` here (config and metrics).\n")
print("| seed | variant | state | first ≥ +18 (frames) | held after it (lowest) | settled from (frames) | best | last (frames) |")
print("|---:|---|---|---:|---|---:|---:|---:|")
frames = lambda steps: "" if steps is None else f"{4 * steps / 1e6:.2f} M"
paired, final, midway, (nx, ny), args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:6], sys.argv[6:]
for seed, variant, state, path in zip(args[0::4], args[1::4], args[2::4], args[3::4]):
    m = json.load(open(path))["members"][0] if path != "-" else None
    if m is None or m["final_return"] is None:
        print(f"| {seed} | {variant} | {state} | | | | | |")
        continue
    first = m["first_step_at_threshold"]
    held = m["held_after_threshold"]
    lowest = m["lowest_after_threshold"]
    held = "" if held is None else ("yes" if held else "no") + (f" ({lowest:+.1f})" if lowest is not None else " (none after)")
    print(f"| {seed} | {variant} | {state} | {frames(first) or 'not reached'} | {held} | "
          f"{frames(m['settled_step_at_threshold'])} | {m['best_return']:+.1f} | "
          f"{m['final_return']:+.1f} ({frames(m['final_env_steps'])}) |")
def versus(path, what):
    if path == "-":
        return
    r = json.load(open(path))
    x, y, c = r["x"], r["y"], r["comparison"]
    seeds = lambda side: ", ".join(str(m["seed"]) for m in side["members"] if m["finished"])
    p, pci = c["probability_of_improvement"], c["probability_of_improvement_ci"]
    d, dci = c["iqm_difference"], c["iqm_difference_ci"]
    at = f" --at {r['x']['at']}" if r["x"]["at"] else ""
    print(f"\n{what} (`flotilla report {nx.upper()}_RUNS --against {ny.upper()}_RUNS --threshold 18{at}`; {nx}: "
          f"seeds {seeds(x)}, {ny}: seeds {seeds(y)}): **P({nx} > {ny}) = {p:.2f}** [{pci[0]:.2f}, {pci[1]:.2f}] "
          f"(rliable's probability of improvement: a {nx} run above an {ny} run; 0.5 is neither better), IQM "
          f"difference {d:+.1f} [{dci[0]:+.1f}, {dci[1]:+.1f}]; reached +18 {x['reached']}/{x['size']} against "
          f"{y['reached']}/{y['size']}, held {x['held']}/{x['size']} against {y['held']}/{y['size']}. 95 % "
          f"intervals: {c['bootstrap_resamples']} bootstrap resamples of each variant's runs.")
versus(final, f"{nx} against {ny} over every finished run, at its last evaluation")
if midway != "-":
    versus(midway, f"{nx} against {ny} as of {frames(json.load(open(midway))['x']['at'])} frames, over every run past "
           "it (running ones too)")
if paired:
    band = ("the mean over them with a ± std band across them" if " " in paired
            else "its run, with a ± std band over the evaluation's 8 games")
    print(f"\n![the evaluations of seeds {paired.replace(' ', ', ')} (finished in every variant), each variant "
          f"{band}, against agent steps](curves.png)")
EOF
mv "$table/README.md.tmp" "$table/README.md"
cat "$table/README.md"
