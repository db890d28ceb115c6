//! The interface both carriers share: [`LearnerService`] (implemented by the learner) and [`LearnerClient`]
//! (used by actors), with the handshake messages.
use std::future::Future;

use flotilla_core::{Chunk, Gradient, Params, Space};

use crate::error::{Code, RpcError};

/// The run an actor is joining.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// Unique per learner start; registration and reconnects check it.
    pub run_id: String,
    /// The learner's resolved experiment config (TOML): the actor builds its envs and policy from it.
    pub config_toml: String,
}

/// An actor asking to join.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// The run the actor means to join (from [`RunInfo`]).
    pub run_id: String,
    /// Its envs' observation space.
    pub observation_space: Space,
    /// Its envs' action space.
    pub action_space: Space,
    /// Envs it steps.
    pub n_envs: usize,
    /// The slot a launcher assigned (`None`: the learner picks the lowest free one).
    pub actor_index: Option<u32>,
    /// Host name, for logs.
    pub host: String,
    /// Process id, for logs.
    pub pid: u32,
}

/// The learner's answer to a [`Registration`].
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    /// The id to put on every chunk (new for each registration, so a restarted actor is a new actor).
    pub actor_id: u64,
    /// The actor's slot `0..n_actors` (sets its exploration and seed).
    pub actor_index: u32,
    /// Slots in the run.
    pub n_actors: u32,
    /// Seed for the actor's envs and sampling.
    pub seed: u64,
    /// Steps per chunk.
    pub chunk_steps: usize,
    /// Newest published parameter version.
    pub policy_version: u64,
    /// Wait for each message's ack and collect again only with the parameters it names: on-policy chunks are
    /// acked after the update they feed (synchronous mode), A3C gradients after they are applied.
    pub synchronous: bool,
}

/// The learner's answer to a chunk or gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The run is over: stop.
    pub finished: bool,
    /// Newest published parameter version (fetch it when newer than yours).
    pub policy_version: u64,
    /// Env steps the learner has received so far.
    pub env_steps: u64,
    /// The run's budget of env steps.
    pub total_env_steps: u64,
    /// The learner's queue took the message (delivered: the run accounts for it, trained on or not); `false`
    /// where it was refused because the run was over.
    pub accepted: bool,
}

/// A message's idempotency key: a random id of the sending process and the message's number from it. An
/// actor numbers its messages 1, 2, … and a resend keeps its number, so a message whose first send reached the
/// learner but whose answer was lost (a partition, a reset connection) is not taken twice. The learner takes
/// each key once ([`LearnerService::ingest`]); [`MessageKey::NONE`] (sender 0) opts out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageKey {
    /// The sending process's id, random (0: no key).
    pub sender: u64,
    /// The message's number from `sender`, from 1.
    pub seq: u64,
}

impl MessageKey {
    /// No key: the message is taken however often it arrives.
    pub const NONE: MessageKey = MessageKey { sender: 0, seq: 0 };

    /// A sender id for this process: random (the standard library's per-process hash keys, mixed with the pid
    /// and the clock), never 0.
    pub fn new_sender() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        h.finish().max(1)
    }

    /// Whether the message has a key.
    pub fn is_some(&self) -> bool {
        self.sender != 0
    }
}

/// The learner side. Implemented once; served by [`crate::grpc::serve`] or called by
/// [`crate::local::LocalClient`]. Token and protocol checks happen before these methods are called.
pub trait LearnerService: Send + Sync + 'static {
    /// The run actors are joining.
    fn run_info(&self) -> RunInfo;
    /// Admit an actor: check its run id and env spaces.
    fn register(&self, registration: Registration) -> Result<Registered, RpcError>;
    /// Take a chunk: validate it (refuse with [`Code::InvalidArgument`] naming the problem) and queue it,
    /// waiting while the queue is full. A `key` taken before is answered as delivered and not taken again.
    fn ingest(&self, chunk: Chunk, key: MessageKey) -> impl Future<Output = Result<Ack, RpcError>> + Send;
    /// Take an A3C gradient, like [`LearnerService::ingest`].
    fn gradient(&self, gradient: Gradient, key: MessageKey) -> impl Future<Output = Result<Ack, RpcError>> + Send;
    /// The newest parameters if newer than `have`, else `None`.
    fn params(&self, actor_id: u64, have: Option<u64>) -> Result<Option<Params>, RpcError>;
}

/// The actor side: blocking calls, one at a time, from an OS thread.
pub trait LearnerClient: Send {
    /// [`LearnerService::run_info`].
    fn run_info(&mut self) -> Result<RunInfo, RpcError>;
    /// [`LearnerService::register`].
    fn register(&mut self, registration: &Registration) -> Result<Registered, RpcError>;
    /// [`LearnerService::ingest`]; returns when the learner has queued the chunk. Send a message again with
    /// the same `key`.
    fn send_chunk(&mut self, chunk: &Chunk, key: MessageKey) -> Result<Ack, RpcError>;
    /// [`LearnerService::gradient`].
    fn send_gradient(&mut self, gradient: &Gradient, key: MessageKey) -> Result<Ack, RpcError>;
    /// [`LearnerService::params`].
    fn params(&mut self, actor_id: u64, have: Option<u64>) -> Result<Option<Params>, RpcError>;
}

/// Compare a presented token with the run's in time independent of where they differ.
pub fn check_token(expected: &str, given: Option<&str>) -> Result<(), RpcError> {
    let Some(given) = given else {
        return Err(RpcError::new(Code::Unauthenticated, "missing run token (authorization: Bearer <token>)"));
    };
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    let diff = a.iter().zip(b).fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y));
    if diff == 0 { Ok(()) } else { Err(RpcError::new(Code::Unauthenticated, "wrong run token")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_must_match_exactly() {
        assert!(check_token("abc", Some("abc")).is_ok());
        for given in [Some("abd"), Some("ab"), Some("abcd"), Some(""), None] {
            assert_eq!(check_token("abc", given).unwrap_err().code, Code::Unauthenticated, "{given:?}");
        }
    }
}
