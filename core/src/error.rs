use thiserror::Error as ThisError;

/// Errors shared by environments and the crates built on them. Messages name the input that was wrong.
#[derive(Debug, Clone, PartialEq, ThisError)]
pub enum Error {
    /// An action that is not in the environment's action space (out of range, wrong length, NaN, wrong kind).
    #[error("invalid action for {env}: {detail}")]
    InvalidAction {
        /// Environment id, e.g. `CartPole-v1`.
        env: String,
        /// What was wrong with the action.
        detail: String,
    },
    /// `step` was called before the first `reset` (Gymnasium's `OrderEnforcing`).
    #[error("{env}: step() called before reset()")]
    ResetNeeded {
        /// Environment id.
        env: String,
    },
    /// An environment id that the registry does not know.
    #[error("unknown environment id {id:?}; known ids: {known}")]
    UnknownEnv {
        /// The id that was asked for.
        id: String,
        /// Comma-separated list of registered ids.
        known: String,
    },
    /// A constructor argument that is unknown, of the wrong type, or out of range.
    #[error("{env}: bad argument {key:?}: {detail}")]
    BadArgument {
        /// Environment id.
        env: String,
        /// The argument's name.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// A physical state of the wrong length or with non-finite values.
    #[error("{env}: invalid state: {detail}")]
    InvalidState {
        /// Environment id.
        env: String,
        /// What was wrong.
        detail: String,
    },
    /// A snapshot that does not fit the env asked to restore it (another id, another layout).
    #[error("{env}: cannot restore snapshot: {detail}")]
    InvalidSnapshot {
        /// Id of the env that refused it.
        env: String,
        /// What did not fit.
        detail: String,
    },
    /// The environment's implementation failed, e.g. an exception inside a Python env; the message is its own.
    #[error("{env}: {detail}")]
    Backend {
        /// Environment id.
        env: String,
        /// What the implementation said.
        detail: String,
    },
    /// The operation is not available for this environment (e.g. setting the state of an emulator).
    #[error("{env}: {what} is not supported")]
    Unsupported {
        /// Environment id.
        env: String,
        /// The operation.
        what: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
