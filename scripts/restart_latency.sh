#!/usr/bin/env bash
# Restart latency of a supervised run: `flotilla train CONFIG --actors 2` with a checkpoint every CHECKPOINT env
# steps; after each new checkpoint the learner is killed with SIGKILL, KILLS times. For each restart it prints the
# seconds from this script's kill to the log line of the restarted learner's first accepted actor data, and the
# learner's own figure (`accepting actors' data again X s after the previous learner died`, from the
# supervisor's view of the death). Each learner is killed once it has run GAP seconds (default 61: a learner
# that ran 60 s is restarted at once, one that keeps dying sooner waits; see cli/src/supervise.rs; GAP=0 times
# that crash loop). Writes under ~/.cache/flotilla/runs/restart-latency-NAME/.
#   [GAP=S] bash scripts/restart_latency.sh NAME CONFIG KILLS CHECKPOINT [--set key=value ...]
# e.g. bash scripts/restart_latency.sh cartpole examples/configs/cartpole_ppo.toml 5 10000 --set run.total_env_steps=2000000
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: bash scripts/restart_latency.sh NAME CONFIG KILLS CHECKPOINT [--set ...]" >&2; exit 2; }
name="$1" config="$2" kills="$3" every="$4"; shift 4
source scripts/release_bin.sh
dir="${HOME}/.cache/flotilla/runs/restart-latency-$name"
rm -rf "$dir" && mkdir -p "$dir"
"$release_bin" train "$config" --actors 2 --out "$dir/run" --set "checkpoint.interval_steps=$every" \
  --set "learner.max_restarts=$kills" "$@" >"$dir/log" 2>&1 &
supervisor=$!
trap 'kill $supervisor 2>/dev/null || true' EXIT
learner() { pgrep -P "$supervisor" -f 'flotilla learner --supervised' | head -1; }
checkpoint_mtime() { stat -c %Y.%N "$dir/run/checkpoint.safetensors" 2>/dev/null || echo none; }
: >"$dir/kills"
for k in $(seq 1 "$kills"); do
  before=$(checkpoint_mtime)
  # A new checkpoint since the last kill (the restarted learner's own), then the learner is killed.
  for _ in $(seq 1 600); do
    [ "$(checkpoint_mtime)" != "$before" ] && [ -n "$(learner)" ] && break
    kill -0 "$supervisor" 2>/dev/null || { echo "restart_latency.sh: the run ended before kill $k" >&2; exit 1; }
    sleep 0.2
  done
  pid=$(learner)
  while [ "$(ps -o etimes= -p "$pid" | tr -d ' ')" -lt "${GAP:-61}" ]; do sleep 0.5; done
  date -u +%s.%N >>"$dir/kills"
  kill -9 "$pid"
  # Wait for the restarted learner to take data again.
  for _ in $(seq 1 300); do
    [ "$(grep -c "accepting actors' data again" "$dir/log")" -ge "$k" ] && break
    sleep 0.2
  done
done
kill "$supervisor" 2>/dev/null || true
wait "$supervisor" 2>/dev/null || true
trap - EXIT
python3 - "$dir" <<'EOF'
import datetime, re, statistics, sys
d = sys.argv[1]
kills = [float(x) for x in open(f"{d}/kills")]
accepted = []
for line in open(f"{d}/log"):
    m = re.match(r"(\S+Z)\s+INFO accepting actors' data again ([\d.]+) s", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        accepted.append((t, float(m.group(2))))
print("restart | kill → first accepted data (s) | learner's figure (s)")
rows = []
for i, (k, (t, own)) in enumerate(zip(kills, accepted), 1):
    rows.append(t - k)
    print(f"{i:7} | {t - k:30.2f} | {own:19.2f}")
if rows:
    print(f"median {statistics.median(rows):.2f} s, max {max(rows):.2f} s over {len(rows)} restarts")
if len(rows) < len(kills):
    print(f"{len(kills) - len(rows)} restarts took no data (see {d}/log)")
    sys.exit(1)
EOF
