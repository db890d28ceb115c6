//! The distributed learner: a [`Hub`] served over gRPC (or called in-process), and the update loop that turns
//! deliveries into updates and publishes each new parameter version.
//!
//! ```text
//! publish params v0 ─► loop until total_env_steps:
//!     next delivery (waits; actors block on a full queue)
//!     on-policy (PPO, A2C):  policy lag = newest version − chunk version; lag > max_policy_lag ─► skipped,
//!                            counted in charts/stale_chunks; else kept until chunks_per_batch are in, then
//!                            their T steps are stacked row-wise (num_envs rows), observed, and one update runs
//!     off-policy (DQN, DDPG, TD3): each step of the chunk is observed (into replay) and update() is asked,
//!                            as in single-process training; any training publishes
//!     A3C:                   gradient staleness as above; else applied by the parameter server's optimiser,
//!                            then the actor's call is answered and it fetches the new version (A3C's sync)
//!     publish the new version ─► actors pick it up between chunks
//!     metrics row / evaluation at their intervals
//! hub.finish(): actors are told the run is over
//! ```
//! PPO corrects for lag through its ratio `π_θ / μ` against the behaviour log-probs the chunks carry (and,
//! with `[algorithm.vtrace]`, V-trace targets); A2C needs V-trace for that.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flotilla_algorithms::a2c::A2c;
use flotilla_algorithms::{ActOutput, Algorithm, Metrics, Progress, Transition};
use flotilla_core::{Chunk, ChunkSpec, DType, EpisodeStats, Gradient};
use flotilla_transport::RunInfo;
use flotilla_transport::grpc::{Limits, ServerHandle, serve};
use tch::{Device, Tensor};
use tracing::{info, warn};

use crate::config::{AlgorithmConfig, ExperimentConfig, Family, Plan};
use crate::eval::evaluate;
use crate::hub::{Delivery, Hub, HubSpec, next_delivery};
use crate::train::{EvalPoint, LogRow, RunCounters, TrainReport, log_progress};
use crate::{Error, Result};

/// The learner's agent: any algorithm fed chunks, or A3C's parameter server.
pub enum LearnerAgent {
    /// PPO, A2C, DQN, DDPG, TD3.
    Chunks(Box<dyn Algorithm>),
    /// A3C: applies actors' gradients.
    Gradients(Box<A2c>),
}

impl LearnerAgent {
    /// The agent as an [`Algorithm`] (evaluation, saving).
    pub fn algorithm(&mut self) -> &mut dyn Algorithm {
        match self {
            LearnerAgent::Chunks(a) => a.as_mut(),
            LearnerAgent::Gradients(a) => a.as_mut(),
        }
    }

    fn params_vec(&mut self) -> Result<Vec<f32>> {
        let flat = self.algorithm().policy_params().flat().to_device(Device::Cpu);
        Ok(Vec::<f32>::try_from(flat.view([-1])).map_err(flotilla_algorithms::Error::from)?)
    }
}

/// Progress counters of a distributed run (saved in its checkpoints): the single-process ones, plus policy lag
/// and the time spent evaluating (training time is wall-clock minus that).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Counters {
    #[serde(flatten)]
    run: RunCounters,
    /// Lag of the chunks (or gradients) used since the last log row: sum, max, count.
    interval_lag: (u64, u64, u64),
    stale: u64,
    eval_secs: f64,
}

/// A learner serving actors. Build with [`DistributedLearner::new`], then [`DistributedLearner::run`].
pub struct DistributedLearner {
    config: ExperimentConfig,
    plan: Plan,
    agent: LearnerAgent,
    hub: Arc<Hub>,
    rx: tokio::sync::mpsc::Receiver<Delivery>,
    runtime: tokio::runtime::Runtime,
    server: Option<ServerHandle>,
    counters: Counters,
    pending: Vec<Chunk>,
    last_metrics: Metrics,
    obs_dim: usize,
    /// Where to write checkpoints (none: no checkpoints).
    checkpoint: Option<std::path::PathBuf>,
    /// Stop (with a checkpoint) once this many env steps are in, before the budget.
    stop_at: u64,
}

/// A unique run id: time and process id.
pub fn new_run_id() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("run-{}-{}", now.as_millis(), std::process::id())
}

