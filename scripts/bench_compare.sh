#!/usr/bin/env bash
# Before/after comparison of the distributed benchmarks, side by side in one run (this machine is noisy:
# compare ratios measured together, never numbers from different days).
#
#   bash scripts/bench_compare.sh BEFORE_BIN_DIR AFTER_BIN_DIR [ROUNDS] [--only ppo,scaling]
#
# Each BIN_DIR holds a `flotilla` and a `flotilla-bench-distributed` built from one commit, e.g.
#   git worktree add /tmp/base <rev> && (cd /tmp/base && bash scripts/setup.sh && \
#     CARGO_TARGET_DIR=~/.cache/flotilla/target-base cargo build --release --bin flotilla \
#     --bin flotilla-bench-distributed) && \
#   mkdir -p /tmp/base-bin && cp ~/.cache/flotilla/target-base/release/{flotilla,flotilla-bench-distributed} /tmp/base-bin/
# The base needs a target dir of its own: built in the shared one, its workspace crates (same names and versions,
# another path) left artifacts that cargo then took as fresh for the main tree (seen 2026-11-28: the main
# tree's build linked the base's flotilla-transport until `cargo clean -p` of the workspace crates).
# Rounds alternate before/after so slow drifts in the machine's load hit both. Output: one log per round and
# binary under $FLOTILLA_BENCH_LOGS (default /tmp/flotilla-bench-compare), outside the clone.
#
#   bash scripts/bench_compare.sh --train BEFORE_BIN_DIR AFTER_BIN_DIR ROUNDS 'CONFIG [--set k=v ...]' ...
#
# times `flotilla train` of each run (a config and its own arguments) with the two binaries, rounds alternating,
# pinned to FLOTILLA_BENCH_CPUS (default 0: one core), and prints a Markdown table: the wall-clock seconds of each
# whole command (start-up and evaluations included, the same for both) and the ratio of the medians.
set -euo pipefail
if [[ "${1:-}" == --train ]]; then
  before="$2"; after="$3"; rounds="$4"; shift 4
  logs="${FLOTILLA_BENCH_LOGS:-/tmp/flotilla-bench-compare}"
  cpus="${FLOTILLA_BENCH_CPUS:-0}"
  mkdir -p "$logs"
  echo "| run | before s (each round) | after s (each round) | after / before (medians) |"
  echo "|---|---|---|---:|"
  for run in "$@"; do
    declare -A secs=([before]="" [after]="")
    for round in $(seq 1 "$rounds"); do
      for side in before after; do
        dir=$before; [[ $side == after ]] && dir=$after
        out="$logs/train-$side-$round-$RANDOM"
        start=$(date +%s.%N)
        # shellcheck disable=SC2086  # the run is a config followed by its own arguments
        taskset -c "$cpus" "$dir/flotilla" train $run --out "$out" > "$out.log" 2>&1 || {
          echo "bench_compare: $side failed on: $run (log: $out.log)" >&2; exit 1; }
        end=$(date +%s.%N)
        rm -rf "$out"
        secs[$side]="${secs[$side]} $(python3 -c "print($end - $start)")"
      done
    done
    python3 - "$run" "${secs[before]}" "${secs[after]}" <<'PY'
import statistics, sys
run, b, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
print(f"| `{run}` | {', '.join(f'{x:.2f}' for x in b)} | {', '.join(f'{x:.2f}' for x in a)} | "
      f"{statistics.median(a) / statistics.median(b):.3f} |")
PY
  done
  exit 0
fi
before="$1"; after="$2"; rounds="${3:-2}"; only="${4:-ppo,scaling}"
logs="${FLOTILLA_BENCH_LOGS:-/tmp/flotilla-bench-compare}"
mkdir -p "$logs"
for dir in "$before" "$after"; do
  for bin in flotilla flotilla-bench-distributed; do
    [[ -x "$dir/$bin" ]] || { echo "missing $dir/$bin" >&2; exit 1; }
  done
done
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$before; [[ $side == after ]] && dir=$after
    echo "== round $round: $side ($dir) --only $only" >&2
    (cd "$logs" && "$dir/flotilla-bench-distributed" --only "$only") > "$logs/$side-$round.md" 2> "$logs/$side-$round.err"
  done
done
echo "logs in $logs" >&2
