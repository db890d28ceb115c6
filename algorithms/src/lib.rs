//! Flotilla's learning algorithms on libtorch.
//!
//! Building blocks — [`nets`] (MLP and Nature-CNN torsos), [`distributions`] (categorical and diagonal
//! Gaussian), [`gae`] (generalised advantage estimation), [`rollout`] (on-policy storage) — and the
//! algorithms built from them, one file each: [`ppo`].
//!
//! The crate knows environments only through `flotilla_core` types and never touches files except in explicit
//! save/load calls, tokio or the network.

pub mod a2c;
pub mod action_noise;
pub mod actor_critic;
pub mod adam;
pub mod algorithm;
pub mod atomic_write;
pub mod checkpoint;
pub mod distributions;
pub mod dqn;
pub mod error;
pub mod gae;
pub mod host_mlp;
pub mod metrics;
pub mod n_step;
pub mod nets;
pub mod params;
pub mod policy;
pub mod ppo;
pub mod replay;
pub mod rmsprop;
pub mod rollout;
pub mod sum_tree;
pub mod td3;
pub mod vtrace;

pub use algorithm::{Algorithm, Progress, Transition};
pub use checkpoint::Checkpoint;
pub use error::{Error, Result};
pub use metrics::Metrics;
pub use policy::{ActMode, ActOutput, Policy};
pub use tch;
