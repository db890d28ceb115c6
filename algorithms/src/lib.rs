//! Flotilla's learning algorithms on libtorch.
//!
//! Two traits split every agent: [`Algorithm`] (observe trajectory chunks — the one way data enters —,
//! update, checkpoint: what a learner runs) and
//! [`ActingPolicy`] (weights and the forward pass: what an actor runs). [`registry`] is the one place that
//! knows every algorithm kind and builds both from a config.
//!
//! Layers, from the top; a file uses files of its own layer or below, and no file uses one that uses it
//! (`tests/tests/layers.rs`):
//!
//! ```text
//! registry, export,         the kinds: config enum, building learners and acting policies, batching a
//! normalize                 population's members; the acting policy in PyTorch's layout; observation and
//!                           reward normalisation around any agent and acting policy
//! ppo/ a2c/ dqn/ td3/ sac/  one folder per kind: config, loss, its one update over the member axis (a run is a
//! distill/ actor_critic/    population of one), acting policy; actor_critic/ is PPO's and A2C's network, host
//! continuous/               step and member axis; continuous/ is DDPG's, TD3's and SAC's replay and critics
//! algorithm, acting         the traits a learner and an actor run (Algorithm, ActingPolicy, GradientWorker)
//! data/                     rollouts, replay, frame replay, n-step, GAE, V-trace, sum tree
//! nn/                       flat parameters, networks, host kernels, Adam, RMSprop, distributions, replicas,
//!                           the member axis
//! policy, progress,         plain data and files: Policy, Progress, Teaching, Checkpoint,
//! teaching, checkpoint, …   safetensors weights, atomic writes, Metrics, Error
//! ```
//!
//! Algorithms: [`ppo`], [`dqn`] (double-Q, dueling, PER, n-step), [`a2c`] (and A3C's actor-side
//! [`a2c::A3cWorker`]), [`td3`] (TD3, and DDPG as its special case), [`sac`], [`distill`] (policy distillation into a
//! small student).
//!
//! The crate knows environments only through `flotilla_core` types and never touches files except in explicit
//! save/load calls, tokio or the network.
#![deny(missing_docs)]

pub mod a2c;
pub mod acting;
pub mod actor_critic;
pub mod algorithm;
pub mod atomic_write;
pub mod checkpoint;
pub mod continuous;
pub mod data;
pub mod distill;
pub mod dqn;
pub mod error;
pub mod export;
pub mod kind;
pub mod metrics;
pub mod nn;
pub mod normalize;
pub mod policy;
pub mod ppo;
pub mod progress;
pub mod registry;
pub mod sac;
pub mod td3;
pub mod teaching;
pub mod weights_file;

pub use acting::{Acting, ActingPolicy, ActingSetup, GradientWorker};
pub use algorithm::{Algorithm, Prepared, ReplayFeed};
pub use checkpoint::Checkpoint;
pub use error::{Error, Result};
pub use kind::{AlgorithmKind, Family};
pub use metrics::Metrics;
pub use nn::data_parallel::{DataParallel, GradientSync};
pub use nn::lanes::{LANES_VAR, host_lanes};
pub use policy::{ActMode, ActOutput, Memory, Policy, f32_obs};
pub use progress::Progress;
pub use registry::AlgorithmConfig;
pub use tch;
pub use teaching::{Teaching, TeachingKind};
