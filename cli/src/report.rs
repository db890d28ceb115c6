//! `flotilla report`: a population's (or any set of runs') final returns, aggregated as rliable recommends.
//!
//! ```text
//! flotilla report RUN_DIR [RUN_DIR ...] [--json] [--threshold X] [--metric eval/mean_return] [--at STEPS]
//!                 [--against RUN_DIR ...]
//! ```
//! Each RUN_DIR is a population directory (`population.json`: every member it lists, `members/NNN/`) or a plain
//! run directory (one member, its config's seed, no hyperparameters). Several directories are merged, which is
//! how a sweep split across jobs is read back; a member (index and seed) found in two of them is an error.
//!
//! Per member: its seed and hyperparameters, its *final return* (the metric of the last `metrics.csv` row that
//! has one) and best, the first env step at which the metric reached the threshold (`--threshold`, else the env's
//! registered reward threshold), whether it *held* there (every later value ≥ the threshold; the lowest of them),
//! where it *settled* (the first row from which every value to the last is ≥ the threshold), and whether it
//! *finished*: that last row is at `[run] total_env_steps` (training ends with an evaluation of the final policy
//! there). Unfinished members are listed but left out of the aggregates: IQM (`scipy.stats.trim_mean(x, 0.25)`),
//! mean and median with 95 % stratified bootstrap intervals (`flotilla_learner::stats`; strata are env ids), the
//! solved fraction (final return ≥ threshold) and how many reached the threshold and held it. A grid
//! sweep with several seeds per point also gets one aggregate row per hyperparameter assignment. Where PBT wrote
//! a `lineage.jsonl`, the best member's hyperparameter schedule is traced back through the members whose weights
//! it inherited.
//!
//! With `--at STEPS`, every member is judged as of that env step, as if it had stopped there: rows after it
//! are left out, and a member is finished when it has a row at or after it (runs still going count once they
//! are past it; the final return is then its last row at or before STEPS).
//!
//! With `--against`, the runs given first (X) and those after `--against` (Y) are each reported so, then
//! compared: rliable's probability of improvement P(X > Y) and the IQM difference X − Y of the finished
//! members' final returns, with intervals from resampling X and Y independently ([`stats::compare`]). Both sets
//! must cover the same envs (the strata), each with a finished member.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::population::{self, LineageEvent, POPULATION_FILE, PopulationRecord};
use flotilla_learner::run_dir::{CONFIG_FILE, METRICS_FILE, RunDir};
use flotilla_learner::stats::{self, Comparison, Course, Estimate, Summary};
use serde_json::{Value, json};

