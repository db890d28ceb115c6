//! DDPG and TD3 for a population: the members' training phases as one batched program.
//!
//! Each member stays a whole [`Td3`] (its replay, RNG, exploration noise, actor, critics, their targets and
//! Adam moments; it acts and observes exactly as it would alone). When the members' training phases fall due
//! together (they share `train_freq`, `learning_starts`, `gradient_steps`, `batch_size` and `policy_delay`, and
//! are all DDPG or all TD3), [`update_population`] gathers actors, actor targets, critics and critic targets
//! into `[N, P]` tensors and runs the phase's gradient steps once for all. Each step: every member samples its
//! own minibatch from its own replay with its own RNG, drawing its own target-policy-smoothing noise (σ̃ and
//! its clip are the member's), exactly as alone; the `N` target actors and critics make each member's target
//! `r + γ (1 − terminated) min_j Q̄_j(s', a')` (γ is the member's, stored with its transitions); each member's
//! critic loss is its own sum over critics and mean over its minibatch; one backward of the summed losses gives
//! each member its own gradient, and one Adam step with per-member learning rates and ε follows
//! (`crate::nn::adam::StackedAdam`). On the policy-delay steps the actor loss `−mean Q_1(s, π(s))` (critic
//! 1 just updated, its weights detached) goes the same way, then the Polyak updates of both targets, with each
//! member's τ (`lerp_` with a per-member weight, as [`Td3`]'s `FlatParams::polyak_from`). The MLPs run as
//! batched matmuls (`crate::dqn::population::batched_mlp`). TD3 clips no gradients, so neither does this.
//!
//! Elementwise maths is the single-member code's, op for op; only reductions (matmuls, the losses' means) may
//! add in another order, so a member matches its run alone to float rounding (tests: within 1e-6 relative).
use tch::{Kind, Reduction, Tensor};

use crate::algorithm::Algorithm;
use crate::dqn::population::{batched_mlp, mlp_operands};
use crate::nn::adam::Adam;
use crate::nn::adam::StackedAdam;
use crate::nn::members::{backward_into, member_views, per_member};
use crate::nn::params::FlatParams;
use crate::td3::{Td3, activate};
use crate::transition::Progress;
use crate::{Error, Metrics, Result};

/// Why these members cannot share one batched training phase (`None`: they can): batching takes plain-MLP
/// actors and critics (no task heads) of one shape on one device, no data-parallel replicas, accumulation or
/// frozen layers, the libtorch step (on the CPU `fused_cpu` takes its Adam and Polyak steps as host loops, one
/// member at a time), one algorithm (DDPG or TD3) and one training schedule, at the same optimiser step.
/// Members that cannot are updated one by one with the same results.
pub fn unbatchable(members: &[&Td3]) -> Option<String> {
    let first = members.first()?;
    let c0 = &first.config;
    if first.pi.heads > 1 || first.critic_net.heads > 1 {
        return Some("the actor or critics are not plain MLPs (task heads)".into());
    }
    let layout = |m: &Td3| {
        let net = |(l, a): (&[usize], crate::nn::nets::Activation)| (l.to_vec(), a);
        (net(m.pi.net.layout()), m.critic_net.nets.iter().map(|n| net(n.layout())).collect::<Vec<_>>())
    };
    let schedule = |m: &Td3| {
        let c = &m.config;
        let s = (c.train_freq, c.gradient_steps, c.learning_starts, c.batch_size, c.policy_delay);
        (m.name(), s, c.smoothing(), m.counters.calls)
    };
    let l0 = layout(first);
    for m in members {
        if schedule(m) != schedule(first) {
            return Some(
                "members' training schedules differ (algorithm, train_freq, gradient_steps, \
                         learning_starts, batch_size, policy_delay or target smoothing)"
                    .into(),
            );
        }
        let c = &m.config;
        if layout(m) != l0
            || c.hidden_sizes != c0.hidden_sizes
            || (m.obs_dim, m.act_dim) != (first.obs_dim, first.act_dim)
            || (m.actor.numel(), m.critic.numel()) != (first.actor.numel(), first.critic.numel())
            || m.device != first.device
        {
            return Some("members' networks, parameter counts or devices differ".into());
        }
        if c.fused_cpu && m.device == tch::Device::Cpu {
            // Host Adam and Polyak loops have no per-op dispatch for a batch to share: members step in turn,
            // each as alone.
            return Some("members take the fused CPU step (`fused_cpu`)".into());
        }
        if m.parallel.replicas() > 1 || m.parallel.accumulate() > 1 || m.actor.has_frozen() || m.critic.has_frozen() {
            return Some("data-parallel replicas, gradient accumulation or frozen layers".into());
        }
        let steps = |m: &Td3| (m.actor_opt.steps, m.critic_opt.steps, m.counters.critic_updates);
        if steps(m) != steps(first) {
            return Some("members' optimiser steps differ".into());
        }
    }
    None
}

