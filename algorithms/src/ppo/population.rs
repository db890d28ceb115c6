//! PPO for a population: many members' updates as one batched program.
//!
//! Each member stays a whole [`Ppo`] (its network, Adam moments, RNG and rollout; it acts and collects exactly
//! as it would alone). When every member's rollout is complete, [`update_population`] gathers the members'
//! parameter buffers into one `[N, P]` leaf and their Adam moments into `[N, P]` tensors, and runs the epochs
//! and minibatches once for all: the `2N` policy and value MLPs as one chain of batched matmuls, each member's
//! loss over its own minibatch (its own shuffle from its own RNG), one backward pass of the members' summed
//! losses (so each member's gradient is its own), each member's gradient norm clipped to its own limit, and one
//! Adam step with per-member learning rates and ε. The results go back into the members. Per-member
//! coefficients (learning rate, clip range, entropy and value coefficients, value clip, gradient limit, Adam
//! ε — what a sweep or PBT may change) are tensors on the member axis; shapes and schedules are shared.
//!
//! Elementwise maths is the single-member code's, operation for operation; only reductions (matmuls, means,
//! the gradient norm) may add in another order, so a member matches its run alone to float rounding (tests:
//! within 1e-6 relative after several updates; see `tests` below).
use rand::seq::SliceRandom;
use tch::{Kind, Tensor};

use crate::actor_critic::ActorCritic;
use crate::actor_critic::explained_variance;
use crate::data::rollout::Rollout;
use crate::nn::distributions::LOG_SQRT_2PI;
use crate::ppo::Ppo;
use crate::{Error, Metrics, Result};

/// Why these members cannot share one batched update (`None`: they can). Members that cannot are updated one
/// by one with [`Ppo::update_from`], which gives the same results, only slower.
pub fn unbatchable(members: &[&Ppo]) -> Option<String> {
    let first = members.first()?;
    let c0 = &first.config;
    let nets: Vec<MemberNet> = members
        .iter()
        .map(|m| MemberNet { net: &m.pi.net, fused_cpu: m.config.fused_cpu, parallel: &m.parallel, steps: m.opt.steps })
        .collect();
    if let Some(why) = actor_critics_unbatchable(&nets) {
        return Some(why);
    }
    for m in members {
        let c = &m.config;
        if c.vtrace.is_some() || c.target_kl.is_some() {
            return Some("V-trace or a KL early stop".into());
        }
        if (c.n_epochs, c.batch_size, c.normalize_advantage, c.anneal_lr, c.anneal_clip_range)
            != (c0.n_epochs, c0.batch_size, c0.normalize_advantage, c0.anneal_lr, c0.anneal_clip_range)
            || c.clip_range_vf.is_some() != c0.clip_range_vf.is_some()
        {
            return Some("members' update schedules differ".into());
        }
    }
    None
}

/// What [`actor_critics_unbatchable`] reads of one PPO or A2C member.
pub(crate) struct MemberNet<'a> {
    pub(crate) net: &'a ActorCritic,
    pub(crate) fused_cpu: bool,
    pub(crate) parallel: &'a crate::nn::data_parallel::DataParallel,
    /// Optimiser steps taken.
    pub(crate) steps: u64,
}

/// Why actor-critic members cannot share one batched update, whatever their algorithm: not plain MLPs of one
/// layout, the fused CPU step, data-parallel replicas, accumulation or frozen layers, or different parameter
/// counts, optimiser steps or devices. `None`: nothing here stops them.
pub(crate) fn actor_critics_unbatchable(members: &[MemberNet]) -> Option<String> {
    let first = members.first()?;
    let layout = |m: &MemberNet| {
        m.net
            .twin_layout()
            .map(|(layers, activation, outputs, log_std)| (layers.to_vec(), activation, outputs, log_std))
    };
    let l0 = layout(first);
    if l0.is_none() {
        return Some("the network is not a plain MLP (a CNN, or task heads)".into());
    }
    for m in members {
        if layout(m) != l0 {
            return Some("members' networks differ".into());
        }
        if m.fused_cpu && m.net.device == tch::Device::Cpu {
            // One fused step per minibatch has no per-op dispatch for a batch to share, and one member's
            // activations stay in the caches: members update in turn, each exactly as alone.
            return Some("members take the fused CPU step (`fused_cpu`)".into());
        }
        if m.parallel.replicas() > 1 || m.parallel.accumulate() > 1 || m.net.params.has_frozen() {
            return Some("data-parallel replicas, gradient accumulation or frozen layers".into());
        }
        if m.net.params.numel() != first.net.params.numel()
            || m.steps != first.steps
            || m.net.device != first.net.device
        {
            return Some("members' parameter counts, optimiser steps or devices differ".into());
        }
    }
    None
}

