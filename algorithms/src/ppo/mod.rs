//! Proximal Policy Optimization (Schulman et al. 2017, "Proximal Policy Optimization Algorithms").
//!
//! Implementation details that matter (Huang et al. 2022, "The 37 Implementation Details of PPO"; SB3):
//! * separate policy and value MLPs (64-64 tanh), orthogonal init (√2 hidden, 0.01 policy head, 1 value head);
//! * GAE advantages with truncation bootstrapped from the true final observation ([`crate::data::gae`]);
//! * advantages normalised per minibatch; clipped surrogate objective; value loss optionally clipped around
//!   the old values; entropy bonus; global gradient-norm clipping; Adam with ε = 1e-5;
//! * learning rate and clip range annealed linearly to 0 over training (`progress_remaining` from the caller);
//! * a state-independent log-std for Gaussian policies; continuous actions are stored unclipped and clipped
//!   to the action bounds only when sent to the env;
//! * optional V-trace correction (`vtrace`, `[algorithm.vtrace]` in TOML) for rollouts that actors collected
//!   with parameters a few versions old, as IMPALA (Espeholt et al. 2018) and APPO: before the update the
//!   current parameters (no gradient) recompute `ln π(a|x)` of the stored actions, `V(x_t)` and `V(x_{t+1})`
//!   (from the kept final and bootstrap observations), and the advantages and value targets become V-trace's
//!   `ρ^pg (r + γ v_{t+1} − V(x_t))` and `v_t` ([`crate::data::vtrace`]; `gae_lambda` is then unused). The ratio
//!   stays `π_θ / μ` against the behaviour log-probs, and value clipping is around the recomputed values.
//!
//! Defaults follow RL Zoo's tuned CartPole-v1 PPO (with `[env] num_envs = 8`): `n_steps` 32, batch 256,
//! 20 epochs, γ 0.98, λ 0.8, lr 1e-3 and clip 0.2 both linearly annealed, no entropy bonus.
//!
//! Metrics: `losses/policy_loss`, `losses/value_loss`, `losses/entropy`, `losses/approx_kl`,
//! `losses/clip_fraction`, `losses/explained_variance`, `charts/learning_rate`, `charts/clip_range`,
//! `charts/gradient_steps`; with V-trace also `losses/vtrace_mean_rho` (mean `min(ρ̄, π/μ)`),
//! `losses/vtrace_mean_ratio` (mean `π/μ`), `losses/vtrace_rho_clip_fraction` (share with `π/μ > ρ̄`) and
//! `losses/vtrace_behaviour_kl` (estimated KL(μ ‖ π)), all before the update.
use serde::{Deserialize, Serialize};

use crate::actor_critic::agent::{OnPolicyAgent, on_policy_kind};
use crate::actor_critic::{ActorCritic, LossCoefficients, Settings, StepLoss};
use crate::data::rollout::Rollout;
use crate::data::vtrace::VtraceConfig;
use crate::error::Checks;
use crate::kind::KindName;
use crate::nn::data_parallel::DataParallel;
use crate::nn::nets::{Activation, CnnOptions};
use crate::nn::optimiser::{Adam, Optimiser};
use crate::nn::params::FlatParams;
use crate::nn::recurrent::Recurrence;
use crate::{Error, Metrics, Result};

pub use crate::actor_critic::agent::{unbatchable, update_members};

/// PPO hyperparameters. `Default` is RL Zoo's CartPole-v1 PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    /// Steps per env per rollout (the rollout holds `n_steps × num_envs` transitions).
    pub n_steps: usize,
    /// Minibatch size; `n_steps × num_envs` must be a multiple of it.
    pub batch_size: usize,
    /// Passes over each rollout.
    pub n_epochs: usize,
    /// Discount factor γ.
    pub gamma: f64,
    /// GAE λ.
    pub gae_lambda: f64,
    /// Adam learning rate (initial value when annealed).
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over training.
    pub anneal_lr: bool,
    /// Surrogate clipping ε (initial value when annealed).
    pub clip_range: f64,
    /// Anneal the clip range linearly to 0 over training.
    pub anneal_clip_range: bool,
    /// Clip value predictions to `old ± clip_range_vf`; `None` disables value clipping.
    pub clip_range_vf: Option<f64>,
    /// Entropy bonus coefficient.
    pub ent_coef: f64,
    /// Value loss coefficient.
    pub vf_coef: f64,
    /// Global gradient-norm limit.
    pub max_grad_norm: f64,
    /// Normalise advantages per minibatch.
    pub normalize_advantage: bool,
    /// Stop an update's epochs early when the approximate KL exceeds this.
    pub target_kl: Option<f64>,
    /// Hidden layer widths of both the policy and the value MLP.
    pub hidden_sizes: Vec<i64>,
    /// Hidden nonlinearity.
    pub activation: Activation,
    /// Adam ε.
    pub adam_eps: f64,
    /// Initial log standard deviation of Gaussian policies.
    pub log_std_init: f64,
    /// Off-policy correction for rollouts collected with stale parameters: when set (`[algorithm.vtrace]`,
    /// with its truncation thresholds), advantages and value targets are recomputed with V-trace under the
    /// current parameters before each update, and `gae_lambda` is unused. `None` is plain PPO.
    pub vtrace: Option<VtraceConfig>,
    /// How the Nature CNN computes for image observations (`[algorithm.cnn]`: channels-last, bf16).
    pub cnn: CnnOptions,
    /// `[[tasks]]` runs: one policy head and one value per task on the shared MLP torso, each observation
    /// reading its task's (else one head for all tasks, told apart by the one-hot input alone).
    pub task_heads: bool,
    /// The run's task count, set from `[[tasks]]` when the experiment config is parsed (not a setting).
    #[serde(skip)]
    pub tasks: usize,
    /// Run each minibatch step of an MLP on the CPU as one fused step without libtorch
    /// (`crate::nn::host_train`: hand-written forward/backward over `sgemm`, host Adam), several times faster for
    /// small networks. Same maths, same results to float rounding. Used only where it applies (CPU, MLP, one
    /// head, no data-parallel replicas or accumulation, nothing frozen); `false` runs every step on libtorch.
    pub fused_cpu: bool,
    /// A recurrent core (`"lstm"` or `"gru"`) between the observations and the policy and value MLPs, for
    /// tasks whose observations do not hold the whole state; `"none"` (the default) is feed-forward. Actors
    /// keep each env's state and send it with every chunk; the learner re-runs whole env sequences from it
    /// (truncated BPTT over the rollout, states zeroed where episodes start). Minibatches are whole env
    /// sequences: `batch_size` must be a multiple of `n_steps`.
    pub recurrent: Recurrence,
    /// Hidden units of the recurrent core.
    pub recurrent_hidden: i64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            n_steps: 32,
            batch_size: 256,
            n_epochs: 20,
            gamma: 0.98,
            gae_lambda: 0.8,
            learning_rate: 1e-3,
            anneal_lr: true,
            clip_range: 0.2,
            anneal_clip_range: true,
            clip_range_vf: None,
            ent_coef: 0.0,
            vf_coef: 0.5,
            max_grad_norm: 0.5,
            normalize_advantage: true,
            target_kl: None,
            hidden_sizes: vec![64, 64],
            activation: Activation::Tanh,
            adam_eps: 1e-5,
            log_std_init: 0.0,
            vtrace: None,
            cnn: CnnOptions::default(),
            task_heads: false,
            tasks: 0,
            fused_cpu: true,
            recurrent: Recurrence::None,
            recurrent_hidden: 64,
        }
    }
}

