//! The member axis of PPO's and A2C's libtorch updates: each update is written once over `N` members (`[N, …]`
//! tensors, `[N]` losses), and a single run is a population of one.
//!
//! [`Nets`] is the one interface the update loops see: a member alone ([`Nets::Alone`]: its own network, any
//! body — MLP, CNN, task heads — with data-parallel replicas, micro-batches and frozen layers), or plain twin
//! MLPs of one layout stacked into one `[N, P]` leaf ([`Nets::Stacked`]: the `2N` MLPs run as one chain of
//! batched matmuls, one backward pass of the members' summed losses gives each its own gradient, each clipped
//! to its own limit, one optimiser step for all). Members that cannot be stacked are updated one by one through
//! [`Nets::Alone`] — the same loss, not a copy of it. A stacked member matches its update alone to float
//! rounding: elementwise maths is the same ops; only reductions (matmuls, means, norms) may add in another order
//! (tests in `ppo` and `a2c`: within 1e-6 relative after several updates).
use flotilla_core::ObsRef;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64;
use tch::{Device, Kind, Tensor};

use crate::actor_critic::{
    ActorCritic, ActorCriticLoss, ActorCriticPolicy, LossCoefficients, Settings, StepLoss, actor_critic_loss,
    explained_variance, mean_of,
};
use crate::data::rollout::{Rollout, sequence_rows};
use crate::data::vtrace::VtraceConfig;
use crate::nn::data_parallel::DataParallel;
use crate::nn::distributions::ActionDist;
use crate::nn::members::{
    Coef, MemberStack, Rows, backward_alone, clip_per_member_lazily, frozen, normalize_rows, reduce_and_clip_alone,
    stack, to_device_async,
};
use crate::nn::optimiser::{Optimiser, StackedOptimiser};
use crate::nn::params::FlatParams;
use crate::nn::phases::mark;
use crate::policy::ActOutput;
use crate::{Metrics, Result};

/// The networks (and optimisers) an actor-critic update trains, on the member axis.
#[allow(clippy::large_enum_variant)] // one per update, on the stack: no boxing to save
pub(crate) enum Nets<'a> {
    /// One member with its own network, replicas and optimiser.
    Alone {
        /// The network.
        net: &'a mut ActorCritic,
        /// Its replicas and micro-batches.
        parallel: &'a mut DataParallel,
        /// Its optimiser (`None` for a gradient worker, which computes gradients and takes no step).
        opt: Option<&'a mut Optimiser>,
    },
    /// Plain twin MLPs of one layout, stacked: the network over the rows' views, the rows (parameters and
    /// gradients) and the optimiser states stacked.
    Stacked(StackedActorCritic, Rows, StackedOptimiser),
}

