//! Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"), the version with
//! twin critics and automatic entropy tuning, as SB3's `SAC` and CleanRL's `sac_continuous_action` run it.
//!
//! Implementation details that matter (SB3's `SAC`):
//! * the actor is an MLP torso with two linear heads, the Gaussian's mean (`actor.{k}`, the torso's last layer)
//!   and its log standard deviation (`log_std.0`, clamped to `[−20, 2]`); an action is `a = tanh(u)`,
//!   `u = μ + σ ε`, with `log π(a|s) = Σ [log N(u; μ, σ) − log(1 − a² + 10⁻⁶)]`. The deterministic action (evaluation,
//!   `flotilla export`) is `tanh(μ)`; actions live in `[−1, 1]` and are scaled to the Box bounds only when
//!   handed to the env, replay stores them in `[−1, 1]` ([`crate::continuous`]);
//! * uniformly random actions before `learning_starts` env steps, then samples of the current policy;
//! * every `train_freq` vectorised steps once more than `learning_starts` env steps were taken,
//!   `gradient_steps` updates, each on one minibatch: (1) with `α = exp(log α)` as it stands, the temperature
//!   loss `−mean(log α · (log π(ã|s) + H̄))` (target entropy `H̄ = −|A|` by default) and its Adam step;
//!   (2) the critic target `y = r + γ (1 − terminated) (min_j Q̄_j(s', ã') − α log π(ã'|s'))`, `ã' ~ π(·|s')`, the
//!   loss `½ Σ_j MSE(Q_j(s, a), y)` and an Adam step; (3) the actor loss `mean(α log π(ã|s) − min_j Q_j(s, ã))`
//!   through the critics just updated (their weights detached) and an Adam step; (4) every
//!   `target_update_interval` updates, the Polyak update (τ) of the critics' targets. There is no target actor;
//! * the Gaussian draws `ε` for `ã` and `ã'` are taken on the host from the agent's seeded generator and travel
//!   in the minibatch rows, so a resumed run continues bit for bit;
//! * separate Adam optimisers (PyTorch defaults) for actor, critics and `log α`, PyTorch's default `nn.Linear`
//!   initialisation; on the CPU, `fused_cpu` takes the Adam and Polyak steps as host loops.
//!
//! Defaults are RL Zoo's Pendulum-v1 (`sac.yml`: lr 1e-3, SB3's defaults otherwise): 256-256 ReLU MLPs, batch
//! 256, buffer 1 M, learning starts 100, γ 0.99, τ 0.005, one gradient step per env step, `α` learnt from 1.
//!
//! Metrics: `losses/critic_loss`, `losses/actor_loss`, `losses/ent_coef_loss`, `charts/ent_coef` (α after
//! the update), `losses/q_values` (mean `Q_j(s, a)`), `charts/learning_rate`, `charts/gradient_steps`.
use flotilla_core::{Chunk, ObsRef, Space};
use rand::SeedableRng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::acting::{Acting, ActingNet, ActingSetup, WarmupPolicy};
use crate::algorithm::{Algorithm, Replicated};
use crate::checkpoint::Checkpoint;
use crate::continuous::action_noise::fill_standard_normal;
use crate::continuous::{ActionReplay, Critics, Transitions, act_tanh, action_bounds, adam_step, mean_of, polyak};
use crate::data::replay::check_len;
use crate::error::Checks;
use crate::export::{Architecture, Network, PolicyOutput};
use crate::kind::AlgorithmKind;
use crate::nn::data_parallel::DataParallel;
use crate::nn::host_mlp::HostScratch;
use crate::nn::members::backward_alone;
use crate::nn::mixed::dense;
use crate::nn::nets::{Activation, FlatMlp, LayerInit, cpu_has_native_bf16, mlp_input_dim, with_torch_seed};
use crate::nn::optimiser::Adam;
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy, f32_obs};
use crate::progress::Progress;
use crate::teaching::{Teaching, TeachingKind};
use crate::{Metrics, Result};

/// SB3's bounds on the policy's log standard deviation.
const LOG_STD_RANGE: (f64, f64) = (-20.0, 2.0);

/// SAC hyperparameters. `Default` is RL Zoo's Pendulum-v1 SAC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SacConfig {
    /// Adam learning rate (actor, critics and temperature).
    pub learning_rate: f64,
    /// Adam ε.
    pub adam_eps: f64,
    /// Transitions per gradient step.
    pub batch_size: usize,
    /// Replay capacity (transitions).
    pub buffer_size: usize,
    /// Env steps of uniformly random actions before learning starts.
    pub learning_starts: u64,
    /// Discount factor γ.
    pub gamma: f64,
    /// Polyak coefficient of the critics' target updates.
    pub tau: f64,
    /// Vectorised env steps between training phases.
    pub train_freq: u64,
    /// Gradient steps per training phase.
    pub gradient_steps: usize,
    /// The entropy coefficient α at the start (SB3's `ent_coef = "auto_<x>"`; `"auto"` is 1).
    pub ent_coef: f64,
    /// Learn α towards the target entropy (SB3's `"auto"`); `false` keeps `ent_coef` fixed.
    pub learn_ent_coef: bool,
    /// The target entropy `H̄`; unset: `−|A|` (the action dimension, negated).
    pub target_entropy: Option<f64>,
    /// Gradient steps between the critics' Polyak target updates.
    pub target_update_interval: u64,
    /// Hidden layer widths of the actor and of each critic.
    pub hidden_sizes: Vec<i64>,
    /// Hidden nonlinearity.
    pub activation: Activation,
    /// Critics; targets and the actor read the minimum of them.
    pub n_critics: usize,
    /// Adam steps and Polyak updates as one host loop on the CPU, as [`crate::td3::Td3Config::fused_cpu`].
    pub fused_cpu: bool,
    /// Mixed precision for the update on the CPU, as [`crate::td3::Td3Config::bf16`].
    pub bf16: bool,
}