/// `[N]` f32 values on `device`.
pub(crate) fn per_member(values: impl Iterator<Item = f64>, device: tch::Device) -> Tensor {
    let v: Vec<f32> = values.map(|x| x as f32).collect();
    Tensor::from_slice(&v).to_device(device)
}

/// A `[N]` (or `[N, …]`) tensor's values on the host, as f64.
pub(crate) fn host(t: &Tensor) -> Result<Vec<f64>> {
    Ok(Vec::<f64>::try_from(t.detach().to_kind(Kind::Double).flatten(0, -1))?)
}

/// Each row of `x` (`[N, B]`) to zero mean and unit variance (unbiased std, 1e-8 guard), as the single-member
/// updates normalise advantages.
pub(crate) fn normalize_rows(x: &Tensor) -> Tensor {
    (x - x.mean_dim(1, true, Kind::Float)) / (x.std_dim(1, true, true) + 1e-8)
}

/// The members' rollouts (`n` transitions each), stacked on a leading member axis on `device`: what an
/// actor-critic population update trains on, and each member's explained variance.
pub(crate) struct StackedRollouts {
    /// Observations as the networks take them, `[N, n, obs_dim]`.
    pub(crate) obs: Tensor,
    /// Actions taken, `[N, n]` indices or `[N, n, D]` floats.
    pub(crate) actions: Tensor,
    /// Their log-probabilities under the policy that collected them, `[N, n]`.
    pub(crate) old_log_prob: Tensor,
    /// GAE advantages `[N, n]`.
    pub(crate) advantages: Tensor,
    /// Value targets `[N, n]`.
    pub(crate) returns: Tensor,
    /// Values at collection `[N, n]`.
    pub(crate) old_values: Tensor,
    /// Each member's explained variance of its returns by its values.
    pub(crate) explained: Vec<f64>,
}

impl StackedRollouts {
    /// Stack `rollouts[k]` for `nets[k]` (each at least `n` transitions long).
    pub(crate) fn new(nets: &[&ActorCritic], rollouts: &[&Rollout], n: usize, device: tch::Device) -> Result<Self> {
        let mut obs = Vec::new();
        let mut explained = Vec::new();
        let (mut adv, mut ret, mut val, mut old_lp, mut act) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (net, r) in nets.iter().zip(rollouts) {
            obs.push(net.rollout_obs(r)?);
            let (a, rt, v) = (&r.advantages[..n], &r.returns[..n], &r.values[..n]);
            explained.push(explained_variance(v, rt));
            adv.push(Tensor::from_slice(a));
            ret.push(Tensor::from_slice(rt));
            val.push(Tensor::from_slice(v));
            old_lp.push(Tensor::from_slice(&r.log_probs[..n]));
            act.push(net.actions_tensor(&r.actions));
        }
        let stack = |v: &[Tensor]| Tensor::stack(v, 0).to_device(device);
        Ok(StackedRollouts {
            obs: stack(&obs),
            actions: stack(&act),
            old_log_prob: stack(&old_lp),
            advantages: stack(&adv),
            returns: stack(&ret),
            old_values: stack(&val),
            explained,
        })
    }
}

/// The members' actor-critic networks (plain twin MLPs of one layout) as one: their parameter buffers stacked
/// into one `[N, P]` leaf, seen as each layer's `[N, …]` shapes, with a `[N, P]` gradient buffer beside it.
pub(crate) struct StackedActorCritic {
    n_members: i64,
    layers: Vec<usize>,
    activation: crate::nn::nets::Activation,
    outputs: [i64; 2],
    log_std: Option<usize>,
    /// Every member's parameters, `[N, P]`, requiring grad.
    pub(crate) params: Tensor,
    /// Every member's gradient after [`StackedActorCritic::backward`], `[N, P]`.
    pub(crate) grad: Tensor,
    views: Vec<Tensor>,
    grad_views: Vec<Tensor>,
}

