//! A2C for a population: many members' updates as one batched program.
//!
//! Each member stays a whole [`A2c`] (its network, optimiser state, RNG and rollout; it acts and collects exactly
//! as it would alone). When every member's rollout is complete, [`update_population`] gathers the members'
//! parameter buffers into one `[N, P]` leaf and their optimiser state (RMSprop's running mean of squared
//! gradients, or Adam's moments) into `[N, P]` tensors, and takes A2C's one gradient step for all at once: the
//! `2N` policy and value MLPs as one chain of batched matmuls over each member's whole rollout, each member's
//! loss `−mean(Â · ln π) − ent_coef · mean(H) + vf_coef · mean((R − V)²)` (as [`crate::a2c::a2c_loss`]), one
//! backward pass of the members' summed losses (so each member's gradient is its own), each member's gradient
//! norm clipped to its own limit, and one optimiser step — RMSprop (A2C's default) or Adam — with per-member
//! learning rates (annealed as each member's [`A2cConfig::learning_rate_at`](crate::a2c::A2cConfig)), ε and,
//! for RMSprop, α. The results go back into the members. Per-member coefficients (learning rate, entropy and
//! value coefficients, gradient limit, optimiser ε and α — what a sweep or PBT may change) are tensors on the
//! member axis; shapes, the optimiser kind and schedules are shared.
//!
//! Elementwise maths is the single-member libtorch update's, operation for operation; only reductions (matmuls,
//! means, the gradient norm) may add in another order, so a member matches its update alone to float rounding
//! (tests: within 1e-6 relative after 6 updates, ~1e-7 seen with libtorch's multi-threaded reductions, so not
//! bit-identical in general; `cli/tests/population.rs`, on one torch thread, came out bit-identical after 50
//! updates). The shared machinery (stacked networks and rollouts, per-member clipping, the Adam step) is
//! [`crate::ppo::population`]'s.
use tch::{Kind, Tensor};

use crate::a2c::{A2c, Optimizer};
use crate::actor_critic::ActorCritic;
use crate::data::rollout::Rollout;
use crate::nn::adam::Adam;
use crate::ppo::population::{
    MemberNet, StackedActorCritic, StackedAdam, StackedRollouts, actor_critics_unbatchable, clip_per_member, host,
    normalize_rows, per_member,
};
use crate::{Error, Metrics, Result};

/// Why these members cannot share one batched update (`None`: they can). Members that cannot are updated one
/// by one with [`A2c::update_from`], which gives the same results, only slower.
pub fn unbatchable(members: &[&A2c]) -> Option<String> {
    let first = members.first()?;
    let c0 = &first.config;
    let nets: Vec<MemberNet> = members
        .iter()
        .map(|m| MemberNet {
            net: &m.pi.net,
            fused_cpu: m.config.fused_cpu,
            parallel: &m.parallel,
            steps: m.opt.steps(),
        })
        .collect();
    if let Some(why) = actor_critics_unbatchable(&nets) {
        return Some(why);
    }
    for m in members {
        let c = &m.config;
        if c.vtrace.is_some() {
            // V-trace recomputes targets under each member's parameters on the host, one member at a time.
            return Some("V-trace targets (`vtrace`)".into());
        }
        if (c.n_steps, c.normalize_advantage, c.anneal_lr, c.optimizer)
            != (c0.n_steps, c0.normalize_advantage, c0.anneal_lr, c0.optimizer)
        {
            return Some("members' update schedules or optimisers differ".into());
        }
    }
    None
}