impl Default for SacConfig {
    fn default() -> Self {
        SacConfig {
            learning_rate: 1e-3,
            adam_eps: 1e-8,
            batch_size: 256,
            buffer_size: 1_000_000,
            learning_starts: 100,
            gamma: 0.99,
            tau: 0.005,
            train_freq: 1,
            gradient_steps: 1,
            ent_coef: 1.0,
            learn_ent_coef: true,
            target_entropy: None,
            target_update_interval: 1,
            hidden_sizes: vec![256, 256],
            activation: Activation::Relu,
            n_critics: 2,
            fused_cpu: true,
            bf16: cpu_has_native_bf16(),
        }
    }
}

impl SacConfig {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<()> {
        let widths = &self.hidden_sizes;
        Checks::of("sac")
            .adam(self.learning_rate, self.adam_eps)
            .replay(self.batch_size, self.buffer_size, self.train_freq, self.gradient_steps)
            .targets(self.gamma, self.tau)
            .that(
                self.ent_coef.is_finite() && self.ent_coef > 0.0,
                "ent_coef",
                self.ent_coef,
                "must be finite and > 0 (α, or its start)",
            )
            .set(self.target_entropy, |c, h| c.finite("target_entropy", h))
            .at_least_one("target_update_interval", self.target_update_interval)
            .that(!widths.is_empty(), "hidden_sizes", "[]", "one or more widths, each at least 1")
            .widths("hidden_sizes", widths)
            .at_least_one("n_critics", self.n_critics)
            .done()
    }
}

impl AlgorithmKind for SacConfig {
    fn validate(&self, _num_envs: usize) -> Result<()> {
        SacConfig::validate(self)
    }

    fn mlp_bf16(&self) -> bool {
        self.bf16
    }

    fn learner(&self, o: &Space, a: &Space, n_envs: usize, device: Device, seed: u64) -> Result<Box<dyn Algorithm>> {
        Ok(Box::new(Sac::new(o, a, n_envs, self.clone(), device, seed)?))
    }

    /// The mean's MLP (`actor.{k}`) and `tanh`, scaled to the bounds: the deterministic action.
    fn architecture(&self, o: &Space, a: &Space) -> Result<Architecture> {
        let (low, high) = action_bounds("sac", a)?;
        let network = Network::mlp("actor", mlp_input_dim("sac", o)?, &self.hidden_sizes, low.len(), self.activation);
        Ok(Architecture::new("sac", network, PolicyOutput::TanhScaled { low, high }, 1, o, a))
    }

    fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let ActingSetup { observation_space: o, action_space: a, seed, .. } = *setup;
        self.validate()?;
        let (pi, named) = with_torch_seed(seed, || GaussianActor::init(o, a, self, Device::Cpu))?;
        Ok(Acting::Chunks(Box::new(WarmupPolicy::new(pi, named, (), self.learning_starts, seed ^ 0x5ac_ac70))))
    }
}

/// The squashed Gaussian policy: the mean's MLP `actor.{k}` and the log-std head `log_std.0` on its last
/// hidden layer, in one [`FlatParams`]; shared by the agent and its acting copy ([`WarmupPolicy`]).
#[derive(Debug, Clone)]
pub(crate) struct GaussianActor {
    net: FlatMlp,
    /// Index of the log-std head's weight (its bias follows).
    log_std: usize,
    low: Vec<f32>,
    high: Vec<f32>,
    obs_dim: usize,
    act_dim: usize,
    device: Device,
}

impl GaussianActor {
    /// The actor for these spaces and its initial parameters, drawn from libtorch's generator.
    fn init(o: &Space, a: &Space, c: &SacConfig, device: Device) -> Result<(Self, Vec<(String, Tensor)>)> {
        let obs_dim = mlp_input_dim("sac", o)?;
        let (low, high) = action_bounds("sac", a)?;
        let act_dim = low.len();
        let (od, ad, hidden) = (obs_dim as i64, act_dim as i64, &c.hidden_sizes);
        let (net, mut named) = FlatMlp::init("actor", od, hidden, ad, c.activation, LayerInit::Torch, 0);
        let last = *hidden.last().expect("validated: one or more hidden layers");
        let log_std = named.len();
        named.extend(FlatMlp::init("log_std", last, &[], ad, c.activation, LayerInit::Torch, log_std).1);
        Ok((GaussianActor { net, log_std, low, high, obs_dim, act_dim, device }, named))
    }

