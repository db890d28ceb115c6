//! The optimisers over a [`FlatParams`] buffer, Adam and RMSprop: one step is a handful of tensor ops for the
//! whole model, or one host loop on the fused CPU path (`nn::host_train`).
//!
//! * Adam (Kingma & Ba 2015) as `torch.optim.Adam` (no weight decay, no AMSGrad):
//!   `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `θ ← θ − (lr / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)`.
//! * RMSprop (Tieleman & Hinton 2012, lecture 6.5) as `torch.optim.RMSprop` without weight decay, momentum or
//!   centring (SB3's A2C optimiser): `v ← αv + (1−α)g²`, `θ ← θ − lr · g / (√v + ε)`. Note ε is added *outside*
//!   the square root, unlike TensorFlow's RMSprop (SB3's `RMSpropTFLike`), and `v` starts at 0.
//!
//! The host loops set state that decays below the smallest normal f32 to 0: a parameter whose gradient stays 0
//! (a dead ReLU unit) would otherwise carry subnormals, on which x86 arithmetic is ~100× slower; the step they
//! would give is < 1e-30.
use tch::Tensor;

use crate::Result;
use crate::checkpoint::Checkpoint;
use crate::nn::lanes::{Lanes, lanes};
use crate::nn::members::{Coef, per_member, shared_tensor_rows};
use crate::nn::params::FlatParams;

/// An update rule and its decay rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Adam with first- and second-moment decays β₁, β₂.
    Adam {
        /// β₁.
        beta1: f64,
        /// β₂.
        beta2: f64,
    },
    /// RMSprop with decay α of the running mean of squared gradients.
    RmsProp {
        /// α.
        alpha: f64,
    },
}

impl Rule {
    /// The rule's name, the checkpoint prefix of its state.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Adam { .. } => "adam",
            Rule::RmsProp { .. } => "rmsprop",
        }
    }

    /// Its state tensors' names, in the order of [`Optimiser`]'s state.
    fn keys(&self) -> &'static [&'static str] {
        match self {
            Rule::Adam { .. } => &["exp_avg", "exp_avg_sq"],
            Rule::RmsProp { .. } => &["square_avg"],
        }
    }
}

/// An optimiser's state for one flat parameter buffer.
#[derive(Debug)]
pub struct Optimiser {
    /// Learning rate.
    pub lr: f64,
    /// The update rule.
    pub rule: Rule,
    /// ε added to the denominator.
    pub eps: f64,
    pub(crate) steps: u64,
    /// Adam's moments `[exp_avg, exp_avg_sq]`, or RMSprop's running mean `[square_avg]`.
    pub(crate) state: Vec<Tensor>,
}

/// The Adam optimiser ([`Optimiser::new`]).
pub type Adam = Optimiser;

impl Optimiser {
    /// Fresh Adam state for `params` (its trainable scalars: frozen layers get no moments) with PyTorch's
    /// default betas.
    pub fn new(params: &FlatParams, lr: f64, eps: f64) -> Self {
        Self::with_rule(params, lr, Rule::Adam { beta1: 0.9, beta2: 0.999 }, eps)
    }

    /// Fresh RMSprop state (a zero running mean) for `params`' trainable scalars.
    pub fn rmsprop(params: &FlatParams, lr: f64, alpha: f64, eps: f64) -> Self {
        Self::with_rule(params, lr, Rule::RmsProp { alpha }, eps)
    }