/// The training due after a lockstep env step, for every member: one batched phase when all are due together
/// (each member's metrics, as its own update reports them), `None` for members with nothing due; members
/// [`unbatchable`] refuses update alone.
pub fn update_population(members: &mut [&mut Td3], progress: &Progress) -> Result<Vec<Option<Metrics>>> {
    let refs: Vec<&Td3> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().map(|m| m.update(progress)).collect();
    }
    let dues: Vec<bool> = members.iter().map(|m| m.phase_due(progress)).collect();
    if dues.iter().all(|&d| !d) {
        return Ok(vec![None; members.len()]);
    }
    if dues.iter().any(|&d| !d) {
        let name = members[0].name();
        return Err(Error::Unsupported(format!("{name} population: members' training phases fell due apart {dues:?}")));
    }
    let device = members[0].device;
    let (od, ad) = (members[0].obs_dim as i64, members[0].act_dim as i64);
    let (b, smoothing) = (members[0].config.batch_size as i64, members[0].config.smoothing());
    let activation = members[0].config.activation;
    let mut actors = Stacked::new(members, |m| (&m.actor, &m.actor_target, &m.actor_opt));
    let mut critics = Stacked::new(members, |m| (&m.critic, &m.critic_target, &m.critic_opt));
    let taus: Vec<f64> = members.iter().map(|m| m.config.tau).collect();
    let actor_layers = members[0].pi.net.layout().0.to_vec();
    let critic_layers: Vec<Vec<usize>> = members[0].critic_net.nets.iter().map(|n| n.layout().0.to_vec()).collect();
    // The networks as `Td3` runs them: FlatMlp's activation between layers; the actor ends in tanh; the critics'
    // outputs side by side, `[N, B, n_critics]`.
    let hidden = |h: &Tensor| activation.apply(h);
    let actor_net = |params: &[Tensor], obs: &Tensor| batched_mlp(params, &actor_layers, &hidden, obs).tanh();
    let critic_nets = |params: &[Tensor], x: &Tensor| match critic_layers.as_slice() {
        [one] => batched_mlp(params, one, &hidden, x),
        all => Tensor::cat(&all.iter().map(|l| batched_mlp(params, l, &hidden, x)).collect::<Vec<_>>(), 2),
    };
    // Critic 1 as the actor loss reads it (`Critics::forward_first`): detached aliases of the critics' buffer.
    let mut first_views = member_views(&critics.online.detach(), &members[0].critic);
    first_views.truncate(2 * members[0].critic_net.layers);
    let first_activation = |h: &Tensor| activate(activation, h.shallow_clone());

    let n_steps = members[0].config.gradient_steps;
    let (mut critic_losses, mut qs, mut actor_losses) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n_steps {
        let update_actor = members[0].actor_step_due();
        let mut rows = Vec::with_capacity(members.len());
        for m in members.iter_mut() {
            let width = m.fill_batch()?;
            rows.push(Tensor::f_from_slice(&m.batch)?.f_view([b, width as i64])?);
        }
        let x = Tensor::stack(&rows, 0).to_device(device);
        let obs = x.narrow(2, 0, od);
        let next_obs = x.narrow(2, od + ad, od);
        let target = tch::no_grad(|| {
            let mut next_action = actor_net(&mlp_operands(&actors.target_views), &next_obs);
            if smoothing {
                next_action = (next_action + x.narrow(2, 2 * od + ad + 2, ad)).clamp(-1.0, 1.0);
            }
            let next_q = critic_nets(&mlp_operands(&critics.target_views), &Tensor::cat(&[&next_obs, &next_action], 2));
            x.narrow(2, 2 * od + ad, 1).addcmul(&x.narrow(2, 2 * od + ad + 1, 1), &next_q.amin(2, true))
        });
        let q = critic_nets(&mlp_operands(&critics.views), &x.narrow(2, 0, od + ad));
        let dims = [1i64, 2];
        let loss =
            q.mse_loss(&target.expand_as(&q), Reduction::None).sum_dim_intlist(dims.as_slice(), false, Kind::Float)
                / b as f64;
        backward_into(&loss, &critics.views, &critics.grad_views);
        critics.adam_step();
        for m in members.iter_mut() {
            m.counters.critic_updates += 1;
        }
        critic_losses.push(loss.detach());
        qs.push(q.detach().mean_dim(dims.as_slice(), false, Kind::Float));
        if update_actor {
            let action = actor_net(&mlp_operands(&actors.views), &obs);
            let q1 = batched_mlp(
                &mlp_operands(&first_views),
                &critic_layers[0],
                &first_activation,
                &Tensor::cat(&[&obs, &action], 2),
            );
            let loss = -q1.mean_dim(dims.as_slice(), false, Kind::Float);
            backward_into(&loss, &actors.views, &actors.grad_views);
            actors.adam_step();
            critics.polyak(&taus);
            actors.polyak(&taus);
            for m in members.iter_mut() {
                m.counters.actor_updates += 1;
            }
            actor_losses.push(loss.detach());
        }
    }
    members
        .iter_mut()
        .enumerate()
        .map(|(k, m)| {
            actors.scatter(k, &m.actor, &m.actor_target, &mut m.actor_opt);
            critics.scatter(k, &m.critic, &m.critic_target, &mut m.critic_opt);
            let own = |ts: &[Tensor]| ts.iter().map(|t| t.get(k as i64)).collect::<Vec<_>>();
            m.phase_metrics(&own(&critic_losses), &own(&qs), &own(&actor_losses)).map(Some)
        })
        .collect()
}

