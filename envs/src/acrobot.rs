//! Acrobot-v1, mirroring `gymnasium/envs/classic_control/acrobot.py` (Gymnasium 1.2.2, `AcrobotEnv`).
//!
//! Two links hanging from a fixed joint; torque -1, 0 or +1 (actions 0, 1, 2) on the middle joint swings
//! the free end up. The "book" dynamics (Sutton & Barto) are integrated over `dt = 0.2` s by one step of
//! classic RK4 (Gymnasium's `rk4(self._dsdt, s_augmented, [0, dt])`), then the angles are wrapped into
//! `[-pi, pi]` and the velocities bounded to `±4pi` and `±9pi`. Observation `[cos t1, sin t1, cos t2,
//! sin t2, dt1, dt2]`; reward -1 per step and 0 on the terminating step, when the free end rises above
//! the bar: `-cos(t1) - cos(t2 + t1) > 1`. Reset draws the four state variables uniformly from
//! `[-0.1, 0.1)` and, as Gymnasium does, rounds them to f32. No torque noise (Gymnasium's default).
//!
//! Every operation keeps Python's order; `x**2` on a NumPy scalar is libm `pow` ([`pow2`]).

use std::f64::consts::PI;

use flotilla_core::{Action, Env, Error, Result, Space};

use crate::action;
use crate::buffered::{BufferedEnv, StepOutcome, impl_native_env};
use crate::numpy_scalar::pow2;
use crate::seeding::EnvRng;

const ID: &str = "Acrobot-v1";
const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];

/// Acrobot's physical state, in Gymnasium's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AcrobotState {
    /// Angle of the first link from hanging down (rad).
    pub theta1: f64,
    /// Angle of the second link relative to the first (rad).
    pub theta2: f64,
    /// Angular velocity of the first joint (rad/s).
    pub dtheta1: f64,
    /// Angular velocity of the second joint (rad/s).
    pub dtheta2: f64,
}

impl AcrobotState {
    /// `[theta1, theta2, dtheta1, dtheta2]`.
    pub fn to_array(self) -> [f64; 4] {
        [self.theta1, self.theta2, self.dtheta1, self.dtheta2]
    }

    /// From `[theta1, theta2, dtheta1, dtheta2]`.
    pub fn from_array([theta1, theta2, dtheta1, dtheta2]: [f64; 4]) -> Self {
        AcrobotState { theta1, theta2, dtheta1, dtheta2 }
    }
}

/// The Acrobot environment (unwrapped: [`make`](crate::make) adds the 500-step [`TimeLimit`](crate::TimeLimit)).
/// Gymnasium's constructor takes no arguments besides `render_mode`, so there is no config.
#[derive(Debug, Clone)]
pub struct Acrobot {
    state: Option<[f64; 4]>,
    rng: EnvRng,
    observation_space: Space,
    action_space: Space,
}

impl Default for Acrobot {
    fn default() -> Self {
        Acrobot::new()
    }
}

impl Acrobot {
    /// A fresh, unreset Acrobot.
    pub fn new() -> Self {
        let high = [1.0, 1.0, 1.0, 1.0, MAX_VEL_1 as f32, MAX_VEL_2 as f32];
        Acrobot {
            state: None,
            rng: EnvRng::default(),
            observation_space: Space::box1d(high.map(|h| -h).to_vec(), high.to_vec()),
            action_space: Space::discrete(3),
        }
    }

    /// The physical state, or `None` before the first reset.
    pub fn physical_state(&self) -> Option<AcrobotState> {
        self.state.map(AcrobotState::from_array)
    }

    /// Overwrites the physical state (as `env.unwrapped.state = ...`). Fails before the first reset or on
    /// non-finite values. Angles outside `[-pi, pi]` are accepted; the next step wraps them.
    pub fn set_physical_state(&mut self, state: AcrobotState) -> Result<()> {
        self.set_state(&state.to_array())
    }

    #[inline]
    fn write_obs(s: &[f64; 4], obs: &mut [f32]) {
        let values = [s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]];
        for (o, v) in obs.iter_mut().zip(values) {
            *o = v as f32;
        }
    }
}