impl Nets<'_> {
    /// Each member's advantages `[N, B]` to zero mean and unit variance (a member alone: over every replica's).
    fn normalize(&mut self, x: &Tensor) -> Result<Tensor> {
        match self {
            Nets::Alone { parallel, .. } => parallel.normalize(x),
            Nets::Stacked(..) => Ok(normalize_rows(x)),
        }
    }

    /// The clipped loss gradient of every member on a minibatch (`[N, B, …]` observations, actions, behaviour
    /// log-probs, advantages, old values and returns), accumulated over a member alone's micro-batches (each
    /// loss scaled by their share) and averaged over its replicas; `sequence` (a recurrent member alone: the
    /// starts `[T, M]` and initial states `[M, S]` of [`Sequences::of`]) runs it as whole env sequences. Each
    /// member's gradient is clipped to its limit. A member alone: a non-finite norm is an error naming
    /// `algorithm` (the step is not taken). Members stacked: it is recorded on the device, without waiting for
    /// the GPU, and `nn::members::check_finite` reports it before the update is written back to any
    /// member (the whole update is not applied). Returns each micro-batch's loss and policy.
    fn gradient(
        &mut self,
        [obs, actions, old_log_prob, advantages, old_values, returns]: [&Tensor; 6],
        sequence: Option<(Tensor, Tensor)>,
        c: &LossCoefficients<Coef>,
        need_entropy: bool,
        max_norms: &[f64],
        algorithm: &str,
    ) -> Result<Vec<(ActorCriticLoss, ActionDist)>> {
        let (micro_batches, scale) = match self {
            Nets::Alone { parallel, .. } => parallel.micro_batches(obs.size()[1]),
            Nets::Stacked(..) => (vec![(0, obs.size()[1])], 1.0),
        };
        let mut parts = Vec::with_capacity(micro_batches.len());
        for (j, &(start, len)) in micro_batches.iter().enumerate() {
            let micro = |t: &Tensor| if scale == 1.0 { t.shallow_clone() } else { t.narrow(1, start, len) };
            let (dist, values) = match (&*self, &sequence) {
                (Nets::Alone { net, .. }, Some((starts, state0))) => {
                    let (head, values, _) = net.forward_sequence(&obs.squeeze_dim(0), starts, state0);
                    (net.dist(head.unsqueeze(0)), values.unsqueeze(0))
                }
                (Nets::Alone { net, .. }, None) => {
                    let (head, values) = net.forward(&micro(obs).squeeze_dim(0));
                    (net.dist(head.unsqueeze(0)), values.unsqueeze(0))
                }
                (Nets::Stacked(net, ..), None) => net.forward(&micro(obs)),
                (Nets::Stacked(..), Some(_)) => unreachable!("recurrent members are not stacked (unbatchable)"),
            };
            let entropy = need_entropy.then(|| dist.entropy());
            let log_prob = dist.log_prob(&micro(actions));
            let (old, adv, old_values, returns) =
                (micro(old_log_prob), micro(advantages), micro(old_values), micro(returns));
            let loss = actor_critic_loss(&log_prob, &old, &adv, entropy.as_ref(), &values, &old_values, &returns, c);
            mark("forward and loss");
            match self {
                Nets::Alone { net, .. } => backward_alone(&mut net.params, &loss.total, scale, j > 0),
                Nets::Stacked(_, rows, _) => rows.backward(&loss.total),
            }
            mark("backward");
            parts.push((loss, dist));
        }
        match self {
            Nets::Alone { net, parallel, .. } => {
                reduce_and_clip_alone(&mut net.params, parallel, max_norms[0], algorithm)?
            }
            Nets::Stacked(_, rows, _) => clip_per_member_lazily(&rows.grad, max_norms, &mut rows.nonfinite),
        }
        mark("clipping gradients");
        Ok(parts)
    }

    /// One optimiser step of every member (learning rates `lrs`; a member alone has its own set already).
    fn step(&mut self, lrs: &[f64]) {
        match self {
            Nets::Alone { net, opt: Some(opt), .. } => opt.step(&mut net.params),
            Nets::Alone { opt: None, .. } => {}
            Nets::Stacked(_, rows, opt) => opt.step(&rows.params, &rows.grad, lrs),
        }
    }

    /// The mean of `x` over a member alone's replicas (members stacked have none).
    fn replica_mean(&mut self, x: f64) -> Result<f64> {
        match self {
            Nets::Alone { parallel, .. } => parallel.mean(x),
            Nets::Stacked(..) => Ok(x),
        }
    }
}

/// The members' rollouts (equal lengths) and their training targets, stacked on the member axis.
pub(crate) struct Batch {
    /// Observations as the networks take them, `[N, n, …]`.
    pub(crate) obs: Tensor,
    /// Actions taken, `[N, n]` indices or `[N, n, D]` floats.
    pub(crate) actions: Tensor,
    /// Their log-probabilities under the policy that collected them, `[N, n]`.
    pub(crate) old_log_prob: Tensor,
    /// Advantages `[N, n]` (GAE, or V-trace's).
    pub(crate) advantages: Tensor,
    /// Value targets `[N, n]`.
    pub(crate) returns: Tensor,
    /// The values the targets were computed with `[N, n]`.
    pub(crate) old_values: Tensor,
    /// Each member's explained variance of its value targets by its values.
    pub(crate) explained: Vec<f64>,
    /// Each member's V-trace importance-weight metrics (empty without V-trace).
    pub(crate) vtrace: Vec<Metrics>,
    /// A recurrent member alone: its rollout's sequences.
    pub(crate) sequences: Option<Sequences>,
}

/// A recurrent member's rollout as sequences: one per env, `n_steps` long.
pub(crate) struct Sequences {
    /// Envs `E` (one sequence each).
    pub(crate) n_envs: usize,
    /// Episode starts `[1, n]` (0/1 per transition, `Rollout::episode_starts`).
    pub(crate) starts: Tensor,
    /// Each env's state before the rollout `[E, S]`.
    pub(crate) state0: Tensor,
}

