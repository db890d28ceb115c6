//! The algorithms crate's error type.
use thiserror::Error as ThisError;

/// Errors from building, running, saving or loading an algorithm.
#[derive(Debug, ThisError)]
pub enum Error {
    /// The algorithm cannot work with this observation or action space.
    #[error("unsupported {which} space for {algorithm}: {detail}")]
    UnsupportedSpace {
        /// `"observation"` or `"action"`.
        which: &'static str,
        /// Algorithm name.
        algorithm: &'static str,
        /// What is wrong with the space.
        detail: String,
    },
    /// A configuration value out of its valid range.
    #[error("invalid {algorithm} config: {field} = {value}: {detail}")]
    InvalidConfig {
        /// Algorithm name.
        algorithm: &'static str,
        /// Field name as in the TOML file.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The valid range.
        detail: String,
    },
    /// Input data of the wrong size.
    #[error("{what}: got {got} values, expected {expected}")]
    BadLength {
        /// What was being read.
        what: String,
        /// Number of values received.
        got: usize,
        /// Number of values expected.
        expected: usize,
    },
    /// Saving or loading weights failed.
    #[error("{action} weights at {path}: {source}")]
    Weights {
        /// `"saving"` or `"loading"`.
        action: &'static str,
        /// The file.
        path: String,
        /// What libtorch said.
        source: tch::TchError,
    },
    /// Starting from another run's weights, freezing or reinitialising layers failed (a missing layer, a shape
    /// that differs): the message names the layer and both shapes.
    #[error("{0}")]
    Init(String),
    /// A checkpoint that cannot be written, read, or does not match the agent.
    #[error("{0}")]
    Checkpoint(String),
    /// The algorithm has no such role (e.g. applying actors' gradients outside A3C).
    #[error("{0}")]
    Unsupported(String),
    /// An update produced a non-finite loss or gradient; nothing was applied.
    #[error("{0}")]
    NonFinite(String),
    /// Averaging over the replicas of a data-parallel group failed (a lost rank, a timeout).
    #[error("data-parallel sync: {0}")]
    Sync(String),
    /// A libtorch call failed.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// [`Error::BadLength`].
    pub(crate) fn length(what: impl Into<String>, got: usize, expected: usize) -> Self {
        Error::BadLength { what: what.into(), got, expected }
    }

    /// [`Error::UnsupportedSpace`].
    pub(crate) fn space(which: &'static str, algorithm: &'static str, detail: impl Into<String>) -> Self {
        Error::UnsupportedSpace { which, algorithm, detail: detail.into() }
    }

    /// [`Error::InvalidConfig`].
    pub(crate) fn config(
        algorithm: &'static str,
        field: &'static str,
        value: impl ToString,
        detail: impl Into<String>,
    ) -> Self {
        Error::InvalidConfig { algorithm, field, value: value.to_string(), detail: detail.into() }
    }
}

impl From<flotilla_core::LengthMismatch> for Error {
    fn from(m: flotilla_core::LengthMismatch) -> Self {
        Error::length(m.what, m.got, m.expected)
    }
}