    fn with_rule(params: &FlatParams, lr: f64, rule: Rule, eps: f64) -> Self {
        let state = rule.keys().iter().map(|_| params.trainable_grad().zeros_like().detach()).collect();
        Optimiser { lr, rule, eps, steps: 0, state }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Apply one update from the gradient accumulated in `params` (a no-op when there is none). Only the
    /// trainable scalars have state and move; when that set changed since the last step (layers frozen after
    /// this state was made), the state starts afresh for the new set.
    pub fn step(&mut self, params: &mut FlatParams) {
        if !params.flat().grad().defined() {
            return;
        }
        let grad = params.trainable_grad();
        if self.state[0].size() != grad.size() {
            self.state.iter_mut().for_each(|s| *s = grad.zeros_like().detach());
            self.steps = 0;
        }
        self.steps += 1;
        let rates = Rates::one(self.rule);
        let (step, eps) = (Coef::One(rates.step(self.lr, self.steps)), Coef::One(self.eps));
        tch::no_grad(|| {
            let (scaled, denom) = rates.apply(&mut self.state, &grad, self.steps, &step, &eps);
            if params.has_frozen() {
                params.add_to_trainable(&(scaled / denom)).expect("state sized to the trainable scalars");
            } else {
                let mut theta = params.flat().shallow_clone();
                let _ = theta.addcdiv_(&scaled, &denom);
            }
        });
    }

    /// [`Optimiser::step`] on host slices (the fused CPU training step, [`crate::nn::host_train`]): `grad` for
    /// every scalar of `theta`, the state read and written in place. Needs CPU f32 state covering all of
    /// `theta` (nothing frozen); returns false, changing nothing, when it does not.
    pub(crate) fn step_host(&mut self, theta: &mut [f32], grad: &[f32]) -> bool {
        let n = theta.len();
        let host = |t: &Tensor| {
            t.device() == tch::Device::Cpu && t.kind() == tch::Kind::Float && t.is_contiguous() && t.numel() == n
        };
        if grad.len() != n || !self.state.iter().all(host) {
            return false;
        }
        // SAFETY: each state tensor is a contiguous f32 CPU tensor of `n` elements (checked above), a buffer of
        // its own that this optimiser owns exclusively (`&mut self`); no libtorch op runs on it while the slices
        // live.
        let slice = |t: &Tensor| unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, n) };
        self.steps += 1;
        match (self.rule, self.state.as_slice()) {
            (Rule::Adam { beta1, beta2 }, [m, v]) => {
                adam_step(theta, grad, slice(m), slice(v), self.steps, self.lr, (beta1, beta2, self.eps))
            }
            (Rule::RmsProp { alpha }, [v]) => {
                let (alpha, w, step, eps) = (alpha as f32, (1.0 - alpha) as f32, -self.lr as f32, self.eps as f32);
                // `step`'s tensor ops element by element: `v·α + g·(g·(1−α))`, then `θ + (−lr·g) / (√v + ε)`.
                for ((th, &g), v) in theta.iter_mut().zip(grad).zip(slice(v).iter_mut()) {
                    let v1 = *v * alpha + g * (g * w);
                    let v1 = if v1 < f32::MIN_POSITIVE { 0.0 } else { v1 };
                    *v = v1;
                    *th += (g * step) / (v1.sqrt() + eps);
                }
            }
            _ => unreachable!("state sized for the rule"),
        }
        true
    }

    /// Save the state and step count under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        for (key, t) in self.rule.keys().iter().zip(&self.state) {
            c.put_tensor(format!("{prefix}.{key}"), t);
        }
        c.put_meta(format!("{prefix}.steps"), &self.steps)
    }

    /// Restore what [`Optimiser::write_to`] saved for `params` (the learning rate is the caller's: schedules set
    /// it). State for another number of trainable scalars (a run with other frozen layers) is an error, unless
    /// no step was taken yet (then it is zeros for the trainable scalars).
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str, params: &FlatParams) -> Result<()> {
        self.steps = c.meta(&format!("{prefix}.steps"))?;
        for (key, t) in self.rule.keys().iter().zip(&mut self.state) {
            *t = params.take_optimiser_state(c, &format!("{prefix}.{key}"), self.steps)?;
        }
        Ok(())
    }
}

/// The members' optimiser states (one rule) stacked on the member axis for one step of all: state `[N, P]`,
/// per-member ε (and RMSprop's α), the shared step count (and Adam's betas). State of another size than the
/// parameters (made while layers were frozen) starts afresh at step 0, as [`Optimiser::step`] restarts it.
pub(crate) struct StackedOptimiser {
    state: Vec<Tensor>,
    steps: u64,
    rates: Rates,
    eps: Coef,
}

/// [`StackedOptimiser`] of Adam states.
pub(crate) type StackedAdam = StackedOptimiser;

