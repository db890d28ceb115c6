//! A training run's progress, shared by the single-process [`Trainer`](crate::train::Trainer) and the
//! [`DistributedLearner`](crate::distributed::DistributedLearner): the counters and schedules
//! (`RunCounters`: evaluations, metrics rows, checkpoints), the metrics row ([`LogRow`]) with its CSV columns
//! and progress line, and what a finished run reports ([`TrainReport`]).
use flotilla_algorithms::Metrics;
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::config::{ExperimentConfig, TaskConfig};
use crate::eval::EvalResult;

/// One metrics row, written at each log interval.
#[derive(Debug, Clone)]
pub struct LogRow {
    /// Env steps so far (all envs).
    pub env_steps: u64,
    /// Updates so far.
    pub updates: u64,
    /// Training seconds so far (evaluation excluded).
    pub train_secs: f64,
    /// Env steps per training second over the last interval.
    pub sps: f64,
    /// Mean return of episodes finished in the last interval.
    pub episodic_return: Option<f64>,
    /// Mean length of those episodes.
    pub episodic_length: Option<f64>,
    /// Episodes finished so far.
    pub episodes: u64,
    /// A multi-task run: each task's name and the mean return of its episodes finished in the last interval.
    pub task_returns: Vec<(String, Option<f64>)>,
    /// The last update's metrics.
    pub update: Metrics,
    /// Evaluation run at this point, if any.
    pub eval: Option<EvalResult>,
}

impl LogRow {
    /// `(column, value)` pairs with CleanRL-style names, for the metrics CSV. A multi-task run's evaluations
    /// add `eval/<task>/mean_return` per task.
    pub fn columns(&self) -> Vec<(std::borrow::Cow<'static, str>, Option<f64>)> {
        let mut cols: Vec<(std::borrow::Cow<'static, str>, Option<f64>)> = [
            ("env_steps", Some(self.env_steps as f64)),
            ("updates", Some(self.updates as f64)),
            ("train_secs", Some(self.train_secs)),
            ("charts/sps", Some(self.sps)),
            ("charts/episodic_return", self.episodic_return),
            ("charts/episodic_length", self.episodic_length),
            ("charts/episodes", Some(self.episodes as f64)),
        ]
        .into_iter()
        .map(|(n, v)| (n.into(), v))
        .collect();
        for (task, mean) in &self.task_returns {
            cols.push((format!("charts/{task}/episodic_return").into(), *mean));
        }
        cols.extend(self.update.iter().map(|(n, v)| ((*n).into(), Some(*v))));
        cols.push(("eval/mean_return".into(), self.eval.as_ref().map(EvalResult::mean)));
        cols.push(("eval/std_return".into(), self.eval.as_ref().map(EvalResult::std)));
        for (task, mean) in self.eval.iter().flat_map(EvalResult::task_means) {
            cols.push((format!("eval/{task}/mean_return").into(), Some(mean)));
        }
        cols
    }
}

/// An evaluation during training.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Env steps when it ran.
    pub env_steps: u64,
    /// Training seconds when it ran.
    pub train_secs: f64,
    /// Its result.
    pub result: EvalResult,
}

/// What a finished training run reports.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Env steps taken.
    pub env_steps: u64,
    /// Updates made (calls to `Algorithm::update` that trained).
    pub updates: u64,
    /// Gradient steps taken (as the algorithms report them in `charts/gradient_steps`).
    pub gradient_steps: u64,
    /// Seconds spent collecting and updating.
    pub train_secs: f64,
    /// Of which, seconds inside updates.
    pub update_secs: f64,
    /// Of `update_secs`, seconds a distributed on-policy learner spent assembling batches (stacking chunks into
    /// the rollout, values of their final observations) before the update proper.
    pub assemble_secs: f64,
    /// Of `train_secs`, seconds a distributed learner waited for actors' data (0 for single-process training).
    pub wait_secs: f64,
    /// Evaluations during training, in order (the last one is the final policy's).
    pub evals: Vec<EvalPoint>,
    /// A distributed learner: env steps actors delivered into its queue that the run ended without taking in
    /// (not counted in `env_steps`). Every env step an actor delivered is in one of the two — except, for now,
    /// with the batch-assembly thread, whose last partial batch is dropped uncounted at the end of a run.
    pub untrained_env_steps: u64,
}

