//! RMSprop (Tieleman & Hinton 2012, lecture 6.5) over a [`FlatParams`] buffer: one step is a handful of tensor
//! ops for the whole model.
//!
//! Same update as `torch.optim.RMSprop` without weight decay, momentum or centring (SB3's A2C optimiser):
//! `v ← αv + (1−α)g²`, `θ ← θ − lr · g / (√v + ε)`. Note ε is added *outside* the square root, unlike
//! TensorFlow's RMSprop (SB3's `RMSpropTFLike`), and `v` starts at 0.
use tch::Tensor;

use crate::Result;
use crate::checkpoint::Checkpoint;
use crate::nn::members::{Coef, per_member};
use crate::nn::params::FlatParams;

/// RMSprop state for one flat parameter buffer.
#[derive(Debug)]
pub struct RmsProp {
    /// Learning rate.
    pub lr: f64,
    /// Decay α of the running mean of squared gradients.
    pub alpha: f64,
    /// ε added to the denominator.
    pub eps: f64,
    pub(crate) steps: u64,
    pub(crate) square_avg: Tensor,
}

impl RmsProp {
    /// Fresh state (a zero running mean) for `params`' trainable scalars (frozen layers get none).
    pub fn new(params: &FlatParams, lr: f64, alpha: f64, eps: f64) -> Self {
        RmsProp { lr, alpha, eps, steps: 0, square_avg: params.trainable_grad().zeros_like().detach() }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Apply one update from the gradient accumulated in `params` (a no-op when there is none). Only the
    /// trainable scalars have state and move; when that set changed since the last step, the state starts
    /// afresh for the new set.
    pub fn step(&mut self, params: &mut FlatParams) {
        if !params.flat().grad().defined() {
            return;
        }
        let grad = params.trainable_grad();
        if self.square_avg.size() != grad.size() {
            self.square_avg = grad.zeros_like().detach();
            self.steps = 0;
        }
        self.steps += 1;
        let (alpha, weight) = (Coef::One(self.alpha), Coef::One(1.0 - self.alpha));
        let (step, eps) = (Coef::One(-self.lr), Coef::One(self.eps));
        tch::no_grad(|| {
            let (scaled, denom) = square_avg_step(&mut self.square_avg, &grad, (&alpha, &weight), &step, &eps);
            if params.has_frozen() {
                params.add_to_trainable(&(scaled / denom)).expect("state sized to the trainable scalars");
            } else {
                let mut theta = params.flat().shallow_clone();
                let _ = theta.addcdiv_(&scaled, &denom);
            }
        });
    }

    /// [`RmsProp::step`] on host slices (the fused CPU training step, [`crate::nn::host_train`]): `grad` for every
    /// scalar of `theta`, the running mean read and written in place. Needs a CPU f32 running mean covering
    /// all of `theta` (nothing frozen); returns false, changing nothing, when it does not.
    pub(crate) fn step_host(&mut self, theta: &mut [f32], grad: &[f32]) -> bool {
        let v = &self.square_avg;
        let n = theta.len();
        if v.device() != tch::Device::Cpu
            || v.kind() != tch::Kind::Float
            || !v.is_contiguous()
            || v.numel() != n
            || grad.len() != n
        {
            return false;
        }
        // SAFETY: the running mean is a contiguous f32 CPU tensor of `n` elements (checked above) that this
        // state owns exclusively (`&mut self`); no libtorch op runs on it while the slice lives.
        let v = unsafe { std::slice::from_raw_parts_mut(v.data_ptr() as *mut f32, n) };
        self.steps += 1;
        let (alpha, w, step, eps) = (self.alpha as f32, (1.0 - self.alpha) as f32, -self.lr as f32, self.eps as f32);
        // The same operations as `step`'s tensor ops, element by element: `v·α + g·(g·(1−α))`, then
        // `θ + (−lr·g) / (√v + ε)`. A running mean below the smallest normal f32 is set to 0 (a parameter whose
        // gradient stays 0 would otherwise carry subnormals, ~100× slower on x86; its step is 0 either way).
        for ((th, &g), v) in theta.iter_mut().zip(grad).zip(v.iter_mut()) {
            let v1 = *v * alpha + g * (g * w);
            let v1 = if v1 < f32::MIN_POSITIVE { 0.0 } else { v1 };
            *v = v1;
            *th += (g * step) / (v1.sqrt() + eps);
        }
        true
    }

    /// Save the running mean and step count under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        c.put_tensor(format!("{prefix}.square_avg"), &self.square_avg);
        c.put_meta(format!("{prefix}.steps"), &self.steps)
    }

    /// Restore what [`RmsProp::write_to`] saved for `params` (the learning rate is the caller's: schedules set
    /// it). State for another number of trainable scalars (other frozen layers) is an error, unless no step was
    /// taken yet (then it is zeros for the trainable scalars).
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str, params: &FlatParams) -> Result<()> {
        self.steps = c.meta(&format!("{prefix}.steps"))?;
        self.square_avg = params.take_optimiser_state(c, &format!("{prefix}.square_avg"), self.steps)?;
        Ok(())
    }
}

/// The members' RMSprop states stacked on the member axis ([`crate::nn::members`]) for one step of all: running
/// means `[N, P]`, per-member α and ε, the shared step count. A running mean of another size than the
/// parameters (made while layers were frozen) starts afresh at step 0, as [`RmsProp::step`] restarts it.
pub(crate) struct StackedRmsProp {
    square_avg: Tensor,
    steps: u64,
    alpha: Coef,
    weight: Coef,
    eps: Coef,
}

