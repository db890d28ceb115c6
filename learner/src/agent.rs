//! From the `[algorithm]` config to a live agent: the one place that knows every algorithm.
use flotilla_algorithms::Algorithm;
use flotilla_algorithms::a2c::A2c;
use flotilla_algorithms::dqn::Dqn;
use flotilla_algorithms::ppo::Ppo;
use flotilla_algorithms::td3::Td3;
use flotilla_core::Space;
use tch::Device;

use crate::Result;
use crate::config::{AlgorithmConfig, ExperimentConfig};

/// A fresh agent for these spaces, as `config.algorithm` says, seeded with `config.run.seed`.
pub fn build(
    config: &ExperimentConfig,
    observation_space: &Space,
    action_space: &Space,
    device: Device,
) -> Result<Box<dyn Algorithm>> {
    build_for(config, observation_space, action_space, device, config.env.num_envs, config.run.seed)
}

/// [`build`] for `n_envs` parallel rows per observed step and another seed (distributed learners batch
/// several actors' chunks; each actor builds its own acting copy).
pub fn build_for(
    config: &ExperimentConfig,
    observation_space: &Space,
    action_space: &Space,
    device: Device,
    n_envs: usize,
    seed: u64,
) -> Result<Box<dyn Algorithm>> {
    Ok(match &config.algorithm {
        AlgorithmConfig::Ppo(c) => {
            Box::new(Ppo::new(observation_space, action_space, n_envs, c.clone(), device, seed)?)
        }
        AlgorithmConfig::Dqn(c) => {
            Box::new(Dqn::new(observation_space, action_space, n_envs, c.clone(), device, seed)?)
        }
        AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => {
            Box::new(A2c::new(observation_space, action_space, n_envs, c.clone(), device, seed)?)
        }
        AlgorithmConfig::Ddpg(c) => {
            Box::new(Td3::ddpg(observation_space, action_space, n_envs, c.clone(), device, seed)?)
        }
        AlgorithmConfig::Td3(c) => {
            Box::new(Td3::td3(observation_space, action_space, n_envs, c.clone(), device, seed)?)
        }
    })
}
