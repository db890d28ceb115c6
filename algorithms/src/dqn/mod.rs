//! Deep Q-Networks (Mnih et al. 2015, "Human-level control through deep reinforcement learning") with the
//! Rainbow-era options (Hessel et al. 2018): double-Q targets (van Hasselt et al. 2016), dueling heads
//! (Wang et al. 2016), prioritized replay (Schaul et al. 2016) and n-step returns.
//!
//! Implementation details that matter (SB3's `DQN`):
//! * ε-greedy exploration, ε decaying linearly from `exploration_initial_eps` to `exploration_final_eps`
//!   over the first `exploration_fraction` of training; uniformly random actions before `learning_starts`;
//! * every `train_freq` vectorised steps (SB3's unit: one call to the vectorised env; with one env, env steps)
//!   after `learning_starts` env steps, `gradient_steps` minibatch updates;
//! * the target network follows the online one every `target_update_interval` env steps, by Polyak
//!   averaging with `tau` (1 = a hard copy), so it stays fixed within each block of gradient steps;
//! * Huber (smooth L1) loss, weighted by importance weights under prioritized replay, whose priorities
//!   become `(|δ| + ε)^α`; β anneals linearly from `per_beta0` to `per_beta_final`;
//! * global gradient-norm clipping; Adam.
//!
//! **QR-DQN** (Dabney et al. 2018, "Distributional Reinforcement Learning with Quantile Regression", as
//! SB3-contrib's `QRDQN`) is `n_quantiles = N`: the network gives N quantiles of the return per action at the
//! fractions `τ̂_i = (2i + 1)/2N`, Q is their mean (acting, double-Q's choice, the target's greedy action), and the
//! loss is the quantile Huber loss (κ = 1) between each sample's N current quantiles and its N target quantiles
//! `r + γ^m z_j(s′, a*)`, summed over the current quantiles and averaged over the targets and the batch. Dueling
//! combines per quantile; prioritized replay takes `|mean target − Q|` as the error. The fused CPU step takes it too.
//!
//! Image observations (u8 frame stacks `[C, H, W]`, e.g. Atari) get the Nature-DQN network ([`NatureCnn`],
//! frames divided by 255 on the device) and a [`FrameReplay`] that stores each frame once; prioritized replay is
//! available for vector observations only.
//!
//! Defaults are RL Zoo's CartPole-v1 DQN (with `[env] num_envs = 1`): 256-256 ReLU MLP, lr 2.3e-3, batch
//! 64, buffer 100 K, learning starts 1 K, γ 0.99, train every 256 steps with 128 gradient steps, target
//! every 10 steps, ε 1 → 0.04 over 16 % of training; no double-Q, dueling, PER or n-step (turn them on).
//!
//! Metrics: `losses/td_loss`, `losses/q_values`, `charts/epsilon`, `charts/learning_rate`, `charts/gradient_steps`,
//! `charts/per_beta`.
mod host;
use std::sync::{Arc, Mutex, MutexGuard};

use flotilla_core::{Chunk, DType, ObsBuf, ObsRef, Space};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Reduction, Tensor};

use crate::acting::{Acting, ActingNet, ActingSetup, WarmupPolicy};
use crate::algorithm::{Algorithm, Prepared, ReplayFeed};
use crate::checkpoint::Checkpoint;
use crate::data::frame_replay::FrameReplay;
use crate::data::n_step::NStep;
use crate::data::replay::{Element, PrioritizedReplay, ReplayBuffer, ReplaySample, check_len};
use crate::dqn::host::DqnHost;
use crate::error::Checks;
use crate::export::{Architecture, Network, PolicyOutput, unsupported};
use crate::kind::{AlgorithmKind, members_as};
use crate::nn::data_parallel::DataParallel;
use crate::nn::host_mlp::HostScratch;
use crate::nn::members::{
    Rows, backward_alone, batched_mlp, clip_per_member, member_views, mlp_operands, reduce_and_clip_alone, shared_rows,
};
use crate::nn::nets::is_image;
use crate::nn::nets::{
    Activation, CnnOptions, FlatMlp, LayerInit, NatureCnn, ObsLayout, cpu_has_native_bf16, mlp_input_dim,
    with_torch_seed,
};
use crate::nn::optimiser::{Adam, StackedAdam};
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy, f32_obs};
use crate::progress::Progress;
use crate::{Error, Metrics, Result};

/// DQN hyperparameters. `Default` is RL Zoo's CartPole-v1 DQN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DqnConfig {
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over training (as PPO and A2C can). DQN's CartPole policies
    /// tend to collapse and recover at a constant rate; annealing keeps the one training ends with.
    pub anneal_lr: bool,
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
    /// Vectorised steps between training phases (SB3's unit; env steps when `num_envs = 1`).
    pub train_freq: u64,
    /// Gradient steps per training phase.
    pub gradient_steps: usize,
    /// Env steps between target-network updates (counted as SB3 does: every max(interval / num_envs, 1)
    /// vectorised steps).
    pub target_update_interval: u64,
    /// Polyak coefficient of a target update (1: hard copy).
    pub tau: f64,
    /// Fraction of training over which ε decays.
    pub exploration_fraction: f64,
    /// ε at the start.
    pub exploration_initial_eps: f64,
    /// ε after the decay.
    pub exploration_final_eps: f64,
    /// Global gradient-norm limit.
    pub max_grad_norm: f64,
    /// Hidden layer widths.
    pub hidden_sizes: Vec<i64>,
    /// Hidden nonlinearity.
    pub activation: Activation,
    /// Double-Q targets: the online network picks the next action, the target network values it.
    pub double_q: bool,
    /// Dueling heads: `Q = V + A − mean(A)`.
    pub dueling: bool,
    /// n of the n-step returns (1: one-step TD).
    pub n_step: usize,
    /// Prioritized replay instead of uniform.
    pub prioritized_replay: bool,
    /// Priority exponent α.
    pub per_alpha: f64,
    /// Importance-sampling exponent β at the start (annealed to `per_beta_final`).
    pub per_beta0: f64,
    /// β at the end of training.
    pub per_beta_final: f64,
    /// Added to `|δ|` so no transition has priority 0.
    pub per_eps: f64,
    /// How the Nature CNN computes for image observations (`[algorithm.cnn]`: channels-last, bf16).
    pub cnn: CnnOptions,
    /// `[[tasks]]` runs: one Q head per task on the shared MLP torso (as multi-task DQN), each observation
    /// reading its task's (else one head for all tasks, told apart by the one-hot input alone).
    pub task_heads: bool,
    /// The run's task count, set from `[[tasks]]` when the experiment config is parsed (not a setting).
    #[serde(skip)]
    pub tasks: usize,
    /// Run each gradient step of an MLP Q-network on the CPU as one fused step without libtorch
    /// (`crate::nn::host_train`): the same maths, several times faster for small networks. Used where it applies
    /// (CPU, MLP without dueling or task heads, f32 observations, no replicas, accumulation or frozen layers).
    pub fused_cpu: bool,
    /// Mixed precision for an MLP Q-network's update on the CPU: the hidden layers' matrix products in bf16
    /// (products summed in f32; parameters, gradients, Adam, the loss and acting stay f32), on the fused step and on
    /// libtorch (`crate::nn::mixed::dense`). Default: on where the CPU computes bf16 natively
    /// ([`cpu_has_native_bf16`]). Image observations take `cnn.bf16` instead.
    pub bf16: bool,
    /// QR-DQN: the number of return quantiles per action (SB3-contrib's `n_quantiles`; its default is 200, RL
    /// Zoo's CartPole 10); `0` is DQN's expected values.
    pub n_quantiles: usize,
}

impl Default for DqnConfig {
    fn default() -> Self {
        DqnConfig {
            learning_rate: 2.3e-3,
            anneal_lr: false,
            adam_eps: 1e-8,
            batch_size: 64,
            buffer_size: 100_000,
            learning_starts: 1_000,
            gamma: 0.99,
            train_freq: 256,
            gradient_steps: 128,
            target_update_interval: 10,
            tau: 1.0,
            exploration_fraction: 0.16,
            exploration_initial_eps: 1.0,
            exploration_final_eps: 0.04,
            max_grad_norm: 10.0,
            hidden_sizes: vec![256, 256],
            activation: Activation::Relu,
            double_q: false,
            dueling: false,
            n_step: 1,
            prioritized_replay: false,
            per_alpha: 0.6,
            per_beta0: 0.4,
            per_beta_final: 1.0,
            per_eps: 1e-6,
            cnn: CnnOptions::default(),
            task_heads: false,
            tasks: 0,
            fused_cpu: true,
            bf16: cpu_has_native_bf16(),
            n_quantiles: 0,
        }
    }
}

impl AlgorithmKind for DqnConfig {
    fn validate(&self, _num_envs: usize) -> Result<()> {
        DqnConfig::validate(self)
    }

    fn set_tasks(&mut self, tasks: usize) {
        self.tasks = tasks;
    }

    fn check_distributed(&self) -> Result<()> {
        if self.n_step > 1 {
            let detail = "n-step returns need one queue per actor env, which the distributed learner does not keep \
                          yet; use n_step = 1 with actors";
            return Err(Error::config("dqn", "n_step", self.n_step, detail));
        }
        Ok(())
    }

    fn check_assemble_ahead(&self) -> std::result::Result<(), String> {
        if self.prioritized_replay {
            return Err("dqn with prioritized_replay = true draws each minibatch by the priorities the update \
                        before it sets, so it cannot be sampled ahead"
                .into());
        }
        Ok(())
    }

    fn cnn_options(&self) -> Option<crate::nn::nets::CnnOptions> {
        Some(self.cnn)
    }

    fn mlp_bf16(&self) -> bool {
        self.bf16
    }

    fn learner(&self, o: &Space, a: &Space, n_envs: usize, device: Device, seed: u64) -> Result<Box<dyn Algorithm>> {
        Ok(Box::new(Dqn::new(o, a, n_envs, self.clone(), device, seed)?))
    }

    /// The Q-network (`QNet`).
    fn architecture(&self, o: &Space, a: &Space) -> Result<Architecture> {
        let (n, heads, outputs) = self.q_shape(a)?;
        let network = if is_image(o) {
            Network::nature_cnn("q", o, NatureCnn::CHANNELS, NatureCnn::FEATURES, outputs, outputs)?
        } else {
            Network::mlp("q", mlp_input_dim("dqn", o)?, &self.hidden_sizes, outputs, self.activation)
        };
        let policy = PolicyOutput::QValues { n, dueling: self.dueling, quantiles: self.n_quantiles.max(1) };
        Ok(Architecture::new("dqn", network, policy, heads, o, a))
    }

    fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let ActingSetup { observation_space: o, action_space: a, seed, epsilon_floor: floor, .. } = *setup;
        self.validate()?;
        let (q, named) = QNet::init(o, a, self, seed)?;
        let explore = Epsilon { schedule: self.clone(), floor, epsilon: self.exploration_initial_eps };
        Ok(Acting::Chunks(Box::new(WarmupPolicy::new(q, named, explore, self.learning_starts, seed ^ 0xd9_ac70))))
    }

    fn update_members(
        &self,
        members: &mut [&mut dyn Algorithm],
        progress: &Progress,
    ) -> Result<Option<Vec<Option<Metrics>>>> {
        members_as::<Dqn>(members).map(|mut dqns| update_members(&mut dqns, progress)).transpose()
    }
}

impl DqnConfig {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<()> {
        Checks::of("dqn")
            .task_heads(self.task_heads, self.tasks)
            .adam(self.learning_rate, self.adam_eps)
            .replay(self.batch_size, self.buffer_size, self.train_freq, self.gradient_steps)
            .targets(self.gamma, self.tau)
            .unit("exploration_fraction", self.exploration_fraction)
            .unit("exploration_initial_eps", self.exploration_initial_eps)
            .unit("exploration_final_eps", self.exploration_final_eps)
            .limit("max_grad_norm", self.max_grad_norm)
            .widths("hidden_sizes", &self.hidden_sizes)
            .at_least_one("n_step", self.n_step)
            .non_negative("per_alpha", self.per_alpha)
            .unit("per_beta0", self.per_beta0)
            .unit("per_beta_final", self.per_beta_final)
            .positive("per_eps", self.per_eps)
            .that(self.n_quantiles <= 1024, "n_quantiles", self.n_quantiles, "at most 1024 (0: DQN's expected values)")
            .done()
    }

