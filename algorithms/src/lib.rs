//! Flotilla's learning algorithms on libtorch.
//!
//! Two traits split every agent: [`Algorithm`] (observe, update, checkpoint: what a learner runs) and
//! [`ActingPolicy`] (weights and the forward pass: what an actor runs). [`registry`] is the one place that
//! knows every algorithm kind and builds both from a config.
//!
//! Algorithms, one file each: [`ppo`], [`dqn`] (double-Q, dueling, PER, n-step), [`a2c`] (and A3C's actor-side
//! [`a2c::A3cWorker`]), [`td3`] (TD3, and DDPG as its special case), [`distill`] (policy distillation into a small student). Building blocks: [`nets`], [`host_mlp`],
//! [`activation`], [`params`], [`actor_critic`], [`distributions`], [`action_noise`], [`gae`], [`vtrace`],
//! [`n_step`], [`rollout`] (on-policy storage, filled per step or straight from actors' chunks), [`replay`],
//! [`sum_tree`], [`adam`], [`rmsprop`], [`checkpoint`]; [`export`] (the architecture in `model.safetensors`, and
//! the acting policy as a PyTorch `nn.Sequential`).
//!
//! The crate knows environments only through `flotilla_core` types and never touches files except in explicit
//! save/load calls, tokio or the network.
#![deny(missing_docs)]

pub mod a2c;
pub mod a2c_population;
pub mod acting;
pub mod action_noise;
pub mod activation;
pub mod actor_critic;
mod actor_critic_host;
pub mod adam;
pub mod algorithm;
pub mod atomic_write;
pub mod checkpoint;
pub mod data_parallel;
pub mod distill;
pub mod distributions;
pub mod dqn;
mod dqn_host;
pub mod dqn_population;
pub mod error;
pub mod export;
pub mod frame_replay;
pub mod gae;
pub mod host_mlp;
pub(crate) mod host_train;
pub mod lanes;
pub mod metrics;
pub mod n_step;
pub mod nets;
pub mod params;
pub mod policy;
pub mod ppo;
pub mod ppo_population;
pub mod registry;
pub mod replay;
pub mod rmsprop;
pub mod rollout;
pub mod sum_tree;
pub mod td3;
pub mod td3_population;
pub mod teaching;
pub mod transition;
pub mod vtrace;
pub mod weights_file;

pub use acting::{Acting, ActingPolicy, ActingSetup, GradientWorker};
pub use algorithm::{Algorithm, Prepared, ReplayFeed};
pub use checkpoint::Checkpoint;
pub use data_parallel::{DataParallel, GradientSync};
pub use error::{Error, Result};
pub use lanes::{LANES_VAR, host_lanes};
pub use metrics::Metrics;
pub use policy::{ActMode, ActOutput, Policy, f32_obs};
pub use registry::{AlgorithmConfig, Family};
pub use tch;
pub use teaching::{Teaching, TeachingKind};
pub use transition::{Progress, Transition, for_each_transition};
