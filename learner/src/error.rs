//! The learner crate's error type.
use thiserror::Error as ThisError;

/// Errors from configuring, running or evaluating an experiment.
#[derive(Debug, ThisError)]
pub enum Error {
    /// A bad config file, override or value; the message names the file and key.
    #[error("{0}")]
    Config(String),
    /// A run directory that is missing, incomplete, or already in use.
    #[error("{0}")]
    RunDir(String),
    /// Reading or writing a file.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The distributed runtime failed: a server that cannot listen, a runtime that cannot start.
    #[error("{0}")]
    Runtime(String),
    /// An environment refused an action or argument.
    #[error(transparent)]
    Env(#[from] flotilla_core::Error),
    /// The algorithm failed.
    #[error(transparent)]
    Algorithm(#[from] flotilla_algorithms::Error),
    /// Writing an observability output (a TensorBoard event file) failed.
    #[error(transparent)]
    Observe(#[from] flotilla_observe::Error),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
