//! The distributed learner: a [`Hub`] served over gRPC (or called in-process), and the update loop that turns
//! deliveries into updates and publishes each new parameter version.
//!
//! ```text
//! publish params v0 ─► loop until total_env_steps:
//!     next delivery (waits; actors block on a full queue)
//!     on-policy (PPO, A2C):  policy lag = newest version − chunk version; lag > max_policy_lag ─► skipped,
//!                            counted in charts/stale_chunks; else kept until chunks_per_batch are in, then
//!                            their T steps are stacked row-wise (num_envs rows), observed, and one update runs
//!     off-policy (DQN, DDPG, TD3): the chunk is observed (into replay) and update() is asked,
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

use flotilla_algorithms::{Algorithm, Metrics, Progress};
use flotilla_core::{Chunk, ChunkSpec, DType, EpisodeStats, Gradient};
use flotilla_transport::RunInfo;
use flotilla_transport::grpc::{Limits, ServerHandle, serve_with};
use flotilla_transport::tls::ServerTls;
use tch::Device;
use tracing::{error, info, warn};

use crate::assembly::{Assembly, AssemblySpec, Intake, PreparedChunk, Ready, Staged, add_lag, guarded, merge_lag};
use crate::config::{ExperimentConfig, Family, Plan};
use crate::data_parallel::Replicas;
use crate::eval::evaluate;
use crate::hub::{Delivery, Hub, HubSpec, next_delivery};
use crate::progress::{EvalPoint, LogRow, RunCounters, TrainReport, log_progress};
use crate::{Error, Result};

/// The agent's policy parameters as a flat CPU vector (what a broadcast carries).
fn params_vec(agent: &dyn Algorithm) -> Result<Vec<f32>> {
    let flat = agent.policy_params().flat().to_device(Device::Cpu);
    Ok(Vec::<f32>::try_from(flat.view([-1])).map_err(flotilla_algorithms::Error::from)?)
}

/// The error for an agent of kind `name` that lacks the capability a step needs (`what` it cannot do).
fn lacks(name: &str, what: &str) -> flotilla_algorithms::Error {
    flotilla_algorithms::Error::Unsupported(format!("{name} {what}"))
}

/// The checkpoint's metadata key of the run's [`Counters`].
const COUNTERS_META: &str = "distributed.counters";

/// Progress counters of a distributed run (saved in its checkpoints): the single-process ones, plus policy lag
/// and the time spent evaluating (training time is wall-clock minus that).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Counters {
    #[serde(flatten)]
    run: RunCounters,
    /// Lag of the chunks (or gradients) used since the last log row: sum, max, count.
    interval_lag: (u64, u64, u64),
    stale: u64,
    /// Updates that failed (a libtorch error or a non-finite loss): their data was skipped.
    #[serde(default)]
    failed_updates: u64,
    eval_secs: f64,
}

