"""CleanRL's published ppo_atari.py learning curves as numbers, read off the plots in its repository.

The game table (docs/benchmarks/atari.md) sets Flotilla's scores at 1-10 M frames beside CleanRL's. CleanRL
publishes only final scores as numbers; its curves are W&B plots. The plots kept in its repository,
`docs/rl-algorithms/ppo/{Pong,Breakout,BeamRider}NoFrameskip-v4.png` (4256 x 2656 PNGs of `ppo_atari.py`,
the mean over its seeds of `charts/episodic_return`: whole-game, unclipped training returns of the stochastic
policy, as W&B smoothed them), are read here pixel by pixel: the solid line's pixels in each column, mapped to
values through the axes' gridlines and ticks (their pixel positions below, found in the images and checked by
the line's last point against CleanRL's published final score).

CleanRL's x axis is `global_step`, which counts agent steps of its `MaxAndSkipEnv(skip=4)` env: 4 frames each.
The CSVs' `env_steps` are agent steps, as Flotilla's metrics count them (4 frames each). Its runs anneal the learning rate over 10 M steps (40 M frames), so at
10 M frames a CleanRL run is a quarter of the way through its schedule; a Flotilla table run has annealed to 0.

    python scripts/cleanrl_curves.py CLEANRL_GIT_DIR [OUT_DIR] [REVISION]

CLEANRL_GIT_DIR: a git directory (or clone) of github.com/vwxyzjn/cleanrl, read at REVISION (default fe8d8a0,
the commit the calibration was taken from). Needs numpy and
Pillow (the setup venv has both). Writes, per game, OUT_DIR/cleanrl_ppo_atari_GAME.csv (default OUT_DIR:
docs/benchmarks/atari-table) as `flotilla plot --reference` reads it: `label,env_steps,value` rows every 250 K
frames to 10 M frames, `env_steps` in agent steps of 4 frames as Flotilla's metrics count them. Prints the
value at every 1 M frames and the line's last point (40 M frames).
"""

import csv
import io
import subprocess
import sys

import numpy as np
from PIL import Image

# Per game: x pixel of step 0, pixels per 1 M steps (from the 2M/4M/6M/8M ticks), y pixel of the value `at`,
# pixels per unit of return (from the gridlines), and CleanRL's published final score the line must end at.
CALIBRATION = {
    # ticks at x = 1184, 1882, 2580, 3278; gridlines 0/100/200/300/400 at y = 2296, 1926, 1556, 1186, 816
    "Breakout": dict(x0=486, px_per_m=349.0, y_at=2296, at=0.0, px_per_unit=3.70, final=414.66),
    # ticks at x = 1158, 1863, 2568, 3272; gridlines 10/0/-10/-20 at y = 972, 1400, 1830, 2258
    "Pong": dict(x0=453, px_per_m=352.5, y_at=1400, at=0.0, px_per_unit=42.8, final=20.36),
    # ticks at x = 1220, 1908, 2598, 3286; gridlines 3000/2500/1000/500/0 at y = 686, 954, 1758, 2028, 2296.
    # The repository's plot is an earlier run set than the final score CleanRL's docs give now (1915.93 for
    # tag pr-424): its line ends near 2,450, so no published number checks it; its scale rests on the gridlines.
    "BeamRider": dict(x0=531, px_per_m=344.5, y_at=2296, at=0.0, px_per_unit=268 / 500, final=None),
}


def line_points(png: bytes) -> np.ndarray:
    """(x, y) of the plotted line: the median row of the dark red pixels in each column (the band is pale)."""
    im = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    line = (r > 170) & (g < 110) & (b < 110)
    line[:400] = False  # the legend and title above the plot area
    points = [(x, float(np.median(np.where(line[:, x])[0]))) for x in range(im.shape[1]) if line[:, x].any()]
    return np.array(points)


def value_at(points: np.ndarray, c: dict, steps_m: float) -> float:
    x = c["x0"] + steps_m * c["px_per_m"]
    near = points[np.abs(points[:, 0] - x) <= 4]
    if len(near) == 0:
        raise SystemExit(f"no line pixels near x = {x:.0f}")
    return c["at"] + (c["y_at"] - near[:, 1].mean()) / c["px_per_unit"]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python scripts/cleanrl_curves.py CLEANRL_GIT_DIR [OUT_DIR] [REVISION]")
    git_dir = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks/atari-table"
    revision = sys.argv[3] if len(sys.argv) > 3 else "fe8d8a0"
    label = "CleanRL ppo_atari.py (mean of its seeds)"
    for game, c in CALIBRATION.items():
        path = f"{revision}:docs/rl-algorithms/ppo/{game}NoFrameskip-v4.png"
        png = subprocess.run(["git", "--git-dir", git_dir, "show", path], check=True, capture_output=True).stdout
        points = line_points(png)
        last = c["at"] + (c["y_at"] - points[-1][1]) / c["px_per_unit"]
        if c["final"] is not None and abs(last - c["final"]) > 0.03 * max(abs(c["final"]), 20):
            raise SystemExit(f"{game}: the line ends at {last:.1f}, CleanRL publishes {c['final']}: calibration off")
        rows = [(k * 62_500, round(value_at(points, c, k * 62_500 / 1e6), 1)) for k in range(1, 41)]
        snake = "".join("_" + ch.lower() if ch.isupper() else ch for ch in game).lstrip("_")
        out = f"{out_dir}/cleanrl_ppo_atari_{snake}.csv"
        with open(out, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["label", "env_steps", "value"])
            w.writerows((label, steps, value) for steps, value in rows)
        every_m = " ".join(f"{v:g}" for steps, v in rows if (steps * 4) % 1_000_000 == 0)
        print(f"{game}: at 1..10 M frames {every_m}; at 40 M frames {last:.1f}; wrote {out}")


if __name__ == "__main__":
    main()
