//! Flotilla's learning algorithms on libtorch.
//!
//! Building blocks — [`nets`] (MLP and Nature-CNN torsos), [`distributions`] (categorical and diagonal
//! Gaussian), [`gae`] (generalised advantage estimation), [`rollout`] (on-policy storage) — and the
//! algorithms built from them, one file each: [`ppo`].
//!
//! The crate knows environments only through `flotilla_core` types and never touches files except in explicit
//! save/load calls, tokio or the network.

pub mod adam;
pub mod atomic_write;
pub mod distributions;
pub mod error;
pub mod gae;
pub mod metrics;
pub mod nets;
pub mod params;
pub mod ppo;
pub mod rollout;

pub use error::{Error, Result};
pub use metrics::Metrics;
pub use tch;