impl StackedActorCritic {
    /// Gather the members' current parameters (their layouts must match: `unbatchable` checks).
    pub(crate) fn new(nets: &[&ActorCritic]) -> Self {
        let first = &nets[0];
        let (layers, activation, outputs, log_std) = {
            let (l, a, o, s) = first.twin_layout().expect("checked by unbatchable");
            (l.to_vec(), a, o, s)
        };
        let n_members = nets.len() as i64;
        let flats: Vec<Tensor> = nets.iter().map(|m| m.params.flat().detach()).collect();
        let params = Tensor::stack(&flats, 0).set_requires_grad(true);
        let grad = params.zeros_like().detach();
        let views = member_views(&params, &first.params);
        let grad_views = member_views(&grad, &first.params);
        StackedActorCritic { n_members, layers, activation, outputs, log_std, params, grad, views, grad_views }
    }

    /// Every member's policy head `[N, B, A]` and values `[N, B]` on its own observations `x` (`[N, B, obs]`):
    /// the `2N` MLPs as one chain of batched matmuls (`TwinMlp::forward`'s ops).
    pub(crate) fn forward(&self, x: &Tensor) -> (Tensor, Tensor) {
        let (n_members, views) = (self.n_members, &self.views);
        let b = x.size()[1];
        let mut h = x.unsqueeze(1).expand([n_members, 2, b, x.size()[2]], false).reshape([2 * n_members, b, -1]);
        let last = self.layers.len() - 1;
        for (k, &i) in self.layers.iter().enumerate() {
            let w = views[i].reshape([2 * n_members, views[i].size()[2], views[i].size()[3]]);
            let bias = views[i + 1].reshape([2 * n_members, 1, -1]);
            h = bias.baddbmm(&h, &w, 1.0, 1.0);
            if k < last {
                h = self.activation.apply(&h);
            }
        }
        let h = h.view([n_members, 2, b, -1]);
        (h.select(1, 0).narrow(2, 0, self.outputs[0]), h.select(1, 1).narrow(2, 0, self.outputs[1]).squeeze_dim(2))
    }

    /// Log-probabilities `[N, B]` of `actions` under the policy heads, and (with `need_entropy`) the entropies
    /// `[N, B]`: `ActionDist::log_prob` and `ActionDist::entropy`, op for op.
    pub(crate) fn log_prob_entropy(
        &self,
        head: &Tensor,
        actions: &Tensor,
        need_entropy: bool,
    ) -> (Tensor, Option<Tensor>) {
        match self.log_std {
            None => {
                let logp = head.log_softmax(-1, Kind::Float);
                let lp = logp.gather(2, &actions.unsqueeze(2), false).squeeze_dim(2);
                let ent = need_entropy.then(|| -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float));
                (lp, ent)
            }
            Some(i) => {
                let ls = self.views[i].unsqueeze(1);
                let z = (actions - head) * (-&ls).exp();
                let lp = (z.square() * -0.5 - &ls - LOG_SQRT_2PI).sum_dim_intlist(-1, false, Kind::Float);
                let ent = need_entropy
                    .then(|| (&ls + (0.5 + LOG_SQRT_2PI)).expand_as(head).sum_dim_intlist(-1, false, Kind::Float));
                (lp, ent)
            }
        }
    }

    /// Each member's mean entropy `[N]` of the policy heads, without gradient (for metrics).
    pub(crate) fn mean_entropy(&self, head: &Tensor) -> Tensor {
        tch::no_grad(|| match self.log_std {
            None => {
                let logp = head.log_softmax(-1, Kind::Float);
                -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float).mean_dim(1, false, Kind::Float)
            }
            Some(i) => (self.views[i].unsqueeze(1) + (0.5 + LOG_SQRT_2PI))
                .expand_as(head)
                .sum_dim_intlist(-1, false, Kind::Float)
                .mean_dim(1, false, Kind::Float),
        })
    }

    /// The gradient of the members' summed losses (`[N]`) into [`StackedActorCritic::grad`]: each member's
    /// row is its own loss's gradient (zero where the loss does not reach, as `FlatParams::backward`).
    pub(crate) fn backward(&self, losses: &Tensor) {
        backward_into(losses, &self.views, &self.grad_views);
    }

    /// Each member's total loss `policy + vf_coef · value − ent_coef · entropy` (`[N]`; coefficients `[N]`), the
    /// entropy being the mean over each member's samples of `entropy` (`[N, B]`, absent when no member has an
    /// entropy bonus). Returns the total and that mean entropy.
    pub(crate) fn total_loss(
        policy: &Tensor,
        value: &Tensor,
        entropy: Option<Tensor>,
        (vf_coef, ent_coef): (&Tensor, &Tensor),
    ) -> (Tensor, Option<Tensor>) {
        let mut total = policy + value * vf_coef;
        let entropy = entropy.map(|e| e.mean_dim(1, false, Kind::Float));
        if let Some(e) = &entropy {
            total -= e * ent_coef;
        }
        (total, entropy)
    }

    /// Copy member `k`'s row of the parameters into its own buffer.
    pub(crate) fn write_back(&self, k: usize, params: &crate::nn::params::FlatParams) {
        tch::no_grad(|| {
            let mut flat = params.flat().shallow_clone();
            flat.copy_(&self.params.get(k as i64));
        });
    }
}

