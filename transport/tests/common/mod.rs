//! What the transport's integration tests share: a learner that answers every call.
use flotilla_core::{Chunk, Gradient, Params};
use flotilla_transport::{Ack, LearnerService, MessageKey, Registered, Registration, RpcError, RunInfo};

/// A learner that answers every call; a chunk's or a gradient's answer carries the message's idempotency key
/// back (`policy_version` = sender, `env_steps` = seq), so a test sees the key travel.
pub struct Echo;

impl LearnerService for Echo {
    fn run_info(&self) -> RunInfo {
        RunInfo { run_id: "run-1".into(), config_toml: "[env]\nid = \"CartPole-v1\"\n".into() }
    }

    fn register(&self, r: Registration) -> Result<Registered, RpcError> {
        Ok(Registered {
            actor_id: 7,
            actor_index: r.actor_index.unwrap_or(0),
            n_actors: 1,
            seed: 1,
            chunk_steps: 8,
            policy_version: 1,
            synchronous: false,
        })
    }

    async fn ingest(&self, _chunk: Chunk, key: MessageKey) -> Result<Ack, RpcError> {
        Ok(echo(key))
    }

    async fn gradient(&self, _gradient: Gradient, key: MessageKey) -> Result<Ack, RpcError> {
        Ok(echo(key))
    }

    fn params(&self, _actor_id: u64, _have: Option<u64>) -> Result<Option<Params>, RpcError> {
        Ok(None)
    }
}

fn echo(key: MessageKey) -> Ack {
    Ack { finished: false, policy_version: key.sender, env_steps: key.seq, total_env_steps: 1, accepted: true }
}