/// `flotilla report`: read every directory, print the per-member table and the aggregates (or `--json`); with
/// `against` non-empty, both sets so and their comparison.
pub fn report_command(dirs: &[PathBuf], against: &[PathBuf], json: bool, judge: &Judge) -> Result<()> {
    let everything: Vec<PathBuf> = dirs.iter().chain(against).cloned().collect();
    refuse_repeats(&everything)?;
    let report = Report::read(dirs, judge)?;
    let text = if against.is_empty() {
        if json {
            serde_json::to_string_pretty(&report.to_json()).expect("JSON values serialise") + "\n"
        } else {
            report.text()
        }
    } else {
        let other = Report::read(against, judge)?;
        let comparison = compare(&report, &other)?;
        if json {
            let value = json!({"x": report.to_json(), "y": other.to_json(), "comparison": comparison.to_json()});
            serde_json::to_string_pretty(&value).expect("JSON values serialise") + "\n"
        } else {
            format!("X: {}\nY: {}\n{}", report.text(), other.text(), comparison.text(&report, &other))
        }
    };
    match std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()) {
        // `flotilla report … | head`.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// What each member is judged by.
#[derive(Debug, Clone)]
pub struct Judge {
    /// The threshold (`None`: each env's registered reward threshold).
    pub threshold: Option<f64>,
    /// The `metrics.csv` column whose last value is the final return.
    pub metric: String,
    /// Judge as of this env step (rows after it left out; finished: a row at or after it) instead of at the
    /// run's `total_env_steps`.
    pub at: Option<u64>,
}

/// One directory given on the command line.
#[derive(Debug)]
pub struct Source {
    /// The directory as given.
    pub dir: PathBuf,
    /// Its `population.json`; `None` for a plain run directory.
    pub record: Option<PopulationRecord>,
    /// Its `lineage.jsonl` (empty without PBT).
    pub lineage: Vec<LineageEvent>,
}

impl Source {
    /// A population directory (it has `population.json`) or a plain run directory (it has `config.toml`).
    pub fn read(dir: &Path) -> Result<Self> {
        if dir.join(POPULATION_FILE).is_file() {
            let record = PopulationRecord::read(dir)?;
            let lineage = population::read_lineage(dir)?;
            let mut seen = BTreeSet::new();
            for m in &record.members {
                anyhow::ensure!(
                    seen.insert(m.index),
                    "{} lists member {} twice",
                    dir.join(POPULATION_FILE).display(),
                    m.index
                );
                let member_dir = dir.join(&m.dir);
                anyhow::ensure!(
                    member_dir.is_dir(),
                    "{} lists member {} in {}, which does not exist",
                    dir.join(POPULATION_FILE).display(),
                    m.index,
                    member_dir.display()
                );
            }
            Ok(Source { dir: dir.to_path_buf(), record: Some(record), lineage })
        } else if dir.join(CONFIG_FILE).is_file() {
            Ok(Source { dir: dir.to_path_buf(), record: None, lineage: Vec::new() })
        } else if !dir.is_dir() {
            bail!("{} does not exist", dir.display())
        } else {
            bail!(
                "{} is neither a population directory (no {POPULATION_FILE}) nor a run directory (no {CONFIG_FILE})",
                dir.display()
            )
        }
    }

    /// Its members' run directories, with their population index (`None` for a plain run directory).
    pub fn member_dirs(&self) -> Vec<(Option<usize>, PathBuf)> {
        match &self.record {
            Some(record) => record.members.iter().map(|m| (Some(m.index), self.dir.join(&m.dir))).collect(),
            None => vec![(None, self.dir.clone())],
        }
    }
}

/// `(env_steps, value)` of every `metrics.csv` row of `dir` with a finite `metric`, in row order. A run that
/// has logged nothing yet (no file, or an empty one) has none; a header without the column is an error.
pub fn read_metric(dir: &Path, metric: &str) -> Result<Vec<(f64, f64)>> {
    Ok(read_columns(dir, metric, None)?.unwrap_or_default().into_iter().map(|(x, y, _)| (x, y)).collect())
}

/// Rows of `(x, metric, other)` read from a run's metrics ([`read_columns`]).
pub type Columns = Vec<(f64, f64, Option<f64>)>;

/// `(env_steps, metric, other)` of every `metrics.csv` row of `dir` with a finite `metric` (`other`: the
/// finite value of the column `other`, when given and present); `None` when the run has logged nothing yet (no
/// file, or no header). A header without `env_steps` or `metric`, or a cell that is not a number, is an error
/// naming the file (and row).
pub fn read_columns(dir: &Path, metric: &str, other: Option<&str>) -> Result<Option<Columns>> {
    read_columns_against(dir, "env_steps", metric, other)
}

/// [`read_columns`] with the column `x` (e.g. `train_secs`) in place of `env_steps`.
pub fn read_columns_against(dir: &Path, x: &str, metric: &str, other: Option<&str>) -> Result<Option<Columns>> {
    let path = dir.join(METRICS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else { return Ok(None) };
    let header: Vec<&str> = header.split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let Some(x) = column(x) else {
        bail!("{} has no {x} column; available: {}", path.display(), header.join(", "));
    };
    let Some(y) = column(metric) else {
        let available: Vec<&str> = header.iter().copied().filter(|h| *h != "env_steps").collect();
        bail!("metric {metric:?} is not in {}; available: {}", path.display(), available.join(", "));
    };
    let z = other.and_then(column);
    let mut points = Vec::new();
    for (row, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let number = |i: usize| -> Result<Option<f64>> {
            match cells.get(i).map(|c| c.trim()).filter(|c| !c.is_empty()) {
                None => Ok(None),
                Some(c) => c.parse::<f64>().map(Some).with_context(|| {
                    format!("{} row {}: {} is {c:?}, not a number", path.display(), row + 2, header[i])
                }),
            }
        };
        if let (Some(steps), Some(value)) = (number(x)?, number(y)?)
            && value.is_finite()
        {
            let extra = z.map(number).transpose()?.flatten().filter(|v| v.is_finite());
            points.push((steps, value, extra));
        }
    }
    Ok(Some(points))
}

/// The registered reward threshold of a single-env config's env (a `gymnasium:` id of a native env included).
pub fn env_threshold(config: &ExperimentConfig) -> Option<f64> {
    if !config.env.tasks.is_empty() {
        return None;
    }
    let id = config.env.id.strip_prefix("gymnasium:").unwrap_or(&config.env.id);
    flotilla_envs::spec(id).ok().and_then(|s| s.reward_threshold)
}

/// One member as read.
#[derive(Debug, Clone)]
struct Member {
    /// Index in its population (`None`: a plain run directory).
    index: Option<usize>,
    seed: u64,
    dir: PathBuf,
    /// Which [`Source`] it came from.
    source: usize,
    env_id: String,
    hyperparameters: BTreeMap<String, f64>,
    threshold: Option<f64>,
    final_return: Option<f64>,
    /// Env steps of the row the final return is from.
    last_step: Option<u64>,
    total_env_steps: u64,
    /// The step it is judged at: `--at`, else `total_env_steps`.
    budget: u64,
    /// The largest value of the metric.
    best_return: Option<f64>,
    /// The metric against the threshold (`None` without one).
    course: Option<Course>,
    finished: bool,
}

impl Member {
    fn first_at_threshold(&self) -> Option<u64> {
        self.course.and_then(|c| c.first)
    }

    /// Reached the threshold and never fell below it after.
    fn held(&self) -> Option<bool> {
        self.course.and_then(|c| c.held())
    }
}

/// One stretch of the best member's weights' history: from `env_steps` on, `member` trained them with
/// `hyperparameters`.
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    env_steps: u64,
    member: usize,
    hyperparameters: BTreeMap<String, f64>,
}

/// Aggregates of one set of finished members.
#[derive(Debug, Clone)]
struct Aggregate {
    summary: Summary,
    /// Finished members at or above their threshold; `None` when some member's env has none.
    solved: Option<usize>,
    /// Finished members that reached their threshold at some row, and those of them that held it after
    /// ([`Course`]); `None` as for `solved`.
    reached: Option<usize>,
    held: Option<usize>,
}

/// Everything `flotilla report` prints.
struct Report {
    sources: Vec<Source>,
    metric: String,
    at: Option<u64>,
    members: Vec<Member>,
    all: Aggregate,
    /// Per hyperparameter assignment (a grid with several seeds per point).
    groups: Vec<(BTreeMap<String, f64>, usize, Aggregate)>,
    /// The best member (index, source) and its schedule, where PBT wrote a lineage.
    best_schedule: Option<(usize, Vec<Segment>)>,
    /// Indices below the population size that no directory holds.
    missing: Vec<usize>,
}

impl Report {
    fn read(dirs: &[PathBuf], judge: &Judge) -> Result<Self> {
        let (threshold, metric) = (judge.threshold, judge.metric.as_str());
        anyhow::ensure!(!dirs.is_empty(), "give at least one RUN_DIR");
        let sources = dirs.iter().map(|d| Source::read(d)).collect::<Result<Vec<_>>>()?;

        let mut members = Vec::new();
        let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
        for (s, source) in sources.iter().enumerate() {
            let listed: Vec<_> = match &source.record {
                Some(record) => record
                    .members
                    .iter()
                    .map(|m| (Some(m.index), Some(m.seed), source.dir.join(&m.dir), m.hyperparameters.clone()))
                    .collect(),
                None => vec![(None, None, source.dir.clone(), BTreeMap::new())],
            };
            for (index, seed, dir, hyperparameters) in listed {
                let (_, config) = RunDir::open(&dir)?;
                let seed = seed.unwrap_or(config.run.seed);
                if let Some(index) = index
                    && let Some(other) = seen.insert((index, seed), s)
                {
                    bail!(
                        "member {index} (seed {seed}) is in both {} and {}: the same job given twice?",
                        sources[other].dir.display(),
                        source.dir.display()
                    );
                }
                let mut points = read_metric(&dir, metric)?;
                let threshold = threshold.or_else(|| env_threshold(&config));
                let total = config.run.total_env_steps;
                let budget = judge.at.unwrap_or(total);
                let got_there = points.last().is_some_and(|&(x, _)| x >= budget as f64);
                if judge.at.is_some() {
                    points.retain(|&(x, _)| x <= budget as f64);
                }
                let last = points.last().copied();
                let best_return = points.iter().map(|(_, v)| *v).reduce(f64::max);
                members.push(Member {
                    index,
                    seed,
                    dir,
                    source: s,
                    env_id: config.env.id.clone(),
                    hyperparameters,
                    threshold,
                    final_return: last.map(|(_, v)| v),
                    last_step: last.map(|(x, _)| x as u64),
                    total_env_steps: total,
                    budget,
                    best_return,
                    course: threshold.map(|t| {
                        let steps: Vec<(u64, f64)> = points.iter().map(|&(x, v)| (x as u64, v)).collect();
                        Course::of(&steps, t)
                    }),
                    finished: got_there && last.is_some(),
                });
            }
        }
        // Population index order (a sweep split across jobs interleaves them), plain runs after, stable.
        members.sort_by_key(|m| m.index.unwrap_or(usize::MAX));

        let all = aggregate(members.iter());
        let pbt = sources.iter().any(|s| s.record.as_ref().is_some_and(|r| r.pbt) || !s.lineage.is_empty());
        let mut assignments: Vec<(BTreeMap<String, f64>, Vec<&Member>)> = Vec::new();
        for m in &members {
            match assignments.iter_mut().find(|(h, _)| *h == m.hyperparameters) {
                Some((_, ms)) => ms.push(m),
                None => assignments.push((m.hyperparameters.clone(), vec![m])),
            }
        }
        let grouped = !pbt
            && members.iter().any(|m| !m.hyperparameters.is_empty())
            && (2..members.len()).contains(&assignments.len());
        let groups = if grouped {
            assignments.into_iter().map(|(h, ms)| (h, ms.len(), aggregate(ms.into_iter()))).collect()
        } else {
            Vec::new()
        };

        let best_schedule = best_schedule(&sources, &members);
        let mut missing = Vec::new();
        let sizes: BTreeSet<usize> = sources.iter().filter_map(|s| s.record.as_ref().map(|r| r.size)).collect();
        if let [size] = sizes.into_iter().collect::<Vec<_>>()[..] {
            let present: BTreeSet<usize> = members.iter().filter_map(|m| m.index).collect();
            missing = (0..size).filter(|i| !present.contains(i)).collect();
        }
        Ok(Report { sources, metric: metric.to_string(), at: judge.at, members, all, groups, best_schedule, missing })
    }

    /// The single threshold every member is judged by, if there is one.
    fn common_threshold(&self) -> Option<f64> {
        let first = self.members.first()?.threshold?;
        self.members.iter().all(|m| m.threshold == Some(first)).then_some(first)
    }

    fn strata(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.members.iter().filter(|m| m.finished).map(|m| m.env_id.as_str()).collect();
        set.into_iter().map(String::from).collect()
    }

    fn unfinished(&self) -> usize {
        self.members.iter().filter(|m| !m.finished).count()
    }

    fn to_json(&self) -> Value {
        let hp = |h: &BTreeMap<String, f64>| Value::Object(h.iter().map(|(k, v)| (k.clone(), num(*v))).collect());
        let members: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                json!({
                    "index": m.index,
                    "seed": m.seed,
                    "dir": m.dir.display().to_string(),
                    "env_id": m.env_id,
                    "hyperparameters": hp(&m.hyperparameters),
                    "final_return": m.final_return.map(num),
                    "final_env_steps": m.last_step,
                    "total_env_steps": m.total_env_steps,
                    "best_return": m.best_return.map(num),
                    "first_step_at_threshold": m.first_at_threshold(),
                    "held_after_threshold": m.held(),
                    "evaluations_after_threshold": m.course.map(|c| c.after),
                    "lowest_after_threshold": m.course.and_then(|c| c.lowest_after).map(num),
                    "settled_step_at_threshold": m.course.and_then(|c| c.settled),
                    "threshold": m.threshold.map(num),
                    "finished": m.finished,
                })
            })
            .collect();
        let thresholds: BTreeMap<&str, Value> =
            self.members.iter().map(|m| (m.env_id.as_str(), m.threshold.map_or(Value::Null, num))).collect();
        let size = self.all.summary.n;
        let mut out = json!({
            "metric": self.metric,
            "at": self.at,
            "size": size,
            "members_total": self.members.len(),
            "unfinished": self.unfinished(),
            "threshold": self.common_threshold().map(num),
            "thresholds": thresholds,
            "solved": self.all.solved,
            "solved_fraction": self.all.solved.filter(|_| size > 0).map(|k| num(k as f64 / size as f64)),
            "reached": self.all.reached,
            "held": self.all.held,
            "iqm": num(self.all.summary.iqm.point),
            "iqm_ci": ci(&self.all.summary.iqm),
            "mean": num(self.all.summary.mean.point),
            "mean_ci": ci(&self.all.summary.mean),
            "median": num(self.all.summary.median.point),
            "median_ci": ci(&self.all.summary.median),
            "strata": self.strata(),
            "bootstrap_resamples": stats::BOOTSTRAP_RESAMPLES,
            "missing_members": self.missing,
            "members": members,
        });
        if !self.groups.is_empty() {
            out["groups"] = self
                .groups
                .iter()
                .map(|(h, total, a)| {
                    json!({
                        "hyperparameters": hp(h),
                        "size": a.summary.n,
                        "members_total": total,
                        "iqm": num(a.summary.iqm.point),
                        "iqm_ci": ci(&a.summary.iqm),
                        "mean": num(a.summary.mean.point),
                        "mean_ci": ci(&a.summary.mean),
                        "median": num(a.summary.median.point),
                        "median_ci": ci(&a.summary.median),
                        "solved": a.solved,
                        "reached": a.reached,
                        "held": a.held,
                    })
                })
                .collect();
        }
        if let Some((best, schedule)) = &self.best_schedule {
            out["best_member"] = json!(best);
            out["best_schedule"] = schedule
                .iter()
                .map(|s| json!({"env_steps": s.env_steps, "member": s.member, "hyperparameters": hp(&s.hyperparameters)}))
                .collect();
        }
        out
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for source in &self.sources {
            match &source.record {
                Some(r) => {
                    let _ =
                        write!(out, "population {}: {} of {} members", source.dir.display(), r.members.len(), r.size);
                    if r.jobs > 1 {
                        let _ = write!(out, " (job {} of {})", r.job_index + 1, r.jobs);
                    }
                    if !r.sweep_keys.is_empty() {
                        let _ = write!(out, ", sweep of {}", r.sweep_keys.join(", "));
                    }
                    if r.pbt {
                        out.push_str(", PBT");
                    }
                    out.push('\n');
                }
                None => {
                    let _ = writeln!(out, "run {}", source.dir.display());
                }
            }
        }
        if !self.missing.is_empty() {
            let list: Vec<String> = self.missing.iter().map(|i| i.to_string()).collect();
            let _ = writeln!(out, "not in these directories (another job's?): members {}", list.join(", "));
        }
        let threshold = self.common_threshold();
        let as_of = self.at.map_or(String::new(), |at| format!(", as of {at} env steps (later rows left out)"));
        let _ = writeln!(out, "metric {}{as_of}", self.metric);
        if self.sources.iter().any(|s| s.record.as_ref().is_some_and(|r| r.pbt)) {
            out.push_str("hyperparameters: each member's starting values (PBT changed them: lineage.jsonl)\n");
        }
        out.push('\n');

        // The member table.
        let keys: BTreeSet<&str> =
            self.members.iter().flat_map(|m| m.hyperparameters.keys().map(String::as_str)).collect();
        let envs: BTreeSet<&str> = self.members.iter().map(|m| m.env_id.as_str()).collect();
        let mut header: Vec<String> = vec!["member".into(), "seed".into()];
        if envs.len() > 1 {
            header.push("env".into());
        }
        header.extend(keys.iter().map(|k| k.to_string()));
        header.push("final return".into());
        header.push("best".into());
        let at = threshold.map_or("threshold".into(), fmt_value);
        header.push(format!("first step ≥ {at}"));
        header.push("held after (lowest)".into());
        header.push(format!("settled ≥ {at} from"));
        header.push("finished".into());
        header.push("dir".into());
        let mut rows = vec![header];
        for m in &self.members {
            let mut row = vec![m.index.map_or("—".into(), |i| i.to_string()), m.seed.to_string()];
            if envs.len() > 1 {
                row.push(m.env_id.clone());
            }
            row.extend(keys.iter().map(|k| m.hyperparameters.get(*k).map_or("—".into(), |v| fmt_value(*v))));
            row.push(m.final_return.map_or("—".into(), fmt_return));
            row.push(m.best_return.map_or("—".into(), fmt_return));
            row.push(m.first_at_threshold().map_or("—".into(), |s| s.to_string()));
            row.push(match (m.held(), m.course.and_then(|c| c.lowest_after)) {
                (None, _) => "—".into(),
                (Some(held), lowest) => {
                    format!("{} ({})", if held { "yes" } else { "no" }, lowest.map_or("none after".into(), fmt_return))
                }
            });
            row.push(m.course.and_then(|c| c.settled).map_or("—".into(), |s| s.to_string()));
            row.push(if m.finished { "yes".into() } else { format!("no ({}/{})", m.last_step.unwrap_or(0), m.budget) });
            row.push(m.dir.display().to_string());
            rows.push(row);
        }
        out.push_str(&table(&rows));
        out.push('\n');

        // Aggregates.
        let strata = self.strata();
        let _ = writeln!(out, "all members{}: {}", strata_note(&strata), self.aggregate_line(&self.all));
        for (h, _, a) in &self.groups {
            let name: Vec<String> = h.iter().map(|(k, v)| format!("{k} = {}", fmt_value(*v))).collect();
            let _ = writeln!(out, "{}: {}", name.join(", "), self.aggregate_line(a));
        }
        let unfinished = self.unfinished();
        if unfinished > 0 {
            let _ = writeln!(
                out,
                "{unfinished} unfinished member{} left out of the aggregates (finished \"no\" above)",
                if unfinished == 1 { "" } else { "s" }
            );
        }
        if self.all.solved.is_none() {
            let without: BTreeSet<&str> =
                self.members.iter().filter(|m| m.threshold.is_none()).map(|m| m.env_id.as_str()).collect();
            let without: Vec<&str> = without.into_iter().collect();
            let _ = writeln!(
                out,
                "solved: unavailable: {} has no reward threshold; pass --threshold X",
                without.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "[95% CI]: percentile bootstrap, {} resamples of the members{}",
            stats::BOOTSTRAP_RESAMPLES,
            if strata.len() > 1 { ", stratified by env" } else { "" }
        );

        if let Some((best, schedule)) = &self.best_schedule {
            let m = self.members.iter().find(|m| m.index == Some(*best)).expect("the best member is a member");
            let _ = writeln!(
                out,
                "\nbest member's hyperparameter schedule (member {best}, seed {}, final return {}):",
                m.seed,
                m.final_return.map_or("—".into(), fmt_return)
            );
            for s in schedule {
                let values: Vec<String> =
                    s.hyperparameters.iter().map(|(k, v)| format!("{k} = {}", fmt_value(*v))).collect();
                let _ = writeln!(
                    out,
                    "  from {} env steps: {} (weights trained by member {})",
                    s.env_steps,
                    if values.is_empty() { "(unknown)".into() } else { values.join(", ") },
                    s.member
                );
            }
        }
        out
    }

    fn aggregate_line(&self, a: &Aggregate) -> String {
        let s = &a.summary;
        if s.n == 0 {
            return "no finished members".into();
        }
        let est = |e: &Estimate| format!("{} [{}, {}]", fmt_return(e.point), fmt_return(e.lo), fmt_return(e.hi));
        let solved = match (a.solved, a.reached, a.held) {
            (Some(k), Some(r), Some(h)) => {
                format!(
                    "solved {k}/{} ({:.0}%), reached {r}/{n}, held {h}/{n}",
                    s.n,
                    100.0 * k as f64 / s.n as f64,
                    n = s.n
                )
            }
            _ => "solved —".into(),
        };
        format!("n = {}, IQM {}, mean {}, median {}, {solved}", s.n, est(&s.iqm), est(&s.mean), est(&s.median))
    }
}