    /// The Gaussian's mean and clamped log standard deviation on `obs` `[B, obs_dim]`: `([B, A], [B, A])`.
    /// With `bf16` the torso's matmuls run in bf16 ([`dense`]; the update's choice, acting's is f32).
    fn forward(&self, params: &FlatParams, obs: &Tensor, bf16: bool) -> (Tensor, Tensor) {
        let (layers, activation) = self.net.layout();
        let (torso, out) = layers.split_at(layers.len() - 1);
        let mut h = obs.shallow_clone();
        for &i in torso {
            h = activation.apply(&dense(&h, params.view_in(i, bf16), params.view_in(i + 1, bf16), bf16));
        }
        // Both heads in f32 on one cast of the torso's output.
        let h = if bf16 { h.to_kind(Kind::Float) } else { h };
        let mean = params.view(out[0] + 1).addmm(&h, params.view(out[0]));
        let log_std = params.view(self.log_std + 1).addmm(&h, params.view(self.log_std));
        (mean, log_std.clamp(LOG_STD_RANGE.0, LOG_STD_RANGE.1))
    }

    /// A reparameterised sample `tanh(μ + σ ε)` `[B, A]` for the standard-normal draws `eps` `[B, A]`, and the
    /// log standard deviation `[B, A]` it was drawn with.
    fn squashed(&self, params: &FlatParams, obs: &Tensor, eps: &Tensor, bf16: bool) -> (Tensor, Tensor) {
        let (mean, log_std) = self.forward(params, obs, bf16);
        (mean.addcmul(&log_std.exp(), eps).tanh(), log_std)
    }

    /// [`GaussianActor::squashed`] and the sample's log-probability `[B, 1]` with the tanh correction,
    /// `Σ_j [log N(u_j; μ_j, σ_j) − log(1 − a_j² + 10⁻⁶)]`, where `log N = −ε²/2 − log σ − ln √(2π)`: the draws'
    /// own part `Σ_j (−ε_j²/2) − A ln √(2π)` comes in `eps_density` `[B, 1]`, taken on the host with the draws
    /// ([`push_eps_densities`]), so the graph holds only the terms that depend on the parameters.
    fn sample(
        &self,
        params: &FlatParams,
        obs: &Tensor,
        (eps, eps_density): (&Tensor, &Tensor),
        bf16: bool,
    ) -> (Tensor, Tensor) {
        let (action, log_std) = self.squashed(params, obs, eps, bf16);
        // (1 − a²) + 10⁻⁶ in SB3's order: the 10⁻⁶ must not round into the 1 where tanh saturates.
        let squash = (action.square().neg() + 1.0 + 1e-6).log();
        let log_prob = eps_density - (log_std + squash).sum_dim_intlist(1, true, Kind::Float);
        (action, log_prob)
    }
}

impl ActingNet for GaussianActor {
    type Explore = ();

    fn dims(&self) -> (usize, usize) {
        (self.obs_dim, self.act_dim)
    }

    /// A sample scaled to the bounds, or without `explore` the mean's `tanh`. The mean runs without libtorch on
    /// CPU parameters.
    fn act(
        &self,
        params: &FlatParams,
        obs: ObsRef<'_>,
        warm_up: bool,
        explore: Option<&mut ()>,
        rng: &mut Pcg64,
        host: &mut (HostScratch, Vec<f32>),
        out: &mut ActOutput,
    ) -> Result<()> {
        let (obs, deterministic) = (f32_obs("sac", obs)?, explore.is_none());
        act_tanh(obs, self.obs_dim, (&self.low, &self.high), warm_up, None, rng, out, |rows, rng, actions| {
            let (scratch, raw) = host;
            if deterministic && self.net.forward_host(params, obs, rows, scratch, raw) {
                for (a, r) in actions.iter_mut().zip(raw.iter()) {
                    *a = r.tanh();
                }
                return Ok(());
            }
            let x = Tensor::f_from_slice(obs)?.f_view([rows as i64, self.obs_dim as i64])?.to_device(self.device);
            let a = tch::no_grad(|| {
                if deterministic {
                    self.forward(params, &x, false).0.tanh()
                } else {
                    // The draws go through `raw`, the host forward's output buffer (unused on this path).
                    raw.clear();
                    fill_standard_normal(rng, rows * self.act_dim, |_, e| raw.push(e as f32));
                    let eps = Tensor::from_slice(raw).view([rows as i64, -1]).to_device(self.device);
                    self.squashed(params, &x, &eps, false).0
                }
            });
            Ok(a.to_device(Device::Cpu).f_copy_data(actions, rows * self.act_dim)?)
        })
    }
}

/// A SAC agent: the actor, the critics and their targets, `log α`, three Adam optimisers, replay, RNG.
#[derive(Debug)]
pub struct Sac {
    config: SacConfig,
    pi: GaussianActor,
    actor: FlatParams,
    critic_net: Critics,
    critic: FlatParams,
    critic_target: FlatParams,
    /// Every critic's weights, detached (the actor loss's).
    critic_detached: Vec<Tensor>,
    /// `log α`, one value.
    log_alpha: FlatParams,
    target_entropy: f64,
    actor_opt: Adam,
    critic_opt: Adam,
    alpha_opt: Adam,
    data: ActionReplay,
    rng: Pcg64,
    /// One row per sampled transition, `[obs | action | next_obs | reward | bootstrap | ε | ε']`.
    batch: Vec<f32>,
    host: (HostScratch, Vec<f32>),
    parallel: DataParallel,
}

/// One gradient step's losses and mean Q, as scalar tensors (no device sync).
struct StepLosses {
    critic: Tensor,
    q: Tensor,
    actor: Tensor,
    alpha: Tensor,
}

