//! Flotilla's outputs for people watching a run: TensorBoard event files ([`tensorboard`]) beside a run
//! directory's `metrics.csv`, and the learner's Prometheus endpoint ([`prometheus`]). Knows no algorithm and no
//! config: callers hand it names and numbers.
#![deny(missing_docs)]

pub mod prometheus;
pub mod tensorboard;

/// What can go wrong writing a run's observability outputs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be created or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, Error>;