/// An error naming two of `dirs` that are one directory (its members would be counted twice).
fn refuse_repeats(dirs: &[PathBuf]) -> Result<()> {
    let mut canonical: HashMap<PathBuf, &Path> = HashMap::new();
    for dir in dirs {
        if let Ok(c) = std::fs::canonicalize(dir)
            && let Some(first) = canonical.insert(c, dir)
        {
            bail!("{} and {} are the same directory: it would be counted twice", first.display(), dir.display());
        }
    }
    Ok(())
}

/// X (the runs given first) against Y (`--against`): [`stats::compare`] of their finished members' final
/// returns, stratified by env.
struct Versus {
    strata: Vec<String>,
    comparison: Comparison,
}

/// The comparison of two reports, or an error where their finished members do not cover the same envs.
fn compare(x: &Report, y: &Report) -> Result<Versus> {
    let (sx, sy) = (x.strata(), y.strata());
    anyhow::ensure!(!sx.is_empty(), "no finished member in the runs given first: nothing to compare");
    anyhow::ensure!(!sy.is_empty(), "no finished member in the --against runs: nothing to compare");
    if sx != sy {
        let only =
            |a: &[String], b: &[String]| -> Vec<String> { a.iter().filter(|e| !b.contains(e)).cloned().collect() };
        let (ox, oy) = (only(&sx, &sy), only(&sy, &sx));
        let mut parts = Vec::new();
        if !ox.is_empty() {
            parts.push(format!("{} only in the runs given first", ox.join(", ")));
        }
        if !oy.is_empty() {
            parts.push(format!("{} only in the --against runs", oy.join(", ")));
        }
        bail!(
            "the two sets' finished members cover different envs ({}): they are compared env by env",
            parts.join("; ")
        );
    }
    let values = |r: &Report| -> Vec<Vec<f64>> {
        sx.iter()
            .map(|env| {
                r.members
                    .iter()
                    .filter(|m| m.finished && m.env_id == *env)
                    .map(|m| m.final_return.expect("a finished member has a final return"))
                    .collect()
            })
            .collect()
    };
    Ok(Versus { comparison: stats::compare(&values(x), &values(y)), strata: sx })
}