impl Sac {
    /// A fresh agent for a bounded 1-D `Box` action space fed by `n_envs` envs.
    pub fn new(o: &Space, a: &Space, n_envs: usize, config: SacConfig, device: Device, seed: u64) -> Result<Self> {
        config.validate()?;
        let c = &config;
        // The actor's draws first, then the critics', from one seeded stream.
        let (pi, actor, critic_net, mut critic) = with_torch_seed(seed, || -> Result<_> {
            let (pi, actor) = GaussianActor::init(o, a, c, device)?;
            let dims = (pi.obs_dim as i64, pi.act_dim as i64);
            let spec = (c.n_critics, &c.hidden_sizes[..], c.activation);
            let (critic_net, q) = Critics::init("critic", dims, spec, 1, c.bf16 && device == Device::Cpu);
            Ok((pi, FlatParams::new(actor, device), critic_net, FlatParams::new(q, device)))
        })?;
        if critic_net.bf16 {
            // The detached critics below alias its bf16 copy; `step_on` refreshes every copy it reads.
            critic.refresh_bf16();
        }
        let log_alpha =
            FlatParams::new(vec![("log_ent_coef".into(), Tensor::from_slice(&[c.ent_coef.ln() as f32]))], device);
        Ok(Sac {
            target_entropy: c.target_entropy.unwrap_or(-(pi.act_dim as f64)),
            actor_opt: Adam::new(&actor, c.learning_rate, c.adam_eps),
            critic_opt: Adam::new(&critic, c.learning_rate, c.adam_eps),
            alpha_opt: Adam::new(&log_alpha, c.learning_rate, c.adam_eps),
            critic_target: critic.target_copy(),
            critic_detached: critic_net.detached(&critic, c.n_critics),
            data: ActionReplay::new(c.buffer_size, pi.obs_dim, (&pi.low, &pi.high), n_envs, c.gamma, c.train_freq)?,
            pi,
            actor,
            critic_net,
            critic,
            log_alpha,
            rng: Pcg64::seed_from_u64(seed ^ 0x5ac_0000),
            batch: Vec::new(),
            host: Default::default(),
            parallel: DataParallel::default(),
            config,
        })
    }

    /// The entropy coefficient α now.
    pub fn ent_coef(&self) -> f64 {
        f64::try_from(self.log_alpha.flat().exp().sum(Kind::Float)).unwrap_or(f64::NAN)
    }

    /// The online critics' parameters (the policy's are [`Algorithm::policy_params`]).
    pub fn critic_params(&self) -> &FlatParams {
        &self.critic
    }

    /// Sample a minibatch into `self.batch` (with its Gaussian draws) and take one gradient step on it.
    fn gradient_step(&mut self) -> Result<StepLosses> {
        let (ad, b) = (self.pi.act_dim, self.config.batch_size);
        let width = self.data.sample_rows(b, &mut self.rng, &mut self.batch, |rng, out| {
            fill_standard_normal(rng, 2 * ad, |_, e| out.push(e as f32));
            push_eps_densities(out, ad);
        })?;
        self.step_on(b, width)
    }

    /// One gradient step on explicit transitions rather than a replay sample (offline data, tests): `obs` /
    /// `next_obs` (`B` rows of `obs_dim`), `actions` in `[−1, 1]`, `rewards`, `bootstrap` (γ, 0 where the episode
    /// terminated) and the standard-normal draws of the policy's samples at `obs` and at `next_obs` (`eps`,
    /// `next_eps`: `B` rows of `act_dim` each). Returns the critic loss, the actor loss and α's loss.
    #[allow(clippy::too_many_arguments)]
    pub fn train_on(
        &mut self,
        obs: &[f32],
        actions: &[f32],
        rewards: &[f32],
        bootstrap: &[f32],
        next_obs: &[f32],
        eps: &[f32],
        next_eps: &[f32],
    ) -> Result<(f64, f64, f64)> {
        let (dims, b) = ((self.pi.obs_dim, self.pi.act_dim), rewards.len());
        let rows = Transitions { obs, actions, rewards, bootstrap, next_obs };
        rows.check("sac train_on", dims)?;
        for (what, got) in [("eps", eps.len()), ("next_eps", next_eps.len())] {
            check_len(&format!("sac train_on {what}"), got, b * dims.1)?;
        }
        self.parallel.check_batch("sac", "train_on batch", b)?;
        let mut row = 0;
        let width = rows.lay_out(dims, &mut self.batch, |out| {
            out.extend_from_slice(&eps[row * dims.1..(row + 1) * dims.1]);
            out.extend_from_slice(&next_eps[row * dims.1..(row + 1) * dims.1]);
            push_eps_densities(out, dims.1);
            row += 1;
        });
        let l = self.step_on(b, width)?;
        Ok((f64::try_from(&l.critic)?, f64::try_from(&l.actor)?, f64::try_from(&l.alpha)?))
    }

