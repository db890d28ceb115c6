"""Check `flotilla report --json` against an independent computation on the same directories.

    flotilla report DIR... --json | python report_check.py [--threshold X] [--metric COL] DIR...
    flotilla report DIR... --against DIR... --json | python report_check.py [...] DIR... --against DIR...

Reads population.json / config.toml / metrics.csv / lineage.jsonl with the standard library and computes, with
NumPy: each member's final and best return, finished flag, first step at the threshold, whether it held there
(the lowest value after it, how many rows) and where it settled; the IQM as
`scipy.stats.trim_mean(x, 0.25)` defines it (SciPy itself where it is installed), mean and median; 95 %
percentile bootstrap intervals with 10,000 resamples stratified by env id (as rliable's StratifiedBootstrap);
solved counts; groups of a grid sweep; the PBT best member's schedule; with --at, all of it as of that env step; with --against, both sets so and
rliable's probability of improvement and the IQM difference (X and Y resampled independently within every env).
Point estimates must agree to 1e-9.
The intervals come from a different random stream, so each bound must be within 2 % of the data's range of
NumPy's, or inside NumPy's own 1.5-3.5 (97.5: 96.5-98.5) percentile band where the statistic's bootstrap
distribution is lumpy (medians and IQMs of a few values jump between data points). Prints "ok" or the
mismatches (exit status 1).
"""

import argparse
import csv
import json
import math
import sys
import tomllib
from pathlib import Path

import numpy as np

THRESHOLDS = {"CartPole-v0": 195.0, "CartPole-v1": 475.0, "MountainCar-v0": -110.0,
              "MountainCarContinuous-v0": 90.0, "Acrobot-v1": -100.0, "Pendulum-v1": None}
RESAMPLES = 10_000

try:
    from scipy.stats import trim_mean as scipy_trim_mean
except ImportError:
    scipy_trim_mean = None


def trim_mean(x, proportion=0.25):
    """scipy.stats.trim_mean along the last axis: drop int(proportion * n) values at each end of each sorted
    sample (n the samples' length)."""
    x = np.sort(np.asarray(x, dtype=float), axis=-1)
    n = x.shape[-1]
    cut = int(proportion * n)
    ours = np.mean(x[..., cut:n - cut], axis=-1)
    if scipy_trim_mean is not None:
        theirs = scipy_trim_mean(x, proportion, axis=-1)
        assert np.allclose(ours, theirs, rtol=1e-12, atol=1e-12), (ours, theirs)
    return ours


# Each takes one sample (1-D) or a matrix of resamples, one per row.
STATISTICS = {"iqm": trim_mean, "mean": lambda x: np.mean(x, axis=-1), "median": lambda x: np.median(x, axis=-1)}


def read_member(run_dir, metric, threshold, at=None):
    config = tomllib.loads((run_dir / "config.toml").read_text())
    env_id = config["env"]["id"]
    total = config["run"]["total_env_steps"]
    if threshold is None:
        threshold = THRESHOLDS.get(env_id.removeprefix("gymnasium:"))
    points = []
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        with metrics.open() as f:
            for row in csv.DictReader(f):
                if row.get(metric, "") != "" and math.isfinite(float(row[metric])):
                    points.append((float(row["env_steps"]), float(row[metric])))
    budget = total if at is None else at
    got_there = bool(points) and points[-1][0] >= budget
    if at is not None:
        points = [(x, v) for x, v in points if x <= at]
    final = points[-1][1] if points else None
    member = dict(env_id=env_id, seed=config["run"]["seed"], final_return=final, threshold=threshold,
                  finished=got_there and bool(points), first_step_at_threshold=None,
                  best_return=max((v for _, v in points), default=None), held_after_threshold=None,
                  evaluations_after_threshold=None, lowest_after_threshold=None, settled_step_at_threshold=None)
    if threshold is not None:
        reached = [i for i, (_, v) in enumerate(points) if v >= threshold]
        after = [v for _, v in points[reached[0] + 1:]] if reached else []
        below = [i for i, (_, v) in enumerate(points) if v < threshold]
        settle = (below[-1] + 1) if below else 0
        member.update(
            first_step_at_threshold=int(points[reached[0]][0]) if reached else None,
            held_after_threshold=all(v >= threshold for v in after) if reached else None,
            evaluations_after_threshold=len(after),
            lowest_after_threshold=min(after) if after else None,
            settled_step_at_threshold=int(points[settle][0]) if settle < len(points) else None)
    return member


def read_all(dirs, metric, threshold, at=None):
    members, lineages = [], {}
    for d in map(Path, dirs):
        if (d / "population.json").exists():
            record = json.loads((d / "population.json").read_text())
            lineage_file = d / "lineage.jsonl"
            lineage = [json.loads(line) for line in lineage_file.read_text().splitlines() if line.strip()] \
                if lineage_file.exists() else []
            for m in record["members"]:
                member = read_member(d / m["dir"], metric, threshold, at)
                member.update(index=m["index"], seed=m["seed"], hyperparameters=m["hyperparameters"], source=str(d))
                members.append(member)
            lineages[str(d)] = (lineage, {m["index"]: m["hyperparameters"] for m in record["members"]},
                                record["pbt"])
        else:
            member = read_member(d, metric, threshold, at)
            member.update(index=None, hyperparameters={}, source=str(d))
            members.append(member)
    return members, lineages