/// One network of every member (the actors, or the critics), stacked on a leading member axis: online
/// parameters `[N, P]` (one leaf), targets, gradients and Adam moments, with views in the members' layer shapes.
struct Stacked {
    online: Tensor,
    target: Tensor,
    grad: Tensor,
    adam: StackedAdam,
    lrs: Vec<f64>,
    views: Vec<Tensor>,
    target_views: Vec<Tensor>,
    grad_views: Vec<Tensor>,
}

impl Stacked {
    /// The members' `(online, target, optimiser)` that `pick` names, stacked.
    fn new(members: &[&mut Td3], pick: fn(&Td3) -> (&FlatParams, &FlatParams, &Adam)) -> Self {
        let picked: Vec<_> = members.iter().map(|m| pick(m)).collect();
        let stack = |f: &dyn Fn(&(&FlatParams, &FlatParams, &Adam)) -> Tensor| {
            Tensor::stack(&picked.iter().map(f).collect::<Vec<_>>(), 0)
        };
        let online = stack(&|(p, _, _)| p.flat().detach()).set_requires_grad(true);
        let target = stack(&|(_, t, _)| t.flat().detach());
        let grad = online.zeros_like().detach();
        let (layout, _, _) = picked[0];
        Stacked {
            views: member_views(&online, layout),
            target_views: member_views(&target, layout),
            grad_views: member_views(&grad, layout),
            adam: StackedAdam::new(&picked.iter().map(|(_, _, o)| *o).collect::<Vec<_>>(), &online),
            lrs: picked.iter().map(|(_, _, o)| o.lr).collect(),
            online,
            target,
            grad,
        }
    }

    /// One Adam step of every member from the gradient in `grad`.
    fn adam_step(&mut self) {
        self.adam.step(&self.online, &self.grad, &self.lrs);
    }

    /// The Polyak update of every member's target with its own τ, as `FlatParams::polyak_from`: `lerp_`
    /// (the weight a per-member column), a copy for τ ≥ 1.
    fn polyak(&mut self, taus: &[f64]) {
        tch::no_grad(|| {
            let weight = per_member(taus.iter().copied(), self.online.device()).unsqueeze(1);
            let _ = self.target.lerp_tensor_(&self.online, &weight);
            for (k, _) in taus.iter().enumerate().filter(|(_, tau)| **tau >= 1.0) {
                self.target.get(k as i64).copy_(&self.online.get(k as i64));
            }
        });
    }

