//! `flotilla actor`: join a learner, build envs and the acting policy from its run config, and act.
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use flotilla_actors::{ActorFactory, ActorOptions, ActorReport, Connector, run_actor};
use flotilla_algorithms::dqn::apex_epsilon;
use flotilla_algorithms::{Acting, ActingSetup};
use flotilla_envs::{EnvRole, VectorEnv};
use flotilla_learner::config::{ExperimentConfig, MAX_RECONNECT_SECS};
use flotilla_transport::grpc::{GrpcClient, Limits};
use flotilla_transport::tls::ClientTls;
use flotilla_transport::{LearnerClient, Registered, RunInfo};

/// Builds an actor's envs and acting policy from the learner's resolved config. Actors act on the CPU, one
/// torch thread: their batches are a few rows.
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
    fn envs(&mut self, run: &RunInfo, slot: Option<u32>) -> flotilla_actors::Result<Box<dyn VectorEnv>> {
        tch::set_num_threads(1);
        let config = self.config(run)?;
        let plan = config.plan(config.actor_slots()).map_err(setup)?;
        // `[actors] task_per_actor`: the actor in slot s steps task s mod T only (task 0 until the learner has
        // given a slot; same spaces whichever task).
        let t = config.env.tasks.len();
        if config.actors.task_per_actor && t > 0 {
            let task = slot.map_or(0, |s| s as usize % t);
            return config.env.make_task_vector(task, plan.envs_per_actor, EnvRole::Training).map_err(setup);
        }
        config.env.make_vector(plan.envs_per_actor, EnvRole::Training).map_err(setup)
    }

    fn acting(
        &mut self,
        run: &RunInfo,
        registered: &Registered,
        envs: &dyn VectorEnv,
    ) -> flotilla_actors::Result<Acting> {
        let config = self.config(run)?;
        let a = &config.actors;
        // Ape-X: slot i of N explores with at least ε_i (ε-greedy policies; the others ignore it).
        let (slot, slots) = (registered.actor_index as usize, registered.n_actors as usize);
        let epsilon_floor = apex_epsilon(slot, slots, a.epsilon, a.epsilon_alpha);
        let setup = ActingSetup {
            observation_space: envs.observation_space(),
            action_space: envs.action_space(),
            n_envs: envs.num_envs(),
            seed: registered.seed,
            epsilon_floor,
            frozen: &config.init.freeze,
        };
        let acting = config.algorithm.build_acting(&setup)?;
        Ok(flotilla_algorithms::normalize::wrap_acting(acting, config.normalize.as_ref(), envs.observation_space())?)
    }
}

/// Act for the learner at `addr` until the run ends, over TLS when `tls` is given.
pub fn actor_command(
    addr: &str,
    token: &str,
    index: Option<u32>,
    reconnect_secs: f64,
    tls: Option<ClientTls>,
) -> anyhow::Result<ActorReport> {
    let stop: Arc<AtomicBool> = crate::launcher::install_stop_signals();
    let (addr, token) = (addr.to_string(), token.to_string());
    let connect: Connector = Box::new(move || {
        let limits = Limits { max_message_bytes: 1 << 30, ..Limits::default() };
        GrpcClient::connect_with(&addr, &token, &limits, Duration::from_secs(5), tls.as_ref())
            .map(|c| Box::new(c) as Box<dyn LearnerClient>)
    });
    anyhow::ensure!(
        reconnect_secs.is_finite() && reconnect_secs > 0.0 && reconnect_secs <= MAX_RECONNECT_SECS,
        "--reconnect-secs {reconnect_secs}: must be a number of seconds in (0, {MAX_RECONNECT_SECS}]"
    );
    let options = ActorOptions { actor_index: index, reconnect_for: Duration::from_secs_f64(reconnect_secs), stop };
    let report = run_actor(connect, &mut ConfigFactory::default(), &options)?;
    tracing::info!(
        "actor done: {} messages delivered, {} env steps delivered, {} env steps collected, {} parameter versions, \
         {} reconnects",
        report.sent,
        report.delivered_env_steps,
        report.env_steps,
        report.params_loaded,
        report.reconnects
    );
    Ok(report)
}
