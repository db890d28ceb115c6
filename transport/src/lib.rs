//! Flotilla's wire between actors and learners.
//!
//! One interface, two carriers: the learner implements [`LearnerService`] once; actors talk to it through a
//! [`LearnerClient`], either [`grpc::GrpcClient`] (tonic over TCP, one process per actor or many machines) or
//! [`local::LocalClient`] (a direct call in the same process). The same learner and actor code runs on both.
//!
//! ```text
//! actor                                   learner
//!   run_info()        ─────────────────►  RunInfo { run id, config }
//!   register(spaces)  ─────────────────►  checks version, run id, spaces ─► Registered { actor id, seed }
//!   loop:
//!     send_chunk(chunk) ───────────────►  validate ─► bounded ingest queue (waits when full) ─► Ack
//!     params(have)      ───────────────►  newest Versioned params, or None when up to date
//! ```
//!
//! Only this crate sees protobuf types ([`proto`]); they become `flotilla_core` types at its edge
//! ([`codec`]). Every call carries the run's token (checked here, for both carriers: a wrong one is
//! [`Code::Unauthenticated`] and a log line), and every gRPC request its protocol version (another one is
//! [`Code::InvalidArgument`] naming both). gRPC may run over TLS, mutual or not ([`tls`]); the token is
//! still required.
#![deny(missing_docs)]

pub mod codec;
mod error;
pub mod grpc;
mod guard;
pub mod local;
mod service;
pub mod tls;

pub use error::{Code, RpcError};
pub use service::{Ack, LearnerClient, LearnerService, MessageKey, Registered, Registration, RunInfo, check_token};

/// Version of the protocol in `proto/flotilla.proto`; peers must agree exactly.
pub const PROTOCOL_VERSION: u32 = 1;

/// The generated protobuf messages and tonic service (package `flotilla.v1`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("flotilla.v1");
}