impl Sequences {
    /// The starts `[T, M]` and initial states `[M, S]` of the envs `envs` (their rows `idx` picked time-major,
    /// `None`: every env in order).
    pub(crate) fn of(&self, envs: Option<&[i64]>, idx: Option<&Tensor>) -> (Tensor, Tensor) {
        let m = envs.map_or(self.n_envs as i64, |e| e.len() as i64);
        let starts = idx.map_or_else(|| self.starts.shallow_clone(), |i| pick(&self.starts, i));
        let state0 = match envs {
            None => self.state0.shallow_clone(),
            Some(e) => self.state0.index_select(0, &Tensor::from_slice(e).to_device(self.state0.device())),
        };
        (starts.view([-1, m]), state0)
    }
}

impl Batch {
    /// `rollouts[k]` for `nets[k]`, with V-trace's targets recomputed under each member's parameters where
    /// `vtrace` is set (else the rollouts' own).
    pub(crate) fn new(
        nets: &[&ActorCritic],
        rollouts: &[&Rollout],
        gamma: f32,
        vtrace: Option<&VtraceConfig>,
    ) -> Result<Batch> {
        // The per-transition columns gathered on the host and made one tensor each, not one per member (2,048
        // members' small tensors and their stacking cost ~15 µs a member per update). V-trace re-evaluates each
        // member's observations on the device: there they are a tensor per member.
        let device = nets[0].device;
        let on_host = vtrace.is_none()
            && nets.len() > 1
            && rollouts.iter().all(|r| r.device_obs().is_none() && matches!(r.obs.as_ref(), ObsRef::F32(_)));
        let (mut obs, mut host_obs) = (Vec::new(), Vec::new());
        let mut cols: [Vec<f32>; 5] = Default::default();
        let (mut explained, mut weights) = (Vec::new(), Vec::new());
        for (net, r) in nets.iter().zip(rollouts) {
            let x = match (r.obs.as_ref(), r.device_obs()) {
                (ObsRef::F32(v), _) if on_host => {
                    host_obs.extend_from_slice(v);
                    None
                }
                (_, Some(x)) => Some(x.shallow_clone()),
                (o, None) => Some(net.obs_layout().tensor(o)?),
            };
            let targets = net.targets(r, x.as_ref(), gamma, vtrace)?;
            let (advantages, returns, values) = targets.advantages_returns_values();
            explained.push(explained_variance(values, returns));
            weights.push(targets.vtrace_metrics());
            let columns = [&r.actions[..], advantages, returns, values, &r.log_probs[..r.len()]];
            for (col, v) in cols.iter_mut().zip(columns) {
                col.extend_from_slice(v);
            }
            obs.extend(x);
        }
        let [actions, advantages, returns, old_values, old_log_prob] = cols;
        let members = nets.len() as i64;
        // `t` (`[N · n, …]`, member after member) as `[N, n, …]` on the device.
        let per_member = |t: Tensor| {
            let mut shape = t.size();
            shape.insert(0, members);
            shape[1] = -1;
            to_device_async(t.view(shape.as_slice()), device)
        };
        let obs = match on_host {
            true => per_member(
                crate::nn::nets::ObsLayout { device: Device::Cpu, ..nets[0].obs_layout() }
                    .tensor(ObsRef::F32(&host_obs))?,
            ),
            false => stack(obs),
        };
        let actions = per_member(nets[0].actions_tensor(&actions, Device::Cpu));
        let [advantages, returns, old_values, old_log_prob] =
            [advantages, returns, old_values, old_log_prob].map(|c| per_member(Tensor::from_slice(&c)));
        let sequences = match (nets, rollouts) {
            ([net], [r]) if net.state_dim() > 0 => {
                let (d, s) = (net.device, net.state_dim() as i64);
                Some(Sequences {
                    n_envs: r.n_envs,
                    starts: Tensor::from_slice(&r.episode_starts()).to_device(d).unsqueeze(0),
                    state0: Tensor::from_slice(&r.initial_state).view([-1, s]).to_device(d),
                })
            }
            _ => None,
        };
        Ok(Batch { obs, actions, old_log_prob, advantages, returns, old_values, explained, vtrace: weights, sequences })
    }
}

