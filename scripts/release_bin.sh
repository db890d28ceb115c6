# Sourced by the run scripts (long_run.sh, pong_fast.sh, bench_pong_peer.sh) from the repository root: the
# idempotent set-up, a release build of the `flotilla` CLI, and `release_bin`, the path of the built binary in
# the cargo target dir (outside the clone: scripts/setup.sh points it at the cache).
bash scripts/setup.sh >/dev/null
cargo build --release -p flotilla-cli >/dev/null
release_bin="$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/flotilla"
