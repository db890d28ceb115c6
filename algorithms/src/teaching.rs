//! What a trained policy says about a batch of states ([`Teaching`]): the targets a distillation student learns,
//! given by any kind that can teach.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// What a trained policy says about a batch of `B` states, the target a student learns (no gradient).
#[derive(Debug)]
pub struct Teaching {
    /// What the labels are.
    pub kind: TeachingKind,
    /// The label rows stored in replay, `[B, L]` on the CPU: the outputs (`n` or `D` floats), or for a
    /// Gaussian its means then its log-stds (`2D`).
    pub labels: Tensor,
}

/// What a teacher gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TeachingKind {
    /// Action logits of a categorical policy, `[B, n]`.
    Logits,
    /// Q-values, `[B, n]`.
    QValues,
    /// A diagonal Gaussian policy ([`Teaching::gaussian`]).
    Gaussian,
    /// A deterministic policy's actions in env units, `[B, D]`.
    Actions,
}

impl Teaching {
    /// Outputs `[B, L]` of `kind` as labels.
    pub fn new(kind: TeachingKind, outputs: &Tensor) -> Self {
        Teaching { kind, labels: outputs.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous() }
    }

    /// A diagonal Gaussian: means `[B, D]`, log standard deviations `[B, D]` or `[D]`.
    pub fn gaussian(mean: &Tensor, log_std: &Tensor) -> Self {
        Teaching::new(TeachingKind::Gaussian, &Tensor::cat(&[mean.shallow_clone(), log_std.expand_as(mean)], 1))
    }
}