/// The update on libtorch over the member axis, as the members' settings `s` say (their schedules equal):
/// `n_epochs` passes over minibatches of `batch_size` samples (for a recurrent member, whole env sequences) in
/// orders each member's RNG in `rngs` shuffles every epoch (none: in order, nothing drawn), advantages normalised
/// where asked (per minibatch, or once for a full batch); each a gradient and an optimiser step of every member,
/// until a member alone's approximate KL passes `1.5 · target_kl`. Returns each member's loss terms on the last
/// minibatch ([`step_losses`]) and the steps taken.
pub(crate) fn train(
    nets: &mut Nets,
    mut rngs: Vec<&mut Pcg64>,
    batch: &Batch,
    s: &[Settings],
) -> Result<(Vec<StepLoss>, usize)> {
    let (s0, device, n) = (&s[0], batch.obs.device(), batch.obs.size()[1] as usize);
    let each = |f: fn(&LossCoefficients) -> f64| Coef::of(s.iter().map(|s| f(&s.coefficients)), device);
    let coefficients = LossCoefficients {
        clip_range: s0.coefficients.clip_range.map(|_| each(|c| c.clip_range.expect("all or none"))),
        clip_range_vf: s0.coefficients.clip_range_vf.map(|_| each(|c| c.clip_range_vf.expect("all or none"))),
        ent_coef: each(|c| c.ent_coef),
        vf_coef: each(|c| c.vf_coef),
    };
    let need_entropy = s.iter().any(|s| s.coefficients.ent_coef != 0.0);
    let max_norms: Vec<f64> = s.iter().map(|s| s.max_grad_norm).collect();
    let lrs: Vec<f64> = s.iter().map(|s| s.lr).collect();
    let Batch { obs, actions, old_log_prob, returns, old_values, sequences, .. } = batch;
    // What a minibatch draws: transitions, or for a recurrent policy whole env sequences (`T` rows each).
    let (units, unit_rows) = match sequences {
        Some(q) => (q.n_envs, n / q.n_envs),
        None => (n, 1),
    };
    let per_minibatch = s0.batch_size / unit_rows;
    let full_batch = s0.batch_size == n;
    let mut advantages = batch.advantages.shallow_clone();
    if s0.normalize_advantage && full_batch {
        // One minibatch holds every sample, so its normalisation is the same in every epoch: done once.
        advantages = nets.normalize(&advantages)?;
    }
    let normalize_minibatch = s0.normalize_advantage && !full_batch && s0.batch_size > 1;
    let mut orders: Vec<Vec<i64>> = s.iter().map(|_| (0..units as i64).collect()).collect();
    let mut gradient_steps = 0usize;
    let mut last = None;
    'epochs: for _ in 0..s0.n_epochs {
        for (rng, order) in rngs.iter_mut().zip(orders.iter_mut()) {
            order.shuffle(*rng);
        }
        // The epoch's draws of transitions, every member's row of `[N, n]` indices into the flattened batch
        // (member k's transition i at k · n + i), on the device in one copy rather than one per minibatch.
        let epoch_rows = (!full_batch && sequences.is_none()).then(|| {
            let rows: Vec<i64> =
                orders.iter().enumerate().flat_map(|(k, o)| o.iter().map(move |&i| i + (k * n) as i64)).collect();
            to_device_async(Tensor::from_slice(&rows), device).view([orders.len() as i64, units as i64])
        });
        for first in (0..units).step_by(per_minibatch) {
            // A full-batch "minibatch" needs no gather: each member's loss is a mean over its samples.
            let idx = match (sequences, &epoch_rows) {
                // Whole env sequences, time-major: row t · E + e for each step t of each drawn env e.
                (Some(q), _) if !full_batch => {
                    let envs = orders[0][first..first + per_minibatch].iter().map(|&e| e as usize);
                    let rows: Vec<i64> = sequence_rows(unit_rows, q.n_envs, envs).map(|i| i as i64).collect();
                    Some(Tensor::from_slice(&rows).to_device(device))
                }
                // Each member's next `per_minibatch` draws, member after member.
                (None, Some(rows)) => Some(rows.narrow(1, first as i64, per_minibatch as i64).reshape([-1])),
                _ => None,
            };
            let pick = |t: &Tensor| idx.as_ref().map_or_else(|| t.shallow_clone(), |i| pick(t, i));
            let mut mb_advantages = pick(&advantages);
            if normalize_minibatch {
                mb_advantages = nets.normalize(&mb_advantages)?;
            }
            let (mb_obs, mb_actions, mb_old_log_prob) = (pick(obs), pick(actions), pick(old_log_prob));
            let (mb_old_values, mb_returns) = (pick(old_values), pick(returns));
            let envs = (!full_batch).then(|| &orders[0][first..first + per_minibatch]);
            let sequence = sequences.as_ref().map(|q| q.of(envs, idx.as_ref()));
            let mb = [&mb_obs, &mb_actions, &mb_old_log_prob, &mb_advantages, &mb_old_values, &mb_returns];
            mark("drawing minibatches");
            let parts = nets.gradient(mb, sequence, &coefficients, need_entropy, &max_norms, s0.algorithm)?;
            // Without a clip range (A2C: one step), the loss terms are read before the step.
            let before = match coefficients.clip_range {
                None => Some(step_losses(&parts, None)?),
                Some(_) => None,
            };
            mark("losses to the host");
            nets.step(&lrs);
            mark("optimiser step");
            gradient_steps += 1;
            let stop = match s0.target_kl {
                None => false,
                Some(t) => {
                    let kl = ActorCriticLoss::merge(&parts).approx_kl().sum(Kind::Float);
                    nets.replica_mean(f64::try_from(kl).unwrap_or(0.0))? > 1.5 * t
                }
            };
            mark("losses to the host");
            last = Some((parts, before));
            if stop {
                break 'epochs;
            }
        }
    }
    let losses = match last.expect("at least one minibatch") {
        (_, Some(before)) => before,
        (parts, None) => step_losses(&parts, coefficients.clip_range.as_ref())?,
    };
    mark("losses to the host");
    Ok((losses, gradient_steps))
}

