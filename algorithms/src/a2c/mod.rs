//! Advantage Actor-Critic: the synchronous variant of A3C (Mnih et al. 2016, "Asynchronous Methods for Deep
//! Reinforcement Learning"), as Stable-Baselines3's `A2C`.
//!
//! Implementation details that matter (SB3):
//! * the same actor-critic network as PPO ([`crate::actor_critic`]): separate 64-64 tanh policy and value
//!   MLPs, orthogonal init (√2 hidden, 0.01 policy head, 1 value head);
//! * short rollouts (`n_steps` 5 per env) and **one** gradient step on all `n_steps × n_envs` samples: no
//!   epochs, no minibatches, no importance ratio;
//! * returns from GAE with λ = 1, which is the n-step return bootstrapped from `V(s_{t+n})`; truncated episodes
//!   bootstrap from `V(true final observation)` ([`crate::data::gae`]);
//! * loss `−E[Â log π(a|s)] + vf_coef · E[(R − V)²] − ent_coef · E[H]`; advantages not normalised; global
//!   gradient-norm clipping at 0.5;
//! * `torch.optim.RMSprop` (α 0.99, ε 1e-5, ε outside the square root: [`crate::nn::optimiser`]) at a constant
//!   learning rate 7e-4;
//! * the gradient is computed and applied in two calls ([`A2c::compute_gradients`], [`A2c::apply_gradients`]),
//!   so it can be computed where the data is and applied elsewhere (A3C's actors and parameter server);
//! * on the CPU, an MLP's update runs as one fused step without libtorch (`fused_cpu`,
//!   `crate::actor_critic::host`): the same loss, gradient, clipping and optimiser step, to float rounding;
//! * optional V-trace correction (`vtrace`, as PPO's: [`crate::ppo`]) for rollouts that actors collected with
//!   parameters a few versions old, which makes the update IMPALA's (Espeholt et al. 2018).
//!
//! Defaults follow RL Zoo's CartPole-v1 A2C (with `[env] num_envs = 8`): SB3's defaults with no entropy bonus.
//!
//! Metrics: `losses/policy_loss`, `losses/value_loss`, `losses/entropy`, `losses/explained_variance`,
//! `charts/learning_rate`, `charts/gradient_steps`; with V-trace also `losses/vtrace_mean_rho` (mean
//! `min(ρ̄, π/μ)`), `losses/vtrace_mean_ratio` (mean `π/μ`), `losses/vtrace_rho_clip_fraction` (share with
//! `π/μ > ρ̄`) and `losses/vtrace_behaviour_kl` (estimated KL(μ ‖ π)).
use flotilla_core::{Chunk, ObsRef, Space};
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use crate::acting::{Acting, ActingPolicy, ActingSetup, GradientWorker};
use crate::actor_critic::agent::{OnPolicyAgent, OnPolicyKind, on_policy_kind};
use crate::actor_critic::members::{self, Batch, Nets};
use crate::actor_critic::{ActorCritic, ActorCriticPolicy, LossCoefficients, Settings, StepLoss};
use crate::algorithm::Algorithm;
use crate::data::rollout::{Rollout, RolloutCollector};
use crate::data::vtrace::VtraceConfig;
use crate::error::Checks;
use crate::export::Architecture;
use crate::kind::{AlgorithmKind, KindName, not_data_parallel};
use crate::nn::data_parallel::DataParallel;
use crate::nn::nets::{Activation, CnnOptions};
use crate::nn::optimiser::Optimiser;
use crate::nn::params::FlatParams;
use crate::nn::recurrent::Recurrence;
use crate::progress::Progress;
use crate::{Error, Metrics, Result};

pub use crate::actor_critic::agent::{unbatchable, update_members};

/// Which optimiser applies the gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// `torch.optim.RMSprop` without momentum or centring (SB3's A2C default, `use_rms_prop = True`).
    RmsProp,
    /// `torch.optim.Adam` with PyTorch's default betas (SB3's `use_rms_prop = False`).
    Adam,
}

/// A2C hyperparameters. `Default` is RL Zoo's CartPole-v1 A2C.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct A2cConfig {
    /// Steps per env per rollout (one update per `n_steps × num_envs` transitions).
    pub n_steps: usize,
    /// Discount factor γ.
    pub gamma: f64,
    /// GAE λ; 1 gives the classic n-step returns.
    pub gae_lambda: f64,
    /// Learning rate (initial value when annealed).
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over training.
    pub anneal_lr: bool,
    /// Entropy bonus coefficient.
    pub ent_coef: f64,
    /// Value loss coefficient.
    pub vf_coef: f64,
    /// Global gradient-norm limit.
    pub max_grad_norm: f64,
    /// `"rmsprop"` or `"adam"`.
    pub optimizer: OptimizerKind,
    /// RMSprop's decay α of the running mean of squared gradients (unused by Adam).
    pub rmsprop_alpha: f64,
    /// ε in the optimiser's denominator (SB3's `rms_prop_eps`; its Adam uses 1e-5 too).
    pub optimizer_eps: f64,
    /// Normalise the advantages of each rollout to zero mean and unit variance.
    pub normalize_advantage: bool,
    /// Hidden layer widths of both the policy and the value MLP.
    pub hidden_sizes: Vec<i64>,
    /// Hidden nonlinearity.
    pub activation: Activation,
    /// Initial log standard deviation of Gaussian policies.
    pub log_std_init: f64,
    /// V-trace's off-policy correction, as [`crate::ppo::PpoConfig::vtrace`] (before each gradient).
    pub vtrace: Option<VtraceConfig>,
    /// How the Nature CNN computes for image observations (`[algorithm.cnn]`: channels-last, bf16).
    pub cnn: CnnOptions,
    /// A head per task, as [`crate::ppo::PpoConfig::task_heads`].
    pub task_heads: bool,
    /// The run's task count, set from `[[tasks]]` when the experiment config is parsed (not a setting).
    #[serde(skip)]
    pub tasks: usize,
    /// The fused CPU step, as [`crate::ppo::PpoConfig::fused_cpu`] (host RMSprop or Adam; an A3C gradient from
    /// an actor is applied on libtorch).
    pub fused_cpu: bool,
    /// A recurrent core, as [`crate::ppo::PpoConfig::recurrent`] (each update runs every env's whole sequence).
    pub recurrent: Recurrence,
    /// Hidden units of the recurrent core.
    pub recurrent_hidden: i64,
}