/// One PPO update of every member on its finished rollout (GAE computed), batched over the member axis.
/// `progress_remaining` (1 → 0) anneals each member's learning rate and clip range as [`Ppo::update_from`]
/// does. Returns each member's metrics. Members that [`unbatchable`] refuses are updated one by one.
pub fn update_population(
    members: &mut [&mut Ppo],
    rollouts: &[&Rollout],
    progress_remaining: f64,
) -> Result<Vec<Metrics>> {
    if members.len() != rollouts.len() {
        return Err(Error::BadLength {
            what: "population rollouts".into(),
            got: rollouts.len(),
            expected: members.len(),
        });
    }
    let refs: Vec<&Ppo> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().zip(rollouts).map(|(m, r)| m.update_from(r, progress_remaining)).collect();
    }
    let n_members = members.len() as i64;
    let c0 = members[0].config.clone();
    let n = rollouts[0].len();
    for r in rollouts {
        if r.len() != n || n == 0 || !n.is_multiple_of(c0.batch_size) {
            return Err(Error::BadLength {
                what: "population rollout transitions (equal, a multiple of batch_size)".into(),
                got: r.len(),
                expected: n,
            });
        }
    }
    let device = members[0].pi.net.device;
    let progress = progress_remaining.clamp(0.0, 1.0);
    let lrs: Vec<f64> = members
        .iter()
        .map(|m| if m.config.anneal_lr { m.config.learning_rate * progress } else { m.config.learning_rate })
        .collect();
    let clips: Vec<f64> = members
        .iter()
        .map(|m| if m.config.anneal_clip_range { m.config.clip_range * progress } else { m.config.clip_range })
        .collect();
    for (m, &lr) in members.iter_mut().zip(&lrs) {
        m.opt.lr = lr;
    }
    let clip_lo = per_member(clips.iter().map(|c| 1.0 - c), device).unsqueeze(1);
    let clip_hi = per_member(clips.iter().map(|c| 1.0 + c), device).unsqueeze(1);
    let vf_coef = per_member(members.iter().map(|m| m.config.vf_coef), device);
    let ent_coef = per_member(members.iter().map(|m| m.config.ent_coef), device);
    let need_entropy = members.iter().any(|m| m.config.ent_coef != 0.0);
    let vf_clip = c0.clip_range_vf.map(|_| {
        let eps: Vec<f64> = members.iter().map(|m| m.config.clip_range_vf.expect("all or none")).collect();
        (per_member(eps.iter().map(|e| -e), device).unsqueeze(1), per_member(eps.iter().copied(), device).unsqueeze(1))
    });

    // The members' data, stacked on the member axis.
    let nets: Vec<&ActorCritic> = members.iter().map(|m| &m.pi.net).collect();
    let data = StackedRollouts::new(&nets, rollouts, n, device)?;
    let StackedRollouts { obs, actions, old_log_prob, returns, old_values, explained, mut advantages } = data;
    let full_batch = c0.batch_size == n;
    if c0.normalize_advantage && full_batch {
        advantages = normalize_rows(&advantages);
    }
    let normalize_minibatch = c0.normalize_advantage && !full_batch;

    // Parameters `[N, P]` (one leaf) seen as each member's layer shapes, and the Adam moments.
    let net = StackedActorCritic::new(&nets);
    let mut adam = StackedAdam::new(&members.iter().map(|m| &m.opt).collect::<Vec<_>>(), &net.params);
    let max_norms: Vec<f64> = members.iter().map(|m| m.config.max_grad_norm).collect();

    let mut orders: Vec<Vec<i64>> = (0..members.len()).map(|_| (0..n as i64).collect()).collect();
    let mut gradient_steps = 0usize;
    let mut last = None;
    for _ in 0..c0.n_epochs {
        for (m, order) in members.iter_mut().zip(orders.iter_mut()) {
            order.shuffle(&mut m.pi.rng);
        }
        for start in (0..n).step_by(c0.batch_size) {
            // A full-batch "minibatch" needs no gather: each member's loss is a mean over its samples.
            let idx = (!full_batch).then(|| {
                let rows: Vec<i64> =
                    orders.iter().flat_map(|o| o[start..start + c0.batch_size].iter().copied()).collect();
                Tensor::from_slice(&rows).view([n_members, c0.batch_size as i64]).to_device(device)
            });
            let pick = |t: &Tensor| match &idx {
                None => t.shallow_clone(),
                Some(i) if t.dim() == 2 => t.gather(1, i, false),
                Some(i) => {
                    let d = t.size()[2];
                    t.gather(1, &i.unsqueeze(2).expand([n_members, c0.batch_size as i64, d], false), false)
                }
            };
            let mut mb_adv = pick(&advantages);
            if normalize_minibatch && c0.batch_size > 1 {
                mb_adv = normalize_rows(&mb_adv);
            }
            let (mb_obs, mb_actions, mb_old_lp) = (pick(&obs), pick(&actions), pick(&old_log_prob));
            let (mb_old_values, mb_returns) = (pick(&old_values), pick(&returns));
            let (head, values) = net.forward(&mb_obs);
            let (log_prob, entropy) = net.log_prob_entropy(&head, &mb_actions, need_entropy);
            // The PPO loss of each member (crate::ppo::ppo_loss, with per-member coefficients).
            let log_ratio = &log_prob - &mb_old_lp;
            let ratio = log_ratio.exp();
            let surrogate = &mb_adv * &ratio;
            let clipped = &mb_adv * ratio.clamp_tensor(Some(&clip_lo), Some(&clip_hi));
            let policy = -surrogate.min_other(&clipped).mean_dim(1, false, Kind::Float);
            let value = match &vf_clip {
                None => (&mb_returns - &values).square().mean_dim(1, false, Kind::Float),
                Some((lo, hi)) => {
                    let clipped_values = &mb_old_values + (&values - &mb_old_values).clamp_tensor(Some(lo), Some(hi));
                    let unclipped = (&mb_returns - &values).square();
                    let clipped = (&mb_returns - clipped_values).square();
                    unclipped.max_other(&clipped).mean_dim(1, false, Kind::Float)
                }
            };
            let (total, entropy) = StackedActorCritic::total_loss(&policy, &value, entropy, (&vf_coef, &ent_coef));
            net.backward(&total);
            clip_per_member(&net.grad, &max_norms, "ppo")?;
            adam.step(&net.params, &net.grad, &lrs);
            gradient_steps += 1;
            last = Some((policy, value, entropy, log_ratio, head));
        }
    }

    // Back into the members: parameters, moments, step counts.
    tch::no_grad(|| {
        for (k, m) in members.iter_mut().enumerate() {
            net.write_back(k, &m.pi.net.params);
            adam.write_back(k, &mut m.opt);
        }
    });

    let (policy, value, entropy, log_ratio, head) = last.expect("at least one minibatch");
    let entropy = entropy.unwrap_or_else(|| net.mean_entropy(&head));
    let (policy, value, entropy) = (host(&policy)?, host(&value)?, host(&entropy)?);
    let approx_kl = host(&tch::no_grad(|| (log_ratio.exp() - 1.0 - &log_ratio).mean_dim(1, false, Kind::Float)))?;
    let clip_t = per_member(clips.iter().copied(), device).unsqueeze(1);
    let clip_fraction = host(&tch::no_grad(|| {
        (log_ratio.exp() - 1.0).abs().gt_tensor(&clip_t).to_kind(Kind::Float).mean_dim(1, false, Kind::Float)
    }))?;
    Ok((0..members.len())
        .map(|k| {
            let mut m = Metrics::default();
            m.push("losses/policy_loss", policy[k]);
            m.push("losses/value_loss", value[k]);
            m.push("losses/entropy", entropy[k]);
            m.push("losses/approx_kl", approx_kl[k]);
            m.push("losses/clip_fraction", clip_fraction[k]);
            m.push("losses/explained_variance", explained[k]);
            m.push("charts/learning_rate", lrs[k]);
            m.push("charts/clip_range", clips[k]);
            m.push("charts/gradient_steps", gradient_steps as f64);
            m
        })
        .collect())
}