    /// The action count, Q heads and network outputs for `action_space` (a `Discrete` one). A dueling network's
    /// last layer holds the value head next to the advantage head; with task heads, one such head per task.
    fn q_shape(&self, action_space: &Space) -> Result<(usize, usize, usize)> {
        let Space::Discrete { n, .. } = *action_space else {
            return Err(unsupported("dqn", format!("{action_space:?}: DQN needs discrete actions")));
        };
        let heads = if self.task_heads { self.tasks.max(1) } else { 1 };
        Ok((n, heads, (n + usize::from(self.dueling)) * self.n_quantiles.max(1) * heads))
    }

    /// ε at `progress_remaining` (SB3's `get_linear_fn`): from the initial to the final ε linearly over the first
    /// `exploration_fraction` of training, then the final ε.
    pub fn epsilon(&self, progress_remaining: f64) -> f64 {
        let (start, end, fraction) =
            (self.exploration_initial_eps, self.exploration_final_eps, self.exploration_fraction);
        let elapsed = 1.0 - progress_remaining;
        if fraction <= 0.0 || elapsed > fraction { end } else { start + elapsed * (end - start) / fraction }
    }
}

/// The n-step accumulator and the replay it feeds: uniform or prioritized replay of f32 vectors, or uniform
/// replay of u8 frame stacks (one variant per valid pairing of the two).
#[derive(Debug)]
pub(crate) enum Memory {
    Uniform(NStep<f32>, ReplayBuffer<f32>),
    Prioritized(NStep<f32>, PrioritizedReplay<f32>),
    Frames(NStep<u8>, FrameReplay),
}

/// Counters that schedules and triggers depend on (saved in checkpoints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Counters {
    /// Env steps observed (all envs).
    env_steps: u64,
    /// Vectorised steps observed (SB3's `_n_calls`, which times target updates).
    calls: u64,
    /// Vectorised steps since the last training phase.
    since_train: u64,
    /// Gradient steps taken.
    pub(crate) gradient_steps: u64,
    pub(crate) epsilon: f64,
    pub(crate) beta: f64,
}

/// A DQN agent: online and target Q-networks, optimiser, and its `DataSide` (replay, n-step accumulator,
/// RNG, schedule counters).
#[derive(Debug)]
pub struct Dqn {
    /// Hyperparameters.
    pub config: DqnConfig,
    pub(crate) q: QNet,
    pub(crate) online: FlatParams,
    pub(crate) target: FlatParams,
    pub(crate) opt: Adam,
    pub(crate) side: Arc<Mutex<DataSide>>,
    n_envs: usize,
    /// Loss and mean Q of the prepared batches trained on so far in the current training phase.
    phase: Vec<(Tensor, Tensor)>,
    /// Acting's host forward pass: hidden activations and the network's raw output.
    host: (HostScratch, Vec<f32>),
    /// Replicas to average gradients with, and micro-batches per gradient step.
    pub(crate) parallel: DataParallel,
    /// The fused CPU step's layout and buffers, once a phase took that path ([`DqnConfig::fused_cpu`]).
    host_step: Option<DqnHost>,
}

/// What observing transitions and sampling replay touch: the n-step accumulator and replay, the RNG (replay
/// sampling and ε-greedy acting draw from this one stream) and the schedule counters. The agent keeps it
/// behind a mutex so that a learner's batch-assembly thread can observe and sample ahead through a
/// [`DqnFeed`] while the agent trains on the previous sample; on one thread the lock is never contended.
#[derive(Debug)]
pub(crate) struct DataSide {
    pub(crate) memory: Memory,
    rng: Pcg64,
    pub(crate) counters: Counters,
    sample: ReplaySample<f32>,
    frames_sample: ReplaySample<u8>,
    /// A step's next observations where episodes ended in it ([`Chunk::next_obs_rows`]).
    next: ObsBuf,
    /// Values per observation (a frame stack's pixels for frames).
    obs_dim: usize,
}

/// One gradient step's replay sample on the device.
#[derive(Debug)]
pub(crate) struct DqnBatch {
    pub(crate) obs: Tensor,
    pub(crate) next_obs: Tensor,
    /// `[B, 1]` int64.
    pub(crate) actions: Tensor,
    /// n-step returns.
    pub(crate) rewards: Tensor,
    /// The bootstrap factor γ^m, zero for terminal transitions.
    pub(crate) bootstrap: Tensor,
    /// Prioritized replay: importance weights and the slots to give new priorities.
    pub(crate) prioritized: Option<(Tensor, Vec<usize>)>,
    /// The sample on the host, for the fused CPU step (a [`DqnFeed`] keeps it when that step may apply).
    pub(crate) host: Option<Box<ReplaySample<f32>>>,
}

/// Where a prepared batch sits in its training phase, and the schedules when it was sampled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhaseStep {
    progress: Progress,
    epsilon: f64,
    beta: f64,
    /// The phase's last gradient step: its metrics are reported after it.
    last: bool,
}

impl DataSide {
    /// Record a chunk's steps in order (n-step windows, then replay); the number of times the target
    /// network fell due to follow the online one.
    fn observe(&mut self, chunk: &Chunk, config: &DqnConfig, n_envs: usize) -> Result<u64> {
        if chunk.transitions() == 0 {
            return Ok(0);
        }
        chunk.check_lengths(n_envs, self.obs_dim, 1, false)?;
        let (e, d) = (n_envs, self.obs_dim);
        // SB3 counts the target interval in vectorised steps: every max(interval / n_envs, 1) calls.
        let every = (config.target_update_interval / n_envs as u64).max(1);
        let (mut cursor, mut syncs) = (0, 0);
        for t in 0..chunk.n_steps {
            let rows = t * e..(t + 1) * e;
            let (obs, next) =
                (chunk.obs.slice(rows.start * d..rows.end * d), chunk.next_obs_rows(t, d, &mut self.next, &mut cursor));
            let (a, r) = (&chunk.actions[rows.clone()], &chunk.rewards[rows.clone()]);
            let (te, tr) = (&chunk.terminated[rows.clone()], &chunk.truncated[rows]);
            match (&mut self.memory, obs, next) {
                (Memory::Frames(n, m), ObsRef::U8(o), ObsRef::U8(x)) => n.push(o, a, r, te, tr, x, |e| m.push(e))?,
                (Memory::Uniform(n, m), ObsRef::F32(o), ObsRef::F32(x)) => n.push(o, a, r, te, tr, x, |e| m.push(e))?,
                (Memory::Prioritized(n, m), ObsRef::F32(o), ObsRef::F32(x)) => {
                    n.push(o, a, r, te, tr, x, |e| m.push(e))?
                }
                (Memory::Frames(..), obs, _) => return Err(unsupported_obs(obs)),
                (_, obs, _) => return Err(f32_obs("dqn", obs).err().unwrap_or_else(|| unsupported_obs(obs))),
            }
            let c = &mut self.counters;
            c.env_steps += e as u64;
            c.since_train += 1;
            c.calls += 1;
            syncs += u64::from(c.calls.is_multiple_of(every));
        }
        Ok(syncs)
    }

    /// Advance the schedules to `progress`; the number of gradient steps due now (0 if it is not time to
    /// train), starting a new training phase if any are.
    pub(crate) fn phase_due(&mut self, config: &DqnConfig, progress: &Progress) -> usize {
        let remaining = progress.remaining();
        // The run's env steps (every data-parallel learner's, not only those in this replica's replay).
        let waiting = progress.env_steps <= config.learning_starts || self.replay_len() == 0;
        let c = &mut self.counters;
        c.epsilon = config.epsilon(remaining);
        c.beta = config.per_beta0 + (1.0 - remaining) * (config.per_beta_final - config.per_beta0);
        if waiting {
            // Waiting to learn: the first phase falls due at the first step after it, once.
            c.since_train = c.since_train.min(config.train_freq - 1);
            return 0;
        }
        let phases = c.since_train / config.train_freq;
        c.since_train %= config.train_freq;
        phases as usize * config.gradient_steps
    }

    /// Draw one minibatch into the host sample buffers (frames into `frames_sample`, else `sample`).
    fn draw(&mut self, batch: usize) -> Result<()> {
        let beta = self.counters.beta;
        match &self.memory {
            Memory::Uniform(_, r) => r.sample(batch, &mut self.rng, &mut self.sample),
            Memory::Prioritized(_, r) => r.sample(batch, beta, &mut self.rng, &mut self.sample),
            Memory::Frames(_, r) => r.sample(batch, &mut self.rng, &mut self.frames_sample),
        }
    }

    /// Draw one minibatch and put it on the device as `layout` says.
    pub(crate) fn sample(&mut self, batch: usize, layout: &ObsLayout) -> Result<DqnBatch> {
        self.draw(batch)?;
        let mut b = match &self.memory {
            Memory::Frames(..) => DqnBatch::of_sample(&self.frames_sample, layout)?,
            _ => DqnBatch::of_sample(&self.sample, layout)?,
        };
        if let Memory::Prioritized(..) = &self.memory {
            let weights = Tensor::from_slice(&self.sample.weights).to_device(layout.device);
            b.prioritized = Some((weights, self.sample.indices.clone()));
        }
        Ok(b)
    }

    fn replay_len(&self) -> usize {
        match &self.memory {
            Memory::Uniform(_, r) => r.len(),
            Memory::Prioritized(_, r) => r.len(),
            Memory::Frames(_, r) => r.len(),
        }
    }
}

impl DqnBatch {
    /// A batch on `layout`'s device (`actions`: `[B]` int64 indices; `bootstrap`: γ^m, 0 where terminated).
    fn new(
        layout: &ObsLayout,
        obs: ObsRef<'_>,
        next_obs: ObsRef<'_>,
        actions: Tensor,
        rewards: &[f32],
        bootstrap: &[f32],
    ) -> Result<DqnBatch> {
        let d = layout.device;
        Ok(DqnBatch {
            obs: layout.tensor(obs)?,
            next_obs: layout.tensor(next_obs)?,
            actions: actions.to_device(d).unsqueeze(1),
            rewards: Tensor::from_slice(rewards).to_device(d),
            bootstrap: Tensor::from_slice(bootstrap).to_device(d),
            prioritized: None,
            host: None,
        })
    }

    /// A replay sample's batch on `layout`'s device (without prioritized replay's weights).
    fn of_sample<'a, O: Element>(s: &'a ReplaySample<O>, layout: &ObsLayout) -> Result<DqnBatch>
    where
        ObsRef<'a>: From<&'a [O]>,
    {
        let bootstrap: Vec<f32> =
            s.discounts.iter().zip(&s.terminated).map(|(g, t)| if *t { 0.0 } else { *g }).collect();
        let actions = Tensor::from_slice(&s.actions).to_kind(Kind::Int64);
        DqnBatch::new(layout, ObsRef::from(&s.obs[..]), ObsRef::from(&s.next_obs[..]), actions, &s.rewards, &bootstrap)
    }

    /// The members' batches (one shape) stacked on the member axis, `[N, B, …]`: a lone member's as a view,
    /// with its prioritized replay's weights and slots; several members' with uniform replay.
    fn stack(batches: &[DqnBatch]) -> DqnBatch {
        let stack = |f: fn(&DqnBatch) -> &Tensor| match batches {
            [one] => f(one).unsqueeze(0),
            _ => Tensor::stack(&batches.iter().map(f).collect::<Vec<_>>(), 0),
        };
        DqnBatch {
            obs: stack(|b| &b.obs),
            next_obs: stack(|b| &b.next_obs),
            actions: stack(|b| &b.actions),
            rewards: stack(|b| &b.rewards),
            bootstrap: stack(|b| &b.bootstrap),
            prioritized: match batches {
                [one] => one.prioritized.as_ref().map(|(w, i)| (w.unsqueeze(0), i.clone())),
                _ => None,
            },
            host: None,
        }
    }
}

