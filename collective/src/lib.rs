//! Data-parallel collectives for Flotilla's learners, on libtorch's own c10d — the engine PyTorch's
//! DistributedDataParallel uses: Gloo on CPU, NCCL on CUDA. Nothing here is a collective of our own.
//!
//! - [`Rendezvous`]: where this process is in its group, read the torchrun way (`MASTER_ADDR`, `RANK`, …).
//! - [`ProcessGroup`]: joins the group (refusing ranks with a different config), then all-reduce, broadcast,
//!   all-gather, barrier and a parameter-agreement check, each returning `Result`: a rank that dies makes the
//!   others fail within the collective timeout with an error naming it.

//!
//! - [`codec`]: gradient compression (fp16/bf16 casts, top-k with error feedback).
//!
//! The C++ side is one file, `shim/c10d_shim.cpp`, compiled by build.rs against the libtorch tch uses.
#![deny(missing_docs)]

pub mod codec;
mod ffi;
pub mod group;
pub mod rendezvous;

pub use group::{Backend, GroupOptions, Lost, ProcessGroup, Store, has_nccl};
pub use rendezvous::Rendezvous;

/// What went wrong in a collective.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The group could not be formed: bad variables, an unreachable store, missing ranks, a config mismatch.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// A rendezvous-store operation failed.
    #[error("rendezvous store: {0}")]
    Store(String),
    /// A collective failed (a lost rank, a timeout).
    #[error("{op} failed on rank {rank}: {lost}: {message}")]
    Collective {
        /// The collective.
        op: String,
        /// The rank reporting.
        rank: usize,
        /// Which ranks stopped, as far as the heartbeats tell.
        lost: Lost,
        /// c10d's message.
        message: String,
    },
    /// Ranks that must hold identical values do not.
    #[error("{what} diverged: rank(s) {ranks:?} differ from rank 0")]
    Diverged {
        /// What was compared.
        what: String,
        /// The ranks whose checksum differs from rank 0's.
        ranks: Vec<usize>,
    },
    /// A tensor a collective cannot take.
    #[error("tensor: {0}")]
    Tensor(String),
}

/// The collective crate's result.
pub type Result<T> = std::result::Result<T, Error>;
