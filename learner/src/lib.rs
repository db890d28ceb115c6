//! Flotilla's learner: the experiment config, the single-process training loop, the distributed learner
//! (hub and update loop), evaluation and run directories. The `flotilla` binary (the `flotilla-cli` crate)
//! is the command-line front end.
//!
//! Library use:
//! ```no_run
//! use flotilla_learner::{config::ExperimentConfig, train::train};
//! let config = ExperimentConfig::parse("[env]\nid = \"CartPole-v1\"\n[algorithm]\nkind = \"ppo\"\n", &[])?;
//! let (agent, report) = train(&config, &mut |_row| Ok(()))?;
//! println!("eval return {:.1}", report.final_eval().mean());
//! # let _ = agent;
//! # Ok::<(), flotilla_learner::Error>(())
//! ```
#![deny(missing_docs)]

mod allocator;
mod assembly;
pub mod config;
pub mod data_parallel;
pub mod distributed;
mod env_replay;
pub mod error;
pub mod eval;
pub mod hub;
pub mod init;
pub mod population;
pub mod progress;
pub mod run_dir;
pub mod stats;
pub mod train;

pub use allocator::{ALLOCATOR_TUNABLES, tune_allocator};
pub use error::{Error, Result};
/// From policy outputs to env actions (moved to `flotilla_envs::env_actions`, shared with the actors).
pub use flotilla_envs::env_actions as actions;