/// The Q-networks a DQN gradient step trains, on the member axis ([`crate::nn::members`]): one agent's own
/// (any network — MLP, CNN, dueling, task heads — with replicas and micro-batches), or the plain MLPs of a
/// population's members stacked into `[N, P]` rows.
enum QNets<'a> {
    Alone(&'a mut Dqn),
    Stacked {
        online: Box<Rows>,
        /// The target networks' rows as [`mlp_operands`].
        target: Vec<Tensor>,
        /// Every member's network (a plain MLP; its precision and quantiles).
        q: Box<QNet>,
        opt: StackedAdam,
        /// Each member's gradient-norm limit and (`lrs`) learning rate.
        max_norms: Vec<f64>,
        lrs: Vec<f64>,
    },
}

impl QNets<'_> {
    /// The return quantiles `Z(obs, ·)` `[N, B, n_actions, quantiles]` (one quantile: the Q-values) on the
    /// members' observations `[N, B, …]`, with the online parameters or (`target`) the target network's.
    fn q(&self, obs: &Tensor, target: bool) -> Tensor {
        match self {
            QNets::Alone(m) => {
                let params = if target { &m.target } else { &m.online };
                m.q.forward_in(params, &obs.squeeze_dim(0), m.q.bf16).unsqueeze(0)
            }
            QNets::Stacked { online, target: t, q, .. } => {
                let online_operands = (!target).then(|| mlp_operands(&online.views));
                let params = online_operands.as_ref().unwrap_or(t);
                let (layers, activation) = q.mlp_layout().expect("checked by unbatchable");
                let z = batched_mlp(params, layers, &|h| activation.apply(h), obs, q.bf16);
                let size = z.size();
                z.view([size[0], size[1], -1, q.quantiles as i64])
            }
        }
    }

    /// A minibatch of `len` samples as micro-batches `(start, len)`, and the scale of each one's loss.
    fn micro_batches(&self, len: i64) -> (Vec<(i64, i64)>, f64) {
        match self {
            QNets::Alone(m) => m.parallel.micro_batches(len),
            QNets::Stacked { .. } => (vec![(0, len)], 1.0),
        }
    }

    /// Each member's gradient of `scale ·` its loss (`[N]`), added with `add`.
    fn backward(&mut self, losses: &Tensor, scale: f64, add: bool) {
        match self {
            QNets::Alone(m) => backward_alone(&mut m.online, losses, scale, add),
            QNets::Stacked { online, .. } => online.backward(losses),
        }
    }

    /// Average over replicas, clip each member's gradient to its limit, and take one Adam step.
    fn clip_and_step(&mut self) -> Result<()> {
        match self {
            QNets::Alone(m) => {
                reduce_and_clip_alone(&mut m.online, &mut m.parallel, m.config.max_grad_norm, "dqn")?;
                m.opt.step(&mut m.online);
            }
            QNets::Stacked { online, opt, max_norms, lrs, .. } => {
                clip_per_member(&online.grad, max_norms, "dqn")?;
                opt.step(&online.params, &online.grad, lrs);
            }
        }
        Ok(())
    }
}

/// DQN's gradient step, written once over the member axis: every member's Huber TD loss (QR-DQN: quantile Huber
/// loss) on its minibatch `b` `[N, B, …]` against the (double-)Q target of its target network, a mean over its
/// samples (importance-weighted with prioritized replay), averaged over replicas, clipped, and one Adam step.
/// Returns each member's loss `[N]`, the Q-values of the actions taken `[N, B]` and their targets.
fn td_step(nets: &mut QNets, b: &DqnBatch, double_q: bool) -> Result<(Tensor, Tensor, Tensor)> {
    // `[N, B, quantiles]`: the target network's quantiles (Q-values) of the greedy next action — greedy by the
    // online network's Q with double-Q — discounted onto the reward.
    let target = tch::no_grad(|| {
        let next_z = nets.q(&b.next_obs, true);
        let q_of = |z: &Tensor| z.mean_dim(-1, false, Kind::Float);
        let best = if double_q { q_of(&nets.q(&b.next_obs, false)) } else { q_of(&next_z) }.argmax(-1, true);
        let next = next_z.gather(2, &best.unsqueeze(-1).expand_as(&next_z.narrow(2, 0, 1)), false).squeeze_dim(2);
        b.rewards.unsqueeze(-1) + b.bootstrap.unsqueeze(-1) * next
    });
    let quantiles = target.size()[2];
    // The loss is a mean over the batch: each micro-batch's mean, scaled by 1/k, adds up to it.
    let (micro_batches, scale) = nets.micro_batches(b.actions.size()[1]);
    let (mut qs, mut losses) = (vec![], vec![]);
    for (j, &(start, len)) in micro_batches.iter().enumerate() {
        let micro = |t: &Tensor| if scale == 1.0 { t.shallow_clone() } else { t.narrow(1, start, len) };
        let z = nets.q(&micro(&b.obs), false);
        let index = micro(&b.actions).unsqueeze(-1).expand_as(&z.narrow(2, 0, 1));
        let z = z.gather(2, &index, false).squeeze_dim(2);
        let per_sample = if quantiles == 1 {
            z.smooth_l1_loss(&micro(&target), Reduction::None, 1.0).squeeze_dim(-1)
        } else {
            quantile_huber(&z, &micro(&target))
        };
        let loss = match &b.prioritized {
            None => per_sample,
            Some((weights, _)) => per_sample * micro(weights),
        }
        .mean_dim(-1, false, Kind::Float);
        nets.backward(&loss, scale, j > 0);
        qs.push(z.detach().mean_dim(-1, false, Kind::Float));
        losses.push(loss.detach());
    }
    let (q, loss) = if qs.len() == 1 {
        (qs.pop().expect("one"), losses.pop().expect("one"))
    } else {
        (Tensor::cat(&qs, 1), Tensor::stack(&losses, 0).mean_dim(0, false, Kind::Float))
    };
    nets.clip_and_step()?;
    Ok((loss, q, target.mean_dim(-1, false, Kind::Float)))
}

/// QR-DQN's quantile Huber loss per sample (κ = 1, as SB3-contrib's `quantile_huber_loss` with
/// `sum_over_quantiles`): current quantiles `z` and target quantiles `t`, both `[…, N]`; pairs `δ_ij = t_j − z_i`
/// weighted by `|τ̂_i − 1{δ_ij < 0}|` at the fractions `τ̂_i = (2i + 1)/2N`, summed over `i`, averaged over `j`.
fn quantile_huber(z: &Tensor, t: &Tensor) -> Tensor {
    let n = z.size()[z.dim() - 1];
    let delta = t.unsqueeze(-2) - z.unsqueeze(-1); // [.., i, j]
    let huber = delta.smooth_l1_loss(&delta.zeros_like(), Reduction::None, 1.0);
    let tau = ((Tensor::arange(n, (Kind::Float, z.device())) + 0.5) / n as f64).unsqueeze(-1);
    let weight = (tau - delta.detach().lt(0.0).to_kind(Kind::Float)).abs();
    (weight * huber).sum_dim_intlist(-2, false, Kind::Float).mean_dim(-1, false, Kind::Float)
}

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
        if layout(m) != layout(first)
            || m.online.numel() != first.online.numel()
            || m.q.device != first.q.device
            || m.q.bf16 != first.q.bf16
            || m.q.quantiles != first.q.quantiles
        {
            return Some("members' networks, precisions (bf16) or devices differ".into());
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

/// The training due after a lockstep env step, for every member: one batched phase of `td_step`s when all
/// are due together (each member's metrics), `None` for members with nothing due; members [`unbatchable`]
/// refuses update alone.
pub fn update_members(members: &mut [&mut Dqn], progress: &Progress) -> Result<Vec<Option<Metrics>>> {
    let refs: Vec<&Dqn> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().map(|m| m.update(progress)).collect();
    }
    let mut dues = Vec::with_capacity(members.len());
    for m in members.iter_mut() {
        m.set_learning_rate(progress);
        dues.push(lock(&m.side).phase_due(&m.config, progress));
    }
    if dues.iter().all(|&d| d == 0) {
        return Ok(vec![None; members.len()]);
    }
    if dues.iter().any(|&d| d != dues[0]) {
        return Err(Error::Unsupported(format!(
            "dqn population: members' training phases fell due apart ({dues:?} gradient steps)"
        )));
    }
    // The members' online and target networks and Adam states are rows of shared stacks (made at the first
    // batched phase, kept after): the steps are theirs, nothing is written back.
    let online = Box::new(Rows::of(&mut members.iter_mut().map(|m| &mut m.online).collect::<Vec<_>>()));
    let opt = StackedAdam::of(&mut members.iter_mut().map(|m| &mut m.opt).collect::<Vec<_>>(), &online.params);
    let targets = shared_rows(&mut members.iter_mut().map(|m| &mut m.target).collect::<Vec<_>>());
    let target = tch::no_grad(|| mlp_operands(&member_views(&targets, &members[0].target)));
    let lrs = members.iter().map(|m| m.opt.lr).collect();
    let max_norms = members.iter().map(|m| m.config.max_grad_norm).collect();
    let mut nets = QNets::Stacked { online, target, q: Box::new(members[0].q.clone()), opt, max_norms, lrs };
    let (layout, batch, double_q) = (members[0].q.layout(), members[0].config.batch_size, members[0].config.double_q);
    let mut phase = Vec::with_capacity(dues[0]);
    let stepped = (|| -> Result<()> {
        for _ in 0..dues[0] {
            let samples = members.iter().map(|m| lock(&m.side).sample(batch, &layout)).collect::<Result<Vec<_>>>()?;
            let (loss, q, _) = td_step(&mut nets, &DqnBatch::stack(&samples), double_q)?;
            for m in members.iter() {
                lock(&m.side).counters.gradient_steps += 1;
            }
            phase.push((loss, q.mean_dim(1, false, Kind::Float)));
        }
        Ok(())
    })();
    // The steps taken are the members' (as alone, a failed step is not taken, the ones before it are): each
    // optimiser counts them.
    let QNets::Stacked { opt, .. } = &nets else { unreachable!("stacked above") };
    for m in members.iter_mut() {
        opt.finish(&mut m.opt);
    }
    stepped?;
    members
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let own: Vec<(Tensor, Tensor)> = phase.iter().map(|(l, q)| (l.get(k as i64), q.get(k as i64))).collect();
            let Counters { epsilon, beta, .. } = lock(&m.side).counters;
            m.phase_metrics(&own, epsilon, beta).map(Some)
        })
        .collect()
}

/// DQN's data side for a learner's batch-assembly thread ([`crate::algorithm::ReplayAhead::replay_feed`]): it
/// observes transitions into the agent's replay and, whenever a training phase is due, samples its minibatches onto
/// the device as [`Prepared`] work — exactly the draws [`Algorithm::update`] would make at that point, so training
/// on them gives the same result. Uniform and frame replay only.
#[derive(Debug)]
pub struct DqnFeed {
    side: Arc<Mutex<DataSide>>,
    config: DqnConfig,
    n_envs: usize,
    layout: ObsLayout,
}