impl Default for A2cConfig {
    fn default() -> Self {
        A2cConfig {
            n_steps: 5,
            gamma: 0.99,
            gae_lambda: 1.0,
            learning_rate: 7e-4,
            anneal_lr: false,
            ent_coef: 0.0,
            vf_coef: 0.5,
            max_grad_norm: 0.5,
            optimizer: OptimizerKind::RmsProp,
            rmsprop_alpha: 0.99,
            optimizer_eps: 1e-5,
            normalize_advantage: false,
            hidden_sizes: vec![64, 64],
            activation: Activation::Tanh,
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

impl A2cConfig {
    /// Check ranges that serde cannot; `num_envs` is the number of envs feeding each rollout.
    pub fn validate(&self, num_envs: usize) -> Result<()> {
        let samples = self.n_steps * num_envs;
        self.shared_checks(Checks::of("a2c"))
            .that(
                !self.normalize_advantage || samples >= 2,
                "normalize_advantage",
                true,
                &format!("needs at least 2 samples per rollout, n_steps × num_envs = {samples}"),
            )
            .that((0.0..1.0).contains(&self.rmsprop_alpha), "rmsprop_alpha", self.rmsprop_alpha, "must be in [0, 1)")
            .positive("optimizer_eps", self.optimizer_eps)
            .done()
    }

    /// The learning rate at `progress_remaining` (1 at the start of training, 0 at the end).
    pub fn learning_rate_at(&self, progress_remaining: f64) -> f64 {
        if self.anneal_lr { self.learning_rate * progress_remaining.clamp(0.0, 1.0) } else { self.learning_rate }
    }
}

/// A3C's config: A2C's fields, for actors that compute gradients and a learner that applies them
/// (`kind = "a3c"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct A3cConfig(pub A2cConfig);

on_policy_kind! {
    impl OnPolicyKind for A2cConfig {
        const NAME: &'static str = "a2c";
        const RNG_SALT: u64 = 0xa2c0_0a2c;

        fn optimiser(&self, params: &FlatParams) -> Optimiser {
            let (lr, eps) = (self.learning_rate, self.optimizer_eps);
            match self.optimizer {
                OptimizerKind::RmsProp => Optimiser::rmsprop(params, lr, self.rmsprop_alpha, eps),
                OptimizerKind::Adam => Optimiser::new(params, lr, eps),
            }
        }

        fn settings(&self, n: usize, progress_remaining: f64) -> Settings {
            Settings {
                lr: self.learning_rate_at(progress_remaining),
                coefficients: LossCoefficients {
                    clip_range: None,
                    clip_range_vf: None,
                    ent_coef: self.ent_coef,
                    vf_coef: self.vf_coef,
                },
                n_epochs: 1,
                batch_size: n,
                normalize_advantage: self.normalize_advantage,
                target_kl: None,
                max_grad_norm: self.max_grad_norm,
                shuffle: false,
                algorithm: "a2c",
            }
        }

        fn check_rollout(&self, net: &ActorCritic, rollout: &Rollout, population: Option<usize>) -> Result<()> {
            if rollout.is_empty() {
                return Err(Error::length("A2C rollout transitions", 0, rollout.n_steps));
            }
            if rollout.act_dim != net.act_dim() {
                return Err(Error::length("A2C rollout action size", rollout.act_dim, net.act_dim()));
            }
            match population {
                Some(n) if rollout.len() != n => {
                    Err(Error::length("population rollout transitions (equal)", rollout.len(), n))
                }
                _ => Ok(()),
            }
        }

        fn unbatchable(&self, first: &Self) -> Option<&'static str> {
            if self.vtrace.is_some() {
                return Some("V-trace targets (`vtrace`)");
            }
            let schedule = |c: &Self| (c.n_steps, c.normalize_advantage, c.anneal_lr, c.optimizer);
            (schedule(self) != schedule(first)).then_some("members' update schedules or optimisers differ")
        }

        fn metrics(&self, s: &Settings, loss: &StepLoss, explained: f64, vtrace: &Metrics, steps: usize) -> Metrics {
            let mut m = gradient_metrics(loss, explained, vtrace);
            m.0.extend([("charts/learning_rate", s.lr), ("charts/gradient_steps", steps as f64)]);
            m
        }

        fn check_replicas(agent: &A2c, parallel: &DataParallel) -> Result<()> {
            let layout = agent.collector.layout(agent.pi.net.obs_layout());
            parallel.check_batch("a2c", "n_steps × envs", layout.n_envs * layout.n_steps)
        }

        fn parameter_server(agent: &mut A2c) -> Option<&mut dyn crate::algorithm::ParameterServer> {
            Some(agent)
        }
    }
}

/// A3C: A2C's answers, but actors send gradients (a [`A3cWorker`] each) to an [`A2c`] learner applying them.
impl AlgorithmKind for A3cConfig {
    fn validate(&self, num_envs: usize) -> Result<()> {
        if self.0.recurrent.is_some() {
            return Err(Error::config(
                "a3c",
                "recurrent",
                format!("{:?}", self.0.recurrent).to_lowercase(),
                "recurrent A3C gradient workers are not built (recurrent A2C and PPO are, with actors too)",
            ));
        }
        self.0.validate(num_envs)
    }

    fn set_tasks(&mut self, tasks: usize) {
        self.0.tasks = tasks;
    }

    fn rollout_steps(&self) -> Option<usize> {
        Some(self.0.n_steps)
    }

    fn check_assemble_ahead(&self) -> std::result::Result<(), String> {
        Err("a3c's learner applies actors' gradients; it assembles no batches".into())
    }

    fn check_data_parallel(&self) -> std::result::Result<(), String> {
        not_data_parallel(self.name())
    }

    fn cnn_options(&self) -> Option<CnnOptions> {
        Some(self.0.cnn)
    }

    fn learner(&self, o: &Space, a: &Space, n_envs: usize, device: Device, seed: u64) -> Result<Box<dyn Algorithm>> {
        AlgorithmKind::learner(&self.0, o, a, n_envs, device, seed)
    }

    fn architecture(&self, o: &Space, a: &Space) -> Result<Architecture> {
        self.0.net().architecture("a3c", o, a)
    }

    fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let mut worker =
            A3cWorker::new(setup.observation_space, setup.action_space, setup.n_envs, self.0.clone(), setup.seed)?;
        worker.freeze(setup.frozen)?;
        Ok(Acting::Gradients(Box::new(worker)))
    }
}

/// A gradient's metrics: the loss terms, the explained variance and V-trace's.
fn gradient_metrics(loss: &StepLoss, explained: f64, vtrace: &Metrics) -> Metrics {
    let mut m = Metrics::default();
    m.push("losses/policy_loss", loss.policy);
    m.push("losses/value_loss", loss.value);
    m.push("losses/entropy", loss.entropy);
    m.push("losses/explained_variance", explained);
    m.0.extend(vtrace.iter().copied());
    m
}

/// The clipped A2C loss gradient of one network on a rollout (left in its buffer), and its metrics.
fn rollout_gradient(
    net: &mut ActorCritic,
    parallel: &mut DataParallel,
    config: &A2cConfig,
    rollout: &Rollout,
) -> Result<Metrics> {
    config.check_rollout(net, rollout, None)?;
    let batch = Batch::new(&[&*net], &[rollout], config.gamma as f32, config.vtrace.as_ref())?;
    let settings = config.settings(rollout.len(), 1.0);
    let mut nets = Nets::Alone { net, parallel, opt: None };
    let (losses, _) = members::train(&mut nets, Vec::new(), &batch, &[settings])?;
    Ok(gradient_metrics(&losses[0], batch.explained[0], &batch.vtrace[0]))
}

/// An A2C agent: the actor-critic network, its optimiser (RMSprop or Adam) and the RNG used to act.
pub type A2c = OnPolicyAgent<A2cConfig>;

impl A2c {
    /// The loss gradient on a finished rollout (GAE already computed), with its global norm clipped to
    /// `max_grad_norm`: a detached flat tensor of the trainable parameters, laid out like the parameter buffer with
    /// frozen layers left out ([`FlatParams::trainable_grad`]). Neither the parameters nor the
    /// optimiser change; [`A2c::apply_gradients`] (here or on another copy of the agent) takes the step.
    ///
    /// With `vtrace` set, the rollout's advantages, returns and values are not used: V-trace recomputes them
    /// under this agent's parameters (the rollout itself is left as the behaviour policy's record).
    pub fn compute_gradients(&mut self, rollout: &Rollout) -> Result<(Tensor, Metrics)> {
        let metrics = rollout_gradient(&mut self.pi.net, &mut self.parallel, &self.config, rollout)?;
        // Packed: the trainable parameters' gradient only (all of it while nothing is frozen).
        Ok((self.pi.net.params.trainable_grad().detach().copy(), metrics))
    }

