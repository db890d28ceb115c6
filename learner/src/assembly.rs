//! The learner's batch assembly, on a thread of its own, double-buffered over crossbeam channels.
//!
//! On-policy (PPO, A2C):
//! ```text
//!  hub queue ─► assembly thread: admit by policy lag, stack the batch's chunks into a spare rollout
//!               (Rollout::stack_chunks), copy its observations to the device (put_obs_on_device)
//!                  ─► ready (bounded, 1 batch) ─► update thread: observe_rollout, update, publish
//!                  ◄─ spares ◄──────────────────── the agent's emptied buffer
//! ```
//! While the update thread trains on batch k, this thread takes batch k+1's chunks off the hub queue, stacks
//! them and puts them on the device, so the update never waits for the host unless the actors are behind.
//! At most one finished batch waits in `ready`, and one more is being stacked; beyond that the hub's bounded
//! queue makes actors wait. Three rollout buffers circulate; none is allocated per batch.
//!
//! Bookkeeping travels with the data: a stale chunk (lag > `max_policy_lag`) is counted at once in the
//! shared [`Intake`]; an admitted chunk's env steps, episodes and lag travel with its batch, so the update
//! thread counts them when it trains on them — a run ends only after training on the batch that reached its
//! budget, and a checkpoint never counts chunks it does not hold.
//!
//! Off-policy (DQN with uniform or frame replay):
//! ```text
//!  hub queue ─► assembly thread: each chunk into the agent's replay (ReplayFeed::observe), and
//!               each due training phase's minibatches sampled and put on the device
//!                  ─► ready (bounded, 1 chunk's work) ─► update thread: train_prepared, publish
//! ```
//! The feed makes the draws `update()` would make at the same point, so training is the same as in line; the
//! thread observes no chunk past the run's budget. The replay it fills is ahead of the update thread by at
//! most two chunks, so a checkpoint first [pauses](Assembly::pause) it between chunks and trains on all it
//! handed out (`Ready::Paused` marks the point): the saved replay, counters and weights then agree.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use flotilla_algorithms::data::rollout::{Rollout, RolloutLayout};
use flotilla_algorithms::{Prepared, Progress, ReplayFeed};
use flotilla_core::{Chunk, EpisodeStats};
use tokio::sync::mpsc;
use tracing::error;

use crate::hub::{Delivery, Hub, next_delivery};
use crate::{Error, Result};

/// What arrived: env steps, finished episodes and policy lag, for the update thread's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Intake {
    /// Env steps the chunks held.
    pub env_steps: u64,
    /// Episodes that ended in them.
    pub episodes: Vec<EpisodeStats>,
    /// Lag of the admitted chunks: sum, max, count.
    pub lag: (u64, u64, u64),
    /// Chunks refused as stale.
    pub stale: u64,
    /// Chunks received at all (stale or not).
    pub chunks: u64,
    /// Seconds spent stacking batches and copying them to the device.
    pub assemble_secs: f64,
}

impl Intake {
    fn count_chunk(&mut self, chunk: &Chunk) {
        self.env_steps += chunk.transitions() as u64;
        self.episodes.extend_from_slice(&chunk.episodes);
        self.chunks += 1;
    }

    /// Add what `other` counted (chunks and env steps: what [`Assembly::stop`] reports as left over).
    fn add(&mut self, other: &Intake) {
        self.env_steps += other.env_steps;
        self.chunks += other.chunks;
    }
}

/// Count one admitted delivery's policy lag into `(sum, max, count)`.
pub(crate) fn add_lag(acc: &mut (u64, u64, u64), lag: u64) {
    merge_lag(acc, (lag, lag, 1));
}

/// Add the `(sum, max, count)` lag statistics `more` to `acc`.
pub(crate) fn merge_lag(acc: &mut (u64, u64, u64), more: (u64, u64, u64)) {
    *acc = (acc.0 + more.0, acc.1.max(more.1), acc.2 + more.2);
}

