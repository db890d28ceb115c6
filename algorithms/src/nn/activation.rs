//! Hidden-layer nonlinearities, shared by the libtorch networks ([`crate::nn::nets`]) and the host passes
//! ([`crate::nn::host_mlp`], `host_train`).
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

    /// Apply in place, on the host.
    #[inline(always)]
    pub(crate) fn apply_host(self, h: &mut [f32]) {
        match self {
            Activation::Tanh => crate::nn::host_train::tanh_in_place(h),
            Activation::Relu => h.iter_mut().for_each(|v| *v = v.max(0.0)),
        }
    }

    /// `d ← d ⊙ act'` on the host given the activation's output `y` (tanh' = 1 − y², relu' = [y > 0], as
    /// libtorch's backward kernels compute them from the output).
    #[inline(always)]
    pub(crate) fn backward_host(self, y: &[f32], d: &mut [f32]) {
        match self {
            Activation::Tanh => d.iter_mut().zip(y).for_each(|(d, y)| *d *= 1.0 - y * y),
            // A select, not a conditional store: the store's branch kept this loop scalar (half the backward
            // pass's time on CartPole's DQN). Same values either way.
            Activation::Relu => d.iter_mut().zip(y).for_each(|(d, &y)| *d = if y <= 0.0 { 0.0 } else { *d }),
        }
    }
}