/// One A2C update of every member on its finished rollout (GAE computed), batched over the member axis.
/// `progress_remaining` (1 → 0) anneals each member's learning rate as [`A2c::update_from`] does. Returns each
/// member's metrics, as its own update would report them. Members that [`unbatchable`] refuses are updated one
/// by one.
pub fn update_population(
    members: &mut [&mut A2c],
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
    let refs: Vec<&A2c> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().zip(rollouts).map(|(m, r)| m.update_from(r, progress_remaining)).collect();
    }
    let n = rollouts[0].len();
    for (m, r) in members.iter().zip(rollouts) {
        if r.len() != n || n == 0 {
            return Err(Error::BadLength {
                what: "population rollout transitions (equal)".into(),
                got: r.len(),
                expected: n,
            });
        }
        if r.act_dim != m.pi.net.act_dim() {
            return Err(Error::BadLength {
                what: "A2C rollout action size".into(),
                got: r.act_dim,
                expected: m.pi.net.act_dim(),
            });
        }
    }
    let device = members[0].pi.net.device;
    let c0 = members[0].config.clone();
    let lrs: Vec<f64> = members.iter().map(|m| m.config.learning_rate_at(progress_remaining)).collect();
    let vf_coef = per_member(members.iter().map(|m| m.config.vf_coef), device);
    let ent_coef = per_member(members.iter().map(|m| m.config.ent_coef), device);
    let need_entropy = members.iter().any(|m| m.config.ent_coef != 0.0);
    let max_norms: Vec<f64> = members.iter().map(|m| m.config.max_grad_norm).collect();

    // The members' rollouts and parameters, stacked on the member axis.
    let nets: Vec<&ActorCritic> = members.iter().map(|m| &m.pi.net).collect();
    let StackedRollouts { obs, actions, mut advantages, returns, explained, .. } =
        StackedRollouts::new(&nets, rollouts, n, device)?;
    if c0.normalize_advantage {
        advantages = normalize_rows(&advantages);
    }
    let net = StackedActorCritic::new(&nets);

    // Each member's A2C loss over its whole rollout (`a2c_loss`, with per-member coefficients), one backward.
    let (head, values) = net.forward(&obs);
    let (log_prob, entropy) = net.log_prob_entropy(&head, &actions, need_entropy);
    let policy = -(&advantages * &log_prob).mean_dim(1, false, Kind::Float);
    let value = (&returns - &values).square().mean_dim(1, false, Kind::Float);
    let (total, entropy) = StackedActorCritic::total_loss(&policy, &value, entropy, (&vf_coef, &ent_coef));
    net.backward(&total);
    clip_per_member(&net.grad, &max_norms, "a2c")?;

    // One optimiser step for all; then parameters, state and step counts back into the members.
    let p = members[0].pi.net.params.numel();
    let eps: Vec<f64> = members.iter().map(|m| m.config.optimizer_eps).collect();
    match &members[0].opt {
        Optimizer::RmsProp(_) => {
            let means: Vec<Tensor> = members
                .iter()
                .filter_map(|m| match &m.opt {
                    Optimizer::RmsProp(o) => Some(o.square_avg.shallow_clone()),
                    Optimizer::Adam(_) => None,
                })
                .collect();
            // A running mean of another size (made while layers were frozen) starts afresh, as `RmsProp::step`
            // restarts it.
            let (square_avg, steps) = if means.iter().any(|t| t.numel() as i64 != p) {
                (net.grad.zeros_like(), 0)
            } else {
                (Tensor::stack(&means, 0), members[0].opt.steps())
            };
            let alphas: Vec<f64> = members.iter().map(|m| m.config.rmsprop_alpha).collect();
            rmsprop_step(&net.params, &net.grad, &square_avg, &alphas, &lrs, &eps);
            for (k, m) in members.iter_mut().enumerate() {
                net.write_back(k, &m.pi.net.params);
                if let Optimizer::RmsProp(o) = &mut m.opt {
                    o.lr = lrs[k];
                    o.square_avg = square_avg.get(k as i64).copy();
                    o.steps = steps + 1;
                }
            }
        }
        Optimizer::Adam(_) => {
            let opts: Vec<&Adam> = members
                .iter()
                .filter_map(|m| match &m.opt {
                    Optimizer::Adam(o) => Some(o),
                    Optimizer::RmsProp(_) => None,
                })
                .collect();
            // `unbatchable` saw one optimiser kind.
            let mut adam = StackedAdam::new(&opts, &net.params);
            adam.step(&net.params, &net.grad, &lrs);
            for (k, m) in members.iter_mut().enumerate() {
                net.write_back(k, &m.pi.net.params);
                if let Optimizer::Adam(o) = &mut m.opt {
                    o.lr = lrs[k];
                    adam.write_back(k, o);
                }
            }
        }
    }

    let entropy = entropy.unwrap_or_else(|| net.mean_entropy(&head));
    let (policy, value, entropy) = (host(&policy)?, host(&value)?, host(&entropy)?);
    Ok((0..members.len())
        .map(|k| {
            let mut m = Metrics::default();
            m.push("losses/policy_loss", policy[k]);
            m.push("losses/value_loss", value[k]);
            m.push("losses/entropy", entropy[k]);
            m.push("losses/explained_variance", explained[k]);
            m.push("charts/learning_rate", lrs[k]);
            m.push("charts/gradient_steps", 1.0);
            m
        })
        .collect())
}

