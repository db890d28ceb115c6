//! DQN for a population: the members' training phases as one batched program.
//!
//! Each member stays a whole [`Dqn`] (its replay, RNG, ε schedule, target network, Adam moments; it acts and
//! observes exactly as it would alone, and syncs its own target network on its own interval). When the
//! members' training phases fall due together (they share `train_freq`, `learning_starts` and
//! `gradient_steps`), [`update_population`] gathers their online and target parameters and Adam moments into
//! `[N, P]` tensors and runs the phase's gradient steps once for all: each member samples its own minibatch
//! from its own replay with its own RNG, the `N` MLPs (online, target and, for double-Q, the online net on the
//! next observations) run as batched matmuls, each member's Huber loss is a mean over its own minibatch, one
//! backward of the summed losses gives each member its own gradient, clipped to its own limit, and one Adam
//! step with per-member learning rates and ε follows (`crate::nn::members::clip_per_member`, `crate::nn::adam::StackedAdam`).
//! Elementwise maths is the single-member code's; reductions may add in another order.
use tch::{Kind, Reduction, Tensor};

use crate::algorithm::Algorithm;
use crate::dqn::{Dqn, Memory, lock};
use crate::nn::adam::StackedAdam;
use crate::nn::members::{backward_into, clip_per_member, member_views};
use crate::transition::Progress;
use crate::{Error, Metrics, Result};

/// Why these members cannot share one batched training phase (`None`: they can): batching takes plain-MLP
/// Q-networks (no dueling, CNN or task heads) with uniform replay and no data-parallel replicas, and the same
/// training schedule. Members that cannot are updated one by one with the same results.
pub fn unbatchable(members: &[&Dqn]) -> Option<String> {
    let first = members.first()?;
    let c0 = &first.config;
    let layout = |m: &Dqn| m.q.mlp_layout().map(|(l, a)| (l.to_vec(), a));
    if layout(first).is_none() || first.q.dueling || first.q.heads > 1 {
        return Some("the Q-network is not a plain MLP (a CNN, dueling or task heads)".into());
    }
    for m in members {
        let c = &m.config;
        if layout(m) != layout(first) || m.online.numel() != first.online.numel() || m.q.device != first.q.device {
            return Some("members' networks differ".into());
        }
        if !matches!(lock(&m.side).memory, Memory::Uniform(..)) {
            return Some("prioritized or frame replay".into());
        }
        if c.fused_cpu && m.q.device == tch::Device::Cpu {
            // The fused step has no per-op dispatch for a batch to share: members step in turn, each as alone.
            return Some("members take the fused CPU step (`fused_cpu`)".into());
        }
        if m.parallel.replicas() > 1 || m.parallel.accumulate() > 1 || m.online.has_frozen() {
            return Some("data-parallel replicas, gradient accumulation or frozen layers".into());
        }
        if (c.train_freq, c.gradient_steps, c.learning_starts, c.batch_size, c.double_q, c.anneal_lr)
            != (c0.train_freq, c0.gradient_steps, c0.learning_starts, c0.batch_size, c0.double_q, c0.anneal_lr)
            || m.opt.steps != first.opt.steps
        {
            return Some("members' training schedules or optimiser steps differ".into());
        }
    }
    None
}