    /// One optimiser step with a gradient from [`A2c::compute_gradients`] (of this agent or of a copy with the
    /// same layout), at the learning rate for `progress_remaining` (1 at the start of training, 0 at the end).
    /// Returns that learning rate.
    pub fn apply_gradients(&mut self, flat_grad: &Tensor, progress_remaining: f64) -> Result<f64> {
        // FlatParams allocates its gradient buffer up front, so a parameter server that never ran a backward
        // pass can still be handed gradients; they are the trainable parameters' (frozen layers' stay zero).
        let params = &mut self.pi.net.params;
        let n = params.trainable_numel() as usize;
        if flat_grad.size() != [n as i64] {
            return Err(Error::length("A2C flat gradient", flat_grad.numel(), n));
        }
        params.set_trainable_grad(flat_grad)?;
        let lr = self.config.learning_rate_at(progress_remaining);
        self.opt.lr = lr;
        self.opt.step(&mut self.pi.net.params);
        Ok(lr)
    }
}

impl crate::algorithm::ParameterServer for A2c {
    /// A3C's parameter server step: the gradient an [`A3cWorker`] computed, at the annealed learning rate.
    fn apply_gradient(&mut self, gradient: &[f32], progress: &Progress) -> Result<Metrics> {
        let grad = Tensor::from_slice(gradient);
        let lr = self.apply_gradients(&grad, progress.remaining())?;
        Ok(Metrics(vec![("charts/learning_rate", lr), ("charts/gradient_steps", 1.0)]))
    }
}

/// A3C's actor side (Mnih et al. 2016): acts with a copy of the parameters and turns each chunk it collected
/// into the clipped A2C loss gradient, which the learner applies ([`crate::algorithm::ParameterServer::apply_gradient`]
/// of an [`A2c`])
/// before broadcasting. No optimiser lives here.
#[derive(Debug)]
pub struct A3cWorker {
    config: A2cConfig,
    policy: ActorCriticPolicy,
    collector: RolloutCollector,
}

impl A3cWorker {
    /// A worker for `n_envs` envs; `seed` fixes action sampling (the weights come from the learner).
    pub fn new(
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        config: A2cConfig,
        seed: u64,
    ) -> Result<Self> {
        config.validate(n_envs)?;
        let net = ActorCritic::new("a3c", observation_space, action_space, &config.net(), Device::Cpu, seed)?;
        let policy = ActorCriticPolicy::new(net, seed);
        let collector = RolloutCollector::new(n_envs, config.n_steps, policy.net.obs_dim(), policy.net.act_dim());
        Ok(A3cWorker { config, policy, collector })
    }

