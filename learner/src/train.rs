//! Single-process training: step a `VecEnv` in this thread, let the algorithm observe and update, evaluate,
//! log, checkpoint.
//!
//! ```text
//! reset envs (seed) ─► loop until total_env_steps:
//!     act (batched, exploring) ─► step envs (same-step auto-reset) ─► observe (obs, actions, rewards, flags,
//!     true next obs) ─► update if the algorithm is ready (PPO: full rollout; DQN: every train_freq steps)
//!     every log interval: metrics row + progress line; every eval interval: deterministic evaluation;
//!     every checkpoint interval: the whole state (agent, envs, counters) to RUN_DIR/checkpoint.safetensors
//! ```
//! Wall-clock is split: `train_secs` counts collection and updates only, not evaluation, so speed numbers
//! compare with other libraries' training time. A run resumed from a checkpoint continues bit for bit as if
//! it had never stopped (CPU, one torch thread).
use std::path::Path;
use std::time::Instant;

use flotilla_algorithms::{ActMode, ActOutput, Algorithm, Checkpoint, Metrics, Progress, Transition};
use flotilla_envs::{VecEnv, VecEnvSnapshot};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::Result;
use crate::actions::EnvActions;
use crate::config::ExperimentConfig;
use crate::eval::{EvalResult, evaluate};

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
    /// The last update's metrics.
    pub update: Metrics,
    /// Evaluation run at this point, if any.
    pub eval: Option<EvalResult>,
}

impl LogRow {
    /// `(column, value)` pairs with CleanRL-style names, for the metrics CSV.
    pub fn columns(&self) -> Vec<(&'static str, Option<f64>)> {
        let mut cols = vec![
            ("env_steps", Some(self.env_steps as f64)),
            ("updates", Some(self.updates as f64)),
            ("train_secs", Some(self.train_secs)),
            ("charts/sps", Some(self.sps)),
            ("charts/episodic_return", self.episodic_return),
            ("charts/episodic_length", self.episodic_length),
            ("charts/episodes", Some(self.episodes as f64)),
        ];
        cols.extend(self.update.iter().map(|(n, v)| (*n, Some(*v))));
        cols.push(("eval/mean_return", self.eval.as_ref().map(EvalResult::mean)));
        cols.push(("eval/std_return", self.eval.as_ref().map(EvalResult::std)));
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
    /// Evaluations during training, in order (the last one is the final policy's).
    pub evals: Vec<EvalPoint>,
}

impl TrainReport {
    /// The first evaluation whose mean return reached `threshold`.
    pub fn first_reaching(&self, threshold: f64) -> Option<&EvalPoint> {
        self.evals.iter().find(|e| e.result.mean() >= threshold)
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
    /// Env steps and train seconds at the last log row.
    last_log: (u64, f64),
    next_eval: u64,
    next_checkpoint: u64,
    /// Sums over episodes finished since the last log row: return, length, count.
    interval_episodes: (f64, f64, u64),
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

    /// The seed of the next evaluation: evaluation k seeds its envs from seed + k · episodes, so each one
    /// starts from fresh states.
    pub(crate) fn eval_seed(&self, config: &ExperimentConfig) -> u64 {
        config.eval.seed + (self.evals.len() * config.eval.episodes) as u64
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
    pub(crate) fn log_row(&mut self, update: Metrics, eval: Option<EvalResult>) -> LogRow {
        let sps = (self.env_steps - self.last_log.0) as f64 / (self.train_secs - self.last_log.1).max(1e-9);
        let (ret, len, count) = self.interval_episodes;
        let mean = |sum: f64| (count > 0).then(|| sum / count as f64);
        let row = LogRow {
            env_steps: self.env_steps,
            updates: self.updates,
            train_secs: self.train_secs,
            sps,
            episodic_return: mean(ret),
            episodic_length: mean(len),
            episodes: self.episodes,
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
            evals: self.evals.clone(),
        }
    }
}

/// A training run in progress: config, envs, agent, counters. [`Trainer::run`] advances it; a checkpoint
/// holds all of it.
pub struct Trainer {
    config: ExperimentConfig,
    envs: VecEnv,
    agent: Box<dyn Algorithm>,
    obs: Vec<f32>,
    counters: RunCounters,
    last_metrics: Metrics,
}

impl Trainer {
    /// Build envs and agent from `config` and reset the envs with the run's seed.
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        crate::tune_allocator();
        tch::set_num_threads(config.run.torch_threads.max(1) as i32);
        let device = config.run.device.resolve()?;
        let kwargs = config.env.registry_kwargs()?;
        let mut envs = VecEnv::make(&config.env.id, &kwargs, config.env.num_envs)?;
        let agent = crate::agent::build(config, envs.observation_space(), envs.action_space(), device)?;
        let obs = envs.reset(Some(config.run.seed))?.to_vec();
        let counters = RunCounters::new(config);
        Ok(Trainer { config: config.clone(), envs, agent, obs, counters, last_metrics: Metrics::default() })
    }

    /// Rebuild a trainer from `config` and a checkpoint written by [`Trainer::save_checkpoint`].
    pub fn resume(config: &ExperimentConfig, path: &Path) -> Result<Self> {
        let mut t = Self::new(config)?;
        let mut c = Checkpoint::load(path)?;
        t.agent.restore(&mut c)?;
        t.counters = c.meta("trainer.counters")?;
        let envs: VecEnvSnapshot = c.meta("trainer.envs")?;
        t.envs.restore(&envs)?;
        t.obs = c.take_f32("trainer.obs")?;
        Ok(t)
    }

    /// Write the whole state to `path`, atomically.
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let mut c = self.agent.checkpoint()?;
        c.put_meta("trainer.counters", &self.counters)?;
        c.put_meta("trainer.envs", &self.envs.snapshot()?)?;
        c.put_f32("trainer.obs", &self.obs);
        c.save(path)?;
        Ok(())
    }