impl PpoConfig {
    /// Check ranges that serde cannot; `num_envs` is the number of envs feeding each rollout.
    pub fn validate(&self, num_envs: usize) -> Result<()> {
        let rollout = self.n_steps * num_envs;
        let whole_sequences = !self.recurrent.is_some() || self.batch_size.is_multiple_of(self.n_steps.max(1));
        self.shared_checks(Checks::of("ppo"))
            .that(
                self.batch_size > 0 && rollout.is_multiple_of(self.batch_size),
                "batch_size",
                self.batch_size,
                &format!("must divide n_steps × num_envs = {rollout}"),
            )
            .that(
                whole_sequences,
                "batch_size",
                self.batch_size,
                &format!(
                    "with `recurrent`, minibatches are whole env sequences: a multiple of n_steps = {}",
                    self.n_steps
                ),
            )
            .at_least_one("n_epochs", self.n_epochs)
            .positive("clip_range", self.clip_range)
            .set(self.clip_range_vf, |c, x| c.positive("clip_range_vf", x))
            .set(self.target_kl, |c, x| c.positive("target_kl", x))
            .positive("adam_eps", self.adam_eps)
            .done()
    }
}

on_policy_kind! {
    impl OnPolicyKind for PpoConfig {
        const NAME: &'static str = "ppo";
        const RNG_SALT: u64 = 0x5050_4f00;

        fn optimiser(&self, params: &FlatParams) -> Optimiser {
            Adam::new(params, self.learning_rate, self.adam_eps)
        }

        fn settings(&self, _n: usize, progress_remaining: f64) -> Settings {
            let progress = progress_remaining.clamp(0.0, 1.0);
            let anneal = |on: bool, x: f64| if on { x * progress } else { x };
            Settings {
                lr: anneal(self.anneal_lr, self.learning_rate),
                coefficients: LossCoefficients {
                    clip_range: Some(anneal(self.anneal_clip_range, self.clip_range)),
                    clip_range_vf: self.clip_range_vf,
                    ent_coef: self.ent_coef,
                    vf_coef: self.vf_coef,
                },
                n_epochs: self.n_epochs,
                batch_size: self.batch_size,
                normalize_advantage: self.normalize_advantage,
                target_kl: self.target_kl,
                max_grad_norm: self.max_grad_norm,
                shuffle: true,
                algorithm: "ppo",
            }
        }

        fn check_rollout(&self, _: &ActorCritic, rollout: &Rollout, population: Option<usize>) -> Result<()> {
            let n = population.unwrap_or(rollout.len());
            if rollout.len() != n || n == 0 || !n.is_multiple_of(self.batch_size) {
                let what = match population {
                    Some(_) => "rollout transitions (equal for every member, a multiple of batch_size)",
                    None => "rollout transitions (a multiple of batch_size)",
                };
                return Err(Error::length(what, rollout.len(), self.batch_size));
            }
            Ok(())
        }

        fn unbatchable(&self, first: &Self) -> Option<&'static str> {
            if self.vtrace.is_some() || self.target_kl.is_some() {
                return Some("V-trace or a KL early stop");
            }
            let schedule = |c: &Self| {
                let annealed = (c.anneal_lr, c.anneal_clip_range, c.clip_range_vf.is_some());
                (c.n_epochs, c.batch_size, c.normalize_advantage, annealed)
            };
            (schedule(self) != schedule(first)).then_some("members' update schedules differ")
        }

        fn metrics(&self, s: &Settings, loss: &StepLoss, explained: f64, vtrace: &Metrics, steps: usize) -> Metrics {
            let mut m = Metrics::default();
            m.push("losses/policy_loss", loss.policy);
            m.push("losses/value_loss", loss.value);
            m.push("losses/entropy", loss.entropy);
            m.push("losses/approx_kl", loss.approx_kl);
            m.push("losses/clip_fraction", loss.clip_fraction);
            m.push("losses/explained_variance", explained);
            m.push("charts/learning_rate", s.lr);
            m.push("charts/clip_range", s.coefficients.clip_range.expect("PPO clips"));
            m.push("charts/gradient_steps", steps as f64);
            m.0.extend(vtrace.iter().copied());
            m
        }

        fn check_replicas(agent: &Ppo, parallel: &DataParallel) -> Result<()> {
            parallel.check_batch("ppo", "batch_size", agent.config.batch_size)
        }
    }
}

