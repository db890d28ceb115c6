//! Deterministic evaluation: run the greedy policy for whole episodes and report the returns.
use flotilla_algorithms::{ActMode, ActOutput, Policy};
use flotilla_envs::env_actions::EnvActions;
use flotilla_envs::{EnvRole, make_vector};
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
}

impl EvalResult {
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
pub fn evaluate(agent: &mut dyn Policy, env: &EnvConfig, episodes: usize, seed: u64) -> Result<EvalResult> {
    let kwargs = env.registry_kwargs()?;
    let mut envs = make_vector(&env.id, &kwargs, episodes, EnvRole::Evaluation)?;
    let action_space = envs.action_space().clone();
    let mut obs = envs.reset(Some(seed))?.to_buf();
    let mut done = vec![false; episodes];
    let (mut returns, mut lengths) = (vec![0.0; episodes], vec![0usize; episodes]);
    let mut out = ActOutput::default();
    let mut env_actions = EnvActions::default();
    let mut left = episodes;
    while left > 0 {
        agent.act(obs.as_ref(), ActMode::Deterministic, &mut out)?;
        let step = envs.step(&env_actions.convert(&action_space, &out.actions))?;
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
    Ok(EvalResult { returns, lengths })
}
