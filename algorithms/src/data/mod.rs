//! What algorithms learn from, and the pure maths over it: on-policy rollouts ([`rollout`]), replay of vectors
//! and of frame stacks ([`replay`], [`frame_replay`], prioritised through [`sum_tree`]), n-step returns
//! ([`n_step`]), GAE ([`gae`]) and V-trace ([`vtrace`]). Knows no algorithm.
pub mod frame_replay;
pub mod gae;
pub mod n_step;
pub mod replay;
pub mod rollout;
pub mod sum_tree;
pub mod vtrace;