    /// SAC's update on the `rows` rows of `width` floats in `batch` (one per transition: `[obs | action | next_obs |
    /// reward | bootstrap | ε | ε′ | ε's density | ε′'s density]`, [`push_eps_densities`]): temperature, critics,
    /// actor, targets.
    fn step_on(&mut self, rows: usize, width: usize) -> Result<StepLosses> {
        let (od, ad, b) = (self.pi.obs_dim as i64, self.pi.act_dim as i64, rows as i64);
        let x = Tensor::f_from_slice(&self.batch)?.f_view([b, width as i64])?.to_device(self.pi.device);
        let (fused, bf16) = (self.config.fused_cpu, self.critic_net.bf16);
        let column = |start: i64, len: i64| x.narrow(1, start, len);
        let (obs, action, next_obs) = (column(0, od), column(od, ad), column(od + ad, od));
        let (reward, bootstrap) = (column(2 * od + ad, 1), column(2 * od + ad + 1, 1));
        let (eps, next_eps) = (column(2 * od + ad + 2, ad), column(2 * od + 2 * ad + 2, ad));
        let (density, next_density) = (column(2 * od + 3 * ad + 2, 1), column(2 * od + 3 * ad + 3, 1));
        let (parts, _) = self.parallel.micro_batches(b);
        let part =
            |t: &Tensor, (start, len): (i64, i64)| if len == b { t.shallow_clone() } else { t.narrow(0, start, len) };
        if bf16 {
            for p in [&mut self.actor, &mut self.critic, &mut self.critic_target] {
                p.refresh_bf16();
            }
        }
        // α as it stands before its own step weighs this step's losses (SB3).
        let alpha = self.log_alpha.flat().exp().detach();
        // (1) The policy at s, kept for the actor loss; the temperature's loss and step.
        let (mut sampled, mut alpha_losses) = (Vec::with_capacity(parts.len()), Vec::new());
        for (j, &p) in parts.iter().enumerate() {
            let (a_pi, log_prob) =
                self.pi.sample(&self.actor, &part(&obs, p), (&part(&eps, p), &part(&density, p)), bf16);
            if self.config.learn_ent_coef {
                let loss =
                    -(self.log_alpha.view(0) * (log_prob.detach() + self.target_entropy)).sum(Kind::Float) / b as f64;
                backward_alone(&mut self.log_alpha, &loss, 1.0, j > 0);
                alpha_losses.push(loss.detach());
            }
            sampled.push((a_pi, log_prob));
        }
        if self.config.learn_ent_coef {
            self.parallel.reduce_slot(2, &mut self.log_alpha)?;
            adam_step(&mut self.alpha_opt, &mut self.log_alpha, fused);
        }
        // (2) The critics against the soft target.
        let target = tch::no_grad(|| {
            let (next_action, next_log_prob) = self.pi.sample(&self.actor, &next_obs, (&next_eps, &next_density), bf16);
            let next_q = self.critic_net.forward(&self.critic_target, &Tensor::cat(&[&next_obs, &next_action], 1));
            reward.addcmul(&bootstrap, &(next_q.amin(1, true) - &alpha * next_log_prob))
        });
        let (mut critic_losses, mut qs) = (Vec::new(), Vec::new());
        for (j, &p) in parts.iter().enumerate() {
            let q = self.critic_net.forward(&self.critic, &Tensor::cat(&[part(&obs, p), part(&action, p)], 1));
            let loss = (&q - part(&target, p)).square().sum(Kind::Float) * (0.5 / b as f64);
            backward_alone(&mut self.critic, &loss, 1.0, j > 0);
            critic_losses.push(loss.detach());
            qs.push(q.detach());
        }
        self.parallel.reduce_slot(0, &mut self.critic)?;
        adam_step(&mut self.critic_opt, &mut self.critic, fused);
        if bf16 {
            self.critic.refresh_bf16();
        }
        // (3) The actor through the updated critics (detached weights: no critic gradient).
        let mut actor_losses = Vec::new();
        for (j, (&p, (a_pi, log_prob))) in parts.iter().zip(sampled).enumerate() {
            let q_pi = self.critic_net.forward_detached(&self.critic_detached, &Tensor::cat(&[part(&obs, p), a_pi], 1));
            let loss = (&alpha * log_prob - q_pi.amin(1, true)).sum(Kind::Float) / b as f64;
            backward_alone(&mut self.actor, &loss, 1.0, j > 0);
            actor_losses.push(loss.detach());
        }
        self.parallel.reduce_slot(1, &mut self.actor)?;
        adam_step(&mut self.actor_opt, &mut self.actor, fused);
        // (4) The critics' targets.
        let counters = &mut self.data.counters;
        if counters.critic_updates.is_multiple_of(self.config.target_update_interval) {
            polyak(&mut self.critic_target, &self.critic, self.config.tau, fused);
        }
        counters.critic_updates += 1;
        counters.actor_updates += 1;
        let total = |ts: Vec<Tensor>| Tensor::stack(&ts, 0).sum(Kind::Float);
        let alpha_loss = if alpha_losses.is_empty() { Tensor::from(0.0f32) } else { total(alpha_losses) };
        let q = Tensor::cat(&qs, 0).mean(Kind::Float);
        Ok(StepLosses { critic: total(critic_losses), q, actor: total(actor_losses), alpha: alpha_loss })
    }
}

/// After a row's draws `[ε | ε′]` (the last `2 · act_dim` values of `out`), their own parts of the Gaussian
/// log-density, `Σ_j (−ε_j²/2) − A ln √(2π)` for `ε` and for `ε′` ([`GaussianActor::sample`]).
fn push_eps_densities(out: &mut Vec<f32>, act_dim: usize) {
    let half_ln_two_pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let density = |e: &[f32]| {
        e.iter().map(|&x| -0.5 * f64::from(x) * f64::from(x)).sum::<f64>() - act_dim as f64 * half_ln_two_pi
    };
    let draws = &out[out.len() - 2 * act_dim..];
    let (now, next) = (density(&draws[..act_dim]) as f32, density(&draws[act_dim..]) as f32);
    out.extend([now, next]);
}

