//! The learning half of an agent: take trajectory chunks, update when there is enough data, save everything.
//!
//! Chunks ([`flotilla_core::Chunk`]) are the one way data enters an algorithm: the single-process trainer
//! records each env step as a one-step chunk (`flotilla_envs::ChunkRecorder`), actors send whole ones.
//!
//! ```text
//! let mut obs = envs.reset(Some(seed))?.to_buf();
//! while progress.env_steps < progress.total_env_steps {
//!     agent.act(obs.as_ref(), ActMode::Explore, &mut out)?;
//!     let step = envs.step(..)?;                         // same-step auto-reset
//!     if recorder.record(obs.as_ref(), &out.actions, &out.log_probs, &out.values, &step)? {
//!         agent.observe(std::slice::from_ref(recorder.chunk()))?;
//!     }
//!     progress.env_steps += n_envs;
//!     if let Some(metrics) = agent.update(&progress)? { log(metrics) }   // PPO: full rollout; DQN: train_freq
//!     obs = step.obs;
//! }
//! ```
use std::path::Path;

use flotilla_core::{Chunk, ObsRef};

use crate::checkpoint::Checkpoint;
use crate::data::rollout::{Rollout, RolloutLayout};
use crate::nn::data_parallel::DataParallel;
use crate::nn::params::FlatParams;
use crate::policy::Policy;
use crate::progress::Progress;
use crate::teaching::Teaching;
use crate::{Metrics, Result};

/// Work an off-policy agent's [`ReplayFeed`] prepared ahead of its update (a replay minibatch already on the
/// device, or a target-network sync), to be applied in the order it was made with
/// [`crate::algorithm::ReplayAhead::train_prepared`]. Opaque: only the agent that made it reads it (the kind's own type
/// inside).
/// `Send`, so a learner's batch-assembly thread can hand it to the update thread.
#[derive(Debug)]
pub struct Prepared(pub(crate) Box<dyn std::any::Any + Send>);

/// An off-policy agent's data side, run on a learner's batch-assembly thread
/// ([`crate::algorithm::ReplayAhead::replay_feed`]): it observes chunks into the agent's replay and prepares
/// the minibatches each due training phase draws, while the agent trains on earlier ones. Observing a chunk
/// here and then applying its work with [`crate::algorithm::ReplayAhead::train_prepared`] trains exactly as
/// [`Algorithm::observe`] + [`Algorithm::update`] do.
pub trait ReplayFeed: Send {
    /// Record a chunk at `progress` (env steps including the chunk's); append the work it makes due.
    fn observe(&mut self, chunk: &Chunk, progress: &Progress, out: &mut Vec<Prepared>) -> Result<()>;
}

