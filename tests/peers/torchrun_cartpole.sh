#!/usr/bin/env bash
# Data-parallel learners launched by PyTorch's own torchrun (the peers venv: `bash scripts/setup_peers.sh --torch`),
# unchanged: torchrun's agent hosts the rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True) and sets RANK,
# WORLD_SIZE, MASTER_ADDR/PORT. With `kill`, learner 1 is killed with SIGKILL after the first checkpoint and
# torchrun --max-restarts 1 starts the group again, which resumes from the run's checkpoint.
#   bash tests/peers/torchrun_cartpole.sh [kill]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
torchrun="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/peers-venv/bin/torchrun"
[[ -x $torchrun ]] || { echo "no torchrun: run bash scripts/setup_peers.sh --torch" >&2; exit 1; }
cargo build --release --bin flotilla
flotilla="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/flotilla"
run="$(mktemp -d)/run"
log="$run.log"
"$torchrun" --no-python --nproc-per-node 2 --max-restarts 1 --master-port "${PORT:-29535}" "$flotilla" train \
  examples/configs/cartpole_ppo.toml --actors 2 --set learner.learners=2 --set checkpoint.interval_steps=20000 \
  --set learner.collective_timeout_secs=30 --out "$run" >"$log" 2>&1 &
group=$!
if [[ "${1:-}" == kill ]]; then
  until [[ -f $run/checkpoint.safetensors ]]; do sleep 0.05; done
  victim=$(grep -a "learner 1 of 2 joined" "$log" | sed 's/.*pid \([0-9]*\);.*/\1/')
  kill -9 "$victim" && echo "killed learner 1 (pid $victim)"
fi
wait $group
grep -a -E "joined|resuming|lost rank|^(trained|first|evaluation)" "$log" | cut -c1-200