impl Policy for Sac {
    fn obs_dim(&self) -> usize {
        self.pi.obs_dim
    }

    fn act_dim(&self) -> usize {
        self.pi.act_dim
    }

    /// A sample of the policy scaled to the bounds (uniformly random before `learning_starts`); `tanh(μ)`
    /// unless exploring.
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        let explore = mode == ActMode::Explore;
        let random = explore && self.data.counters.env_steps < self.config.learning_starts;
        self.pi.act(&self.actor, obs, random, explore.then_some(&mut ()), &mut self.rng, &mut self.host, out)
    }
}

impl Algorithm for Sac {
    fn replicated(&mut self) -> Option<&mut dyn Replicated> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "sac"
    }

    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        self.data.observe("sac", chunks, |_| {})
    }

    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        let c = &self.config;
        let steps = self.data.phase_due(c.learning_starts, c.gradient_steps, progress);
        if steps == 0 {
            return Ok(None);
        }
        let losses = (0..steps).map(|_| self.gradient_step()).collect::<Result<Vec<_>>>()?;
        let of = |f: fn(&StepLosses) -> &Tensor| losses.iter().map(|l| f(l).shallow_clone()).collect::<Vec<_>>();
        let mut m = Metrics::default();
        m.push("losses/critic_loss", mean_of(&of(|l| &l.critic))?);
        m.push("losses/actor_loss", mean_of(&of(|l| &l.actor))?);
        m.push("losses/ent_coef_loss", mean_of(&of(|l| &l.alpha))?);
        m.push("charts/ent_coef", self.ent_coef());
        m.push("losses/q_values", mean_of(&of(|l| &l.q))?);
        m.push("charts/learning_rate", self.actor_opt.lr);
        m.push("charts/gradient_steps", steps as f64);
        Ok(Some(m))
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("actor.online", self.actor.flat());
        c.put_tensor("critic.online", self.critic.flat());
        c.put_tensor("critic.target", self.critic_target.flat());
        c.put_tensor("log_ent_coef", self.log_alpha.flat());
        self.actor_opt.write_to(&mut c, "actor_adam")?;
        self.critic_opt.write_to(&mut c, "critic_adam")?;
        self.alpha_opt.write_to(&mut c, "ent_coef_adam")?;
        self.data.write_to(&mut c)?;
        c.put_meta("rng", &self.rng)?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        // The metadata first: a checkpoint of another algorithm fails before anything changes.
        let rng = c.meta("rng")?;
        let counters = ActionReplay::counters_in(c)?;
        c.copy_into("actor.online", self.actor.flat())?;
        c.copy_into("critic.online", self.critic.flat())?;
        c.copy_into("critic.target", self.critic_target.flat())?;
        c.copy_into("log_ent_coef", self.log_alpha.flat())?;
        self.actor_opt.read_from(c, "actor_adam", &self.actor)?;
        self.critic_opt.read_from(c, "critic_adam", &self.critic)?;
        self.alpha_opt.read_from(c, "ent_coef_adam", &self.log_alpha)?;
        self.data.read_from(c, counters)?;
        self.rng = rng;
        Ok(())
    }

    /// The actor (the mean's MLP and the log-std head).
    fn policy_params(&self) -> &FlatParams {
        &self.actor
    }

    fn policy_params_mut(&mut self) -> &mut FlatParams {
        &mut self.actor
    }

    /// The deterministic actions `tanh(μ)`, in env units.
    fn teach(&mut self, obs: ObsRef<'_>) -> Result<Teaching> {
        let mut out = ActOutput::default();
        let x = f32_obs("sac", obs)?;
        self.pi.act(&self.actor, ObsRef::F32(x), false, None, &mut self.rng, &mut self.host, &mut out)?;
        let rows = (x.len() / self.pi.obs_dim) as i64;
        Ok(Teaching::new(TeachingKind::Actions, &Tensor::from_slice(&out.actions).view([rows, -1])))
    }
}