impl Versus {
    fn to_json(&self) -> Value {
        let c = &self.comparison;
        json!({
            "probability_of_improvement": num(c.improvement.point),
            "probability_of_improvement_ci": ci(&c.improvement),
            "iqm_difference": num(c.iqm_difference.point),
            "iqm_difference_ci": ci(&c.iqm_difference),
            "strata": self.strata,
            "bootstrap_resamples": stats::BOOTSTRAP_RESAMPLES,
        })
    }

    fn text(&self, x: &Report, y: &Report) -> String {
        let c = &self.comparison;
        let (p, d) = (&c.improvement, &c.iqm_difference);
        format!(
            "X against Y{}: the final {} of the finished members, X n = {}, Y n = {}\n  \
             probability of improvement P(X > Y) {:.2} [{:.2}, {:.2}]   (a run of X above a run of Y; ties half; 0.5: \
             neither is better)\n  \
             IQM difference X − Y {} [{}, {}]\n\
             [95% CI]: percentile bootstrap, {} resamples of X's and Y's members independently{}\n",
            strata_note(&self.strata),
            x.metric,
            x.all.summary.n,
            y.all.summary.n,
            p.point,
            p.lo,
            p.hi,
            fmt_signed(d.point),
            fmt_signed(d.lo),
            fmt_signed(d.hi),
            stats::BOOTSTRAP_RESAMPLES,
            if self.strata.len() > 1 { ", stratified by env; P averaged over envs" } else { "" }
        )
    }
}