/// Each parameter of `layout` (a member's buffer) as a view `[N, shape…]` of `stacked` (`[N, P]`, the members'
/// buffers as rows).
pub(crate) fn member_views(stacked: &Tensor, layout: &crate::nn::params::FlatParams) -> Vec<Tensor> {
    let n_members = stacked.size()[0];
    (0..layout.names().count())
        .map(|i| {
            let v = layout.view(i);
            let mut shape = vec![n_members];
            shape.extend(v.size());
            stacked.narrow(1, layout.offset(i) as i64, v.numel() as i64).view(shape.as_slice())
        })
        .collect()
}

/// The gradient of the members' summed losses (`losses`, `[N]`: each member's gradient is its own) with
/// respect to `views`, written into `grad_views` (zero where a loss does not reach), as `FlatParams::backward`.
pub(crate) fn backward_into(losses: &Tensor, views: &[Tensor], grad_views: &[Tensor]) {
    let grads = Tensor::run_backward(&[losses.sum(Kind::Float)], views, false, false);
    tch::no_grad(|| {
        for (dst, g) in grad_views.iter().zip(&grads) {
            let mut dst = dst.shallow_clone();
            if g.defined() {
                dst.copy_(g);
            } else {
                let _ = dst.zero_();
            }
        }
    });
}