/// One RMSprop step ([`crate::nn::rmsprop::RmsProp::step`], op for op) of every member's parameters (rows of
/// `params`, `[N, P]`) from its gradient, with per-member decay α, learning rate and ε; `square_avg` (`[N, P]`)
/// is updated in place.
pub(crate) fn rmsprop_step(
    params: &Tensor,
    grad: &Tensor,
    square_avg: &Tensor,
    alphas: &[f64],
    lrs: &[f64],
    eps: &[f64],
) {
    let device = params.device();
    let column = |values: Vec<f64>| per_member(values.into_iter(), device).unsqueeze(1);
    let alpha = column(alphas.to_vec());
    let weight = column(alphas.iter().map(|a| 1.0 - a).collect());
    let step = column(lrs.iter().map(|lr| -lr).collect());
    let eps = column(eps.to_vec());
    tch::no_grad(|| {
        let mut v = square_avg.shallow_clone();
        let _ = v.g_mul_(&alpha).addcmul_(grad, &grad.g_mul(&weight));
        let denom = v.sqrt() + &eps;
        let scaled = grad * &step;
        let mut theta = params.shallow_clone();
        let _ = theta.addcdiv_(&scaled, &denom);
    });
}

#[cfg(test)]
mod tests {
    use flotilla_core::Space;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::a2c::{A2cConfig, OptimizerKind};
    use crate::data::vtrace::VtraceConfig;
    use crate::nn::nets::Activation;
    use crate::ppo::population::tests::{cartpole, rel_diff, twin_rollout};

    /// A member's optimiser state as one flat tensor: RMSprop's running mean, or Adam's two moments.
    fn optimiser_state(a: &A2c) -> Tensor {
        match &a.opt {
            Optimizer::RmsProp(o) => o.square_avg.shallow_clone(),
            Optimizer::Adam(o) => Tensor::cat(&[&o.exp_avg, &o.exp_avg_sq], 0),
        }
    }

