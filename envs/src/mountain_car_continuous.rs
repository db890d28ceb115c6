//! MountainCarContinuous-v0, mirroring `gymnasium/envs/classic_control/continuous_mountain_car.py`
//! (Gymnasium 1.2.2, `Continuous_MountainCarEnv`).
//!
//! The mountain car with a continuous force in `[-1, 1]` (out-of-range actions are clipped, as in
//! Gymnasium; NaN and infinity are errors here). `velocity += force * 0.0015 - 0.0025 * cos(3 *
//! position)`, clipped to `±0.07`; `position += velocity`, clipped to `[-1.2, 0.6]`; the left wall stops
//! the car. The episode terminates when `position >= 0.45` and `velocity >= goal_velocity`, with reward
//! 100; every step also costs `0.1 * action²` on the *unclipped* action. Reset draws the position
//! uniformly from `[-0.6, -0.4)` with zero velocity.
//!
//! Precision follows NumPy exactly, which here is unusual: `step` stores the state as an f32 array, while
//! `reset` (and `env.unwrapped.state = np.array(..)`) leave f64. The first step after a reset therefore
//! runs in f64 and later ones in f32, with Python floats cast to f32 under NEP 50 — in arithmetic and
//! in the comparisons that decide clipping and termination. [`Scalar`] carries those kinds along so the
//! step below reads line by line like the Python.

use flotilla_core::{Action, Env, Error, Result, Space};

use crate::action;
use crate::buffered::{BufferedEnv, StepOutcome, impl_native_env};
use crate::kwargs::{KwargReader, Kwargs, read_config, require_finite};
use crate::mountain_car::{self, MAX_POSITION, MAX_SPEED, MIN_POSITION, MountainCarState};
use crate::numpy_scalar::{Scalar, pow2};
use crate::seeding::EnvRng;

const ID: &str = "MountainCarContinuous-v0";
const MIN_ACTION: f64 = -1.0;
const MAX_ACTION: f64 = 1.0;
const GOAL_POSITION: f64 = 0.45;
const POWER: f64 = 0.0015;

/// MountainCarContinuous's constructor arguments; `Default` is Gymnasium's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MountainCarContinuousConfig {
    /// Minimum velocity at the goal position for the episode to terminate, 0.
    pub goal_velocity: f64,
}

impl Default for MountainCarContinuousConfig {
    fn default() -> Self {
        MountainCarContinuousConfig { goal_velocity: 0.0 }
    }
}

impl MountainCarContinuousConfig {
    /// Argument names accepted by [`from_kwargs`](MountainCarContinuousConfig::from_kwargs).
    pub const KWARGS: &'static [&'static str] = &["goal_velocity"];

    /// The config from `gym.make`-style arguments; unknown keys and wrong types are [`Error::BadArgument`].
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self> {
        read_config(ID, kwargs, Self::KWARGS, Self::read)
    }

    pub(crate) fn read(r: &mut KwargReader<'_>) -> Result<Self> {
        Ok(MountainCarContinuousConfig { goal_velocity: r.float("goal_velocity")?.unwrap_or(0.0) })
    }
}

/// The continuous MountainCar environment (unwrapped: [`make`](crate::make) adds the 999-step
/// [`TimeLimit`](crate::TimeLimit)).
#[derive(Debug, Clone)]
pub struct MountainCarContinuous {
    config: MountainCarContinuousConfig,
    state: Option<[f64; 2]>,
    /// Whether Gymnasium would hold the state as an f32 array (after a step) rather than f64.
    state_is_f32: bool,
    rng: EnvRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for MountainCarContinuous {
    fn default() -> Self {
        MountainCarContinuous::build(MountainCarContinuousConfig::default())
    }
}

impl MountainCarContinuous {
    /// A MountainCarContinuous with the given goal velocity (which must be finite).
    pub fn new(config: MountainCarContinuousConfig) -> Result<Self> {
        require_finite(ID, "goal_velocity", config.goal_velocity)?;
        Ok(MountainCarContinuous::build(config))
    }

    fn build(config: MountainCarContinuousConfig) -> Self {
        MountainCarContinuous {
            config,
            state: None,
            state_is_f32: false,
            rng: EnvRng::default(),
            observation_space: mountain_car::observation_space(),
            action_space: Space::box1d(vec![MIN_ACTION as f32], vec![MAX_ACTION as f32]),
        }
    }

    /// The arguments this env runs with.
    pub fn config(&self) -> &MountainCarContinuousConfig {
        &self.config
    }

