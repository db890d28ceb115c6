//! What an actor process runs: an acting policy (weights and the forward pass, nothing a learner needs), or
//! for A3C a gradient worker. Built by [`crate::kind::AlgorithmKind::build_acting`].
//!
//! ```text
//! let mut acting = config.build_acting(&setup)?;                  // no optimiser, no replay, no rollout
//! loop {
//!     policy.load_params(&broadcast)?;                              // a parameter broadcast, flat f32
//!     policy.set_progress(&learner_progress);                       // ε / warm-up schedules follow the learner
//!     T × { policy.act(obs, Explore, &mut out)?; step envs; record } ─► chunk
//!     Chunks: send the chunk    Gradients: worker.gradient(&chunk)? ─► send the Vec<f32>
//! }
//! ```
//! Everything crossing this boundary is plain `f32` slices and `flotilla_core` types, so the actor crate
//! never sees a libtorch type.
use flotilla_core::{Chunk, ObsRef, Space};
use rand::SeedableRng;
use rand_pcg::Pcg64;
use tch::{Device, Tensor};

use crate::nn::host_mlp::HostScratch;
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy};
use crate::progress::Progress;
use crate::{Error, Metrics, Result};

/// The acting half of an algorithm, as an actor holds it.
pub trait ActingPolicy: Policy {
    /// The parameters a broadcast overwrites (laid out as the learner's `Algorithm::policy_params`).
    fn params(&self) -> &FlatParams;
    /// Number of parameters a broadcast carries.
    fn n_params(&self) -> usize {
        self.params().numel() as usize
    }
    /// Overwrite the parameters with a broadcast, in place (a wrong length is an error and changes nothing).
    fn load_params(&mut self, values: &[f32]) -> Result<()> {
        load_flat(self.params(), values)
    }
    /// Let acting schedules (DQN's ε, the random warm-up of DQN/DDPG/TD3) follow the learner's progress.
    /// Policies without such schedules ignore it.
    fn set_progress(&mut self, _progress: &Progress) {}
}

/// A3C's actor side: acts, and computes the loss gradient on each chunk it collected with the current
/// parameters. The parameters never change here; the learner applies the gradient and broadcasts.
pub trait GradientWorker {
    /// The acting policy the gradient is computed for.
    fn policy(&mut self) -> &mut dyn ActingPolicy;
    /// The clipped loss gradient on `chunk` (a whole rollout of this worker's envs), flat in the parameters'
    /// layout, and the loss metrics.
    fn gradient(&mut self, chunk: &Chunk) -> Result<(Vec<f32>, Metrics)>;
}

/// What an actor builds from the run's algorithm.
pub enum Acting {
    /// Act and send trajectory chunks (every algorithm but A3C).
    Chunks(Box<dyn ActingPolicy>),
    /// Act and send gradients (A3C).
    Gradients(Box<dyn GradientWorker>),
}

impl Acting {
    /// The policy that acts, whichever kind this is.
    pub fn policy(&mut self) -> &mut dyn ActingPolicy {
        match self {
            Acting::Chunks(p) => p.as_mut(),
            Acting::Gradients(w) => w.policy(),
        }
    }
}

/// What an actor knows when it builds its acting policy.
#[derive(Debug, Clone)]
pub struct ActingSetup<'a> {
    /// The envs' observation space.
    pub observation_space: &'a Space,
    /// The envs' action space.
    pub action_space: &'a Space,
    /// Envs the actor steps in lock-step (rows per `act` call).
    pub n_envs: usize,
    /// Seeds action sampling (and the unused initial weights, overwritten by the first broadcast).
    pub seed: u64,
    /// Ape-X's per-actor exploration floor (Horgan et al. 2018): ε-greedy policies explore with at least this ε.
    /// Other policies ignore it.
    pub epsilon_floor: f64,
    /// The run's frozen layers (`[init] freeze`): an A3C worker computes and sends gradients for the other
    /// layers only. Acting policies ignore it (they load every parameter).
    pub frozen: &'a [String],
}

/// The network of an off-policy algorithm's acting policy ([`WarmupPolicy`]), and how it explores.
pub(crate) trait ActingNet: std::fmt::Debug + Send {
    /// What exploration keeps between calls (TD3's noise, DQN's ε).
    type Explore: std::fmt::Debug + Send;
    /// Values per observation and per action.
    fn dims(&self) -> (usize, usize);
    /// Actions for a batch of `obs` into `out`: exploring with `explore` (`None`: deterministic), uniformly
    /// random with `warm_up`. On CPU parameters an MLP runs without libtorch (`host` is its scratch).
    #[allow(clippy::too_many_arguments)]
    fn act(
        &self,
        params: &FlatParams,
        obs: ObsRef<'_>,
        warm_up: bool,
        explore: Option<&mut Self::Explore>,
        rng: &mut Pcg64,
        host: &mut (HostScratch, Vec<f32>),
        out: &mut ActOutput,
    ) -> Result<()>;
    /// Let `explore` follow the learner's progress.
    fn follow(_explore: &mut Self::Explore, _progress: &Progress) {}
}

/// An off-policy algorithm's acting policy (DQN, DDPG, TD3, SAC) in an actor process: the network's weights
/// (from the learner's broadcast) and its exploration, uniformly random while the learner has fewer than
/// `learning_starts` env steps. No critics, no target, no replay, no optimiser.
#[derive(Debug)]
pub(crate) struct WarmupPolicy<N: ActingNet> {
    net: N,
    params: FlatParams,
    explore: N::Explore,
    learning_starts: u64,
    learner_env_steps: u64,
    rng: Pcg64,
    host: (HostScratch, Vec<f32>),
}

impl<N: ActingNet> WarmupPolicy<N> {
    /// `net` with its initial parameters `named` on the CPU; `seed` fixes exploration.
    pub(crate) fn new(
        net: N,
        named: Vec<(String, Tensor)>,
        explore: N::Explore,
        learning_starts: u64,
        seed: u64,
    ) -> Self {
        let params = FlatParams::new(named, Device::Cpu);
        let rng = Pcg64::seed_from_u64(seed);
        WarmupPolicy { net, params, explore, learning_starts, learner_env_steps: 0, rng, host: Default::default() }
    }
}

impl<N: ActingNet> Policy for WarmupPolicy<N> {
    fn obs_dim(&self) -> usize {
        self.net.dims().0
    }

    fn act_dim(&self) -> usize {
        self.net.dims().1
    }

    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        let explore = (mode == ActMode::Explore).then_some(&mut self.explore);
        let warm_up = explore.is_some() && self.learner_env_steps < self.learning_starts;
        self.net.act(&self.params, obs, warm_up, explore, &mut self.rng, &mut self.host, out)
    }
}

impl<N: ActingNet> ActingPolicy for WarmupPolicy<N> {
    fn params(&self) -> &FlatParams {
        &self.params
    }

    fn set_progress(&mut self, progress: &Progress) {
        N::follow(&mut self.explore, progress);
        self.learner_env_steps = progress.env_steps;
    }
}

/// Copy a broadcast into `params` in place (the views share its storage), checking its length.
pub(crate) fn load_flat(params: &FlatParams, values: &[f32]) -> Result<()> {
    if values.len() as i64 != params.numel() {
        return Err(Error::length("broadcast parameters", values.len(), params.numel() as usize));
    }
    let mut flat = params.flat().shallow_clone();
    let src = tch::Tensor::from_slice(values).to_device(flat.device());
    tch::no_grad(|| flat.copy_(&src));
    Ok(())
}