/// The training due after a lockstep env step, for every member: one batched phase when all are due together
/// (each member's metrics), `None` for members with nothing due; members [`unbatchable`] refuses update alone.
pub fn update_population(members: &mut [&mut Dqn], progress: &Progress) -> Result<Vec<Option<Metrics>>> {
    let refs: Vec<&Dqn> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().map(|m| m.update(progress)).collect();
    }
    let mut dues = Vec::with_capacity(members.len());
    for m in members.iter_mut() {
        m.set_learning_rate(progress);
        let config = m.config.clone();
        dues.push(lock(&m.side).phase_due(&config, progress));
    }
    if dues.iter().all(|&d| d == 0) {
        return Ok(vec![None; members.len()]);
    }
    if dues.iter().any(|&d| d != dues[0]) {
        return Err(Error::Unsupported(format!(
            "dqn population: members' training phases fell due apart ({dues:?} gradient steps)"
        )));
    }
    let due = dues[0];
    let (layers, activation) = {
        let (l, a) = members[0].q.mlp_layout().expect("checked by unbatchable");
        (l.to_vec(), a)
    };
    let stack = |f: &dyn Fn(&Dqn) -> Tensor| Tensor::stack(&members.iter().map(|m| f(m)).collect::<Vec<_>>(), 0);
    let online = stack(&|m| m.online.flat().detach()).set_requires_grad(true);
    let target = stack(&|m| m.target.flat().detach());
    let grad = online.zeros_like().detach();
    let mut adam = StackedAdam::new(&members.iter().map(|m| &m.opt).collect::<Vec<_>>(), &online);
    let lrs: Vec<f64> = members.iter().map(|m| m.opt.lr).collect();
    let max_norms: Vec<f64> = members.iter().map(|m| m.config.max_grad_norm).collect();
    let double_q = members[0].config.double_q;
    let views = member_views(&online, &members[0].online);
    let grad_views = member_views(&grad, &members[0].online);
    // The members' MLPs on `x` `[N, B, obs]`: `[N, B, n_actions]`.
    let forward = |params: &[Tensor], x: &Tensor| batched_mlp(params, &layers, &|h| activation.apply(h), x);
    let layout = members[0].q.layout();
    let target_params = tch::no_grad(|| mlp_operands(&member_views(&target, &members[0].target)));
    let batch = members[0].config.batch_size;
    let mut phase = Vec::with_capacity(due);
    for _ in 0..due {
        let mut samples = Vec::with_capacity(members.len());
        for m in members.iter() {
            samples.push(lock(&m.side).sample(batch, &layout)?);
        }
        let stacked = |f: &dyn Fn(&crate::dqn::DqnBatch) -> &Tensor| {
            Tensor::stack(&samples.iter().map(|s| f(s).shallow_clone()).collect::<Vec<_>>(), 0)
        };
        let (obs, next_obs, actions) = (stacked(&|s| &s.obs), stacked(&|s| &s.next_obs), stacked(&|s| &s.actions));
        let (rewards, bootstrap) = (stacked(&|s| &s.rewards), stacked(&|s| &s.bootstrap));
        let target_q = tch::no_grad(|| {
            let next_q = forward(&target_params, &next_obs);
            let next = if double_q {
                let best = forward(&mlp_operands(&views), &next_obs).argmax(2, true);
                next_q.gather(2, &best, false).squeeze_dim(2)
            } else {
                next_q.amax(2, false)
            };
            &rewards + &bootstrap * next
        });
        let q = forward(&mlp_operands(&views), &obs).gather(2, &actions, false).squeeze_dim(2);
        let loss = q.smooth_l1_loss(&target_q, Reduction::None, 1.0).mean_dim(1, false, Kind::Float);
        backward_into(&loss, &views, &grad_views);
        clip_per_member(&grad, &max_norms, "dqn")?;
        adam.step(&online, &grad, &lrs);
        for m in members.iter() {
            lock(&m.side).counters.gradient_steps += 1;
        }
        phase.push((loss.detach(), q.detach().mean_dim(1, false, Kind::Float)));
    }
    tch::no_grad(|| {
        for (k, m) in members.iter_mut().enumerate() {
            let mut flat = m.online.flat().shallow_clone();
            flat.copy_(&online.get(k as i64));
            adam.write_back(k, &mut m.opt);
        }
    });
    members
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let own: Vec<(Tensor, Tensor)> = phase.iter().map(|(l, q)| (l.get(k as i64), q.get(k as i64))).collect();
            let (epsilon, beta) = {
                let c = &lock(&m.side).counters;
                (c.epsilon, c.beta)
            };
            m.phase_metrics(&own, epsilon, beta).map(Some)
        })
        .collect()
}

/// A member-stacked MLP's parameter views (`[N, in, out]` weights, `[N, out]` biases; [`member_views`]) as
/// [`batched_mlp`] takes them. Biases become `[N, 1, out]`, broadcasting over each member's rows. Weights are
/// copied contiguous: a batched matmul on `[N, in, out]` views strided by the member's whole buffer runs at
/// half speed (measured, 256×256 layers), the copy costs far less.
pub(crate) fn mlp_operands(views: &[Tensor]) -> Vec<Tensor> {
    views.iter().map(|v| if v.dim() == 3 { v.contiguous() } else { v.unsqueeze(1) }).collect()
}

