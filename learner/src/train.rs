//! Single-process training: step a `VecEnv` in this thread, collect rollouts, update, evaluate, log.
//!
//! ```text
//! reset envs (seed) ─► loop until total_env_steps:
//!     n_steps × { act (batched, no grad) ─► step envs ─► store; V(final obs) for truncated envs }
//!     V(last obs) ─► GAE ─► PPO update (progress = 1 − steps/total anneals lr and clip range)
//!     every log interval: metrics row + progress line; every eval interval: deterministic evaluation
//! ```
//! Wall-clock is split: `train_secs` counts collection and updates only, not evaluation, so speed numbers
//! compare with other libraries' training time.
use std::time::Instant;

use flotilla_algorithms::Metrics;
use flotilla_algorithms::ppo::{ActOutput, Ppo};
use flotilla_algorithms::rollout::Rollout;
use flotilla_envs::VecEnv;
use tracing::info;

use crate::Result;
use crate::actions::EnvActions;
use crate::config::{AlgorithmConfig, ExperimentConfig};
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
#[derive(Debug, Clone)]
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
    /// Updates made.
    pub updates: u64,
    /// Seconds spent collecting and updating.
    pub train_secs: f64,
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

/// Train as `config` says, calling `on_log` with each metrics row. Returns the trained agent and a report
/// whose last evaluation is of the final policy.
pub fn train(config: &ExperimentConfig, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<(Ppo, TrainReport)> {
    let AlgorithmConfig::Ppo(ppo_config) = &config.algorithm;
    crate::tune_allocator();
    let device = config.run.device.resolve()?;
    tch::set_num_threads(config.run.torch_threads.max(1) as i32);
    let seed = config.run.seed;
    let kwargs = config.env.registry_kwargs()?;
    let mut envs = VecEnv::make(&config.env.id, &kwargs, config.env.num_envs)?;
    let action_space = envs.action_space().clone();
    let mut agent = Ppo::new(envs.observation_space(), &action_space, ppo_config.clone(), device, seed)?;
    let (n_envs, n_steps) = (config.env.num_envs, ppo_config.n_steps);
    let mut rollout = Rollout::new(n_envs, n_steps, agent.obs_dim(), agent.act_dim());
    let (gamma, lambda) = (ppo_config.gamma as f32, ppo_config.gae_lambda as f32);

    let mut obs = envs.reset(Some(seed))?.to_vec();
    let mut out = ActOutput::default();
    let mut env_actions = EnvActions::default();
    let mut final_obs = Vec::new();
    let mut truncated_envs = Vec::new();

    let total = config.run.total_env_steps;
    let (mut env_steps, mut updates, mut episodes) = (0u64, 0u64, 0u64);
    let (mut ep_return_sum, mut ep_length_sum, mut ep_count) = (0.0f64, 0.0f64, 0u64);
    let mut train_secs = 0.0f64;
    let mut last_log = (0u64, 0.0f64);
    let mut next_eval = if config.eval.interval_steps > 0 { config.eval.interval_steps } else { u64::MAX };
    let mut evals = Vec::new();

    while env_steps < total {
        let started = Instant::now();
        rollout.clear();
        for _ in 0..n_steps {
            agent.act(&obs, false, &mut out)?;
            rollout.push_policy(&obs, &out.actions, &out.log_probs, &out.values)?;
            let step = envs.step(&env_actions.convert(&action_space, &out.actions))?;
            rollout.push_outcome(step.rewards, step.terminated, step.truncated)?;
            // Bootstrap truncated episodes from their true final observation, in one batched call.
            final_obs.clear();
            truncated_envs.clear();
            for i in 0..n_envs {
                if let (true, Some(o)) = (step.truncated[i] && !step.terminated[i], step.final_obs(i)) {
                    final_obs.extend_from_slice(o);
                    truncated_envs.push(i);
                }
            }
            for ep in step.episodes {
                ep_return_sum += ep.return_;
                ep_length_sum += ep.length as f64;
                ep_count += 1;
                episodes += 1;
            }
            obs.copy_from_slice(step.obs);
            if !truncated_envs.is_empty() {
                for (&i, v) in truncated_envs.iter().zip(agent.values(&final_obs)?) {
                    rollout.set_final_value(i, v);
                }
            }
            env_steps += n_envs as u64;
        }
        let last_values = agent.values(&obs)?;
        rollout.finish(&last_values, gamma, lambda)?;
        let progress_remaining = 1.0 - env_steps as f64 / total as f64;
        let metrics = agent.update(&rollout, progress_remaining)?;
        updates += 1;
        train_secs += started.elapsed().as_secs_f64();

        let done = env_steps >= total;
        let eval = if env_steps >= next_eval || done {
            while next_eval <= env_steps {
                next_eval = next_eval.saturating_add(config.eval.interval_steps);
            }
            // Each evaluation starts from fresh states: evaluation k seeds its envs from seed + k · episodes.
            let eval_seed = config.eval.seed + (evals.len() * config.eval.episodes) as u64;
            let result = evaluate(&mut agent, &config.env, config.eval.episodes, eval_seed)?;
            evals.push(EvalPoint { env_steps, train_secs, result: result.clone() });
            Some(result)
        } else {
            None
        };
        if eval.is_some() || done || env_steps - last_log.0 >= config.metrics.log_interval_steps {
            let sps = (env_steps - last_log.0) as f64 / (train_secs - last_log.1).max(1e-9);
            let mean = |sum: f64| (ep_count > 0).then(|| sum / ep_count as f64);
            let row = LogRow {
                env_steps,
                updates,
                train_secs,
                sps,
                episodic_return: mean(ep_return_sum),
                episodic_length: mean(ep_length_sum),
                episodes,
                update: metrics,
                eval,
            };
            log_progress(&row);
            on_log(&row)?;
            (ep_return_sum, ep_length_sum, ep_count) = (0.0, 0.0, 0);
            last_log = (env_steps, train_secs);
        }
    }
    Ok((agent, TrainReport { env_steps, updates, train_secs, evals }))
}

fn log_progress(row: &LogRow) {
    let fmt = |x: Option<f64>| x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let m = |name| row.update.get(name).map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
    match &row.eval {
        Some(e) => info!(
            "steps {:>8} | return {:>6} | eval {:.1} ± {:.1} | sps {:>7.0} | pg {} vf {} kl {}",
            row.env_steps,
            fmt(row.episodic_return),
            e.mean(),
            e.std(),
            row.sps,
            m("losses/policy_loss"),
            m("losses/value_loss"),
            m("losses/approx_kl")
        ),
        None => info!(
            "steps {:>8} | return {:>6} | sps {:>7.0} | pg {} vf {} kl {}",
            row.env_steps,
            fmt(row.episodic_return),
            row.sps,
            m("losses/policy_loss"),
            m("losses/value_loss"),
            m("losses/approx_kl")
        ),
    }
}
