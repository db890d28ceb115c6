//! Stepping into caller-owned buffers: the allocation-free path that [`VecEnv`](crate::VecEnv) uses.
//!
//! [`Env::step`] returns a fresh `Vec` per observation, which is the right shape for a single env but
//! costs an allocation per step. [`BufferedEnv`] writes the observation into a slice the caller owns
//! (a row of `VecEnv`'s batch) and returns only the scalars. Every native env implements it directly;
//! [`BoxedEnv`] adapts any other `Box<dyn Env>` (e.g. a Python-bridged one) by copying.
//!
//! A native env's [`Env`] impl is the same in all five: [`impl_native_env!`] writes it, with `reset` and
//! `step` going through the buffered path.

use flotilla_core::{Action, Env, EnvSnapshot, Error, Info, Obs, Result, Space, Step};

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

/// [`Env::state`] for a native env: its physical state, or [`Error::ResetNeeded`] before the first reset.
pub(crate) fn state_of<const N: usize>(env: &str, state: Option<[f64; N]>) -> Result<Vec<f64>> {
    state.map(|s| s.to_vec()).ok_or_else(|| Error::ResetNeeded { env: env.into() })
}

/// [`Env::set_state`] for a native env: checks `new` (length `N`, finite values), then overwrites the
/// physical state, which must exist (else [`Error::ResetNeeded`]).
pub(crate) fn set_state_of<const N: usize>(env: &str, state: &mut Option<[f64; N]>, new: &[f64]) -> Result<()> {
    let new = action::state::<N>(env, new)?;
    let current = state.as_mut().ok_or_else(|| Error::ResetNeeded { env: env.into() })?;
    *current = new;
    Ok(())
}

/// Writes the [`Env`] impl of a native env, which is the same for all five of them:
///
/// ```text
/// impl_native_env!(Acrobot, id: ID, obs_dim: 6);
/// impl_native_env!(CartPole, id: ID, obs_dim: 4, bookkeeping: steps_beyond_terminated);
/// impl_native_env!(MountainCarContinuous, id: ID, obs_dim: 2, bookkeeping: state_is_f32,
///                  after_set_state: |env| env.state_is_f32 = false);
/// ```
///
/// The type needs the fields `observation_space: Space`, `action_space: Space`,
/// `state: Option<[f64; N]>` (the physical state in Gymnasium's order, `None` before the first reset) and
/// `rng: EnvRng`, and a [`BufferedEnv`] impl whose observations have `obs_dim` elements. `reset` and `step`
/// go through [`reset_via`] and [`step_via`]; `state` and `set_state` through [`state_of`] and
/// [`set_state_of`]; `snapshot` and `restore` through [`native_snapshot`] and [`native_restore`], saving
/// `state`, `rng` and the optional `bookkeeping` field (any other dynamic state, a
/// [`Bookkeeping`](crate::snapshot::Bookkeeping) type). The optional `after_set_state: |env| expr` runs
/// `expr` with `env: &mut Self` after a successful `set_state`.
///
/// A macro because the blanket `impl<T: NativeTrait> Env for T` is not allowed: `Env` is foreign to this
/// crate, and the orphan rule (E0210) rejects foreign-trait impls for an uncovered type parameter.
///
/// [`native_snapshot`]: crate::snapshot::native_snapshot
/// [`native_restore`]: crate::snapshot::native_restore
macro_rules! impl_native_env {
    // The bookkeeping field's value, or `()` without one.
    (@bookkeeping $this:ident) => {
        ()
    };
    (@bookkeeping $this:ident $field:ident) => {
        $this.$field
    };
    // Assigns restored bookkeeping to its field (without one, `$value` is `()`).
    (@set_bookkeeping $this:ident, $value:expr) => {
        let () = $value;
    };
    (@set_bookkeeping $this:ident, $value:expr, $field:ident) => {
        $this.$field = $value;
    };
    (
        $env:ty, id: $id:expr, obs_dim: $dim:expr
        $(, bookkeeping: $book:ident)?
        $(, after_set_state: |$this:ident| $after:expr)? $(,)?
    ) => {
        impl ::flotilla_core::Env for $env {
            fn id(&self) -> &str {
                $id
            }
            fn observation_space(&self) -> &::flotilla_core::Space {
                &self.observation_space
            }
            fn action_space(&self) -> &::flotilla_core::Space {
                &self.action_space
            }
            fn reset(
                &mut self,
                seed: Option<u64>,
            ) -> ::flotilla_core::Result<(::flotilla_core::Obs, ::flotilla_core::Info)> {
                $crate::buffered::reset_via(self, seed, $dim)
            }
            fn step(&mut self, action: ::flotilla_core::Action<'_>) -> ::flotilla_core::Result<::flotilla_core::Step> {
                $crate::buffered::step_via(self, action, $dim)
            }
            fn state(&self) -> ::flotilla_core::Result<Vec<f64>> {
                $crate::buffered::state_of($id, self.state)
            }
            fn set_state(&mut self, state: &[f64]) -> ::flotilla_core::Result<()> {
                $crate::buffered::set_state_of($id, &mut self.state, state)?;
                $({
                    let $this = &mut *self;
                    $after;
                })?
                Ok(())
            }
            fn snapshot(&self) -> ::flotilla_core::Result<::flotilla_core::EnvSnapshot> {
                let bookkeeping = $crate::buffered::impl_native_env!(@bookkeeping self $($book)?);
                Ok($crate::snapshot::native_snapshot($id, self.state, &self.rng, &bookkeeping))
            }
            fn restore(&mut self, snapshot: &::flotilla_core::EnvSnapshot) -> ::flotilla_core::Result<()> {
                let restored = $crate::snapshot::native_restore($id, snapshot)?;
                self.state = restored.state;
                self.rng = restored.rng;
                $crate::buffered::impl_native_env!(@set_bookkeeping self, restored.bookkeeping $(, $book)?);
                Ok(())
            }
        }
    };
}
pub(crate) use impl_native_env;

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
    fn snapshot(&self) -> Result<EnvSnapshot> {
        self.inner.snapshot()
    }
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<()> {
        self.inner.restore(snapshot)
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