/// Clip each member's gradient (a row of `grad`, `[N, P]`) to its own global-norm limit, as
/// `FlatParams::clip_grad_norm` does (1e-6 guard); a non-finite norm is an error naming the member.
pub(crate) fn clip_per_member(grad: &Tensor, max_norms: &[f64], algorithm: &str) -> Result<()> {
    let norms = Vec::<f32>::try_from(tch::no_grad(|| grad.norm_scalaropt_dim(2, [1i64].as_slice(), false)))?;
    let mut coefs = Vec::with_capacity(norms.len());
    for (k, (&norm, &max_norm)) in norms.iter().zip(max_norms).enumerate() {
        let norm = norm as f64;
        if !norm.is_finite() {
            return Err(Error::NonFinite(format!(
                "{algorithm} population member {k}: gradient norm {norm} (non-finite loss); step not taken"
            )));
        }
        let coef = max_norm / (norm + 1e-6);
        coefs.push(if coef < 1.0 { coef } else { 1.0 });
    }
    if coefs.iter().any(|&c| c < 1.0) {
        let coef = per_member(coefs.into_iter(), grad.device()).unsqueeze(1);
        let mut g = grad.shallow_clone();
        let _ = tch::no_grad(|| g.g_mul_(&coef));
    }
    Ok(())
}

/// The members' Adam states ([`crate::nn::adam::Adam`]) stacked on the member axis for one batched step of all:
/// moments `[N, P]`, the shared step count and betas, per-member ε (`[N, 1]`). Moments of another size than the
/// parameters (made while layers were frozen) start afresh at step 0, as `Adam::step` restarts them.
pub(crate) struct StackedAdam {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: u64,
    betas: (f64, f64),
    eps: Tensor,
}

impl StackedAdam {
    /// `opts[k]` is the optimiser of row `k` of `params` (`[N, P]`).
    pub(crate) fn new(opts: &[&crate::nn::adam::Adam], params: &Tensor) -> Self {
        let first = opts[0];
        let fresh = opts.iter().any(|o| o.exp_avg.numel() as i64 != params.size()[1]);
        let stack = |pick: fn(&crate::nn::adam::Adam) -> &Tensor| {
            if fresh {
                params.zeros_like().detach()
            } else {
                Tensor::stack(&opts.iter().map(|o| pick(o).shallow_clone()).collect::<Vec<_>>(), 0)
            }
        };
        StackedAdam {
            exp_avg: stack(|o| &o.exp_avg),
            exp_avg_sq: stack(|o| &o.exp_avg_sq),
            steps: if fresh { 0 } else { first.steps },
            betas: (first.beta1, first.beta2),
            eps: per_member(opts.iter().map(|o| o.eps), params.device()).unsqueeze(1),
        }
    }