def bootstrap(strata, statistic, rng):
    """The statistic of RESAMPLES stratified resamples: within each stratum, its size drawn with replacement."""
    samples = np.concatenate([s[rng.integers(0, len(s), (RESAMPLES, len(s)))] for s in strata], axis=1)
    return statistic(samples)


def aggregate(members, rng):
    finished = [m for m in members if m["finished"]]
    envs = sorted({m["env_id"] for m in finished})
    strata = [np.array([m["final_return"] for m in finished if m["env_id"] == e]) for e in envs]
    pooled = np.concatenate(strata) if strata else np.array([])
    values = np.concatenate([pooled, [m["final_return"] for m in members if m["final_return"] is not None]])
    out = {"size": len(finished), "range": float(np.ptp(values)) if len(values) else 0.0}
    for name, statistic in STATISTICS.items():
        out[name] = float(statistic(pooled)) if len(pooled) else None
        out[name + "_draws"] = bootstrap(strata, statistic, rng) if len(pooled) else None
    solved = reached = held = None
    if all(m["threshold"] is not None for m in finished):
        solved = sum(m["final_return"] >= m["threshold"] for m in finished)
        reached = sum(m["first_step_at_threshold"] is not None for m in finished)
        held = sum(m["held_after_threshold"] is True for m in finished)
    out.update(solved=solved, reached=reached, held=held)
    return out


def schedule(lineage, member, start):
    """The best member's weights back through PBT exploits, in chronological order."""
    segments, before = [], math.inf
    while True:
        events = [e for e in lineage if e["member"] == member and e["env_steps"] < before]
        if not events:
            segments.append({"env_steps": 0, "member": member, "hyperparameters": start.get(member, {})})
            break
        e = max(events, key=lambda e: e["env_steps"])
        segments.append({"env_steps": e["env_steps"], "member": member, "hyperparameters": e["hyperparameters"]})
        member, before = e["source"], e["env_steps"]
    return segments[::-1]


class Checker:
    def __init__(self):
        self.errors = []
        self.largest = 0.0  # the largest |report - NumPy| of a bound, as a fraction of the data's range

    def same(self, what, got, want, tol=1e-9):
        if want is None or got is None:
            ok = want is None and got is None
        elif isinstance(want, float) or isinstance(got, float):
            ok = math.isclose(float(got), float(want), rel_tol=tol, abs_tol=tol)
        else:
            ok = got == want
        if not ok:
            self.errors.append(f"{what}: report says {got!r}, NumPy {want!r}")

    def interval(self, what, got, draws, data_range):
        if draws is None:
            self.same(what, got, [None, None])
            return
        slack = 0.02 * data_range + 1e-9
        for bound, (q, q_lo, q_hi) in zip(got, [(2.5, 1.5, 3.5), (97.5, 96.5, 98.5)]):
            want, lo, hi = np.percentile(draws, [q, q_lo, q_hi])
            if data_range > 0:
                self.largest = max(self.largest, abs(bound - want) / data_range)
            if not (abs(bound - want) <= slack or lo - 1e-9 <= bound <= hi + 1e-9):
                self.errors.append(f"{what} percentile {q}: report {bound}, NumPy {want} (its {q_lo}-{q_hi} "
                                   f"percentiles {lo}-{hi}; 2% of the range {slack})")


def improvement(x, y):
    """rliable's probability of improvement of one stratum: every pair, 1 where x is higher, 1/2 where equal.
    x, y: 1-D, or matrices of resamples (one per row)."""
    x, y = np.asarray(x, dtype=float)[..., :, None], np.asarray(y, dtype=float)[..., None, :]
    return np.mean((x > y) + 0.5 * (x == y), axis=(-2, -1))


