//! Twin Delayed DDPG (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods")
//! and DDPG (Lillicrap et al. 2016, "Continuous control with deep reinforcement learning"), one implementation:
//! as in SB3, DDPG is TD3 with one critic, `policy_delay = 1` and no target policy smoothing.
//!
//! Implementation details that matter (SB3's `TD3` / `DDPG`):
//! * the actor is an MLP ending in `tanh`: actions live in `[−1, 1]` and are scaled to the Box bounds only when
//!   handed to the env; replay stores the `[−1, 1]` action, as [`crate::continuous`] says;
//! * exploration: uniformly random actions before `learning_starts` env steps, then the actor's action; in
//!   both cases plus Gaussian or Ornstein–Uhlenbeck noise ([`crate::continuous::action_noise`], σ in `[−1, 1]` units, OU
//!   state per env, reset when its episode ends), clipped to `[−1, 1]`;
//! * every `train_freq` vectorised steps once more than `learning_starts` env steps were taken,
//!   `gradient_steps` updates, each: critic target `y = r + γ (1 − terminated) min_j Q̄_j(s', clip(π̄(s') + ε,
//!   −1, 1))` with `ε = clip(N(0, σ̃²), −c, c)` (target policy smoothing; 0 for DDPG), critic loss
//!   `Σ_j MSE(Q_j(s, a), y)`; every `policy_delay`-th update (counted over the whole run) the actor loss
//!   `−mean Q_1(s, π(s))` and Polyak updates (τ) of the actor *and* critic targets; truncated episodes
//!   bootstrap from the true final observation;
//! * all critics share one parameter buffer (one Adam step, one Polyak op); the actor loss reads critic 1
//!   through detached aliases of its weights, so no critic weight gradient is computed there; gradients are
//!   written straight into each buffer's `.grad()` (`GradSink`); separate Adam optimisers (PyTorch
//!   defaults, ε 1e-8) for actor and critics; PyTorch's default `nn.Linear` initialisation
//!   ([`LayerInit::Torch`]).
//!
//! Defaults are RL Zoo's Pendulum-v1 (`td3.yml` / `ddpg.yml`, same for both): 400-300 ReLU MLPs, lr 1e-3,
//! batch 256, buffer 200 K, learning starts 10 K, γ 0.98, τ 0.005, train every step with 1 gradient step,
//! Gaussian noise σ 0.1; TD3: 2 critics, policy delay 2, target noise 0.2 clipped at 0.5.
//!
//! Metrics: `losses/critic_loss`, `losses/actor_loss` (mean over this update's actor steps; the latest one
//! when the delay skipped them all, so every row has the same columns; NaN before the first),
//! `losses/q_values` (mean `Q_j(s, a)` over critics and batch), `charts/learning_rate`,
//! `charts/gradient_steps` (critic updates in this call).

use flotilla_core::{Chunk, ObsRef, Space};
use rand::SeedableRng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Reduction, Tensor};

use crate::acting::{Acting, ActingNet, ActingSetup, WarmupPolicy};
use crate::algorithm::Algorithm;
use crate::checkpoint::Checkpoint;
use crate::continuous::action_noise::{ActionNoise, NoiseType, fill_standard_normal};
use crate::continuous::{
    ActionReplay, Critics, Transitions, act_tanh, action_bounds, activate, adam_step, cat_or_one, mean_of, polyak,
    sum_of,
};
use crate::error::Checks;
use crate::export::{Architecture, Network, PolicyOutput, unsupported};
use crate::kind::{AlgorithmKind, members_as};
use crate::nn::data_parallel::DataParallel;
use crate::nn::host_mlp::HostScratch;
use crate::nn::members::{Rows, backward_alone, batched_mlp, member_views, mlp_operands, per_member, shared_rows};
use crate::nn::nets::{Activation, FlatMlp, LayerInit, cpu_has_native_bf16, mlp_input_dim, with_torch_seed};
use crate::nn::optimiser::{Adam, StackedAdam};
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy, f32_obs};
use crate::progress::Progress;
use crate::{Error, Metrics, Result};

