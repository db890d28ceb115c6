use std::collections::BTreeMap;

use crate::{EnvSnapshot, Error, Result, Space};

/// One action, borrowed so stepping allocates nothing: an index for `Discrete` spaces, a flat f32 slice for
/// `Box` spaces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// Index into a `Discrete` space.
    Discrete(i64),
    /// Flattened sample of a `Box` space.
    Continuous(&'a [f32]),
}

/// One flattened observation, in the dtype of the observation space.
#[derive(Debug, Clone, PartialEq)]
pub enum Obs {
    /// `Box` of f32 (classic control).
    F32(Vec<f32>),
    /// `Box` of u8 (image frames stay u8 end to end).
    U8(Vec<u8>),
}

impl Obs {
    /// The elements, borrowed, in their own dtype.
    pub fn as_ref(&self) -> crate::ObsRef<'_> {
        match self {
            Obs::F32(v) => crate::ObsRef::F32(v),
            Obs::U8(v) => crate::ObsRef::U8(v),
        }
    }

    /// The f32 elements, if this is an f32 observation.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Obs::F32(v) => Some(v),
            Obs::U8(_) => None,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Obs::F32(v) => v.len(),
            Obs::U8(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gymnasium's `info` dict, restricted to numbers (e.g. `"TimeLimit.truncated"` is not needed: see
/// [`Step::truncated`]).
pub type Info = BTreeMap<String, f64>;

/// What `Env::step` returns: Gymnasium's `(obs, reward, terminated, truncated, info)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Observation after the action.
    pub obs: Obs,
    /// Reward for the transition.
    pub reward: f64,
    /// The MDP reached a terminal state: do not bootstrap from `obs`.
    pub terminated: bool,
    /// The episode was cut short (time limit): bootstrap from `obs`.
    pub truncated: bool,
    /// Extra diagnostics.
    pub info: Info,
}

/// An environment with Gymnasium 1.x semantics.
///
/// ```text
/// let (mut obs, _) = env.reset(Some(seed))?;
/// loop {
///     let step = env.step(policy(&obs))?;
///     if step.terminated || step.truncated { (obs, _) = env.reset(None)?; } else { obs = step.obs; }
/// }
/// ```
///
/// `reset(Some(seed))` reseeds the environment's RNG; `reset(None)` continues the current stream. Stepping
/// before the first reset returns [`Error::ResetNeeded`]; an action outside the action space returns
/// [`Error::InvalidAction`] and leaves the state untouched. [`snapshot`](Env::snapshot) and
/// [`restore`](Env::restore) save and put back everything that decides the future, for exact resume.
pub trait Env: Send {
    /// Registered id, e.g. `"CartPole-v1"`.
    fn id(&self) -> &str;
    /// Space of observations.
    fn observation_space(&self) -> &Space;
    /// Space of actions.
    fn action_space(&self) -> &Space;
    /// Start a new episode.
    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)>;
    /// Apply one action.
    fn step(&mut self, action: Action<'_>) -> Result<Step>;
    /// The time limit the registry wraps this env in, if any.
    fn max_episode_steps(&self) -> Option<usize> {
        None
    }
    /// The physical state (Gymnasium's `env.unwrapped.state`), for envs that expose one.
    fn state(&self) -> Result<Vec<f64>> {
        Err(Error::Unsupported { env: self.id().to_string(), what: "reading the physical state".into() })
    }
    /// Overwrite the physical state, e.g. to test the dynamics from a chosen point.
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        let _ = state;
        Err(Error::Unsupported { env: self.id().to_string(), what: "setting the physical state".into() })
    }
    /// Everything that decides this env's future — physical state, bookkeeping, the reset-noise stream —
    /// so that [`restore`](Env::restore) on an env made with the same id and arguments continues exactly
    /// as this one will.
    fn snapshot(&self) -> Result<EnvSnapshot> {
        Err(Error::Unsupported { env: self.id().to_string(), what: "taking a snapshot".into() })
    }
    /// Put back a state taken by [`snapshot`](Env::snapshot): later observations, rewards, flags and resets
    /// are bit-identical to those of the env it was taken from. A snapshot of another id or layout is
    /// [`Error::InvalidSnapshot`] and changes nothing.
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<()> {
        let _ = snapshot;
        Err(Error::Unsupported { env: self.id().to_string(), what: "restoring a snapshot".into() })
    }
}