/// Each member's loss terms on a minibatch from its micro-batches' (`parts`): [`ActorCriticLoss::merge`]'s,
/// with PPO's approximate KL and clip fraction where there is a clip range (`clip`). An entropy left out of the
/// loss (coefficient 0) is the distributions': PPO's the last micro-batch's, A2C's the mean of theirs.
fn step_losses(parts: &[(ActorCriticLoss, ActionDist)], clip: Option<&Coef>) -> Result<Vec<StepLoss>> {
    let loss = ActorCriticLoss::merge(parts);
    let kl_clipped = clip.map(|c| (loss.approx_kl(), loss.clip_fraction(c)));
    let dist_entropy = |d: &ActionDist| tch::no_grad(|| d.entropy().mean_dim(-1, false, Kind::Float));
    let entropy = match (loss.entropy, clip) {
        (Some(e), _) => e,
        (None, Some(_)) => dist_entropy(&parts[parts.len() - 1].1),
        (None, None) => mean_of(parts.iter().map(|(_, d)| dist_entropy(d)).collect()),
    };
    let host = crate::nn::members::host;
    let (policy, value, entropy) = (host(&loss.policy)?, host(&loss.value)?, host(&entropy)?);
    let (kl, clipped) = match kl_clipped {
        Some((kl, clipped)) => (host(&kl)?, host(&clipped)?),
        None => (vec![0.0; policy.len()], vec![0.0; policy.len()]),
    };
    Ok((0..policy.len())
        .map(|k| StepLoss {
            policy: policy[k],
            value: value[k],
            entropy: entropy[k],
            approx_kl: kl[k],
            clip_fraction: clipped[k],
        })
        .collect())
}

/// Rows `idx` (`[N · B]`, member `k`'s rows numbered from `k · n`) of `t` (`[N, n, …]`), as `[N, B, …]`.
fn pick(t: &Tensor, idx: &Tensor) -> Tensor {
    let mut shape = t.size();
    shape[1] = -1;
    t.flatten(0, 1).index_select(0, idx).view(shape.as_slice())
}

/// The members' actor-critic networks (plain twin MLPs of one layout) as one, over their parameters stacked
/// (each parameter's `[N, …]`: views of the update's `Rows`, or the [`frozen`] copies a forward pass takes).
pub(crate) struct StackedActorCritic {
    n_members: i64,
    layers: Vec<usize>,
    activation: crate::nn::nets::Activation,
    outputs: [i64; 2],
    log_std: Option<usize>,
    /// Each parameter of every member, `[N, …]`.
    views: Vec<Tensor>,
}