/// A learning algorithm: a [`Policy`] that also learns from what it observes and can save its whole state.
/// `Send`: a population's lockstep group lets its members observe their shares of a step on several threads.
pub trait Algorithm: Policy + std::any::Any + Send {
    /// Short name, as in configs (`"ppo"`, `"dqn"`, ...).
    fn name(&self) -> &'static str;
    /// Take in trajectory chunks, the one way data enters an algorithm: on-policy kinds append them, stacked
    /// row-wise (chunk `k`'s env `j` is row `k · E + j`; the chunks' envs add up to the rollout's rows), to
    /// their rollout; off-policy kinds put each chunk's steps, in order, into their replay, with the true next
    /// observations from the chunk's final-observation index. The single-process trainer passes one-step
    /// chunks; a learner passes its actors' chunks.
    fn observe(&mut self, chunks: &[Chunk]) -> Result<()>;
    /// Learn if it is time to (a full rollout, every `train_freq` steps after `learning_starts`, ...);
    /// returns the metrics of the updates made, `None` if none were.
    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>>;
    /// Everything needed to continue training exactly: weights, optimiser moments, target networks, replay
    /// contents and priorities, schedule counters, RNG streams.
    fn checkpoint(&self) -> Result<Checkpoint>;
    /// Restore a [`Algorithm::checkpoint`] of an agent built with the same spaces and config.
    fn restore(&mut self, checkpoint: &mut Checkpoint) -> Result<()>;
    /// The parameters acting needs (what a parameter broadcast sends and `save_weights` writes).
    fn policy_params(&self) -> &FlatParams;
    /// The same, to change from outside (transfer: [`Algorithm::transfer`]).
    fn policy_params_mut(&mut self) -> &mut FlatParams;
    /// After the policy parameters were changed from outside: bring what follows them (target networks) in
    /// line. The default has nothing to follow.
    fn policy_params_changed(&mut self) {}
    /// Transfer: start from another run's policy weights (`source`, named as [`Algorithm::save_weights`] writes
    /// them; `what` names it in errors) except the `reinit` layers, which keep their fresh initialisation, and
    /// keep the `freeze` layers fixed from now on (zero gradient: no optimiser moves them). Layers are named
    /// as [`FlatParams::layers`] lists them (`pi_vf.0`, `q.1`, …) or by a prefix of them. An empty `source`
    /// initialises nothing (freeze alone). Returns the parameters copied and the scalars frozen.
    fn transfer(
        &mut self,
        what: &str,
        source: &[(String, tch::Tensor)],
        reinit: &[String],
        freeze: &[String],
    ) -> Result<(usize, i64)> {
        let copied = if source.is_empty() { 0 } else { self.policy_params_mut().init_from(what, source, reinit)? };
        let frozen = self.policy_params_mut().freeze(what, freeze)?;
        self.policy_params_changed();
        Ok((copied, frozen))
    }
    /// Distillation: what this agent's policy says about `obs` (no gradient), the target a student learns —
    /// logits, Q-values, a Gaussian or deterministic actions ([`Teaching`]). Every kind has a policy to teach.
    fn teach(&mut self, obs: ObsRef<'_>) -> Result<Teaching>;
    /// The capabilities only some kinds have, each asked for here: the agent as that capability, `None` (the
    /// default) where its kind does not have it. The registry says in advance which kinds have which
    /// (`AlgorithmKind::family`, `check_data_parallel`, `check_assemble_ahead`); callers name the capability
    /// they need when it is missing.
    fn on_policy(&mut self) -> Option<&mut dyn OnPolicy> {
        None
    }
    /// See [`Algorithm::on_policy`]: replay fed and sampled on another thread.
    fn replay_ahead(&mut self) -> Option<&mut dyn ReplayAhead> {
        None
    }
    /// See [`Algorithm::on_policy`]: updates spread over data-parallel replicas and micro-batches.
    fn replicated(&mut self) -> Option<&mut dyn Replicated> {
        None
    }
    /// See [`Algorithm::on_policy`]: A3C's parameter server.
    fn parameter_server(&mut self) -> Option<&mut dyn ParameterServer> {
        None
    }
    /// See [`Algorithm::on_policy`]: a distillation student.
    fn student(&mut self) -> Option<&mut dyn Student> {
        None
    }
    /// Save the policy weights alone ([`Algorithm::policy_params`]: what `flotilla eval` loads), atomically.
    fn save_weights(&self, path: &Path) -> Result<()> {
        self.policy_params().save(path)
    }
    /// Load weights saved by [`Algorithm::save_weights`] (target copies follow: `policy_params_changed`).
    fn load_weights(&mut self, path: &Path) -> Result<()> {
        self.policy_params_mut().load(path)?;
        self.policy_params_changed();
        Ok(())
    }
}

/// Capability: an on-policy learner fed by actors' chunks (PPO, A2C), which lets the learner's batch-assembly
/// thread stack chunks ([`Rollout::stack_chunks`]) and put their observations on the device
/// ([`Rollout::put_obs_on_device`]) while the agent updates on the previous batch. Without it, batches go
/// through [`Algorithm::observe`] on the update thread.
pub trait OnPolicy {
    /// The layout of this agent's rollouts.
    fn rollout_layout(&self) -> RolloutLayout;
    /// Take a whole rollout stacked as [`OnPolicy::rollout_layout`] says (the next [`Algorithm::update`] trains
    /// on it), handing back the agent's empty buffer to stack a later batch into.
    fn observe_rollout(&mut self, rollout: Rollout) -> Result<Rollout>;
}

/// Capability: an off-policy agent whose replay can be fed and sampled on another thread (DQN).
pub trait ReplayAhead {
    /// A [`ReplayFeed`] sharing this agent's replay. Samplers that depend on the update before (prioritized
    /// replay) refuse with the reason.
    fn replay_feed(&mut self) -> Result<Box<dyn ReplayFeed>>;
    /// Apply work this agent's [`ReplayFeed`] prepared, in order; returns a training phase's metrics after its
    /// last gradient step, else `None`.
    fn train_prepared(&mut self, work: Prepared) -> Result<Option<Metrics>>;
}

/// Capability: updates spread over the replicas of a data-parallel group and/or over micro-batches
/// ([`DataParallel`]) (PPO, A2C, DQN, DDPG, TD3, SAC).
pub trait Replicated {
    /// Take the group (or the micro-batch count); a batch that does not split refuses, naming why.
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()>;
}

/// Capability: A3C's parameter server (the A2C learner of an A3C run).
pub trait ParameterServer {
    /// One optimiser step with a flat gradient an actor computed (in [`Algorithm::policy_params`]' layout,
    /// frozen layers left out: [`FlatParams::trainable_grad`]).
    fn apply_gradient(&mut self, gradient: &[f32], progress: &Progress) -> Result<Metrics>;
}

/// Capability: a distillation student.
pub trait Student {
    /// Hand the student its teachers (trained agents, loaded by the learner from their run directories).
    fn set_teachers(&mut self, teachers: Vec<Box<dyn Algorithm>>) -> Result<()>;
}
