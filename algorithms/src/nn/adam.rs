//! Adam (Kingma & Ba 2015) over a [`FlatParams`] buffer: one step is eight tensor ops for the whole model.
//!
//! Same update as `torch.optim.Adam` (no weight decay, no AMSGrad):
//! `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `θ ← θ − (lr / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)`.
use tch::Tensor;

use crate::Result;
use crate::checkpoint::Checkpoint;
use crate::nn::lanes::{Lanes, lanes};
use crate::nn::members::{Coef, per_member};
use crate::nn::params::FlatParams;

/// Adam state for one flat parameter buffer.
#[derive(Debug)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay β₁.
    pub beta1: f64,
    /// Second-moment decay β₂.
    pub beta2: f64,
    /// ε added to the denominator.
    pub eps: f64,
    pub(crate) steps: u64,
    pub(crate) exp_avg: Tensor,
    pub(crate) exp_avg_sq: Tensor,
}

impl Adam {
    /// Fresh state for `params` (its trainable scalars: frozen layers get no moments) with PyTorch's default
    /// betas.
    pub fn new(params: &FlatParams, lr: f64, eps: f64) -> Self {
        let zeros = || params.trainable_grad().zeros_like().detach();
        Adam { lr, beta1: 0.9, beta2: 0.999, eps, steps: 0, exp_avg: zeros(), exp_avg_sq: zeros() }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Scalars the moments cover (the trainable ones of the buffer this state was made or last stepped for).
    pub fn state_numel(&self) -> i64 {
        self.exp_avg.numel() as i64
    }

    /// Apply one update from the gradient accumulated in `params` (a no-op when there is none). Only the
    /// trainable scalars have moments and move; when that set changed since the last step (layers frozen
    /// after this state was made), the state starts afresh for the new set.
    pub fn step(&mut self, params: &mut FlatParams) {
        if !params.flat().grad().defined() {
            return;
        }
        let grad = params.trainable_grad();
        if self.exp_avg.size() != grad.size() {
            self.exp_avg = grad.zeros_like().detach();
            self.exp_avg_sq = grad.zeros_like().detach();
            self.steps = 0;
        }
        self.steps += 1;
        let step = Coef::One(-self.lr / bias(self.beta1, self.steps));
        let (betas, eps) = ((self.beta1, self.beta2), Coef::One(self.eps));
        tch::no_grad(|| {
            let (m, v) = (&mut self.exp_avg, &mut self.exp_avg_sq);
            let (scaled, denom) = moments_step(m, v, &grad, self.steps, betas, &step, &eps);
            if params.has_frozen() {
                params.add_to_trainable(&(scaled / denom)).expect("moments sized to the trainable scalars");
            } else {
                let mut theta = params.flat().shallow_clone();
                let _ = theta.addcdiv_(&scaled, &denom);
            }
        });
    }

    /// [`Adam::step`] on host slices (the fused CPU training step, [`crate::nn::host_train`]): `grad` for every
    /// scalar of `theta`, the moments read and written in place. Needs CPU f32 moments covering all of
    /// `theta` (nothing frozen); returns false, changing nothing, when they do not.
    pub(crate) fn step_host(&mut self, theta: &mut [f32], grad: &[f32]) -> bool {
        let host = |t: &Tensor| {
            t.device() == tch::Device::Cpu
                && t.kind() == tch::Kind::Float
                && t.is_contiguous()
                && t.numel() == theta.len()
                && grad.len() == theta.len()
        };
        if !host(&self.exp_avg) || !host(&self.exp_avg_sq) {
            return false;
        }
        let n = theta.len();
        // SAFETY: both moments are contiguous f32 CPU tensors of `n` elements (checked above) that this state
        // owns exclusively (`&mut self`); no libtorch op runs on them while the slices live.
        let (m, v) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.exp_avg.data_ptr() as *mut f32, n),
                std::slice::from_raw_parts_mut(self.exp_avg_sq.data_ptr() as *mut f32, n),
            )
        };
        self.steps += 1;
        adam_step(theta, grad, m, v, self.steps, self.lr, (self.beta1, self.beta2, self.eps));
        true
    }

    /// Save the moments and step count under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        c.put_tensor(format!("{prefix}.exp_avg"), &self.exp_avg);
        c.put_tensor(format!("{prefix}.exp_avg_sq"), &self.exp_avg_sq);
        c.put_meta(format!("{prefix}.steps"), &self.steps)
    }

    /// Restore what [`Adam::write_to`] saved for `params` (the learning rate is the caller's: schedules set
    /// it). Moments for another number of trainable scalars (a run with other frozen layers) are an error,
    /// unless no step was taken yet (then they are zeros for the trainable scalars).
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str, params: &FlatParams) -> Result<()> {
        self.steps = c.meta(&format!("{prefix}.steps"))?;
        self.exp_avg = params.take_optimiser_state(c, &format!("{prefix}.exp_avg"), self.steps)?;
        self.exp_avg_sq = params.take_optimiser_state(c, &format!("{prefix}.exp_avg_sq"), self.steps)?;
        Ok(())
    }
}

