//! The actor loop (see the crate docs for its shape).
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flotilla_algorithms::{ActMode, ActOutput, Acting, Memory, Progress};
use flotilla_core::{Chunk, Gradient, Params};
use flotilla_envs::env_actions::EnvActions;
use flotilla_envs::{ChunkRecorder, VectorEnv};
use flotilla_transport::grpc::backoff;
use flotilla_transport::{Code, LearnerClient, MessageKey, Registered, Registration, RpcError, RunInfo};
use tracing::{info, warn};

use crate::{Error, Result};

/// Opens a connection to the learner (called again to reconnect).
pub type Connector = Box<dyn FnMut() -> std::result::Result<Box<dyn LearnerClient>, RpcError> + Send>;

/// Builds the actor's envs and acting policy from the learner's run config (the binary knows the config
/// format; this crate does not).
pub trait ActorFactory {
    /// The envs to step in actor slot `slot` (their spaces are checked at registration). The slot is the one
    /// asked for before registering (`None` when the learner picks); where the learner then gives another, the
    /// envs are built again for it (envs may differ by slot: an actor assigned one task of several).
    fn envs(&mut self, run: &RunInfo, slot: Option<u32>) -> Result<Box<dyn VectorEnv>>;
    /// The acting policy (or A3C gradient worker) for the slot the learner gave (`registered.actor_index` sets
    /// Ape-X exploration); no optimiser, replay or rollout buffers.
    fn acting(&mut self, run: &RunInfo, registered: &Registered, envs: &dyn VectorEnv) -> Result<Acting>;
}

/// How an actor joins and how long it keeps trying.
#[derive(Debug, Clone)]
pub struct ActorOptions {
    /// The slot a launcher assigned (`None`: the learner picks).
    pub actor_index: Option<u32>,
    /// How long to keep reconnecting to a learner that went away before giving up.
    pub reconnect_for: Duration,
    /// Set to stop after the current chunk.
    pub stop: Arc<AtomicBool>,
}

/// What an actor did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActorReport {
    /// Chunks (or gradients) delivered: accepted by the learner into its queue (acknowledged, run not over).
    pub sent: u64,
    /// Env steps taken (all envs), delivered or not.
    pub env_steps: u64,
    /// The env steps of the delivered messages. The difference to `env_steps` was collected but never reached
    /// the learner's queue: messages refused because the run was over, or left on the actor when it ended.
    pub delivered_env_steps: u64,
    /// Parameter versions loaded.
    pub params_loaded: u64,
    /// Times the actor reconnected and re-registered.
    pub reconnects: u32,
    /// Whether the learner said the run is over.
    pub finished: bool,
}

#[allow(clippy::large_enum_variant)] // One message in flight at a time; boxing would only add an allocation.
enum Outgoing {
    Chunk(Chunk),
    Gradient(Gradient),
}

/// A message and the learner run (0, 1, ... as the actor rejoins restarted learners) whose parameters made it.
struct Tagged {
    run: u64,
    message: Outgoing,
}

/// State the env thread and the IO thread share.
#[derive(Default)]
struct Shared {
    /// Newer parameters for the env thread, with the run (see [`Tagged`]) they belong to.
    params: Mutex<Option<(u64, Params)>>,
    /// The learner's progress from the last ack: (env steps, budget).
    progress: Mutex<(u64, u64)>,
    finished: AtomicBool,
    reconnects: AtomicU32,
    /// Messages the learner accepted, and their env steps.
    delivered: AtomicU64,
    delivered_env_steps: AtomicU64,
}