/// IQM, mean and median (stratified by env) and the solved count of the finished ones of `members`.
fn aggregate<'a>(members: impl Iterator<Item = &'a Member>) -> Aggregate {
    let mut strata: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut counts = Some((0, 0, 0));
    for m in members.filter(|m| m.finished) {
        let r = m.final_return.expect("a finished member has a final return");
        strata.entry(&m.env_id).or_default().push(r);
        counts = match (counts, m.threshold, m.held()) {
            (Some((k, reached, held)), Some(t), h) => {
                Some((k + usize::from(r >= t), reached + usize::from(h.is_some()), held + usize::from(h == Some(true))))
            }
            _ => None,
        };
    }
    let strata: Vec<Vec<f64>> = strata.into_values().collect();
    Aggregate {
        summary: stats::summarize(&strata),
        solved: counts.map(|c| c.0),
        reached: counts.map(|c| c.1),
        held: counts.map(|c| c.2),
    }
}

/// The best finished member of a population with a PBT lineage, and whose hyperparameters its weights were
/// trained with since env step 0: from the end, its own stretch back to its last exploit; there it copied
/// `source`'s weights, so before that the history is `source`'s (back to `source`'s last exploit before then),
/// and so on to a member that was never replaced before, which started with its `population.json` values.
fn best_schedule(sources: &[Source], members: &[Member]) -> Option<(usize, Vec<Segment>)> {
    let best = members
        .iter()
        .filter(|m| m.finished && !sources[m.source].lineage.is_empty() && m.index.is_some())
        .max_by(|a, b| {
            let (ra, rb) = (a.final_return.unwrap_or(f64::NEG_INFINITY), b.final_return.unwrap_or(f64::NEG_INFINITY));
            // Ties go to the lower index.
            ra.total_cmp(&rb).then(b.index.cmp(&a.index))
        })?;
    let source = &sources[best.source];
    let start = |member: usize| {
        source
            .record
            .as_ref()
            .and_then(|r| r.members.iter().find(|m| m.index == member))
            .map(|m| m.hyperparameters.clone())
            .unwrap_or_default()
    };
    let index = best.index.expect("filtered to population members");
    Some((index, schedule(&source.lineage, index, start)))
}

