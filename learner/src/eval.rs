//! Deterministic evaluation: run the greedy policy for whole episodes and report the returns.
use flotilla_algorithms::{ActMode, ActOutput, Memory, Policy};
use flotilla_envs::env_actions::EnvActions;
use flotilla_envs::{EnvRole, VectorEnv};
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::config::EnvConfig;

/// Returns and lengths of evaluation episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Undiscounted return of each episode.
    pub returns: Vec<f64>,
    /// Length of each episode.
    pub lengths: Vec<usize>,
    /// A multi-task run's tasks: each one's name and how many of the episodes (in order) were its.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<(String, usize)>,
}

impl EvalResult {
    /// Each task's name and mean return (empty for a single-task run).
    pub fn task_means(&self) -> Vec<(String, f64)> {
        let mut at = 0;
        self.tasks
            .iter()
            .map(|(name, n)| {
                let mean = self.returns[at..at + n].iter().sum::<f64>() / (*n).max(1) as f64;
                at += n;
                (name.clone(), mean)
            })
            .collect()
    }

    /// Mean return.
    pub fn mean(&self) -> f64 {
        self.returns.iter().sum::<f64>() / self.returns.len() as f64
    }

    /// Population standard deviation of the returns.
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.returns.iter().map(|r| (r - m).powi(2)).sum::<f64>() / self.returns.len() as f64).sqrt()
    }
}

/// Run `episodes` episodes, one per env of a batch built for evaluation (env `i` reset with `seed + i`; for
/// Atari that means whole games, unclipped scores), acting deterministically in one batch per step, and return
/// each env's first episode. Episodes end on termination or the env's time limit; an env that has finished
/// keeps stepping with the batch, but its later episodes are not counted.
/// A multi-task run evaluates every task this way in turn, `episodes` each (same seeds), and reports all of
/// them, with each task's share in [`EvalResult::tasks`].
pub fn evaluate(agent: &mut dyn Policy, env: &EnvConfig, episodes: usize, seed: u64) -> Result<EvalResult> {
    if env.tasks.is_empty() {
        return evaluate_on(agent, env.make_vector(episodes, EnvRole::Evaluation)?.as_mut(), episodes, seed);
    }
    let mut all = EvalResult { returns: Vec::new(), lengths: Vec::new(), tasks: Vec::new() };
    for (k, task) in env.tasks.iter().enumerate() {
        let mut envs = env.make_task_vector(k, episodes, EnvRole::Evaluation)?;
        let one = evaluate_on(agent, envs.as_mut(), episodes, seed)?;
        all.returns.extend(one.returns);
        all.lengths.extend(one.lengths);
        all.tasks.push((task.name.clone(), episodes));
    }
    Ok(all)
}

/// [`evaluate`] on a built batch of `episodes` envs.
fn evaluate_on(agent: &mut dyn Policy, envs: &mut dyn VectorEnv, episodes: usize, seed: u64) -> Result<EvalResult> {
    let action_space = envs.action_space().clone();
    let mut obs = envs.reset(Some(seed))?.to_buf();
    let mut done = vec![false; episodes];
    let (mut returns, mut lengths) = (vec![0.0; episodes], vec![0usize; episodes]);
    let mut out = ActOutput::default();
    let mut env_actions = EnvActions::default();
    let mut memory = Memory::new(agent, episodes);
    let mut left = episodes;
    while left > 0 {
        memory.act(agent, obs.as_ref(), ActMode::Deterministic, &mut out)?;
        let step = envs.step(&env_actions.convert(&action_space, &out.actions))?;
        memory.end_episodes(step.terminated, step.truncated);
        for ep in step.episodes {
            if !std::mem::replace(&mut done[ep.env_index], true) {
                returns[ep.env_index] = ep.episode_return;
                lengths[ep.env_index] = ep.length as usize;
                left -= 1;
            }
        }
        obs.clear();
        let same = obs.extend(step.obs);
        debug_assert!(same, "one dtype per batch");
    }
    Ok(EvalResult { returns, lengths, tasks: Vec::new() })
}
