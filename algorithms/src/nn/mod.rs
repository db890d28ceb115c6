//! Networks and what trains them, shared by every algorithm: the flat parameter buffer ([`params`]), networks
//! over it ([`nets`], [`host_mlp`], [`activation`], `mixed`: bf16 training layers), the fused host training step (`host_train`, its matrix products `gemm` in f32 and bf16, vector width
//! [`lanes`]), recurrent cores ([`recurrent`], on the host `host_lstm`), the optimisers ([`optimiser`]: Adam and RMSprop, each with its tensor and host form), action distributions
//! ([`distributions`]) and gradient averaging over replicas ([`data_parallel`]), with the member axis
//! of populations (`members`; [`MemberStack`] is what a population's batched acting keeps) and the opt-in timing of
//! an update's phases ([`phases`]). Knows no algorithm.
pub mod activation;
pub mod data_parallel;
pub mod distributions;
pub(crate) mod gemm;
pub(crate) mod host_lstm;
pub mod host_mlp;
pub(crate) mod host_train;
pub mod lanes;
pub(crate) mod members;
pub(crate) mod mixed;
pub mod nets;
pub mod optimiser;
pub mod params;
pub mod phases;
pub mod recurrent;

pub use members::MemberStack;