/// [`best_schedule`]'s walk for `member`, in chronological order.
fn schedule(lineage: &[LineageEvent], member: usize, start: impl Fn(usize) -> BTreeMap<String, f64>) -> Vec<Segment> {
    let mut segments = Vec::new();
    let (mut current, mut before) = (member, u64::MAX);
    loop {
        let last = lineage.iter().filter(|e| e.member == current && e.env_steps < before).max_by_key(|e| e.env_steps);
        match last {
            Some(e) => {
                segments.push(Segment {
                    env_steps: e.env_steps,
                    member: current,
                    hyperparameters: e.hyperparameters.clone(),
                });
                (current, before) = (e.source, e.env_steps);
            }
            None => {
                segments.push(Segment { env_steps: 0, member: current, hyperparameters: start(current) });
                break;
            }
        }
    }
    segments.reverse();
    segments
}

/// A number for JSON: `null` where it is not finite (no finished members).
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

fn ci(e: &Estimate) -> Value {
    json!([num(e.lo), num(e.hi)])
}

fn strata_note(strata: &[String]) -> String {
    if strata.is_empty() { String::new() } else { format!(" ({})", strata.join(", ")) }
}

/// A return as printed: one decimal, or more where it would otherwise read as 0.
fn fmt_return(x: f64) -> String {
    if x != 0.0 && x.abs() < 0.1 { format!("{x:.4}") } else { format!("{x:.1}") }
}