/// A batch ready for an update: the stacked rollout (observations on the device), the actors it came from
/// and the bookkeeping of its chunks. `rollout` is an error message where stacking failed.
#[derive(Debug)]
pub(crate) struct Staged {
    pub rollout: std::result::Result<Rollout, String>,
    pub actors: Vec<u64>,
    pub intake: Intake,
}

/// One chunk's off-policy work: its steps are in the agent's replay; `work` is what they made due (target
/// syncs, minibatches on the device), in order.
#[derive(Debug)]
pub(crate) struct PreparedChunk {
    pub work: Vec<Prepared>,
    /// Observing the chunk failed part-way: the message (the rest of its steps were not observed).
    pub error: Option<String>,
    pub actor: u64,
    pub intake: Intake,
}

/// What the assembly thread hands the update thread.
#[derive(Debug)]
pub(crate) enum Ready {
    /// An on-policy batch (boxed: it is four times the size of the other variants).
    Batch(Box<Staged>),
    /// One off-policy chunk's work.
    Replay(PreparedChunk),
    /// The thread stopped between chunks as [`Assembly::pause`] asked: all it observed has been handed out.
    Paused,
}

/// What the assembly thread needs to know.
pub(crate) enum AssemblySpec {
    /// Stack on-policy batches.
    OnPolicy { layout: RolloutLayout, chunks_per_batch: usize, max_policy_lag: u64 },
    /// Feed an off-policy agent's replay. `env_steps` is the run's count so far; the thread observes no chunk
    /// once `stop_after` env steps are in; schedules run over `total_env_steps`.
    OffPolicy { feed: Box<dyn ReplayFeed>, env_steps: u64, stop_after: u64, total_env_steps: u64 },
}

/// The running assembly thread. [`Assembly::stop`] ends it and gives the hub queue back.
pub(crate) struct Assembly {
    ready: Receiver<Ready>,
    spares: Sender<Rollout>,
    intake: Arc<Mutex<Intake>>,
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
    resume: Sender<()>,
    thread: Option<JoinHandle<(mpsc::Receiver<Delivery>, Intake)>>,
}

impl Assembly {
    /// Start assembling what arrives on `rx` (the hub's queue) as `spec` says.
    pub(crate) fn start(
        rx: mpsc::Receiver<Delivery>,
        runtime: tokio::runtime::Handle,
        hub: Arc<Hub>,
        spec: AssemblySpec,
    ) -> Result<Self> {
        let (ready_tx, ready) = crossbeam_channel::bounded(1);
        // Buffers come back one per update; two spares cover the batch being stacked and the one ready.
        let (spares, spares_rx) = crossbeam_channel::bounded(3);
        let intake = Arc::new(Mutex::new(Intake::default()));
        let (stop, pause) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (resume, resumed) = crossbeam_channel::unbounded();
        let worker = Worker {
            resumed,
            rx,
            runtime,
            hub,
            ready: ready_tx,
            spares: spares_rx,
            intake: intake.clone(),
            stop: stop.clone(),
            pause: pause.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("flotilla-assembly".into())
            .spawn(move || worker.run(spec))
            .map_err(|e| Error::Runtime(format!("starting the batch-assembly thread: {e}")))?;
        Ok(Assembly { ready, spares, intake, stop, pause, resume, thread: Some(thread) })
    }

    /// Ask the thread to stop between chunks; it answers with [`Ready::Paused`] after all it handed out
    /// before (off-policy; the on-policy thread keeps nothing the agent holds, so it is never paused).
    pub(crate) fn pause(&self) {
        self.pause.store(true, Ordering::SeqCst);
    }

    /// Let a paused thread go on (once per [`Ready::Paused`] received).
    pub(crate) fn resume(&self) {
        // A message, not a flag: a pause asked for right after cannot be lost in the paused thread's wait.
        if self.resume.send(()).is_err() {
            error!("the batch-assembly thread is gone");
        }
    }

    /// The next batch or chunk's work, waiting up to `timeout`; `None` if none came.
    pub(crate) fn next(&self, timeout: Duration) -> Result<Option<Ready>> {
        match self.ready.recv_timeout(timeout) {
            Ok(staged) => Ok(Some(staged)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::Runtime("the batch-assembly thread ended (the hub queue closed)".into()))
            }
        }
    }