    /// Freeze the run's `[init] freeze` layers here too, so each gradient holds the trainable parameters
    /// only ([`FlatParams::trainable_grad`]): frozen layers cost nothing on the wire.
    pub fn freeze(&mut self, layers: &[String]) -> Result<()> {
        self.policy.net.params.freeze("[init] freeze", layers).map(|_| ())
    }
}

impl GradientWorker for A3cWorker {
    fn policy(&mut self) -> &mut dyn ActingPolicy {
        &mut self.policy
    }

    fn gradient(&mut self, chunk: &Chunk) -> Result<(Vec<f32>, Metrics)> {
        let net = &mut self.policy.net;
        self.collector.push_chunks(std::slice::from_ref(chunk), |obs: ObsRef<'_>| net.values(obs))?;
        let (gamma, lambda) = (self.config.gamma as f32, self.config.gae_lambda as f32);
        let rollout = self
            .collector
            .finish(|obs: ObsRef<'_>| net.values(obs), gamma, lambda)?
            .ok_or_else(|| Error::length("A3C chunk steps", chunk.n_steps, self.config.n_steps))?;
        let out = rollout_gradient(net, &mut DataParallel::default(), &self.config, &rollout);
        self.collector.recycle(rollout);
        let metrics = out?;
        let grad = net.params.trainable_grad().to_device(Device::Cpu).view([-1]);
        Ok((Vec::<f32>::try_from(grad)?, metrics))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor_critic::actor_critic_loss;
    use crate::checkpoint::Checkpoint;
    use crate::data::vtrace::VtraceConfig;
    use crate::nn::members::Coef;
    use crate::nn::params::assert_params_close;
    use crate::policy::{ActMode, ActOutput, Policy};
    use flotilla_core::Chunk;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Kind;

    /// A2C's coefficients of [`actor_critic_loss`] (no clipping).
    fn a2c_coefficients(ent_coef: f64, vf_coef: f64) -> LossCoefficients<Coef> {
        LossCoefficients {
            clip_range: None,
            clip_range_vf: None,
            ent_coef: Coef::One(ent_coef),
            vf_coef: Coef::One(vf_coef),
        }
    }

    /// [`actor_critic_loss`] with A2C's coefficients (which read no behaviour log-probs or old values).
    fn a2c_loss(
        lp: &Tensor,
        adv: &Tensor,
        ent: Option<&Tensor>,
        v: &Tensor,
        ret: &Tensor,
        c: &LossCoefficients<Coef>,
    ) -> crate::actor_critic::ActorCriticLoss {
        actor_critic_loss(lp, &lp.detach(), adv, ent, v, &v.detach(), ret, c)
    }

    /// The A2C loss in the paper's notation, sample by sample, in f64: (policy, value, total).
    fn reference_loss(
        lp: &[f64],
        adv: &[f64],
        ent: &[f64],
        v: &[f64],
        ret: &[f64],
        c: [f64; 2],
        normalize: bool,
    ) -> [f64; 3] {
        let n = adv.len() as f64;
        let mean = adv.iter().sum::<f64>() / n;
        let std = (adv.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let (mut pg, mut vf, mut h) = (0.0, 0.0, 0.0);
        for i in 0..adv.len() {
            let a = if normalize { (adv[i] - mean) / (std + 1e-8) } else { adv[i] };
            pg -= a * lp[i];
            vf += (ret[i] - v[i]).powi(2);
            h += ent[i];
        }
        let (pg, vf, h) = (pg / n, vf / n, h / n);
        let [ent_coef, vf_coef] = c;
        [pg, vf, pg + vf_coef * vf - ent_coef * h]
    }

    #[test]
    fn loss_matches_reference() {
        let mut rng = Pcg64::seed_from_u64(3);
        let n = 40;
        let mut draw = |lo: f64, hi: f64| (0..n).map(|_| rng.random_range(lo..hi)).collect::<Vec<f64>>();
        let (lp, adv, ent, v, ret) =
            (draw(-2.0, -0.1), draw(-3.0, 3.0), draw(0.0, 0.7), draw(-1.0, 1.0), draw(-2.0, 2.0));
        let t = |x: &[f64]| Tensor::from_slice(x).to_kind(Kind::Float);
        for (normalize, ent_coef) in [(false, 0.0), (false, 0.01), (true, 0.05)] {
            let c = a2c_coefficients(ent_coef, 0.5);
            let entropy = (ent_coef != 0.0).then(|| t(&ent));
            // Advantages are normalised by the update, per member, before the loss.
            let advantages = match normalize {
                true => crate::nn::members::normalize_rows(&t(&adv).unsqueeze(0)).squeeze_dim(0),
                false => t(&adv),
            };
            let loss = a2c_loss(&t(&lp), &advantages, entropy.as_ref(), &t(&v), &t(&ret), &c);
            let want = reference_loss(&lp, &adv, &ent, &v, &ret, [ent_coef, 0.5], normalize);
            let got = |x: &Tensor| f64::try_from(x).unwrap();
            for (name, g, w) in [
                ("policy", got(&loss.policy), want[0]),
                ("value", got(&loss.value), want[1]),
                ("total", got(&loss.total), want[2]),
            ] {
                assert!((g - w).abs() < 1e-5, "{name} (normalize {normalize}, ent_coef {ent_coef}): {g} vs {w}");
            }
        }
    }

    #[test]
    fn loss_gradients_point_the_right_way() {
        // A positive advantage raises log π(a|s); the value moves towards the return; entropy is rewarded.
        let lp = Tensor::from_slice(&[-0.7f32, -0.7]).set_requires_grad(true);
        let v = Tensor::from_slice(&[0.0f32, 0.0]).set_requires_grad(true);
        let ent = Tensor::from_slice(&[0.5f32, 0.5]).set_requires_grad(true);
        let c = a2c_coefficients(0.1, 0.5);
        let adv = Tensor::from_slice(&[2.0f32, -1.0]);
        let ret = Tensor::from_slice(&[1.0f32, -3.0]);
        a2c_loss(&lp, &adv, Some(&ent), &v, &ret, &c).total.backward();
        let grad = |t: &Tensor| Vec::<f32>::try_from(t.grad()).unwrap();
        // d/d lp_i = −Â_i / n; d/d V_i = vf_coef · 2 (V_i − R_i) / n; d/d H_i = −ent_coef / n.
        assert_eq!(grad(&lp), vec![-1.0, 0.5]);
        assert_eq!(grad(&v), vec![-0.5, 1.5]);
        assert_eq!(grad(&ent), vec![-0.05, -0.05]);
    }

    fn cartpole_spaces() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2))
    }

    /// A finished bandit rollout of `n_steps × 8` steps collected by `agent`: action 1 pays 1, action 0 pays 0,
    /// every step ends its episode.
    fn bandit_rollout(agent: &mut A2c, rng: &mut Pcg64) -> Rollout {
        let n_steps = agent.config.n_steps;
        let mut rollout = Rollout::new(8, n_steps, 4, 1);
        let mut out = ActOutput::default();
        for _ in 0..n_steps {
            let obs: Vec<f32> = (0..32).map(|_| rng.random_range(-1.0..1.0)).collect();
            agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            rollout.push_acted(&obs, &out, &out.actions.clone(), &[true; 8]);
        }
        rollout.finish(&[0.0; 8], agent.config.gamma as f32, agent.config.gae_lambda as f32).unwrap();
        rollout
    }

    fn flat(agent: &A2c) -> Tensor {
        agent.params().flat().detach().copy()
    }

    #[test]
    fn bandit_policy_improves() {
        let (obs_space, act_space) = cartpole_spaces();
        let mut a2c = A2c::new(&obs_space, &act_space, 8, A2cConfig::default(), Device::Cpu, 0).unwrap();
        let probe = [0.1f32, 0.2, 0.3, 0.4];
        let prob_of_1 = |a2c: &A2c| {
            let x = a2c.pi.net.obs_tensor(ObsRef::F32(&probe)).unwrap();
            let (logits, _) = tch::no_grad(|| a2c.pi.net.forward(&x));
            f64::try_from(logits.softmax(-1, Kind::Float).get(0).get(1)).unwrap()
        };
        let before = prob_of_1(&a2c);
        assert!((before - 0.5).abs() < 0.05, "near-uniform initial policy: {before}");
        let mut rng = Pcg64::seed_from_u64(9);
        let mut first_value_loss = None;
        for _ in 0..40 {
            let rollout = bandit_rollout(&mut a2c, &mut rng);
            let m = a2c.update_from(&rollout, 1.0).unwrap();
            first_value_loss.get_or_insert(m.get("losses/value_loss").unwrap());
            assert_eq!(m.get("charts/learning_rate"), Some(7e-4));
        }
        let after = prob_of_1(&a2c);
        assert!(after > 0.8, "P(action 1): {before} -> {after}");
        let mut o = ActOutput::default();
        a2c.act(ObsRef::F32(&probe), ActMode::Deterministic, &mut o).unwrap();
        assert_eq!(o.actions, vec![1.0], "the greedy action is the paying one");
    }

    #[test]
    fn gradients_computed_on_one_agent_and_applied_on_another_match_a_local_update() {
        let (obs_space, act_space) = cartpole_spaces();
        for optimizer in [OptimizerKind::RmsProp, OptimizerKind::Adam] {
            // The libtorch path throughout: the local update is to match the split one bit for bit.
            let config =
                A2cConfig { optimizer, ent_coef: 0.01, anneal_lr: true, fused_cpu: false, ..Default::default() };
            let mut actor = A2c::new(&obs_space, &act_space, 8, config.clone(), Device::Cpu, 4).unwrap();
            let mut server = A2c::new(&obs_space, &act_space, 8, config, Device::Cpu, 4).unwrap();
            assert!(flat(&actor).equal(&flat(&server)));
            let mut rng = Pcg64::seed_from_u64(1);
            for k in 0..3 {
                let progress = 1.0 - k as f64 / 10.0;
                let rollout = bandit_rollout(&mut actor, &mut rng);
                let before = flat(&actor);
                let (grad, m) = actor.compute_gradients(&rollout).unwrap();
                assert!(flat(&actor).equal(&before), "computing a gradient does not move the parameters");
                assert!(m.get("losses/policy_loss").unwrap().is_finite());
                let norm = f64::try_from(grad.norm()).unwrap();
                assert!(norm > 0.0 && norm <= 0.5 + 1e-4, "clipped gradient norm {norm}");
                let lr = server.apply_gradients(&grad, progress).unwrap();
                assert!((lr - 7e-4 * progress).abs() < 1e-12);
                actor.update_from(&rollout, progress).unwrap();
                assert!(!flat(&actor).equal(&before), "the update moved the parameters");
                assert!(flat(&actor).equal(&flat(&server)), "{optimizer:?}, update {k}: remote step differs");
            }
            let wrong = Tensor::zeros([3], (Kind::Float, Device::Cpu));
            assert!(server.apply_gradients(&wrong, 1.0).is_err(), "a gradient of the wrong layout is refused");
        }
    }

    #[test]
    fn fused_cpu_update_matches_libtorch() {
        let discrete = (Space::box1d(vec![-1.0; 5], vec![1.0; 5]), Space::discrete(3));
        let gaussian = (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::box1d(vec![-2.0; 2], vec![2.0; 2]));
        let base = A2cConfig { n_steps: 8, ..Default::default() };
        let cases = [
            ("rmsprop (the zoo's settings)", &discrete, base.clone()),
            (
                "adam, entropy, normalised advantages, relu, annealed",
                &discrete,
                A2cConfig {
                    optimizer: OptimizerKind::Adam,
                    ent_coef: 0.01,
                    normalize_advantage: true,
                    activation: Activation::Relu,
                    hidden_sizes: vec![32, 16],
                    anneal_lr: true,
                    ..base.clone()
                },
            ),
            ("gaussian", &gaussian, A2cConfig { ent_coef: 0.02, ..base.clone() }),
            (
                "v-trace",
                &discrete,
                A2cConfig { vtrace: Some(VtraceConfig::default()), learning_rate: 3e-3, ..base.clone() },
            ),
            (
                "lstm, entropy",
                &discrete,
                A2cConfig { recurrent: Recurrence::Lstm, recurrent_hidden: 8, ent_coef: 0.01, ..base.clone() },
            ),
            (
                "lstm, v-trace, adam",
                &discrete,
                A2cConfig {
                    recurrent: Recurrence::Lstm,
                    recurrent_hidden: 8,
                    optimizer: OptimizerKind::Adam,
                    vtrace: Some(VtraceConfig::default()),
                    learning_rate: 3e-3,
                    ..base.clone()
                },
            ),
        ];
        for (what, (obs_space, act_space), config) in cases {
            let obs_dim = obs_space.flat_dim();
            let make = |fused_cpu| {
                A2c::new(obs_space, act_space, 4, A2cConfig { fused_cpu, ..config.clone() }, Device::Cpu, 7).unwrap()
            };
            let (mut fused, mut torch) = (make(true), make(false));
            // A third agent acts (a few updates behind, so V-trace has something to correct).
            let mut actor = make(true);
            for u in 0..4 {
                let mut rollout = crate::ppo::tests::varied_rollout(&mut actor, 4, 8, obs_dim, u * 8);
                let last: Vec<f32> = (0..4 * obs_dim).map(|i| (i as f32 * 0.71 + u as f32).cos()).collect();
                rollout.bootstrap_obs = flotilla_core::ObsBuf::F32(last);
                let progress = 1.0 - u as f64 / 5.0;
                let mf = fused.update_from(&rollout, progress).unwrap();
                let mt = torch.update_from(&rollout, progress).unwrap();
                assert!(fused.host.is_some() && torch.host.is_none(), "{what}: paths");
                let keys = |m: &Metrics| m.iter().map(|(k, _)| *k).collect::<Vec<_>>();
                assert_eq!(keys(&mf), keys(&mt), "{what}: metrics");
                for &(key, a) in mf.iter() {
                    let b = mt.get(key).unwrap();
                    assert!((a - b).abs() <= 1e-4 * b.abs().max(1e-2), "{what}, update {u}: {key} {a} vs {b}");
                }
                let a = assert_params_close(&format!("{what}, update {u}"), fused.params(), torch.params(), 1e-5);
                let init: Vec<f32> = Vec::try_from(make(true).params().flat().detach()).unwrap();
                assert_ne!(a, init, "{what}: weights moved");
                if u == 1 {
                    actor.pi.net.params.copy_from(&fused.params().flat().detach().copy()).unwrap();
                }
            }
            // The optimiser states agree too: a checkpoint of each restores into the other's path.
            let (mut cf, mut ct) = (fused.checkpoint().unwrap(), torch.checkpoint().unwrap());
            for key in ["rmsprop.square_avg", "adam.exp_avg_sq"] {
                if let (Ok(x), Ok(y)) = (cf.take_tensor(key), ct.take_tensor(key)) {
                    let worst = f64::try_from((x - &y).abs().max()).unwrap();
                    let scale = f64::try_from(y.abs().max()).unwrap();
                    assert!(worst <= 1e-4 * scale, "{what}: {key} differs by {worst} (scale {scale})");
                }
            }
        }
    }

    #[test]
    fn a_non_finite_loss_on_the_fused_path_is_an_error_and_no_step_is_taken() {
        let (obs_space, act_space) = cartpole_spaces();
        let mut a2c = A2c::new(&obs_space, &act_space, 4, A2cConfig::default(), Device::Cpu, 0).unwrap();
        let mut rollout = crate::ppo::tests::varied_rollout(&mut a2c, 4, 5, 4, 0);
        rollout.advantages[3] = f32::NAN; // what a NaN reward or value would leave behind
        let before = a2c.params().flat().detach().copy();
        let e = a2c.update_from(&rollout, 1.0).unwrap_err();
        assert!(matches!(e, Error::NonFinite(_)), "{e}");
        assert!(a2c.host.is_some(), "the fused path ran");
        assert!(a2c.params().flat().equal(&before), "the parameters changed");
    }

    /// Drive an agent through the `Algorithm` interface on a synthetic 2-env task with terminations and
    /// truncations, for `steps` vectorised steps starting at step `start`.
    fn drive(agent: &mut A2c, start: u64, steps: u64, total: u64) -> Vec<f32> {
        let mut out = ActOutput::default();
        let mut actions = Vec::new();
        for k in start..start + steps {
            let obs: Vec<f32> = (0..8).map(|i| ((k * 8 + i) as f32 * 0.37).sin()).collect();
            let next_obs: Vec<f32> = (0..8).map(|i| ((k * 8 + i) as f32 * 0.53).cos()).collect();
            agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            actions.extend_from_slice(&out.actions);
            let rewards: Vec<f32> = out.actions.iter().map(|a| 1.0 - a).collect();
            let terminated = [k % 7 == 6, false];
            let truncated = [false, k % 5 == 4];
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
            agent.observe(std::slice::from_ref(&step)).unwrap();
            agent.update(&Progress { env_steps: (k + 1) * 2, total_env_steps: total }).unwrap();
        }
        actions
    }

    #[test]
    fn checkpoint_round_trip_continues_identically() {
        let (obs_space, act_space) = cartpole_spaces();
        for optimizer in [OptimizerKind::RmsProp, OptimizerKind::Adam] {
            let config = A2cConfig { optimizer, anneal_lr: true, ..Default::default() };
            let mut a = A2c::new(&obs_space, &act_space, 2, config.clone(), Device::Cpu, 11).unwrap();
            // 23 steps: four updates and a rollout three steps in.
            drive(&mut a, 0, 23, 100);
            let path = std::env::temp_dir().join(format!("flotilla-a2c-{}-{optimizer:?}.ckpt", std::process::id()));
            a.checkpoint().unwrap().save(&path).unwrap();
            let mut b = A2c::new(&obs_space, &act_space, 2, config, Device::Cpu, 12).unwrap();
            assert!(!flat(&a).equal(&flat(&b)));
            b.restore(&mut Checkpoint::load(&path).unwrap()).unwrap();
            std::fs::remove_file(&path).unwrap();
            let actions_a = drive(&mut a, 23, 27, 100);
            let actions_b = drive(&mut b, 23, 27, 100);
            assert_eq!(actions_a, actions_b, "the RNG stream continues");
            assert!(flat(&a).equal(&flat(&b)), "{optimizer:?}: training continues bit-identically");
        }
    }

    #[test]
    fn checkpoint_of_another_optimizer_is_refused() {
        let (obs_space, act_space) = cartpole_spaces();
        let a = A2c::new(&obs_space, &act_space, 2, A2cConfig::default(), Device::Cpu, 1).unwrap();
        let adam = A2cConfig { optimizer: OptimizerKind::Adam, ..Default::default() };
        let mut b = A2c::new(&obs_space, &act_space, 2, adam, Device::Cpu, 1).unwrap();
        let e = b.restore(&mut a.checkpoint().unwrap()).unwrap_err().to_string();
        assert!(e.contains("adam"), "{e}");
    }

    #[test]
    fn gaussian_policy_acts_and_updates() {
        let obs_space = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let act_space = Space::box1d(vec![-2.0], vec![2.0]);
        let config = A2cConfig { ent_coef: 0.01, normalize_advantage: true, ..Default::default() };
        let mut a2c = A2c::new(&obs_space, &act_space, 4, config, Device::Cpu, 1).unwrap();
        assert_eq!(a2c.act_dim(), 1);
        let mut out = ActOutput::default();
        let mut rollout = Rollout::new(4, 5, 3, 1);
        for _ in 0..5 {
            let obs = vec![0.5f32; 12];
            a2c.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let rewards: Vec<f32> = out.actions.iter().map(|a| -(a - 1.0).powi(2)).collect();
            rollout.push_acted(&obs, &out, &rewards, &[true; 4]);
        }
        rollout.finish(&[0.0; 4], 0.99, 1.0).unwrap();
        let m = a2c.update_from(&rollout, 1.0).unwrap();
        assert!(m.get("losses/entropy").unwrap().is_finite());
    }

    #[test]
    fn config_validation_and_serde() {
        assert!(A2cConfig::default().validate(8).is_ok());
        let e = A2cConfig { rmsprop_alpha: 1.0, ..Default::default() }.validate(8).unwrap_err().to_string();
        assert!(e.contains("rmsprop_alpha") && e.contains("a2c"), "{e}");
        let e = A2cConfig { normalize_advantage: true, n_steps: 1, ..Default::default() }.validate(1).unwrap_err();
        assert!(e.to_string().contains("normalize_advantage"), "{e}");
        assert!(A2cConfig { n_steps: 0, ..Default::default() }.validate(8).is_err());
        let c: A2cConfig = serde_json::from_str(r#"{"optimizer": "adam", "n_steps": 8}"#).unwrap();
        assert_eq!((c.optimizer, c.n_steps, c.gamma), (OptimizerKind::Adam, 8, 0.99));
        let e = serde_json::from_str::<A2cConfig>(r#"{"optimiser": "adam"}"#).unwrap_err().to_string();
        assert!(e.contains("optimiser"), "{e}");
        assert!(serde_json::from_str::<A2cConfig>(r#"{"optimizer": "sgd"}"#).is_err());
    }

    #[test]
    fn vtrace_on_policy_is_plain_a2c_and_reweights_a_lagging_rollout() {
        let (obs_space, act_space) = cartpole_spaces();
        // A2C's returns are GAE with λ = 1 already, so on-policy V-trace (ρ̄ = c̄ = ρ̄_pg = 1) changes nothing.
        // (No gradient clipping, so that gradients compare by scale too.)
        let config = A2cConfig { max_grad_norm: 1e9, ..Default::default() };
        let mut a2c = A2c::new(&obs_space, &act_space, 8, config, Device::Cpu, 2).unwrap();
        let mut rollout = bandit_rollout(&mut a2c, &mut Pcg64::seed_from_u64(5));
        let (plain, m) = a2c.compute_gradients(&rollout).unwrap();
        assert!(m.get("losses/vtrace_mean_rho").is_none());
        a2c.config.vtrace = Some(VtraceConfig::default());
        let (corrected, m) = a2c.compute_gradients(&rollout).unwrap();
        assert!(corrected.allclose(&plain, 1e-5, 1e-7, false), "on-policy V-trace gradient differs");
        assert!((m.get("losses/vtrace_mean_rho").unwrap() - 1.0).abs() < 1e-5);
        // μ gave every action twice π's probability: ρ = ρ^pg = 0.5, so each (terminal) advantage and each
        // v_s − V(x_s) halves, and with them, without an entropy bonus, the whole gradient.
        for lp in &mut rollout.log_probs {
            *lp += 2.0f32.ln();
        }
        let (lagged, m) = a2c.compute_gradients(&rollout).unwrap();
        assert!((m.get("losses/vtrace_mean_rho").unwrap() - 0.5).abs() < 1e-5);
        assert!((m.get("losses/vtrace_mean_ratio").unwrap() - 0.5).abs() < 1e-5);
        assert_eq!(m.get("losses/vtrace_rho_clip_fraction"), Some(0.0));
        assert!(lagged.allclose(&(&plain * 0.5), 1e-4, 1e-7, false), "ρ = 0.5 halves the gradient");
        let vtrace = Some(&VtraceConfig::default());
        let t = a2c.pi.net.targets(&rollout, None, a2c.config.gamma as f32, vtrace).unwrap().vtrace.unwrap();
        for i in 0..rollout.len() {
            let td = rollout.rewards[i] - t.values[i];
            assert!((t.pg_advantages[i] - 0.5 * td).abs() < 1e-5 * (1.0 + td.abs()), "step {i}");
            assert!((t.vs[i] - t.values[i] - 0.5 * td).abs() < 1e-5 * (1.0 + td.abs()), "step {i}");
        }
    }

    #[test]
    fn vtrace_through_the_algorithm_interface_resumes_identically() {
        // `drive` truncates env 1 at the last step of every rollout, so V-trace needs the kept final and
        // bootstrap observations, including those of a rollout restored half-filled from a checkpoint.
        let (obs_space, act_space) = cartpole_spaces();
        let config = A2cConfig { vtrace: Some(VtraceConfig::default()), ..Default::default() };
        let mut a = A2c::new(&obs_space, &act_space, 2, config.clone(), Device::Cpu, 11).unwrap();
        let before = flat(&a);
        drive(&mut a, 0, 23, 100);
        assert!(!flat(&a).equal(&before), "the updates ran");
        let mut c = a.checkpoint().unwrap();
        let mut b = A2c::new(&obs_space, &act_space, 2, config, Device::Cpu, 12).unwrap();
        b.restore(&mut c).unwrap();
        assert_eq!(drive(&mut a, 23, 27, 100), drive(&mut b, 23, 27, 100));
        assert!(flat(&a).equal(&flat(&b)), "training continues bit-identically");
    }

    #[test]
    fn vtrace_config_parses_and_validates() {
        let c: A2cConfig =
            serde_json::from_str(r#"{"vtrace": {"clip_rho_threshold": 1.5, "clip_pg_rho_threshold": 2.0}}"#).unwrap();
        let want = VtraceConfig { clip_rho_threshold: 1.5, clip_pg_rho_threshold: 2.0, ..VtraceConfig::default() };
        assert_eq!(c.vtrace, Some(want));
        assert!(c.validate(8).is_ok());
        assert_eq!(A2cConfig::default().vtrace, None, "off unless asked for");
        assert!(serde_json::from_str::<A2cConfig>(r#"{"vtrace": {"c_bar": 1.0}}"#).is_err());
        let bad = A2cConfig {
            vtrace: Some(VtraceConfig { clip_rho_threshold: -1.0, ..VtraceConfig::default() }),
            ..A2cConfig::default()
        };
        let e = bad.validate(8).unwrap_err().to_string();
        assert!(e.contains("vtrace") && e.contains("clip_rho_threshold = -1"), "{e}");
    }
}

#[cfg(test)]
mod member_tests {
    use flotilla_core::Space;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::actor_critic::members::tests::{cartpole, twin_rollout};
    use crate::data::vtrace::VtraceConfig;
    use crate::nn::members::rel_diff;
    use crate::nn::nets::Activation;

    /// A member's optimiser state as one flat tensor: RMSprop's running mean, or Adam's two moments.
    fn optimiser_state(a: &A2c) -> Tensor {
        Tensor::cat(&a.opt.state, 0)
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
            let batched = update_members(&mut refs, &rollouts.iter().collect::<Vec<_>>(), progress).unwrap();
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
            update_members(&mut refs, &rollouts.iter().collect::<Vec<_>>(), 1.0).unwrap();
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
