//! CartPole-v1, mirroring `gymnasium/envs/classic_control/cartpole.py` (Gymnasium 1.2.2, `CartPoleEnv`).
//!
//! A pole hinged on a cart; push the cart left (0) or right (1) with a fixed force and keep the pole up.
//! Euler integration with `tau = 0.02` s, the state kept in f64 as NumPy does and observed as f32.
//! The episode terminates when `|x| > 2.4` or `|theta| > 12°`. Reward is +1 per step including the
//! terminating one; with `sutton_barto_reward` it is 0 per step and -1 on termination. Stepping on after
//! termination (undefined behaviour in Gymnasium, which only warns) gives 0 (or -1), as Gymnasium does.
//! Reset draws all four state variables uniformly from `[-0.05, 0.05)`.
//!
//! [`CartPoleConfig`] has Gymnasium's one constructor argument, `sutton_barto_reward`, plus the physical
//! constants (`gravity`, `masscart`, `masspole`, `length`, `force_mag`, `tau`) for transfer experiments;
//! Gymnasium keeps these as attributes, and the observation bounds and thresholds do not depend on them.

use std::f64::consts::PI;

use flotilla_core::{Action, Env, Error, Result, Space};

use crate::action;
use crate::buffered::{BufferedEnv, StepOutcome, impl_native_env};
use crate::kwargs::{KwargReader, Kwargs, read_config, require_finite, require_positive};
use crate::seeding::EnvRng;

const ID: &str = "CartPole-v1";
/// Episode fails beyond this cart position (m).
const X_THRESHOLD: f64 = 2.4;
/// Episode fails beyond this pole angle: `12 * 2 * math.pi / 360` rad.
const THETA_THRESHOLD_RADIANS: f64 = 12.0 * 2.0 * PI / 360.0;

/// CartPole's constructor arguments and physical constants; `Default` is Gymnasium's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CartPoleConfig {
    /// Reward 0 per surviving step and -1 on termination (Sutton & Barto) instead of +1 per step.
    pub sutton_barto_reward: bool,
    /// Gravitational acceleration (m/s²), 9.8.
    pub gravity: f64,
    /// Mass of the cart (kg), 1.0; must be positive.
    pub masscart: f64,
    /// Mass of the pole (kg), 0.1; must be positive.
    pub masspole: f64,
    /// Half the pole's length (m), 0.5, as Gymnasium's `length`; must be positive.
    pub length: f64,
    /// Magnitude of the push (N), 10.0.
    pub force_mag: f64,
    /// Seconds between state updates, 0.02; must be positive.
    pub tau: f64,
}

impl Default for CartPoleConfig {
    fn default() -> Self {
        CartPoleConfig {
            sutton_barto_reward: false,
            gravity: 9.8,
            masscart: 1.0,
            masspole: 0.1,
            length: 0.5,
            force_mag: 10.0,
            tau: 0.02,
        }
    }
}

impl CartPoleConfig {
    /// Argument names accepted by [`from_kwargs`](CartPoleConfig::from_kwargs).
    pub const KWARGS: &'static [&'static str] =
        &["sutton_barto_reward", "gravity", "masscart", "masspole", "length", "force_mag", "tau"];

    /// The config from `gym.make`-style arguments; unknown keys, wrong types and non-physical values
    /// are [`Error::BadArgument`].
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self> {
        read_config(ID, kwargs, Self::KWARGS, Self::read)
    }

    pub(crate) fn read(r: &mut KwargReader<'_>) -> Result<Self> {
        let d = CartPoleConfig::default();
        let config = CartPoleConfig {
            sutton_barto_reward: r.boolean("sutton_barto_reward")?.unwrap_or(d.sutton_barto_reward),
            gravity: r.float("gravity")?.unwrap_or(d.gravity),
            masscart: r.float("masscart")?.unwrap_or(d.masscart),
            masspole: r.float("masspole")?.unwrap_or(d.masspole),
            length: r.float("length")?.unwrap_or(d.length),
            force_mag: r.float("force_mag")?.unwrap_or(d.force_mag),
            tau: r.float("tau")?.unwrap_or(d.tau),
        };
        config.validate()?;
        Ok(config)
    }

    /// Every constant finite; masses, length and time step positive (else the dynamics divide by zero).
    pub fn validate(&self) -> Result<()> {
        require_finite(ID, "gravity", self.gravity)?;
        require_positive(ID, "masscart", self.masscart)?;
        require_positive(ID, "masspole", self.masspole)?;
        require_positive(ID, "length", self.length)?;
        require_finite(ID, "force_mag", self.force_mag)?;
        require_positive(ID, "tau", self.tau)
    }
}

/// CartPole's physical state, in Gymnasium's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CartPoleState {
    /// Cart position (m).
    pub x: f64,
    /// Cart velocity (m/s).
    pub x_dot: f64,
    /// Pole angle from upright (rad).
    pub theta: f64,
    /// Pole angular velocity (rad/s).
    pub theta_dot: f64,
}