    /// One Adam step (`Adam::step`, op for op) of every member's parameters (rows of `params`) from its
    /// gradient (rows of `grad`), with per-member learning rates.
    pub(crate) fn step(&mut self, params: &Tensor, grad: &Tensor, lrs: &[f64]) {
        self.steps += 1;
        let (beta1, beta2) = self.betas;
        let t = self.steps as i32;
        let bias1 = 1.0 - beta1.powi(t);
        let bias2 = 1.0 - beta2.powi(t);
        let step_size = per_member(lrs.iter().map(|lr| -lr / bias1), params.device()).unsqueeze(1);
        tch::no_grad(|| {
            let (mut m1, mut m2) = (self.exp_avg.shallow_clone(), self.exp_avg_sq.shallow_clone());
            let _ = m1.lerp_(grad, 1.0 - beta1);
            let _ = m2.g_mul_scalar_(beta2).addcmul_(grad, &grad.g_mul_scalar(1.0 - beta2));
            let denom = (m2.sqrt() / bias2.sqrt()) + &self.eps;
            let scaled = &m1 * &step_size;
            let mut theta = params.shallow_clone();
            let _ = theta.addcdiv_(&scaled, &denom);
        });
    }

    /// Member `k`'s moments and step count back into its optimiser.
    pub(crate) fn write_back(&self, k: usize, opt: &mut crate::nn::adam::Adam) {
        opt.exp_avg = self.exp_avg.get(k as i64).copy();
        opt.exp_avg_sq = self.exp_avg_sq.get(k as i64).copy();
        opt.steps = self.steps;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use flotilla_core::{ObsRef, Space};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::policy::{ActMode, ActOutput, Policy};
    use crate::ppo::PpoConfig;

    /// Largest |a − b| over the largest |b|, of two flat buffers.
    pub(crate) fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
        let d = f64::try_from((a - b).abs().max()).unwrap();
        d / f64::try_from(b.abs().max()).unwrap().max(1e-30)
    }

    /// A finished rollout (`n_envs × n_steps`, random observations, rewards and episode ends from `rng`) that
    /// `member` collects; its `twin` acts on the same observations, so that its sampling stream stays in step.
    pub(crate) fn twin_rollout(
        member: &mut dyn Policy,
        twin: &mut dyn Policy,
        rng: &mut Pcg64,
        n_envs: usize,
        n_steps: usize,
        obs_dim: usize,
    ) -> Rollout {
        let act_dim = member.act_dim();
        let (mut out, mut twin_out) = (ActOutput::default(), ActOutput::default());
        let mut rollout = Rollout::new(n_envs, n_steps, obs_dim, act_dim);
        for _ in 0..n_steps {
            let obs: Vec<f32> = (0..n_envs * obs_dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            member.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            twin.act(ObsRef::F32(&obs), ActMode::Explore, &mut twin_out).unwrap();
            rollout.push_policy(ObsRef::F32(&obs), &out.actions, &out.log_probs, &out.values).unwrap();
            let rewards: Vec<f32> =
                out.actions.chunks(act_dim).map(|a| a[0].tanh() + rng.random_range(-0.1..0.1)).collect();
            let done: Vec<bool> = (0..n_envs).map(|_| rng.random_bool(0.1)).collect();
            rollout.push_outcome(&rewards, &done, &vec![false; n_envs]).unwrap();
        }
        rollout.finish(&vec![0.0; n_envs], 0.98, 0.8).unwrap();
        rollout
    }

    /// Members updated together match twins (same seeds, same configs, same rollouts) updated alone, after
    /// several updates: parameters and Adam moments within 1e-6 relative (only reductions may add in another
    /// order), and the sampling RNG streams exactly.
    fn check_matches_alone(obs_space: Space, act_space: Space, configs: Vec<PpoConfig>, n_envs: usize) {
        let obs_dim = obs_space.flat_dim();
        // The libtorch path on both sides (the fused CPU step is never batched).
        let build = |c: &PpoConfig, k: usize| {
            let c = PpoConfig { fused_cpu: false, ..c.clone() };
            Ppo::new(&obs_space, &act_space, n_envs, c, Device::Cpu, 100 + k as u64).unwrap()
        };
        let mut together: Vec<Ppo> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        let mut alone: Vec<Ppo> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        let n_steps = configs[0].n_steps;
        let mut rng = Pcg64::seed_from_u64(7);
        for update in 0..4 {
            let rollouts: Vec<Rollout> = together
                .iter_mut()
                .zip(alone.iter_mut())
                .map(|(m, twin)| twin_rollout(m, twin, &mut rng, n_envs, n_steps, obs_dim))
                .collect();
            let progress = 1.0 - update as f64 / 8.0;
            let mut refs: Vec<&mut Ppo> = together.iter_mut().collect();
            let batched = update_population(&mut refs, &rollouts.iter().collect::<Vec<_>>(), progress).unwrap();
            for (k, (m, r)) in alone.iter_mut().zip(&rollouts).enumerate() {
                let single = m.update_from(r, progress).unwrap();
                for key in ["losses/policy_loss", "losses/value_loss", "charts/learning_rate", "charts/gradient_steps"]
                {
                    let (a, b) = (batched[k].get(key).unwrap(), single.get(key).unwrap());
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "update {update} member {k} {key}: {a} vs {b}");
                }
            }
            for (k, (a, b)) in together.iter().zip(&alone).enumerate() {
                let d = rel_diff(a.params().flat(), b.params().flat());
                assert!(d <= 1e-6, "update {update} member {k}: parameters differ by {d:e} (relative)");
                let d = rel_diff(&a.opt.exp_avg_sq, &b.opt.exp_avg_sq);
                assert!(d <= 1e-5, "update {update} member {k}: Adam moments differ by {d:e}");
                assert_eq!(a.opt.steps, b.opt.steps);
                assert_eq!(a.pi.rng, b.pi.rng, "member {k}: the shuffles drew the same numbers");
            }
        }
    }