/// The members' MLPs on `x` (`[N, B, in]`) → `[N, B, out]`: `crate::nn::nets::FlatMlp::forward` as batched
/// matmuls, with `params` from [`mlp_operands`] and `layers` the weights' indices (each bias follows its
/// weight); `activate` runs between layers (the single-member code's own nonlinearity, op for op).
pub(crate) fn batched_mlp(
    params: &[Tensor],
    layers: &[usize],
    activate: &dyn Fn(&Tensor) -> Tensor,
    x: &Tensor,
) -> Tensor {
    let last = layers.len() - 1;
    let mut h = x.shallow_clone();
    for (k, &i) in layers.iter().enumerate() {
        h = params[i + 1].baddbmm(&h, &params[i], 1.0, 1.0);
        if k < last {
            h = activate(&h);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use flotilla_core::{ObsRef, Space};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::dqn::DqnConfig;
    use crate::nn::members::rel_diff;
    use crate::policy::{ActMode, ActOutput, Policy};
    use crate::transition::Transition;

    /// Members trained together match twins (same seeds, configs and transitions) trained alone: every phase's
    /// metrics, and the online and target parameters within 1e-6 relative after ~40 gradient steps.
    fn check(configs: Vec<DqnConfig>) {
        let obs_space = Space::box1d(vec![-1.0; 4], vec![1.0; 4]);
        let act_space = Space::discrete(3);
        let n_envs = 2;
        // The libtorch path on both sides (the fused CPU step is never batched).
        let build = |c: &DqnConfig, k: usize| {
            let c = DqnConfig { fused_cpu: false, ..c.clone() };
            Dqn::new(&obs_space, &act_space, n_envs, c, Device::Cpu, 40 + k as u64).unwrap()
        };
        let mut together: Vec<Dqn> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        let mut alone: Vec<Dqn> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        let mut rng = Pcg64::seed_from_u64(3);
        let total = 400u64;
        let mut phases = 0;
        for step in 1..=(total / n_envs as u64) {
            let obs: Vec<f32> = (0..n_envs * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
            let next: Vec<f32> = (0..n_envs * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
            let rewards: Vec<f32> = (0..n_envs).map(|_| rng.random_range(-1.0..1.0)).collect();
            let done: Vec<bool> = (0..n_envs).map(|_| rng.random_bool(0.05)).collect();
            for (m, twin) in together.iter_mut().zip(alone.iter_mut()) {
                let (mut out, mut twin_out) = (ActOutput::default(), ActOutput::default());
                m.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
                twin.act(ObsRef::F32(&obs), ActMode::Explore, &mut twin_out).unwrap();
                let t = Transition {
                    obs: ObsRef::F32(&obs),
                    act: &out,
                    rewards: &rewards,
                    terminated: &done,
                    truncated: &vec![false; n_envs],
                    next_obs: ObsRef::F32(&next),
                };
                m.observe(&t).unwrap();
                twin.observe(&t).unwrap();
            }
            let progress = Progress { env_steps: step * n_envs as u64, total_env_steps: total };
            let mut refs: Vec<&mut Dqn> = together.iter_mut().collect();
            let batched = update_population(&mut refs, &progress).unwrap();
            for (k, (twin, b)) in alone.iter_mut().zip(&batched).enumerate() {
                let single = twin.update(&progress).unwrap();
                assert_eq!(single.is_some(), b.is_some(), "step {step} member {k}: phases fall due together");
                if let (Some(a), Some(s)) = (b, &single) {
                    phases += 1;
                    for key in ["losses/td_loss", "losses/q_values", "charts/epsilon", "charts/learning_rate"] {
                        let (x, y) = (a.get(key).unwrap(), s.get(key).unwrap());
                        assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "step {step} member {k} {key}: {x} vs {y}");
                    }
                }
            }
        }
        assert!(phases >= 6 * configs.len(), "{phases} training phases");
        for (k, (a, b)) in together.iter().zip(&alone).enumerate() {
            let d = rel_diff(a.params().flat(), b.params().flat());
            assert!(d <= 1e-6, "member {k}: online parameters differ by {d:e} (relative)");
            let d = rel_diff(a.target.flat(), b.target.flat());
            assert!(d <= 1e-6, "member {k}: target parameters differ by {d:e} (relative)");
            assert_eq!(a.opt.steps, b.opt.steps);
        }
    }

    fn small(lr: f64, gamma: f64, target_update_interval: u64, double_q: bool) -> DqnConfig {
        DqnConfig {
            learning_rate: lr,
            gamma,
            target_update_interval,
            double_q,
            batch_size: 16,
            buffer_size: 1000,
            learning_starts: 60,
            train_freq: 20,
            gradient_steps: 5,
            hidden_sizes: vec![32, 32],
            exploration_fraction: 0.5,
            max_grad_norm: 0.5,
            ..DqnConfig::default()
        }
    }

    #[test]
    fn members_match_their_runs_alone() {
        check(vec![small(1e-3, 0.99, 30, false), small(3e-3, 0.9, 50, false), small(5e-4, 0.95, 10, false)]);
    }

    #[test]
    fn double_q_members_match_their_runs_alone() {
        check(vec![small(1e-3, 0.99, 30, true), small(2e-3, 0.98, 20, true)]);
    }

    #[test]
    fn dueling_members_are_not_batched() {
        let obs = Space::box1d(vec![-1.0; 4], vec![1.0; 4]);
        let a = Dqn::new(
            &obs,
            &Space::discrete(2),
            1,
            DqnConfig { dueling: true, ..small(1e-3, 0.99, 30, false) },
            Device::Cpu,
            1,
        )
        .unwrap();
        assert!(unbatchable(&[&a, &a]).unwrap().contains("dueling"));
        let fused = Dqn::new(&obs, &Space::discrete(2), 1, small(1e-3, 0.99, 30, false), Device::Cpu, 1).unwrap();
        assert!(unbatchable(&[&fused, &fused]).unwrap().contains("fused"));
        let torch = DqnConfig { fused_cpu: false, ..small(1e-3, 0.99, 30, false) };
        let torch = Dqn::new(&obs, &Space::discrete(2), 1, torch, Device::Cpu, 1).unwrap();
        assert!(unbatchable(&[&torch, &torch]).is_none());
    }
}