    /// What arrived outside batches (stale chunks) since the last call.
    pub(crate) fn take_intake(&self) -> Intake {
        std::mem::take(&mut *self.intake.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Give an emptied rollout buffer back for a later batch.
    pub(crate) fn recycle(&self, rollout: Rollout) {
        // A full spares channel means enough buffers circulate: this one is dropped.
        if let Err(TrySendError::Disconnected(_)) = self.spares.try_send(rollout) {
            error!("the batch-assembly thread is gone");
        }
    }

    /// Stop the thread and return the hub queue, with what the thread took from it that the update thread never
    /// counted (chunks waiting for a full batch, a batch or chunk not handed out, stale chunks not yet taken with
    /// [`Assembly::take_intake`]): `chunks` and `env_steps` of an [`Intake`], for the run's account of what it
    /// did not train on.
    pub(crate) fn stop(mut self) -> Result<(mpsc::Receiver<Delivery>, Intake)> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("joined once");
        let (rx, mut left) = thread.join().map_err(|_| Error::Runtime("the batch-assembly thread panicked".into()))?;
        while let Ok(ready) = self.ready.try_recv() {
            match ready {
                Ready::Batch(staged) => left.add(&staged.intake),
                Ready::Replay(prepared) => left.add(&prepared.intake),
                Ready::Paused => {}
            }
        }
        left.add(&self.take_intake());
        Ok((rx, left))
    }
}

impl Drop for Assembly {
    /// A learner that stops on an error still ends the thread (it checks the flag every 100 ms).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

struct Worker {
    rx: mpsc::Receiver<Delivery>,
    runtime: tokio::runtime::Handle,
    hub: Arc<Hub>,
    ready: Sender<Ready>,
    spares: Receiver<Rollout>,
    intake: Arc<Mutex<Intake>>,
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
    resumed: Receiver<()>,
}

impl Worker {
    /// Assemble until stopped; returns the hub queue and what was taken from it but never handed out.
    fn run(mut self, spec: AssemblySpec) -> (mpsc::Receiver<Delivery>, Intake) {
        let left = match spec {
            AssemblySpec::OnPolicy { layout, chunks_per_batch, max_policy_lag } => {
                self.stack_batches(&layout, chunks_per_batch, max_policy_lag)
            }
            AssemblySpec::OffPolicy { feed, env_steps, stop_after, total_env_steps } => {
                self.feed_replay(feed, env_steps, stop_after, total_env_steps)
            }
        };
        (self.rx, left)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The next chunk from the hub queue, waiting up to 100 ms; `Err(())` once the queue is closed and empty.
    fn next_chunk(&mut self) -> std::result::Result<Option<Chunk>, ()> {
        let Some(delivery) = next_delivery(&self.runtime, &mut self.rx, Duration::from_millis(100)) else {
            return if self.rx.is_closed() && self.rx.is_empty() { Err(()) } else { Ok(None) };
        };
        match delivery {
            Delivery::Chunk(chunk) => Ok(Some(chunk)),
            Delivery::Gradient(_, receipt) => {
                // The hub refuses gradients in a chunk run; answer the call if one got through.
                drop(receipt);
                error!("a gradient reached a learner that trains on chunks; ignored");
                Ok(None)
            }
        }
    }

    /// Hand `item` to the update thread, waiting while the previous one is still there (the double buffer);
    /// `Err` with what it holds (chunks and env steps) if the thread was stopped meanwhile.
    fn hand_over(&self, item: Ready) -> std::result::Result<(), Intake> {
        let mut item = Some(item);
        while let Some(i) = item.take() {
            match self.ready.send_timeout(i, Duration::from_millis(100)) {
                Ok(()) => {}
                Err(crossbeam_channel::SendTimeoutError::Timeout(i)) if !self.stopped() => item = Some(i),
                Err(e) => {
                    let mut left = Intake::default();
                    match e.into_inner() {
                        Ready::Batch(staged) => left.add(&staged.intake),
                        Ready::Replay(prepared) => left.add(&prepared.intake),
                        Ready::Paused => {}
                    }
                    return Err(left);
                }
            }
        }
        Ok(())
    }

    /// Off-policy: each chunk into the replay through `feed`, its work handed over chunk by chunk.
    fn feed_replay(
        &mut self,
        mut feed: Box<dyn ReplayFeed>,
        mut env_steps: u64,
        stop_after: u64,
        total: u64,
    ) -> Intake {
        while !self.stopped() {
            if self.pause.swap(false, Ordering::SeqCst) {
                if let Err(left) = self.hand_over(Ready::Paused) {
                    return left;
                }
                loop {
                    match self.resumed.recv_timeout(Duration::from_millis(100)) {
                        Ok(()) => break,
                        Err(RecvTimeoutError::Timeout) if !self.stopped() => {}
                        Err(_) => return Intake::default(),
                    }
                }
                continue;
            }
            if env_steps >= stop_after {
                // The budget is in: chunks still queued are not observed (as on the update thread).
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let chunk = match self.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => continue,
                Err(()) => return Intake::default(),
            };
            let started = Instant::now();
            let mut intake = Intake::default();
            intake.count_chunk(&chunk);
            add_lag(&mut intake.lag, self.hub.version().saturating_sub(chunk.policy_version));
            // Every step of the chunk counts, whether or not the agent could learn from all of it.
            env_steps += chunk.transitions() as u64;
            let mut work = Vec::new();
            let progress = Progress { env_steps, total_env_steps: total };
            let observed = guarded(|| feed.observe(&chunk, &progress, &mut work));
            intake.assemble_secs = started.elapsed().as_secs_f64();
            let prepared = PreparedChunk { work, error: observed.err(), actor: chunk.actor_id, intake };
            if let Err(left) = self.hand_over(Ready::Replay(prepared)) {
                return left;
            }
        }
        Intake::default()
    }

    /// On-policy: admit chunks by lag and stack each batch's into a rollout on the device.
    fn stack_batches(&mut self, layout: &RolloutLayout, chunks_per_batch: usize, max_policy_lag: u64) -> Intake {
        let mut pending: Vec<Chunk> = Vec::with_capacity(chunks_per_batch);
        let mut batch = Intake::default();
        while !self.stopped() {
            let chunk = match self.next_chunk() {
                Ok(Some(chunk)) => chunk,
                Ok(None) => continue,
                Err(()) => break,
            };
            let lag = self.hub.version().saturating_sub(chunk.policy_version);
            if lag > max_policy_lag {
                let mut shared = self.intake.lock().unwrap_or_else(|e| e.into_inner());
                shared.count_chunk(&chunk);
                shared.stale += 1;
                continue;
            }
            batch.count_chunk(&chunk);
            add_lag(&mut batch.lag, lag);
            pending.push(chunk);
            if pending.len() < chunks_per_batch {
                continue;
            }
            let started = Instant::now();
            let mut rollout = self.spares.try_recv().unwrap_or_else(|_| layout.empty());
            let stacked = rollout
                .stack_chunks(&pending)
                .and_then(|()| rollout.put_obs_on_device(&layout.obs))
                .map(|()| rollout)
                .map_err(|e| e.to_string());
            batch.assemble_secs += started.elapsed().as_secs_f64();
            let actors = pending.iter().map(|c| c.actor_id).collect();
            pending.clear();
            let staged = Staged { rollout: stacked, actors, intake: std::mem::take(&mut batch) };
            if let Err(left) = self.hand_over(Ready::Batch(Box::new(staged))) {
                return left;
            }
        }
        // The chunks waiting for a full batch (counted in `batch`).
        batch
    }
}

/// Run one learning step; an error from it — a libtorch error (which tch raises as a panic), or an `Err`
/// such as a non-finite loss — comes back as a message instead of ending the learner.
pub(crate) fn guarded<T>(step: impl FnOnce() -> flotilla_algorithms::Result<T>) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())),
    }
}
