use thiserror::Error as ThisError;

/// Why a call failed, in gRPC's terms (the local transport uses the same codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The request was malformed: wrong shapes or dtypes, non-finite numbers, unknown actor, other protocol.
    InvalidArgument,
    /// Missing or wrong run token.
    Unauthenticated,
    /// The request is well formed but does not fit the run (env spaces differ, another run id).
    FailedPrecondition,
    /// The learner cannot be reached (not started, gone, restarting): retry with backoff.
    Unavailable,
    /// The message exceeds a size limit.
    ResourceExhausted,
    /// A deadline passed.
    DeadlineExceeded,
    /// Anything else.
    Internal,
}

/// A failed call: its [`Code`] and a message naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, ThisError)]
#[error("{code:?}: {message}")]
pub struct RpcError {
    /// What kind of failure.
    pub code: Code,
    /// Details.
    pub message: String,
}

impl RpcError {
    /// An error of `code` with `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into() }
    }

    /// [`Code::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// Whether reconnecting and retrying may help (the learner went away or is restarting).
    pub fn is_transient(&self) -> bool {
        matches!(self.code, Code::Unavailable | Code::DeadlineExceeded)
    }
}

impl From<tonic::Status> for RpcError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code as C;
        let code = match s.code() {
            C::InvalidArgument | C::OutOfRange => Code::InvalidArgument,
            C::Unauthenticated | C::PermissionDenied => Code::Unauthenticated,
            C::FailedPrecondition => Code::FailedPrecondition,
            C::Unavailable | C::Cancelled | C::Aborted => Code::Unavailable,
            C::ResourceExhausted => Code::ResourceExhausted,
            C::DeadlineExceeded => Code::DeadlineExceeded,
            // A connection reset mid-call surfaces as Unknown/Internal with an h2 error: treat it as gone.
            C::Unknown | C::Internal if s.message().contains("transport") || s.message().contains("h2") => {
                Code::Unavailable
            }
            _ => Code::Internal,
        };
        RpcError::new(code, s.message())
    }
}

impl From<RpcError> for tonic::Status {
    fn from(e: RpcError) -> Self {
        let code = match e.code {
            Code::InvalidArgument => tonic::Code::InvalidArgument,
            Code::Unauthenticated => tonic::Code::Unauthenticated,
            Code::FailedPrecondition => tonic::Code::FailedPrecondition,
            Code::Unavailable => tonic::Code::Unavailable,
            Code::ResourceExhausted => tonic::Code::ResourceExhausted,
            Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Code::Internal => tonic::Code::Internal,
        };
        tonic::Status::new(code, e.message)
    }
}
