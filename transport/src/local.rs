//! The in-process carrier: a [`LearnerClient`] that calls a [`LearnerService`] directly, with the same token
//! check and the same back-pressure as gRPC but no encoding. Actors on threads of the learner's process use it.
use std::sync::Arc;

use flotilla_core::{Chunk, Gradient, Params};

use crate::error::{Code, RpcError};
use crate::service::{Ack, LearnerClient, LearnerService, MessageKey, Registered, Registration, RunInfo, check_token};

/// A client bound to a service in this process.
pub struct LocalClient<S> {
    service: Arc<S>,
    token: String,
    expected: String,
    runtime: tokio::runtime::Runtime,
}

impl<S: LearnerService> LocalClient<S> {
    /// A client presenting `token` to `service`, whose run token is `expected`.
    pub fn new(service: Arc<S>, expected: &str, token: &str) -> Result<Self, RpcError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| RpcError::new(Code::Internal, format!("tokio runtime: {e}")))?;
        Ok(LocalClient { service, token: token.to_string(), expected: expected.to_string(), runtime })
    }

    fn admit(&self, rpc: &str) -> Result<(), RpcError> {
        check_token(&self.expected, Some(&self.token)).inspect_err(|e| {
            tracing::warn!("refused {rpc} from a local client: {}", e.message);
        })
    }
}

impl<S: LearnerService> LearnerClient for LocalClient<S> {
    fn run_info(&mut self) -> Result<RunInfo, RpcError> {
        self.admit("GetRunInfo")?;
        Ok(self.service.run_info())
    }

    fn register(&mut self, registration: &Registration) -> Result<Registered, RpcError> {
        self.admit("Register")?;
        self.service.register(registration.clone())
    }

    fn send_chunk(&mut self, chunk: &Chunk, key: MessageKey) -> Result<Ack, RpcError> {
        self.admit("SendChunk")?;
        self.runtime.block_on(self.service.ingest(chunk.clone(), key))
    }

    fn send_gradient(&mut self, gradient: &Gradient, key: MessageKey) -> Result<Ack, RpcError> {
        self.admit("SendGradient")?;
        self.runtime.block_on(self.service.gradient(gradient.clone(), key))
    }

    fn params(&mut self, actor_id: u64, have: Option<u64>) -> Result<Option<Params>, RpcError> {
        self.admit("GetParams")?;
        self.service.params(actor_id, have)
    }
}
