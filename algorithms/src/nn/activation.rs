//! Hidden-layer nonlinearities, shared by the libtorch networks ([`crate::nn::nets`]) and their host forward
//! pass ([`crate::nn::host_mlp`]).
use serde::{Deserialize, Serialize};
use tch::Tensor;

/// Hidden-layer nonlinearity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `tanh` (SB3's default for on-policy MLPs).
    #[default]
    Tanh,
    /// `relu`.
    Relu,
}

impl Activation {
    /// Apply to a tensor (training and libtorch acting).
    pub(crate) fn apply(self, x: &Tensor) -> Tensor {
        match self {
            // 2σ(2x) − 1 = tanh(x): libtorch's CPU tanh kernel is ~5× slower than its sigmoid here.
            Activation::Tanh => (x * 2.0).sigmoid() * 2.0 - 1.0,
            Activation::Relu => x.relu(),
        }
    }
}