/// Join the learner `connect` reaches and act until it says the run is over, `options.stop` is set, or the
/// learner stays unreachable for `options.reconnect_for`.
pub fn run_actor(
    mut connect: Connector,
    factory: &mut dyn ActorFactory,
    options: &ActorOptions,
) -> Result<ActorReport> {
    let (mut client, run) = join(&mut connect, options.reconnect_for)?;
    let mut envs = factory.envs(&run, options.actor_index)?;
    let registration = Registration {
        run_id: run.run_id.clone(),
        observation_space: envs.observation_space().clone(),
        action_space: envs.action_space().clone(),
        n_envs: envs.num_envs(),
        actor_index: options.actor_index,
        host: hostname(),
        pid: std::process::id(),
    };
    let registered = client.register(&registration)?;
    if options.actor_index != Some(registered.actor_index) {
        envs = factory.envs(&run, Some(registered.actor_index))?;
        if envs.observation_space() != &registration.observation_space || envs.num_envs() != registration.n_envs {
            return Err(Error::Setup(format!(
                "the envs of slot {} differ from those this actor registered with",
                registered.actor_index
            )));
        }
    }
    let mut registration = registration;
    registration.actor_index = Some(registered.actor_index);
    info!(actor_id = registered.actor_id, "registered in slot {} of {}", registered.actor_index, registered.n_actors);
    let mut agent = factory.acting(&run, &registered, envs.as_ref())?;
    let mut version = 0;
    if let Some(p) = client.params(registered.actor_id, None)? {
        agent.policy().load_params(&p.value)?;
        version = p.version;
    }

    let shared = Arc::new(Shared::default());
    let (tx, rx) = sync_channel::<Tagged>(1);
    // Synchronous on-policy runs and A3C: the IO thread reports each message done (acked, newer parameters
    // fetched) and the env thread waits for that before collecting again.
    let (done_tx, done_rx) = sync_channel::<()>(1);
    let done_tx = registered.synchronous.then_some(done_tx);
    let io = {
        let shared = shared.clone();
        let mut link = Link {
            client,
            connect,
            registration,
            actor_id: registered.actor_id,
            have: Some(version),
            run_id: run.run_id,
            run: 0,
            sender: MessageKey::new_sender(),
            sent: 0,
        };
        let reconnect_for = options.reconnect_for;
        std::thread::Builder::new()
            .name("flotilla-actor-io".into())
            .spawn(move || link.serve(rx, &shared, reconnect_for, done_tx))
            .map_err(|e| Error::Setup(format!("IO thread: {e}")))?
    };
    let mut report = ActorReport { params_loaded: 1, ..Default::default() };
    let result = act_loop(
        envs.as_mut(),
        &mut agent,
        registered.seed,
        registered.chunk_steps,
        version,
        (&tx, registered.synchronous.then_some(&done_rx)),
        &shared,
        options,
        &mut report,
    );
    drop(tx);
    let io_result = join_io(io);
    result?;
    io_result?;
    report.reconnects = shared.reconnects.load(Ordering::SeqCst);
    report.sent = shared.delivered.load(Ordering::SeqCst);
    report.delivered_env_steps = shared.delivered_env_steps.load(Ordering::SeqCst);
    report.finished = shared.finished.load(Ordering::SeqCst);
    Ok(report)
}

