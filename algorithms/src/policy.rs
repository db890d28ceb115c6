//! The acting half of an agent: batched observations in, actions out.
//!
//! ```text
//! let mut out = ActOutput::default();
//! loop {
//!     policy.act(envs.observations(), ActMode::Explore, &mut out)?;   // ε-greedy, sampled, or noisy
//!     envs.step(&to_env_actions(&out.actions))?;
//! }
//! ```
use flotilla_core::ObsRef;

use crate::Result;

/// How to pick actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActMode {
    /// The behaviour policy used to collect data: sampling (PPO, A2C), ε-greedy (DQN), action noise (DDPG, TD3).
    Explore,
    /// The greedy / mean action, for evaluation.
    Deterministic,
}

/// What a policy produced for a batch of `rows` observations. Buffers are reused between calls; a field an
/// algorithm does not produce is left empty.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ActOutput {
    /// Actions, row-major: one f32 index per row for discrete spaces, `D` values for continuous ones (for
    /// Gaussian policies the unclipped sample; clip to the bounds before stepping the env).
    pub actions: Vec<f32>,
    /// Behaviour log-probability of each row's action (stochastic policies).
    pub log_probs: Vec<f32>,
    /// `V(obs)` per row (actor-critics).
    pub values: Vec<f32>,
    /// `Q(obs, ·)`, `rows × n_actions` (value-based policies).
    pub q_values: Vec<f32>,
}

/// Batched action selection.
pub trait Policy {
    /// Flattened observation size.
    fn obs_dim(&self) -> usize;
    /// f32 values per action: 1 for discrete actions, `D` for boxes.
    fn act_dim(&self) -> usize;
    /// Act on `obs` (`rows × obs_dim`, row-major, in the observation space's dtype), filling `out`.
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()>;
}

/// The floats of `obs`, for networks that take f32 observations (MLPs): frames are refused with an error naming
/// `algorithm`, never converted silently.
pub fn f32_obs<'a>(algorithm: &'static str, obs: ObsRef<'a>) -> Result<&'a [f32]> {
    obs.as_f32().ok_or_else(|| crate::Error::UnsupportedSpace {
        which: "observation",
        algorithm,
        detail: format!("{:?} observations; this network takes f32 vectors", obs.dtype()),
    })
}
