#!/usr/bin/env bash
# The timed Pong run: `flotilla train examples/configs/pong_fast.toml` and nothing else on its command line (extra
# `--set`s are for tuning runs, which then do not count), wall-clock from the command's start. Writes
# ~/.cache/flotilla/runs/NAME/ (the run), NAME.log (its output, each line stamped by the run's own UTC clock)
# and prints, from the log, every evaluation against wall-clock and frames, the wall-clock to the first
# evaluation ≥ +18 and ≥ +20, whether every evaluation after the first ≥ +18 stays ≥ +18, and where it settled
# (the evaluation from which every later one is ≥ +18, to the run's end).
# It runs a copy of the release binary (a rebuild meanwhile does not touch it) at normal priority: time the run
# that counts with nothing else running on the machine, and say so.
#   bash scripts/pong_fast.sh NAME [--set key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/pong_fast.sh NAME [--set key=value ...]" >&2; exit 2; }
name="$1"; shift
case "$name" in */*|.*|"") echo "pong_fast.sh: NAME must be a plain directory name, got '$name'" >&2; exit 2;; esac
source scripts/release_bin.sh
runs="${HOME}/.cache/flotilla/runs"
mkdir -p "$runs/bin"
out="$runs/$name"
[ -e "$out" ] && { echo "pong_fast.sh: $out exists; remove it (and $out.log) to run $name again" >&2; exit 2; }
bin="$runs/bin/$name"
cp "$release_bin" "$bin.tmp" && mv "$bin.tmp" "$bin"
{
  echo "== pong_fast.sh $name: $(date -u +%FT%T.%NZ) start; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
  echo "== command: flotilla train examples/configs/pong_fast.toml --out $out $*"
} >"$out.log"
start=$(date +%s.%N)
"$bin" train examples/configs/pong_fast.toml --out "$out" "$@" >>"$out.log" 2>&1
end=$(date +%s.%N)
echo "== end: wall $(python3 -c "print(f'{$end - $start:.1f}')") s; load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out.log"
python3 - "$out.log" "$start" <<'EOF' | tee -a "$out.log"
import datetime, re, sys
log, start = sys.argv[1], float(sys.argv[2])
evals = []
for line in open(log):
    m = re.match(r"(\S+Z)\s+INFO steps\s+(\d+) .*\| eval\s+(-?[\d.]+)", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp() - start
        evals.append((t, int(m.group(2)), float(m.group(3))))
print("wall min | frames M | eval (8 games)")
for t, steps, score in evals:
    print(f"{t / 60:8.1f} | {4 * steps / 1e6:8.2f} | {score:+.1f}")
for level in (18.0, 20.0):
    first = next((i for i, e in enumerate(evals) if e[2] >= level), None)
    if first is None:
        print(f"+{level:.0f}: not reached")
        continue
    t, steps, _ = evals[first]
    after = [e[2] for e in evals[first + 1:]]
    held = all(s >= level for s in after)
    print(f"+{level:.0f}: first at {t / 60:.1f} min wall-clock, {4 * steps / 1e6:.2f} M frames; "
          f"{'held' if held else 'not held'} at the {len(after)} evaluations after it (lowest "
          f"{min(after) if after else float('nan'):+.1f})")
    # Settled: the first evaluation from which every later one is >= level (the run holds it to its end).
    settled = next((i for i in range(len(evals)) if all(e[2] >= level for e in evals[i:])), None)
    if settled is None:
        print(f"+{level:.0f}: not settled (the last evaluation is below)")
    else:
        t, steps, _ = evals[settled]
        print(f"+{level:.0f}: settled at {t / 60:.1f} min wall-clock, {4 * steps / 1e6:.2f} M frames "
              f"(>= +{level:.0f} at it and the {len(evals) - settled - 1} evaluations after it)")
EOF