/// TD3's and DDPG's configs from one field list: DDPG has every field but the `td3` ones, which it runs at the
/// values given there (one critic, no delay, no target policy smoothing).
macro_rules! td3_configs {
    (
        shared { $($(#[$sm:meta])* $s:ident: $st:ty,)* }
        td3 { $($(#[$tm:meta])* $t:ident: $tt:ty = $ddpg:expr,)* }
        shared { $($(#[$lm:meta])* $l:ident: $lt:ty,)* }
    ) => {
        /// TD3 hyperparameters. `Default` is RL Zoo's Pendulum-v1 TD3.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Td3Config {
            $($(#[$sm])* pub $s: $st,)*
            $($(#[$tm])* pub $t: $tt,)*
            $($(#[$lm])* pub $l: $lt,)*
        }

        /// DDPG hyperparameters. `Default` is RL Zoo's Pendulum-v1 DDPG.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct DdpgConfig {
            $($(#[$sm])* pub $s: $st,)*
            $($(#[$lm])* pub $l: $lt,)*
        }

        /// DDPG as TD3 runs it.
        impl From<DdpgConfig> for Td3Config {
            fn from(c: DdpgConfig) -> Self {
                Td3Config { $($s: c.$s,)* $($t: $ddpg,)* $($l: c.$l,)* }
            }
        }
    };
}

td3_configs! {
    shared {
        /// Adam learning rate (actor and critics).
        learning_rate: f64,
        /// Adam ε.
        adam_eps: f64,
        /// Transitions per gradient step.
        batch_size: usize,
        /// Replay capacity (transitions).
        buffer_size: usize,
        /// Env steps of uniformly random actions before learning starts.
        learning_starts: u64,
        /// Discount factor γ.
        gamma: f64,
        /// Polyak coefficient of the target updates.
        tau: f64,
        /// Vectorised env steps between training phases.
        train_freq: u64,
        /// Gradient steps per training phase.
        gradient_steps: usize,
        /// Exploration noise added to the actor's `[−1, 1]` action.
        noise_type: NoiseType,
        /// σ of the exploration noise, in units of the `[−1, 1]` action.
        noise_std: f64,
        /// Hidden layer widths of the actor and of each critic.
        hidden_sizes: Vec<i64>,
        /// Hidden nonlinearity.
        activation: Activation,
    }
    td3 {
        /// Critics; the target is the minimum of their target networks (clipped double-Q with 2).
        n_critics: usize = 1,
        /// Critic updates per actor and target update.
        policy_delay: u64 = 1,
        /// σ̃ of the Gaussian noise added to the target action (target policy smoothing), `[−1, 1]` units.
        target_policy_noise: f64 = 0.0,
        /// The target-action noise is clipped to `[−c, c]`.
        target_noise_clip: f64 = 0.0,
    }
    shared {
        /// `[[tasks]]` runs: an action head on the actor and a Q head on each critic per task (the shared
        /// torsos as in multi-task DQN), each observation reading its task's by the one-hot ending it (else one
        /// head for all tasks, told apart by the one-hot input alone).
        task_heads: bool,
        /// The run's task count, set from `[[tasks]]` when the experiment config is parsed (not a setting).
        #[serde(skip)]
        tasks: usize,
        /// On the CPU, take each Adam step and each Polyak target update as one host loop over the flat buffers
        /// (one pass over memory) instead of libtorch's several elementwise ops; the forward and backward passes
        /// stay on libtorch (MKL's matmuls, compute-bound at these sizes). Same maths to float rounding; `false`
        /// runs everything on libtorch. Layers frozen or buffers off the CPU: libtorch.
        fused_cpu: bool,
        /// Mixed precision for the update on the CPU: the hidden layers' matmuls in bf16 as PyTorch's CPU autocast
        /// runs a linear layer, with the parameters, their gradients, the optimiser and the output layers in f32.
        /// Default: on where the CPU computes bf16 natively (AVX512-BF16 or AMX; [`cpu_has_native_bf16`]), off
        /// elsewhere (libtorch would emulate it, several times slower than f32). Acting stays f32; ignored on CUDA.
        bf16: bool,
    }
}

impl Default for Td3Config {
    fn default() -> Self {
        let d = DdpgConfig::default();
        Td3Config { n_critics: 2, policy_delay: 2, target_policy_noise: 0.2, target_noise_clip: 0.5, ..d.into() }
    }
}

impl Default for DdpgConfig {
    fn default() -> Self {
        DdpgConfig {
            learning_rate: 1e-3,
            adam_eps: 1e-8,
            batch_size: 256,
            buffer_size: 200_000,
            learning_starts: 10_000,
            gamma: 0.98,
            tau: 0.005,
            train_freq: 1,
            gradient_steps: 1,
            noise_type: NoiseType::Normal,
            noise_std: 0.1,
            hidden_sizes: vec![400, 300],
            activation: Activation::Relu,
            task_heads: false,
            tasks: 0,
            fused_cpu: true,
            bf16: cpu_has_native_bf16(),
        }
    }
}

/// TD3's answers, for its config and DDPG's (`name`: which of the two; `learner` builds the agent).
macro_rules! td3_kind {
    ($config:ty, $name:literal, $td3:expr, $learner:path) => {
        impl $config {
            /// Range checks serde cannot express.
            pub fn validate(&self) -> Result<()> {
                $td3(self).validate_as($name)
            }
        }

        impl AlgorithmKind for $config {
            fn validate(&self, _num_envs: usize) -> Result<()> {
                <$config>::validate(self)
            }

            fn set_tasks(&mut self, tasks: usize) {
                self.tasks = tasks;
            }

            fn mlp_bf16(&self) -> bool {
                self.bf16
            }

            fn learner(&self, o: &Space, a: &Space, n: usize, device: Device, seed: u64) -> Result<Box<dyn Algorithm>> {
                Ok(Box::new($learner(o, a, n, self.clone(), device, seed)?))
            }

            fn architecture(&self, o: &Space, a: &Space) -> Result<Architecture> {
                architecture(&$td3(self), $name, o, a)
            }

            fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
                let ActingSetup { observation_space: o, action_space: a, n_envs, seed, .. } = *setup;
                let c = $td3(self);
                c.validate_as($name)?;
                let (pi, named) = with_torch_seed(seed, || ActorNet::init($name, o, a, &c, Device::Cpu))?;
                let noise = ActionNoise::new(c.noise_type, c.noise_std, n_envs, pi.act_dim);
                let policy = WarmupPolicy::new(pi, named, noise, c.learning_starts, seed ^ 0x7d3_ac70);
                Ok(Acting::Chunks(Box::new(policy)))
            }

            fn update_members(
                &self,
                members: &mut [&mut dyn Algorithm],
                progress: &Progress,
            ) -> Result<Option<Vec<Option<Metrics>>>> {
                members_as::<Td3>(members).map(|mut m| update_members(&mut m, progress)).transpose()
            }
        }
    };
}

td3_kind!(Td3Config, "td3", Td3Config::clone, Td3::td3);
td3_kind!(DdpgConfig, "ddpg", |c: &DdpgConfig| Td3Config::from(c.clone()), Td3::ddpg);

/// The exported architecture of the actor ([`ActorNet`]); `algorithm` is `ddpg` or `td3`.
fn architecture(c: &Td3Config, algorithm: &str, o: &Space, a: &Space) -> Result<Architecture> {
    let (low, high) = match a {
        Space::Box { low, high, shape, .. } if shape.len() == 1 => (low, high),
        _ => return Err(unsupported("td3", format!("{a:?}: needs a 1-D box"))),
    };
    let network = Network::mlp("actor", mlp_input_dim("td3", o)?, &c.hidden_sizes, low.len() * c.heads(), c.activation);
    let policy = PolicyOutput::TanhScaled { low: low.clone(), high: high.clone() };
    Ok(Architecture::new(algorithm, network, policy, c.heads(), o, a))
}

impl Td3Config {
    /// Range checks serde cannot express; errors name `algorithm`.
    fn validate_as(&self, algorithm: &'static str) -> Result<()> {
        Checks::of(algorithm)
            .task_heads(self.task_heads, self.tasks)
            .adam(self.learning_rate, self.adam_eps)
            .replay(self.batch_size, self.buffer_size, self.train_freq, self.gradient_steps)
            .targets(self.gamma, self.tau)
            .non_negative("noise_std", self.noise_std)
            .widths("hidden_sizes", &self.hidden_sizes)
            .at_least_one("n_critics", self.n_critics)
            .at_least_one("policy_delay", self.policy_delay)
            .non_negative("target_policy_noise", self.target_policy_noise)
            .non_negative("target_noise_clip", self.target_noise_clip)
            .done()
    }

    /// Heads per network: the task count with `task_heads`, else 1.
    fn heads(&self) -> usize {
        if self.task_heads { self.tasks.max(1) } else { 1 }
    }

    /// Whether target actions get clipped Gaussian noise (a zero clip or σ̃ leaves them unchanged).
    pub(crate) fn smoothing(&self) -> bool {
        self.target_policy_noise > 0.0 && self.target_noise_clip > 0.0
    }
}

/// Each replay row's target-action noise (TD3's smoothing; nothing for DDPG): `act_dim` draws of
/// `clip(N(0, σ̃²), −c, c)`.
fn target_noise(c: &Td3Config, act_dim: usize) -> impl Fn(&mut Pcg64, &mut Vec<f32>) + use<> {
    let (smoothing, sigma, clip) = (c.smoothing(), c.target_policy_noise, c.target_noise_clip);
    move |rng, out| {
        if smoothing {
            fill_standard_normal(rng, act_dim, |_, e| out.push((sigma * e).clamp(-clip, clip) as f32));
        }
    }
}

/// A DDPG or TD3 agent: actor and critics with their targets, optimisers, replay, exploration noise, RNG.
#[derive(Debug)]
pub struct Td3 {
    name: &'static str,
    pub(crate) config: Td3Config,
    pub(crate) pi: ActorNet,
    pub(crate) actor: FlatParams,
    pub(crate) actor_target: FlatParams,
    pub(crate) critic_net: Critics,
    pub(crate) critic: FlatParams,
    pub(crate) critic_target: FlatParams,
    /// Critic 1 of `critic`, detached (for the actor loss).
    critic_first: Vec<Tensor>,
    pub(crate) actor_opt: Adam,
    pub(crate) critic_opt: Adam,
    /// Replay of `[−1, 1]` actions and the schedule's counters.
    pub(crate) data: ActionReplay,
    noise: ActionNoise,
    pub(crate) rng: Pcg64,
    /// One row per sampled transition, `[obs | action | next_obs | reward | bootstrap | target noise]`:
    /// the whole batch goes to the device as one tensor.
    pub(crate) batch: Vec<f32>,
    /// Acting's host forward pass: hidden activations and the actor network's raw output.
    host: (HostScratch, Vec<f32>),
    /// Data-parallel replicas (critic and actor gradients averaged) and micro-batches per step.
    pub(crate) parallel: DataParallel,
}

impl Td3 {
    /// A fresh DDPG agent for a bounded 1-D `Box` action space fed by `n_envs` envs.
    pub fn ddpg(
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        config: DdpgConfig,
        device: Device,
        seed: u64,
    ) -> Result<Self> {
        Self::build("ddpg", observation_space, action_space, n_envs, config.into(), device, seed)
    }

    /// A fresh TD3 agent for a bounded 1-D `Box` action space fed by `n_envs` envs.
    #[allow(clippy::self_named_constructors)] // `Td3::td3` next to `Td3::ddpg` names the algorithm built.
    pub fn td3(
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        config: Td3Config,
        device: Device,
        seed: u64,
    ) -> Result<Self> {
        Self::build("td3", observation_space, action_space, n_envs, config, device, seed)
    }

    fn build(
        name: &'static str,
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        config: Td3Config,
        device: Device,
        seed: u64,
    ) -> Result<Self> {
        config.validate_as(name)?;
        let c = &config;
        // The actor's draws first, then the critics', from one seeded stream.
        let (pi, actor, critic_net, mut critic) = with_torch_seed(seed, || -> Result<_> {
            let (pi, a) = ActorNet::init(name, observation_space, action_space, c, device)?;
            let dims = (pi.obs_dim as i64, pi.act_dim as i64);
            let spec = (c.n_critics, &c.hidden_sizes[..], c.activation);
            let (critic_net, q) = Critics::init("critic", dims, spec, c.heads(), c.bf16 && device == Device::Cpu);
            Ok((pi, FlatParams::new(a, device), critic_net, FlatParams::new(q, device)))
        })?;
        if critic_net.bf16 {
            // Critic 1's detached weights below alias its bf16 copy; each step refreshes every copy it reads
            // (`Td3Nets::refresh_bf16`).
            critic.refresh_bf16();
        }
        Ok(Td3 {
            name,
            host: Default::default(),
            actor_opt: Adam::new(&actor, c.learning_rate, c.adam_eps),
            critic_opt: Adam::new(&critic, c.learning_rate, c.adam_eps),
            actor_target: actor.target_copy(),
            critic_target: critic.target_copy(),
            critic_first: critic_net.detached(&critic, 1),
            data: ActionReplay::new(c.buffer_size, pi.obs_dim, (&pi.low, &pi.high), n_envs, c.gamma, c.train_freq)?,
            noise: ActionNoise::new(c.noise_type, c.noise_std, n_envs, pi.act_dim),
            pi,
            actor,
            critic_net,
            critic,
            rng: Pcg64::seed_from_u64(seed ^ 0x7d3_0000),
            batch: Vec::new(),
            parallel: DataParallel::default(),
            config,
        })
    }

    /// The online critics' parameters (the policy's are [`Algorithm::policy_params`]).
    pub fn critic_params(&self) -> &FlatParams {
        &self.critic
    }

    /// One gradient step on explicit transitions rather than a replay sample (offline data, tests):
    /// `obs` / `next_obs` (`B` rows of `obs_dim`), `actions` already in `[−1, 1]` (`B` rows of `act_dim`),
    /// `rewards`, and `bootstrap` (γ, 0 where the episode terminated). The critic steps; with `update_actor`
    /// so do the actor and the Polyak targets (TD3's delay is [`Algorithm::update`]'s business). Target-action
    /// noise, where configured, is drawn as for a replay sample. Returns the critic loss and the actor loss.
    pub fn train_on(
        &mut self,
        obs: &[f32],
        actions: &[f32],
        rewards: &[f32],
        bootstrap: &[f32],
        next_obs: &[f32],
        update_actor: bool,
    ) -> Result<(f64, Option<f64>)> {
        let (dims, b) = (self.pi.dims(), rewards.len());
        let rows = Transitions { obs, actions, rewards, bootstrap, next_obs };
        rows.check(&format!("{} train_on", self.name), dims)?;
        self.parallel.check_batch(self.name, "train_on batch", b)?;
        let (noise, rng) = (target_noise(&self.config, self.pi.act_dim), &mut self.rng);
        let width = rows.lay_out(dims, &mut self.batch, |out| noise(rng, out));
        let x = Tensor::f_from_slice(&self.batch)?.f_view([1, b as i64, width as i64])?.to_device(self.pi.device);
        let (critic, _, actor) = td3_step(&mut Td3Nets::Alone(self), &x, update_actor)?;
        self.data.counters.critic_updates += 1;
        self.data.counters.actor_updates += u64::from(update_actor);
        let scalar = |t: Tensor| f64::try_from(t.squeeze_dim(0));
        Ok((scalar(critic)?, actor.map(scalar).transpose()?))
    }
}

/// TD3's (and DDPG's) networks on the member axis ([`crate::nn::members`]): one agent's own (task heads,
/// replicas, micro-batches, the host Adam and Polyak loops of `fused_cpu`), or a population's plain MLPs
/// stacked.
enum Td3Nets<'a> {
    Alone(&'a mut Td3),
    Stacked(&'a mut StackedTd3),
}

/// The actor or the critics.
#[derive(Clone, Copy)]
enum Net {
    Actor,
    Critic,
}

impl Td3Nets<'_> {
    /// The first member (all share shapes and schedules).
    fn dims(&self) -> (i64, i64, bool) {
        match self {
            Td3Nets::Alone(m) => (m.pi.obs_dim as i64, m.pi.act_dim as i64, m.config.smoothing()),
            Td3Nets::Stacked(s) => s.dims,
        }
    }

    /// `π(obs)` `[N, B, act_dim]` in `[−1, 1]` on `[N, B, obs_dim]`, online or (`target`) the target actor.
    fn actor(&self, obs: &Tensor, target: bool) -> Tensor {
        match self {
            Td3Nets::Alone(m) => {
                let params = if target { &m.actor_target } else { &m.actor };
                m.pi.forward(params, &obs.squeeze_dim(0), m.critic_net.bf16).unsqueeze(0)
            }
            Td3Nets::Stacked(s) => {
                let views = if target { &s.actor.target_views } else { &s.actor.online.views };
                batched_mlp(&mlp_operands(views), &s.actor_layers, &|h| s.activation.apply(h), obs, s.bf16).tanh()
            }
        }
    }

    /// Every critic on `[N, B, obs + act]`: `[N, B, n_critics]`, online or (`target`) the targets.
    fn critics(&self, x: &Tensor, target: bool) -> Tensor {
        match self {
            Td3Nets::Alone(m) => {
                m.critic_net.forward(if target { &m.critic_target } else { &m.critic }, &x.squeeze_dim(0)).unsqueeze(0)
            }
            Td3Nets::Stacked(s) => {
                let views = if target { &s.critic.target_views } else { &s.critic.online.views };
                let (params, hidden) = (mlp_operands(views), |h: &Tensor| s.activation.apply(h));
                cat_or_one(s.critic_layers.iter().map(|l| batched_mlp(&params, l, &hidden, x, s.bf16)).collect(), 2)
            }
        }
    }

    /// Critic 1 on `[N, B, obs + act]` with its weights detached (the actor loss's): `[N, B, 1]`.
    fn first_critic(&self, x: &Tensor) -> Tensor {
        match self {
            Td3Nets::Alone(m) => m.critic_net.forward_detached(&m.critic_first, &x.squeeze_dim(0)).unsqueeze(0),
            Td3Nets::Stacked(s) => {
                let activation = s.activation;
                let first = |h: &Tensor| activate(activation, h.shallow_clone());
                batched_mlp(&mlp_operands(&s.first_views), &s.critic_layers[0], &first, x, s.bf16)
            }
        }
    }

    /// Bring a member alone's bf16 copies up to date ([`FlatParams::refresh_bf16`]): every network's, or only
    /// the online critics' (`critics_only`, after their step); stacked members cast as they go.
    fn refresh_bf16(&mut self, critics_only: bool) {
        if let Td3Nets::Alone(m) = self
            && m.critic_net.bf16
        {
            m.critic.refresh_bf16();
            if !critics_only {
                m.critic_target.refresh_bf16();
                m.actor.refresh_bf16();
                m.actor_target.refresh_bf16();
            }
        }
    }

    /// A minibatch of `len` rows as micro-batches `(start, len)`, and the scale of each one's mean.
    fn micro_batches(&self, len: i64) -> (Vec<(i64, i64)>, f64) {
        match self {
            Td3Nets::Alone(m) => m.parallel.micro_batches(len),
            Td3Nets::Stacked(_) => (vec![(0, len)], 1.0),
        }
    }

    /// Each member's gradient of its loss (`[N]`) for `net`, added with `add`.
    fn backward(&mut self, net: Net, losses: &Tensor, add: bool) {
        match (self, net) {
            (Td3Nets::Alone(m), Net::Actor) => backward_alone(&mut m.actor, losses, 1.0, add),
            (Td3Nets::Alone(m), Net::Critic) => backward_alone(&mut m.critic, losses, 1.0, add),
            (Td3Nets::Stacked(s), Net::Actor) => s.actor.online.backward(losses),
            (Td3Nets::Stacked(s), Net::Critic) => s.critic.online.backward(losses),
        }
    }

    /// `net`'s gradients averaged over replicas, then one Adam step of every member (TD3 clips nothing).
    fn step(&mut self, net: Net) -> Result<()> {
        match self {
            Td3Nets::Alone(m) => {
                let fused = m.config.fused_cpu;
                let (params, opt, slot) = match net {
                    Net::Actor => (&mut m.actor, &mut m.actor_opt, 1),
                    Net::Critic => (&mut m.critic, &mut m.critic_opt, 0),
                };
                m.parallel.reduce_slot(slot, params)?;
                adam_step(opt, params, fused);
            }
            Td3Nets::Stacked(s) => match net {
                Net::Actor => s.actor.adam_step(),
                Net::Critic => s.critic.adam_step(),
            },
        }
        Ok(())
    }

    /// The Polyak updates of both targets, each member with its τ.
    fn polyak(&mut self) {
        match self {
            Td3Nets::Alone(m) => {
                let (tau, fused) = (m.config.tau, m.config.fused_cpu);
                polyak(&mut m.critic_target, &m.critic, tau, fused);
                polyak(&mut m.actor_target, &m.actor, tau, fused);
            }
            Td3Nets::Stacked(s) => {
                s.critic.polyak(&s.taus);
                s.actor.polyak(&s.taus);
            }
        }
    }
}

/// TD3's gradient step, written once over the member axis, on each member's minibatch `x` (`[N, B, width]`
/// rows `[obs | action | next_obs | reward | bootstrap | target noise]`): the critics' loss Σ_j MSE(Q_j, y)
/// against `y = r + γ (1 − terminated) min_j Q̄_j(s', ã')` (ã' the target actor's action, smoothed by the noise
/// where configured), summed over critics and a mean over the batch, and an Adam step; with `update_actor`,
/// the actor's loss `−mean Q₁(s, π(s))` (critic 1 just updated, its weights detached), its Adam step and both
/// Polyak updates. Returns each member's critic loss `[N]`, mean Q `[N]` and actor loss.
fn td3_step(nets: &mut Td3Nets, x: &Tensor, update_actor: bool) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let ((od, ad, smoothing), b) = (nets.dims(), x.size()[1]);
    let obs = x.narrow(2, 0, od);
    let next_obs = x.narrow(2, od + ad, od);
    nets.refresh_bf16(false);
    let target = tch::no_grad(|| {
        let mut next_action = nets.actor(&next_obs, true);
        if smoothing {
            next_action = (next_action + x.narrow(2, 2 * od + ad + 2, ad)).clamp(-1.0, 1.0);
        }
        let next_q = nets.critics(&Tensor::cat(&[&next_obs, &next_action], 2), true);
        x.narrow(2, 2 * od + ad, 1).addcmul(&x.narrow(2, 2 * od + ad + 1, 1), &next_q.amin(2, true))
    });
    // With micro-batches (accumulate = k), each one's sum over the batch size adds up to the loss.
    let micro =
        |t: &Tensor, (start, len): (i64, i64)| if len == b { t.shallow_clone() } else { t.narrow(1, start, len) };
    let (micro_batches, scale) = nets.micro_batches(b);
    let dims = [1i64, 2];
    let (mut critic_losses, mut qs) = (Vec::new(), Vec::new());
    for (j, &part) in micro_batches.iter().enumerate() {
        let q = nets.critics(&micro(x, part).narrow(2, 0, od + ad), false);
        let squared = q.mse_loss(&micro(&target, part).expand_as(&q), Reduction::None);
        let loss = squared.sum_dim_intlist(dims.as_slice(), false, Kind::Float) / b as f64;
        nets.backward(Net::Critic, &loss, j > 0);
        critic_losses.push(loss.detach());
        qs.push(q.detach());
    }
    nets.step(Net::Critic)?;
    let actor_loss = if update_actor {
        nets.refresh_bf16(true);
        let mut losses = Vec::new();
        for (j, &part) in micro_batches.iter().enumerate() {
            let obs = micro(&obs, part);
            let action = nets.actor(&obs, false);
            let q1 = nets.first_critic(&Tensor::cat(&[&obs, &action], 2));
            let mut loss = -q1.mean_dim(dims.as_slice(), false, Kind::Float);
            if scale != 1.0 {
                loss *= scale;
            }
            nets.backward(Net::Actor, &loss, j > 0);
            losses.push(loss.detach());
        }
        nets.step(Net::Actor)?;
        nets.polyak();
        Some(sum_of(losses))
    } else {
        None
    };
    let q = cat_or_one(qs, 1);
    Ok((sum_of(critic_losses), q.mean_dim(dims.as_slice(), false, Kind::Float), actor_loss))
}

/// A population's actors and critics (plain MLPs of one layout) stacked on the member axis.
struct StackedTd3 {
    actor: StackedNet,
    critic: StackedNet,
    actor_layers: Vec<usize>,
    critic_layers: Vec<Vec<usize>>,
    activation: Activation,
    /// The hidden layers' matmuls in bf16 (every member's setting).
    bf16: bool,
    /// Critic 1's weights and biases as detached views of the stacked critics.
    first_views: Vec<Tensor>,
    taus: Vec<f64>,
    /// Observation and action widths, target smoothing.
    dims: (i64, i64, bool),
}

/// One network of every member (the actors, or the critics) stacked on the member axis: online rows (one
/// leaf, with their gradients), targets and Adam moments.
struct StackedNet {
    online: Rows,
    target: Tensor,
    target_views: Vec<Tensor>,
    adam: StackedAdam,
    lrs: Vec<f64>,
}

impl StackedNet {
    /// The members' `(online, target, optimiser)` that `pick` names as rows of shared stacks (made at the first
    /// batched phase, kept after): the phase's steps are the members' own, nothing is written back.
    fn new(members: &mut [&mut Td3], pick: fn(&mut Td3) -> (&mut FlatParams, &mut FlatParams, &mut Adam)) -> Self {
        let mut picked: Vec<_> = members.iter_mut().map(|m| pick(m)).collect();
        let online = Rows::of(&mut picked.iter_mut().map(|p| &mut *p.0).collect::<Vec<_>>());
        let target = shared_rows(&mut picked.iter_mut().map(|p| &mut *p.1).collect::<Vec<_>>());
        StackedNet {
            target_views: member_views(&target, picked[0].0),
            adam: StackedAdam::of(&mut picked.iter_mut().map(|p| &mut *p.2).collect::<Vec<_>>(), &online.params),
            lrs: picked.iter().map(|p| p.2.lr).collect(),
            online,
            target,
        }
    }

    /// One Adam step of every member from its gradient.
    fn adam_step(&mut self) {
        self.adam.step(&self.online.params, &self.online.grad, &self.lrs);
    }

    /// The Polyak update of every member's target with its own τ, as `FlatParams::polyak_from`: `lerp_`
    /// (the weight a per-member column), a copy for τ ≥ 1.
    fn polyak(&mut self, taus: &[f64]) {
        let online = &self.online.params;
        tch::no_grad(|| {
            let weight = per_member(taus.iter().copied(), online.device()).unsqueeze(1);
            let _ = self.target.lerp_tensor_(online, &weight);
            for (k, _) in taus.iter().enumerate().filter(|(_, tau)| **tau >= 1.0) {
                self.target.get(k as i64).copy_(&online.get(k as i64));
            }
        });
    }

    /// A member's optimiser step count after the phase (its parameters, target and state are its rows).
    fn finish(&self, opt: &mut Adam) {
        self.adam.finish(opt);
    }
}

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
        let net = |(l, a): (&[usize], Activation)| (l.to_vec(), a);
        (net(m.pi.net.layout()), m.critic_net.nets.iter().map(|n| net(n.layout())).collect::<Vec<_>>())
    };
    let schedule = |m: &Td3| {
        let c = &m.config;
        let s = (c.train_freq, c.gradient_steps, c.learning_starts, c.batch_size, c.policy_delay);
        (m.name(), s, c.smoothing(), m.data.counters.calls)
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
            || m.critic_net.bf16 != first.critic_net.bf16
            || m.pi.dims() != first.pi.dims()
            || (m.actor.numel(), m.critic.numel()) != (first.actor.numel(), first.critic.numel())
            || m.pi.device != first.pi.device
        {
            return Some("members' networks, parameter counts, precisions (bf16) or devices differ".into());
        }
        if c.fused_cpu && m.pi.device == Device::Cpu {
            // Host Adam and Polyak loops have no per-op dispatch for a batch to share: members step in turn,
            // each as alone.
            return Some("members take the fused CPU step (`fused_cpu`)".into());
        }
        if m.parallel.replicas() > 1 || m.parallel.accumulate() > 1 || m.actor.has_frozen() || m.critic.has_frozen() {
            return Some("data-parallel replicas, gradient accumulation or frozen layers".into());
        }
        let steps = |m: &Td3| (m.actor_opt.steps, m.critic_opt.steps, m.data.counters.critic_updates);
        if steps(m) != steps(first) {
            return Some("members' optimiser steps differ".into());
        }
    }
    None
}

/// The training due after a lockstep env step, for every member: one batched phase of `td3_step`s when all
/// are due together (each member's metrics, as its own update reports them), `None` for members with nothing
/// due; members [`unbatchable`] refuses update alone.
pub fn update_members(members: &mut [&mut Td3], progress: &Progress) -> Result<Vec<Option<Metrics>>> {
    let refs: Vec<&Td3> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().map(|m| m.update(progress)).collect();
    }
    let due = |m: &mut &mut Td3| m.data.phase_due(m.config.learning_starts, m.config.gradient_steps, progress);
    let dues: Vec<usize> = members.iter_mut().map(due).collect();
    if dues.iter().all(|&d| d == 0) {
        return Ok(vec![None; members.len()]);
    }
    if dues.iter().any(|&d| d != dues[0]) {
        let name = members[0].name();
        return Err(Error::Unsupported(format!("{name} population: members' training phases fell due apart {dues:?}")));
    }
    let critic = StackedNet::new(members, |m| (&mut m.critic, &mut m.critic_target, &mut m.critic_opt));
    let actor = StackedNet::new(members, |m| (&mut m.actor, &mut m.actor_target, &mut m.actor_opt));
    let m0 = &members[0];
    let mut first_views = member_views(&critic.online.params.detach(), &m0.critic);
    first_views.truncate(2 * m0.critic_net.layers);
    let mut stacked = StackedTd3 {
        actor,
        critic,
        actor_layers: m0.pi.net.layout().0.to_vec(),
        critic_layers: m0.critic_net.nets.iter().map(|n| n.layout().0.to_vec()).collect(),
        activation: m0.config.activation,
        bf16: m0.critic_net.bf16,
        first_views,
        taus: members.iter().map(|m| m.config.tau).collect(),
        dims: (m0.pi.obs_dim as i64, m0.pi.act_dim as i64, m0.config.smoothing()),
    };
    let trained = train_phase(members, Some(&mut stacked), dues[0]);
    // The steps taken are the members' (as alone, a failed step is not taken, the ones before it are): each
    // optimiser counts them.
    for m in members.iter_mut() {
        stacked.actor.finish(&mut m.actor_opt);
        stacked.critic.finish(&mut m.critic_opt);
    }
    Ok(trained?.into_iter().map(Some).collect())
}

/// A training phase of `steps` [`td3_step`]s of `members`, stacked in `stacked` (else the one member alone),
/// and each member's metrics, as its own update reports them.
fn train_phase(members: &mut [&mut Td3], mut stacked: Option<&mut StackedTd3>, steps: usize) -> Result<Vec<Metrics>> {
    let (device, b) = (members[0].pi.device, members[0].config.batch_size as i64);
    let (mut critic_losses, mut qs, mut actor_losses) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        // The policy delay, counted over the whole run.
        let update_actor = (members[0].data.counters.critic_updates + 1).is_multiple_of(members[0].config.policy_delay);
        let mut rows = Vec::with_capacity(members.len());
        for m in members.iter_mut() {
            // A minibatch laid out in `batch` (see its doc), with its target-action noise.
            let width =
                m.data.sample_rows(b as usize, &mut m.rng, &mut m.batch, target_noise(&m.config, m.pi.act_dim))?;
            rows.push(Tensor::f_from_slice(&m.batch)?.f_view([b, width as i64])?);
        }
        let mut nets = match stacked.as_deref_mut() {
            Some(s) => Td3Nets::Stacked(s),
            None => Td3Nets::Alone(&mut *members[0]),
        };
        let (critic_loss, q, actor_loss) =
            td3_step(&mut nets, &Tensor::stack(&rows, 0).to_device(device), update_actor)?;
        for m in members.iter_mut() {
            m.data.counters.critic_updates += 1;
            m.data.counters.actor_updates += u64::from(update_actor);
        }
        critic_losses.push(critic_loss);
        qs.push(q);
        actor_losses.extend(actor_loss);
    }
    members
        .iter_mut()
        .enumerate()
        .map(|(k, m)| {
            // The mean over the phase's steps of member `k`'s losses; the latest actor loss is kept for phases
            // the delay skips.
            let mean = |ts: &[Tensor]| mean_of(&ts.iter().map(|t| t.get(k as i64)).collect::<Vec<_>>());
            if !actor_losses.is_empty() {
                m.data.counters.last_actor_loss = Some(mean(&actor_losses)?);
            }
            let mut metrics = Metrics::default();
            metrics.push("losses/critic_loss", mean(&critic_losses)?);
            metrics.push("losses/actor_loss", m.data.counters.last_actor_loss.unwrap_or(f64::NAN));
            metrics.push("losses/q_values", mean(&qs)?);
            metrics.push("charts/learning_rate", m.actor_opt.lr);
            metrics.push("charts/gradient_steps", critic_losses.len() as f64);
            Ok(metrics)
        })
        .collect()
}

impl Policy for Td3 {
    fn obs_dim(&self) -> usize {
        self.pi.obs_dim
    }

    fn act_dim(&self) -> usize {
        self.pi.act_dim
    }

    /// `π(obs)` scaled to the bounds; with `Explore`, plus noise (uniformly random before `learning_starts`).
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        let explore = mode == ActMode::Explore;
        let random = explore && self.data.counters.env_steps < self.config.learning_starts;
        let noise = explore.then_some(&mut self.noise);
        self.pi.act(&self.actor, obs, random, noise, &mut self.rng, &mut self.host, out)
    }
}

impl Algorithm for Td3 {
    fn replicated(&mut self) -> Option<&mut dyn crate::algorithm::Replicated> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        let noise = &mut self.noise;
        self.data.observe(self.name, chunks, |env| noise.reset(env))
    }

    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        let steps = self.data.phase_due(self.config.learning_starts, self.config.gradient_steps, progress);
        if steps == 0 {
            return Ok(None);
        }
        Ok(train_phase(&mut [self], None, steps)?.pop())
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("actor.online", self.actor.flat());
        c.put_tensor("actor.target", self.actor_target.flat());
        c.put_tensor("critic.online", self.critic.flat());
        c.put_tensor("critic.target", self.critic_target.flat());
        self.actor_opt.write_to(&mut c, "actor_adam")?;
        self.critic_opt.write_to(&mut c, "critic_adam")?;
        self.data.write_to(&mut c)?;
        c.put_meta("noise", &self.noise.state())?;
        c.put_meta("rng", &self.rng)?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        // Read the metadata first: a checkpoint of another algorithm fails before anything changes.
        let noise: Vec<f64> = c.meta("noise")?;
        let rng = c.meta("rng")?;
        let counters = ActionReplay::counters_in(c)?;
        c.copy_into("actor.online", self.actor.flat())?;
        c.copy_into("actor.target", self.actor_target.flat())?;
        c.copy_into("critic.online", self.critic.flat())?;
        c.copy_into("critic.target", self.critic_target.flat())?;
        self.actor_opt.read_from(c, "actor_adam", &self.actor)?;
        self.critic_opt.read_from(c, "critic_adam", &self.critic)?;
        self.data.read_from(c, counters)?;
        self.noise.set_state(&noise)?;
        self.rng = rng;
        Ok(())
    }

    /// The actor.
    fn policy_params(&self) -> &FlatParams {
        &self.actor
    }

    /// The actor's deterministic actions, in env units.
    fn teach(&mut self, obs: ObsRef<'_>) -> Result<crate::teaching::Teaching> {
        let mut out = ActOutput::default();
        let x = f32_obs(self.name, obs)?;
        self.pi.act(&self.actor, ObsRef::F32(x), false, None, &mut self.rng, &mut self.host, &mut out)?;
        let rows = (x.len() / self.pi.obs_dim) as i64;
        let actions = Tensor::from_slice(&out.actions).view([rows, -1]);
        Ok(crate::teaching::Teaching::new(crate::teaching::TeachingKind::Actions, &actions))
    }

    fn policy_params_mut(&mut self) -> &mut FlatParams {
        &mut self.actor
    }

    fn policy_params_changed(&mut self) {
        self.actor_target.polyak_from(&self.actor, 1.0);
    }
}

impl crate::algorithm::Replicated for Td3 {
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()> {
        parallel.check_batch(self.name, "batch_size", self.config.batch_size)?;
        self.parallel = parallel;
        Ok(())
    }
}

/// The deterministic actor `π(obs) = tanh(MLP(obs))` in `[−1, 1]`, scaled to the action bounds for the env;
/// shared by the agent and its acting copy ([`WarmupPolicy`]).
#[derive(Debug, Clone)]
pub(crate) struct ActorNet {
    pub(crate) net: FlatMlp,
    /// Action heads (1 without task heads); a row reads its task's, by the one-hot ending its observation.
    pub(crate) heads: usize,
    low: Vec<f32>,
    high: Vec<f32>,
    obs_dim: usize,
    act_dim: usize,
    device: Device,
}

impl ActorNet {
    /// The actor for `observation_space` → `action_space` and its initial parameters (named `actor.{k}.…`),
    /// drawn from libtorch's generator; errors name `name` ("ddpg" / "td3") and the space that does not fit.
    fn init(
        name: &'static str,
        observation_space: &Space,
        action_space: &Space,
        c: &Td3Config,
        device: Device,
    ) -> Result<(Self, Vec<(String, Tensor)>)> {
        let obs_dim = mlp_input_dim(name, observation_space)?;
        let (low, high) = action_bounds(name, action_space)?;
        let (act_dim, heads) = (low.len(), c.heads());
        if heads > 1 && obs_dim <= heads {
            let need = "task heads need observations ending in the task's one-hot ([[tasks]])";
            return Err(Error::space("observation", name, format!("{observation_space:?}: {heads} {need}")));
        }
        let (od, outputs) = (obs_dim as i64, (act_dim * heads) as i64);
        let (net, named) = FlatMlp::init("actor", od, &c.hidden_sizes, outputs, c.activation, LayerInit::Torch, 0);
        Ok((ActorNet { net, heads, low, high, obs_dim, act_dim, device }, named))
    }

    /// `π(obs)` in `[−1, 1]`, `[B, act_dim]`, with the online or target parameters; the hidden layers'
    /// matmuls in bf16 where `bf16` (an update's choice).
    fn forward(&self, params: &FlatParams, obs: &Tensor, bf16: bool) -> Tensor {
        let out = self.net.forward_in(params, obs, bf16);
        if self.heads > 1 {
            crate::nn::nets::select_task_heads_tensor(obs, self.heads, &out).tanh()
        } else {
            out.tanh()
        }
    }
}

impl ActingNet for ActorNet {
    type Explore = ActionNoise;

    fn dims(&self) -> (usize, usize) {
        (self.obs_dim, self.act_dim)
    }

    /// `π(obs)` scaled to the bounds, plus the noise when exploring.
    fn act(
        &self,
        params: &FlatParams,
        obs: ObsRef<'_>,
        warm_up: bool,
        noise: Option<&mut ActionNoise>,
        rng: &mut Pcg64,
        host: &mut (HostScratch, Vec<f32>),
        out: &mut ActOutput,
    ) -> Result<()> {
        let obs = f32_obs("td3", obs)?;
        act_tanh(obs, self.obs_dim, (&self.low, &self.high), warm_up, noise, rng, out, |rows, _, actions| {
            let (scratch, raw) = host;
            if self.net.forward_host(params, obs, rows, scratch, raw) {
                // The network without libtorch (CPU parameters), its task heads, then `forward`'s tanh.
                if self.heads > 1 {
                    crate::nn::nets::select_task_heads(obs, self.obs_dim, self.heads, raw);
                }
                for (a, r) in actions.iter_mut().zip(raw.iter()) {
                    *a = r.tanh();
                }
            } else {
                let x = Tensor::f_from_slice(obs)?.f_view([rows as i64, self.obs_dim as i64])?.to_device(self.device);
                let a = tch::no_grad(|| self.forward(params, &x, false)).to_device(Device::Cpu);
                a.f_copy_data(actions, rows * self.act_dim)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuous::bandit::{Bandit, OPTIMUM, spaces};
    use crate::continuous::{Counters, scale_action, unscale_action};
    use crate::nn::params::assert_params_close;

    fn tiny_td3() -> Td3Config {
        Td3Config {
            batch_size: 32,
            buffer_size: 1_000,
            learning_starts: 64,
            hidden_sizes: vec![32, 32],
            gamma: 0.9,
            tau: 0.05,
            ..Td3Config::default()
        }
    }

    fn tiny_ddpg() -> DdpgConfig {
        let t = tiny_td3();
        DdpgConfig {
            batch_size: t.batch_size,
            buffer_size: t.buffer_size,
            learning_starts: t.learning_starts,
            hidden_sizes: t.hidden_sizes,
            gamma: t.gamma,
            tau: t.tau,
            ..DdpgConfig::default()
        }
    }

    fn values(p: &FlatParams) -> Vec<f32> {
        Vec::try_from(p.flat().detach()).unwrap()
    }

    #[test]
    fn action_scaling_both_ways_with_asymmetric_bounds() {
        // [−1, 1] → [−1, 2]: the ends map to the bounds, 0 to the midpoint.
        for (a, x) in [(-1.0, -1.0), (1.0, 2.0), (0.0, 0.5), (-0.5, -0.25)] {
            assert_eq!(unscale_action(a, -1.0, 2.0), x);
            assert_eq!(scale_action(x, -1.0, 2.0), a);
        }
        for (low, high) in [(-2.0f32, 2.0f32), (0.0, 1.0), (-5.0, 0.5)] {
            for k in 0..=20 {
                let a = -1.0 + k as f32 / 10.0;
                assert!((scale_action(unscale_action(a, low, high), low, high) - a).abs() < 1e-6);
            }
        }
        // The agent scales its [−1, 1] actions to the bounds, per dimension, and stores them back in [−1, 1].
        let obs_space = Space::box1d(vec![-1.0], vec![1.0]);
        let act_space = Space::box1d(vec![-2.0, 0.0], vec![2.0, 10.0]);
        let config = Td3Config { learning_starts: 0, noise_type: NoiseType::None, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 1, config, Device::Cpu, 0).unwrap();
        let mut out = ActOutput::default();
        agent.act(ObsRef::F32(&[0.7]), ActMode::Deterministic, &mut out).unwrap();
        let raw = tch::no_grad(|| agent.pi.forward(&agent.actor, &Tensor::from_slice(&[0.7f32]).view([1, 1]), false));
        let raw = Vec::<f32>::try_from(raw.flatten(0, -1)).unwrap();
        assert!((out.actions[0] - 2.0 * raw[0]).abs() < 1e-6, "{:?} vs {raw:?}", out.actions);
        assert!((out.actions[1] - 5.0 * (raw[1] + 1.0)).abs() < 1e-5, "{:?} vs {raw:?}", out.actions);
        agent.act(ObsRef::F32(&[0.7]), ActMode::Explore, &mut out).unwrap();
        let step = Chunk::from_step(
            ObsRef::F32(&[0.7]),
            &out.actions,
            &out.log_probs,
            &out.values,
            &[0.0],
            &[false],
            &[false],
            ObsRef::F32(&[0.1]),
        );
        agent.observe(std::slice::from_ref(&step)).unwrap();
        let stored = agent.data.replay.get(0).unwrap().action;
        assert!(stored.iter().zip(&raw).all(|(s, r)| (s - r).abs() < 1e-6), "{stored:?} vs {raw:?}");
    }

    #[test]
    fn random_warm_up_and_noisy_actions_stay_in_bounds() {
        let (obs_space, act_space) = spaces();
        let config = Td3Config { noise_std: 0.5, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 2, config, Device::Cpu, 1).unwrap();
        let mut env = Bandit::new(1, 2, 5, false);
        let mut out = ActOutput::default();
        let mut warm_up = Vec::new();
        for _ in 0..32 {
            agent.act(ObsRef::F32(&env.obs), ActMode::Explore, &mut out).unwrap();
            warm_up.extend_from_slice(&out.actions);
            env.drive(&mut agent, 1, 1_000);
        }
        assert!(warm_up.iter().all(|a| (-1.0..=2.0).contains(a)));
        let mean = warm_up.iter().sum::<f32>() / warm_up.len() as f32;
        assert!((mean - 0.5).abs() < 0.25, "uniform over [−1, 2]: mean {mean}");
        env.drive(&mut agent, 64, 1_000);
        for _ in 0..50 {
            agent.act(ObsRef::F32(&env.obs), ActMode::Explore, &mut out).unwrap();
            assert!(out.actions.iter().all(|a| (-1.0..=2.0).contains(a)), "{:?}", out.actions);
        }
        let mut det = ActOutput::default();
        agent.act(ObsRef::F32(&env.obs), ActMode::Deterministic, &mut det).unwrap();
        agent.act(ObsRef::F32(&env.obs), ActMode::Explore, &mut out).unwrap();
        assert_ne!(det.actions, out.actions, "exploration adds noise");
    }

    #[test]
    fn acting_without_libtorch_gives_the_tensor_policy() {
        let (obs_space, act_space) = spaces();
        let config = Td3Config { learning_starts: 0, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 2, config, Device::Cpu, 1).unwrap();
        let obs: Vec<f32> = (0..2 * agent.pi.obs_dim).map(|i| 0.3 * i as f32 - 0.5).collect();
        let mut out = ActOutput::default();
        agent.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut out).unwrap();
        let x = Tensor::from_slice(&obs).view([2, agent.pi.obs_dim as i64]);
        let want = Vec::<f32>::try_from(agent.pi.forward(&agent.actor, &x, false).flatten(0, -1)).unwrap();
        assert_eq!(out.actions.len(), want.len());
        for (k, (got, w)) in out.actions.iter().zip(&want).enumerate() {
            let (l, h) = (agent.pi.low[k % agent.pi.act_dim], agent.pi.high[k % agent.pi.act_dim]);
            assert!((got - unscale_action(*w, l, h)).abs() < 1e-5, "{:?} vs {want:?}", out.actions);
        }
    }

    #[test]
    fn td3_delays_actor_and_targets_ddpg_does_not() {
        let (obs_space, act_space) = spaces();
        let td3 = Td3::td3(&obs_space, &act_space, 1, tiny_td3(), Device::Cpu, 2).unwrap();
        let ddpg = Td3::ddpg(&obs_space, &act_space, 1, tiny_ddpg(), Device::Cpu, 2).unwrap();
        assert_eq!((td3.name(), ddpg.name()), ("td3", "ddpg"));
        assert_eq!((ddpg.config.n_critics, ddpg.config.policy_delay, ddpg.config.smoothing()), (1, 1, false));
        for (mut agent, delay) in [(td3, 2), (ddpg, 1)] {
            let mut env = Bandit::new(3, 1, 10, false);
            // Up to learning_starts (64 env steps) nothing trains.
            assert!(env.drive(&mut agent, 64, 1_000).is_empty());
            for step in 1..=8u64 {
                let before = [&agent.actor, &agent.actor_target, &agent.critic, &agent.critic_target].map(values);
                let m = env.drive(&mut agent, 1, 1_000);
                assert_eq!(m.len(), 1, "trains every step after learning_starts");
                assert_eq!(m[0].get("charts/gradient_steps"), Some(1.0));
                let after = [&agent.actor, &agent.actor_target, &agent.critic, &agent.critic_target].map(values);
                let changed = |i: usize| before[i] != after[i];
                assert!(changed(2), "the critic learns every step");
                let due = step.is_multiple_of(delay);
                assert_eq!([changed(0), changed(1), changed(3)], [due; 3], "{} step {step}", agent.name());
                assert_eq!(agent.data.counters.critic_updates, step);
                assert_eq!(agent.data.counters.actor_updates, step / delay);
                assert_eq!(m[0].get("losses/actor_loss").unwrap().is_finite(), step >= delay);
            }
        }
    }

    #[test]
    fn fused_cpu_optimiser_and_target_steps_match_libtorch() {
        let (obs_space, act_space) = spaces();
        let td3 =
            |fused_cpu| Td3::td3(&obs_space, &act_space, 1, Td3Config { fused_cpu, ..tiny_td3() }, Device::Cpu, 3);
        let ddpg =
            |fused_cpu| Td3::ddpg(&obs_space, &act_space, 1, DdpgConfig { fused_cpu, ..tiny_ddpg() }, Device::Cpu, 3);
        for (mut fused, mut torch) in
            [(td3(true).unwrap(), td3(false).unwrap()), (ddpg(true).unwrap(), ddpg(false).unwrap())]
        {
            let (mut env_f, mut env_t) = (Bandit::new(6, 1, 10, false), Bandit::new(6, 1, 10, false));
            // 64 warm-up steps, then 40 critic updates (20 TD3 actor updates).
            let (mf, mt) = (env_f.drive(&mut fused, 104, 1_000), env_t.drive(&mut torch, 104, 1_000));
            assert_eq!(mf.len(), 40);
            for (a, b) in mf.iter().zip(&mt) {
                for &(key, x) in a.iter() {
                    let y = b.get(key).unwrap();
                    // (No actor loss yet before TD3's first delayed update: NaN on both.)
                    let close = (x - y).abs() <= 1e-4 * y.abs().max(1e-2) || (x.is_nan() && y.is_nan());
                    assert!(close, "{}: {key} {x} vs {y}", fused.name());
                }
            }
            for (what, x, y) in [
                ("actor", &fused.actor, &torch.actor),
                ("actor target", &fused.actor_target, &torch.actor_target),
                ("critic", &fused.critic, &torch.critic),
                ("critic target", &fused.critic_target, &torch.critic_target),
            ] {
                let a = assert_params_close(&format!("{} {what}", fused.name()), x, y, 1e-5);
                assert_ne!(
                    a,
                    values(y),
                    "{} {what}: the host loops ran (float rounding tells the paths apart)",
                    fused.name()
                );
            }
            let counts = |c: &Counters| (c.env_steps, c.calls, c.critic_updates, c.actor_updates);
            assert_eq!(counts(&fused.data.counters), counts(&torch.data.counters));
            assert_eq!(
                (fused.actor_opt.steps(), fused.critic_opt.steps()),
                (torch.actor_opt.steps(), torch.critic_opt.steps())
            );
        }
    }

    #[test]
    fn checkpoint_round_trip_continues_bit_identically() {
        let (obs_space, act_space) = spaces();
        let config = Td3Config { noise_type: NoiseType::OrnsteinUhlenbeck, noise_std: 0.3, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 2, config.clone(), Device::Cpu, 4).unwrap();
        let mut env = Bandit::new(4, 2, 7, false);
        // 151 vectorised steps: past learning_starts, an odd number of critic updates, OU noise mid-episode.
        env.drive(&mut agent, 151, 1_000);
        assert_eq!(agent.data.counters.critic_updates % 2, 1);
        assert!(agent.noise.state().iter().any(|x| *x != 0.0));
        let path = std::env::temp_dir().join(format!("flotilla-td3-ckpt-{}.safetensors", std::process::id()));
        agent.checkpoint().unwrap().save(&path).unwrap();
        let mut back = Td3::td3(&obs_space, &act_space, 2, config, Device::Cpu, 99).unwrap();
        back.restore(&mut Checkpoint::load(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut env_copy = env.clone();
        let a = env.drive(&mut agent, 60, 1_000);
        let b = env_copy.drive(&mut back, 60, 1_000);
        assert_eq!(a, b, "same metrics");
        for (x, y) in [
            (&agent.actor, &back.actor),
            (&agent.actor_target, &back.actor_target),
            (&agent.critic, &back.critic),
            (&agent.critic_target, &back.critic_target),
        ] {
            assert_eq!(values(x), values(y));
        }
        assert_eq!(agent.data.counters, back.data.counters);
        assert_eq!(agent.noise, back.noise);
        // A DDPG checkpoint (one critic) does not fit a TD3 agent.
        let ddpg = Td3::ddpg(&obs_space, &act_space, 2, tiny_ddpg(), Device::Cpu, 0).unwrap();
        assert!(back.restore(&mut ddpg.checkpoint().unwrap()).is_err());
    }

    #[test]
    fn learns_the_bandit_optimum() {
        let (obs_space, act_space) = spaces();
        let ddpg = DdpgConfig { learning_starts: 200, ..tiny_ddpg() };
        let td3 = Td3Config { learning_starts: 200, ..tiny_td3() };
        for mut agent in [
            Td3::ddpg(&obs_space, &act_space, 1, ddpg, Device::Cpu, 5).unwrap(),
            Td3::td3(&obs_space, &act_space, 1, td3, Device::Cpu, 5).unwrap(),
        ] {
            let mut env = Bandit::new(5, 1, 1, true);
            env.drive(&mut agent, 1_500, 1_500);
            let obs = env.draw();
            let mut out = ActOutput::default();
            agent.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut out).unwrap();
            assert!((out.actions[0] - OPTIMUM).abs() < 0.1, "{}: action {:?}", agent.name(), out.actions);
        }
    }

    #[test]
    fn task_heads_read_each_rows_own_head_train_only_it_and_act_alike_in_actors() {
        // 2 floats + a 3-task one-hot; a 1-D action in [−1, 2]; row r is of task r mod 3.
        let obs_space = Space::box1d(vec![-5.0; 5], vec![5.0; 5]);
        let (_, act_space) = spaces();
        let row = |r: usize| {
            let mut x = vec![(r as f32 * 0.7).sin(), (r as f32 * 0.3).cos()];
            x.extend((0..3).map(|k| if k == r % 3 { 1.0 } else { 0.0 }));
            x
        };
        let x: Vec<f32> = (0..6).flat_map(row).collect();
        let xt = Tensor::from_slice(&x).view([6, 5]);
        let config = Td3Config { task_heads: true, tasks: 3, learning_starts: 0, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 1, config.clone(), Device::Cpu, 2).unwrap();
        // The actor: 3 raw outputs per row (one per head); each row's action is tanh of its own task's.
        let raw = agent.pi.net.forward(&agent.actor, &xt);
        assert_eq!(raw.size(), [6, 3]);
        let pi = tch::no_grad(|| agent.pi.forward(&agent.actor, &xt, false));
        for r in 0..6i64 {
            let want = raw.get(r).get(r % 3).tanh();
            assert!(pi.get(r).get(0).allclose(&want, 1e-6, 1e-6, false), "row {r}");
        }
        // The host acting path (no libtorch), in the agent and in an actor's acting copy, gives the same.
        let mut out = ActOutput::default();
        agent.act(ObsRef::F32(&x), ActMode::Deterministic, &mut out).unwrap();
        let pi = Vec::<f32>::try_from(pi.flatten(0, -1)).unwrap();
        let want: Vec<f32> = pi.iter().map(|a| unscale_action(*a, -1.0, 2.0)).collect();
        assert!(out.actions.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{:?} vs {want:?}", out.actions);
        let setup = ActingSetup {
            observation_space: &obs_space,
            action_space: &act_space,
            n_envs: 1,
            seed: 9,
            epsilon_floor: 0.0,
            frozen: &[],
        };
        let Acting::Chunks(mut acting) = config.build_acting(&setup).unwrap() else { panic!("td3 acts") };
        acting.load_params(&values(&agent.actor)).unwrap();
        let mut copy = ActOutput::default();
        acting.act(ObsRef::F32(&x), ActMode::Deterministic, &mut copy).unwrap();
        assert_eq!(copy.actions, out.actions);
        // Each critic: 3 Q heads; a row's Q is its task's, in the loss and in the actor's critic 1 alike.
        let xa = Tensor::cat(&[&xt, &Tensor::from_slice(&[0.1f32, -0.4, 0.9, 0.0, -1.0, 0.5]).view([6, 1])], 1);
        let q = agent.critic_net.forward(&agent.critic, &xa);
        assert_eq!(q.size(), [6, 2]);
        for (j, net) in agent.critic_net.nets.iter().enumerate() {
            let raw = net.forward_in(&agent.critic, &xa, agent.critic_net.bf16);
            assert_eq!(raw.size(), [6, 3]);
            for r in 0..6i64 {
                assert!(
                    q.get(r).get(j as i64).allclose(&raw.get(r).get(r % 3), 1e-6, 1e-6, false),
                    "critic {j} row {r}"
                );
            }
        }
        let first = agent.critic_net.forward_detached(&agent.critic_first, &xa);
        assert!(first.allclose(&q.narrow(1, 0, 1), 1e-6, 1e-6, false));
        // Train on task-0 rows only: task 0's output columns move, the other tasks' stay as they were.
        let rows: Vec<f32> = (0..4).flat_map(|r| row(3 * r)).collect();
        let out_cols = |p: &FlatParams, weight: usize| -> Vec<Vec<f32>> {
            let w = p.view(weight).detach();
            (0..3).map(|k| Vec::<f32>::try_from(w.select(1, k).contiguous()).unwrap()).collect()
        };
        let layers = config.hidden_sizes.len() + 1;
        let (actor_out, critic_outs) = (2 * (layers - 1), [2 * (layers - 1), 2 * layers + 2 * (layers - 1)]);
        let before = (out_cols(&agent.actor, actor_out), critic_outs.map(|i| out_cols(&agent.critic, i)));
        for _ in 0..3 {
            agent.train_on(&rows, &[0.5, -0.5, 0.2, 0.9], &[1.0, -1.0, 0.5, 0.0], &[0.9; 4], &rows, true).unwrap();
        }
        let after = (out_cols(&agent.actor, actor_out), critic_outs.map(|i| out_cols(&agent.critic, i)));
        let heads =
            |(a, c): &(Vec<Vec<f32>>, [Vec<Vec<f32>>; 2]), k: usize| (a[k].clone(), c[0][k].clone(), c[1][k].clone());
        assert_ne!(heads(&before, 0), heads(&after, 0), "task 0's heads train");
        for k in 1..3 {
            assert_eq!(heads(&before, k), heads(&after, k), "task {k}'s heads are untouched by task-0 data");
        }
        // Refusals: heads without [[tasks]]; observations with no room for the one-hot.
        for e in [
            DdpgConfig { task_heads: true, ..tiny_ddpg() }.validate().unwrap_err(),
            Td3Config { task_heads: true, ..tiny_td3() }.validate().unwrap_err(),
        ] {
            assert!(e.to_string().contains("a head per task needs [[tasks]]"), "{e}");
        }
        let narrow = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let e = Td3::td3(&narrow, &act_space, 1, config, Device::Cpu, 0).unwrap_err().to_string();
        assert!(e.contains("3 task heads"), "{e}");
    }

    #[test]
    fn task_heads_learn_each_tasks_own_optimum() {
        // Two tasks, optima 0.3 and −0.5, one env each: each task's head ends near its own optimum.
        let obs_space = Space::box1d(vec![-1.0; 4], vec![1.0; 4]);
        let (_, act_space) = spaces();
        let config = Td3Config { learning_starts: 200, task_heads: true, tasks: 2, ..tiny_td3() };
        let mut agent = Td3::td3(&obs_space, &act_space, 2, config, Device::Cpu, 5).unwrap();
        let mut env = Bandit::tasked(5, 2, 2);
        env.drive(&mut agent, 3_000, 6_000);
        let obs = env.draw();
        let mut out = ActOutput::default();
        agent.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut out).unwrap();
        for e in 0..2 {
            assert!((out.actions[e] - env.optimum(e)).abs() < 0.1, "task {e}: action {:?}", out.actions);
        }
    }

    #[test]
    fn configs_defaults_and_validation() {
        let (d, t) = (DdpgConfig::default(), Td3Config::default());
        assert_eq!(
            (d.learning_starts, d.buffer_size, d.gamma, d.hidden_sizes.as_slice()),
            (10_000, 200_000, 0.98, &[400, 300][..])
        );
        assert_eq!((t.policy_delay, t.n_critics, t.target_policy_noise, t.target_noise_clip), (2, 2, 0.2, 0.5));
        assert_eq!(
            Td3Config { n_critics: 1, policy_delay: 1, target_policy_noise: 0.0, target_noise_clip: 0.0, ..t.clone() },
            d.into()
        );
        let e = Td3Config { policy_delay: 0, ..t }.validate().unwrap_err().to_string();
        assert!(e.contains("td3") && e.contains("policy_delay"), "{e}");
        let e = DdpgConfig { batch_size: 0, ..DdpgConfig::default() }.validate().unwrap_err().to_string();
        assert!(e.contains("ddpg") && e.contains("batch_size"), "{e}");
        let (obs_space, _) = spaces();
        for bad in [Space::discrete(3), Space::box1d(vec![f32::NEG_INFINITY], vec![1.0])] {
            assert!(Td3::td3(&obs_space, &bad, 1, tiny_td3(), Device::Cpu, 0).is_err());
        }
    }
}

#[cfg(test)]
mod member_tests {
    use flotilla_core::{ObsRef, Space};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::continuous::Counters;
    use crate::nn::members::rel_diff;
    use crate::policy::{ActMode, ActOutput, Policy};
    use crate::td3::{DdpgConfig, Td3Config};
    use flotilla_core::Chunk;

    fn spaces() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::box1d(vec![-1.0, 0.0], vec![2.0, 1.0]))
    }

    /// Mixed precision (bf16 hidden layers, forced here whatever the CPU) takes f32's step to bf16's rounding,
    /// for TD3 and DDPG: the same losses within 2 %, and each network moved the same way (cosine of the
    /// parameter changes over three steps above 0.95).
    #[test]
    fn a_bf16_step_follows_the_f32_step() {
        use crate::continuous::bandit::{cosine_of_changes, random_rows};
        let (o, a) = spaces();
        let values = |p: &FlatParams| Vec::<f32>::try_from(p.flat().detach()).unwrap();
        for ddpg in [false, true] {
            let build = |bf16: bool| {
                if ddpg {
                    let d = DdpgConfig { bf16, hidden_sizes: vec![64, 64], ..small_ddpg(0) };
                    Td3::ddpg(&o, &a, 2, d, Device::Cpu, 4).unwrap()
                } else {
                    let c = Td3Config { bf16, hidden_sizes: vec![64, 64], ..small_td3(0) };
                    Td3::td3(&o, &a, 2, c, Device::Cpu, 4).unwrap()
                }
            };
            let (mut f32s, mut mixed) = (build(false), build(true));
            assert!(mixed.critic_net.bf16 && !f32s.critic_net.bf16);
            let before = [values(&f32s.actor), values(&f32s.critic)];
            for step in 0..3 {
                let [o, a, r, g, n] = random_rows(step, 32, f32s.pi.obs_dim, f32s.pi.act_dim);
                let x = f32s.train_on(&o, &a, &r, &g, &n, true).unwrap();
                let y = mixed.train_on(&o, &a, &r, &g, &n, true).unwrap();
                for (what, p, q) in [("critic", x.0, y.0), ("actor", x.1.unwrap(), y.1.unwrap())] {
                    let close = (p - q).abs() <= 0.02 * p.abs().max(1e-2);
                    assert!(close, "{} step {step} {what} loss: f32 {p}, bf16 {q}", f32s.name());
                }
            }
            for (k, (what, p, q)) in
                [("actor", &f32s.actor, &mixed.actor), ("critic", &f32s.critic, &mixed.critic)].into_iter().enumerate()
            {
                assert_ne!(values(p), values(q), "{} {what}: bf16 ran (its rounding shows)", f32s.name());
                let cos = cosine_of_changes(&before[k], &values(p), &values(q));
                assert!(cos > 0.95, "{} {what}: bf16's change against f32's, cosine {cos}", f32s.name());
            }
        }
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
        let (od, ad) = together[0].pi.dims();
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
                let t = Chunk::from_step(
                    ObsRef::F32(&obs),
                    &out.actions,
                    &out.log_probs,
                    &out.values,
                    &rewards,
                    &done,
                    &truncated,
                    ObsRef::F32(&next),
                );
                m.observe(std::slice::from_ref(&t)).unwrap();
                twin.observe(std::slice::from_ref(&t)).unwrap();
            }
            let progress = Progress { env_steps: step * n_envs as u64, total_env_steps: total };
            let mut refs: Vec<&mut Td3> = together.iter_mut().collect();
            let batched = update_members(&mut refs, &progress).unwrap();
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
            assert!(a.data.counters.actor_updates >= 2 * a.config.policy_delay, "member {k}: {:?}", a.data.counters);
            for (what, x, y) in [
                ("actor", a.actor.flat(), b.actor.flat()),
                ("actor target", a.actor_target.flat(), b.actor_target.flat()),
                ("critics", a.critic.flat(), b.critic.flat()),
                ("critic targets", a.critic_target.flat(), b.critic_target.flat()),
                ("actor Adam m", &a.actor_opt.state[0], &b.actor_opt.state[0]),
                ("actor Adam v", &a.actor_opt.state[1], &b.actor_opt.state[1]),
                ("critic Adam m", &a.critic_opt.state[0], &b.critic_opt.state[0]),
                ("critic Adam v", &a.critic_opt.state[1], &b.critic_opt.state[1]),
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
                Counters { last_actor_loss: None, ..a.data.counters.clone() },
                Counters { last_actor_loss: None, ..b.data.counters.clone() },
            );
            assert_eq!(ca, cb, "member {k}");
            match (loss(&a.data.counters), loss(&b.data.counters)) {
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
            // f32: stacked (baddbmm) and single (addmm) bf16 kernels round differently.
            bf16: false,
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
            bf16: false,
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