/// A learner serving actors. Build with [`DistributedLearner::new`], then [`DistributedLearner::run`].
pub struct DistributedLearner {
    config: ExperimentConfig,
    plan: Plan,
    agent: Box<dyn Algorithm>,
    hub: Arc<Hub>,
    /// The hub's queue (handed to the assembly thread while an on-policy run assembles ahead).
    rx: Option<tokio::sync::mpsc::Receiver<Delivery>>,
    /// The on-policy batch-assembly thread, while `run` runs.
    assembly: Option<Assembly>,
    runtime: tokio::runtime::Runtime,
    server: Option<ServerHandle>,
    /// The Prometheus endpoint (`[learner] metrics_listen`), stopped when the learner is dropped.
    metrics_server: Option<flotilla_observe::prometheus::MetricsServer>,
    counters: Counters,
    pending: Vec<Chunk>,
    /// Env steps delivered into the queue that the run ended without taking in ([`TrainReport::untrained_env_steps`]).
    untrained_env_steps: u64,
    /// Chunks and env steps the batch-assembly thread held, uncounted, when it stopped.
    assembly_left: (u64, u64),
    last_metrics: Metrics,
    /// Where to write checkpoints (none: no checkpoints).
    checkpoint: Option<std::path::PathBuf>,
    /// Stop (with a checkpoint) once this many env steps are in, before the budget.
    stop_at: u64,
    /// The other learners training this model, if any (`[learner] learners > 1`).
    replicas: Option<Replicas>,
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
        Self::build(config, plan, true)
    }

    /// [`DistributedLearner::new`]; `fresh`: a new run (`[init] from` applies; a resumed run's weights come
    /// from its checkpoint).
    fn build(config: &ExperimentConfig, plan: Plan, fresh: bool) -> Result<Self> {
        crate::tune_allocator();
        tch::set_num_threads(config.run.torch_threads.max(1) as i32);
        let device = config.run.device.resolve()?;
        crate::config::warn_about_the_machine(config, device);
        let (obs_space, act_space) = config.env.spaces()?;
        let obs_dtype = match &obs_space {
            flotilla_core::Space::Box { dtype, .. } => *dtype,
            flotilla_core::Space::Discrete { .. } => DType::F32,
        };
        let seed = config.run.seed;
        // An on-policy update is a batch of whole chunks stacked row-wise; otherwise the agent sees one
        // actor's envs at a time (chunks into replay, or A3C gradients of one actor's rollout).
        let rows = match plan.family {
            Family::OnPolicy => plan.envs_per_actor * plan.chunks_per_batch,
            Family::OffPolicy | Family::Gradients => plan.envs_per_actor,
        };
        let agent = config.algorithm.build_learner(&obs_space, &act_space, rows, device, seed)?;
        let mut agent = flotilla_algorithms::normalize::wrap_learner(agent, config.normalize.as_ref(), &obs_space)?;
        crate::init::init_agent(config, agent.as_mut(), fresh)?;
        let replicas = crate::data_parallel::join(config, agent.as_mut(), device)?;
        // Each learner of a group seeds its own actors' envs: rank r's actors draw from seed + r·2³², far from
        // the seed + 1000·(k + 1) its k-th actor registration adds, so no two learners step the same episodes.
        let rank = replicas.as_ref().map_or(0, |r| r.rank as u64);
        let actor_seed = seed.wrapping_add(rank << 32);
        let initial = params_vec(agent.as_ref())?;
        let (obs_dim, act_dim) = (agent.obs_dim(), agent.act_dim());
        let spec = HubSpec {
            run: RunInfo { run_id: new_run_id(), config_toml: config.to_toml() },
            chunk: ChunkSpec {
                observation_space: obs_space,
                action_space: act_space,
                obs_dim,
                obs_dtype,
                act_dim,
                n_envs: plan.envs_per_actor,
                n_steps: plan.chunk_steps,
                needs_behaviour: plan.family == Family::OnPolicy,
                state_dim: agent.state_dim(),
                state_bounded: agent.state_bounded(),
                n_tasks: config.env.tasks.len(),
            },
            family: plan.family,
            n_actors: plan.n_actors,
            seed: actor_seed,
            // A3C gradients hold the trainable parameters only (frozen layers stay off the wire).
            n_params: agent.policy_params().trainable_numel() as usize,
            total_env_steps: config.run.total_env_steps,
            max_refused_in_a_row: config.learner.max_refused_in_a_row,
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
        let metrics_server = match config.learner.metrics_addr()? {
            Some(addr) => {
                // Learner r of a group listens r ports up, so a group on one machine does not collide.
                let port = if addr.port() == 0 { 0 } else { addr.port().saturating_add(rank as u16) };
                let server = flotilla_observe::prometheus::serve(
                    std::net::SocketAddr::new(addr.ip(), port),
                    hub.metrics().clone(),
                )?;
                info!("metrics on http://{}/metrics", server.local_addr());
                Some(server)
            }
            None => None,
        };
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
            rx: Some(rx),
            assembly: None,
            runtime,
            server: None,
            metrics_server,
            counters,
            pending: Vec::new(),
            untrained_env_steps: 0,
            assembly_left: (0, 0),
            last_metrics: Metrics::default(),
            checkpoint: None,
            stop_at: u64::MAX,
            replicas,
        })
    }

    /// A learner that continues the run a checkpoint written by [`DistributedLearner::save_checkpoint`] holds:
    /// the agent's whole state (parameters, optimiser, replay, schedules, RNG) and the run's counters and
    /// evaluations. The restored parameters are published as version 1 of a new run id, so actors (new ones,
    /// or old ones that re-register) start from them; their envs start new episodes.
    pub fn resume(config: &ExperimentConfig, plan: Plan, path: &std::path::Path) -> Result<Self> {
        let mut learner = Self::build(config, plan, false)?;
        let mut c = flotilla_algorithms::Checkpoint::load(path)?;
        learner.agent.restore(&mut c)?;
        learner.counters = c.meta(COUNTERS_META)?;
        let params = params_vec(learner.agent.as_ref())?;
        learner.hub.publish(params);
        learner.hub.set_env_steps(learner.counters.run.env_steps);
        Ok(learner)
    }

    /// The env steps counted in the checkpoint at `path` (one [`DistributedLearner::save_checkpoint`] wrote): where
    /// a learner resumed from it starts counting again.
    pub fn checkpoint_env_steps(path: &std::path::Path) -> Result<u64> {
        let counters: Counters = flotilla_algorithms::Checkpoint::load(path)?.meta(COUNTERS_META)?;
        Ok(counters.run.env_steps)
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
        let mut c = self.agent.checkpoint()?;
        c.put_meta(COUNTERS_META, &self.counters)?;
        c.save(path)?;
        Ok(())
    }

    /// Serve gRPC on `[learner] listen` with `token`, over TLS when `tls` is given (read it early with
    /// `TransportConfig::server_tls`, so a bad certificate fails before anything is built); returns the bound
    /// address.
    pub fn listen(&mut self, token: &str, tls: Option<&ServerTls>) -> Result<SocketAddr> {
        let addr: SocketAddr = self
            .config
            .learner
            .listen
            .parse()
            .map_err(|e| Error::Config(format!("[learner] listen = {:?}: {e}", self.config.learner.listen)))?;
        let limits = Limits {
            max_message_bytes: self.config.transport.max_message_mib << 20,
            max_refused_in_a_row: self.config.learner.max_refused_in_a_row,
            auth_timeout: std::time::Duration::from_secs_f64(self.config.transport.auth_timeout_secs),
        };
        let server = serve_with(self.runtime.handle(), self.hub.clone(), addr, token, &limits, tls)
            .map_err(|e| Error::Runtime(e.to_string()))?;
        let local = server.local_addr;
        self.server = Some(server);
        Ok(local)
    }

    /// The hub (for in-process actors and tests).
    pub fn hub(&self) -> Arc<Hub> {
        self.hub.clone()
    }

    /// Where the Prometheus endpoint listens (`[learner] metrics_listen`), if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.as_ref().map(|s| s.local_addr())
    }

    /// This learner's rank in its data-parallel group (0 when alone). Only rank 0 evaluates, logs metrics rows
    /// and writes checkpoints.
    pub fn rank(&self) -> usize {
        self.replicas.as_ref().map_or(0, |r| r.rank)
    }

    /// The plan this learner runs.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// The agent.
    pub fn agent(&mut self) -> &mut dyn Algorithm {
        self.agent.as_mut()
    }

    /// Train until the budget or until `stop` is set, calling `on_log` with each metrics row. Ends with an
    /// evaluation of the final policy (unless stopped) and tells actors the run is over.
    pub fn run(&mut self, stop: &AtomicBool, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<TrainReport> {
        let total = self.config.run.total_env_steps;
        self.start_assembly()?;
        // An off-policy assembly thread's replay is ahead of the update: train on all it handed out first.
        let result = self.serve(stop, on_log).and_then(|()| self.drain_assembly());
        if let Some(assembly) = self.assembly.take() {
            let (rx, left) = assembly.stop()?;
            self.rx = Some(rx);
            self.assembly_left = (left.chunks, left.env_steps);
        }
        result?;
        // Actors waiting on a full queue get `finished` now, and every later message too.
        self.hub.finish();
        self.account_for_untrained_data(total);
        if self.rank() == 0
            && !stop.load(Ordering::SeqCst)
            && self.counters.run.env_steps >= total
            && self.counters.run.evals.last().is_none_or(|e| e.env_steps < self.counters.run.env_steps)
        {
            self.evaluate_now()?;
        }
        if let Some(path) = self.checkpoint.clone().filter(|_| self.rank() == 0) {
            self.save_checkpoint(&path)?;
        }
        // Actors learn that the run is over from an ack: keep serving until they have (a few round trips).
        let untold = self.hub.wait_until_actors_told(Duration::from_secs(5));
        if untold > 0 {
            info!("{untold} actors were not told that the run is over (they will find the learner gone)");
        }
        Ok(self.report())
    }

    /// Close the hub's queue and say what data actors delivered that the run ends without training on: chunks
    /// (and A3C gradients) queued when the budget was reached, and on-policy chunks waiting for a full batch.
    /// Nothing is dropped without a line in the log.
    fn account_for_untrained_data(&mut self, total: u64) {
        let (mut queued, mut queued_steps) = (0usize, 0u64);
        if let Some(rx) = &mut self.rx {
            rx.close();
            while let Ok(delivery) = rx.try_recv() {
                queued += 1;
                queued_steps += match delivery {
                    Delivery::Chunk(chunk) => chunk.transitions() as u64,
                    Delivery::Gradient(g, _receipt) => g.env_steps,
                };
            }
        }
        let (held, held_steps) = self.assembly_left;
        self.untrained_env_steps = queued_steps + held_steps;
        let done = self.counters.run.env_steps;
        if held > 0 {
            info!(
                "{held} chunks ({held_steps} env steps) were held by the batch-assembly thread (a batch not yet full \
                 or not yet handed over) when the run ended: not trained on"
            );
        }
        if queued > 0 {
            info!(
                "{queued} actor messages ({queued_steps} env steps) were still queued when the run ended at {done} of \
                 {total} env steps: not trained on"
            );
        }
        if !self.pending.is_empty() {
            let steps: u64 = self.pending.iter().map(|c| c.transitions() as u64).sum();
            info!(
                "{} chunks ({steps} env steps, counted in the {done}) were waiting for a full batch when the run \
                 ended: not trained on",
                self.pending.len()
            );
        }
    }

    /// Batches are assembled on a thread of their own ([`crate::assembly`]) as `[learner] assemble_ahead` says
    /// (by default: on a GPU), where the agent supports it: on-policy agents that take stacked rollouts, and
    /// off-policy agents with a replay feed (DQN without prioritized replay). Config validation refused "on"
    /// for the others.
    fn start_assembly(&mut self) -> Result<()> {
        if !self.config.assembles_ahead() {
            return Ok(());
        }
        let spec = match self.plan.family {
            Family::OnPolicy => match self.agent.on_policy().map(|a| a.rollout_layout()) {
                Some(layout) => AssemblySpec::OnPolicy {
                    layout,
                    chunks_per_batch: self.plan.chunks_per_batch,
                    max_policy_lag: self.config.learner.max_policy_lag,
                },
                None => return Ok(()),
            },
            Family::OffPolicy => {
                let name = self.agent.name();
                let replay =
                    self.agent.replay_ahead().ok_or_else(|| lacks(name, "has no replay feed for another thread"));
                let feed =
                    replay.and_then(|r| r.replay_feed()).map_err(|e| Error::Runtime(format!("assemble_ahead: {e}")))?;
                AssemblySpec::OffPolicy {
                    feed,
                    env_steps: self.counters.run.env_steps,
                    stop_after: self.config.run.total_env_steps.min(self.stop_at),
                    total_env_steps: self.config.run.total_env_steps,
                }
            }
            Family::Gradients => return Ok(()),
        };
        let Some(rx) = self.rx.take() else { return Ok(()) };
        self.assembly = Some(Assembly::start(rx, self.runtime.handle().clone(), self.hub.clone(), spec)?);
        Ok(())
    }

    /// Pause an off-policy assembly thread between chunks and train on all it handed out, so that the agent's
    /// replay, counters and weights agree (before a checkpoint, and at the end). The caller resumes it.
    fn drain_assembly(&mut self) -> Result<()> {
        if self.plan.family != Family::OffPolicy {
            return Ok(());
        }
        let Some(assembly) = &self.assembly else { return Ok(()) };
        assembly.pause();
        loop {
            let assembly = self.assembly.as_ref().expect("checked above");
            match assembly.next(Duration::from_millis(200))? {
                Some(Ready::Paused) => return Ok(()),
                Some(Ready::Replay(prepared)) => self.train_prepared_chunk(prepared)?,
                Some(Ready::Batch(staged)) => self.train_staged(*staged)?,
                None => {}
            }
        }
    }

    /// The update loop of [`DistributedLearner::run`]: until the budget, `stop_at` or `stop`.
    fn serve(&mut self, stop: &AtomicBool, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<()> {
        let total = self.config.run.total_env_steps;
        // Training time is wall-clock (actors run in parallel with the learner) minus evaluations, added to what
        // a resumed run had.
        let start = Instant::now();
        let (train_before, eval_before) = (self.counters.run.train_secs, self.counters.eval_secs);
        let (mut last_data, mut waited_log) = (Instant::now(), Instant::now());
        while self.counters.run.env_steps < total.min(self.stop_at) && !stop.load(Ordering::SeqCst) {
            // A partitioned or stopped actor shows up here as "actor N lost", and later "reconnected".
            self.hub.note_silent_actors();
            let waiting = Instant::now();
            let got_data = match &self.assembly {
                Some(assembly) => {
                    let ready = assembly.next(Duration::from_millis(200))?;
                    self.counters.run.wait_secs += waiting.elapsed().as_secs_f64();
                    // Stale chunks are counted as they come; a batch's chunks with the batch.
                    let stale = assembly.take_intake();
                    let any = stale.chunks > 0 || ready.is_some();
                    self.absorb(stale);
                    match ready {
                        Some(Ready::Batch(staged)) => self.train_staged(*staged)?,
                        Some(Ready::Replay(prepared)) => self.train_prepared_chunk(prepared)?,
                        Some(Ready::Paused) => {
                            return Err(Error::Runtime("the batch-assembly thread paused unasked".into()));
                        }
                        None => {}
                    }
                    any
                }
                None => {
                    let rx = self.rx.as_mut().expect("the hub queue is here when no assembly thread has it");
                    let next = next_delivery(self.runtime.handle(), rx, Duration::from_millis(200));
                    self.hub.note_queue_depth();
                    self.counters.run.wait_secs += waiting.elapsed().as_secs_f64();
                    let any = next.is_some();
                    match next {
                        Some(Delivery::Chunk(chunk)) => self.on_chunk(chunk)?,
                        // The actor's ack goes out as soon as its gradient is in the published parameters.
                        Some(Delivery::Gradient(g, receipt)) => {
                            self.on_gradient(g)?;
                            drop(receipt);
                        }
                        None => {}
                    }
                    any
                }
            };
            if !got_data {
                if last_data.elapsed() > Duration::from_secs(10) && waited_log.elapsed() > Duration::from_secs(10) {
                    info!("waiting for actors ({} registered)", self.hub.live_actors());
                    waited_log = Instant::now();
                }
                continue;
            }
            last_data = Instant::now();
            self.hub.set_env_steps(self.counters.run.env_steps);
            self.counters.run.train_secs =
                train_before + start.elapsed().as_secs_f64() - (self.counters.eval_secs - eval_before);
            self.after_data(on_log)?;
            self.checkpoint_if_due()?;
        }
        Ok(())
    }

    /// What the run has done so far.
    pub fn report(&self) -> TrainReport {
        TrainReport { untrained_env_steps: self.untrained_env_steps, ..self.counters.run.report() }
    }

    /// A checkpoint once its interval has passed, at an update boundary (no chunks waiting for a batch; an
    /// off-policy assembly thread paused with all it observed trained on).
    fn checkpoint_if_due(&mut self) -> Result<()> {
        let Some(path) = self.checkpoint.clone().filter(|_| self.rank() == 0) else { return Ok(()) };
        if self.pending.is_empty() && self.counters.run.checkpoint_due(&self.config) {
            self.drain_assembly()?;
            self.save_checkpoint(&path)?;
            if let Some(assembly) = &self.assembly {
                assembly.resume();
            }
        }
        Ok(())
    }

    /// Count what the assembly thread took in: env steps, episodes, lag, stale chunks, assembly time.
    fn absorb(&mut self, intake: Intake) {
        self.count_on_policy_steps(intake.env_steps);
        self.count_episodes(&intake.episodes);
        let c = &mut self.counters;
        c.run.assemble_secs += intake.assemble_secs;
        merge_lag(&mut c.interval_lag, intake.lag);
        let before = c.stale;
        c.stale += intake.stale;
        if before.checked_ilog2() != c.stale.checked_ilog2() {
            warn!(
                "skipped chunks with policy lag > max_policy_lag {} ({} skipped so far)",
                self.config.learner.max_policy_lag, c.stale
            );
        }
    }

    /// Train on a batch the assembly thread stacked; its buffer goes back for a later batch.
    fn train_staged(&mut self, staged: Staged) -> Result<()> {
        let Staged { rollout, actors, intake } = staged;
        self.absorb(intake);
        self.sync_env_steps()?;
        let started = Instant::now();
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let agent = &mut self.agent;
        let updated = rollout.and_then(|rollout| {
            guarded(|| {
                let name = agent.name();
                let spare = agent
                    .on_policy()
                    .ok_or_else(|| lacks(name, "takes no stacked rollouts"))?
                    .observe_rollout(rollout)?;
                Ok((spare, agent.update(&progress)?))
            })
        });
        let updated = updated.map(|(spare, metrics)| {
            if let Some(assembly) = &self.assembly {
                assembly.recycle(spare);
            }
            metrics
        });
        self.on_policy_updated(updated, started, &actors)
    }

    /// Apply one chunk's off-policy work the assembly thread prepared (as [`Self::feed_off_policy`] does in
    /// line): count the chunk, train, publish once.
    fn train_prepared_chunk(&mut self, prepared: PreparedChunk) -> Result<()> {
        let PreparedChunk { work, error, actor, intake } = prepared;
        self.absorb(intake);
        let started = Instant::now();
        let (agent, counters) = (&mut self.agent, &mut self.counters);
        let mut last = None;
        let trained = guarded(|| {
            let name = agent.name();
            let replay = agent.replay_ahead().ok_or_else(|| lacks(name, "takes no prepared work"))?;
            for w in work {
                if let Some(m) = replay.train_prepared(w)? {
                    counters.run.count_update(&m);
                    last = Some(m);
                }
            }
            Ok(())
        });
        if let Some(error) = trained.err().or(error) {
            self.update_failed(&error, &[actor])?;
        }
        if let Some(m) = last {
            self.publish(m, started)?;
        }
        Ok(())
    }

    /// Count and publish an on-policy update begun at `started` on data from `actors`; a failed one is
    /// logged and skipped.
    fn on_policy_updated(
        &mut self,
        updated: std::result::Result<Option<Metrics>, String>,
        started: Instant,
        actors: &[u64],
    ) -> Result<()> {
        match updated {
            Ok(Some(m)) => {
                self.counters.run.count_update(&m);
                self.publish(m, started)
            }
            Ok(None) => {
                Err(Error::Runtime(format!("an on-policy batch from actors {actors:?} did not fill a rollout")))
            }
            Err(e) => self.update_failed(&e, actors),
        }
    }

    /// Count on-policy env steps: alone, at once; with other learners, at the next update, summed over the
    /// group ([`Self::sync_env_steps`]).
    fn count_on_policy_steps(&mut self, n: u64) {
        match &mut self.replicas {
            Some(r) => r.unsynced += n,
            None => self.counters.run.env_steps += n,
        }
    }

    /// Before an on-policy update with other learners: add every learner's env steps since the last one, so
    /// that all schedule and stop on the same global count.
    fn sync_env_steps(&mut self) -> Result<()> {
        if let Some(r) = &mut self.replicas {
            let local = std::mem::take(&mut r.unsynced);
            self.counters.run.env_steps += r.sum(local)?;
            self.hub.set_env_steps(self.counters.run.env_steps);
        }
        Ok(())
    }

    /// Count finished episodes: alone, at once; with other learners, at the next update, summed over the
    /// group, so that every learner's counters (and rank 0's metrics rows) hold every learner's episodes.
    fn count_episodes(&mut self, episodes: &[EpisodeStats]) {
        for ep in episodes {
            // Chunks' episodes were checked against the run's tasks by the hub; an A3C gradient's may name
            // any: one outside the run's tasks counts in the totals only, and says so.
            let task = ep.task.map(|k| k as usize).filter(|k| *k < self.config.env.tasks.len());
            if ep.task.is_some() && task.is_none() {
                warn!("an episode from an actor names task {:?}; the run has {}", ep.task, self.config.env.tasks.len());
            }
            match &mut self.replicas {
                Some(r) => r.episodes.add(ep.episode_return, ep.length, task),
                None => {
                    self.counters.run.count_episode(ep.episode_return, ep.length);
                    if let Some(task) = task {
                        self.counters.run.count_task_return(task, ep.episode_return, 1);
                    }
                }
            }
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
        add_lag(&mut c.interval_lag, lag);
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
                self.count_on_policy_steps(chunk.transitions() as u64);
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
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let started = Instant::now();
        let agent = &mut self.agent;
        let applied = guarded(|| {
            let name = agent.name();
            agent
                .parameter_server()
                .ok_or_else(|| lacks(name, "does not apply actors' gradients"))?
                .apply_gradient(&g.values, &progress)
        });
        match applied {
            Ok(m) => {
                self.counters.run.count_update(&m);
                self.publish(m, started)
            }
            Err(e) => self.update_failed(&e, &[g.actor_id]),
        }
    }

    /// An update failed: its data is skipped, the error logged with the actors it came from; the learner keeps
    /// serving with the parameters it last published.
    /// An update that failed: alone, skipped (counted and logged; the run goes on). In a data-parallel group
    /// it ends this learner's run: the others took part in collectives this one may not have (or lost a
    /// rank), so going on would pair mismatched all-reduces.
    fn update_failed(&mut self, error: &str, actors: &[u64]) -> Result<()> {
        if self.replicas.is_some() {
            return Err(Error::Runtime(format!("update on data from actors {actors:?} failed: {error}")));
        }
        self.counters.failed_updates += 1;
        error!("update failed on data from actors {actors:?}; skipped: {error}");
        Ok(())
    }

    /// Observe a chunk into the off-policy agent's replay and let it train the phases the chunk's steps made
    /// due, as the single-process trainer does after each of its one-step chunks.
    fn feed_off_policy(&mut self, chunk: &Chunk) -> Result<()> {
        // With L learners, each transition stands for L: every learner takes in the same number per chunk.
        let world = self.replicas.as_ref().map_or(1, |r| r.world as u64);
        let started = Instant::now();
        // Every step of the chunk counts, whether or not the agent could learn from all of it.
        self.counters.run.env_steps += chunk.transitions() as u64 * world;
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let agent = &mut self.agent;
        match guarded(|| {
            agent.observe(std::slice::from_ref(chunk))?;
            agent.update(&progress)
        }) {
            Err(error) => self.update_failed(&error, &[chunk.actor_id]),
            Ok(None) => Ok(()),
            Ok(Some(m)) => {
                self.counters.run.count_update(&m);
                self.publish(m, started)
            }
        }
    }

    /// Push `batch`'s chunks into the agent's rollout (chunk k's env j is row k·E + j) and update.
    fn train_on_policy(&mut self, batch: &[Chunk]) -> Result<()> {
        self.sync_env_steps()?;
        let started = Instant::now();
        let progress =
            Progress { env_steps: self.counters.run.env_steps, total_env_steps: self.config.run.total_env_steps };
        let (agent, assemble_secs) = (&mut self.agent, &mut self.counters.run.assemble_secs);
        let updated = guarded(|| {
            let assembling = Instant::now();
            agent.observe(batch)?;
            *assemble_secs += assembling.elapsed().as_secs_f64();
            agent.update(&progress)
        });
        let actors: Vec<u64> = batch.iter().map(|c| c.actor_id).collect();
        self.on_policy_updated(updated, started, &actors)
    }

    /// Publish the parameters after updates begun at `started`; `m` is the last update's metrics.
    fn publish(&mut self, mut m: Metrics, started: Instant) -> Result<()> {
        if let Some(replicas) = &mut self.replicas {
            let episodes = replicas.after_update(self.agent.as_ref(), &mut m)?;
            self.counters.run.count_episodes(episodes.returns, episodes.lengths, episodes.count);
            for (task, (returns, count)) in episodes.tasks.into_iter().enumerate() {
                self.counters.run.count_task_return(task, returns, count);
            }
        }
        let params = params_vec(self.agent.as_ref())?;
        self.hub.publish(params);
        let secs = started.elapsed().as_secs_f64();
        self.counters.run.update_secs += secs;
        self.hub.metrics().update_seconds.observe(secs);
        self.last_metrics = m;
        Ok(())
    }

    fn evaluate_now(&mut self) -> Result<()> {
        let (c, k) = (&self.config, &mut self.counters);
        let started = Instant::now();
        let result = evaluate(self.agent.as_mut(), &c.env, c.eval.episodes, k.run.eval_seed(c))?;
        k.eval_secs += started.elapsed().as_secs_f64();
        k.run.evals.push(EvalPoint { env_steps: k.run.env_steps, train_secs: k.run.train_secs, result });
        Ok(())
    }

    fn after_data(&mut self, on_log: &mut dyn FnMut(&LogRow) -> Result<()>) -> Result<()> {
        if self.rank() != 0 {
            return Ok(());
        }
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
        update.push("charts/failed_updates", c.failed_updates as f64);
        update.push("charts/refused_messages", self.hub.counters.refused.load(Ordering::Relaxed) as f64);
        update.push("charts/policy_version", self.hub.version() as f64);
        update.push("charts/actors", self.hub.live_actors() as f64);
        update.push("charts/queue_depth", self.hub.queue_depth() as f64);
        let row = c.run.log_row(update, eval, &self.config.tasks);
        log_progress(&row);
        self.hub.metrics().observe_row(&row.columns());
        on_log(&row)?;
        c.interval_lag = (0, 0, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_step_becomes_a_message_not_a_crash() {
        assert_eq!(guarded(|| Ok(3)), Ok(3));
        let e = guarded::<()>(|| Err(flotilla_algorithms::Error::NonFinite("loss NaN".into()))).unwrap_err();
        assert!(e.contains("loss NaN"), "{e}");
        // What libtorch does on an out-of-range index: tch turns the C++ error into a panic.
        let e = guarded::<()>(|| {
            let x = tch::Tensor::from_slice(&[1.0f32, 2.0]).view([1, 2]);
            let index = tch::Tensor::from_slice(&[7i64]).view([1, 1]);
            let _ = x.gather(1, &index, false);
            Ok(())
        })
        .unwrap_err();
        assert!(e.contains("index") || e.contains("out of bounds"), "{e}");
    }
}