impl StackedActorCritic {
    /// The members' networks (their layouts must match: `agent::unbatchable` checks) over `views`, their
    /// parameters stacked (`Rows::of`'s views to train, [`frozen`] or a [`MemberStack`]'s to run forward).
    pub(crate) fn new(nets: &[&ActorCritic], views: Vec<Tensor>) -> Self {
        let (l, activation, outputs, log_std) = nets[0].twin_layout().expect("checked by the caller");
        let n_members = nets.len() as i64;
        StackedActorCritic { n_members, layers: l.to_vec(), activation, outputs, log_std, views }
    }

    /// Every member's policy `[N, B, A]` and values `[N, B]` on its own observations `x` (`[N, B, obs]`): the
    /// `2N` MLPs as one chain of batched matmuls (`TwinMlp::forward`'s ops).
    fn forward(&self, x: &Tensor) -> (ActionDist, Tensor) {
        let (n_members, views) = (self.n_members, &self.views);
        let b = x.size()[1];
        let x = x.unsqueeze(1).expand([n_members, 2, b, x.size()[2]], false).reshape([2 * n_members, b, -1]);
        let param = |k: usize, _| {
            let i = self.layers[k];
            let w = views[i].reshape([2 * n_members, views[i].size()[2], views[i].size()[3]]);
            (w, views[i + 1].reshape([2 * n_members, 1, -1]))
        };
        let h = crate::nn::mixed::mlp(self.layers.len(), param, |h| self.activation.apply(h), &x, false);
        let h = h.view([n_members, 2, b, -1]);
        let head = h.select(1, 0).narrow(2, 0, self.outputs[0]);
        let dist = match self.log_std {
            None => ActionDist::Categorical { logits: head },
            Some(i) => ActionDist::DiagGaussian { mean: head, log_std: views[i].unsqueeze(1) },
        };
        (dist, h.select(1, 1).narrow(2, 0, self.outputs[1]).squeeze_dim(2))
    }
}

/// The members' parameter buffers.
pub(crate) fn params_of<'a>(nets: &[&'a ActorCritic]) -> Vec<&'a FlatParams> {
    nets.iter().map(|n| &n.params).collect()
}

/// The members' networks and observations as one forward pass needs them: plain twin MLPs of one layout on one
/// device, and float observations (`obs[k]` member `k`'s rows), as `[N, R, obs]` with each member's rows
/// zero-padded to the most any has (`R`). `None` where they are not (then each member runs alone).
fn stackable(nets: &[&ActorCritic], obs: &[ObsRef<'_>]) -> Option<(Tensor, usize)> {
    let first = nets.first()?;
    let l0 = first.twin_layout()?;
    let same = |n: &&ActorCritic| {
        n.device == first.device && n.params.numel() == first.params.numel() && n.twin_layout() == Some(l0)
    };
    let (len, obs_dim) = (obs.iter().map(ObsRef::len).max()?, first.obs_dim());
    let whole = obs.iter().all(|o| o.len().is_multiple_of(obs_dim) && matches!(o, ObsRef::F32(_)));
    if nets.len() < 2 || nets.len() != obs.len() || !nets.iter().all(same) || len == 0 || !whole {
        return None;
    }
    let mut x = vec![0.0; len * nets.len()];
    for (row, o) in x.chunks_mut(len).zip(obs) {
        if let ObsRef::F32(v) = o {
            row[..v.len()].copy_from_slice(v);
        }
    }
    let rows = len / obs_dim;
    let x = Tensor::from_slice(&x).view([nets.len() as i64, rows as i64, obs_dim as i64]).to_device(first.device);
    Some((x, rows))
}

/// A tensor's elements on the host, in row-major order.
fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(Vec::<f32>::try_from(t.flatten(0, -1).to_device(Device::Cpu))?)
}