/// The members' Adam states stacked on the member axis ([`crate::nn::members`]) for one step of all: moments
/// `[N, P]`, per-member ε, the shared step count and betas. Moments of another size than the parameters (made
/// while layers were frozen) start afresh at step 0, as [`Adam::step`] restarts them.
pub(crate) struct StackedAdam {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: u64,
    betas: (f64, f64),
    eps: Coef,
}

impl StackedAdam {
    /// `opts[k]` is the optimiser of row `k` of `params` (`[N, P]`).
    pub(crate) fn new(opts: &[&Adam], params: &Tensor) -> Self {
        let fresh = opts.iter().any(|o| o.exp_avg.numel() as i64 != params.size()[1]);
        let stack = |pick: fn(&Adam) -> &Tensor| match fresh {
            true => params.zeros_like().detach(),
            false => Tensor::stack(&opts.iter().map(|o| pick(o).shallow_clone()).collect::<Vec<_>>(), 0),
        };
        StackedAdam {
            exp_avg: stack(|o| &o.exp_avg),
            exp_avg_sq: stack(|o| &o.exp_avg_sq),
            steps: if fresh { 0 } else { opts[0].steps },
            betas: (opts[0].beta1, opts[0].beta2),
            eps: Coef::Each(per_member(opts.iter().map(|o| o.eps), params.device())),
        }
    }

    /// One Adam step ([`Adam::step`]'s ops) of every member's parameters (rows of `params`) from its gradient
    /// (rows of `grad`), with per-member learning rates.
    pub(crate) fn step(&mut self, params: &Tensor, grad: &Tensor, lrs: &[f64]) {
        self.steps += 1;
        let bias1 = bias(self.betas.0, self.steps);
        let step = Coef::Each(per_member(lrs.iter().map(|lr| -lr / bias1), params.device()));
        tch::no_grad(|| {
            let (m, v) = (&mut self.exp_avg, &mut self.exp_avg_sq);
            let (scaled, denom) = moments_step(m, v, grad, self.steps, self.betas, &step, &self.eps);
            let mut theta = params.shallow_clone();
            let _ = theta.addcdiv_(&scaled, &denom);
        });
    }

    /// Member `k`'s moments and step count back into its optimiser: views of its rows, not copies (a copy per
    /// member and moment is thousands of kernel launches per update for a large population on a GPU). The
    /// next stacking copies them again; a member stepping alone meanwhile moves only its own row.
    pub(crate) fn write_back(&self, k: usize, opt: &mut Adam) {
        opt.exp_avg = self.exp_avg.get(k as i64);
        opt.exp_avg_sq = self.exp_avg_sq.get(k as i64);
        opt.steps = self.steps;
    }
}

/// Adam's tensor arithmetic (`torch.optim.Adam`, op for op), one member or many: the moments `m`, `v` move
/// towards step `t`'s gradient in place; returns `(scaled, denom)`, the step being `θ += scaled / denom`.
/// `step` is `−lr / (1 − β₁ᵗ)`.
fn moments_step(
    m: &mut Tensor,
    v: &mut Tensor,
    grad: &Tensor,
    t: u64,
    (beta1, beta2): (f64, f64),
    step: &Coef,
    eps: &Coef,
) -> (Tensor, Tensor) {
    let _ = m.lerp_(grad, 1.0 - beta1);
    let _ = v.g_mul_scalar_(beta2).addcmul_(grad, &grad.g_mul_scalar(1.0 - beta2));
    (step.mul(m), eps.add(&(v.sqrt() / bias(beta2, t).sqrt())))
}