impl CartPoleState {
    /// `[x, x_dot, theta, theta_dot]`.
    pub fn to_array(self) -> [f64; 4] {
        [self.x, self.x_dot, self.theta, self.theta_dot]
    }

    /// From `[x, x_dot, theta, theta_dot]`.
    pub fn from_array([x, x_dot, theta, theta_dot]: [f64; 4]) -> Self {
        CartPoleState { x, x_dot, theta, theta_dot }
    }
}

/// The CartPole environment (unwrapped: [`make`](crate::make) adds the 500-step [`TimeLimit`](crate::TimeLimit)).
#[derive(Debug, Clone)]
pub struct CartPole {
    config: CartPoleConfig,
    total_mass: f64,
    polemass_length: f64,
    state: Option<[f64; 4]>,
    steps_beyond_terminated: Option<u64>,
    rng: EnvRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for CartPole {
    fn default() -> Self {
        CartPole::build(CartPoleConfig::default())
    }
}

impl CartPole {
    /// A CartPole with the given constants, checked by [`CartPoleConfig::validate`].
    pub fn new(config: CartPoleConfig) -> Result<Self> {
        config.validate()?;
        Ok(CartPole::build(config))
    }

    fn build(config: CartPoleConfig) -> Self {
        let high = [(X_THRESHOLD * 2.0) as f32, f32::INFINITY, (THETA_THRESHOLD_RADIANS * 2.0) as f32, f32::INFINITY];
        CartPole {
            config,
            total_mass: config.masspole + config.masscart,
            polemass_length: config.masspole * config.length,
            state: None,
            steps_beyond_terminated: None,
            rng: EnvRng::default(),
            observation_space: Space::box1d(high.map(|h| -h).to_vec(), high.to_vec()),
            action_space: Space::discrete(2),
        }
    }

    /// The constants this env runs with.
    pub fn config(&self) -> &CartPoleConfig {
        &self.config
    }

    /// The physical state, or `None` before the first reset.
    pub fn physical_state(&self) -> Option<CartPoleState> {
        self.state.map(CartPoleState::from_array)
    }

    /// Overwrites the physical state (as `env.unwrapped.state = ...`); the termination bookkeeping is kept,
    /// as in Gymnasium. Fails before the first reset or on non-finite values.
    pub fn set_physical_state(&mut self, state: CartPoleState) -> Result<()> {
        self.set_state(&state.to_array())
    }

    /// Steps taken since the episode terminated (`None` while it has not): Gymnasium's
    /// `steps_beyond_terminated`, which decides the reward after termination.
    pub fn steps_beyond_terminated(&self) -> Option<u64> {
        self.steps_beyond_terminated
    }

    #[inline]
    fn write_obs(state: &[f64; 4], obs: &mut [f32]) {
        for (o, s) in obs.iter_mut().zip(state) {
            *o = *s as f32;
        }
    }
}

impl_native_env!(CartPole, id: ID, obs_dim: 4, bookkeeping: steps_beyond_terminated);

impl BufferedEnv for CartPole {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(ID, obs, 4)?;
        self.rng.reseed(seed);
        let state = [(); 4].map(|_| self.rng.uniform(-0.05, 0.05));
        Self::write_obs(&state, obs);
        self.state = Some(state);
        self.steps_beyond_terminated = None;
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let Some([x, x_dot, theta, theta_dot]) = self.state else {
            return Err(Error::ResetNeeded { env: ID.into() });
        };
        let a = action::discrete(ID, action, 2)?;
        action::obs_buffer(ID, obs, 4)?;
        let c = &self.config;

        let force = if a == 1 { c.force_mag } else { -c.force_mag };
        let costheta = theta.cos();
        let sintheta = theta.sin();
        let temp = (force + self.polemass_length * (theta_dot * theta_dot) * sintheta) / self.total_mass;
        let thetaacc = (c.gravity * sintheta - costheta * temp)
            / (c.length * (4.0 / 3.0 - c.masspole * (costheta * costheta) / self.total_mass));
        let xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass;

        // Gymnasium's default kinematics_integrator == "euler".
        let state = [x + c.tau * x_dot, x_dot + c.tau * xacc, theta + c.tau * theta_dot, theta_dot + c.tau * thetaacc];
        self.state = Some(state);
        Self::write_obs(&state, obs);

        let [x, _, theta, _] = state;
        // Python's four comparisons, kept as such: a NaN state does not terminate, as in Gymnasium.
        #[allow(clippy::manual_range_contains)]
        let terminated =
            x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD_RADIANS || theta > THETA_THRESHOLD_RADIANS;
        let sb = c.sutton_barto_reward;
        let reward = if !terminated {
            if sb { 0.0 } else { 1.0 }
        } else if let Some(beyond) = self.steps_beyond_terminated.as_mut() {
            *beyond += 1;
            if sb { -1.0 } else { 0.0 }
        } else {
            self.steps_beyond_terminated = Some(0);
            if sb { -1.0 } else { 1.0 }
        };
        Ok(StepOutcome { reward, terminated, truncated: false })
    }
}
