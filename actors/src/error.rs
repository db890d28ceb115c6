use thiserror::Error as ThisError;

/// Why an actor stopped.
#[derive(Debug, ThisError)]
pub enum Error {
    /// The learner refused or could not be reached within the reconnect window.
    #[error("learner: {0}")]
    Rpc(#[from] flotilla_transport::RpcError),
    /// Building envs or the agent from the learner's config failed.
    #[error("setup: {0}")]
    Setup(String),
    /// An env refused an action.
    #[error(transparent)]
    Env(#[from] flotilla_core::Error),
    /// The policy failed.
    #[error(transparent)]
    Algorithm(#[from] flotilla_algorithms::Error),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