    /// Members (seed 100 + k, config k, libtorch path) updated together match twins (same seeds, configs and
    /// rollouts) updated alone with [`A2c::update_from`], after each of 6 updates: parameters and optimiser state
    /// within 1e-6 relative (only reductions may add in another order, so this is not bit-identical: on the
    /// development CPU the worst difference after 6 updates was ~1e-7, printed with `--nocapture`), the same
    /// optimiser step counts, acting RNG streams and metric names, and metric values within 1e-5 (relative above
    /// 1, absolute below).
    fn check_matches_alone(obs_space: Space, act_space: Space, configs: Vec<A2cConfig>, n_envs: usize) {
        let obs_dim = obs_space.flat_dim();
        // The libtorch path on both sides (the fused CPU step is never batched).
        let build = |c: &A2cConfig, k: usize| {
            let c = A2cConfig { fused_cpu: false, ..c.clone() };
            A2c::new(&obs_space, &act_space, n_envs, c, Device::Cpu, 100 + k as u64).unwrap()
        };
        let mut together: Vec<A2c> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        let mut alone: Vec<A2c> = configs.iter().enumerate().map(|(k, c)| build(c, k)).collect();
        assert_eq!(unbatchable(&together.iter().collect::<Vec<_>>()), None, "the batched path is taken");
        let initial: Vec<Tensor> = together.iter().map(|m| m.params().flat().detach().copy()).collect();
        let n_steps = configs[0].n_steps;
        let mut rng = Pcg64::seed_from_u64(7);
        let (mut worst, mut identical) = (0.0f64, true);
        for update in 0..6 {
            let rollouts: Vec<Rollout> = together
                .iter_mut()
                .zip(alone.iter_mut())
                .map(|(m, twin)| twin_rollout(m, twin, &mut rng, n_envs, n_steps, obs_dim))
                .collect();
            let progress = 1.0 - update as f64 / 10.0;
            let mut refs: Vec<&mut A2c> = together.iter_mut().collect();
            let batched = update_population(&mut refs, &rollouts.iter().collect::<Vec<_>>(), progress).unwrap();
            for (k, (m, r)) in alone.iter_mut().zip(&rollouts).enumerate() {
                let single = m.update_from(r, progress).unwrap();
                let keys = |m: &Metrics| m.iter().map(|(k, _)| *k).collect::<Vec<_>>();
                assert_eq!(keys(&batched[k]), keys(&single), "member {k}: metric names");
                for &(key, b) in single.iter() {
                    let a = batched[k].get(key).unwrap();
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "update {update} member {k} {key}: {a} vs {b}");
                }
            }
            for (k, (a, b)) in together.iter().zip(&alone).enumerate() {
                let (pa, pb) = (a.params().flat().detach(), b.params().flat().detach());
                let d = rel_diff(&pa, &pb);
                assert!(d <= 1e-6, "update {update} member {k}: parameters differ by {d:e} (relative)");
                let (sa, sb) = (optimiser_state(a), optimiser_state(b));
                let ds = rel_diff(&sa, &sb);
                assert!(ds <= 1e-6, "update {update} member {k}: optimiser state differs by {ds:e} (relative)");
                assert_eq!((a.opt.steps(), b.opt.steps()), (update + 1, update + 1), "member {k}: optimiser steps");
                assert_eq!(a.pi.rng, b.pi.rng, "member {k}: the acting streams drew the same numbers");
                worst = worst.max(d).max(ds);
                identical &= pa.equal(&pb) && sa.equal(&sb);
            }
        }
        for (k, m) in together.iter().enumerate() {
            let moved = rel_diff(m.params().flat(), &initial[k]);
            assert!(moved > 1e-4, "member {k}: the updates moved the weights ({moved:e})");
        }
        assert!(rel_diff(together[0].params().flat(), together[1].params().flat()) > 1e-2, "seeds differ");
        eprintln!("batched vs alone after 6 updates: worst relative difference {worst:e}, bit-identical {identical}");
    }

    #[test]
    fn rmsprop_discrete_members_match_their_runs_alone() {
        // The zoo's A2C (RMSprop) with swept learning rates, coefficients, α, ε and gradient limits (0.05 clips).
        let configs: Vec<A2cConfig> =
            [(7e-4, 0.0, 0.5, 0.99, 1e-5, 0.5), (2e-3, 0.01, 0.25, 0.9, 1e-4, 1.0), (3e-3, 0.0, 1.0, 0.95, 1e-5, 0.05)]
                .into_iter()
                .map(|(learning_rate, ent_coef, vf_coef, rmsprop_alpha, optimizer_eps, max_grad_norm)| A2cConfig {
                    n_steps: 8,
                    learning_rate,
                    ent_coef,
                    vf_coef,
                    rmsprop_alpha,
                    optimizer_eps,
                    max_grad_norm,
                    ..A2cConfig::default()
                })
                .collect();
        let (o, a) = cartpole();
        check_matches_alone(o, a, configs, 4);
    }

    #[test]
    fn adam_members_with_normalised_advantages_and_entropy_match_their_runs_alone() {
        let configs: Vec<A2cConfig> = [(1e-3, 0.01, 0.5), (3e-4, 0.05, 0.25), (2e-3, 0.001, 1.0)]
            .into_iter()
            .map(|(learning_rate, ent_coef, vf_coef)| A2cConfig {
                n_steps: 8,
                optimizer: OptimizerKind::Adam,
                normalize_advantage: true,
                anneal_lr: true,
                activation: Activation::Relu,
                hidden_sizes: vec![32, 16],
                learning_rate,
                ent_coef,
                vf_coef,
                ..A2cConfig::default()
            })
            .collect();
        let obs = Space::box1d(vec![-1.0; 5], vec![1.0; 5]);
        check_matches_alone(obs, Space::discrete(3), configs, 4);
    }

    #[test]
    fn gaussian_members_match_their_runs_alone() {
        // One member without an entropy bonus among two with: its loss leaves entropy out, as alone.
        let configs: Vec<A2cConfig> = [(7e-4, 0.0, 0.0), (2e-3, 0.01, -0.5), (1e-3, 0.001, 0.3)]
            .into_iter()
            .map(|(learning_rate, ent_coef, log_std_init)| A2cConfig {
                n_steps: 5,
                learning_rate,
                ent_coef,
                log_std_init,
                ..A2cConfig::default()
            })
            .collect();
        let obs = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let act = Space::box1d(vec![-2.0; 2], vec![2.0; 2]);
        check_matches_alone(obs, act, configs, 4);
    }

    #[test]
    fn members_that_cannot_batch_are_named_and_update_alone() {
        let (o, a) = cartpole();
        let torch = A2cConfig { n_steps: 8, fused_cpu: false, ..A2cConfig::default() };
        let make = |c: &A2cConfig, seed| A2c::new(&o, &a, 4, c.clone(), Device::Cpu, seed).unwrap();
        let (x, y) = (make(&torch, 1), make(&torch, 2));
        assert_eq!(unbatchable(&[&x, &y]), None);
        let vtrace = make(&A2cConfig { vtrace: Some(VtraceConfig::default()), ..torch.clone() }, 3);
        assert!(unbatchable(&[&x, &vtrace]).unwrap().contains("V-trace"));
        let adam = make(&A2cConfig { optimizer: OptimizerKind::Adam, ..torch.clone() }, 3);
        assert!(unbatchable(&[&x, &adam]).unwrap().contains("optimisers differ"));
        // The CPU default: members take the fused step in turn, each exactly as its update alone.
        let fused = A2cConfig { fused_cpu: true, ..torch };
        let mut together = [make(&fused, 1), make(&fused, 2)];
        let mut alone = [make(&fused, 1), make(&fused, 2)];
        assert!(unbatchable(&[&together[0], &together[1]]).unwrap().contains("fused"));
        let mut rng = Pcg64::seed_from_u64(3);
        for _ in 0..2 {
            let rollouts: Vec<Rollout> = together
                .iter_mut()
                .zip(alone.iter_mut())
                .map(|(m, twin)| twin_rollout(m, twin, &mut rng, 4, 8, 4))
                .collect();
            let mut refs: Vec<&mut A2c> = together.iter_mut().collect();
            update_population(&mut refs, &rollouts.iter().collect::<Vec<_>>(), 1.0).unwrap();
            for (m, r) in alone.iter_mut().zip(&rollouts) {
                m.update_from(r, 1.0).unwrap();
            }
        }
        for (a, b) in together.iter().zip(&alone) {
            assert!(a.params().flat().equal(b.params().flat()), "bit for bit as alone");
            assert!(optimiser_state(a).equal(&optimiser_state(b)));
        }
    }
}
