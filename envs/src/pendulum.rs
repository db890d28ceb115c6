//! Pendulum-v1, mirroring `gymnasium/envs/classic_control/pendulum.py` (Gymnasium 1.2.2, `PendulumEnv`).
//!
//! Swing a frictionless pendulum up and hold it with a torque in `[-2, 2]` (out-of-range actions are
//! clipped, as in Gymnasium; NaN and infinity are errors here). Cost `angle_normalize(th)² + 0.1 thdot²
//! + 0.001 u²` on the state *before* the step, reward its negative; never terminates (only the 200-step
//! time limit ends an episode). `thdot += (3g/(2l) sin th + 3/(ml²) u) dt`, clipped to `±8`;
//! `th += thdot dt`, with `dt = 0.05`, `m = l = 1`. Reset draws `th` from `[-pi, pi)` and `thdot` from
//! `[-1, 1)`. Observation `[cos th, sin th, thdot]`.
//!
//! NumPy precision is followed exactly: the clipped torque `u` stays an f32 scalar, so `0.001 * u**2` and
//! `3.0 * u` are computed in f32 before joining the f64 terms.

use std::f64::consts::PI;

use flotilla_core::{Action, Env, Error, Result, Space};

use crate::action;
use crate::buffered::{BufferedEnv, StepOutcome, impl_native_env};
use crate::kwargs::{KwargReader, Kwargs, read_config, require_finite};
use crate::numpy_scalar::{pow2, pow2_f32, py_mod};
use crate::seeding::EnvRng;

const ID: &str = "Pendulum-v1";
const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f64 = 2.0;
const DT: f64 = 0.05;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// Pendulum's constructor arguments; `Default` is Gymnasium's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PendulumConfig {
    /// Gravitational acceleration, 10.0 (Gymnasium's `g`).
    pub g: f64,
}

impl Default for PendulumConfig {
    fn default() -> Self {
        PendulumConfig { g: 10.0 }
    }
}

impl PendulumConfig {
    /// Argument names accepted by [`from_kwargs`](PendulumConfig::from_kwargs).
    pub const KWARGS: &'static [&'static str] = &["g"];

    /// The config from `gym.make`-style arguments; unknown keys and wrong types are [`Error::BadArgument`].
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self> {
        read_config(ID, kwargs, Self::KWARGS, Self::read)
    }

    pub(crate) fn read(r: &mut KwargReader<'_>) -> Result<Self> {
        Ok(PendulumConfig { g: r.float("g")?.unwrap_or(10.0) })
    }
}

/// Pendulum's physical state, in Gymnasium's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PendulumState {
    /// Angle from upright (rad), not normalised.
    pub theta: f64,
    /// Angular velocity (rad/s).
    pub theta_dot: f64,
}

impl PendulumState {
    /// `[theta, theta_dot]`.
    pub fn to_array(self) -> [f64; 2] {
        [self.theta, self.theta_dot]
    }

    /// From `[theta, theta_dot]`.
    pub fn from_array([theta, theta_dot]: [f64; 2]) -> Self {
        PendulumState { theta, theta_dot }
    }
}

/// Gymnasium's `angle_normalize`: `((x + pi) % (2 pi)) - pi`, with Python's `%`.
#[inline]
pub fn angle_normalize(x: f64) -> f64 {
    py_mod(x + PI, 2.0 * PI) - PI
}

/// The Pendulum environment (unwrapped: [`make`](crate::make) adds the 200-step [`TimeLimit`](crate::TimeLimit)).
#[derive(Debug, Clone)]
pub struct Pendulum {
    config: PendulumConfig,
    state: Option<[f64; 2]>,
    rng: EnvRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for Pendulum {
    fn default() -> Self {
        Pendulum::build(PendulumConfig::default())
    }
}

impl Pendulum {
    /// A Pendulum with the given gravity (which must be finite).
    pub fn new(config: PendulumConfig) -> Result<Self> {
        require_finite(ID, "g", config.g)?;
        Ok(Pendulum::build(config))
    }

    fn build(config: PendulumConfig) -> Self {
        let high = [1.0, 1.0, MAX_SPEED as f32];
        Pendulum {
            config,
            state: None,
            rng: EnvRng::default(),
            observation_space: Space::box1d(high.map(|h| -h).to_vec(), high.to_vec()),
            action_space: Space::box1d(vec![-MAX_TORQUE as f32], vec![MAX_TORQUE as f32]),
        }
    }

    /// The arguments this env runs with.
    pub fn config(&self) -> &PendulumConfig {
        &self.config
    }

    /// The physical state, or `None` before the first reset.
    pub fn physical_state(&self) -> Option<PendulumState> {
        self.state.map(PendulumState::from_array)
    }

    /// Overwrites the physical state (as `env.unwrapped.state = ...`). Fails before the first reset or on
    /// non-finite values.
    pub fn set_physical_state(&mut self, state: PendulumState) -> Result<()> {
        self.set_state(&state.to_array())
    }

    #[inline]
    fn write_obs(s: &[f64; 2], obs: &mut [f32]) {
        obs[0] = s[0].cos() as f32;
        obs[1] = s[0].sin() as f32;
        obs[2] = s[1] as f32;
    }
}

impl_native_env!(Pendulum, id: ID, obs_dim: 3);

impl BufferedEnv for Pendulum {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(ID, obs, 3)?;
        self.rng.reseed(seed);
        // `np_random.uniform(low=-high, high=high)` with `high = [pi, 1.0]`.
        let state = [self.rng.uniform(-PI, PI), self.rng.uniform(-1.0, 1.0)];
        Self::write_obs(&state, obs);
        self.state = Some(state);
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let Some([th, thdot]) = self.state else {
            return Err(Error::ResetNeeded { env: ID.into() });
        };
        let u = action::continuous_scalar(ID, action)?;
        action::obs_buffer(ID, obs, 3)?;
        let g = self.config.g;

        // u = np.clip(u, -self.max_torque, self.max_torque)[0]: still an f32 scalar.
        let u = u.clamp(-MAX_TORQUE as f32, MAX_TORQUE as f32);
        let costs = pow2(angle_normalize(th)) + 0.1 * pow2(thdot) + (0.001f32 * pow2_f32(u)) as f64;

        // `3.0 / (m * l**2)` is a Python float, so its product with the f32 `u` is computed in f32.
        let torque_term = (3.0 / (M * (L * L))) as f32 * u;
        let newthdot = thdot + (3.0 * g / (2.0 * L) * th.sin() + torque_term as f64) * DT;
        let newthdot = newthdot.clamp(-MAX_SPEED, MAX_SPEED);
        let newth = th + newthdot * DT;

        let state = [newth, newthdot];
        self.state = Some(state);
        Self::write_obs(&state, obs);
        Ok(StepOutcome { reward: -costs, terminated: false, truncated: false })
    }
}