/// The data side, whichever thread panicked holding it (its contents stay consistent between calls).
pub(crate) fn lock(side: &Mutex<DataSide>) -> MutexGuard<'_, DataSide> {
    side.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a [`DqnFeed`] prepares ([`Prepared`]'s contents for DQN).
#[derive(Debug)]
enum DqnWork {
    /// The target network follows the online one (before the gradient steps prepared after it).
    SyncTarget,
    /// One gradient step's minibatch, and where it sits in its training phase.
    Batch(Box<DqnBatch>, PhaseStep),
}

impl ReplayFeed for DqnFeed {
    fn observe(&mut self, chunk: &Chunk, progress: &Progress, out: &mut Vec<Prepared>) -> Result<()> {
        let mut side = lock(&self.side);
        for _ in 0..side.observe(chunk, &self.config, self.n_envs)? {
            out.push(Prepared(Box::new(DqnWork::SyncTarget)));
        }
        let due = side.phase_due(&self.config, progress);
        // The fused CPU step trains on the host rows: keep a copy when it may apply (the agent decides).
        let host_copy = self.config.fused_cpu && self.layout.device == Device::Cpu && self.layout.image.is_none();
        for i in 0..due {
            let mut batch = side.sample(self.config.batch_size, &self.layout)?;
            batch.host = host_copy.then(|| Box::new(side.sample.clone()));
            let c = &side.counters;
            let at = PhaseStep { progress: *progress, epsilon: c.epsilon, beta: c.beta, last: i + 1 == due };
            out.push(Prepared(Box::new(DqnWork::Batch(Box::new(batch), at))));
        }
        Ok(())
    }
}

/// The Q-network's layout and forward passes, shared by the agent and its acting copy ([`WarmupPolicy`]).
#[derive(Debug, Clone)]
pub(crate) struct QNet {
    body: QBody,
    pub(crate) dueling: bool,
    n_actions: usize,
    obs_dim: usize,
    /// Q heads, one per task (1 without task heads); a row reads its task's, by the one-hot ending its input.
    pub(crate) heads: usize,
    pub(crate) device: Device,
    /// The MLP's hidden layers in bf16 in training passes ([`DqnConfig::bf16`] on the CPU); acting passes are
    /// f32.
    pub(crate) bf16: bool,
    /// Return quantiles per action (1: DQN's expected value; [`DqnConfig::n_quantiles`]).
    pub(crate) quantiles: usize,
}

/// An MLP for vector observations, the Nature CNN for frame stacks.
#[derive(Debug, Clone)]
enum QBody {
    Mlp(FlatMlp),
    Cnn(NatureCnn),
}

impl QNet {
    /// The network for these spaces (a `Discrete` action space) and its initial parameters, seeded: PyTorch's
    /// default init for MLPs (SB3), orthogonal with gain √2 (output layer 1) for the CNN.
    fn init(o: &Space, a: &Space, config: &DqnConfig, seed: u64) -> Result<(QNet, Vec<(String, Tensor)>)> {
        let (n_actions, heads, outputs) = config.q_shape(a)?;
        if heads > 1 && (is_image(o) || o.flat_dim() <= heads) {
            return Err(bad_obs(format!(
                "{o:?}: {heads} task heads need vector observations ending in the task's one-hot \
                 ([[tasks]])"
            )));
        }
        let (obs_dim, body, named) = if is_image(o) {
            let shape = o.shape();
            let built = with_torch_seed(seed, || NatureCnn::init("q", shape, &[(outputs as i64, 1.0)], 0))
                .map(|(cnn, named)| (cnn.with_options(config.cnn), named));
            let (cnn, named) = built.ok_or_else(|| {
                bad_obs(format!("frames of shape {shape:?}: the Nature CNN takes [C, H, W] with H, W ≥ 36"))
            })?;
            (o.flat_dim(), QBody::Cnn(cnn), named)
        } else {
            let obs_dim = mlp_input_dim("dqn", o)?;
            let DqnConfig { hidden_sizes, activation, .. } = config;
            let mlp =
                || FlatMlp::init("q", obs_dim as i64, hidden_sizes, outputs as i64, *activation, LayerInit::Torch, 0);
            let (net, named) = with_torch_seed(seed, mlp);
            (obs_dim, QBody::Mlp(net), named)
        };
        let (dueling, quantiles) = (config.dueling, config.n_quantiles.max(1));
        let q = QNet { body, dueling, n_actions, obs_dim, heads, device: Device::Cpu, bf16: false, quantiles };
        Ok((q, named))
    }

    /// How observations become the network's input.
    pub(crate) fn layout(&self) -> ObsLayout {
        let image = if let QBody::Cnn(cnn) = &self.body { Some(cnn.shape()) } else { None };
        ObsLayout { obs_dim: self.obs_dim, image, device: self.device }
    }

    /// `Q(obs, ·)` `[B, n_actions]` with the parameters `params` (online or target): with quantiles, their mean.
    fn forward(&self, params: &FlatParams, obs: &Tensor) -> Tensor {
        let z = self.forward_in(params, obs, false);
        if self.quantiles == 1 { z.squeeze_dim(-1) } else { z.mean_dim(-1, false, Kind::Float) }
    }

    /// The return quantiles `[B, n_actions, quantiles]` (`quantiles` 1: the Q-values); with `bf16` (a gradient
    /// step's choice, [`QNet::bf16`]) an MLP's hidden layers in bf16.
    fn forward_in(&self, params: &FlatParams, obs: &Tensor, bf16: bool) -> Tensor {
        let mut out = match &self.body {
            QBody::Mlp(net) => net.forward_in(params, obs, bf16),
            QBody::Cnn(cnn) => cnn.forward(params, obs),
        };
        if self.heads > 1 {
            // Each row's own task's head: weights 1 on its task, 0 on the others (the one-hot).
            out = crate::nn::nets::select_task_heads_tensor(obs, self.heads, &out);
        }
        let out = out.view([out.size()[0], -1, self.quantiles as i64]);
        if self.dueling {
            let value = out.narrow(1, 0, 1);
            let advantage = out.narrow(1, 1, self.n_actions as i64);
            value + &advantage - advantage.mean_dim(1, true, Kind::Float)
        } else {
            out
        }
    }

    /// The MLP body's layer weight indices and nonlinearity (`None` for the CNN), for a population's batched
    /// update.
    pub(crate) fn mlp_layout(&self) -> Option<(&[usize], crate::nn::nets::Activation)> {
        if let QBody::Mlp(net) = &self.body { Some(net.layout()) } else { None }
    }

    /// `Q(obs, ·)` for acting, row-major into `q_values`: an MLP on f32 observations without libtorch when the
    /// parameters are on the CPU.
    fn q_values(
        &self,
        params: &FlatParams,
        obs: ObsRef<'_>,
        host: &mut (HostScratch, Vec<f32>),
        q_values: &mut Vec<f32>,
    ) -> Result<()> {
        if obs.is_empty() || !obs.len().is_multiple_of(self.obs_dim) {
            return Err(Error::length("observation batch", obs.len(), self.obs_dim));
        }
        let rows = obs.len() / self.obs_dim;
        let (scratch, raw) = host;
        let on_host = match (&self.body, obs) {
            (QBody::Mlp(net), ObsRef::F32(x)) => net.forward_host(params, x, rows, scratch, raw).then_some(x),
            _ => None,
        };
        if let Some(x) = on_host {
            // The network without libtorch (CPU parameters); the dueling combination as `forward` does it.
            q_values.clear();
            if self.heads > 1 {
                crate::nn::nets::select_task_heads(x, self.obs_dim, self.heads, raw);
            }
            let n = self.quantiles;
            for row in raw.chunks_exact(raw.len() / rows) {
                // Q-values: each action's mean over its quantiles (itself with one).
                let start = q_values.len();
                q_values.extend(row.chunks_exact(n).map(|z| z.iter().sum::<f32>() / n as f32));
                if self.dueling {
                    // [V, A_1..A_n] ─► Q_a = V + A_a − mean(A), in place.
                    let value = q_values[start];
                    q_values.copy_within(start + 1.., start);
                    q_values.pop();
                    let advantage = &mut q_values[start..];
                    let mean = advantage.iter().sum::<f32>() / advantage.len() as f32;
                    advantage.iter_mut().for_each(|a| *a = value + *a - mean);
                }
            }
        } else {
            let x = self.layout().tensor(obs)?;
            let q = tch::no_grad(|| self.forward(params, &x));
            *q_values = Vec::<f32>::try_from(q.flatten(0, -1).to_device(Device::Cpu))?;
        }
        Ok(())
    }
}

fn bad_obs(detail: String) -> Error {
    Error::space("observation", "dqn", detail)
}

fn unsupported_obs(obs: ObsRef<'_>) -> Error {
    bad_obs(format!("{:?} observations for a network built for frames", obs.dtype()))
}

/// Fill `out` from `out.q_values`: the greedy action, or with `epsilon` a uniformly random one with that
/// probability.
fn epsilon_greedy(n_actions: usize, epsilon: Option<f64>, rng: &mut Pcg64, out: &mut ActOutput) {
    out.actions.clear();
    out.log_probs.clear();
    out.values.clear();
    for row in out.q_values.chunks_exact(n_actions) {
        let action = match epsilon {
            Some(eps) if rng.random::<f64>() < eps => rng.random_range(0..n_actions),
            _ => row.iter().enumerate().fold(0, |best, (i, q)| if *q > row[best] { i } else { best }),
        };
        out.actions.push(action as f32);
    }
}

/// An acting copy's ε-greedy exploration: ε = max(its Ape-X floor, the run's schedule at the learner's progress).
#[derive(Debug)]
pub(crate) struct Epsilon {
    schedule: DqnConfig,
    floor: f64,
    epsilon: f64,
}

impl ActingNet for QNet {
    type Explore = Epsilon;

    fn dims(&self) -> (usize, usize) {
        (self.obs_dim, 1)
    }

    /// Greedy in `Q`; when exploring, ε-greedy (ε = 1 during the warm-up). Fills `q_values`.
    fn act(
        &self,
        params: &FlatParams,
        obs: ObsRef<'_>,
        warm_up: bool,
        explore: Option<&mut Epsilon>,
        rng: &mut Pcg64,
        host: &mut (HostScratch, Vec<f32>),
        out: &mut ActOutput,
    ) -> Result<()> {
        self.q_values(params, obs, host, &mut out.q_values)?;
        let eps = explore.map(|e| if warm_up { 1.0 } else { e.floor.max(e.epsilon) });
        epsilon_greedy(self.n_actions, eps, rng, out);
        Ok(())
    }

    fn follow(e: &mut Epsilon, progress: &Progress) {
        e.epsilon = e.schedule.epsilon(progress.remaining());
    }
}

/// Ape-X's per-actor exploration (Horgan et al. 2018): actor `i` of `n` uses `ε_i = ε^(1 + α·i/(n−1))`
/// (ε = 0.4, α = 7 in the paper), so a few actors explore widely and most act nearly greedily.
pub fn apex_epsilon(i: usize, n: usize, epsilon: f64, alpha: f64) -> f64 {
    if n <= 1 { epsilon } else { epsilon.powf(1.0 + alpha * i as f64 / (n - 1) as f64) }
}

impl Dqn {
    /// A fresh agent for observation space `o` and a `Discrete` action space `a`, fed by `n_envs` envs.
    pub fn new(o: &Space, a: &Space, n_envs: usize, config: DqnConfig, device: Device, seed: u64) -> Result<Self> {
        config.validate()?;
        let (mut q, named) = QNet::init(o, a, &config, seed)?;
        q.device = device;
        q.bf16 = config.bf16 && device == Device::Cpu && q.mlp_layout().is_some();
        let obs_dim = q.obs_dim;
        let online = FlatParams::new(named, device);
        let target = online.target_copy();
        let opt = Adam::new(&online, config.learning_rate, config.adam_eps);
        let (n, gamma, capacity) = (config.n_step, config.gamma, config.buffer_size);
        let memory = match (is_image(o), config.prioritized_replay) {
            (true, true) => {
                let detail = "prioritized replay of frame stacks is not implemented; set it to false for image \
                              observations (they use a frame-deduplicating uniform replay)";
                return Err(Error::config("dqn", "prioritized_replay", "true", detail));
            }
            (true, false) => {
                let [c, h, w] = o.shape() else { unreachable!("image observations are [C, H, W]") };
                Memory::Frames(NStep::new(n, n_envs, obs_dim, 1, gamma)?, FrameReplay::new(capacity, *c, h * w, 1)?)
            }
            (false, true) => {
                let per = PrioritizedReplay::new(capacity, obs_dim, 1, config.per_alpha, config.per_eps);
                Memory::Prioritized(NStep::new(n, n_envs, obs_dim, 1, gamma)?, per?)
            }
            (false, false) => {
                Memory::Uniform(NStep::new(n, n_envs, obs_dim, 1, gamma)?, ReplayBuffer::new(capacity, obs_dim, 1)?)
            }
        };
        let counters =
            Counters { epsilon: config.exploration_initial_eps, beta: config.per_beta0, ..Default::default() };
        let side = DataSide {
            memory,
            rng: Pcg64::seed_from_u64(seed ^ 0xd9_0000),
            counters,
            sample: ReplaySample::default(),
            frames_sample: ReplaySample::default(),
            next: ObsBuf::empty(DType::F32),
            obs_dim,
        };
        Ok(Dqn {
            q,
            online,
            target,
            opt,
            side: Arc::new(Mutex::new(side)),
            n_envs,
            phase: Vec::new(),
            host: Default::default(),
            parallel: DataParallel::default(),
            host_step: None,
            config,
        })
    }

    /// One gradient step on the given transitions rather than a replay sample (offline data, distillation,
    /// tests): `B` rows of `obs` / `next_obs`, `actions`, (n-step) `rewards` and `bootstrap` (γ^m, 0 where the
    /// episode terminated). Returns the TD loss. Counts as a gradient step; the target network does not follow.
    pub fn train_on(
        &mut self,
        obs: ObsRef<'_>,
        actions: &[i64],
        rewards: &[f32],
        bootstrap: &[f32],
        next_obs: ObsRef<'_>,
    ) -> Result<f64> {
        let (b, od, n) = (actions.len(), self.q.obs_dim, self.q.n_actions);
        let sizes = [("rewards", rewards.len(), b), ("bootstrap", bootstrap.len(), b)];
        for (what, got, expected) in
            sizes.into_iter().chain([("obs", obs.len(), b * od), ("next_obs", next_obs.len(), b * od)])
        {
            check_len(&format!("dqn train_on {what}"), got, expected)?;
        }
        if let Some(a) = actions.iter().find(|a| **a < 0 || **a as usize >= n) {
            return Err(Error::length(format!("dqn train_on action {a}"), 1, n));
        }
        let batch = DqnBatch::new(&self.q.layout(), obs, next_obs, Tensor::from_slice(actions), rewards, bootstrap)?;
        let (loss, _) = self.gradient_step(&batch)?;
        Ok(f64::try_from(loss)?)
    }

    /// One gradient step on a replay sample ([`td_step`] of this agent alone), then the new priorities
    /// (prioritized replay) and the step count; returns (loss, mean Q) as tensors.
    fn gradient_step(&mut self, b: &DqnBatch) -> Result<(Tensor, Tensor)> {
        let (stacked, double_q) = (DqnBatch::stack(std::slice::from_ref(b)), self.config.double_q);
        let (loss, q, target) = td_step(&mut QNets::Alone(self), &stacked, double_q)?;
        let mut side = lock(&self.side);
        if let (Some((_, indices)), Memory::Prioritized(_, r)) = (&b.prioritized, &mut side.memory) {
            let td: Vec<f32> = Vec::try_from((&q - &target).to_device(Device::Cpu).view([-1]))?;
            r.update_priorities(indices, &td)?;
        }
        side.counters.gradient_steps += 1;
        Ok((loss.squeeze_dim(0), q.mean(Kind::Float)))
    }

    /// The fused CPU step's state, taken out of `self` for a step, when this agent's steps can take it
    /// ([`DqnConfig::fused_cpu`]; uniform or prioritized replay of f32 observations).
    fn fused_path(&mut self) -> Option<DqnHost> {
        let single = self.parallel.replicas() == 1 && self.parallel.accumulate() == 1;
        let frames = matches!(lock(&self.side).memory, Memory::Frames(..));
        if !self.config.fused_cpu || !single || frames || self.q.dueling || self.q.heads > 1 {
            return None;
        }
        let (layers, activation) = self.q.mlp_layout()?;
        let (n_actions, quantiles, bf16) = (self.q.n_actions, self.q.quantiles, self.q.bf16);
        self.host_step.take().or_else(|| DqnHost::new(&self.online, layers, activation, n_actions, quantiles, bf16))
    }

    /// One gradient step on the prepared batch, or (`None`) on a fresh replay sample: on the fused CPU path
    /// where it applies (a prepared batch needs its host rows), else on libtorch ([`Dqn::gradient_step`]), each
    /// drawing from the same RNG; (loss, mean Q).
    fn step(&mut self, prepared: Option<&DqnBatch>) -> Result<(Tensor, Tensor)> {
        let mut host = self.fused_path();
        let step = match (host.as_mut(), prepared) {
            (Some(host), Some(DqnBatch { host: Some(sample), .. })) => self.fused_step(host, sample),
            (Some(host), None) => {
                // The sample buffers leave the data side for the step (it locks the side again) and come back.
                let (drawn, sample) = {
                    let mut side = lock(&self.side);
                    (side.draw(self.config.batch_size), std::mem::take(&mut side.sample))
                };
                let step = drawn.and_then(|()| self.fused_step(host, &sample));
                lock(&self.side).sample = sample;
                step
            }
            (_, Some(b)) => self.gradient_step(b),
            (None, None) => {
                let sample = lock(&self.side).sample(self.config.batch_size, &self.q.layout());
                sample.and_then(|b| self.gradient_step(&b))
            }
        };
        self.host_step = host;
        step
    }

    /// One fused CPU gradient step on a host replay sample, then the new priorities (prioritized replay) and
    /// the step count; (loss, mean Q).
    fn fused_step(&mut self, host: &mut DqnHost, sample: &ReplaySample<f32>) -> Result<(Tensor, Tensor)> {
        let (double_q, max_grad_norm) = (self.config.double_q, self.config.max_grad_norm);
        let (loss, mean_q) =
            host.step(&mut self.online, &self.target, &mut self.opt, sample, double_q, max_grad_norm)?;
        let mut side = lock(&self.side);
        if let Memory::Prioritized(_, r) = &mut side.memory {
            r.update_priorities(&sample.indices, host.td())?;
        }
        side.counters.gradient_steps += 1;
        Ok((Tensor::from(loss), Tensor::from(mean_q)))
    }

    /// The learning rate at `progress`.
    pub(crate) fn set_learning_rate(&mut self, progress: &Progress) {
        let c = &self.config;
        self.opt.lr = if c.anneal_lr { c.learning_rate * progress.remaining() } else { c.learning_rate };
    }

    /// A training phase's metrics from its gradient steps' (loss, mean Q).
    pub(crate) fn phase_metrics(&self, steps: &[(Tensor, Tensor)], epsilon: f64, beta: f64) -> Result<Metrics> {
        let mean = |pick: fn(&(Tensor, Tensor)) -> &Tensor| -> Result<f64> {
            let ts: Vec<&Tensor> = steps.iter().map(pick).collect();
            Ok(f64::try_from(Tensor::stack(&ts, 0).mean(Kind::Float))?)
        };
        let mut m = Metrics::default();
        m.push("losses/td_loss", mean(|s| &s.0)?);
        m.push("losses/q_values", mean(|s| &s.1)?);
        m.push("charts/epsilon", epsilon);
        m.push("charts/learning_rate", self.opt.lr);
        m.push("charts/gradient_steps", steps.len() as f64);
        if self.config.prioritized_replay {
            m.push("charts/per_beta", beta);
        }
        Ok(m)
    }
}

impl Policy for Dqn {
    fn obs_dim(&self) -> usize {
        self.q.obs_dim
    }

    fn act_dim(&self) -> usize {
        1
    }

    /// Greedy in `Q`; with `Explore`, ε-greedy (uniformly random before `learning_starts`). Fills `q_values`.
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        self.q.q_values(&self.online, obs, &mut self.host, &mut out.q_values)?;
        let side = &mut *lock(&self.side);
        let c = &side.counters;
        let eps = if c.env_steps < self.config.learning_starts { 1.0 } else { c.epsilon };
        epsilon_greedy(self.q.n_actions, (mode == ActMode::Explore).then_some(eps), &mut side.rng, out);
        Ok(())
    }
}