/// A PPO agent: the actor-critic network, its Adam optimiser and the RNG used to act and shuffle.
pub type Ppo = OnPolicyAgent<PpoConfig>;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::actor_critic::actor_critic_loss;
    use crate::algorithm::Algorithm;
    use crate::data::rollout::Rollout;
    use crate::data::rollout::RolloutCollector;
    use crate::data::vtrace::VtraceConfig;
    use crate::nn::members::Coef;
    use crate::nn::params::assert_params_close;
    use crate::policy::{ActMode, ActOutput, Policy};
    use flotilla_core::Chunk;
    use flotilla_core::ObsRef;
    use flotilla_core::Space;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::{Device, Kind, Tensor};

    /// One member's [`LossCoefficients`] as the libtorch loss takes them.
    fn coefficients(c: LossCoefficients) -> LossCoefficients<Coef> {
        LossCoefficients {
            clip_range: c.clip_range.map(Coef::One),
            clip_range_vf: c.clip_range_vf.map(Coef::One),
            ent_coef: Coef::One(c.ent_coef),
            vf_coef: Coef::One(c.vf_coef),
        }
    }

    /// The PPO loss in the paper's notation, sample by sample, in f64.
    #[allow(clippy::too_many_arguments)]
    fn reference_loss(
        lp: &[f64],
        old: &[f64],
        adv: &[f64],
        v: &[f64],
        old_v: &[f64],
        ret: &[f64],
        c: LossCoefficients,
        normalize_advantage: bool,
    ) -> (f64, f64) {
        let n = adv.len() as f64;
        let mean = adv.iter().sum::<f64>() / n;
        let std = (adv.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let mut l_clip = 0.0;
        let mut l_vf = 0.0;
        for i in 0..adv.len() {
            let a = if normalize_advantage { (adv[i] - mean) / (std + 1e-8) } else { adv[i] };
            let r = (lp[i] - old[i]).exp();
            let eps = c.clip_range.unwrap();
            l_clip += (r * a).min(r.clamp(1.0 - eps, 1.0 + eps) * a);
            l_vf += match c.clip_range_vf {
                None => (ret[i] - v[i]).powi(2),
                Some(e) => (ret[i] - v[i]).powi(2).max((ret[i] - (old_v[i] + (v[i] - old_v[i]).clamp(-e, e))).powi(2)),
            };
        }
        (-l_clip / n, l_vf / n)
    }

    #[test]
    fn loss_matches_reference() {
        let mut rng = Pcg64::seed_from_u64(3);
        let n = 64;
        let mut draw = |lo: f64, hi: f64| (0..n).map(|_| rng.random_range(lo..hi)).collect::<Vec<f64>>();
        let old = draw(-2.0, -0.1);
        let lp: Vec<f64> = old.iter().zip(draw(-0.5, 0.5)).map(|(o, d)| o + d).collect();
        let (adv, v, old_v, ret, ent) =
            (draw(-3.0, 3.0), draw(-1.0, 1.0), draw(-1.0, 1.0), draw(-2.0, 2.0), draw(0.0, 0.7));
        let t = |x: &[f64]| Tensor::from_slice(x).to_kind(Kind::Float);
        for (normalize, vf_clip) in [(true, None), (false, Some(0.2)), (true, Some(0.05))] {
            let c = LossCoefficients { clip_range: Some(0.2), clip_range_vf: vf_clip, ent_coef: 0.01, vf_coef: 0.5 };
            // Advantages are normalised by the update, per member, before the loss.
            let advantages = match normalize {
                true => crate::nn::members::normalize_rows(&t(&adv).unsqueeze(0)).squeeze_dim(0),
                false => t(&adv),
            };
            let loss = actor_critic_loss(
                &t(&lp),
                &t(&old),
                &advantages,
                Some(&t(&ent)),
                &t(&v),
                &t(&old_v),
                &t(&ret),
                &coefficients(c),
            );
            let (want_pg, want_vf) = reference_loss(&lp, &old, &adv, &v, &old_v, &ret, c, normalize);
            let got = |x: &Tensor| f64::try_from(x).unwrap();
            assert!((got(&loss.policy) - want_pg).abs() < 1e-5, "{} vs {want_pg}", got(&loss.policy));
            assert!((got(&loss.value) - want_vf).abs() < 1e-5, "{} vs {want_vf}", got(&loss.value));
            let ent_mean = ent.iter().sum::<f64>() / n as f64;
            let want_total = want_pg + 0.5 * want_vf - 0.01 * ent_mean;
            assert!((got(&loss.total) - want_total).abs() < 1e-5);
            let frac =
                lp.iter().zip(&old).filter(|(a, b)| ((*a - *b).exp() - 1.0).abs() > 0.2).count() as f64 / n as f64;
            assert!((got(&loss.clip_fraction(&Coef::One(0.2))) - frac).abs() < 1e-6);
            let kl: f64 = lp.iter().zip(&old).map(|(a, b)| (a - b).exp() - 1.0 - (a - b)).sum::<f64>() / n as f64;
            assert!((got(&loss.approx_kl()) - kl).abs() < 1e-6);
        }
    }

    #[test]
    fn clipping_stops_the_gradient_outside_the_trust_region() {
        // Ratio 1.5 with a positive advantage: the clipped branch is active, so d loss / d log_prob = 0.
        let lp = Tensor::from_slice(&[1.5f32.ln()]).set_requires_grad(true);
        let zero = Tensor::from_slice(&[0.0f32]);
        let c =
            coefficients(LossCoefficients { clip_range: Some(0.2), clip_range_vf: None, ent_coef: 0.0, vf_coef: 0.0 });
        let loss = actor_critic_loss(&lp, &zero, &Tensor::from_slice(&[1.0f32]), None, &zero, &zero, &zero, &c);
        loss.total.backward();
        assert_eq!(f64::try_from(lp.grad()).unwrap(), 0.0);
    }

    fn cartpole_spaces() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2))
    }

    #[test]
    fn update_improves_the_surrogate_and_anneals() {
        let (obs_space, act_space) = cartpole_spaces();
        let mut ppo = Ppo::new(&obs_space, &act_space, 8, PpoConfig::default(), Device::Cpu, 0).unwrap();
        // A bandit: action 1 always pays 1, action 0 pays 0; every step ends the episode.
        let mut rng = Pcg64::seed_from_u64(9);
        let mut out = ActOutput::default();
        let prob_of_1 = |ppo: &mut Ppo| {
            let mut o = ActOutput::default();
            ppo.act(ObsRef::F32(&[0.1, 0.2, 0.3, 0.4]), ActMode::Explore, &mut o).unwrap();
            (o.log_probs[0] as f64).exp() * if o.actions[0] == 1.0 { 1.0 } else { -1.0 }
        };
        let before = prob_of_1(&mut ppo).abs();
        assert!((before - 0.5).abs() < 0.05, "near-uniform initial policy: {before}");
        for update in 0..5 {
            let mut rollout = Rollout::new(8, 32, 4, 1);
            for _ in 0..32 {
                let obs: Vec<f32> = (0..32).map(|_| rng.random_range(-1.0..1.0)).collect();
                ppo.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
                let rewards: Vec<f32> = out.actions.clone();
                rollout.push_acted(&obs, &out, &rewards, &[true; 8]);
            }
            rollout.finish(&[0.0; 8], 0.98, 0.8).unwrap();
            let m = ppo.update_from(&rollout, 1.0 - update as f64 / 5.0).unwrap();
            assert!((m.get("charts/learning_rate").unwrap() - 1e-3 * (1.0 - update as f64 / 5.0)).abs() < 1e-12);
        }
        let mut o = ActOutput::default();
        ppo.act(ObsRef::F32(&[0.1, 0.2, 0.3, 0.4]), ActMode::Deterministic, &mut o).unwrap();
        assert_eq!(o.actions, vec![1.0], "the greedy action is the paying one");
        let p1 = if o.actions[0] == 1.0 { (o.log_probs[0] as f64).exp() } else { 0.0 };
        assert!(p1 > 0.7, "P(action 1) = {p1}");
    }

    #[test]
    fn same_seed_same_weights_and_save_load_round_trip() {
        let (obs_space, act_space) = cartpole_spaces();
        let a = Ppo::new(&obs_space, &act_space, 8, PpoConfig::default(), Device::Cpu, 5).unwrap();
        let mut b = Ppo::new(&obs_space, &act_space, 8, PpoConfig::default(), Device::Cpu, 5).unwrap();
        let obs = [0.3f32, -0.2, 0.1, 0.0];
        assert_eq!(a.values(ObsRef::F32(&obs)).unwrap(), b.values(ObsRef::F32(&obs)).unwrap());
        let path = std::env::temp_dir().join(format!("flotilla-ppo-{}.safetensors", std::process::id()));
        a.save_weights(&path).unwrap();
        let mut c = Ppo::new(&obs_space, &act_space, 8, PpoConfig::default(), Device::Cpu, 6).unwrap();
        assert_ne!(a.values(ObsRef::F32(&obs)).unwrap(), c.values(ObsRef::F32(&obs)).unwrap());
        c.load_weights(&path).unwrap();
        assert_eq!(a.values(ObsRef::F32(&obs)).unwrap(), c.values(ObsRef::F32(&obs)).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(b.values(ObsRef::F32(&[1.0, 2.0, 3.0])).is_err(), "wrong observation length is an error");
        let mut out = ActOutput::default();
        assert!(b.act(ObsRef::F32(&[]), ActMode::Explore, &mut out).is_err());
    }

    #[test]
    fn gaussian_policy_acts_and_updates() {
        let obs_space = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let act_space = Space::box1d(vec![-2.0], vec![2.0]);
        let config = PpoConfig { batch_size: 64, n_steps: 16, ..Default::default() };
        let mut ppo = Ppo::new(&obs_space, &act_space, 4, config, Device::Cpu, 1).unwrap();
        assert_eq!(ppo.act_dim(), 1);
        let mut out = ActOutput::default();
        let mut rollout = Rollout::new(4, 16, 3, 1);
        for _ in 0..16 {
            let obs = vec![0.5f32; 12];
            ppo.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let rewards: Vec<f32> = out.actions.iter().map(|a| -(a - 1.0).powi(2)).collect();
            rollout.push_acted(&obs, &out, &rewards, &[true; 4]);
        }
        rollout.finish(&[0.0; 4], 0.99, 0.95).unwrap();
        let m = ppo.update_from(&rollout, 1.0).unwrap();
        assert!(m.get("losses/entropy").unwrap().is_finite());
    }

    /// A rollout of `n_envs × n_steps` varied observations, acting with `ppo`, with rewards that depend on
    /// the actions. A recurrent policy acts from each env's state (a few steps in, so the rollout starts from
    /// non-zero states), reset where episodes end.
    pub(crate) fn varied_rollout(
        ppo: &mut dyn Policy,
        n_envs: usize,
        n_steps: usize,
        obs_dim: usize,
        k0: usize,
    ) -> Rollout {
        let mut out = ActOutput::default();
        let mut rollout = Rollout::new(n_envs, n_steps, obs_dim, ppo.act_dim());
        let mut memory = crate::policy::Memory::new(&*ppo, n_envs);
        let obs_at =
            |k: usize| -> Vec<f32> { (0..n_envs * obs_dim).map(|i| ((k * 31 + i) as f32 * 0.37).sin()).collect() };
        if memory.dim() > 0 {
            for k in 0..3 {
                memory.act(ppo, ObsRef::F32(&obs_at(k0 + 1000 + k)), ActMode::Explore, &mut out).unwrap();
            }
        }
        let initial_state = memory.state().to_vec();
        for k in 0..n_steps {
            let obs = obs_at(k0 + k);
            memory.act(ppo, ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let rewards: Vec<f32> =
                (0..n_envs).map(|e| out.actions[e * ppo.act_dim()] * obs[e * obs_dim] + (e as f32) * 0.1).collect();
            let terminated: Vec<bool> = (0..n_envs).map(|e| (k + e) % 9 == 8).collect();
            rollout.push_acted(&obs, &out, &rewards, &terminated);
            memory.end_episodes(&terminated, &vec![false; n_envs]);
        }
        // (Set after the pushes: the first one starts the rollout afresh.)
        rollout.initial_state = if memory.dim() > 0 { initial_state } else { Vec::new() };
        rollout.finish(&vec![0.3; n_envs], 0.99, 0.95).unwrap();
        rollout
    }

    #[test]
    fn fused_cpu_update_matches_libtorch() {
        let discrete = (Space::box1d(vec![-1.0; 5], vec![1.0; 5]), Space::discrete(3));
        let gaussian = (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::box1d(vec![-2.0; 2], vec![2.0; 2]));
        let base = PpoConfig { n_steps: 16, batch_size: 64, n_epochs: 4, ..Default::default() };
        let cases = [
            ("full batch", &discrete, PpoConfig { ..base.clone() }),
            (
                "minibatches, entropy, value clipping, relu",
                &discrete,
                PpoConfig {
                    batch_size: 16,
                    ent_coef: 0.01,
                    clip_range_vf: Some(0.2),
                    activation: Activation::Relu,
                    hidden_sizes: vec![32, 16],
                    ..base.clone()
                },
            ),
            ("gaussian", &gaussian, PpoConfig { batch_size: 32, ent_coef: 0.02, ..base.clone() }),
            ("kl stop", &discrete, PpoConfig { target_kl: Some(0.001), learning_rate: 3e-2, ..base.clone() }),
            (
                "lstm, minibatches of env sequences, entropy, value clipping",
                &discrete,
                PpoConfig {
                    recurrent: Recurrence::Lstm,
                    recurrent_hidden: 8,
                    hidden_sizes: vec![16],
                    batch_size: 32,
                    ent_coef: 0.01,
                    clip_range_vf: Some(0.2),
                    ..base.clone()
                },
            ),
            (
                "lstm, gaussian, full batch",
                &gaussian,
                PpoConfig { recurrent: Recurrence::Lstm, recurrent_hidden: 6, ent_coef: 0.02, ..base.clone() },
            ),
        ];
        for (what, (obs_space, act_space), config) in cases {
            let obs_dim = obs_space.flat_dim();
            let make = |fused_cpu| {
                Ppo::new(obs_space, act_space, 4, PpoConfig { fused_cpu, ..config.clone() }, Device::Cpu, 7).unwrap()
            };
            let (mut fused, mut torch) = (make(true), make(false));
            // A third agent acts, so the learners' RNG streams (minibatch shuffles) stay in step.
            let mut actor = make(true);
            for u in 0..3 {
                let rollout = varied_rollout(&mut actor, 4, 16, obs_dim, u * 16);
                let progress = 1.0 - u as f64 / 4.0;
                let mf = fused.update_from(&rollout, progress).unwrap();
                let mt = torch.update_from(&rollout, progress).unwrap();
                assert!(fused.host.is_some() && torch.host.is_none(), "{what}: paths");
                for key in ["losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"] {
                    let (a, b) = (mf.get(key).unwrap(), mt.get(key).unwrap());
                    assert!((a - b).abs() <= 1e-4 * b.abs().max(1e-2), "{what}, update {u}: {key} {a} vs {b}");
                }
                assert_eq!(mf.get("charts/gradient_steps"), mt.get("charts/gradient_steps"), "{what}");
                assert_eq!(mf.get("losses/clip_fraction"), mt.get("losses/clip_fraction"), "{what}");
                let a = assert_params_close(&format!("{what}, update {u}"), fused.params(), torch.params(), 1e-5);
                let init: Vec<f32> = Vec::try_from(make(true).params().flat().detach()).unwrap();
                assert_ne!(a, init, "{what}: weights moved");
                // Both paths leave the optimiser in step.
                assert_eq!(fused.opt.steps(), torch.opt.steps());
            }
        }
    }

    #[test]
    fn a_non_finite_loss_is_an_error_and_no_step_is_taken() {
        let (obs_space, act_space) = cartpole_spaces();
        let config = PpoConfig { batch_size: 64, ..Default::default() };
        let mut ppo = Ppo::new(&obs_space, &act_space, 2, config, Device::Cpu, 0).unwrap();
        let mut rollout = collect_cut_rollout(&mut ppo, 32);
        rollout.advantages[3] = f32::NAN; // what a NaN reward or value would leave behind
        let before = ppo.params().flat().detach().copy();
        let e = ppo.update_from(&rollout, 1.0).unwrap_err();
        assert!(matches!(e, Error::NonFinite(_)), "{e}");
        assert!(ppo.params().flat().equal(&before), "the parameters changed");
    }

    #[test]
    fn config_validation_names_the_field() {
        let c = PpoConfig { batch_size: 100, ..Default::default() };
        let e = c.validate(8).unwrap_err().to_string();
        assert!(e.contains("batch_size") && e.contains("256"), "{e}");
        assert!(PpoConfig::default().validate(8).is_ok());
    }

    /// A rollout of `n_steps × 2` steps that `ppo` collected itself through a [`RolloutCollector`], on a
    /// synthetic task where env 0 terminates every 7 steps and env 1 is truncated every 5 and at the last step;
    /// finished with GAE λ = 1 under `ppo`'s current values.
    fn collect_cut_rollout(ppo: &mut Ppo, n_steps: usize) -> Rollout {
        let mut collector = RolloutCollector::new(2, n_steps, 4, 1);
        let obs_at = |k: usize| (0..8).map(|i| ((k * 8 + i) as f32 * 0.37).sin()).collect::<Vec<f32>>();
        let mut out = ActOutput::default();
        for k in 0..n_steps {
            let obs = obs_at(k);
            ppo.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let rewards: Vec<f32> = (0..2).map(|e| out.actions[e] - obs[4 * e]).collect();
            let terminated = [k % 7 == 6, false];
            let truncated = [false, k % 5 == 4 || k + 1 == n_steps];
            // The observation that truly followed: the next one inside an episode, a final one at its end.
            let mut next_obs = obs_at(k + 1);
            for e in (0..2).filter(|&e| terminated[e] || truncated[e]) {
                for (j, x) in next_obs[4 * e..4 * e + 4].iter_mut().enumerate() {
                    *x = ((k * 8 + j) as f32 * 0.53).cos();
                }
            }
            let step = Chunk::from_step(
                ObsRef::F32(&obs),
                &out.actions,
                &out.log_probs,
                &out.values,
                &rewards,
                &terminated,
                &truncated,
                ObsRef::F32(&next_obs),
            );
            collector.push_chunks(std::slice::from_ref(&step), |o: ObsRef<'_>| ppo.values(o)).unwrap();
        }
        collector.finish(|o: ObsRef<'_>| ppo.values(o), ppo.config.gamma as f32, 1.0).unwrap().expect("a full rollout")
    }

    fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what} at {i}: {g} vs {w}");
        }
    }

    fn vtrace_ppo(vtrace: VtraceConfig, seed: u64) -> Ppo {
        let (obs_space, act_space) = cartpole_spaces();
        let config = PpoConfig { n_steps: 16, batch_size: 32, n_epochs: 2, vtrace: Some(vtrace), ..Default::default() };
        Ppo::new(&obs_space, &act_space, 2, config, Device::Cpu, seed).unwrap()
    }

    #[test]
    fn vtrace_on_policy_targets_are_gae_lambda_one_under_current_values() {
        let cfg = VtraceConfig::default();
        let mut ppo = vtrace_ppo(cfg.clone(), 3);
        let gamma = ppo.config.gamma as f32;
        let mut rollout = collect_cut_rollout(&mut ppo, 16);
        assert!(rollout.terminated.iter().any(|&x| x) && rollout.truncated[rollout.len() - 1]);
        let (want_advantages, want_returns) = (rollout.advantages.clone(), rollout.returns.clone());
        // A stale critic's values are not read: V-trace recomputes V(x_t) and V(x_{t+1}) with the current one.
        for v in rollout.values.iter_mut().chain(&mut rollout.next_values) {
            *v += 0.5;
        }
        let t = ppo.pi.net.targets(&rollout, None, gamma, Some(&cfg)).unwrap().vtrace.unwrap();
        assert_close(&t.vs, &want_returns, 1e-5, "v_s vs GAE(λ = 1) returns");
        assert_close(&t.pg_advantages, &want_advantages, 1e-5, "pg advantages vs GAE(λ = 1) advantages");
        assert_close(&t.target_log_probs, &rollout.log_probs, 1e-5, "π vs μ on-policy");
        assert!((t.weights.mean_rho - 1.0).abs() < 1e-5 && t.weights.behaviour_kl.abs() < 1e-6, "{:?}", t.weights);
        let m = ppo.update_from(&rollout, 1.0).unwrap();
        assert!((m.get("losses/vtrace_mean_rho").unwrap() - 1.0).abs() < 1e-5);
        assert_eq!(m.get("losses/vtrace_rho_clip_fraction"), Some(0.0), "rounding is not clipping");
        assert!(m.get("losses/explained_variance").unwrap().is_finite());
    }

    #[test]
    fn vtrace_clips_the_weights_of_a_lagging_behaviour_policy() {
        let cfg = VtraceConfig { clip_rho_threshold: 2.0, clip_c_threshold: 1.0, clip_pg_rho_threshold: 1.5 };
        let mut ppo = vtrace_ppo(cfg.clone(), 4);
        let gamma = ppo.config.gamma as f32;
        let mut rollout = collect_cut_rollout(&mut ppo, 16);
        let on_policy = ppo.pi.net.targets(&rollout, None, gamma, Some(&cfg)).unwrap().vtrace.unwrap();
        // π/μ = 4 at even steps (μ made the action less likely than π does), 0.5 at odd ones.
        let ratio = |i: usize| if (i / 2).is_multiple_of(2) { 4.0f32 } else { 0.5 };
        for (i, lp) in rollout.log_probs.iter_mut().enumerate() {
            *lp -= ratio(i).ln();
        }
        let t = ppo.pi.net.targets(&rollout, None, gamma, Some(&cfg)).unwrap().vtrace.unwrap();
        let w = t.weights;
        assert!((w.mean_rho - (2.0 + 0.5) / 2.0).abs() < 1e-5, "ρ = min(ρ̄, π/μ) = 2 or 0.5: {w:?}");
        assert!((w.mean_ratio - (4.0 + 0.5) / 2.0).abs() < 1e-5 && w.rho_clip_fraction == 0.5, "{w:?}");
        assert!(w.behaviour_kl > 0.1, "{w:?}");
        assert_close(&t.values, &on_policy.values, 0.0, "values do not depend on μ");
        // A terminated step carries nothing back: v_s − V(x_s) = ρ (r − V(x_s)), advantage ρ^pg (r − V(x_s)).
        let terminated: Vec<usize> = (0..rollout.len()).filter(|&i| rollout.terminated[i]).collect();
        assert!(terminated.iter().any(|&i| ratio(i) == 4.0) && terminated.iter().any(|&i| ratio(i) == 0.5));
        for &i in &terminated {
            let td = rollout.rewards[i] - t.values[i];
            assert_close(&[t.vs[i] - t.values[i]], &[ratio(i).min(2.0) * td], 1e-5, "terminated v_s");
            assert_close(&[t.pg_advantages[i]], &[ratio(i).min(1.5) * td], 1e-5, "terminated advantage");
        }
        let moved = t.pg_advantages.iter().zip(&on_policy.pg_advantages).filter(|(a, b)| (*a - *b).abs() > 1e-3);
        assert!(moved.count() > rollout.len() / 2, "the correction changes most advantages");
        let m = ppo.update_from(&rollout, 1.0).unwrap();
        assert!((m.get("losses/vtrace_mean_rho").unwrap() - 1.25).abs() < 1e-5);
        assert_eq!(m.get("losses/vtrace_rho_clip_fraction"), Some(0.5));
        // Without V-trace the same update logs none of it.
        ppo.config.vtrace = None;
        assert!(ppo.update_from(&rollout, 1.0).unwrap().get("losses/vtrace_mean_rho").is_none());
    }

    #[test]
    fn vtrace_config_parses_and_validates() {
        let c: PpoConfig = serde_json::from_str(r#"{"n_steps": 64, "vtrace": {"clip_rho_threshold": 2.0}}"#).unwrap();
        let want = VtraceConfig { clip_rho_threshold: 2.0, ..VtraceConfig::default() };
        assert_eq!((c.n_steps, c.vtrace.clone()), (64, Some(want)));
        assert!(c.validate(8).is_ok());
        let c: PpoConfig = serde_json::from_str(r#"{"vtrace": {}}"#).unwrap();
        assert_eq!(c.vtrace, Some(VtraceConfig::default()), "an empty [algorithm.vtrace] is the paper's");
        assert_eq!(PpoConfig::default().vtrace, None, "off unless asked for");
        let e = serde_json::from_str::<PpoConfig>(r#"{"vtrace": {"rho_bar": 2.0}}"#).unwrap_err().to_string();
        assert!(e.contains("rho_bar"), "{e}");
        let bad = PpoConfig {
            vtrace: Some(VtraceConfig { clip_c_threshold: 0.0, ..VtraceConfig::default() }),
            ..PpoConfig::default()
        };
        let e = bad.validate(8).unwrap_err().to_string();
        assert!(e.contains("vtrace") && e.contains("clip_c_threshold") && e.contains("> 0"), "{e}");
        let (obs_space, act_space) = cartpole_spaces();
        assert!(Ppo::new(&obs_space, &act_space, 8, bad, Device::Cpu, 0).is_err());
    }
}

#[cfg(test)]
mod member_tests {
    use crate::policy::{ActMode, ActOutput, Policy};
    use flotilla_core::{ObsRef, Space};
    use rand::Rng;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;
    use tch::{Device, Tensor};

    use super::*;
    use crate::actor_critic::members::tests::{cartpole, twin_rollout};
    use crate::nn::members::rel_diff;

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
        // Where the members' parameters and Adam moments live after the first batched update: rows of stacks
        // kept from then on (nothing re-stacked, nothing written back).
        let mut homes: Option<Vec<usize>> = None;
        for update in 0..4 {
            let rollouts: Vec<Rollout> = together
                .iter_mut()
                .zip(alone.iter_mut())
                .map(|(m, twin)| twin_rollout(m, twin, &mut rng, n_envs, n_steps, obs_dim))
                .collect();
            let progress = 1.0 - update as f64 / 8.0;
            let mut refs: Vec<&mut Ppo> = together.iter_mut().collect();
            let batched = update_members(&mut refs, &rollouts.iter().collect::<Vec<_>>(), progress).unwrap();
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
                let d = rel_diff(&a.opt.state[1], &b.opt.state[1]);
                assert!(d <= 1e-5, "update {update} member {k}: Adam moments differ by {d:e}");
                assert_eq!(a.opt.steps, b.opt.steps);
                assert_eq!(a.pi.rng, b.pi.rng, "member {k}: the shuffles drew the same numbers");
            }
            let ptr = |t: &Tensor| t.data_ptr() as usize;
            let now: Vec<usize> = together
                .iter()
                .flat_map(|m| [ptr(m.params().flat()), ptr(&m.opt.state[0]), ptr(&m.opt.state[1])])
                .collect();
            let row_bytes = 4 * together[0].params().numel() as usize;
            for (k, at) in now.chunks(3).enumerate() {
                for (j, &p) in at.iter().enumerate() {
                    assert_eq!(p, now[j] + k * row_bytes, "update {update}: member {k}'s buffer {j} is row {k}");
                }
            }
            match &homes {
                None => homes = Some(now),
                Some(h) => assert_eq!(h, &now, "update {update}: the members' buffers moved (were re-stacked)"),
            }
        }
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

    /// A stacked update in which one member's loss is not finite is refused as a whole, naming that member, and
    /// no member's weights, moments or step count move: the non-finite norm is recorded on the device during the
    /// update (no wait for the GPU per gradient step) and checked before anything is written back.
    #[test]
    fn a_non_finite_member_stops_the_stacked_update_and_nothing_is_applied() {
        let (o, a) = cartpole();
        let c = PpoConfig { n_steps: 16, batch_size: 32, n_epochs: 2, fused_cpu: false, ..PpoConfig::default() };
        let mut members: Vec<Ppo> =
            (0..3).map(|k| Ppo::new(&o, &a, 4, c.clone(), Device::Cpu, 10 + k).unwrap()).collect();
        let before: Vec<Tensor> = members.iter().map(|m| m.params().flat().copy()).collect();
        let mut rng = Pcg64::seed_from_u64(3);
        let mut out = ActOutput::default();
        let rollouts: Vec<Rollout> = members
            .iter_mut()
            .enumerate()
            .map(|(k, m)| {
                let mut r = Rollout::new(4, 16, 4, 1);
                for t in 0..16 {
                    let obs: Vec<f32> = (0..16).map(|_| rng.random_range(-1.0..1.0)).collect();
                    m.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
                    let reward = if k == 1 && t == 5 { f32::NAN } else { 1.0 };
                    r.push_acted(&obs, &out, &[reward; 4], &[false; 4]);
                }
                r.finish(&[0.0; 4], 0.99, 0.95).unwrap();
                r
            })
            .collect();
        let mut refs: Vec<&mut Ppo> = members.iter_mut().collect();
        let e = update_members(&mut refs, &rollouts.iter().collect::<Vec<_>>(), 1.0).unwrap_err();
        assert!(matches!(e, Error::NonFinite(_)), "{e}");
        assert!(e.to_string().contains("member 1") && e.to_string().contains("not applied"), "{e}");
        for (k, (m, b)) in members.iter().zip(&before).enumerate() {
            assert!(m.params().flat().equal(b), "member {k}'s weights moved");
            assert_eq!(m.opt.steps, 0, "member {k}'s optimiser stepped");
        }
        // Without the NaN the same members update together.
        let mut refs: Vec<&mut Ppo> = members.iter_mut().collect();
        let fine: Vec<&Rollout> = [&rollouts[0], &rollouts[2], &rollouts[0]].into();
        update_members(&mut refs, &fine, 1.0).unwrap();
        assert!(!members[0].params().flat().equal(&before[0]));
    }

    /// A kept stack of the members' parameters ([`MemberStack`], what a population's batched acting holds
    /// between passes) is reused while no member's parameters changed, and follows every change: a fused CPU
    /// update (host writes libtorch's version counter does not see), a restore (a tensor op), a member
    /// replaced. After each, the batched pass's values are each member's alone.
    #[test]
    fn a_kept_member_stack_is_reused_until_a_members_parameters_change() {
        use crate::actor_critic::ActorCriticPolicy;
        use crate::algorithm::Algorithm;
        use crate::nn::MemberStack;
        let (o, a) = cartpole();
        let c = PpoConfig { n_steps: 8, batch_size: 16, n_epochs: 2, ..PpoConfig::default() };
        let make = |seed| Ppo::new(&o, &a, 2, c.clone(), Device::Cpu, seed).unwrap();
        let mut members: Vec<Ppo> = (1..=3).map(make).collect();
        let mut rng = Pcg64::seed_from_u64(4);
        let obs: Vec<Vec<f32>> = (0..3).map(|_| (0..8).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
        let mut kept = MemberStack::default();
        // The batched pass's values against each member's alone; how many stacks were made by then.
        let mut act = |members: &mut [Ppo], what: &str| {
            let refs: Vec<ObsRef<'_>> = obs.iter().map(|o| ObsRef::F32(o)).collect();
            let mut outs = vec![ActOutput::default(); 3];
            let mut pis: Vec<&mut ActorCriticPolicy> = members.iter_mut().map(|m| &mut m.pi).collect();
            let mut o: Vec<&mut ActOutput> = outs.iter_mut().collect();
            assert!(crate::actor_critic::members::act_stacked(&mut pis, &refs, true, &mut o, &mut kept).unwrap());
            for (k, m) in members.iter_mut().enumerate() {
                let mut want = ActOutput::default();
                m.act(refs[k], ActMode::Deterministic, &mut want).unwrap();
                for (g, w) in outs[k].values.iter().zip(&want.values) {
                    assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}, member {k}: value {g} vs {w} alone");
                }
                assert_eq!(outs[k].actions, want.actions, "{what}, member {k}");
            }
            kept.made
        };
        assert_eq!(act(&mut members, "first pass"), 1);
        assert_eq!(act(&mut members, "second pass"), 1, "nothing changed: the stack is kept");
        // A fused CPU update of member 1 writes its buffer on the host.
        let host_writes = members[1].params().generation().1;
        let mut rollout = |m: &mut Ppo| {
            let mut r = Rollout::new(2, 8, 4, 1);
            let mut out = ActOutput::default();
            for _ in 0..8 {
                let x: Vec<f32> = (0..8).map(|_| rng.random_range(-1.0..1.0)).collect();
                m.act(ObsRef::F32(&x), ActMode::Explore, &mut out).unwrap();
                r.push_acted(&x, &out, &[1.0, -1.0], &[false; 2]);
            }
            r.finish(&[0.0; 2], 0.99, 0.95).unwrap();
            r
        };
        let r = rollout(&mut members[1]);
        update_members(&mut [&mut members[1]], &[&r], 1.0).unwrap();
        assert!(members[1].params().generation().1 > host_writes, "the fused step wrote on the host");
        assert_eq!(act(&mut members, "after member 1's fused update"), 2, "restacked");
        // Member 2 restored from member 0's checkpoint: a tensor op on its buffer.
        let mut saved = members[0].checkpoint().unwrap();
        members[2].restore(&mut saved).unwrap();
        assert_eq!(act(&mut members, "after member 2's restore"), 3, "restacked");
        // Member 0 replaced by another network.
        members[0] = make(9);
        assert_eq!(act(&mut members, "after member 0 was replaced"), 4, "restacked");
        assert_eq!(act(&mut members, "again"), 4, "kept");
        // Batched libtorch updates (members at one optimiser step, on the libtorch path): the first moves the
        // members into rows of one stack, the next steps those rows in place (same addresses: only the version
        // counter says they changed).
        members = (1..=3).map(make).collect();
        members.iter_mut().for_each(|m| m.config.fused_cpu = false);
        assert_eq!(act(&mut members, "fresh members"), 5, "restacked");
        for (update, made) in [(1, 6), (2, 7)] {
            let rs: Vec<Rollout> = members.iter_mut().map(&mut rollout).collect();
            let before = members[0].params().flat().data_ptr();
            update_members(&mut members.iter_mut().collect::<Vec<_>>(), &rs.iter().collect::<Vec<_>>(), 1.0).unwrap();
            let moved = members[0].params().flat().data_ptr() != before;
            assert_eq!(moved, update == 1, "batched update {update}: rows made at the first, kept after");
            assert_eq!(act(&mut members, &format!("after batched update {update}")), made, "restacked");
        }
    }

    /// Members acting in one batched pass ([`crate::actor_critic::members::act_stacked`], what a population on
    /// an accelerator takes) act as each does alone: the same actions from the same RNG streams (discrete;
    /// Gaussian ones to float rounding), log-probs and values to float rounding; and their rollouts, whose
    /// truncated episodes' values wait for the finish, finished with those and the bootstrap values from one
    /// pass ([`Ppo::finish_rollouts`]) — or saved, restored and finished alone — have each member's advantages
    /// alone.
    #[test]
    fn members_acting_in_one_batched_pass_act_and_finish_as_alone() {
        use crate::actor_critic::ActorCriticPolicy;
        use crate::algorithm::Algorithm;
        use crate::policy::{ActMode, ActOutput, Policy};
        use flotilla_core::{Chunk, ObsRef};
        use rand::Rng;
        let assert_close = |got: &[f32], want: &[f32], tol: f32, what: &str| {
            assert_eq!(got.len(), want.len(), "{what}: lengths");
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what} at {i}: {g} vs {w}");
            }
        };
        let pendulum = (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::box1d(vec![-2.0], vec![2.0]));
        for (label, (obs_space, act_space)) in [("discrete", cartpole()), ("gaussian", pendulum)] {
            let obs_dim = obs_space.flat_dim();
            let config = PpoConfig { n_steps: 6, batch_size: 12, n_epochs: 1, ..Default::default() };
            let make = |seed| Ppo::new(&obs_space, &act_space, 2, config.clone(), Device::Cpu, seed).unwrap();
            let (mut batched, mut alone): (Vec<Ppo>, Vec<Ppo>) =
                ((1..=3).map(make).collect(), (1..=3).map(make).collect());
            // As act_members leaves them: truncated episodes' values wait for the finish's one pass.
            batched.iter_mut().for_each(Ppo::defer_final_values);
            let mut rng = Pcg64::seed_from_u64(5);
            let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
            let mut obs: Vec<Vec<f32>> = (0..3).map(|_| draw(2 * obs_dim)).collect();
            let mut kept = crate::nn::MemberStack::default();
            for step in 0..6 {
                let refs: Vec<ObsRef<'_>> = obs.iter().map(|o| ObsRef::F32(o)).collect();
                let mut outs = vec![ActOutput::default(); 3];
                let mut pis: Vec<&mut ActorCriticPolicy> = batched.iter_mut().map(|a| &mut a.pi).collect();
                let mut o: Vec<&mut ActOutput> = outs.iter_mut().collect();
                let acted = crate::actor_critic::members::act_stacked(&mut pis, &refs, false, &mut o, &mut kept);
                assert!(acted.unwrap(), "{label}");
                let next: Vec<Vec<f32>> = (0..3).map(|_| draw(2 * obs_dim)).collect();
                for k in 0..3 {
                    let mut want = ActOutput::default();
                    alone[k].act(refs[k], ActMode::Explore, &mut want).unwrap();
                    let what = format!("{label} step {step} member {k}");
                    assert_close(&outs[k].actions, &want.actions, 1e-5, &format!("{what}: actions"));
                    assert_close(&outs[k].log_probs, &want.log_probs, 1e-5, &format!("{what}: log-probs"));
                    assert_close(&outs[k].values, &want.values, 1e-5, &format!("{what}: values"));
                    let (rewards, terminated, truncated) = ([1.0, -0.5], [step == 2, false], [false, step == 4]);
                    for (agent, out) in [(&mut batched[k], &outs[k]), (&mut alone[k], &want)] {
                        let (actions, log_probs, values) = (&out.actions, &out.log_probs, &out.values);
                        let step = Chunk::from_step(
                            refs[k],
                            actions,
                            log_probs,
                            values,
                            &rewards,
                            &terminated,
                            &truncated,
                            ObsRef::F32(&next[k]),
                        );
                        agent.observe(&[step]).unwrap();
                    }
                }
                obs = next;
            }
            assert!(!batched[0].collector.unvalued_obs().is_empty(), "{label}: a truncation's value waits");
            // A checkpoint keeps what waits: restored and finished alone, the rollout is the run alone's too.
            let mut saved = batched[0].checkpoint().unwrap();
            let mut restored = make(1);
            restored.restore(&mut saved).unwrap();
            let mut members: Vec<&mut Ppo> = batched.iter_mut().collect();
            // `false`: the members' waiting values alone make it one pass.
            let finished = Ppo::finish_rollouts(&mut members, false).unwrap();
            let restored = restored.finish_rollout().unwrap().expect("full");
            for (k, (got, a)) in finished.into_iter().zip(alone.iter_mut()).enumerate() {
                let (got, want) = (got.expect("full"), a.finish_rollout().unwrap().expect("full"));
                let what = format!("{label} member {k}");
                if k == 0 {
                    let (r, w) = (&restored.advantages[..restored.len()], &want.advantages[..want.len()]);
                    assert_close(r, w, 1e-5, &format!("{what}, restored"));
                }
                assert_close(&got.advantages[..got.len()], &want.advantages[..want.len()], 1e-5, &what);
                assert_close(&got.returns[..got.len()], &want.returns[..want.len()], 1e-5, &what);
            }
        }
        // Networks of different layouts do not stack: nothing is done, and each member acts alone.
        let (obs_space, act_space) = cartpole();
        let config = PpoConfig { n_steps: 4, batch_size: 4, ..Default::default() };
        let narrow = PpoConfig { hidden_sizes: vec![8], ..config.clone() };
        let mut a = Ppo::new(&obs_space, &act_space, 1, config, Device::Cpu, 1).unwrap();
        let mut b = Ppo::new(&obs_space, &act_space, 1, narrow, Device::Cpu, 2).unwrap();
        let (obs, mut outs) = ([0.1f32; 4], vec![ActOutput::default(); 2]);
        let mut o: Vec<&mut ActOutput> = outs.iter_mut().collect();
        let refs = [ObsRef::F32(&obs), ObsRef::F32(&obs)];
        let pis = &mut [&mut a.pi, &mut b.pi];
        assert!(
            !crate::actor_critic::members::act_stacked(pis, &refs, false, &mut o, &mut Default::default()).unwrap()
        );
        assert!(outs.iter().all(|o| o.actions.is_empty()), "nothing acted");
    }
}
