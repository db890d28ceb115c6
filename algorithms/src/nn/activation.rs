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

/// Elements from which a CPU tensor takes libtorch's tanh kernel rather than `2σ(2x) − 1`: measured on one
/// thread (AMD EPYC), the four-pass form wins forward and backward up to 4 M elements and loses by ~2× at 16 M.
const TANH_KERNEL_FROM: usize = 8 << 20;

impl Activation {
    /// Apply to a tensor (training and libtorch acting).
    pub(crate) fn apply(self, x: &Tensor) -> Tensor {
        match self {
            // One tanh kernel on an accelerator (four elementwise kernels cost four launches and passes over
            // memory), and on the CPU for a tensor too large for the caches (a stacked population's batch:
            // there the four passes cost ~2× the one, forward and backward). Else 2σ(2x) − 1 = tanh(x):
            // libtorch's CPU tanh kernel is ~2-3× slower per element than its sigmoid on a batch that fits.
            Activation::Tanh if x.device().is_cuda() || x.numel() >= TANH_KERNEL_FROM => x.tanh(),
            Activation::Tanh => (x * 2.0).sigmoid() * 2.0 - 1.0,
            Activation::Relu => x.relu(),
        }
    }

    /// Apply in place, on the host.
    #[inline(always)]
    pub(crate) fn apply_host(self, h: &mut [f32]) {
        match self {
            Activation::Tanh => tanh_in_place(h),
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

/// `tanh` of every element, vectorised (16 lanes with AVX-512, 8 with AVX2). Within 2 ulp-ish of the true
/// value (absolute error < 1.5e-7 everywhere; tested against `f64::tanh`); same results with and without
/// AVX (no fused multiply-adds).
pub(crate) fn tanh_in_place(h: &mut [f32]) {
    match crate::nn::lanes::lanes().unwrap_or_else(|e| panic!("{e}")) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX-512 only where the CPU has AVX-512F.
        crate::nn::lanes::Lanes::Avx512 => unsafe { tanh_avx512(h) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX2 only where the CPU has it.
        crate::nn::lanes::Lanes::Avx2 => unsafe { tanh_avx2(h) },
        _ => h.iter_mut().for_each(|v| *v = tanh_lane(*v)),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn tanh_avx512(h: &mut [f32]) {
    h.iter_mut().for_each(|v| *v = tanh_lane(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tanh_avx2(h: &mut [f32]) {
    h.iter_mut().for_each(|v| *v = tanh_lane(*v));
}

/// One lane of [`tanh_in_place`], branch-free so loops over it vectorise: `tanh a = m / (m + 2)` with
/// `m = e^{2a} − 1` for `a = |x|`, the sign put back at the end.
#[inline(always)]
fn tanh_lane(x: f32) -> f32 {
    let a = x.abs().min(10.0); // tanh(10) rounds to 1 in f32
    let m = expm1_lane(2.0 * a);
    let t = m / (m + 2.0);
    // `min` above turned NaN into 10; keep NaN (a non-finite loss must stay visible).
    if x.is_nan() { x } else { t.copysign(x) }
}

/// `e^y − 1` for `0 ≤ y ≤ 20`, branch-free and accurate near 0: `y = n ln 2 + r` with |r| ≤ ln2/2,
/// `e^r − 1` by its Taylor polynomial to r⁷, then `2ⁿ(e^r − 1) + (2ⁿ − 1)` with `2ⁿ` put in the exponent bits.
#[inline(always)]
fn expm1_lane(y: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer, kept in the low bits
    let shifted = y * std::f32::consts::LOG2_E + SHIFTER;
    let n = shifted - SHIFTER;
    // ln 2 split in two so n·LN2_HI is exact.
    let r = (y - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let mut p = 1.0 / 5040.0f32;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let em1_r = r + r * r * p;
    // 2ⁿ from the integer in `shifted`'s mantissa (no float→int conversion, which would not vectorise).
    let two_n = f32::from_bits(shifted.to_bits().wrapping_sub(SHIFTER.to_bits()).wrapping_add(127) << 23);
    two_n * em1_r + (two_n - 1.0)
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::*;

    /// Both forms of tanh on the CPU (the four-pass form below [`TANH_KERNEL_FROM`] elements, libtorch's kernel
    /// from there) are tanh to float rounding, values and gradients: a large tensor's rows equal the same rows
    /// taken alone.
    #[test]
    fn tanh_is_tanh_either_side_of_the_kernel_threshold() {
        tch::manual_seed(3);
        let x = (Tensor::randn([TANH_KERNEL_FROM as i64 / 64 + 1, 64], (Kind::Float, tch::Device::Cpu)) * 3.0)
            .set_requires_grad(true);
        let small = x.narrow(0, 0, 64).detach().set_requires_grad(true);
        let (big_y, small_y) = (Activation::Tanh.apply(&x), Activation::Tanh.apply(&small));
        let close = |a: &Tensor, b: &Tensor| f64::try_from((a - b).abs().max()).unwrap();
        assert!(close(&big_y.narrow(0, 0, 64), &small_y) <= 1e-6);
        assert!(close(&small_y, &small.tanh()) <= 1e-6);
        big_y.sum(Kind::Float).backward();
        small_y.sum(Kind::Float).backward();
        assert!(close(&x.grad().narrow(0, 0, 64), &small.grad()) <= 1e-6);
    }
}