fn join_io(io: JoinHandle<Result<()>>) -> Result<()> {
    io.join().map_err(|_| Error::Setup("the IO thread panicked".into()))?
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

/// The longest wait between attempts to reach a learner that went away: a learner its supervisor restarts
/// listens again within about a second, and an attempt on a closed port costs next to nothing, so the actors
/// find it within a second of that (restart latency: docs/benchmarks/distributed.md).
const REJOIN_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Connect and fetch the run info, retrying with backoff for up to `window`.
fn join(connect: &mut Connector, window: Duration) -> Result<(Box<dyn LearnerClient>, RunInfo)> {
    let deadline = Instant::now() + window;
    let mut attempt = 0;
    loop {
        let tried = connect().and_then(|mut c| c.run_info().map(|run| (c, run)));
        match tried {
            Ok(ok) => return Ok(ok),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                std::thread::sleep(backoff(attempt, Duration::from_secs(5)));
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn act_loop(
    envs: &mut dyn VectorEnv,
    agent: &mut Acting,
    seed: u64,
    chunk_steps: usize,
    mut version: u64,
    (tx, done): (&SyncSender<Tagged>, Option<&std::sync::mpsc::Receiver<()>>),
    shared: &Shared,
    options: &ActorOptions,
    report: &mut ActorReport,
) -> Result<()> {
    let e = envs.num_envs();
    let action_space = envs.action_space().clone();
    let mut obs = envs.reset(Some(seed))?.to_buf();
    let mut recorder = ChunkRecorder::new(chunk_steps);
    // Each env's recurrent state (empty for feed-forward policies), sent with every chunk as its initial state.
    let mut memory = Memory::new(agent.policy(), e);
    let mut out = ActOutput::default();
    let mut env_actions = EnvActions::default();
    let mut run = 0;
    loop {
        if shared.finished.load(Ordering::SeqCst) || options.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Newer parameters fetched by the IO thread while the envs were stepping.
        if let Some((r, p)) = shared.params.lock().expect("params slot").take() {
            agent.policy().load_params(&p.value)?;
            version = p.version;
            run = r;
            report.params_loaded += 1;
        }
        let (env_steps, total_env_steps) = *shared.progress.lock().expect("progress");
        if total_env_steps > 0 {
            agent.policy().set_progress(&Progress { env_steps, total_env_steps });
        }
        let n = chunk_steps * e;
        if memory.dim() > 0 {
            recorder.set_initial_state(memory.state());
        }
        for _ in 0..chunk_steps {
            memory.act(agent.policy(), obs.as_ref(), ActMode::Explore, &mut out)?;
            let step = envs.step(&env_actions.convert(&action_space, &out.actions))?;
            recorder.record(obs.as_ref(), &out.actions, &out.log_probs, &out.values, &step)?;
            memory.end_episodes(step.terminated, step.truncated);
            let same = obs.write_at(0, step.obs);
            debug_assert!(same, "one dtype per batch");
        }
        let mut c = recorder.take();
        c.policy_version = version;
        report.env_steps += n as u64;
        let message = match agent {
            Acting::Chunks(_) => Outgoing::Chunk(c),
            Acting::Gradients(worker) => {
                let (values, _metrics) = worker.gradient(&c)?;
                Outgoing::Gradient(Gradient {
                    actor_id: 0,
                    policy_version: version,
                    values,
                    env_steps: n as u64,
                    episodes: c.episodes,
                })
            }
        };
        // Waits while the previous message is still on the wire (and so while the learner pushes back).
        if tx.send(Tagged { run, message }).is_err() {
            return Ok(()); // The IO thread ended: finished, or failed (its result says which).
        }
        // Synchronous mode (and A3C): the next chunk is collected with the parameters this one went into.
        if let Some(done) = done
            && done.recv().is_err()
        {
            return Ok(());
        }
    }
}

/// The IO thread's connection and identity.
struct Link {
    client: Box<dyn LearnerClient>,
    connect: Connector,
    registration: Registration,
    actor_id: u64,
    have: Option<u64>,
    run_id: String,
    /// How many times the learner was found running a new run (restarted).
    run: u64,
    /// This actor's id in its messages' idempotency keys (random), and how many messages it has numbered.
    sender: u64,
    sent: u64,
}

impl Link {
    /// Deliver messages until the channel closes or the learner says the run is over. In synchronous mode,
    /// report each message done on `done` (acked, newer parameters in the slot).
    fn serve(
        &mut self,
        rx: std::sync::mpsc::Receiver<Tagged>,
        shared: &Shared,
        reconnect_for: Duration,
        done: Option<SyncSender<()>>,
    ) -> Result<()> {
        for tagged in rx {
            if self.deliver(tagged, shared, reconnect_for)? {
                return Ok(()); // Finished; dropping `done` releases a waiting env thread.
            }
            if let Some(done) = &done {
                let _ = done.send(());
            }
        }
        Ok(())
    }

    /// Send one message (reconnecting as needed) and fetch newer parameters; returns whether the run is over.
    fn deliver(
        &mut self,
        Tagged { run, mut message }: Tagged,
        shared: &Shared,
        reconnect_for: Duration,
    ) -> Result<bool> {
        if run < self.run {
            // Collected with the parameters of a run the learner no longer has: its versions mean nothing there.
            info!("discarding a message collected for the learner's previous run");
            return Ok(false);
        }
        // Numbered once: a resend after a lost answer keeps the number, so the learner takes it only once.
        self.sent += 1;
        let key = MessageKey { sender: self.sender, seq: self.sent };
        let ack = loop {
            let sent = match &mut message {
                Outgoing::Chunk(c) => {
                    c.actor_id = self.actor_id;
                    self.client.send_chunk(c, key)
                }
                Outgoing::Gradient(g) => {
                    g.actor_id = self.actor_id;
                    self.client.send_gradient(g, key)
                }
            };
            match sent {
                Ok(ack) => break ack,
                Err(e) if e.is_transient() => {
                    warn!("learner unreachable ({}); reconnecting", e.message);
                    if self.rejoin(shared, reconnect_for)? {
                        return Ok(false); // A new run: this message belongs to the old one.
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        *shared.progress.lock().expect("progress") = (ack.env_steps, ack.total_env_steps);
        if ack.accepted {
            // In the learner's queue: delivered, whether or not the run ended right after.
            let steps = match &message {
                Outgoing::Chunk(c) => c.transitions() as u64,
                Outgoing::Gradient(g) => g.env_steps,
            };
            shared.delivered.fetch_add(1, Ordering::SeqCst);
            shared.delivered_env_steps.fetch_add(steps, Ordering::SeqCst);
        }
        if ack.finished {
            shared.finished.store(true, Ordering::SeqCst);
            return Ok(true);
        }
        if Some(ack.policy_version) != self.have {
            match self.client.params(self.actor_id, self.have) {
                Ok(Some(p)) => {
                    self.have = Some(p.version);
                    *shared.params.lock().expect("params slot") = Some((self.run, p));
                }
                Ok(None) => {}
                Err(e) if e.is_transient() => {
                    warn!("parameter fetch failed ({}); reconnecting", e.message);
                    self.rejoin(shared, reconnect_for)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Reconnect with exponential backoff and register again. Returns whether the learner now runs another
    /// run (then the unsent message is discarded, with a log line, and parameters are fetched afresh).
    fn rejoin(&mut self, shared: &Shared, window: Duration) -> Result<bool> {
        let deadline = Instant::now() + window;
        let mut attempt = 0;
        loop {
            if Instant::now() >= deadline {
                return Err(RpcError::new(
                    Code::Unavailable,
                    format!("learner unreachable for {:.0} s; giving up", window.as_secs_f64()),
                )
                .into());
            }
            std::thread::sleep(backoff(attempt, REJOIN_MAX_BACKOFF));
            attempt += 1;
            let Ok(mut client) = (self.connect)() else { continue };
            let run = match client.run_info() {
                Ok(run) => run,
                Err(e) if e.is_transient() => continue,
                Err(e) => return Err(e.into()),
            };
            let new_run = run.run_id != self.run_id;
            self.registration.run_id = run.run_id.clone();
            let registered = match client.register(&self.registration) {
                Ok(r) => r,
                Err(e) if e.is_transient() => continue,
                Err(e) => return Err(e.into()),
            };
            info!(
                actor_id = registered.actor_id,
                "re-registered after {attempt} attempts (was actor {}){}",
                self.actor_id,
                if new_run { "; the learner restarted: discarding the message collected for the old run" } else { "" }
            );
            self.client = client;
            self.actor_id = registered.actor_id;
            self.run_id = run.run_id;
            shared.reconnects.fetch_add(1, Ordering::SeqCst);
            if new_run {
                self.run += 1;
                self.have = None;
                if let Some(p) = self.client.params(self.actor_id, None)? {
                    self.have = Some(p.version);
                    *shared.params.lock().expect("params slot") = Some((self.run, p));
                }
            }
            return Ok(new_run);
        }
    }
}
