#!/usr/bin/env bash
# The timed Pong run: `flotilla train examples/configs/pong_fast.toml` and nothing else on its command line (extra
# `--set`s are for tuning runs, which then do not count), wall-clock from the command's start. Writes
# ~/.cache/flotilla/runs/NAME/ (the run), NAME.log (its output, each line stamped by the run's own UTC clock)
# and prints every evaluation against wall-clock and frames, then (from `flotilla report --threshold 18` and
# `20`, NAME.report18.json / .report20.json, each step's wall-clock from the log) the wall-clock to the first
# evaluation ≥ +18 and ≥ +20, whether every evaluation after it stays there, and where it settled (the
# evaluation from which every later one is there, to the run's end).
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
# Reaching, holding and settling come from `flotilla report` (steps); the log gives each evaluation's wall-clock.
"$bin" report "$out" --threshold 18 --json >"$out.report18.json"
"$bin" report "$out" --threshold 20 --json >"$out.report20.json"
python3 - "$out.log" "$start" "$out.report18.json" "$out.report20.json" <<'EOF' | tee -a "$out.log"
import datetime, json, re, sys
log, start, reports = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
evals = {}
for line in open(log):
    m = re.match(r"(\S+Z)\s+INFO steps\s+(\d+) .*\| eval\s+(-?[\d.]+)", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp() - start
        evals[int(m.group(2))] = (t, float(m.group(3)))
print("wall min | frames M | eval (8 games)")
for steps, (t, score) in evals.items():
    print(f"{t / 60:8.1f} | {4 * steps / 1e6:8.2f} | {score:+.1f}")
at = lambda steps: f"{evals[steps][0] / 60:.1f} min wall-clock, {4 * steps / 1e6:.2f} M frames"
for path in reports:
    report = json.load(open(path))
    level, m = report["threshold"], report["members"][0]
    if m["first_step_at_threshold"] is None:
        print(f"+{level:.0f}: not reached")
        continue
    lowest = m["lowest_after_threshold"]
    print(f"+{level:.0f}: first at {at(m['first_step_at_threshold'])}; "
          f"{'held' if m['held_after_threshold'] else 'not held'} at the {m['evaluations_after_threshold']} "
          f"evaluations after it (lowest {'—' if lowest is None else f'{lowest:+.1f}'})")
    settled = m["settled_step_at_threshold"]
    if settled is None:
        print(f"+{level:.0f}: not settled (the last evaluation is below)")
    else:
        after = sum(1 for s in evals if s > settled)
        print(f"+{level:.0f}: settled at {at(settled)} (>= +{level:.0f} at it and the {after} evaluations after it)")
EOF