impl DistributedLearner {
    /// Build the agent and the hub for `config` with `plan.n_actors` actors. Call [`DistributedLearner::listen`]
    /// to serve gRPC; [`DistributedLearner::hub`] serves in-process clients.
    pub fn new(config: &ExperimentConfig, plan: Plan) -> Result<Self> {
        crate::tune_allocator();
        tch::set_num_threads(config.run.torch_threads.max(1) as i32);
        let device = config.run.device.resolve()?;
        let env = flotilla_envs::make(&config.env.id, &config.env.registry_kwargs()?)?;
        let (obs_space, act_space) = (env.observation_space().clone(), env.action_space().clone());
        let obs_dtype = match &obs_space {
            flotilla_core::Space::Box { dtype, .. } => *dtype,
            flotilla_core::Space::Discrete { .. } => DType::F32,
        };
        let seed = config.run.seed;
        let mut agent = match (&config.algorithm, plan.family) {
            (AlgorithmConfig::A3c(c), _) => LearnerAgent::Gradients(Box::new(A2c::new(
                &obs_space,
                &act_space,
                plan.envs_per_actor,
                c.clone(),
                device,
                seed,
            )?)),
            (_, Family::OnPolicy) => LearnerAgent::Chunks(crate::agent::build_for(
                config,
                &obs_space,
                &act_space,
                device,
                plan.envs_per_actor * plan.chunks_per_batch,
                seed,
            )?),
            _ => LearnerAgent::Chunks(crate::agent::build_for(
                config,
                &obs_space,
                &act_space,
                device,
                plan.envs_per_actor,
                seed,
            )?),
        };
        let initial = agent.params_vec()?;
        let (obs_dim, act_dim) = {
            let a = agent.algorithm();
            (a.obs_dim(), a.act_dim())
        };
        let spec = HubSpec {
            run: RunInfo { run_id: new_run_id(), config_toml: config.to_toml() },
            observation_space: obs_space,
            action_space: act_space,
            chunk: ChunkSpec {
                obs_dim,
                obs_dtype,
                act_dim,
                n_envs: plan.envs_per_actor,
                n_steps: plan.chunk_steps,
                needs_behaviour: plan.family == Family::OnPolicy,
            },
            family: plan.family,
            n_actors: plan.n_actors,
            seed,
            n_params: initial.len(),
            total_env_steps: config.run.total_env_steps,
            synchronous: match plan.family {
                Family::OnPolicy => config.learner.synchronous,
                Family::Gradients => true,
                Family::OffPolicy => false,
            },
            queue: match (config.learner.queue_chunks, plan.family) {
                (0, Family::OnPolicy) => plan.chunks_per_batch,
                (0, Family::Gradients) => plan.n_actors,
                (0, Family::OffPolicy) => 64,
                (n, _) => n,
            },
        };
        let (hub, rx) = Hub::new(spec, initial);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("flotilla-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(format!("tokio runtime: {e}")))?;
        let counters = Counters { run: RunCounters::new(config), ..Default::default() };
        Ok(DistributedLearner {
            config: config.clone(),
            plan,
            agent,
            hub,
            rx,
            runtime,
            server: None,
            counters,
            pending: Vec::new(),
            last_metrics: Metrics::default(),
            obs_dim,
            checkpoint: None,
            stop_at: u64::MAX,
        })
    }

    /// A learner that continues the run a checkpoint written by [`DistributedLearner::save_checkpoint`] holds:
    /// the agent's whole state (parameters, optimiser, replay, schedules, RNG) and the run's counters and
    /// evaluations. The restored parameters are published as version 1 of a new run id, so actors (new ones,
    /// or old ones that re-register) start from them; their envs start new episodes.
    pub fn resume(config: &ExperimentConfig, plan: Plan, path: &std::path::Path) -> Result<Self> {
        let mut learner = Self::new(config, plan)?;
        let mut c = flotilla_algorithms::Checkpoint::load(path)?;
        learner.agent.algorithm().restore(&mut c)?;
        learner.counters = c.meta("distributed.counters")?;
        let params = learner.agent.params_vec()?;
        learner.hub.publish(params);
        learner.hub.set_env_steps(learner.counters.run.env_steps);
        Ok(learner)
    }

    /// Write checkpoints to `path` (atomically): every `[checkpoint] interval_steps` env steps, at the first
    /// update boundary after it, and when [`DistributedLearner::run`] returns.
    pub fn checkpoint_to(&mut self, path: std::path::PathBuf) {
        self.checkpoint = Some(path);
    }

    /// Make [`DistributedLearner::run`] return once `env_steps` are in (schedules still use the budget).
    pub fn stop_at(&mut self, env_steps: u64) {
        self.stop_at = env_steps;
    }

    /// Write the learner's state to `path`, atomically. Chunks waiting for a full on-policy batch are not part
    /// of it: like stale chunks, their env steps count but they are not trained on (and, like the chunks actors
    /// have in flight, they are gone after a resume). Periodic checkpoints are taken right after an update,
    /// when there are none.
    pub fn save_checkpoint(&mut self, path: &std::path::Path) -> Result<()> {
        if !self.pending.is_empty() {
            warn!("checkpoint without the {} chunks waiting for a full batch", self.pending.len());
        }
        let mut c = self.agent.algorithm().checkpoint()?;
        c.put_meta("distributed.counters", &self.counters)?;
        c.save(path)?;
        Ok(())
    }

    /// Serve gRPC on `[learner] listen` with `token`; returns the bound address.
    pub fn listen(&mut self, token: &str) -> Result<SocketAddr> {
        let addr: SocketAddr = self
            .config
            .learner
            .listen
            .parse()
            .map_err(|e| Error::Config(format!("[learner] listen = {:?}: {e}", self.config.learner.listen)))?;
        let limits = Limits { max_message_bytes: self.config.transport.max_message_mib << 20 };
        let server = serve(self.runtime.handle(), self.hub.clone(), addr, token, &limits)
            .map_err(|e| Error::Runtime(e.to_string()))?;
        let local = server.local_addr;
        self.server = Some(server);
        Ok(local)
    }

    /// The hub (for in-process actors and tests).
    pub fn hub(&self) -> Arc<Hub> {
        self.hub.clone()
    }

    /// The plan this learner runs.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// The agent.
    pub fn agent(&mut self) -> &mut dyn Algorithm {
        self.agent.algorithm()
    }

    /// Train until the budget or until `stop` is set, calling `on_log` with each metrics row. Ends with an
    /// evaluation of the final policy (unless stopped) and tells actors the run is over.
    pub fn run(&mut self, stop: &AtomicBool, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<TrainReport> {
        let total = self.config.run.total_env_steps;
        // Training time is wall-clock (actors run in parallel with the learner) minus evaluations, added to what
        // a resumed run had.
        let start = Instant::now();
        let (train_before, eval_before) = (self.counters.run.train_secs, self.counters.eval_secs);
        let mut last_data = Instant::now();
        let mut waited_log = Instant::now();
        while self.counters.run.env_steps < total.min(self.stop_at) && !stop.load(Ordering::SeqCst) {
            let Some(delivery) = next_delivery(self.runtime.handle(), &mut self.rx, Duration::from_millis(200)) else {
                if last_data.elapsed() > Duration::from_secs(10) && waited_log.elapsed() > Duration::from_secs(10) {
                    info!("waiting for actors ({} registered)", self.hub.live_actors());
                    waited_log = Instant::now();
                }
                continue;
            };
            last_data = Instant::now();
            match delivery {
                Delivery::Chunk(chunk) => self.on_chunk(chunk)?,
                // The actor's ack goes out as soon as its gradient is in the published parameters.
                Delivery::Gradient(g, receipt) => {
                    self.on_gradient(g)?;
                    drop(receipt);
                }
            }
            self.hub.set_env_steps(self.counters.run.env_steps);
            self.counters.run.train_secs =
                train_before + start.elapsed().as_secs_f64() - (self.counters.eval_secs - eval_before);
            self.after_data(on_log)?;
            self.checkpoint_if_due()?;
        }
        // Actors waiting on a full queue get `finished` now, and every later message too.
        self.hub.finish();
        self.rx.close();
        if !stop.load(Ordering::SeqCst)
            && self.counters.run.env_steps >= total
            && self.counters.run.evals.last().is_none_or(|e| e.env_steps < self.counters.run.env_steps)
        {
            self.evaluate_now()?;
        }
        if let Some(path) = self.checkpoint.clone() {
            self.save_checkpoint(&path)?;
        }
        Ok(self.report())
    }

    /// What the run has done so far.
    pub fn report(&self) -> TrainReport {
        self.counters.run.report()
    }

    /// A checkpoint once its interval has passed, at an update boundary (no chunks waiting for a batch).
    fn checkpoint_if_due(&mut self) -> Result<()> {
        let Some(path) = self.checkpoint.clone() else { return Ok(()) };
        if self.pending.is_empty() && self.counters.run.checkpoint_due(&self.config) {
            self.save_checkpoint(&path)?;
        }
        Ok(())
    }

    fn count_episodes(&mut self, episodes: &[EpisodeStats]) {
        for ep in episodes {
            self.counters.run.count_episode(ep.episode_return, ep.length);
        }
    }

    /// Whether a delivery of `version` is fresh enough to train on; counts its lag.
    fn admit(&mut self, version: u64, actor_id: u64) -> bool {
        let lag = self.hub.version().saturating_sub(version);
        let c = &mut self.counters;
        if self.plan.family != Family::OffPolicy && lag > self.config.learner.max_policy_lag {
            c.stale += 1;
            if c.stale.is_power_of_two() {
                warn!(
                    "skipped data from actor {actor_id} with policy lag {lag} > max_policy_lag {} ({} skipped so far)",
                    self.config.learner.max_policy_lag, c.stale
                );
            }
            return false;
        }
        c.interval_lag.0 += lag;
        c.interval_lag.1 = c.interval_lag.1.max(lag);
        c.interval_lag.2 += 1;
        true
    }

    fn on_chunk(&mut self, chunk: Chunk) -> Result<()> {
        self.count_episodes(&chunk.episodes);
        let fresh = self.admit(chunk.policy_version, chunk.actor_id);
        match self.plan.family {
            Family::OffPolicy => {
                self.feed_off_policy(&chunk)?;
            }
            Family::OnPolicy => {
                self.counters.run.env_steps += chunk.transitions() as u64;
                if fresh {
                    self.pending.push(chunk);
                }
                if self.pending.len() == self.plan.chunks_per_batch {
                    let batch = std::mem::take(&mut self.pending);
                    self.train_on_policy(&batch)?;
                }
            }
            Family::Gradients => unreachable!("the hub refuses chunks in a gradient run"),
        }
        Ok(())
    }

    fn on_gradient(&mut self, g: Gradient) -> Result<()> {
        self.count_episodes(&g.episodes);
        self.counters.run.env_steps += g.env_steps;
        if !self.admit(g.policy_version, g.actor_id) {
            return Ok(());
        }
        let LearnerAgent::Gradients(a2c) = &mut self.agent else {
            unreachable!("the hub refuses gradients unless the run is a3c")
        };
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let started = Instant::now();
        let grad = Tensor::from_slice(&g.values);
        let lr = a2c.apply_gradients(&grad, progress.remaining())?;
        let mut m = Metrics::default();
        m.push("charts/learning_rate", lr);
        m.push("charts/gradient_steps", 1.0);
        self.counters.run.count_update(&m);
        self.publish(m, started)
    }

    /// Observe each step of a chunk into the off-policy agent, asking it to update after each, as the
    /// single-process trainer does.
    fn feed_off_policy(&mut self, chunk: &Chunk) -> Result<()> {
        let (e, d) = (chunk.n_envs, self.obs_dim);
        let act_dim = chunk.actions.len() / chunk.transitions();
        let total = self.config.run.total_env_steps;
        let (mut obs, mut next_obs) = (Vec::with_capacity(e * d), Vec::with_capacity(e * d));
        let mut act = ActOutput::default();
        let mut cursor = 0;
        let started = Instant::now();
        let mut last = None;
        for t in 0..chunk.n_steps {
            let rows = t * e..(t + 1) * e;
            obs.clear();
            chunk.obs.extend_f32(rows.start * d..rows.end * d, &mut obs);
            next_obs.clear();
            for env in 0..e {
                chunk.next_obs_into(t, env, d, &mut cursor, &mut next_obs);
            }
            act.actions.clear();
            act.actions.extend_from_slice(&chunk.actions[rows.start * act_dim..rows.end * act_dim]);
            let transition = Transition {
                obs: &obs,
                act: &act,
                rewards: &chunk.rewards[rows.clone()],
                terminated: &chunk.terminated[rows.clone()],
                truncated: &chunk.truncated[rows.clone()],
                next_obs: &next_obs,
            };
            let agent = self.agent.algorithm();
            agent.observe(&transition)?;
            self.counters.run.env_steps += e as u64;
            let progress = Progress { env_steps: self.counters.run.env_steps, total_env_steps: total };
            if let Some(m) = agent.update(&progress)? {
                self.counters.run.count_update(&m);
                last = Some(m);
            }
        }
        // One publication per chunk, however many updates it triggered.
        if let Some(m) = last {
            self.publish(m, started)?;
        }
        Ok(())
    }

    /// Stack `batch`'s chunks row-wise (chunk k's env j is row k·E + j) and observe its T steps, then update.
    fn train_on_policy(&mut self, batch: &[Chunk]) -> Result<()> {
        let started = Instant::now();
        let d = self.obs_dim;
        let e = self.plan.envs_per_actor;
        let rows = e * batch.len();
        let act_dim = batch[0].actions.len() / batch[0].transitions();
        let mut obs = Vec::with_capacity(rows * d);
        let mut next_obs = Vec::with_capacity(rows * d);
        let mut act = ActOutput::default();
        let (mut rewards, mut terminated, mut truncated) = (Vec::new(), Vec::new(), Vec::new());
        let mut cursors = vec![0usize; batch.len()];
        for t in 0..self.plan.chunk_steps {
            obs.clear();
            next_obs.clear();
            act.actions.clear();
            act.log_probs.clear();
            act.values.clear();
            rewards.clear();
            terminated.clear();
            truncated.clear();
            for (chunk, cursor) in batch.iter().zip(&mut cursors) {
                let r = t * e..(t + 1) * e;
                chunk.obs.extend_f32(r.start * d..r.end * d, &mut obs);
                for env in 0..e {
                    chunk.next_obs_into(t, env, d, cursor, &mut next_obs);
                }
                act.actions.extend_from_slice(&chunk.actions[r.start * act_dim..r.end * act_dim]);
                act.log_probs.extend_from_slice(&chunk.log_probs[r.clone()]);
                act.values.extend_from_slice(&chunk.values[r.clone()]);
                rewards.extend_from_slice(&chunk.rewards[r.clone()]);
                terminated.extend_from_slice(&chunk.terminated[r.clone()]);
                truncated.extend_from_slice(&chunk.truncated[r]);
            }
            let transition = Transition {
                obs: &obs,
                act: &act,
                rewards: &rewards,
                terminated: &terminated,
                truncated: &truncated,
                next_obs: &next_obs,
            };
            self.agent.algorithm().observe(&transition)?;
        }
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let m = self.agent.algorithm().update(&progress)?.ok_or_else(|| {
            Error::Runtime(format!(
                "an on-policy batch of {rows} rows × {} steps did not fill a rollout",
                self.plan.chunk_steps
            ))
        })?;
        self.counters.run.count_update(&m);
        self.publish(m, started)
    }

    /// Publish the parameters after updates begun at `started`; `m` is the last update's metrics.
    fn publish(&mut self, m: Metrics, started: Instant) -> Result<()> {
        let params = self.agent.params_vec()?;
        self.hub.publish(params);
        self.counters.run.update_secs += started.elapsed().as_secs_f64();
        self.last_metrics = m;
        Ok(())
    }

    fn evaluate_now(&mut self) -> Result<()> {
        let (c, k) = (&self.config, &mut self.counters);
        let started = Instant::now();
        let result = evaluate(self.agent.algorithm(), &c.env, c.eval.episodes, k.run.eval_seed(c))?;
        k.eval_secs += started.elapsed().as_secs_f64();
        k.run.evals.push(EvalPoint { env_steps: k.run.env_steps, train_secs: k.run.train_secs, result });
        Ok(())
    }

    fn after_data(&mut self, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<()> {
        let mut eval = None;
        if self.counters.run.eval_due(&self.config) {
            self.evaluate_now()?;
            eval = self.counters.run.evals.last().map(|e| e.result.clone());
        }
        let c = &mut self.counters;
        if !c.run.log_due(&self.config, eval.is_some()) {
            return Ok(());
        }
        let mut update = self.last_metrics.clone();
        let (lag_sum, lag_max, lag_n) = c.interval_lag;
        if lag_n > 0 {
            update.push("charts/policy_lag", lag_sum as f64 / lag_n as f64);
            update.push("charts/policy_lag_max", lag_max as f64);
        }
        update.push("charts/stale_chunks", c.stale as f64);
        update.push("charts/refused_messages", self.hub.counters.refused.load(Ordering::Relaxed) as f64);
        update.push("charts/policy_version", self.hub.version() as f64);
        update.push("charts/actors", self.hub.live_actors() as f64);
        let row = c.run.log_row(update, eval);
        log_progress(&row);
        on_log(&row)?;
        c.interval_lag = (0, 0, 0);
        Ok(())
    }
}