/// Adam's bias correction `1 − βᵗ`.
fn bias(beta: f64, t: u64) -> f64 {
    1.0 - beta.powi(t as i32)
}

/// One Adam step on host slices, the same arithmetic as [`Adam::step`] (`torch.optim.Adam`):
/// `m ← m + (1−β₁)(g − m)`, `v ← β₂v + (1−β₂)g²`, `θ ← θ − (lr/(1−β₁ᵗ)) · m / (√v/√(1−β₂ᵗ) + ε)`, with `t`
/// the step number (from 1).
#[allow(clippy::too_many_arguments)]
pub(crate) fn adam_step(
    theta: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    t: u64,
    lr: f64,
    (beta1, beta2, eps): (f64, f64, f64),
) {
    let (bias1, bias2) = (bias(beta1, t), bias(beta2, t));
    let k = AdamConstants {
        w1: (1.0 - beta1) as f32,
        b2: beta2 as f32,
        w2: (1.0 - beta2) as f32,
        step: (-lr / bias1) as f32,
        sqrt_bias2: bias2.sqrt() as f32,
        eps: eps as f32,
    };
    // Not `widest_lanes(|| …)`: slices captured by a closure lose `noalias`, and the loop then stays scalar.
    match lanes().unwrap_or_else(|e| panic!("{e}")) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX-512 only where the CPU has AVX-512F.
        Lanes::Avx512 => unsafe { adam_avx512(theta, grad, m, v, &k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX2 only where the CPU has it.
        Lanes::Avx2 => unsafe { adam_avx2(theta, grad, m, v, &k) },
        _ => adam_lanes(theta, grad, m, v, &k),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn adam_avx512(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    adam_lanes(theta, grad, m, v, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adam_avx2(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    adam_lanes(theta, grad, m, v, k)
}

/// Adam's per-step scalars in f32.
struct AdamConstants {
    w1: f32,
    b2: f32,
    w2: f32,
    step: f32,
    sqrt_bias2: f32,
    eps: f32,
}

/// The Adam loop, branch-free (it vectorises). Moments that decay below the smallest normal f32 are set to
/// 0: a parameter whose gradient stays 0 (a dead ReLU unit) would otherwise carry subnormal moments, on which
/// x86 arithmetic is ~100× slower; the step they would give is < 1e-30.
#[inline(always)]
fn adam_lanes(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    for (((th, &g), m), v) in theta.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
        let mut m1 = *m + k.w1 * (g - *m);
        let mut v1 = *v * k.b2 + g * (g * k.w2);
        m1 = if m1.abs() < f32::MIN_POSITIVE { 0.0 } else { m1 };
        v1 = if v1 < f32::MIN_POSITIVE { 0.0 } else { v1 };
        *m = m1;
        *v = v1;
        *th += (m1 * k.step) / (v1.sqrt() / k.sqrt_bias2 + k.eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, OptimizerConfig};
    use tch::{Device, Kind};

    #[test]
    fn matches_torch_adam() {
        // The same quadratic problem optimised by libtorch's Adam and ours.
        let target = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0, -1.0]);
        let init = Tensor::from_slice(&[0.1f32, 0.2, -0.3, 0.4, 0.0]);
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &init);
        let mut opt = nn::Adam { eps: 1e-5, ..Default::default() }.build(&vs, 0.05).unwrap();
        let mut params = FlatParams::new(vec![("w".into(), init.shallow_clone())], Device::Cpu);
        let mut adam = Adam::new(&params, 0.05, 1e-5);
        for _ in 0..50 {
            opt.zero_grad();
            ((&w - &target).square() * &target.abs()).sum(Kind::Float).backward();
            opt.step();
            params.zero_grad();
            ((params.view(0) - &target).square() * &target.abs()).sum(Kind::Float).backward();
            adam.step(&mut params);
        }
        let diff = f64::try_from((w.detach() - params.flat().detach()).abs().max()).unwrap();
        assert!(diff < 1e-5, "max difference {diff}");
        assert_eq!(adam.steps(), 50);
    }
}
