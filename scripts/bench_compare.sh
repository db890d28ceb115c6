#!/usr/bin/env bash
# Before/after comparison of the distributed benchmarks, side by side in one run (this machine is noisy:
# compare ratios measured together, never numbers from different days).
#
#   bash scripts/bench_compare.sh BEFORE_BIN_DIR AFTER_BIN_DIR [ROUNDS] [--only ppo,scaling]
#
# Each BIN_DIR holds a `flotilla` and a `flotilla-bench-distributed` built from one commit, e.g.
#   git worktree add /tmp/base <rev> && (cd /tmp/base && bash scripts/setup.sh && \
#     cargo build --release --bin flotilla --bin flotilla-bench-distributed) && \
#   mkdir -p /tmp/base-bin && cp ~/.cache/flotilla/target/release/{flotilla,flotilla-bench-distributed} /tmp/base-bin/
# Rounds alternate before/after so slow drifts in the machine's load hit both. Output: one log per round and
# binary under $FLOTILLA_BENCH_LOGS (default /tmp/flotilla-bench-compare), outside the clone.
set -euo pipefail
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