impl StackedOptimiser {
    /// `opts[k]` is the optimiser of row `k` of `params` (`[N, P]`). Its state becomes row `k` of one stack
    /// per state tensor (`nn::members::shared_tensor_rows`: made once, then kept from update to update), so the
    /// stacked steps move each member's own state, and a member stepping alone meanwhile only its own row.
    pub(crate) fn of(opts: &mut [&mut Optimiser], params: &Tensor) -> Self {
        let fresh = opts.iter().any(|o| o.state[0].numel() as i64 != params.size()[1]);
        if fresh {
            let zeros = params.get(0).zeros_like().detach();
            opts.iter_mut().for_each(|o| o.state.iter_mut().for_each(|s| *s = zeros.copy()));
        }
        let state = (0..opts[0].state.len())
            .map(|i| shared_tensor_rows(&mut opts.iter_mut().map(|o| &mut o.state[i]).collect::<Vec<_>>()))
            .collect();
        let refs: Vec<&Optimiser> = opts.iter().map(|o| &**o).collect();
        StackedOptimiser {
            state,
            steps: if fresh { 0 } else { opts[0].steps },
            rates: Rates::each(&refs, params.device()),
            eps: Coef::Each(per_member(opts.iter().map(|o| o.eps), params.device())),
        }
    }

    /// The stacked state tensors (`[N, P]` each), the members' own.
    pub(crate) fn state(&self) -> &[Tensor] {
        &self.state
    }

    /// One step ([`Optimiser::step`]'s ops) of every member's parameters (rows of `params`) from its gradient
    /// (rows of `grad`), with per-member learning rates.
    pub(crate) fn step(&mut self, params: &Tensor, grad: &Tensor, lrs: &[f64]) {
        self.steps += 1;
        let step = Coef::Each(per_member(lrs.iter().map(|&lr| self.rates.step(lr, self.steps)), params.device()));
        tch::no_grad(|| {
            let (scaled, denom) = self.rates.apply(&mut self.state, grad, self.steps, &step, &self.eps);
            let mut theta = params.shallow_clone();
            let _ = theta.addcdiv_(&scaled, &denom);
        });
    }

    /// A member's step count after the stacked steps (its state is its row already).
    pub(crate) fn finish(&self, opt: &mut Optimiser) {
        opt.steps = self.steps;
    }
}

/// A rule's rates as its tensor arithmetic takes them: one member's ([`Coef::One`]) or many.
enum Rates {
    /// Adam's betas (shared by stacked members).
    Adam((f64, f64)),
    /// RMSprop's α and `1 − α`.
    RmsProp(Coef, Coef),
}

impl Rates {
    /// One member's rates.
    fn one(rule: Rule) -> Rates {
        match rule {
            Rule::Adam { beta1, beta2 } => Rates::Adam((beta1, beta2)),
            Rule::RmsProp { alpha } => Rates::RmsProp(Coef::One(alpha), Coef::One(1.0 - alpha)),
        }
    }

    /// The stacked members' rates, per member on `device` (one rule: members are stacked only with one
    /// optimiser kind; Adam's betas are the first member's).
    fn each(opts: &[&Optimiser], device: tch::Device) -> Rates {
        let Rule::RmsProp { .. } = opts[0].rule else { return Rates::one(opts[0].rule) };
        let alphas = || {
            opts.iter().map(|o| match o.rule {
                Rule::RmsProp { alpha } => alpha,
                Rule::Adam { .. } => unreachable!("members stacked with one rule"),
            })
        };
        Rates::RmsProp(
            Coef::Each(per_member(alphas(), device)),
            Coef::Each(per_member(alphas().map(|a| 1.0 - a), device)),
        )
    }

    /// The step coefficient at step `t`: `−lr / (1 − β₁ᵗ)` for Adam, `−lr` for RMSprop.
    fn step(&self, lr: f64, t: u64) -> f64 {
        match self {
            Rates::Adam((beta1, _)) => -lr / bias(*beta1, t),
            Rates::RmsProp(..) => -lr,
        }
    }

