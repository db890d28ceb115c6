//! One algorithm kind's answers to every per-kind question ([`AlgorithmKind`]), implemented by the kind's config type in
//! the kind's own folder. The registry lists the kinds, one line each; nothing else matches on the kind.
use std::any::Any;

use flotilla_core::Space;
use tch::Device;

use crate::acting::{Acting, ActingSetup};
use crate::algorithm::Algorithm;
use crate::export::Architecture;
use crate::nn::nets::CnnOptions;
use crate::progress::Progress;
use crate::{Metrics, Result};

/// How a learner uses what actors send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// PPO, A2C: batches of fresh whole chunks (rollouts of the algorithm's `n_steps`); too-stale chunks are
    /// skipped.
    OnPolicy,
    /// DQN, DDPG, TD3: every chunk goes into replay.
    OffPolicy,
    /// A3C: actors send gradients; the learner applies them.
    Gradients,
}

/// A kind's name and family, implemented for each config by its line in [`crate::registry`].
pub trait KindName {
    /// Short name, as in configs (`"ppo"`).
    fn name(&self) -> &'static str;

    /// How a learner fed by actors uses their data.
    fn family(&self) -> Family;
}

/// Everything the rest of the workspace asks of an algorithm kind, answered by its `[algorithm]` config.
pub trait AlgorithmKind: KindName {
    /// Range checks serde cannot express; `num_envs` envs feed each update.
    fn validate(&self, num_envs: usize) -> Result<()>;

    /// Tell the config how many tasks the run has (`[[tasks]]`; 0 without), for kinds with `task_heads`.
    fn set_tasks(&mut self, _tasks: usize) {}

    /// Steps per rollout of an on-policy algorithm (and A3C's per-gradient rollout): the length every actor
    /// chunk must have. `None` for replay-based algorithms, whose chunks may be any length.
    fn rollout_steps(&self) -> Option<usize> {
        None
    }

    /// Whether the config can train with actor processes feeding one learner; the error says why not.
    fn check_distributed(&self) -> Result<()> {
        Ok(())
    }

    /// Whether the update can be spread over data-parallel learners or accumulated micro-batches (its gradient
    /// steps sum gradients through [`crate::DataParallel`]); the reason where not.
    fn check_data_parallel(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Whether a distributed learner can assemble this algorithm's batches on a thread of its own (stack
    /// on-policy chunks, or feed and sample replay through [`crate::algorithm::ReplayAhead::replay_feed`]); the
    /// reason where not. By default on-policy kinds can and the others sample on the update thread.
    fn check_assemble_ahead(&self) -> std::result::Result<(), String> {
        match self.family() {
            Family::OnPolicy => Ok(()),
            _ => Err(format!("{} samples its replay on the update thread (it has no replay feed)", self.name())),
        }
    }

    /// The Nature CNN's options (`[algorithm.cnn]`) of the kinds that have them.
    fn cnn_options(&self) -> Option<CnnOptions> {
        None
    }

    /// Whether the update runs an MLP's hidden layers in bf16 (`algorithm.bf16` of DDPG, TD3, SAC and DQN).
    fn mlp_bf16(&self) -> bool {
        false
    }

    /// A fresh learning agent for these spaces fed by `n_envs` env rows per step, seeded with `seed`.
    fn learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        device: Device,
        seed: u64,
    ) -> Result<Box<dyn Algorithm>>;

    /// How the acting network of an agent built for these spaces lays out its weights and reads its output
    /// (written into `model.safetensors`; [`crate::export`]).
    fn architecture(&self, observation_space: &Space, action_space: &Space) -> Result<Architecture>;

    /// What an actor process runs (on the CPU): the acting policy alone — weights and the forward pass, no
    /// optimiser, replay or rollout buffers — or, for A3C, a gradient worker.
    fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting>;

    /// The run directories of a distillation's teachers (empty for every other kind): the learner loads them
    /// and hands them over with [`crate::algorithm::Student::set_teachers`].
    fn teachers(&self) -> &[String] {
        &[]
    }

    /// One batched update for a population's members of this kind, each member's metrics in order (`None`
    /// where no update was due); `None` where they cannot batch (then each updates alone).
    fn update_members(
        &self,
        _members: &mut [&mut dyn Algorithm],
        _progress: &Progress,
    ) -> Result<Option<Vec<Option<Metrics>>>> {
        Ok(None)
    }

    /// One batched acting pass for a population's members of this kind: member `k` acts on `obs[k]` into
    /// `outs[k]` as its [`crate::policy::Policy::act`] would (to float rounding), all members' networks run as
    /// one. `Ok(false)` where they cannot (nothing was done: each acts alone). Worth it where a forward pass is
    /// launch-bound (an accelerator): the caller decides when to ask. The caller keeps `stack` from one pass
    /// to the next: the members' parameters stacked, reused while none changed.
    fn act_members(
        &self,
        _members: &mut [&mut dyn Algorithm],
        _obs: &[flotilla_core::ObsRef<'_>],
        _mode: crate::policy::ActMode,
        _outs: &mut [&mut crate::policy::ActOutput],
        _stack: &mut crate::nn::MemberStack,
    ) -> Result<bool> {
        Ok(false)
    }
}

/// [`AlgorithmKind::check_data_parallel`]'s answer for a kind whose updates run on one learner alone.
pub(crate) fn not_data_parallel(name: &str) -> std::result::Result<(), String> {
    Err(format!(
        "{name} updates cannot be spread over learners or micro-batches (PPO, A2C, DQN, DDPG, TD3 and SAC can)"
    ))
}

/// Every member as an `A`, or `None` if any is another kind (a kind's [`AlgorithmKind::update_members`] takes its own).
pub fn members_as<'a, A: Algorithm>(members: &'a mut [&mut dyn Algorithm]) -> Option<Vec<&'a mut A>> {
    if members.len() < 2 {
        return None;
    }
    members.iter_mut().map(|m| (&mut **m as &mut dyn Any).downcast_mut::<A>()).collect()
}