/// Gymnasium's `_dsdt` with `book_or_nips == "book"`: the time derivative of `[t1, t2, dt1, dt2, torque]`.
#[inline]
fn dsdt(s: &[f64; 5]) -> [f64; 5] {
    let m1 = LINK_MASS_1;
    let m2 = LINK_MASS_2;
    let l1 = LINK_LENGTH_1;
    let lc1 = LINK_COM_POS_1;
    let lc2 = LINK_COM_POS_2;
    let i1 = LINK_MOI;
    let i2 = LINK_MOI;
    let g = 9.8;
    // Python-float powers of the constants (`lc1**2` ...) are exact.
    let (l1_sq, lc1_sq, lc2_sq) = (l1 * l1, lc1 * lc1, lc2 * lc2);
    let [theta1, theta2, dtheta1, dtheta2, a] = *s;

    let cos_theta2 = theta2.cos();
    let sin_theta2 = theta2.sin();
    let d1 = m1 * lc1_sq + m2 * (l1_sq + lc2_sq + 2.0 * l1 * lc2 * cos_theta2) + i1 + i2;
    let d2 = m2 * (lc2_sq + l1 * lc2 * cos_theta2) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * pow2(dtheta2) * sin_theta2 - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin_theta2
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 =
        (a + d2 / d1 * phi1 - m2 * l1 * lc2 * pow2(dtheta1) * sin_theta2 - phi2) / (m2 * lc2_sq + i2 - pow2(d2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

/// Gymnasium's `rk4(derivs, y0, [0, dt])`: one classic Runge-Kutta step, NumPy's element-wise order.
#[inline]
fn rk4(y0: &[f64; 5], dt: f64) -> [f64; 5] {
    let dt2 = dt / 2.0;
    let along = |k: &[f64; 5], h: f64| -> [f64; 5] { std::array::from_fn(|j| y0[j] + h * k[j]) };
    let k1 = dsdt(y0);
    let k2 = dsdt(&along(&k1, dt2));
    let k3 = dsdt(&along(&k2, dt2));
    let k4 = dsdt(&along(&k3, dt));
    let h6 = dt / 6.0;
    std::array::from_fn(|j| y0[j] + h6 * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]))
}

/// Gymnasium's `wrap(x, m, M)`: shift by `M - m` until `m <= x <= M`.
#[inline]
fn wrap(mut x: f64, m: f64, big_m: f64) -> f64 {
    let diff = big_m - m;
    while x > big_m {
        x -= diff;
    }
    while x < m {
        x += diff;
    }
    x
}

/// Gymnasium's `bound(x, m, M)`: Python's `min(max(x, m), M)`.
#[inline]
fn bound(x: f64, m: f64, big_m: f64) -> f64 {
    let lower = if m > x { m } else { x };
    if big_m < lower { big_m } else { lower }
}

impl_native_env!(Acrobot, id: ID, obs_dim: 6);

impl BufferedEnv for Acrobot {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        action::obs_buffer(ID, obs, 6)?;
        self.rng.reseed(seed);
        // `np_random.uniform(-0.1, 0.1, size=(4,)).astype(np.float32)`.
        let state = [(); 4].map(|_| self.rng.uniform(-0.1, 0.1) as f32 as f64);
        Self::write_obs(&state, obs);
        self.state = Some(state);
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let Some(s) = self.state else {
            return Err(Error::ResetNeeded { env: ID.into() });
        };
        let a = action::discrete(ID, action, 3)?;
        action::obs_buffer(ID, obs, 6)?;

        let torque = AVAIL_TORQUE[a as usize];
        let s_augmented = [s[0], s[1], s[2], s[3], torque];
        let ns = rk4(&s_augmented, DT);
        let ns = [
            wrap(ns[0], -PI, PI),
            wrap(ns[1], -PI, PI),
            bound(ns[2], -MAX_VEL_1, MAX_VEL_1),
            bound(ns[3], -MAX_VEL_2, MAX_VEL_2),
        ];
        self.state = Some(ns);
        Self::write_obs(&ns, obs);

        let terminated = -ns[0].cos() - (ns[1] + ns[0]).cos() > 1.0;
        let reward = if terminated { 0.0 } else { -1.0 };
        Ok(StepOutcome { reward, terminated, truncated: false })
    }
}
