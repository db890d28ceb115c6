//! Plain data that crosses Flotilla's crate boundaries.
//!
//! This crate holds only types and traits — [`Space`], [`Action`], [`Obs`], [`Step`], the [`Env`] trait
//! with Gymnasium 1.x semantics, [`EnvSnapshot`] for exact resume, what actors send learners ([`Chunk`], [`Gradient`], [`Versioned`]
//! parameters), the shared [`Error`], and how an on/off environment switch reads ([`parse_switch`]) — so it builds
//! in seconds and every other crate can depend on it. It deliberately knows nothing of libtorch, tokio, files or the network.
#![deny(missing_docs)]

mod env;
mod error;
mod obs;
mod snapshot;
mod space;
mod switch;
mod trajectory;

pub use env::{Action, Env, Info, Obs, Step};
pub use error::{Error, Result};
pub use obs::{ObsBuf, ObsRef};
pub use snapshot::EnvSnapshot;
pub use space::{DType, Space};
pub use switch::parse_switch;
pub use trajectory::{Chunk, ChunkSpec, EpisodeStats, Gradient, LengthMismatch, Params, Versioned};
