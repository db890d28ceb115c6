//! MountainCar-v0, mirroring `gymnasium/envs/classic_control/mountain_car.py` (Gymnasium 1.2.2,
//! `MountainCarEnv`).
//!
//! An underpowered car in a valley: accelerate left (0), not at all (1) or right (2) to climb the right
//! hill. `velocity += (action - 1) * 0.001 - 0.0025 * cos(3 * position)`, clipped to `±0.07`;
//! `position += velocity`, clipped to `[-1.2, 0.6]`, and hitting the left wall stops the car. Reward -1
//! per step; the episode terminates when `position >= 0.5` and `velocity >= goal_velocity`. Reset draws
//! the position uniformly from `[-0.6, -0.4)` with zero velocity. The state stays in f64 (a tuple of
//! NumPy f64 scalars in Gymnasium).

use flotilla_core::{Action, Env, Error, Result, Space};

use crate::action;
use crate::buffered::{BufferedEnv, StepOutcome, impl_native_env};
use crate::kwargs::{KwargReader, Kwargs, read_config, require_finite};
use crate::seeding::EnvRng;

const ID: &str = "MountainCar-v0";
pub(crate) const MIN_POSITION: f64 = -1.2;
pub(crate) const MAX_POSITION: f64 = 0.6;
pub(crate) const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;

/// MountainCar's constructor arguments; `Default` is Gymnasium's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MountainCarConfig {
    /// Minimum velocity at the goal position for the episode to terminate, 0.
    pub goal_velocity: f64,
}

impl Default for MountainCarConfig {
    fn default() -> Self {
        MountainCarConfig { goal_velocity: 0.0 }
    }
}

impl MountainCarConfig {
    /// Argument names accepted by [`from_kwargs`](MountainCarConfig::from_kwargs).
    pub const KWARGS: &'static [&'static str] = &["goal_velocity"];

    /// The config from `gym.make`-style arguments; unknown keys and wrong types are [`Error::BadArgument`].
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self> {
        read_config(ID, kwargs, Self::KWARGS, Self::read)
    }

    pub(crate) fn read(r: &mut KwargReader<'_>) -> Result<Self> {
        Ok(MountainCarConfig { goal_velocity: r.float("goal_velocity")?.unwrap_or(0.0) })
    }
}

/// A mountain car's physical state, in Gymnasium's order (shared by the continuous variant).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MountainCarState {
    /// Position along the track.
    pub position: f64,
    /// Velocity.
    pub velocity: f64,
}

impl MountainCarState {
    /// `[position, velocity]`.
    pub fn to_array(self) -> [f64; 2] {
        [self.position, self.velocity]
    }

    /// From `[position, velocity]`.
    pub fn from_array([position, velocity]: [f64; 2]) -> Self {
        MountainCarState { position, velocity }
    }
}

/// Observation bounds shared by both mountain cars: `[min_position, -max_speed]` to
/// `[max_position, max_speed]` as f32.
pub(crate) fn observation_space() -> Space {
    Space::box1d(vec![MIN_POSITION as f32, -MAX_SPEED as f32], vec![MAX_POSITION as f32, MAX_SPEED as f32])
}

/// The discrete MountainCar environment (unwrapped: [`make`](crate::make) adds the 200-step
/// [`TimeLimit`](crate::TimeLimit)).
#[derive(Debug, Clone)]
pub struct MountainCar {
    config: MountainCarConfig,
    state: Option<[f64; 2]>,
    rng: EnvRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for MountainCar {
    fn default() -> Self {
        MountainCar::build(MountainCarConfig::default())
    }
}

impl MountainCar {
    /// A MountainCar with the given goal velocity (which must be finite).
    pub fn new(config: MountainCarConfig) -> Result<Self> {
        require_finite(ID, "goal_velocity", config.goal_velocity)?;
        Ok(MountainCar::build(config))
    }

    fn build(config: MountainCarConfig) -> Self {
        MountainCar {
            config,
            state: None,
            rng: EnvRng::default(),
            observation_space: observation_space(),
            action_space: Space::discrete(3),
        }
    }

    /// The arguments this env runs with.
    pub fn config(&self) -> &MountainCarConfig {
        &self.config
    }

    /// The physical state, or `None` before the first reset.
    pub fn physical_state(&self) -> Option<MountainCarState> {
        self.state.map(MountainCarState::from_array)
    }

    /// Overwrites the physical state (as `env.unwrapped.state = ...`). Fails before the first reset or on
    /// non-finite values.
    pub fn set_physical_state(&mut self, state: MountainCarState) -> Result<()> {
        self.set_state(&state.to_array())
    }
}

impl_native_env!(MountainCar, id: ID, obs_dim: 2);

impl BufferedEnv for MountainCar {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(ID, obs, 2)?;
        self.rng.reseed(seed);
        let state = [self.rng.uniform(-0.6, -0.4), 0.0];
        obs[0] = state[0] as f32;
        obs[1] = state[1] as f32;
        self.state = Some(state);
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let Some([mut position, mut velocity]) = self.state else {
            return Err(Error::ResetNeeded { env: ID.into() });
        };
        let a = action::discrete(ID, action, 3)?;
        action::obs_buffer(ID, obs, 2)?;

        velocity += (a - 1) as f64 * FORCE + (3.0 * position).cos() * -GRAVITY;
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = position >= GOAL_POSITION && velocity >= self.config.goal_velocity;

        self.state = Some([position, velocity]);
        obs[0] = position as f32;
        obs[1] = velocity as f32;
        Ok(StepOutcome { reward: -1.0, terminated, truncated: false })
    }
}
