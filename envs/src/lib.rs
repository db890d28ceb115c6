//! Native Gymnasium-exact environments, the registry, wrappers and [`VecEnv`].
//!
//! Each env reproduces Gymnasium 1.x's classic-control source operation by operation — f64 state as
//! NumPy holds it, f32 observations, the same spaces, rewards, termination rules and reset ranges — and
//! is tested against transitions recorded from the Python package (`scripts/gym_reference.py`,
//! `tests/gym_reference.rs`). Reset noise comes from a seeded [`rand_pcg::Pcg64`], not NumPy's stream,
//! so a seed gives different (equally distributed) start states than in Python.
//!
//! | id | env | time limit | threshold |
//! |---|---|---|---|
//! | `CartPole-v1` | [`CartPole`] | 500 | 475 |
//! | `MountainCar-v0` | [`MountainCar`] | 200 | -110 |
//! | `MountainCarContinuous-v0` | [`MountainCarContinuous`] | 999 | 90 |
//! | `Pendulum-v1` | [`Pendulum`] | 200 | — |
//! | `Acrobot-v1` | [`Acrobot`] | 500 | -100 |
//! | `Latency-v0` | [`Latency`] | 500 | 475 |
//!
//! `Latency-v0` is not Gymnasium's: it is CartPole-v1 whose every step takes a fixed wall-clock time
//! (`step_latency_us`, 1 ms by default), sleeping, like an expensive simulator, for scaling benchmarks of
//! many actor processes on few cores.
//!
//! ```
//! use flotilla_core::Action;
//! use flotilla_envs::{make, Kwargs};
//!
//! let mut env = make("CartPole-v1", &Kwargs::new())?;
//! let (mut obs, _) = env.reset(Some(0))?;
//! let mut episode_return = 0.0;
//! loop {
//!     let push_right = obs.as_f32().map_or(0, |o| i64::from(o[2] > 0.0));
//!     let step = env.step(Action::Discrete(push_right))?;
//!     episode_return += step.reward;
//!     if step.terminated || step.truncated {
//!         break;
//!     }
//!     obs = step.obs;
//! }
//! assert!(episode_return >= 1.0);
//! # Ok::<(), flotilla_core::Error>(())
//! ```
//!
//! Stepping allocates only the returned observation; [`BufferedEnv`] and [`VecEnv`] write into
//! reusable buffers instead.
//!
//! For exact resume, every env here (native, [`TimeLimit`], [`BoxedEnv`]) implements [`Env::snapshot`] and
//! [`Env::restore`], and [`VecEnv`] has its own [`VecEnvSnapshot`]: a restored env, even a fresh unseeded one,
//! continues bit for bit — observations, rewards, flags and reset noise.
//!
//! [`Env::snapshot`]: flotilla_core::Env::snapshot
//! [`Env::restore`]: flotilla_core::Env::restore
#![deny(missing_docs)]

mod acrobot;
mod action;
mod buffered;
mod cartpole;
mod chunk_recorder;
pub mod env_actions;
mod kwargs;
mod latency;
mod mountain_car;
mod mountain_car_continuous;
mod numpy_scalar;
mod observe;
mod pendulum;
mod registry;
mod seeding;
mod snapshot;
mod tasks;
mod time_limit;
mod vec_env;

pub use acrobot::{Acrobot, AcrobotState};
pub use buffered::{BoxedEnv, BufferedEnv, StepOutcome};
pub use cartpole::{CartPole, CartPoleConfig, CartPoleState};
pub use chunk_recorder::ChunkRecorder;
pub use kwargs::{KwargValue, Kwargs};
pub use latency::{Latency, LatencyConfig};
pub use mountain_car::{MountainCar, MountainCarConfig, MountainCarState};
pub use mountain_car_continuous::{MountainCarContinuous, MountainCarContinuousConfig};
pub use observe::ObserveVecEnv;
pub use pendulum::{Pendulum, PendulumConfig, PendulumState, angle_normalize};
pub use registry::{BackendMaker, EnvSpec, make, make_buffered, register_backend, registered, spec};
pub use tasks::{TaskInputs, TaskVecEnv};
pub use time_limit::TimeLimit;
pub use vec_env::{
    EnvRole, EpisodeStats, VecActions, VecEnv, VecEnvSnapshot, VecStep, VectorEnv, VectorMaker, make_vector,
    register_vector_backend,
};
