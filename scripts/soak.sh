#!/usr/bin/env bash
# The chaos soak (tests/src/bin/soak.rs has the whole story): a supervised CartPole PPO run with 8 actors, 4 of
# them in network namespaces behind a latency proxy; a random actor SIGKILLed every 20 s, the learner every
# 3 minutes, a namespaced actor's link cut for 10 s every 4 minutes, a hostile client throughout; sampled every
# 5 s. Ends with one line (`soak: M min, actors killed K, ...`) and exits non-zero if anything is lost, leaks,
# restarts slowly or the run does not end solved. Needs root and iproute2. Logs, samples.csv and the run go to
# ~/.cache/flotilla/soak/<UTC time>/ (outside the clone).
#   bash scripts/soak.sh MINUTES [--seed N]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/soak.sh MINUTES [--seed N]" >&2; exit 2; }
minutes="$1"; shift
bash scripts/setup.sh >/dev/null
cargo build --release -p flotilla-cli -p flotilla-tests --bin flotilla --bin flotilla-soak >/dev/null
target="$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release"
out="${HOME}/.cache/flotilla/soak/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
# Copies of the binaries: a rebuild during a long soak does not touch them.
cp "$target/flotilla" "$out/flotilla" && cp "$target/flotilla-soak" "$out/flotilla-soak"
echo "soak.sh: $minutes min; logs in $out" >&2
"$out/flotilla-soak" "$minutes" --flotilla "$out/flotilla" --out "$out" "$@"
