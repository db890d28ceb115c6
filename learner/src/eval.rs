//! Deterministic evaluation: run the greedy policy for whole episodes and report the returns.
use flotilla_algorithms::{ActMode, ActOutput, Policy};
use flotilla_core::Env;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::actions::env_action;
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

/// Run `episodes` episodes, one per env copy (copy `i` reset with `seed + i`), acting deterministically in
/// one batch per step, and return their returns. Episodes end on termination or the env's time limit.
pub fn evaluate(agent: &mut dyn Policy, env: &EnvConfig, episodes: usize, seed: u64) -> Result<EvalResult> {
    let kwargs = env.registry_kwargs()?;
    let mut envs: Vec<Box<dyn Env>> =
        (0..episodes).map(|_| flotilla_envs::make(&env.id, &kwargs)).collect::<std::result::Result<_, _>>()?;
    let action_space = envs[0].action_space().clone();
    let obs_dim = envs[0].observation_space().flat_dim();
    let mut obs = Vec::with_capacity(episodes * obs_dim);
    for (i, e) in envs.iter_mut().enumerate() {
        let (o, _) = e.reset(Some(seed + i as u64))?;
        obs.push(o.as_f32().map(<[f32]>::to_vec).unwrap_or_default());
    }
    let mut active: Vec<usize> = (0..episodes).collect();
    let (mut returns, mut lengths) = (vec![0.0; episodes], vec![0usize; episodes]);
    let mut batch = Vec::with_capacity(episodes * obs_dim);
    let mut out = ActOutput::default();
    let mut clipped = Vec::new();
    let act_dim = agent.act_dim();
    while !active.is_empty() {
        batch.clear();
        for &i in &active {
            batch.extend_from_slice(&obs[i]);
        }
        agent.act(&batch, ActMode::Deterministic, &mut out)?;
        let mut still = Vec::with_capacity(active.len());
        for (row, &i) in active.iter().enumerate() {
            let a = &out.actions[row * act_dim..(row + 1) * act_dim];
            let step = envs[i].step(env_action(&action_space, a, &mut clipped))?;
            returns[i] += step.reward;
            lengths[i] += 1;
            if step.terminated || step.truncated {
                continue;
            }
            obs[i] = step.obs.as_f32().map(<[f32]>::to_vec).unwrap_or_default();
            still.push(i);
        }
        active = still;
    }
    Ok(EvalResult { returns, lengths })
}
