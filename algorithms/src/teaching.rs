//! What a trained policy says about a batch of states ([`Teaching`]): the targets a distillation student learns,
//! given by any kind that can teach.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// What a trained policy says about a batch of `B` states, the target a student learns (no gradient).
#[derive(Debug)]
pub enum Teaching {
    /// Action logits of a categorical policy, `[B, n]`.
    Logits(Tensor),
    /// Q-values, `[B, n]`.
    QValues(Tensor),
    /// A diagonal Gaussian policy: means `[B, D]`, log standard deviations `[B, D]` or `[D]`.
    Gaussian {
        /// Means.
        mean: Tensor,
        /// Log standard deviations.
        log_std: Tensor,
    },
    /// A deterministic policy's actions in env units, `[B, D]`.
    Actions(Tensor),
}

/// Which of the [`Teaching`] variants a teacher gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TeachingKind {
    /// [`Teaching::Logits`].
    Logits,
    /// [`Teaching::QValues`].
    QValues,
    /// [`Teaching::Gaussian`].
    Gaussian,
    /// [`Teaching::Actions`].
    Actions,
}

impl Teaching {
    /// Which kind this is.
    pub fn kind(&self) -> TeachingKind {
        match self {
            Teaching::Logits(_) => TeachingKind::Logits,
            Teaching::QValues(_) => TeachingKind::QValues,
            Teaching::Gaussian { .. } => TeachingKind::Gaussian,
            Teaching::Actions(_) => TeachingKind::Actions,
        }
    }

    /// The label rows stored in replay, `[B, L]` on the CPU: the outputs (`n` or `D` floats), or for a
    /// Gaussian its means then its log-stds (`2D`).
    pub fn labels(&self) -> Tensor {
        let t = match self {
            Teaching::Logits(t) | Teaching::QValues(t) | Teaching::Actions(t) => t.shallow_clone(),
            Teaching::Gaussian { mean, log_std } => Tensor::cat(&[mean.shallow_clone(), log_std.expand_as(mean)], 1),
        };
        t.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous()
    }
}