    /// The agent.
    pub fn agent(&self) -> &dyn Algorithm {
        self.agent.as_ref()
    }

    /// Give up the trainer for its agent.
    pub fn into_agent(self) -> Box<dyn Algorithm> {
        self.agent
    }

    /// Env steps taken so far.
    pub fn env_steps(&self) -> u64 {
        self.counters.env_steps
    }

    /// What the run has done so far.
    pub fn report(&self) -> TrainReport {
        self.counters.report()
    }

    /// Train until `stop_at` env steps or the budget, whichever comes first, calling `on_log` with each metrics
    /// row and `on_checkpoint` at each checkpoint interval. Reaching the budget ends with an evaluation of the
    /// final policy.
    pub fn run(
        &mut self,
        stop_at: u64,
        on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
        on_checkpoint: &mut dyn FnMut(&Trainer) -> Result<()>,
    ) -> Result<()> {
        let total = self.config.run.total_env_steps;
        let n_envs = self.envs.num_envs();
        let obs_dim = self.envs.obs_dim();
        let action_space = self.envs.action_space().clone();
        let mut out = ActOutput::default();
        let mut env_actions = EnvActions::default();
        let mut next_obs = vec![0.0f32; self.obs.len()];
        while self.counters.env_steps < total.min(stop_at) {
            let started = Instant::now();
            self.agent.act(&self.obs, ActMode::Explore, &mut out)?;
            let step = self.envs.step(&env_actions.convert(&action_space, &out.actions))?;
            // The observation that truly followed: the final one where an episode ended, not the reset one.
            next_obs.copy_from_slice(step.obs);
            for i in 0..n_envs {
                if let Some(last) = step.final_obs(i) {
                    next_obs[i * obs_dim..(i + 1) * obs_dim].copy_from_slice(last);
                }
            }
            let c = &mut self.counters;
            for ep in step.episodes {
                c.count_episode(ep.return_, ep.length as u64);
            }
            let transition = Transition {
                obs: &self.obs,
                act: &out,
                rewards: step.rewards,
                terminated: step.terminated,
                truncated: step.truncated,
                next_obs: &next_obs,
            };
            self.agent.observe(&transition)?;
            self.obs.copy_from_slice(step.obs);
            c.env_steps += n_envs as u64;
            let progress = Progress { env_steps: c.env_steps, total_env_steps: total };
            let update_started = Instant::now();
            if let Some(m) = self.agent.update(&progress)? {
                c.count_update(&m);
                c.update_secs += update_started.elapsed().as_secs_f64();
                self.last_metrics = m;
            }
            c.train_secs += started.elapsed().as_secs_f64();
            self.after_step(on_log, on_checkpoint)?;
        }
        Ok(())
    }

    /// Evaluation, logging and checkpoints due after a step.
    fn after_step(
        &mut self,
        on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
        on_checkpoint: &mut dyn FnMut(&Trainer) -> Result<()>,
    ) -> Result<()> {
        let (config, c) = (&self.config, &mut self.counters);
        let eval = if c.eval_due(config) {
            let result = evaluate(self.agent.as_mut(), &config.env, config.eval.episodes, c.eval_seed(config))?;
            c.evals.push(EvalPoint { env_steps: c.env_steps, train_secs: c.train_secs, result: result.clone() });
            Some(result)
        } else {
            None
        };
        if c.log_due(config, eval.is_some()) {
            let row = c.log_row(self.last_metrics.clone(), eval);
            log_progress(&row);
            on_log(&row)?;
        }
        if c.checkpoint_due(config) {
            on_checkpoint(self)?;
        }
        Ok(())
    }
}

/// Train as `config` says, calling `on_log` with each metrics row. Returns the trained agent and a report
/// whose last evaluation is of the final policy.
pub fn train(
    config: &ExperimentConfig,
    on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
) -> Result<(Box<dyn Algorithm>, TrainReport)> {
    let mut trainer = Trainer::new(config)?;
    trainer.run(u64::MAX, on_log, &mut |_| Ok(()))?;
    let report = trainer.report();
    Ok((trainer.into_agent(), report))
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
