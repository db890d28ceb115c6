//! `flotilla actor`: join a learner, build envs and the acting policy from its run config, and act.
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use flotilla_actors::{ActorAgent, ActorFactory, ActorOptions, ActorReport, Connector, run_actor};
use flotilla_algorithms::a2c::A2c;
use flotilla_algorithms::dqn::{Dqn, apex_epsilon};
use flotilla_envs::VecEnv;
use flotilla_learner::config::{AlgorithmConfig, ExperimentConfig};
use flotilla_transport::grpc::{GrpcClient, Limits};
use flotilla_transport::{LearnerClient, Registered, RunInfo};
use tch::Device;

/// Builds an actor's envs and policy from the learner's resolved config. Actors act on the CPU, one torch
/// thread: their batches are a few rows.
#[derive(Default)]
pub struct ConfigFactory {
    config: Option<ExperimentConfig>,
}

impl ConfigFactory {
    fn config(&mut self, run: &RunInfo) -> flotilla_actors::Result<&ExperimentConfig> {
        if self.config.is_none() {
            let c = ExperimentConfig::parse(&run.config_toml, &[])
                .map_err(|e| flotilla_actors::Error::Setup(format!("the learner's config: {e}")))?;
            self.config = Some(c);
        }
        Ok(self.config.as_ref().expect("just set"))
    }
}

fn setup<E: std::fmt::Display>(e: E) -> flotilla_actors::Error {
    flotilla_actors::Error::Setup(e.to_string())
}

impl ActorFactory for ConfigFactory {
    fn envs(&mut self, run: &RunInfo) -> flotilla_actors::Result<VecEnv> {
        tch::set_num_threads(1);
        let config = self.config(run)?;
        let plan = config.plan(config.actors.count).map_err(setup)?;
        let kwargs = config.env.registry_kwargs().map_err(setup)?;
        Ok(VecEnv::make(&config.env.id, &kwargs, plan.envs_per_actor)?)
    }

    fn agent(&mut self, run: &RunInfo, registered: &Registered, envs: &VecEnv) -> flotilla_actors::Result<ActorAgent> {
        let config = self.config(run)?.clone();
        let (obs, act, n, seed) = (envs.observation_space(), envs.action_space(), envs.num_envs(), registered.seed);
        Ok(match &config.algorithm {
            AlgorithmConfig::A3c(c) => {
                ActorAgent::Gradient(Box::new(A2c::new(obs, act, n, c.clone(), Device::Cpu, seed)?))
            }
            AlgorithmConfig::Dqn(c) => {
                // The acting copy never samples replay: keep its buffer minimal.
                let mut c = c.clone();
                c.buffer_size = c.batch_size;
                let mut dqn = Dqn::new(obs, act, n, c, Device::Cpu, seed)?;
                let a = &config.actors;
                let eps = apex_epsilon(
                    registered.actor_index as usize,
                    registered.n_actors as usize,
                    a.epsilon,
                    a.epsilon_alpha,
                );
                tracing::info!("Ape-X exploration: ε floor {eps:.4} for slot {}", registered.actor_index);
                dqn.set_actor_epsilon(eps);
                ActorAgent::Rollout(Box::new(dqn))
            }
            _ => {
                let mut config = config.clone();
                // The acting copy never trains: size its buffers for what it holds, not the learner's batch.
                if let AlgorithmConfig::Ppo(c) = &mut config.algorithm {
                    c.batch_size = c.n_steps * n;
                }
                if let AlgorithmConfig::Ddpg(c) = &mut config.algorithm {
                    c.buffer_size = c.batch_size;
                }
                if let AlgorithmConfig::Td3(c) = &mut config.algorithm {
                    c.buffer_size = c.batch_size;
                }
                ActorAgent::Rollout(
                    flotilla_learner::agent::build_for(&config, obs, act, Device::Cpu, n, seed).map_err(setup)?,
                )
            }
        })
    }
}

/// Act for the learner at `addr` until the run ends.
pub fn actor_command(addr: &str, token: &str, index: Option<u32>, reconnect_secs: f64) -> anyhow::Result<ActorReport> {
    let stop: Arc<AtomicBool> = flotilla_learner::launcher::install_stop_signals();
    let (addr, token) = (addr.to_string(), token.to_string());
    let connect: Connector = Box::new(move || {
        let limits = Limits { max_message_bytes: 1 << 30 };
        GrpcClient::connect(&addr, &token, &limits, Duration::from_secs(5))
            .map(|c| Box::new(c) as Box<dyn LearnerClient>)
    });
    let options = ActorOptions { actor_index: index, reconnect_for: Duration::from_secs_f64(reconnect_secs), stop };
    let report = run_actor(connect, &mut ConfigFactory::default(), &options)?;
    tracing::info!(
        "actor done: {} messages, {} env steps, {} parameter versions, {} reconnects",
        report.sent,
        report.env_steps,
        report.params_loaded,
        report.reconnects
    );
    Ok(report)
}
