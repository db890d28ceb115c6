"""Print the evaluation curve of a run (its metrics.csv) as a Markdown table: agent steps, frames (×4 for
Atari's frame skip), training seconds, mean and std of the evaluation returns, and the last training return.
`--frameskip 1` (envs without frame skip, e.g. MuJoCo) drops the frames column.

    python3 scripts/eval_curve.py RUN_DIR/metrics.csv [--frameskip 4]
"""
import csv
import sys


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    frameskip = 4
    if "--frameskip" in args:
        i = args.index("--frameskip")
        frameskip = int(args[i + 1])
        del args[i : i + 2]
    with open(args[0], newline="") as f:
        rows = list(csv.DictReader(f))
    frames = frameskip != 1
    if frames:
        print("| agent steps | frames | train s | eval mean | eval std | train game score (log window) |")
        print("|---:|---:|---:|---:|---:|---:|")
    else:
        print("| env steps | train s | eval mean | eval std | train return (log window) |")
        print("|---:|---:|---:|---:|---:|")
    for row in rows:
        if not row.get("eval/mean_return"):
            continue
        steps = int(row["env_steps"])
        print(
            f"| {steps:,} | " + (f"{steps * frameskip:,} | " if frames else "") + f"{float(row['train_secs']):.0f} | "
            f"{float(row['eval/mean_return']):.1f} | {float(row.get('eval/std_return') or 0):.1f} | "
            f"{row.get('charts/episodic_return', '')[:6]} |"
        )


if __name__ == "__main__":
    main()
