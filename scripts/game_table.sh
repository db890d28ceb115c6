#!/usr/bin/env bash
# The Atari game table: PPO with examples/configs/pong_fast.toml's settings on Pong, Breakout and BeamRider
# (CleanRL's published ppo_atari set), SEEDS each (default "1 2"), 10 M frames (2.5 M agent steps, the learning
# rate annealed over them), evaluated every 500 K frames on 8 whole games. One run after another, each through
# scripts/long_run.sh (background-safe: a fixed run directory under ~/.cache/flotilla/runs/, checkpoints every
# 50 K steps, `nice 10`); calling this script again resumes the run that was cut off and skips finished ones.
# Finished runs' configs and metrics go to docs/benchmarks/atari-table/ (what the table in
# docs/benchmarks/atari.md is made from), and each game's finished seeds are drawn (their mean ± std across seeds
# with `--group`) beside CleanRL's curve (docs/benchmarks/atari-table/cleanrl_ppo_atari_GAME.csv, from
# scripts/cleanrl_curves.py) into docs/images/table_GAME.png.
#   bash scripts/game_table.sh [SEEDS]        e.g.  setsid nohup bash scripts/game_table.sh "1 2" &
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-1 2}"
runs="${HOME}/.cache/flotilla/runs"
table=docs/benchmarks/atari-table
mkdir -p "$table"
# The current build draws the plots (a run's own binary, under runs/bin/, may predate `plot --reference`).
source scripts/release_bin.sh
for seed in $seeds; do
  for game in pong breakout beam_rider; do
    name="table_${game}_s${seed}"
    bash scripts/long_run.sh "$name" examples/configs/pong_fast.toml \
      --set "env.id=\"atari:${game}\"" --set run.total_env_steps=2500000 --set "run.seed=${seed}" \
      --set eval.interval_steps=125000
    if [ -e "$runs/$name.done" ]; then
      cp "$runs/$name/config.toml" "$table/${name}.config.toml"
      cp "$runs/$name/metrics.csv" "$table/${name}.metrics.csv"
      finished=()
      for s in $seeds; do
        if [ -e "$runs/table_${game}_s$s.done" ]; then finished+=("$runs/table_${game}_s$s"); fi
      done
      "$release_bin" plot "${finished[@]}" --group --reference "$table/cleanrl_ppo_atari_${game}.csv" \
        --out "docs/images/table_${game}.png" || echo "game_table.sh: the plot of $game failed" >&2
    fi
  done
done
