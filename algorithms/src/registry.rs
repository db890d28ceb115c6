//! The one place that knows every algorithm kind: its config, family, validation, name, how to build the
//! learner, and how to build what an actor runs.
//!
//! Adding an algorithm: its own file (config, network, loss, `impl Algorithm`, an acting policy) and one
//! variant here, with its arm in each `match` below. Nothing else in the workspace matches on the kind.
//!
//! ```text
//! [algorithm] kind = "ppo" ─► AlgorithmConfig::Ppo(PpoConfig)       (serde, from the experiment TOML)
//!   .validate(num_envs) · .name() · .family() · .rollout_steps()
//!   .build_learner(spaces, n_envs, device, seed)  ─► Box<dyn Algorithm>    (trainer, learner, eval)
//!   .build_acting(&ActingSetup)                   ─► Acting                 (actor processes)
//! ```
use flotilla_core::Space;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::a2c::{A2c, A2cConfig, A3cWorker};
use crate::acting::{Acting, ActingSetup};
use crate::actor_critic::ActorCriticPolicy;
use crate::algorithm::Algorithm;
use crate::dqn::{Dqn, DqnConfig, DqnPolicy};
use crate::ppo::{Ppo, PpoConfig};
use crate::td3::{DdpgConfig, Td3, Td3Config, Td3Policy};
use crate::{Error, Result};

/// `[algorithm]`: `kind` picks the algorithm; the other keys are its config struct's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum AlgorithmConfig {
    /// Proximal Policy Optimization.
    Ppo(PpoConfig),
    /// Deep Q-Networks (double-Q, dueling, prioritized replay, n-step as options).
    Dqn(DqnConfig),
    /// Advantage Actor-Critic (synchronous A3C).
    A2c(A2cConfig),
    /// Asynchronous Advantage Actor-Critic: actors compute A2C gradients on their own chunks and the learner
    /// applies them as a parameter server (needs actors: `--actors N`). Same fields as `a2c`.
    A3c(A2cConfig),
    /// Deep Deterministic Policy Gradient.
    Ddpg(DdpgConfig),
    /// Twin Delayed DDPG.
    Td3(Td3Config),
}

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

impl AlgorithmConfig {
    /// Short name, as in configs (`"ppo"`).
    pub fn name(&self) -> &'static str {
        match self {
            AlgorithmConfig::Ppo(_) => "ppo",
            AlgorithmConfig::Dqn(_) => "dqn",
            AlgorithmConfig::A2c(_) => "a2c",
            AlgorithmConfig::A3c(_) => "a3c",
            AlgorithmConfig::Ddpg(_) => "ddpg",
            AlgorithmConfig::Td3(_) => "td3",
        }
    }

    /// How a learner fed by actors uses their data.
    pub fn family(&self) -> Family {
        match self {
            AlgorithmConfig::Ppo(_) | AlgorithmConfig::A2c(_) => Family::OnPolicy,
            AlgorithmConfig::A3c(_) => Family::Gradients,
            AlgorithmConfig::Dqn(_) | AlgorithmConfig::Ddpg(_) | AlgorithmConfig::Td3(_) => Family::OffPolicy,
        }
    }

    /// Range checks serde cannot express; `num_envs` envs feed each update.
    pub fn validate(&self, num_envs: usize) -> Result<()> {
        match self {
            AlgorithmConfig::Ppo(c) => c.validate(num_envs),
            AlgorithmConfig::Dqn(c) => c.validate(),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => c.validate(num_envs),
            AlgorithmConfig::Ddpg(c) => c.validate(),
            AlgorithmConfig::Td3(c) => c.validate(),
        }
    }

    /// Steps per rollout of an on-policy algorithm (and A3C's per-gradient rollout): the length every actor
    /// chunk must have. `None` for replay-based algorithms, whose chunks may be any length.
    pub fn rollout_steps(&self) -> Option<usize> {
        match self {
            AlgorithmConfig::Ppo(c) => Some(c.n_steps),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => Some(c.n_steps),
            AlgorithmConfig::Dqn(_) | AlgorithmConfig::Ddpg(_) | AlgorithmConfig::Td3(_) => None,
        }
    }

    /// Whether the config can train with actor processes feeding one learner; the error says why not.
    pub fn check_distributed(&self) -> Result<()> {
        match self {
            AlgorithmConfig::Dqn(c) if c.n_step > 1 => Err(Error::InvalidConfig {
                algorithm: "dqn",
                field: "n_step",
                value: c.n_step.to_string(),
                detail: "n-step returns need one queue per actor env, which the distributed learner does not keep \
                         yet; use n_step = 1 with actors"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// A fresh learning agent for these spaces fed by `n_envs` env rows per observed step, seeded with `seed`.
    /// A3C's is the parameter server: an A2C agent that applies actors' gradients.
    pub fn build_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        device: Device,
        seed: u64,
    ) -> Result<Box<dyn Algorithm>> {
        let (o, a) = (observation_space, action_space);
        Ok(match self {
            AlgorithmConfig::Ppo(c) => Box::new(Ppo::new(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::Dqn(c) => Box::new(Dqn::new(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => {
                Box::new(A2c::new(o, a, n_envs, c.clone(), device, seed)?)
            }
            AlgorithmConfig::Ddpg(c) => Box::new(Td3::ddpg(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::Td3(c) => Box::new(Td3::td3(o, a, n_envs, c.clone(), device, seed)?),
        })
    }

    /// What an actor process runs (on the CPU): the acting policy alone — weights and the forward pass, no
    /// optimiser, replay or rollout buffers — or, for A3C, a gradient worker.
    pub fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let ActingSetup { observation_space: o, action_space: a, n_envs, seed, epsilon_floor } = *setup;
        let actor_critic = |name, hidden: &[i64], activation, log_std_init| {
            ActorCriticPolicy::new(name, o, a, hidden, activation, log_std_init, seed)
        };
        Ok(match self {
            AlgorithmConfig::Ppo(c) => {
                Acting::Chunks(Box::new(actor_critic("ppo", &c.hidden_sizes, c.activation, c.log_std_init)?))
            }
            AlgorithmConfig::A2c(c) => {
                Acting::Chunks(Box::new(actor_critic("a2c", &c.hidden_sizes, c.activation, c.log_std_init)?))
            }
            AlgorithmConfig::A3c(c) => Acting::Gradients(Box::new(A3cWorker::new(o, a, n_envs, c.clone(), seed)?)),
            AlgorithmConfig::Dqn(c) => Acting::Chunks(Box::new(DqnPolicy::new(o, a, c.clone(), epsilon_floor, seed)?)),
            AlgorithmConfig::Ddpg(c) => {
                Acting::Chunks(Box::new(Td3Policy::new("ddpg", o, a, n_envs, &c.clone().into(), seed)?))
            }
            AlgorithmConfig::Td3(c) => Acting::Chunks(Box::new(Td3Policy::new("td3", o, a, n_envs, c, seed)?)),
        })
    }
}
