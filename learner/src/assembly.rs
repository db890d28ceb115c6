//! The on-policy learner's batch assembly, on a thread of its own, double-buffered over crossbeam channels.
//!
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use flotilla_algorithms::rollout::{Rollout, RolloutLayout};
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

/// What the assembly thread needs to know.
pub(crate) struct AssemblySpec {
    pub layout: RolloutLayout,
    pub chunks_per_batch: usize,
    pub max_policy_lag: u64,
}

/// The running assembly thread. [`Assembly::stop`] ends it and gives the hub queue back.
pub(crate) struct Assembly {
    ready: Receiver<Staged>,
    spares: Sender<Rollout>,
    intake: Arc<Mutex<Intake>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<mpsc::Receiver<Delivery>>>,
}

impl Assembly {
    /// Start stacking the on-policy batches that arrive on `rx` (the hub's queue).
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
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker { rx, runtime, hub, spec, ready: ready_tx, spares: spares_rx, intake: intake.clone() };
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flotilla-assembly".into())
            .spawn(move || worker.run(&stop_flag))
            .map_err(|e| Error::Runtime(format!("starting the batch-assembly thread: {e}")))?;
        Ok(Assembly { ready, spares, intake, stop, thread: Some(thread) })
    }

    /// The next stacked batch, waiting up to `timeout`; `None` if none came.
    pub(crate) fn next(&self, timeout: Duration) -> Result<Option<Staged>> {
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

    /// Stop the thread (batches not handed out are dropped, uncounted) and return the hub queue.
    pub(crate) fn stop(mut self) -> Result<mpsc::Receiver<Delivery>> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("joined once");
        thread.join().map_err(|_| Error::Runtime("the batch-assembly thread panicked".into()))
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
    spec: AssemblySpec,
    ready: Sender<Staged>,
    spares: Receiver<Rollout>,
    intake: Arc<Mutex<Intake>>,
}

impl Worker {
    fn run(mut self, stop: &AtomicBool) -> mpsc::Receiver<Delivery> {
        let mut pending: Vec<Chunk> = Vec::with_capacity(self.spec.chunks_per_batch);
        let mut batch = Intake::default();
        while !stop.load(Ordering::SeqCst) {
            let Some(delivery) = next_delivery(&self.runtime, &mut self.rx, Duration::from_millis(100)) else {
                if self.rx.is_closed() && self.rx.is_empty() {
                    break;
                }
                continue;
            };
            let chunk = match delivery {
                Delivery::Chunk(chunk) => chunk,
                Delivery::Gradient(_, receipt) => {
                    // The hub refuses gradients in an on-policy run; answer the call if one got through.
                    drop(receipt);
                    error!("a gradient reached an on-policy learner; ignored");
                    continue;
                }
            };
            let lag = self.hub.version().saturating_sub(chunk.policy_version);
            if lag > self.spec.max_policy_lag {
                let mut shared = self.intake.lock().unwrap_or_else(|e| e.into_inner());
                shared.count_chunk(&chunk);
                shared.stale += 1;
                continue;
            }
            batch.count_chunk(&chunk);
            add_lag(&mut batch.lag, lag);
            pending.push(chunk);
            if pending.len() < self.spec.chunks_per_batch {
                continue;
            }
            let started = Instant::now();
            let mut rollout = self.spares.try_recv().unwrap_or_else(|_| self.spec.layout.empty());
            let stacked = rollout
                .stack_chunks(&pending)
                .and_then(|()| rollout.put_obs_on_device(&self.spec.layout.obs))
                .map(|()| rollout)
                .map_err(|e| e.to_string());
            batch.assemble_secs += started.elapsed().as_secs_f64();
            let actors = pending.iter().map(|c| c.actor_id).collect();
            pending.clear();
            let staged = Staged { rollout: stacked, actors, intake: std::mem::take(&mut batch) };
            // Waits while the previous batch is still ready (the double buffer); gives up on stop.
            let mut staged = Some(staged);
            while let Some(s) = staged.take() {
                match self.ready.send_timeout(s, Duration::from_millis(100)) {
                    Ok(()) => {}
                    Err(crossbeam_channel::SendTimeoutError::Timeout(s)) if !stop.load(Ordering::SeqCst) => {
                        staged = Some(s)
                    }
                    Err(_) => return self.rx,
                }
            }
        }
        self.rx
    }
}