/// [`fmt_return`] with its sign always shown (a difference).
fn fmt_signed(x: f64) -> String {
    let s = fmt_return(x);
    if x > 0.0 { format!("+{s}") } else { s }
}

/// A hyperparameter or threshold: Rust's shortest exact decimal (`0.0003`, `475`), or 4 significant digits
/// where that is long (a random sweep's `4.501e-4`; `--json` has every digit).
fn fmt_value(x: f64) -> String {
    let exact = format!("{x}");
    if exact.len() <= 9 { exact } else { format!("{x:.3e}") }
}

/// Rows as columns separated by two spaces, the last column left-aligned, the others right-aligned.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, s)| {
                let pad = " ".repeat(widths[c] - s.chars().count());
                if c + 1 == columns { s.clone() } else { format!("{pad}{s}") }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(env_steps: u64, member: usize, source: usize, lr: f64) -> LineageEvent {
        LineageEvent { env_steps, member, source, hyperparameters: BTreeMap::from([("lr".to_string(), lr)]) }
    }

    #[test]
    fn schedules_follow_the_weights_back_through_exploits() {
        let start = |m: usize| BTreeMap::from([("lr".to_string(), [1.0, 2.0, 3.0][m])]);
        let lineage = vec![event(100, 2, 0, 1.5), event(200, 1, 2, 1.8), event(200, 0, 1, 2.5), event(300, 2, 1, 2.2)];
        // Member 2: replaced at 300 by member 1, which was replaced at 200 by member 2, which was replaced at 100
        // by member 0, never replaced before 100.
        let s = schedule(&lineage, 2, start);
        let got: Vec<(u64, usize, f64)> = s.iter().map(|s| (s.env_steps, s.member, s.hyperparameters["lr"])).collect();
        assert_eq!(got, vec![(0, 0, 1.0), (100, 2, 1.5), (200, 1, 1.8), (300, 2, 2.2)]);
        // Never replaced: its start values alone.
        let got = schedule(&[], 1, start);
        assert_eq!(got, vec![Segment { env_steps: 0, member: 1, hyperparameters: start(1) }]);
    }

    #[test]
    fn values_print_short() {
        assert_eq!(fmt_value(475.0), "475");
        assert_eq!(fmt_value(-0.5), "-0.5");
        assert_eq!(fmt_value(3e-4), "0.0003");
        assert_eq!(fmt_value(0.0004500932091431611), "4.501e-4");
    }

    #[test]
    fn tables_align() {
        let t = table(&[vec!["a".into(), "bb".into(), "dir".into()], vec!["100".into(), "1".into(), "x/y".into()]]);
        assert_eq!(t, "  a  bb  dir\n100   1  x/y\n");
    }
}