impl Replicated for Sac {
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()> {
        parallel.check_batch("sac", "batch_size", self.config.batch_size)?;
        self.parallel = parallel;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuous::bandit::{Bandit, OPTIMUM, spaces};
    use crate::nn::params::assert_params_close;

    fn tiny() -> SacConfig {
        SacConfig {
            batch_size: 32,
            buffer_size: 1_000,
            learning_starts: 64,
            hidden_sizes: vec![32, 32],
            gamma: 0.9,
            tau: 0.05,
            ..SacConfig::default()
        }
    }

    fn values(p: &FlatParams) -> Vec<f32> {
        Vec::try_from(p.flat().detach()).unwrap()
    }

    fn sac(config: SacConfig, n_envs: usize, seed: u64) -> Sac {
        let (o, a) = spaces();
        Sac::new(&o, &a, n_envs, config, Device::Cpu, seed).unwrap()
    }

    /// The log-probability of the squashed Gaussian against the change of variables done by hand, and the
    /// deterministic action `tanh(μ)`.
    #[test]
    fn squashed_gaussian_log_probability() {
        let agent = sac(tiny(), 1, 1);
        let obs = Tensor::from_slice(&[0.2f32, -0.4, 0.9, 0.1]).view([2, 2]);
        let eps = Tensor::from_slice(&[0.5f32, -1.5]).view([2, 1]);
        // One row's `[ε | ε′]` with act_dim 1 gives the densities of both rows' draws.
        let mut density = vec![0.5f32, -1.5];
        push_eps_densities(&mut density, 1);
        let density = Tensor::from_slice(&density[2..]).view([2, 1]);
        let (action, log_prob) = agent.pi.sample(&agent.actor, &obs, (&eps, &density), false);
        let (mean, log_std) = agent.pi.forward(&agent.actor, &obs, false);
        for r in 0..2 {
            let (m, s, e) =
                (mean.double_value(&[r, 0]), log_std.double_value(&[r, 0]).exp(), eps.double_value(&[r, 0]));
            let u = m + s * e;
            let density = (-0.5 * e * e).exp() / (s * (2.0 * std::f64::consts::PI).sqrt());
            let want = density.ln() - (1.0 - u.tanh().powi(2) + 1e-6).ln();
            assert!((action.double_value(&[r, 0]) - u.tanh()).abs() < 1e-6);
            assert!(
                (log_prob.double_value(&[r, 0]) - want).abs() < 1e-4,
                "{} vs {want}",
                log_prob.double_value(&[r, 0])
            );
        }
        let mut out = ActOutput::default();
        let mut a = sac(tiny(), 1, 1);
        a.act(ObsRef::F32(&[0.2, -0.4]), ActMode::Deterministic, &mut out).unwrap();
        let want = crate::continuous::unscale_action(mean.double_value(&[0, 0]).tanh() as f32, -1.0, 2.0);
        assert!((out.actions[0] - want).abs() < 1e-5);
    }

    #[test]
    fn learns_the_bandit_optimum_and_lowers_its_entropy() {
        let mut agent = sac(SacConfig { learning_starts: 200, ..tiny() }, 1, 5);
        let mut env = Bandit::new(5, 1, 1, true);
        let metrics = env.drive(&mut agent, 1_500, 1_500);
        let obs = env.draw();
        let mut out = ActOutput::default();
        agent.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut out).unwrap();
        assert!((out.actions[0] - OPTIMUM).abs() < 0.1, "action {:?}", out.actions);
        // α falls from 1 as the policy's entropy comes down to the target.
        let alpha = metrics.last().unwrap().get("charts/ent_coef").unwrap();
        assert!(alpha < 0.5, "α {alpha}");
        // Samples gather around the optimum.
        let mut spread = 0.0;
        for _ in 0..50 {
            agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            spread += (out.actions[0] - OPTIMUM).abs() / 50.0;
        }
        // (Uniform actions in [−1, 2] lie 0.78 from it on average.)
        assert!(spread < 0.45, "mean distance of samples {spread}");
    }

    #[test]
    fn fused_cpu_steps_match_libtorch() {
        let (mut fused, mut torch) = (sac(tiny(), 1, 3), sac(SacConfig { fused_cpu: false, ..tiny() }, 1, 3));
        let (mut env_f, mut env_t) = (Bandit::new(6, 1, 10, false), Bandit::new(6, 1, 10, false));
        let (mf, mt) = (env_f.drive(&mut fused, 104, 1_000), env_t.drive(&mut torch, 104, 1_000));
        assert_eq!(mf.len(), 40);
        for (a, b) in mf.iter().zip(&mt) {
            for &(key, x) in a.iter() {
                let y = b.get(key).unwrap();
                assert!((x - y).abs() <= 1e-4 * y.abs().max(1e-2), "{key} {x} vs {y}");
            }
        }
        for (what, x, y) in [
            ("actor", &fused.actor, &torch.actor),
            ("critic", &fused.critic, &torch.critic),
            ("critic target", &fused.critic_target, &torch.critic_target),
        ] {
            let a = assert_params_close(what, x, y, 1e-5);
            assert_ne!(a, values(y), "{what}: the host loops ran (float rounding tells the paths apart)");
        }
        assert_params_close("log α", &fused.log_alpha, &torch.log_alpha, 1e-5);
        assert_eq!(fused.data.counters, torch.data.counters);
    }