    /// The physical state, or `None` before the first reset. After a step both values are f32 numbers
    /// (widened), as Gymnasium stores them.
    pub fn physical_state(&self) -> Option<MountainCarState> {
        self.state.map(MountainCarState::from_array)
    }

    /// Overwrites the physical state (as `env.unwrapped.state = np.array(.., dtype=np.float64)`): the
    /// next step runs in f64. Fails before the first reset or on non-finite values.
    pub fn set_physical_state(&mut self, state: MountainCarState) -> Result<()> {
        self.set_state(&state.to_array())
    }

    /// Overwrites the physical state as Gymnasium holds it after a step (an f32 array,
    /// `env.unwrapped.state = np.array(.., dtype=np.float32)`): the next step runs in f32.
    /// Fails before the first reset or on non-finite values.
    pub fn set_physical_state_f32(&mut self, [position, velocity]: [f32; 2]) -> Result<()> {
        self.set_state(&[position as f64, velocity as f64])?;
        self.state_is_f32 = true;
        Ok(())
    }
}

// Snapshots keep `state_is_f32`; `set_state` writes an f64 array (`np.array(.., dtype=np.float64)`): the
// next step runs in f64.
impl_native_env!(
    MountainCarContinuous,
    id: ID,
    obs_dim: 2,
    bookkeeping: state_is_f32,
    after_set_state: |env| env.state_is_f32 = false,
);

impl BufferedEnv for MountainCarContinuous {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(ID, obs, 2)?;
        self.rng.reseed(seed);
        let state = [self.rng.uniform(-0.6, -0.4), 0.0];
        obs[0] = state[0] as f32;
        obs[1] = state[1] as f32;
        self.state = Some(state);
        self.state_is_f32 = false;
        Ok(())
    }

    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        use Scalar::{F32, F64, Py};
        let Some(state) = self.state else {
            return Err(Error::ResetNeeded { env: ID.into() });
        };
        let a = action::continuous_scalar(ID, action)?;
        action::obs_buffer(ID, obs, 2)?;

        let (position, velocity) = if self.state_is_f32 {
            (F32(state[0] as f32), F32(state[1] as f32))
        } else {
            (F64(state[0]), F64(state[1]))
        };
        // force = min(max(action[0], self.min_action), self.max_action)
        let mut force = F32(a);
        if Py(MIN_ACTION).gt(force) {
            force = Py(MIN_ACTION);
        }
        if Py(MAX_ACTION).lt(force) {
            force = Py(MAX_ACTION);
        }
        // velocity += force * self.power - 0.0025 * math.cos(3 * position)
        let cos = Py(3.0).mul(position).value().cos();
        let mut velocity = velocity.add(force.mul(Py(POWER)).sub(Py(0.0025 * cos)));
        if velocity.gt(Py(MAX_SPEED)) {
            velocity = Py(MAX_SPEED);
        }
        if velocity.lt(Py(-MAX_SPEED)) {
            velocity = Py(-MAX_SPEED);
        }
        let mut position = position.add(velocity);
        if position.gt(Py(MAX_POSITION)) {
            position = Py(MAX_POSITION);
        }
        if position.lt(Py(MIN_POSITION)) {
            position = Py(MIN_POSITION);
        }
        if position.eq(Py(MIN_POSITION)) && velocity.lt(Py(0.0)) {
            velocity = Py(0.0);
        }
        let terminated = position.ge(Py(GOAL_POSITION)) && velocity.ge(Py(self.config.goal_velocity));
        let base = if terminated { 100.0 } else { 0.0 };
        let reward = base - pow2(a as f64) * 0.1;

        // self.state = np.array([position, velocity], dtype=np.float32)
        let (p, v) = (position.to_f32(), velocity.to_f32());
        self.state = Some([p as f64, v as f64]);
        self.state_is_f32 = true;
        obs[0] = p;
        obs[1] = v;
        Ok(StepOutcome { reward, terminated, truncated: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_state_makes_the_state_f64_again() {
        let mut env = MountainCarContinuous::default();
        env.reset(Some(0)).unwrap();
        assert!(!env.state_is_f32);
        env.step(Action::Continuous(&[0.5])).unwrap();
        assert!(env.state_is_f32);
        env.set_state(&[-0.5, 0.01]).unwrap();
        assert!(!env.state_is_f32);
        env.set_physical_state_f32([-0.5, 0.01]).unwrap();
        assert!(env.state_is_f32);
        env.set_physical_state(MountainCarState { position: -0.5, velocity: 0.01 }).unwrap();
        assert!(!env.state_is_f32);
    }
}