impl TrainReport {
    /// The first evaluation whose mean return reached `threshold`.
    pub fn first_reaching(&self, threshold: f64) -> Option<&EvalPoint> {
        self.course(threshold).first_index.map(|i| &self.evals[i])
    }

    /// The evaluations' mean returns against `threshold`: reached, held, settled.
    pub fn course(&self, threshold: f64) -> crate::stats::Course {
        let points: Vec<(u64, f64)> = self.evals.iter().map(|e| (e.env_steps, e.result.mean())).collect();
        crate::stats::Course::of(&points, threshold)
    }

    /// The final policy's evaluation.
    pub fn final_eval(&self) -> &EvalResult {
        &self.evals.last().expect("training always ends with an evaluation").result
    }
}

/// A training run's progress counters and schedules (evaluation, log rows, checkpoints), shared by the
/// single-process [`Trainer`] and the distributed learner; with the agent (and the envs) they make up a
/// checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RunCounters {
    pub(crate) env_steps: u64,
    pub(crate) updates: u64,
    pub(crate) gradient_steps: u64,
    pub(crate) episodes: u64,
    pub(crate) train_secs: f64,
    pub(crate) update_secs: f64,
    /// Seconds a distributed learner spent waiting for data (absent in checkpoints of older runs: 0).
    #[serde(default)]
    pub(crate) wait_secs: f64,
    /// Seconds a distributed on-policy learner spent stacking chunks into its rollout (older runs: 0).
    #[serde(default)]
    pub(crate) assemble_secs: f64,
    /// Env steps and train seconds at the last log row.
    last_log: (u64, f64),
    next_eval: u64,
    next_checkpoint: u64,
    /// Sums over episodes finished since the last log row: return, length, count.
    interval_episodes: (f64, f64, u64),
    /// The same per task of a multi-task run: return, count (older runs: none).
    #[serde(default)]
    interval_tasks: Vec<(f64, u64)>,
    pub(crate) evals: Vec<EvalPoint>,
}

/// Whether `now` has reached `next`; if so, moves `next` past `now` by whole `interval`s.
fn passed(next: &mut u64, now: u64, interval: u64) -> bool {
    if now < *next {
        return false;
    }
    while *next <= now {
        *next = next.saturating_add(interval);
    }
    true
}

impl RunCounters {
    /// A run at its start: the first evaluation and checkpoint one interval in (never for interval 0).
    pub(crate) fn new(config: &ExperimentConfig) -> Self {
        let every = |n: u64| if n > 0 { n } else { u64::MAX };
        RunCounters {
            next_eval: every(config.eval.interval_steps),
            next_checkpoint: every(config.checkpoint.interval_steps),
            ..Default::default()
        }
    }

    pub(crate) fn count_episode(&mut self, episode_return: f64, length: u64) {
        self.interval_episodes.0 += episode_return;
        self.interval_episodes.1 += length as f64;
        self.interval_episodes.2 += 1;
        self.episodes += 1;
    }

    /// Count `count` finished episodes of `task` (multi-task runs) by their summed returns.
    pub(crate) fn count_task_return(&mut self, task: usize, returns: f64, count: u64) {
        if self.interval_tasks.len() <= task {
            self.interval_tasks.resize(task + 1, (0.0, 0));
        }
        self.interval_tasks[task].0 += returns;
        self.interval_tasks[task].1 += count;
    }

    /// Count `count` finished episodes by their summed returns and lengths (other learners' too).
    pub(crate) fn count_episodes(&mut self, returns: f64, lengths: f64, count: u64) {
        self.interval_episodes.0 += returns;
        self.interval_episodes.1 += lengths;
        self.interval_episodes.2 += count;
        self.episodes += count;
    }

    /// Count an update that produced `m`.
    pub(crate) fn count_update(&mut self, m: &Metrics) {
        self.updates += 1;
        self.gradient_steps += m.get("charts/gradient_steps").unwrap_or(0.0) as u64;
    }