impl Algorithm for Dqn {
    fn replay_ahead(&mut self) -> Option<&mut dyn crate::algorithm::ReplayAhead> {
        Some(self)
    }

    fn replicated(&mut self) -> Option<&mut dyn crate::algorithm::Replicated> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "dqn"
    }

    /// The online network's Q-values.
    fn teach(&mut self, obs: ObsRef<'_>) -> Result<crate::teaching::Teaching> {
        let x = self.q.layout().tensor(obs)?;
        let q = tch::no_grad(|| self.q.forward(&self.online, &x));
        Ok(crate::teaching::Teaching::new(crate::teaching::TeachingKind::QValues, &q))
    }

    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        for chunk in chunks {
            for _ in 0..lock(&self.side).observe(chunk, &self.config, self.n_envs)? {
                self.target.polyak_from(&self.online, self.config.tau);
            }
        }
        Ok(())
    }

    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        self.set_learning_rate(progress);
        let due = lock(&self.side).phase_due(&self.config, progress);
        if due == 0 {
            return Ok(None);
        }
        let steps = (0..due).map(|_| self.step(None)).collect::<Result<Vec<_>>>()?;
        let Counters { epsilon, beta, .. } = lock(&self.side).counters;
        Ok(Some(self.phase_metrics(&steps, epsilon, beta)?))
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("q.online", self.online.flat());
        c.put_tensor("q.target", self.target.flat());
        self.opt.write_to(&mut c, "adam")?;
        let side = lock(&self.side);
        match &side.memory {
            Memory::Uniform(n, r) => (n.write_to(&mut c, "n_step")?, r.write_to(&mut c, "replay")?),
            Memory::Prioritized(n, r) => (n.write_to(&mut c, "n_step")?, r.write_to(&mut c, "replay")?),
            Memory::Frames(n, r) => (n.write_to(&mut c, "n_step")?, r.write_to(&mut c, "replay")?),
        };
        c.put_meta("rng", &side.rng)?;
        c.put_meta("counters", &side.counters)?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        c.copy_into("q.online", self.online.flat())?;
        c.copy_into("q.target", self.target.flat())?;
        self.opt.read_from(c, "adam", &self.online)?;
        let side = &mut *lock(&self.side);
        match &mut side.memory {
            Memory::Uniform(n, r) => (n.read_from(c, "n_step")?, r.read_from(c, "replay")?),
            Memory::Prioritized(n, r) => (n.read_from(c, "n_step")?, r.read_from(c, "replay")?),
            Memory::Frames(n, r) => (n.read_from(c, "n_step")?, r.read_from(c, "replay")?),
        };
        side.rng = c.meta("rng")?;
        side.counters = c.meta("counters")?;
        self.phase.clear();
        Ok(())
    }

    fn policy_params(&self) -> &FlatParams {
        &self.online
    }

    fn policy_params_mut(&mut self) -> &mut FlatParams {
        &mut self.online
    }

    fn policy_params_changed(&mut self) {
        self.target.polyak_from(&self.online, 1.0);
    }
}

impl crate::algorithm::ReplayAhead for Dqn {
    /// Uniform and frame replay: a [`DqnFeed`] sharing this agent's replay. Prioritized replay refuses (each
    /// draw needs the priorities the update before it sets).
    fn replay_feed(&mut self) -> Result<Box<dyn ReplayFeed>> {
        if matches!(lock(&self.side).memory, Memory::Prioritized(..)) {
            let why = "dqn with prioritized_replay cannot sample ahead of its update: each draw needs the priorities \
                       the update before it sets";
            return Err(Error::Unsupported(why.into()));
        }
        let (side, config, layout) = (self.side.clone(), self.config.clone(), self.q.layout());
        Ok(Box::new(DqnFeed { side, config, n_envs: self.n_envs, layout }))
    }

    fn train_prepared(&mut self, work: Prepared) -> Result<Option<Metrics>> {
        let work = work
            .0
            .downcast::<DqnWork>()
            .map_err(|_| Error::Unsupported("dqn: prepared work made by another kind of agent".into()))?;
        match *work {
            DqnWork::SyncTarget => {
                self.target.polyak_from(&self.online, self.config.tau);
                Ok(None)
            }
            DqnWork::Batch(batch, at) => {
                self.set_learning_rate(&at.progress);
                // A failed step ends its phase: the next batch starts a fresh one.
                let step = self.step(Some(&batch)).inspect_err(|_| self.phase.clear())?;
                self.phase.push(step);
                if !at.last {
                    return Ok(None);
                }
                let steps = std::mem::take(&mut self.phase);
                Ok(Some(self.phase_metrics(&steps, at.epsilon, at.beta)?))
            }
        }
    }
}

impl crate::algorithm::Replicated for Dqn {
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()> {
        parallel.check_batch("dqn", "batch_size", self.config.batch_size)?;
        self.parallel = parallel;
        Ok(())
    }
}

#[cfg(test)]
mod apex_tests {
    use super::*;

    #[test]
    fn apex_epsilons_span_from_epsilon_to_nearly_greedy() {
        let eps: Vec<f64> = (0..4).map(|i| apex_epsilon(i, 4, 0.4, 7.0)).collect();
        assert_eq!(eps[0], 0.4);
        assert!((eps[3] - 0.4f64.powi(8)).abs() < 1e-12);
        assert!(eps.windows(2).all(|w| w[1] < w[0]));
        assert_eq!(apex_epsilon(0, 1, 0.4, 7.0), 0.4);
    }

