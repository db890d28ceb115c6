//! Stepping into caller-owned buffers: the allocation-free path that [`VecEnv`](crate::VecEnv) uses.
//!
//! [`Env::step`] returns a fresh `Vec` per observation, which is the right shape for a single env but
//! costs an allocation per step. [`BufferedEnv`] writes the observation into a slice the caller owns
//! (a row of `VecEnv`'s batch) and returns only the scalars. Every native env implements it directly;
//! [`BoxedEnv`] adapts any other `Box<dyn Env>` (e.g. a Python-bridged one) by copying.

use flotilla_core::{Action, Env, Error, Info, Obs, Result, Space, Step};

use crate::action;

/// The scalars of a step, without the observation (which went into the caller's buffer) and without
/// `info` (native envs report none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Reward for the transition.
    pub reward: f64,
    /// The MDP reached a terminal state.
    pub terminated: bool,
    /// The episode was cut short (time limit).
    pub truncated: bool,
}

/// An [`Env`] whose f32 observations can be written into a caller's buffer of exactly
/// `observation_space().flat_dim()` elements (a wrong length is [`Error::BadArgument`]).
///
/// Semantics are those of [`Env::reset`] and [`Env::step`]; only the output channel differs.
pub trait BufferedEnv: Env {
    /// [`Env::reset`], writing the first observation into `obs`.
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()>;
    /// [`Env::step`], writing the next observation into `obs`. On error `obs` and the env are unchanged.
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome>;
}

/// [`Env::reset`] for a native env, through its buffered path.
pub(crate) fn reset_via<E: BufferedEnv>(env: &mut E, seed: Option<u64>, dim: usize) -> Result<(Obs, Info)> {
    let mut obs = vec![0.0; dim];
    env.reset_into(seed, &mut obs)?;
    Ok((Obs::F32(obs), Info::new()))
}

/// [`Env::step`] for a native env, through its buffered path.
pub(crate) fn step_via<E: BufferedEnv>(env: &mut E, action: Action<'_>, dim: usize) -> Result<Step> {
    let mut obs = vec![0.0; dim];
    let out = env.step_into(action, &mut obs)?;
    Ok(Step {
        obs: Obs::F32(obs),
        reward: out.reward,
        terminated: out.terminated,
        truncated: out.truncated,
        info: Info::new(),
    })
}

/// Any boxed [`Env`] with f32 observations, made a [`BufferedEnv`] by copying each observation.
/// `info` is dropped; u8 observations are [`Error::Unsupported`] (reported after the inner env stepped).
pub struct BoxedEnv {
    inner: Box<dyn Env>,
}

impl BoxedEnv {
    /// Wraps `env`.
    pub fn new(env: Box<dyn Env>) -> Self {
        BoxedEnv { inner: env }
    }

    /// The wrapped env.
    pub fn into_inner(self) -> Box<dyn Env> {
        self.inner
    }

    fn copy_obs(&self, from: Obs, to: &mut [f32]) -> Result<()> {
        match from {
            Obs::F32(v) if v.len() == to.len() => {
                to.copy_from_slice(&v);
                Ok(())
            }
            Obs::F32(v) => Err(Error::InvalidState {
                env: self.inner.id().to_string(),
                detail: format!("observation has {} elements, expected {}", v.len(), to.len()),
            }),
            Obs::U8(_) => Err(Error::Unsupported {
                env: self.inner.id().to_string(),
                what: "copying u8 observations into an f32 buffer".into(),
            }),
        }
    }
}

impl Env for BoxedEnv {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn observation_space(&self) -> &Space {
        self.inner.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)> {
        self.inner.reset(seed)
    }
    fn step(&mut self, action: Action<'_>) -> Result<Step> {
        self.inner.step(action)
    }
    fn max_episode_steps(&self) -> Option<usize> {
        self.inner.max_episode_steps()
    }
    fn state(&self) -> Result<Vec<f64>> {
        self.inner.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        self.inner.set_state(state)
    }
}

impl BufferedEnv for BoxedEnv {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(self.inner.id(), obs, self.inner.observation_space().flat_dim())?;
        let (first, _) = self.inner.reset(seed)?;
        self.copy_obs(first, obs)
    }

    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        action::obs_buffer(self.inner.id(), obs, self.inner.observation_space().flat_dim())?;
        let step = self.inner.step(action)?;
        self.copy_obs(step.obs, obs)?;
        Ok(StepOutcome { reward: step.reward, terminated: step.terminated, truncated: step.truncated })
    }
}
