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
    /// Act on `obs` (`rows × obs_dim`, row-major, in the observation space's dtype), filling `out`. A
    /// recurrent policy refuses: it acts through [`Policy::act_with_state`] (callers hold a [`Memory`]).
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()>;
    /// Floats of recurrent state each env row carries (`[algorithm] recurrent`); 0, the default, for
    /// feed-forward policies.
    fn state_dim(&self) -> usize {
        0
    }
    /// Of each row's state, how many leading floats always lie in `[−1, 1]` (an LSTM's or a GRU's `h`; an
    /// LSTM's cell state after them is only finite): the learner refuses chunks whose initial state leaves
    /// that range. 0 for feed-forward policies.
    fn state_bounded(&self) -> usize {
        0
    }
    /// Act from each row's recurrent `state` (`rows × state_dim`: the state before this step, zeros where an
    /// episode starts), overwriting it with the state after. A feed-forward policy takes an empty `state`.
    fn act_with_state(&mut self, obs: ObsRef<'_>, state: &mut [f32], mode: ActMode, out: &mut ActOutput) -> Result<()> {
        if !state.is_empty() {
            return Err(crate::Error::length("recurrent state of a feed-forward policy", state.len(), 0));
        }
        self.act(obs, mode, out)
    }
}

/// What a caller that steps a batch of envs keeps for a policy with memory: each env's recurrent state, reset
/// where an episode ends. With a feed-forward policy it is empty and [`Memory::act`] is [`Policy::act`].
///
/// ```text
/// let mut memory = Memory::new(&policy, n_envs);
/// loop {
///     memory.act(&mut policy, obs, mode, &mut out)?;        // memory.initial_state(): the state before
///     let step = envs.step(..)?;
///     memory.end_episodes(step.terminated, step.truncated);  // zero the rows whose episode ended
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    dim: usize,
    state: Vec<f32>,
    before: Vec<f32>,
}

impl Memory {
    /// Zero state for `rows` envs of `policy`.
    pub fn new(policy: &dyn Policy, rows: usize) -> Self {
        let dim = policy.state_dim();
        Memory { dim, state: vec![0.0; dim * rows], before: vec![0.0; dim * rows] }
    }

    /// Floats of state per env (0: feed-forward).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Act on `obs` from the envs' states, moving them on (feed-forward: [`Policy::act`]).
    pub fn act(&mut self, policy: &mut dyn Policy, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        if self.dim == 0 {
            return policy.act(obs, mode, out);
        }
        self.before.copy_from_slice(&self.state);
        policy.act_with_state(obs, &mut self.state, mode, out)
    }

    /// Zero the state of every env whose episode ended (`terminated` or `truncated`): its next observation
    /// starts a new episode.
    pub fn end_episodes(&mut self, terminated: &[bool], truncated: &[bool]) {
        if self.dim == 0 {
            return;
        }
        for (k, row) in self.state.chunks_mut(self.dim).enumerate() {
            if terminated[k] || truncated[k] {
                row.fill(0.0);
            }
        }
    }

    /// The envs' states now (`rows × dim`): what the next [`Memory::act`] starts from.
    pub fn state(&self) -> &[f32] {
        &self.state
    }

    /// The envs' states before the last [`Memory::act`]: a one-step chunk's initial state.
    pub fn initial_state(&self) -> &[f32] {
        if self.dim == 0 { &[] } else { &self.before }
    }

    /// Restore states saved from [`Memory::state`] (a checkpoint); a wrong length is an error naming it.
    pub fn set_state(&mut self, state: Vec<f32>) -> Result<()> {
        if state.len() != self.state.len() {
            return Err(crate::Error::length("saved recurrent state", state.len(), self.state.len()));
        }
        self.state = state;
        Ok(())
    }
}

/// The floats of `obs`, for networks that take f32 observations (MLPs): frames are refused with an error naming
/// `algorithm`, never converted silently.
pub fn f32_obs<'a>(algorithm: &'static str, obs: ObsRef<'a>) -> Result<&'a [f32]> {
    obs.as_f32().ok_or_else(|| not_f32(algorithm, obs))
}

/// The error [`f32_obs`] gives for observations that are not f32 vectors.
pub(crate) fn not_f32(algorithm: &'static str, obs: ObsRef<'_>) -> crate::Error {
    let why = format!("{:?} observations; this network takes f32 vectors", obs.dtype());
    crate::Error::space("observation", algorithm, why)
}