    /// Member `k`'s results back into its buffers and optimiser.
    fn scatter(&self, k: usize, online: &FlatParams, target: &FlatParams, opt: &mut Adam) {
        let k = k as i64;
        tch::no_grad(|| {
            online.flat().shallow_clone().copy_(&self.online.get(k));
            target.flat().shallow_clone().copy_(&self.target.get(k));
        });
        self.adam.write_back(k as usize, opt);
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{ObsRef, Space};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::nn::members::rel_diff;
    use crate::policy::{ActMode, ActOutput, Policy};
    use crate::td3::{Counters, DdpgConfig, Td3Config};
    use crate::transition::Transition;

    fn spaces() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::box1d(vec![-1.0, 0.0], vec![2.0, 1.0]))
    }

    /// Members trained together match twins (same seeds, configs and transitions) trained alone: every
    /// phase's metrics within 1e-5, and after the run actors, critics, both targets and both Adam states within
    /// 1e-6 relative, step counts, counters and RNG streams exactly. Returns the largest relative difference
    /// seen (0: bit for bit).
    fn check(build: &dyn Fn(usize) -> Td3) -> f64 {
        const N: usize = 3;
        let n_envs = 2;
        let mut together: Vec<Td3> = (0..N).map(build).collect();
        let mut alone: Vec<Td3> = (0..N).map(build).collect();
        let refs: Vec<&Td3> = together.iter().collect();
        assert_eq!(unbatchable(&refs), None, "the batched path is taken");
        let (od, ad) = (together[0].obs_dim, together[0].act_dim);
        let mut rng = Pcg64::seed_from_u64(11);
        let total = 220u64;
        let mut phases = 0;
        for step in 1..=(total / n_envs as u64) {
            let obs: Vec<f32> = (0..n_envs * od).map(|_| rng.random_range(-1.0..1.0)).collect();
            let next: Vec<f32> = (0..n_envs * od).map(|_| rng.random_range(-1.0..1.0)).collect();
            let done: Vec<bool> = (0..n_envs).map(|_| rng.random_bool(0.1)).collect();
            let truncated: Vec<bool> = (0..n_envs).map(|_| rng.random_bool(0.05)).collect();
            for (m, twin) in together.iter_mut().zip(alone.iter_mut()) {
                let (mut out, mut twin_out) = (ActOutput::default(), ActOutput::default());
                m.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
                twin.act(ObsRef::F32(&obs), ActMode::Explore, &mut twin_out).unwrap();
                let rewards: Vec<f32> = out.actions.chunks(ad).map(|a| -(a[0] - 0.3).powi(2) + 0.1 * a[1]).collect();
                let t = Transition {
                    obs: ObsRef::F32(&obs),
                    act: &out,
                    rewards: &rewards,
                    terminated: &done,
                    truncated: &truncated,
                    next_obs: ObsRef::F32(&next),
                };
                m.observe(&t).unwrap();
                twin.observe(&t).unwrap();
            }
            let progress = Progress { env_steps: step * n_envs as u64, total_env_steps: total };
            let mut refs: Vec<&mut Td3> = together.iter_mut().collect();
            let batched = update_population(&mut refs, &progress).unwrap();
            for (k, (twin, b)) in alone.iter_mut().zip(&batched).enumerate() {
                let single = twin.update(&progress).unwrap();
                assert_eq!(single.is_some(), b.is_some(), "step {step} member {k}: phases fall due together");
                if let (Some(a), Some(s)) = (b, &single) {
                    phases += 1;
                    for &(key, y) in s.iter() {
                        let x = a.get(key).unwrap();
                        let close = (x - y).abs() <= 1e-5 * y.abs().max(1.0) || (x.is_nan() && y.is_nan());
                        assert!(close, "step {step} member {k} {key}: {x} vs {y}");
                    }
                }
            }
        }
        let mut worst = 0.0f64;
        for (k, (a, b)) in together.iter().zip(&alone).enumerate() {
            assert!(a.counters.actor_updates >= 2 * a.config.policy_delay, "member {k}: {:?}", a.counters);
            for (what, x, y) in [
                ("actor", a.actor.flat(), b.actor.flat()),
                ("actor target", a.actor_target.flat(), b.actor_target.flat()),
                ("critics", a.critic.flat(), b.critic.flat()),
                ("critic targets", a.critic_target.flat(), b.critic_target.flat()),
                ("actor Adam m", &a.actor_opt.exp_avg, &b.actor_opt.exp_avg),
                ("actor Adam v", &a.actor_opt.exp_avg_sq, &b.actor_opt.exp_avg_sq),
                ("critic Adam m", &a.critic_opt.exp_avg, &b.critic_opt.exp_avg),
                ("critic Adam v", &a.critic_opt.exp_avg_sq, &b.critic_opt.exp_avg_sq),
            ] {
                let d = rel_diff(x, y);
                assert!(d <= 1e-6, "{} member {k}: {what} differ by {d:e} (relative)", a.name());
                worst = worst.max(d);
            }
            // A phase moved everything (so the comparison above can fail): the targets left their start.
            let start = build(k);
            assert!(
                rel_diff(a.actor_target.flat(), start.actor_target.flat()) > 1e-3,
                "member {k}: actor target moved"
            );
            assert!(
                rel_diff(a.critic_target.flat(), start.critic_target.flat()) > 1e-3,
                "member {k}: critic target moved"
            );
            assert_eq!((a.actor_opt.steps, a.critic_opt.steps), (b.actor_opt.steps, b.critic_opt.steps));
            // The step counters exactly; the last actor loss is a float of another kernel (batched vs alone),
            // within the 1e-5 relative the phases' metrics are held to above.
            let loss = |c: &Counters| c.last_actor_loss;
            let (ca, cb) = (
                Counters { last_actor_loss: None, ..a.counters.clone() },
                Counters { last_actor_loss: None, ..b.counters.clone() },
            );
            assert_eq!(ca, cb, "member {k}");
            match (loss(&a.counters), loss(&b.counters)) {
                (Some(x), Some(y)) => {
                    assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "member {k}: last actor loss {x} vs {y}")
                }
                (x, y) => assert_eq!(x.is_some(), y.is_some(), "member {k}: last actor loss {x:?} vs {y:?}"),
            }
            assert_eq!(a.rng, b.rng, "member {k}: minibatches and target noise drew the same numbers");
        }
        assert!(phases >= 10 * N, "{phases} training phases");
        worst
    }

    fn small_td3(k: usize) -> Td3Config {
        Td3Config {
            learning_rate: [1e-3, 3e-3, 5e-4][k],
            tau: [0.05, 0.1, 0.02][k],
            gamma: [0.9, 0.99, 0.95][k],
            noise_std: [0.1, 0.3, 0.2][k],
            target_policy_noise: [0.2, 0.1, 0.3][k],
            adam_eps: [1e-8, 1e-6, 1e-7][k],
            batch_size: 16,
            buffer_size: 500,
            learning_starts: 40,
            train_freq: 4,
            gradient_steps: 3,
            hidden_sizes: vec![16, 16],
            fused_cpu: false,
            ..Td3Config::default()
        }
    }

    fn small_ddpg(k: usize) -> DdpgConfig {
        let t = small_td3(k);
        DdpgConfig {
            learning_rate: t.learning_rate,
            tau: t.tau,
            gamma: t.gamma,
            noise_std: t.noise_std,
            batch_size: t.batch_size,
            buffer_size: t.buffer_size,
            learning_starts: t.learning_starts,
            train_freq: t.train_freq,
            gradient_steps: t.gradient_steps,
            hidden_sizes: t.hidden_sizes,
            fused_cpu: false,
            ..DdpgConfig::default()
        }
    }

    #[test]
    fn td3_members_match_their_runs_alone() {
        let (o, a) = spaces();
        let worst = check(&|k| Td3::td3(&o, &a, 2, small_td3(k), Device::Cpu, 30 + k as u64).unwrap());
        eprintln!("td3 population: largest relative difference {worst:e}");
    }

    #[test]
    fn ddpg_members_match_their_runs_alone() {
        let (o, a) = spaces();
        let worst = check(&|k| Td3::ddpg(&o, &a, 2, small_ddpg(k), Device::Cpu, 50 + k as u64).unwrap());
        eprintln!("ddpg population: largest relative difference {worst:e}");
    }

    #[test]
    fn members_that_cannot_batch_are_named() {
        let (o, a) = spaces();
        let td3 = |c: Td3Config| Td3::td3(&o, &a, 1, c, Device::Cpu, 1).unwrap();
        let x = td3(small_td3(0));
        assert!(unbatchable(&[&x, &td3(small_td3(1))]).is_none(), "per-member hyperparameters batch");
        let fused = td3(Td3Config { fused_cpu: true, ..small_td3(0) });
        assert!(unbatchable(&[&fused, &fused]).unwrap().contains("fused"));
        for other in [
            Td3Config { policy_delay: 3, ..small_td3(0) },
            Td3Config { train_freq: 2, ..small_td3(0) },
            Td3Config { gradient_steps: 1, ..small_td3(0) },
            Td3Config { learning_starts: 10, ..small_td3(0) },
            Td3Config { batch_size: 8, ..small_td3(0) },
        ] {
            assert!(unbatchable(&[&x, &td3(other.clone())]).unwrap().contains("schedules"), "{other:?}");
        }
        let ddpg = Td3::ddpg(&o, &a, 1, small_ddpg(0), Device::Cpu, 1).unwrap();
        assert!(unbatchable(&[&x, &ddpg]).unwrap().contains("schedules"), "DDPG and TD3 do not batch together");
        let wider = td3(Td3Config { hidden_sizes: vec![16, 8], ..small_td3(0) });
        assert!(unbatchable(&[&x, &wider]).unwrap().contains("networks"));
    }
}