/// One acting pass of a population's members whose networks stack ([`stackable`]; `Ok(false)` where they do
/// not, and nothing is done): every member's observations (`obs[k]`) go through the `2N` MLPs as one chain of
/// batched matmuls, the heads and values come back to the host in one copy each, and each member samples from
/// its own rows with its own RNG, as [`ActorCritic::act_with_state`] does — so a member's actions, log-probs
/// and values are its acting alone's to float rounding (the matmuls' sums may add in another order). On an
/// accelerator this is one pass instead of `N` launch-bound ones. The parameters come stacked from `kept`
/// (kept from the last pass while no member's changed).
pub(crate) fn act_stacked(
    pis: &mut [&mut ActorCriticPolicy],
    obs: &[ObsRef<'_>],
    deterministic: bool,
    outs: &mut [&mut ActOutput],
    kept: &mut MemberStack,
) -> Result<bool> {
    let nets: Vec<&ActorCritic> = pis.iter().map(|p| &p.net).collect();
    if obs.iter().any(|o| o.len() != obs[0].len()) {
        return Ok(false);
    }
    // Phase by phase where `FLOTILLA_PROFILE_UPDATE=1` (`nn::phases`; a device wait at each mark).
    let _timing = crate::nn::phases::start(nets.first().map_or(Device::Cpu, |n| n.device), || true)?;
    let Some((x, rows)) = stackable(&nets, obs) else { return Ok(false) };
    mark("acting: observations to the device");
    let stacked = StackedActorCritic::new(&nets, kept.views(&params_of(&nets)));
    mark("acting: stacking parameters");
    let (dist, values) = tch::no_grad(|| stacked.forward(&x));
    mark("acting: forward pass");
    // The heads, values and log-stds (Gaussian heads) to the host in one copy (on an accelerator each copy
    // waits for the device), then apart.
    let (head, log_std) = match &dist {
        ActionDist::Categorical { logits } => (logits, None),
        ActionDist::DiagGaussian { mean, log_std } => (mean, Some(log_std)),
    };
    let parts: Vec<Tensor> =
        [Some(head), Some(&values), log_std].into_iter().flatten().map(|t| t.flatten(0, -1)).collect();
    let mut rest = host(&Tensor::cat(&parts, 0))?;
    let mut pieces = parts.iter().map(|t| {
        let tail = rest.split_off(t.numel());
        std::mem::replace(&mut rest, tail)
    });
    let (mut head, values) = (pieces.next().expect("head"), pieces.next().expect("values"));
    let log_std = pieces.next().unwrap_or_default();
    mark("acting: heads to the host");
    let (head_len, std_len) = (rows * stacked.outputs[0] as usize, log_std.len() / pis.len());
    for (k, (pi, out)) in pis.iter_mut().zip(outs.iter_mut()).enumerate() {
        let ActorCriticPolicy { net, rng, scratch } = &mut **pi;
        out.q_values.clear();
        out.values.clear();
        out.values.extend_from_slice(&values[k * rows..(k + 1) * rows]);
        let h = &mut head[k * head_len..(k + 1) * head_len];
        net.sample_with(deterministic, rng, &mut scratch.samples, h, &log_std[k * std_len..(k + 1) * std_len], out);
    }
    mark("acting: sampling on the host");
    Ok(true)
}

/// `V` of every member's observations (`obs[k]`, any number of rows each) in one batched pass where the
/// networks stack ([`stackable`]); `None` where they do not.
pub(crate) fn values_stacked(nets: &[&ActorCritic], obs: &[ObsRef<'_>]) -> Result<Option<Vec<Vec<f32>>>> {
    let Some((x, rows)) = stackable(nets, obs) else { return Ok(None) };
    let (_, values) = tch::no_grad(|| StackedActorCritic::new(nets, frozen(&params_of(nets))).forward(&x));
    let obs_dim = nets[0].obs_dim();
    let values = host(&values)?;
    Ok(Some(values.chunks(rows).zip(obs).map(|(v, o)| v[..o.len() / obs_dim].to_vec()).collect()))
}

#[cfg(test)]
pub(crate) mod tests {
    use flotilla_core::{ObsRef, Space};
    use rand::Rng;
    use rand_pcg::Pcg64;

    use crate::data::rollout::Rollout;
    use crate::policy::{ActMode, ActOutput, Policy};

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
            let rewards: Vec<f32> =
                out.actions.chunks(act_dim).map(|a| a[0].tanh() + rng.random_range(-0.1..0.1)).collect();
            let done: Vec<bool> = (0..n_envs).map(|_| rng.random_bool(0.1)).collect();
            rollout.push_acted(&obs, &out, &rewards, &done);
        }
        rollout.finish(&vec![0.0; n_envs], 0.98, 0.8).unwrap();
        rollout
    }

    pub(crate) fn cartpole() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2))
    }
}