    #[test]
    fn an_actor_explores_at_its_floor_after_the_learners_warm_up() {
        let space = Space::box1d(vec![-1.0; 2], vec![1.0; 2]);
        let config = DqnConfig { exploration_final_eps: 0.0, ..Default::default() };
        let (action_space, frozen) = (Space::discrete(3), []);
        let setup = ActingSetup {
            observation_space: &space,
            action_space: &action_space,
            n_envs: 64,
            seed: 0,
            epsilon_floor: 0.0,
            frozen: &frozen,
        };
        let Acting::Chunks(mut dqn) = config.build_acting(&setup).unwrap() else { panic!("dqn acts") };
        let mut random = ActOutput::default();
        dqn.act(ObsRef::F32(&[0.3f32, -0.2].repeat(64)), ActMode::Explore, &mut random).unwrap();
        let distinct = random.actions.iter().map(|a| *a as usize).collect::<std::collections::HashSet<_>>();
        assert_eq!(distinct.len(), 3, "uniformly random while the learner is warming up");
        // Past the schedule's decay, with a floor of 0: greedy.
        dqn.set_progress(&Progress { env_steps: 50_000, total_env_steps: 50_000 });
        let mut out = ActOutput::default();
        let obs = [0.3f32, -0.2];
        let mut greedy = ActOutput::default();
        dqn.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut greedy).unwrap();
        for _ in 0..20 {
            dqn.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            assert_eq!(out.actions, greedy.actions, "ε = max(0, 0) acts greedily");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::ReplayAhead;

    /// Four stacked 36×36 u8 frames: small enough for a test, large enough for the Nature CNN's strides.
    fn frame_stack_space() -> Space {
        let dim = 4 * 36 * 36;
        Space::Box {
            low: vec![0.0; dim],
            high: vec![255.0; dim],
            shape: vec![4, 36, 36],
            dtype: flotilla_core::DType::U8,
        }
    }

    fn spaces() -> (Space, Space) {
        (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::discrete(2))
    }

    /// The quantile Huber loss against SB3-contrib's definition, worked by hand: current quantiles (0, 1) at
    /// τ̂ = (¼, ¾), targets (0.5, 3). Pairs δ = t_j − z_k: (0.5, 3) for k = 0 and (−0.5, 2) for k = 1; Huber
    /// (0.125, 2.5) and (0.125, 1.5); weights |τ̂_k − 1{δ < 0}|: (¼, ¼) and (¼, ¾). Σ_k mean_j = (0.125·¼ +
    /// 2.5·¼)/2 + (0.125·¼ + 1.5·¾)/2 = 0.328125 + 0.578125 = 0.90625. Its gradient in z_k is
    /// −mean_j weight · clamp(δ, ±1): z_0 −(¼·0.5 + ¼·1)/2 = −0.1875, z_1 −(¼·(−0.5) + ¾·1)/2 = −0.3125.
    #[test]
    fn the_quantile_huber_loss_is_sb3_contribs() {
        let z = Tensor::from_slice(&[0.0f32, 1.0]).view([1, 2]).set_requires_grad(true);
        let t = Tensor::from_slice(&[0.5f32, 3.0]).view([1, 2]);
        let loss = quantile_huber(&z, &t);
        assert!((f64::try_from(&loss).unwrap() - 0.90625).abs() < 1e-6, "{loss}");
        loss.sum(Kind::Float).backward();
        let g = Vec::<f32>::try_from(z.grad().view([-1])).unwrap();
        assert!((g[0] + 0.1875).abs() < 1e-6 && (g[1] + 0.3125).abs() < 1e-6, "{g:?}");
    }

    /// QR-DQN acts on the mean of each action's quantiles, on the host path and on libtorch, dueling too.
    #[test]
    fn qr_dqn_acts_on_the_mean_of_its_quantiles() {
        let (o, a) = spaces();
        for dueling in [false, true] {
            let c = DqnConfig { n_quantiles: 4, dueling, hidden_sizes: vec![16], bf16: false, ..DqnConfig::default() };
            let mut dqn = Dqn::new(&o, &a, 2, c, Device::Cpu, 3).unwrap();
            let rows = [0.1f32, -0.4, 0.7, 0.9, 0.2, -0.3];
            let x = Tensor::from_slice(&rows).view([2, 3]);
            let z = dqn.q.forward_in(&dqn.online, &x, dqn.q.bf16);
            assert_eq!(z.size(), [2, 2, 4], "[B, actions, quantiles]");
            let want = Vec::<f32>::try_from(z.mean_dim(-1, false, Kind::Float).view([-1])).unwrap();
            let mut out = ActOutput::default();
            dqn.act(ObsRef::F32(&rows), ActMode::Deterministic, &mut out).unwrap();
            for (g, w) in out.q_values.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "dueling {dueling}: host {:?} vs libtorch {want:?}", out.q_values);
            }
            let forward = Vec::<f32>::try_from(dqn.q.forward(&dqn.online, &x).view([-1])).unwrap();
            assert_eq!(forward, want, "dueling {dueling}");
        }
    }

    /// `bf16 = true` (forced, so this runs on any CPU) with `fused_cpu = false` trains the MLP on libtorch with
    /// bf16 hidden matmuls:
    /// three gradient steps from one state follow the f32 libtorch steps (losses within 2 %, the parameter
    /// change's direction within cosine 0.95) and differ from them (bf16 ran).
    #[test]
    fn a_bf16_step_follows_the_f32_step() {
        use crate::continuous::bandit::{cosine_of_changes, random_rows};
        let (o, a) = spaces();
        let values = |p: &FlatParams| Vec::<f32>::try_from(p.flat().detach()).unwrap();
        let build = |bf16: bool| {
            let c = DqnConfig { bf16, fused_cpu: false, hidden_sizes: vec![64, 64], ..DqnConfig::default() };
            Dqn::new(&o, &a, 2, c, Device::Cpu, 4).unwrap()
        };
        let (mut f32s, mut mixed) = (build(false), build(true));
        assert!(mixed.q.bf16 && !f32s.q.bf16);
        let before = values(&f32s.online);
        for step in 0..3 {
            let [x, u, r, g, n] = random_rows(step, 32, 3, 1);
            let actions: Vec<i64> = u.iter().map(|&u| i64::from(u > 0.0)).collect();
            let p = f32s.train_on(ObsRef::F32(&x), &actions, &r, &g, ObsRef::F32(&n)).unwrap();
            let q = mixed.train_on(ObsRef::F32(&x), &actions, &r, &g, ObsRef::F32(&n)).unwrap();
            assert!((p - q).abs() <= 0.02 * p.abs().max(1e-2), "step {step} loss: f32 {p}, bf16 {q}");
        }
        let (p, q) = (values(&f32s.online), values(&mixed.online));
        assert_ne!(p, q, "bf16 ran (its rounding shows)");
        let cos = cosine_of_changes(&before, &p, &q);
        assert!(cos > 0.95, "bf16's change against f32's, cosine {cos}");
    }

    /// `bf16 = true` on the fused host step (the hidden layers' products in bf16, `nn::gemm::Bf16Gemm`: the
    /// CPU's AVX512-BF16 kernel where it has one, else the rounded operands in f32): over the same stream of
    /// transitions and replay draws, DQN and QR-DQN (double Q, 3-step) follow the f32 fused steps — every
    /// phase's loss within 3 % and mean Q within 1 %, the parameter change's direction within cosine 0.95 — and
    /// differ from them (bf16 ran).
    #[test]
    fn a_bf16_fused_step_follows_the_f32_fused_step() {
        use crate::continuous::bandit::cosine_of_changes;
        let base = DqnConfig {
            learning_starts: 40,
            train_freq: 4,
            gradient_steps: 3,
            batch_size: 32,
            buffer_size: 300,
            target_update_interval: 20,
            hidden_sizes: vec![64, 64],
            double_q: true,
            n_step: 3,
            ..Default::default()
        };
        let vector =
            |t: u64, e: usize| (0..4).map(|i| ((t * 7 + i * 3 + e as u64) % 13) as f32 / 13.0).collect::<Vec<f32>>();
        let obs_space = Space::box1d(vec![0.0; 4], vec![1.0; 4]);
        for (what, config) in [("dqn", base.clone()), ("qr-dqn", DqnConfig { n_quantiles: 8, ..base.clone() })] {
            let make = |bf16| {
                let c = DqnConfig { bf16, fused_cpu: true, ..config.clone() };
                Dqn::new(&obs_space, &Space::discrete(3), 2, c, Device::Cpu, 5).unwrap()
            };
            let (mut f32s, mut mixed) = (make(false), make(true));
            assert!(mixed.q.bf16 && !f32s.q.bf16, "{what}");
            let w = |d: &Dqn| Vec::<f32>::try_from(d.online.flat().detach()).unwrap();
            let before = w(&f32s);
            let (mut mf, mut mb) = (Vec::new(), Vec::new());
            fixed_stream(
                200,
                vector,
                |o| ObsRef::F32(o),
                |step, progress| {
                    f32s.observe(std::slice::from_ref(step)).unwrap();
                    mf.extend(f32s.update(&progress).unwrap());
                    mixed.observe(std::slice::from_ref(step)).unwrap();
                    mb.extend(mixed.update(&progress).unwrap());
                },
            );
            assert!(f32s.host_step.is_some() && mixed.host_step.is_some(), "{what}: both on the fused path");
            assert!(mf.len() >= 8 && mf.len() == mb.len(), "{what}: {} vs {} phases", mf.len(), mb.len());
            for (a, b) in mf.iter().zip(&mb) {
                for (key, tol) in [("losses/td_loss", 0.03), ("losses/q_values", 0.01)] {
                    let (x, y) = (a.get(key).unwrap(), b.get(key).unwrap());
                    assert!((x - y).abs() <= tol * x.abs().max(1e-2), "{what}: {key} f32 {x} vs bf16 {y}");
                }
            }
            let (a, b) = (w(&f32s), w(&mixed));
            assert_ne!(a, b, "{what}: bf16 ran (its rounding shows)");
            let cos = cosine_of_changes(&before, &a, &b);
            assert!(cos > 0.95, "{what}: bf16's change against f32's, cosine {cos}");
        }
    }

    #[test]
    fn epsilon_decays_linearly_then_stays() {
        let c = DqnConfig::default();
        assert_eq!(c.epsilon(1.0), 1.0);
        assert!((c.epsilon(1.0 - 0.08) - (1.0 + 0.5 * (0.04 - 1.0))).abs() < 1e-12, "halfway through the decay");
        assert_eq!(c.epsilon(1.0 - 0.16), 0.04);
        assert_eq!(c.epsilon(0.0), 0.04);
    }

    #[test]
    fn dueling_q_values_average_to_the_state_value() {
        let (obs, act) = spaces();
        let config = DqnConfig { dueling: true, hidden_sizes: vec![8], ..Default::default() };
        let dqn = Dqn::new(&obs, &act, 1, config, Device::Cpu, 0).unwrap();
        let x = Tensor::from_slice(&[0.1f32, -0.3, 0.7, 0.2, 0.2, -0.9]).view([2, 3]);
        let QBody::Mlp(net) = &dqn.q.body else { panic!("vector observations get an MLP") };
        let raw = net.forward(&dqn.online, &x);
        let q = dqn.q.forward(&dqn.online, &x);
        // Q = V + A − mean(A), so mean_a Q(s, a) = V(s), the first output.
        let mean_q = q.mean_dim(1, false, Kind::Float);
        assert!(mean_q.allclose(&raw.narrow(1, 0, 1).squeeze_dim(1), 1e-6, 1e-6, false));
    }

    #[test]
    fn task_heads_give_each_row_its_own_tasks_q_values_on_both_paths() {
        // 2 floats + a 3-task one-hot; 2 actions; row r is of task r mod 3.
        let obs = Space::box1d(vec![-5.0; 5], vec![5.0; 5]);
        let act = Space::discrete(2);
        let x: Vec<f32> = (0..6)
            .flat_map(|r| {
                let mut row = vec![(r as f32 * 0.7).sin(), (r as f32 * 0.3).cos()];
                row.extend((0..3).map(|k| if k == r % 3 { 1.0 } else { 0.0 }));
                row
            })
            .collect();
        let xt = Tensor::from_slice(&x).view([6, 5]);
        for dueling in [false, true] {
            let config = DqnConfig { dueling, task_heads: true, tasks: 3, hidden_sizes: vec![8], ..Default::default() };
            let mut dqn = Dqn::new(&obs, &act, 1, config, Device::Cpu, 0).unwrap();
            let QBody::Mlp(net) = &dqn.q.body else { panic!("vector observations get an MLP") };
            let raw = net.forward(&dqn.online, &xt);
            let per = 2 + i64::from(dueling);
            assert_eq!(raw.size(), [6, 3 * per], "dueling {dueling}");
            let q = dqn.q.forward(&dqn.online, &xt);
            for r in 0..6 {
                let own = raw.get(r).narrow(0, (r % 3) * per, per);
                let want = if dueling {
                    let (v, a) = (own.narrow(0, 0, 1), own.narrow(0, 1, 2));
                    v + &a - a.mean(Kind::Float)
                } else {
                    own
                };
                assert!(q.get(r).allclose(&want, 1e-6, 1e-6, false), "row {r}, dueling {dueling}");
            }
            let want = Vec::<f32>::try_from(q.flatten(0, -1)).unwrap();
            let mut out = ActOutput::default();
            dqn.act(ObsRef::F32(&x), ActMode::Deterministic, &mut out).unwrap();
            assert!(out.q_values.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{:?}", out.q_values);
        }
        let lone = DqnConfig { task_heads: true, ..Default::default() };
        assert!(lone.validate().unwrap_err().to_string().contains("a head per task needs [[tasks]]"));
    }

    #[test]
    fn acting_without_libtorch_gives_the_tensor_q_values_and_their_argmax() {
        let (obs, act) = spaces();
        for dueling in [false, true] {
            let config = DqnConfig { dueling, hidden_sizes: vec![16, 16], ..Default::default() };
            let mut dqn = Dqn::new(&obs, &act, 1, config, Device::Cpu, 0).unwrap();
            let rows = [0.1f32, -0.3, 0.7, 0.2, 0.2, -0.9];
            let want = dqn.q.forward(&dqn.online, &Tensor::from_slice(&rows).view([2, 3]));
            let want = Vec::<f32>::try_from(want.flatten(0, -1)).unwrap();
            let mut out = ActOutput::default();
            dqn.act(ObsRef::F32(&rows), ActMode::Deterministic, &mut out).unwrap();
            assert_eq!(out.q_values.len(), want.len());
            assert!(
                out.q_values.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
                "{:?} vs {want:?}",
                out.q_values
            );
            for (row, a) in out.q_values.chunks_exact(2).zip(&out.actions) {
                let best = row.iter().enumerate().fold(0, |b, (i, q)| if *q > row[b] { i } else { b });
                assert_eq!(*a as usize, best, "dueling {dueling}");
            }
        }
    }

    #[test]
    fn random_before_learning_starts_then_learns_a_bandit() {
        let (obs_space, act_space) = spaces();
        let config = DqnConfig {
            learning_starts: 64,
            train_freq: 16,
            gradient_steps: 16,
            batch_size: 32,
            hidden_sizes: vec![32],
            exploration_fraction: 0.2,
            double_q: true,
            prioritized_replay: true,
            n_step: 2,
            ..Default::default()
        };
        let mut dqn = Dqn::new(&obs_space, &act_space, 1, config, Device::Cpu, 3).unwrap();
        let mut rng = Pcg64::seed_from_u64(4);
        let mut out = ActOutput::default();
        let total = 2_000u64;
        let mut early_actions = Vec::new();
        for t in 1..=total {
            let obs: Vec<f32> = (0..3).map(|_| rng.random_range(-1.0..1.0)).collect();
            dqn.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            if t <= 64 {
                early_actions.push(out.actions[0]);
            }
            // Action 1 pays 1, action 0 pays 0; every step ends the episode.
            let reward = [out.actions[0]];
            let step = Chunk::from_step(
                ObsRef::F32(&obs),
                &out.actions,
                &out.log_probs,
                &out.values,
                &reward,
                &[true],
                &[false],
                ObsRef::F32(&obs),
            );
            dqn.observe(std::slice::from_ref(&step)).unwrap();
            dqn.update(&Progress { env_steps: t, total_env_steps: total }).unwrap();
        }
        assert!(early_actions.contains(&0.0) && early_actions.contains(&1.0), "uniform actions before learning");
        for probe in [[0.5f32, 0.5, 0.5], [-0.9, 0.1, 0.3]] {
            dqn.act(ObsRef::F32(&probe), ActMode::Deterministic, &mut out).unwrap();
            assert_eq!(out.actions, vec![1.0], "greedy action pays; Q = {:?}", out.q_values);
            assert!((out.q_values[1] - 1.0).abs() < 0.2 && out.q_values[0].abs() < 0.2, "Q = {:?}", out.q_values);
        }
    }

    /// A frame-stack bandit: a bright frame in the stack means action 1 pays, a dark one action 0. The CNN
    /// learns it from u8 frames in the frame replay, and a checkpoint resumes it exactly.
    #[test]
    fn frames_get_the_cnn_and_the_frame_replay_learn_and_resume_exactly() {
        let obs_space = frame_stack_space();
        let act_space = Space::discrete(2);
        let config = DqnConfig {
            learning_starts: 32,
            train_freq: 4,
            gradient_steps: 4,
            batch_size: 16,
            buffer_size: 1_000,
            learning_rate: 5e-4,
            exploration_fraction: 0.3,
            ..Default::default()
        };
        assert!(
            Dqn::new(
                &obs_space,
                &act_space,
                2,
                DqnConfig { prioritized_replay: true, ..config.clone() },
                Device::Cpu,
                0
            )
            .unwrap_err()
            .to_string()
            .contains("prioritized_replay")
        );
        let mut dqn = Dqn::new(&obs_space, &act_space, 2, config.clone(), Device::Cpu, 3).unwrap();
        let frame = |bright: bool| vec![if bright { 200u8 } else { 20 }; 4 * 36 * 36];
        let total = 600u64;
        let mut out = ActOutput::default();
        let mut run = |dqn: &mut Dqn, from: u64, to: u64| {
            for t in from..=to {
                let brights = [t % 3 == 0, t % 2 == 0];
                let obs: Vec<u8> = brights.iter().flat_map(|&b| frame(b)).collect();
                dqn.act(ObsRef::U8(&obs), ActMode::Explore, &mut out).unwrap();
                let rewards: Vec<f32> =
                    brights.iter().zip(&out.actions).map(|(&b, &a)| f32::from((a == 1.0) == b)).collect();
                let step = Chunk::from_step(
                    ObsRef::U8(&obs),
                    &out.actions,
                    &out.log_probs,
                    &out.values,
                    &rewards,
                    &[true, true],
                    &[false, false],
                    ObsRef::U8(&obs),
                );
                dqn.observe(std::slice::from_ref(&step)).unwrap();
                dqn.update(&Progress { env_steps: 2 * t, total_env_steps: 2 * total }).unwrap();
            }
        };
        run(&mut dqn, 1, 300);
        let saved = dqn.checkpoint().unwrap();
        let mut resumed = Dqn::new(&obs_space, &act_space, 2, config, Device::Cpu, 9).unwrap();
        let mut c = saved;
        resumed.restore(&mut c).unwrap();
        run(&mut dqn, 301, total);
        run(&mut resumed, 301, total);
        assert!(dqn.online.flat().equal(resumed.online.flat()), "a resumed run continues bit for bit");
        for bright in [true, false] {
            let obs = frame(bright);
            dqn.act(ObsRef::U8(&obs), ActMode::Deterministic, &mut out).unwrap();
            assert_eq!(out.actions, vec![f32::from(bright)], "Q = {:?}", out.q_values);
        }
        assert!(dqn.act(ObsRef::F32(&[0.0; 4]), ActMode::Deterministic, &mut out).is_err(), "wrong length");
    }

    /// Transitions of a fixed 2-env stream (actions drawn from their own RNG, not the agent's, as in a learner
    /// whose actors act): obs of `dim` elements, made by `obs_of(t, env)`.
    fn fixed_stream<O: Copy>(
        steps: u64,
        obs_of: impl Fn(u64, usize) -> Vec<O>,
        wrap: for<'a> fn(&'a [O]) -> ObsRef<'a>,
        mut f: impl FnMut(&Chunk, Progress),
    ) {
        let mut rng = Pcg64::seed_from_u64(11);
        let mut act = ActOutput::default();
        for t in 1..=steps {
            let obs: Vec<O> = (0..2).flat_map(|e| obs_of(t, e)).collect();
            let next: Vec<O> = (0..2).flat_map(|e| obs_of(t + 1, e)).collect();
            act.actions = (0..2).map(|_| rng.random_range(0..2) as f32).collect();
            let rewards: Vec<f32> =
                act.actions.iter().enumerate().map(|(e, a)| a * (t % 3) as f32 - e as f32).collect();
            let step = Chunk::from_step(
                wrap(&obs),
                &act.actions,
                &act.log_probs,
                &act.values,
                &rewards,
                &[t % 7 == 0, false],
                &[false, t % 11 == 0],
                wrap(&next),
            );
            f(&step, Progress { env_steps: 2 * t, total_env_steps: 2 * steps });
        }
    }

    #[test]
    fn fused_cpu_steps_match_libtorch() {
        let base = DqnConfig {
            // f32 on both paths (bf16's own tests: `a_bf16_*`).
            bf16: false,
            learning_starts: 40,
            train_freq: 4,
            gradient_steps: 3,
            batch_size: 16,
            buffer_size: 300,
            target_update_interval: 20,
            hidden_sizes: vec![64, 32],
            anneal_lr: true,
            max_grad_norm: 0.5,
            ..Default::default()
        };
        // (what, stream steps, config). Prioritized replay feeds the TD errors back into which transitions
        // are drawn, so float-rounding differences can pick another transition after a while: a short stream.
        let cases = [
            ("plain", 300, base.clone()),
            (
                "double q, n-step, tanh",
                300,
                DqnConfig { double_q: true, n_step: 3, activation: Activation::Tanh, ..base.clone() },
            ),
            ("unclipped", 300, DqnConfig { max_grad_norm: 10.0, ..base.clone() }),
            ("prioritized", 50, DqnConfig { prioritized_replay: true, ..base.clone() }),
            ("qr-dqn", 300, DqnConfig { n_quantiles: 5, ..base.clone() }),
            ("qr-dqn, double q, n-step", 300, DqnConfig { n_quantiles: 8, double_q: true, n_step: 3, ..base.clone() }),
            ("qr-dqn, prioritized", 50, DqnConfig { n_quantiles: 5, prioritized_replay: true, ..base.clone() }),
        ];
        let vector =
            |t: u64, e: usize| (0..4).map(|i| ((t * 7 + i * 3 + e as u64) % 13) as f32 / 13.0).collect::<Vec<f32>>();
        let obs_space = Space::box1d(vec![0.0; 4], vec![1.0; 4]);
        for (what, steps, config) in cases {
            let make = |fused_cpu| {
                let c = DqnConfig { fused_cpu, ..config.clone() };
                Dqn::new(&obs_space, &Space::discrete(3), 2, c, Device::Cpu, 5).unwrap()
            };
            let (mut fused, mut torch) = (make(true), make(false));
            let (mut mf, mut mt) = (Vec::new(), Vec::new());
            fixed_stream(
                steps,
                vector,
                |o| ObsRef::F32(o),
                |step, progress| {
                    fused.observe(std::slice::from_ref(step)).unwrap();
                    mf.extend(fused.update(&progress).unwrap());
                    torch.observe(std::slice::from_ref(step)).unwrap();
                    mt.extend(torch.update(&progress).unwrap());
                },
            );
            assert!(fused.host_step.is_some() && torch.host_step.is_none(), "{what}: paths");
            assert!(mf.len() >= 8 && mf.len() == mt.len(), "{what}: {} vs {} phases", mf.len(), mt.len());
            for (a, b) in mf.iter().zip(&mt) {
                for key in ["losses/td_loss", "losses/q_values"] {
                    let (x, y) = (a.get(key).unwrap(), b.get(key).unwrap());
                    assert!((x - y).abs() <= 1e-4 * y.abs().max(1e-2), "{what}: {key} {x} vs {y}");
                }
                assert_eq!(a.get("charts/gradient_steps"), b.get("charts/gradient_steps"));
            }
            let w = |d: &Dqn| Vec::<f32>::try_from(d.online.flat().detach()).unwrap();
            let (a, b) = (w(&fused), w(&torch));
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-5 * scale, "{what}: weights differ by {worst} (scale {scale})");
            assert_ne!(a, w(&make(true)), "{what}: the weights moved");
            let counters = |d: &Dqn| lock(&d.side).counters.clone();
            assert_eq!(counters(&fused), counters(&torch), "{what}");
        }
    }

    /// FNV-1a over the bits of every number the fused DQN step leaves behind: online and target weights, Adam's
    /// moments and step count, prioritized replay's priorities, and each phase's loss and mean Q.
    fn fused_state_hash(dqn: &Dqn, metrics: &[Metrics]) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |bits: u64| {
            for byte in bits.to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        let floats = |t: &Tensor| Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap();
        for t in [dqn.online.flat(), dqn.target.flat(), &dqn.opt.state[0], &dqn.opt.state[1]] {
            floats(t).iter().for_each(|v| eat(u64::from(v.to_bits())));
        }
        eat(dqn.opt.steps());
        if let Memory::Prioritized(_, r) = &lock(&dqn.side).memory {
            (0..r.len()).for_each(|i| eat(r.priority(i).unwrap().to_bits()));
        }
        for m in metrics {
            for key in ["losses/td_loss", "losses/q_values"] {
                eat(m.get(key).unwrap().to_bits());
            }
        }
        h
    }

    /// Pins the fused DQN step's numerics bit for bit: a change that speeds the step up must leave every
    /// weight, loss and priority as it was, so that the 10-seed learning results measured with the step
    /// (BENCHMARKS.md) stay valid. The hashes are what the step gave when pinned; a change that moves them
    /// changes the step's arithmetic. CartPole's network (4 → 256 → 256 → 2, ReLU), as
    /// `examples/configs/cartpole_dqn.toml` trains it, plain and with double Q, prioritized replay and
    /// clipping; two gradient steps per phase, so each phase's mean is the same sum in any order. The
    /// values hold where `sgemm` multiplies with fused multiply-adds (x86-64 with FMA: `matrixmultiply`'s
    /// AVX2/AVX-512 kernels); other CPUs round differently and skip the check.
    #[test]
    fn fused_cpu_step_numerics_are_pinned() {
        #[cfg(target_arch = "x86_64")]
        let fma = std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        let plain = DqnConfig {
            bf16: false,
            learning_rate: 1e-3,
            anneal_lr: true,
            adam_eps: 1e-8,
            batch_size: 64,
            buffer_size: 1_000,
            learning_starts: 100,
            train_freq: 2,
            gradient_steps: 2,
            target_update_interval: 10,
            max_grad_norm: 10.0,
            hidden_sizes: vec![256, 256],
            activation: Activation::Relu,
            ..Default::default()
        };
        let per = DqnConfig { double_q: true, prioritized_replay: true, max_grad_norm: 0.5, ..plain.clone() };
        let cases =
            [("plain", plain, 0x2c2c_9d1b_1f9c_dd4a), ("double q, prioritized, clipped", per, 0xed44_4473_ce77_28a3)];
        let vector = |t: u64, e: usize| {
            (0..4).map(|i| (((t * 7 + i * 3 + e as u64) % 13) as f32 / 13.0 - 0.5) * (1.0 + i as f32)).collect()
        };
        let obs_space = Space::box1d(vec![-3.0; 4], vec![3.0; 4]);
        let mut got = Vec::new();
        for (what, config, want) in cases {
            let mut dqn = Dqn::new(&obs_space, &Space::discrete(2), 2, config, Device::Cpu, 7).unwrap();
            let mut metrics = Vec::new();
            fixed_stream(
                300,
                vector,
                |o| ObsRef::F32(o),
                |step, progress| {
                    dqn.observe(std::slice::from_ref(step)).unwrap();
                    metrics.extend(dqn.update(&progress).unwrap());
                },
            );
            assert!(dqn.host_step.is_some(), "{what}: the fused path trained");
            assert_eq!(lock(&dqn.side).counters.gradient_steps, 250, "{what}");
            let hash = fused_state_hash(&dqn, &metrics);
            got.push(format!("{what}: {hash:#018x}"));
            if fma && hash != want {
                panic!("{what}: fused DQN state hash {hash:#018x}, pinned {want:#018x}");
            }
        }
        eprintln!("{got:?}");
    }

    /// The same stream trained two ways: observe + update on one thread, and a [`DqnFeed`] on another thread
    /// handing prepared minibatches to `train_prepared`. Same weights, bit for bit, and the same metrics.
    fn feed_ahead_matches_inline<O: Copy + Send + Sync + 'static>(
        obs_space: Space,
        config: DqnConfig,
        obs_of: fn(u64, usize) -> Vec<O>,
        wrap: for<'a> fn(&'a [O]) -> ObsRef<'a>,
    ) {
        let steps = 400;
        let act_space = Space::discrete(2);
        let mut inline = Dqn::new(&obs_space, &act_space, 2, config.clone(), Device::Cpu, 5).unwrap();
        let mut inline_metrics = Vec::new();
        fixed_stream(steps, obs_of, wrap, |step, progress| {
            inline.observe(std::slice::from_ref(step)).unwrap();
            inline_metrics.extend(inline.update(&progress).unwrap());
        });
        let mut ahead = Dqn::new(&obs_space, &act_space, 2, config, Device::Cpu, 5).unwrap();
        let mut feed = ahead.replay_feed().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Prepared>>(1);
        let feeder = std::thread::spawn(move || {
            fixed_stream(steps, obs_of, wrap, |step, progress| {
                let mut work = Vec::new();
                feed.observe(step, &progress, &mut work).unwrap();
                tx.send(work).unwrap();
            })
        });
        let mut ahead_metrics = Vec::new();
        for work in rx {
            for w in work {
                ahead_metrics.extend(ahead.train_prepared(w).unwrap());
            }
        }
        feeder.join().unwrap();
        assert!(inline_metrics.len() > 10, "{inline_metrics:?}");
        assert_eq!(ahead_metrics, inline_metrics);
        assert!(ahead.online.flat().equal(inline.online.flat()), "weights differ");
        assert!(ahead.target.flat().equal(inline.target.flat()), "target weights differ");
        let counters = |d: &Dqn| lock(&d.side).counters.clone();
        assert_eq!(counters(&ahead), counters(&inline));
    }

    #[test]
    fn a_feed_on_another_thread_trains_exactly_as_observe_and_update() {
        let config = DqnConfig {
            learning_starts: 40,
            train_freq: 4,
            gradient_steps: 3,
            batch_size: 16,
            buffer_size: 300,
            target_update_interval: 20,
            n_step: 3,
            double_q: true,
            dueling: true,
            anneal_lr: true,
            hidden_sizes: vec![16],
            ..Default::default()
        };
        let vector = |t: u64, e: usize| (0..4).map(|i| ((t * 7 + i * 3 + e as u64) % 13) as f32 / 13.0).collect();
        feed_ahead_matches_inline(Space::box1d(vec![0.0; 4], vec![1.0; 4]), config.clone(), vector, |o| ObsRef::F32(o));
        // Without the dueling head both sides take the fused CPU step (the feed hands over the host rows).
        let plain = DqnConfig { dueling: false, ..config.clone() };
        feed_ahead_matches_inline(Space::box1d(vec![0.0; 4], vec![1.0; 4]), plain, vector, |o| ObsRef::F32(o));
        let frames = frame_stack_space();
        // A frame stack whose newest frame changes each step (the older three are the previous steps').
        let stack = |t: u64, e: usize| (0..4u64).flat_map(|k| vec![((t + k) * 37 + e as u64) as u8; 36 * 36]).collect();
        let config = DqnConfig { gradient_steps: 1, batch_size: 8, ..config };
        feed_ahead_matches_inline(frames, config.clone(), stack, |o| ObsRef::U8(o));

        // Prioritized replay cannot be sampled ahead: the feed is refused, naming why.
        let per = DqnConfig { prioritized_replay: true, ..config };
        let mut dqn =
            Dqn::new(&Space::box1d(vec![0.0; 4], vec![1.0; 4]), &Space::discrete(2), 2, per, Device::Cpu, 0).unwrap();
        let e = dqn.replay_feed().err().expect("refused").to_string();
        assert!(e.contains("prioritized_replay"), "{e}");
    }

    #[test]
    fn continuous_actions_are_refused() {
        let obs = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let e = Dqn::new(&obs, &obs, 1, DqnConfig::default(), Device::Cpu, 0).unwrap_err().to_string();
        assert!(e.contains("discrete"), "{e}");
    }
}