    pub(crate) fn cartpole() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2))
    }

    #[test]
    fn full_batch_members_match_their_runs_alone() {
        // The zoo config: one minibatch of the whole rollout; swept learning rates and entropy coefficients.
        let configs: Vec<PpoConfig> = [(1e-3, 0.0), (3e-4, 0.01), (2e-3, 0.0)]
            .into_iter()
            .map(|(lr, ent)| PpoConfig {
                n_steps: 16,
                batch_size: 64,
                n_epochs: 5,
                learning_rate: lr,
                ent_coef: ent,
                ..PpoConfig::default()
            })
            .collect();
        let (o, a) = cartpole();
        check_matches_alone(o, a, configs, 4);
    }

    #[test]
    fn minibatched_members_with_value_clipping_match_their_runs_alone() {
        let configs: Vec<PpoConfig> = [(0.2, 0.5, 0.5), (0.1, 0.2, 1.0)]
            .into_iter()
            .map(|(clip, vf, grad)| PpoConfig {
                n_steps: 16,
                batch_size: 16,
                n_epochs: 3,
                clip_range: clip,
                clip_range_vf: Some(vf),
                max_grad_norm: grad,
                ..PpoConfig::default()
            })
            .collect();
        let (o, a) = cartpole();
        check_matches_alone(o, a, configs, 4);
    }

    #[test]
    fn gaussian_members_match_their_runs_alone() {
        let configs: Vec<PpoConfig> = [0.0, -0.5]
            .into_iter()
            .map(|ls| PpoConfig {
                n_steps: 8,
                batch_size: 16,
                n_epochs: 4,
                log_std_init: ls,
                ent_coef: 0.001,
                ..PpoConfig::default()
            })
            .collect();
        let obs = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let act = Space::box1d(vec![-2.0], vec![2.0]);
        check_matches_alone(obs, act, configs, 4);
    }

    #[test]
    fn members_that_cannot_batch_are_named() {
        let (o, a) = cartpole();
        let torch = PpoConfig { n_steps: 16, fused_cpu: false, ..PpoConfig::default() };
        let x = Ppo::new(&o, &a, 4, PpoConfig { batch_size: 64, ..torch.clone() }, Device::Cpu, 1).unwrap();
        let y = Ppo::new(&o, &a, 4, PpoConfig { batch_size: 32, ..torch.clone() }, Device::Cpu, 2).unwrap();
        assert!(unbatchable(&[&x, &y]).unwrap().contains("schedules"));
        assert!(unbatchable(&[&x, &x]).is_none());
        let fused = PpoConfig { batch_size: 64, fused_cpu: true, ..torch };
        let fused = Ppo::new(&o, &a, 4, fused, Device::Cpu, 1).unwrap();
        assert!(unbatchable(&[&fused, &fused]).unwrap().contains("fused"));
    }
}