    #[test]
    fn checkpoint_round_trip_continues_bit_identically() {
        let mut agent = sac(tiny(), 2, 4);
        let mut env = Bandit::new(4, 2, 7, false);
        env.drive(&mut agent, 151, 1_000);
        let path = std::env::temp_dir().join(format!("flotilla-sac-ckpt-{}.safetensors", std::process::id()));
        agent.checkpoint().unwrap().save(&path).unwrap();
        let mut back = sac(tiny(), 2, 99);
        back.restore(&mut Checkpoint::load(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut env_copy = env.clone();
        let (a, b) = (env.drive(&mut agent, 60, 1_000), env_copy.drive(&mut back, 60, 1_000));
        assert_eq!(a, b, "same metrics");
        for (x, y) in [
            (&agent.actor, &back.actor),
            (&agent.critic, &back.critic),
            (&agent.critic_target, &back.critic_target),
            (&agent.log_alpha, &back.log_alpha),
        ] {
            assert_eq!(values(x), values(y));
        }
        assert_eq!(agent.data.counters, back.data.counters);
        // Exploring draws continue from the same generator state too.
        let (mut x, mut y) = (ActOutput::default(), ActOutput::default());
        agent.act(ObsRef::F32(&[0.1, 0.2, 0.3, 0.4]), ActMode::Explore, &mut x).unwrap();
        back.act(ObsRef::F32(&[0.1, 0.2, 0.3, 0.4]), ActMode::Explore, &mut y).unwrap();
        assert_eq!(x.actions, y.actions);
        // A TD3 checkpoint does not fit.
        let (o, act) = spaces();
        let td3 = crate::td3::Td3::td3(&o, &act, 2, Default::default(), Device::Cpu, 0).unwrap();
        assert!(back.restore(&mut td3.checkpoint().unwrap()).is_err());
    }

    /// Mixed precision (bf16 hidden layers, forced here whatever the CPU) takes f32's step to bf16's rounding:
    /// the same losses within 2 %, and each network moved the same way (cosine of the parameter changes, from
    /// the same start and batch, above 0.95) over three steps.
    #[test]
    fn a_bf16_step_follows_the_f32_step() {
        let config = |bf16| SacConfig { bf16, hidden_sizes: vec![64, 64], ..tiny() };
        let (mut f32s, mut mixed) = (sac(config(false), 1, 5), sac(config(true), 1, 5));
        assert!(mixed.critic_net.bf16 && !f32s.critic_net.bf16);
        let (od, ad, b) = (mixed.pi.obs_dim, mixed.pi.act_dim, 64);
        let before = [values(&f32s.actor), values(&f32s.critic)];
        for step in 0..3 {
            let [o, a, r, g, n] = crate::continuous::bandit::random_rows(step, b, od, ad);
            let eps: Vec<f32> = (0..b * ad).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
            let x = f32s.train_on(&o, &a, &r, &g, &n, &eps, &eps).unwrap();
            let y = mixed.train_on(&o, &a, &r, &g, &n, &eps, &eps).unwrap();
            for (what, p, q) in [("critic", x.0, y.0), ("actor", x.1, y.1), ("α", x.2, y.2)] {
                assert!((p - q).abs() <= 0.02 * p.abs().max(1e-2), "step {step} {what} loss: f32 {p}, bf16 {q}");
            }
        }
        for (k, (what, p, q)) in
            [("actor", &f32s.actor, &mixed.actor), ("critic", &f32s.critic, &mixed.critic)].into_iter().enumerate()
        {
            assert_ne!(values(p), values(q), "{what}: bf16 ran (its rounding shows)");
            let cos = crate::continuous::bandit::cosine_of_changes(&before[k], &values(p), &values(q));
            assert!(cos > 0.95, "{what}: bf16's change against f32's, cosine {cos}");
        }
    }

    /// Two micro-batches accumulate the gradient of the whole minibatch.
    #[test]
    fn accumulated_micro_batches_step_as_one_batch() {
        // f32: bf16's rounding of a row may differ with the matmul's row count (oneDNN's blocking).
        let mut one = sac(SacConfig { fused_cpu: false, bf16: false, ..tiny() }, 1, 8);
        let mut two = sac(SacConfig { fused_cpu: false, bf16: false, ..tiny() }, 1, 8);
        two.set_data_parallel(DataParallel::new(None, 2).unwrap()).unwrap();
        let (mut e1, mut e2) = (Bandit::new(9, 1, 5, false), Bandit::new(9, 1, 5, false));
        let (m1, m2) = (e1.drive(&mut one, 90, 1_000), e2.drive(&mut two, 90, 1_000));
        assert_eq!(m1.len(), 26);
        for (a, b) in m1.iter().zip(&m2) {
            for &(key, x) in a.iter() {
                let y = b.get(key).unwrap();
                assert!((x - y).abs() <= 1e-4 * y.abs().max(1e-2), "{key} {x} vs {y}");
            }
        }
        assert_params_close("actor", &one.actor, &two.actor, 1e-5);
        assert_params_close("critic", &one.critic, &two.critic, 1e-5);
    }

    #[test]
    fn random_warm_up_then_samples_within_bounds() {
        let mut agent = sac(tiny(), 3, 2);
        let mut out = ActOutput::default();
        let obs = [0.3f32, -0.2, 0.5, 0.5, -0.9, 0.9];
        agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
        let warm: Vec<f32> = out.actions.clone();
        assert!(warm.iter().all(|a| (-1.0..=2.0).contains(a)));
        agent.data.counters.env_steps = 64;
        for _ in 0..20 {
            agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            assert!(out.actions.iter().all(|a| (-1.0..=2.0).contains(a)), "{:?}", out.actions);
        }
        assert!(agent.act(ObsRef::F32(&obs[..5]), ActMode::Explore, &mut out).is_err());
    }

    #[test]
    fn config_validation_names_the_field() {
        for (bad, field) in [
            (SacConfig { ent_coef: 0.0, ..tiny() }, "ent_coef"),
            (SacConfig { batch_size: 0, ..tiny() }, "batch_size"),
            (SacConfig { buffer_size: 8, ..tiny() }, "buffer_size"),
            (SacConfig { tau: 0.0, ..tiny() }, "tau"),
            (SacConfig { hidden_sizes: vec![], ..tiny() }, "hidden_sizes"),
            (SacConfig { target_entropy: Some(f64::NAN), ..tiny() }, "target_entropy"),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }
}