impl StackedRmsProp {
    /// `opts[k]` is the optimiser of row `k` of `params` (`[N, P]`).
    pub(crate) fn new(opts: &[&RmsProp], params: &Tensor) -> Self {
        let fresh = opts.iter().any(|o| o.square_avg.numel() as i64 != params.size()[1]);
        let d = params.device();
        StackedRmsProp {
            square_avg: match fresh {
                true => params.zeros_like().detach(),
                false => Tensor::stack(&opts.iter().map(|o| o.square_avg.shallow_clone()).collect::<Vec<_>>(), 0),
            },
            steps: if fresh { 0 } else { opts[0].steps },
            alpha: Coef::Each(per_member(opts.iter().map(|o| o.alpha), d)),
            weight: Coef::Each(per_member(opts.iter().map(|o| 1.0 - o.alpha), d)),
            eps: Coef::Each(per_member(opts.iter().map(|o| o.eps), d)),
        }
    }

    /// One RMSprop step ([`RmsProp::step`]'s ops) of every member's parameters (rows of `params`) from its
    /// gradient (rows of `grad`), with per-member learning rates.
    pub(crate) fn step(&mut self, params: &Tensor, grad: &Tensor, lrs: &[f64]) {
        self.steps += 1;
        let step = Coef::Each(per_member(lrs.iter().map(|lr| -lr), params.device()));
        tch::no_grad(|| {
            let alpha = (&self.alpha, &self.weight);
            let (scaled, denom) = square_avg_step(&mut self.square_avg, grad, alpha, &step, &self.eps);
            let mut theta = params.shallow_clone();
            let _ = theta.addcdiv_(&scaled, &denom);
        });
    }

    /// Member `k`'s running mean and step count back into its optimiser.
    pub(crate) fn write_back(&self, k: usize, opt: &mut RmsProp) {
        // A view of its row, as `StackedAdam::write_back` leaves the moments.
        opt.square_avg = self.square_avg.get(k as i64);
        opt.steps = self.steps;
    }
}

/// RMSprop's tensor arithmetic (`torch.optim.RMSprop`, op for op), one member or many: the running mean `v`
/// moves towards `grad²` in place (`v·α + g·(g·(1−α))`, `weight` being `1 − α`); returns `(scaled, denom)`,
/// the step being `θ += scaled / denom`, for `step` = `−lr`.
fn square_avg_step(
    v: &mut Tensor,
    grad: &Tensor,
    (alpha, weight): (&Coef, &Coef),
    step: &Coef,
    eps: &Coef,
) -> (Tensor, Tensor) {
    alpha.mul_(v);
    let _ = v.addcmul_(grad, &weight.mul(grad));
    (step.mul(grad), eps.add(&v.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, OptimizerConfig};
    use tch::{Device, Kind};

    #[test]
    fn matches_torch_rmsprop() {
        // The same quadratic problem optimised by libtorch's RMSprop and ours, with SB3's A2C settings.
        let target = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0, -1.0]);
        let init = Tensor::from_slice(&[0.1f32, 0.2, -0.3, 0.4, 0.0]);
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &init);
        let mut opt = nn::RmsProp { alpha: 0.99, eps: 1e-5, ..Default::default() }.build(&vs, 0.01).unwrap();
        let mut params = FlatParams::new(vec![("w".into(), init.shallow_clone())], Device::Cpu);
        let mut rmsprop = RmsProp::new(&params, 0.01, 0.99, 1e-5);
        for _ in 0..50 {
            opt.zero_grad();
            ((&w - &target).square() * &target.abs()).sum(Kind::Float).backward();
            opt.step();
            params.zero_grad();
            ((params.view(0) - &target).square() * &target.abs()).sum(Kind::Float).backward();
            rmsprop.step(&mut params);
        }
        let diff = f64::try_from((w.detach() - params.flat().detach()).abs().max()).unwrap();
        assert!(diff < 1e-5, "max difference {diff}");
        assert_eq!(rmsprop.steps(), 50);
    }

    #[test]
    fn checkpoint_round_trip_continues_identically() {
        let init = Tensor::from_slice(&[0.5f32, -0.5, 2.0]);
        let loss = |p: &FlatParams| (p.view(0).square() * p.view(0)).sum(Kind::Float);
        let mut a = FlatParams::new(vec![("w".into(), init.copy())], Device::Cpu);
        let mut opt_a = RmsProp::new(&a, 0.05, 0.9, 1e-5);
        for _ in 0..3 {
            a.zero_grad();
            loss(&a).backward();
            opt_a.step(&mut a);
        }
        let mut c = Checkpoint::new();
        opt_a.write_to(&mut c, "rmsprop").unwrap();
        let mut b = FlatParams::new(vec![("w".into(), init.copy())], Device::Cpu);
        b.copy_from(&a.flat().detach()).unwrap();
        let mut opt_b = RmsProp::new(&b, 0.05, 0.9, 1e-5);
        opt_b.read_from(&mut c, "rmsprop", &b).unwrap();
        assert_eq!(opt_b.steps(), 3);
        for (p, opt) in [(&mut a, &mut opt_a), (&mut b, &mut opt_b)] {
            p.zero_grad();
            loss(p).backward();
            opt.step(p);
        }
        assert!(a.flat().detach().equal(&b.flat().detach()), "same state, same step");
    }
}