#[cfg(test)]
mod member_tests {
    use flotilla_core::{ObsRef, Space};
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;
    use tch::Device;

    use super::*;
    use crate::nn::members::rel_diff;
    use crate::policy::{ActMode, ActOutput, Policy};
    use flotilla_core::Chunk;

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
        assert_eq!(unbatchable(&together.iter().collect::<Vec<_>>()), None, "the batched path is taken");
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
                let t = Chunk::from_step(
                    ObsRef::F32(&obs),
                    &out.actions,
                    &out.log_probs,
                    &out.values,
                    &rewards,
                    &done,
                    &vec![false; n_envs],
                    ObsRef::F32(&next),
                );
                m.observe(std::slice::from_ref(&t)).unwrap();
                twin.observe(std::slice::from_ref(&t)).unwrap();
            }
            let progress = Progress { env_steps: step * n_envs as u64, total_env_steps: total };
            let mut refs: Vec<&mut Dqn> = together.iter_mut().collect();
            let batched = update_members(&mut refs, &progress).unwrap();
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
            let d = rel_diff(a.online.flat(), b.online.flat());
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

    /// A batched phase in which one member's gradient is not finite fails naming it, before that step is taken:
    /// the other members' networks are where they were, and every optimiser counts only the steps taken.
    #[test]
    fn a_non_finite_member_fails_the_batched_phase_before_its_step() {
        let (obs_space, act_space, n_envs) = (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(3), 2);
        let c = DqnConfig { fused_cpu: false, ..small(1e-3, 0.99, 30, false) };
        let mut members: Vec<Dqn> =
            (0..3).map(|k| Dqn::new(&obs_space, &act_space, n_envs, c.clone(), Device::Cpu, 40 + k).unwrap()).collect();
        let nan = Tensor::full([members[1].online.numel()], f64::NAN, (Kind::Float, Device::Cpu));
        members[1].online.copy_from(&nan).unwrap();
        let before: Vec<Tensor> = members.iter().map(|m| m.online.flat().detach().copy()).collect();
        let mut rng = Pcg64::seed_from_u64(3);
        let mut failed = None;
        for step in 1..=100u64 {
            let obs: Vec<f32> = (0..n_envs * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
            for m in members.iter_mut() {
                let mut out = ActOutput::default();
                m.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
                let t = Chunk::from_step(
                    ObsRef::F32(&obs),
                    &out.actions,
                    &out.log_probs,
                    &out.values,
                    &[0.5; 2],
                    &[false; 2],
                    &[false; 2],
                    ObsRef::F32(&obs),
                );
                m.observe(std::slice::from_ref(&t)).unwrap();
            }
            let progress = Progress { env_steps: step * n_envs as u64, total_env_steps: 200 };
            if let Err(e) = update_members(&mut members.iter_mut().collect::<Vec<_>>(), &progress) {
                failed = Some(e);
                break;
            }
        }
        let e = failed.expect("the first due phase fails");
        assert!(matches!(e, Error::NonFinite(_)) && e.to_string().contains("member 1"), "{e}");
        for (k, m) in members.iter().enumerate() {
            assert_eq!(m.opt.steps, 0, "member {k}: no step was taken");
            if k != 1 {
                assert!(m.online.flat().equal(&before[k]), "member {k}'s network moved");
            }
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
    fn qr_dqn_members_match_their_runs_alone() {
        let qr = |c: DqnConfig| DqnConfig { n_quantiles: 6, ..c };
        check(vec![qr(small(1e-3, 0.99, 30, true)), qr(small(2e-3, 0.9, 20, true))]);
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