    /// The rule's tensor arithmetic (`torch.optim`'s, op for op), one member or many: the state moves towards
    /// step `t`'s gradient in place; returns `(scaled, denom)`, the step being `θ += scaled / denom`.
    fn apply(&self, state: &mut [Tensor], grad: &Tensor, t: u64, step: &Coef, eps: &Coef) -> (Tensor, Tensor) {
        match (self, state) {
            (Rates::Adam((beta1, beta2)), [m, v]) => {
                let _ = m.lerp_(grad, 1.0 - beta1);
                let _ = v.g_mul_scalar_(*beta2).addcmul_(grad, &grad.g_mul_scalar(1.0 - beta2));
                (step.mul(m), eps.add(&(v.sqrt() / bias(*beta2, t).sqrt())))
            }
            (Rates::RmsProp(alpha, weight), [v]) => {
                alpha.mul_(v);
                let _ = v.addcmul_(grad, &weight.mul(grad));
                (step.mul(grad), eps.add(&v.sqrt()))
            }
            _ => unreachable!("state sized for the rule"),
        }
    }
}

/// Adam's bias correction `1 − βᵗ`.
fn bias(beta: f64, t: u64) -> f64 {
    1.0 - beta.powi(t as i32)
}

/// One Adam step on host slices, the same arithmetic as [`Optimiser::step`] (`m ← m + (1−β₁)(g − m)` is
/// `lerp_`), with `t` the step number (from 1).
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

/// The Adam loop, branch-free (it vectorises), subnormal moments set to 0.
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

    /// The same quadratic problem optimised by libtorch's optimiser (`torch`) and ours (`ours`), 50 steps.
    fn follows_torch(torch: impl FnOnce(&nn::VarStore) -> nn::Optimizer, ours: impl FnOnce(&FlatParams) -> Optimiser) {
        let target = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0, -1.0]);
        let init = Tensor::from_slice(&[0.1f32, 0.2, -0.3, 0.4, 0.0]);
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &init);
        let mut opt = torch(&vs);
        let mut params = FlatParams::new(vec![("w".into(), init.shallow_clone())], Device::Cpu);
        let mut mine = ours(&params);
        for _ in 0..50 {
            opt.zero_grad();
            ((&w - &target).square() * &target.abs()).sum(Kind::Float).backward();
            opt.step();
            params.zero_grad();
            ((params.view(0) - &target).square() * &target.abs()).sum(Kind::Float).backward();
            mine.step(&mut params);
        }
        let diff = f64::try_from((w.detach() - params.flat().detach()).abs().max()).unwrap();
        assert!(diff < 1e-5, "max difference {diff}");
        assert_eq!(mine.steps(), 50);
    }

    #[test]
    fn matches_torch_adam() {
        follows_torch(
            |vs| nn::Adam { eps: 1e-5, ..Default::default() }.build(vs, 0.05).unwrap(),
            |p| Adam::new(p, 0.05, 1e-5),
        );
    }

    #[test]
    fn matches_torch_rmsprop() {
        // SB3's A2C settings.
        follows_torch(
            |vs| nn::RmsProp { alpha: 0.99, eps: 1e-5, ..Default::default() }.build(vs, 0.01).unwrap(),
            |p| Optimiser::rmsprop(p, 0.01, 0.99, 1e-5),
        );
    }

    #[test]
    fn checkpoint_round_trip_continues_identically() {
        let init = Tensor::from_slice(&[0.5f32, -0.5, 2.0]);
        let loss = |p: &FlatParams| (p.view(0).square() * p.view(0)).sum(Kind::Float);
        let mut a = FlatParams::new(vec![("w".into(), init.copy())], Device::Cpu);
        let mut opt_a = Optimiser::rmsprop(&a, 0.05, 0.9, 1e-5);
        for _ in 0..3 {
            a.zero_grad();
            loss(&a).backward();
            opt_a.step(&mut a);
        }
        let mut c = Checkpoint::new();
        opt_a.write_to(&mut c, "rmsprop").unwrap();
        let mut b = FlatParams::new(vec![("w".into(), init.copy())], Device::Cpu);
        b.copy_from(&a.flat().detach()).unwrap();
        let mut opt_b = Optimiser::rmsprop(&b, 0.05, 0.9, 1e-5);
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