    /// Whether the budget is spent.
    pub(crate) fn done(&self, config: &ExperimentConfig) -> bool {
        self.env_steps >= config.run.total_env_steps
    }

    /// Whether an evaluation is due now (at each interval, and at the end of the budget); schedules the next.
    pub(crate) fn eval_due(&mut self, config: &ExperimentConfig) -> bool {
        let due = passed(&mut self.next_eval, self.env_steps, config.eval.interval_steps);
        due || self.done(config)
    }

    /// Whether [`RunCounters::eval_due`] would say an evaluation is due now (it schedules nothing).
    pub(crate) fn eval_pending(&self, config: &ExperimentConfig) -> bool {
        self.env_steps >= self.next_eval || self.done(config)
    }

    /// The seed of the next evaluation: evaluation k seeds its envs from seed + k · episodes, so each one
    /// starts from fresh states.
    pub(crate) fn eval_seed(&self, config: &ExperimentConfig) -> u64 {
        config.eval.seed + (self.evals.len() * config.eval.episodes) as u64
    }

    /// Whether [`RunCounters::checkpoint_due`] would say a checkpoint is due now (it schedules nothing).
    pub(crate) fn checkpoint_pending(&self) -> bool {
        self.env_steps >= self.next_checkpoint
    }

    /// Whether a checkpoint is due now; schedules the next.
    pub(crate) fn checkpoint_due(&mut self, config: &ExperimentConfig) -> bool {
        passed(&mut self.next_checkpoint, self.env_steps, config.checkpoint.interval_steps)
    }

    /// Whether a metrics row is due: with an evaluation, at the end, or a log interval after the last row.
    pub(crate) fn log_due(&self, config: &ExperimentConfig, evaluated: bool) -> bool {
        evaluated || self.done(config) || self.env_steps - self.last_log.0 >= config.metrics.log_interval_steps
    }

    /// The metrics row for now, with the last update's metrics and the evaluation just run; starts the next
    /// interval.
    pub(crate) fn log_row(&mut self, update: Metrics, eval: Option<EvalResult>, tasks: &[TaskConfig]) -> LogRow {
        let sps = (self.env_steps - self.last_log.0) as f64 / (self.train_secs - self.last_log.1).max(1e-9);
        let (ret, len, count) = self.interval_episodes;
        let mean = |sum: f64| (count > 0).then(|| sum / count as f64);
        let task_returns = tasks
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let (sum, n) = self.interval_tasks.get(k).copied().unwrap_or((0.0, 0));
                (t.name.clone(), (n > 0).then(|| sum / n as f64))
            })
            .collect();
        self.interval_tasks.clear();
        let row = LogRow {
            env_steps: self.env_steps,
            updates: self.updates,
            train_secs: self.train_secs,
            sps,
            episodic_return: mean(ret),
            episodic_length: mean(len),
            episodes: self.episodes,
            task_returns,
            update,
            eval,
        };
        self.interval_episodes = (0.0, 0.0, 0);
        self.last_log = (self.env_steps, self.train_secs);
        row
    }

    pub(crate) fn report(&self) -> TrainReport {
        TrainReport {
            env_steps: self.env_steps,
            updates: self.updates,
            gradient_steps: self.gradient_steps,
            train_secs: self.train_secs,
            update_secs: self.update_secs,
            wait_secs: self.wait_secs,
            assemble_secs: self.assemble_secs,
            evals: self.evals.clone(),
            untrained_env_steps: 0,
        }
    }
}

pub(crate) fn log_progress(row: &LogRow) {
    let ret = row.episodic_return.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let eval = row.eval.as_ref().map(|e| format!(" | eval {:.1} ± {:.1}", e.mean(), e.std())).unwrap_or_default();
    // The algorithm's first three losses, named without their `losses/` prefix.
    let losses: Vec<String> = row
        .update
        .iter()
        .filter_map(|(name, v)| name.strip_prefix("losses/").map(|n| format!("{n} {v:.4}")))
        .take(3)
        .collect();
    info!("steps {:>8} | return {ret:>6}{eval} | sps {:>7.0} | {}", row.env_steps, row.sps, losses.join(" "));
}
