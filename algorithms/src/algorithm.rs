//! The learning half of an agent: observe transitions, update when there is enough data, save everything.
//!
//! ```text
//! let mut obs = envs.reset(Some(seed))?.to_vec();
//! while progress.env_steps < progress.total_env_steps {
//!     agent.act(&obs, ActMode::Explore, &mut out)?;
//!     let step = envs.step(..)?;                         // same-step auto-reset
//!     agent.observe(&Transition { obs: &obs, act: &out, rewards, terminated, truncated, next_obs })?;
//!     progress.env_steps += n_envs;
//!     if let Some(metrics) = agent.update(&progress)? { log(metrics) }   // PPO: full rollout; DQN: train_freq
//!     obs = step.obs;
//! }
//! ```
use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::params::FlatParams;
use crate::policy::{ActOutput, Policy};
use crate::{Metrics, Result};

/// One vectorised env step, as the learner saw it. All slices are row-major over `n_envs` rows.
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    /// Observations the policy acted on.
    pub obs: &'a [f32],
    /// What `Policy::act` returned for them (actions, and log-probs/values where the algorithm makes them).
    pub act: &'a ActOutput,
    /// Rewards.
    pub rewards: &'a [f32],
    /// The episode reached a terminal state: do not bootstrap.
    pub terminated: &'a [bool],
    /// The episode was cut by a time limit: bootstrap from `next_obs`.
    pub truncated: &'a [bool],
    /// The observation that truly followed each row: the final observation where an episode ended (not the
    /// auto-reset one), else the next step's observation.
    pub next_obs: &'a [f32],
}

/// Where training stands, for schedules (learning-rate annealing, ε decay, β annealing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Env steps taken so far (all envs), including the step just observed.
    pub env_steps: u64,
    /// The training budget.
    pub total_env_steps: u64,
}

impl Progress {
    /// `1 − env_steps / total`, clamped to [0, 1] (SB3's `progress_remaining`).
    pub fn remaining(&self) -> f64 {
        (1.0 - self.env_steps as f64 / self.total_env_steps.max(1) as f64).clamp(0.0, 1.0)
    }
}

/// A learning algorithm: a [`Policy`] that also learns from what it observes and can save its whole state.
pub trait Algorithm: Policy {
    /// Short name, as in configs (`"ppo"`, `"dqn"`, ...).
    fn name(&self) -> &'static str;
    /// Record one vectorised step (into a rollout or a replay buffer).
    fn observe(&mut self, step: &Transition<'_>) -> Result<()>;
    /// Learn if it is time to (a full rollout, every `train_freq` steps after `learning_starts`, ...);
    /// returns the metrics of the updates made, `None` if none were.
    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>>;
    /// Everything needed to continue training exactly: weights, optimiser moments, target networks, replay
    /// contents and priorities, schedule counters, RNG streams.
    fn checkpoint(&self) -> Result<Checkpoint>;
    /// Restore a [`Algorithm::checkpoint`] of an agent built with the same spaces and config.
    fn restore(&mut self, checkpoint: &mut Checkpoint) -> Result<()>;
    /// The parameters acting needs (what a parameter broadcast sends and `save_weights` writes).
    fn policy_params(&self) -> &FlatParams;
    /// Let acting schedules (DQN's ε) follow the learner's progress: actors, which never call
    /// [`Algorithm::update`], call this between chunks. Policies without such schedules ignore it.
    fn set_progress(&mut self, progress: &Progress) {
        let _ = progress;
    }
    /// Overwrite the acting parameters with `values` (a parameter broadcast, in [`Algorithm::policy_params`]'s
    /// layout). Actors call this between chunks.
    fn load_policy_params(&mut self, values: &[f32]) -> Result<()> {
        let params = self.policy_params();
        if values.len() as i64 != params.numel() {
            return Err(crate::Error::BadLength {
                what: "broadcast parameters".into(),
                got: values.len(),
                expected: params.numel() as usize,
            });
        }
        // The flat leaf shares storage with every view; copy in place without recording autograd.
        let mut flat = params.flat().shallow_clone();
        let src = tch::Tensor::from_slice(values).to_device(flat.device());
        tch::no_grad(|| flat.copy_(&src));
        Ok(())
    }
    /// Save the policy weights alone (what `flotilla eval` loads), atomically.
    fn save_weights(&self, path: &Path) -> Result<()>;
    /// Load weights saved by [`Algorithm::save_weights`].
    fn load_weights(&mut self, path: &Path) -> Result<()>;
}