def compare(c, report, x_members, y_members, rng):
    """P(X > Y) averaged over envs and the IQM difference, each with X and Y resampled independently within
    every env."""
    fx = [m for m in x_members if m["finished"]]
    fy = [m for m in y_members if m["finished"]]
    envs = sorted({m["env_id"] for m in fx})
    c.same("comparison strata", report["strata"], envs)
    xs = [np.array([m["final_return"] for m in fx if m["env_id"] == e]) for e in envs]
    ys = [np.array([m["final_return"] for m in fy if m["env_id"] == e]) for e in envs]
    c.same("probability_of_improvement", report["probability_of_improvement"],
           float(np.mean([improvement(a, b) for a, b in zip(xs, ys)])))
    c.same("iqm_difference", report["iqm_difference"],
           float(trim_mean(np.concatenate(xs)) - trim_mean(np.concatenate(ys))))
    draws = [(s[rng.integers(0, len(s), (RESAMPLES, len(s)))], t[rng.integers(0, len(t), (RESAMPLES, len(t)))])
             for s, t in zip(xs, ys)]
    p_draws = np.mean([improvement(a, b) for a, b in draws], axis=0)
    d_draws = trim_mean(np.concatenate([a for a, _ in draws], axis=1)) \
        - trim_mean(np.concatenate([b for _, b in draws], axis=1))
    c.interval("probability_of_improvement_ci", report["probability_of_improvement_ci"], p_draws, 1.0)
    values = [m["final_return"] for m in fx + fy]
    c.interval("iqm_difference_ci", report["iqm_difference_ci"], d_draws, float(np.ptp(values)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--threshold", type=float)
    parser.add_argument("--metric", default="eval/mean_return")
    parser.add_argument("--against", nargs="+", default=[])
    parser.add_argument("--at", type=int)
    args = parser.parse_args()
    report = json.load(sys.stdin)
    rng = np.random.default_rng(12345)
    c = Checker()
    if not args.against:
        members, size = check(c, report, args.dirs, args, rng)
    else:
        members, size = check(c, report["x"], args.dirs, args, rng)
        y_members, y_size = check(c, report["y"], args.against, args, rng)
        compare(c, report["comparison"], members, y_members, rng)
        members, size = members + y_members, size + y_size
    if c.errors:
        print("\n".join(c.errors))
        sys.exit(1)
    print(f"ok: {len(members)} members, {size} finished{'; X against Y' if args.against else ''}; CI bounds within "
          f"{100 * c.largest:.2f}% of the range of NumPy's; "
          f"scipy {'used' if scipy_trim_mean else 'absent: trim_mean as scipy defines it'}")


def check(c, report, dirs, args, rng):
    """Every number of one report (one set of runs) against NumPy's; its members and finished count."""
    members, lineages = read_all(dirs, args.metric, args.threshold, args.at)
    c.same("at", report["at"], args.at)

    # Members, in population index order with plain runs after (stable).
    members.sort(key=lambda m: math.inf if m["index"] is None else m["index"])
    c.same("members_total", report["members_total"], len(members))
    c.same("unfinished", report["unfinished"], sum(not m["finished"] for m in members))
    for i, (got, want) in enumerate(zip(report["members"], members)):
        for key in ["index", "seed", "env_id", "finished", "first_step_at_threshold", "final_return", "best_return",
                    "held_after_threshold", "evaluations_after_threshold", "lowest_after_threshold",
                    "settled_step_at_threshold"]:
            c.same(f"members[{i}].{key}", got[key], want[key])
        c.same(f"members[{i}].hyperparameters", got["hyperparameters"], want["hyperparameters"])

    # Aggregates over the finished members.
    a = aggregate(members, rng)
    c.same("size", report["size"], a["size"])
    for key in ["solved", "reached", "held"]:
        c.same(key, report[key], a[key])
    if a["solved"] is not None and a["size"]:
        c.same("solved_fraction", report["solved_fraction"], a["solved"] / a["size"])
    c.same("strata", report["strata"], sorted({m["env_id"] for m in members if m["finished"]}))
    thresholds = {m["threshold"] for m in members}
    c.same("threshold", report["threshold"], thresholds.pop() if len(thresholds) == 1 else None)
    for name in STATISTICS:
        c.same(name, report[name], a[name])
        c.interval(name + "_ci", report[name + "_ci"], a[name + "_draws"], a["range"])

    # A grid with several seeds per point: one group per hyperparameter assignment.
    pbt = any(pbt or lineage for lineage, _, pbt in lineages.values())
    assignments = []
    for m in members:
        if m["hyperparameters"] not in assignments:
            assignments.append(m["hyperparameters"])
    grouped = not pbt and any(m["hyperparameters"] for m in members) and 2 <= len(assignments) < len(members)
    c.same("grouped", "groups" in report, grouped)
    if grouped:
        c.same("groups", [g["hyperparameters"] for g in report["groups"]], assignments)
        for g, h in zip(report["groups"], assignments):
            ga = aggregate([m for m in members if m["hyperparameters"] == h], rng)
            c.same(f"group {h} size", g["size"], ga["size"])
            for key in ["solved", "reached", "held"]:
                c.same(f"group {h} {key}", g[key], ga[key])
            for name in STATISTICS:
                c.same(f"group {h} {name}", g[name], ga[name])
            c.interval(f"group {h} iqm_ci", g["iqm_ci"], ga["iqm_draws"], ga["range"])

    # PBT: the best finished member's schedule.
    with_lineage = [m for m in members if m["finished"] and lineages.get(m["source"], ([],))[0]]
    if with_lineage:
        best = max(with_lineage, key=lambda m: (m["final_return"], -m["index"]))
        lineage, start, _ = lineages[best["source"]]
        c.same("best_member", report.get("best_member"), best["index"])
        c.same("best_schedule", report.get("best_schedule"), schedule(lineage, best["index"], start))
    else:
        c.same("best_schedule", "best_schedule" in report, False)
    return members, a["size"]


if __name__ == "__main__":
    main()
