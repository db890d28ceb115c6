//! Flotilla's actor: step `E` envs in lock-step, act in one batched no-grad call on a local copy of the
//! parameters, cut trajectory chunks of `T` steps and send them to the learner while the envs keep going.
//!
//! ```text
//! connect ─► run_info (config) ─► build envs ─► register (spaces) ─► acting policy for the slot ─► params
//! env thread:  loop { pick up newer params if the IO thread fetched some
//!                     T × (act batched ─► step envs ─► record) ─► chunk (A3C: gradient) ─► IO queue (1 deep) }
//! IO thread:   loop { send ─► on an ack with a newer version, fetch params
//!                     learner gone ─► reconnect with exponential backoff, re-register, resend }
//! ```
//! The IO queue holds one message: the env thread collects the next chunk while the previous one is on the
//! wire, and waits only when the learner applies back-pressure. An actor never computes a learner update: it
//! holds only an acting policy ([`flotilla_algorithms::Acting`]: weights and the forward pass), and A3C's
//! gradient comes from the algorithm crate ([`flotilla_algorithms::GradientWorker`]) as a `Vec<f32>`.
#![deny(missing_docs)]

mod actor;
mod error;

pub use actor::{ActorFactory, ActorOptions, ActorReport, Connector, run_actor};
pub use error::{Error, Result};
