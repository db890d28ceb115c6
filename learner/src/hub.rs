//! The learner's front door, shared by the gRPC server's tasks and the update loop: the actor registry, the
//! bounded ingest queue, and the published parameters.
//!
//! ```text
//! actors ─► register (version, run id, spaces) ─► actor table
//!        ─► chunk / gradient ─► validate ─► bounded queue ─► update loop (Hub::next)
//!        ◄─ params(have) ◄─ newest Versioned params ◄─ Hub::publish after each update
//! ```
//! A full queue makes `ingest` wait, so actors wait: back-pressure, nothing dropped. A refused message is
//! logged, counted and answered with an error naming the problem; the hub keeps serving everyone else. An actor
//! with no call in flight that sends nothing for [`SILENT_AFTER`] is logged as lost (once, by
//! [`Hub::note_silent_actors`]), and its next message as a reconnection: a network partition reads as that pair
//! of lines, or as a lost actor replaced by its re-registration, never as an error.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use flotilla_core::{Chunk, ChunkSpec, Gradient, Params, Versioned};
use flotilla_observe::prometheus::LearnerMetrics;
use flotilla_transport::{Ack, Code, LearnerService, MessageKey, Registered, Registration, RpcError, RunInfo};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::Family;

/// What actors deliver.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // Moved through the queue once; boxing would only add an allocation.
pub enum Delivery {
    /// A trajectory chunk.
    Chunk(Chunk),
    /// An A3C gradient, with the receipt that acknowledges it to its actor once dropped (after it is applied).
    Gradient(Gradient, Receipt),
}

/// Held by the update loop while it applies an A3C gradient; dropping it answers the actor's call. An A3C actor
/// waits for that answer, then fetches the parameters its gradient went into before collecting again
/// (Mnih et al. 2016, Algorithm S3: update θ, then synchronise θ′ ← θ), so a gradient is stale only by the
/// other actors' gradients applied while it was collected and computed.
#[derive(Debug)]
pub struct Receipt(Option<tokio::sync::oneshot::Sender<()>>);

impl Receipt {
    /// A receipt and the future its drop completes.
    pub fn new() -> (Receipt, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Receipt(Some(tx)), rx)
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(()); // The actor's call may have gone (disconnected); nothing to answer then.
        }
    }
}

/// Tracing target of the ingest account (debug level): `ingest account (pid P): accepted N env steps from actor
/// A; count T` for every accepted chunk or gradient, written right after the ledger (which then holds T);
/// `ingest account (pid P): returned N env steps from actor A, not queued; count T` for one the queue then did
/// not take; and `ingest account (pid P): ledger opened at C env steps; count T` when the ledger starts (messages
/// accepted before it counted from 0, then C is added).
pub const INGEST_LOG: &str = "flotilla::ingest";

/// The run's fixed facts, against which every actor and message is checked.
#[derive(Debug, Clone)]
pub struct HubSpec {
    /// Run id and config handed to actors.
    pub run: RunInfo,
    /// What every chunk must look like; its spaces are the run's, which actors must register with.
    pub chunk: ChunkSpec,
    /// Chunks or gradients.
    pub family: Family,
    /// Actor slots.
    pub n_actors: usize,
    /// Base seed; actor registration `k` gets `seed + 1000 · (k + 1)`, wrapping modulo 2⁶⁴ so that any base
    /// seed works (one near `u64::MAX` wraps round to small seeds instead of overflowing).
    pub seed: u64,
    /// Parameters per broadcast (and per gradient).
    pub n_params: usize,
    /// Ingest queue capacity.
    pub queue: usize,
    /// The run's budget of env steps.
    pub total_env_steps: u64,
    /// Actors wait for each message's ack before collecting again: on-policy chunks are acked after the update
    /// they feed ([`LearnerConfig::synchronous`](crate::config::LearnerConfig)); A3C gradients always, after
    /// they are applied.
    pub synchronous: bool,
    /// A registered actor whose messages are refused this many times in a row is disconnected (its next call
    /// is answered "unknown actor"; a supervised actor process is restarted); 0: never.
    pub max_refused_in_a_row: u32,
}

/// How long an actor may go without a call in flight before the learner logs it as lost: longer than an actor
/// takes to collect a chunk (milliseconds to about a second), short enough to show a partition as it happens.
pub const SILENT_AFTER: Duration = Duration::from_secs(5);

/// Senders whose idempotency keys the hub remembers before it forgets those silent for [`SENDER_MEMORY`].
const MAX_SENDERS: usize = 1 << 16;
/// How long a silent sender's keys are remembered once [`MAX_SENDERS`] is reached (far longer than any resend).
const SENDER_MEMORY: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct ActorEntry {
    host: String,
    pid: u32,
    /// When its last call ended (or it registered), and how many of its calls are in flight now: an actor
    /// waiting on the learner (a full queue, a synchronous ack) is not silent.
    last_seen: Instant,
    in_flight: u32,
    /// Logged as lost (see [`SILENT_AFTER`]); its next message is logged as a reconnection.
    lost: bool,
    /// Its messages refused since its last accepted one: at [`HubSpec::max_refused_in_a_row`] it is
    /// disconnected.
    refused_in_a_row: u32,
}

/// One call of a registered actor in flight; dropping it (the call answered, or abandoned by a disconnect)
/// marks the actor seen now.
struct Call<'a> {
    hub: &'a Hub,
    actor_id: u64,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.hub.actors.lock().expect("actor table").by_id.get_mut(&self.actor_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.last_seen = Instant::now();
        }
    }
}

#[derive(Default)]
struct ActorTable {
    registrations: u64,
    by_id: HashMap<u64, ActorEntry>,
    by_slot: HashMap<u32, u64>,
    /// Actors an ack has told that the run is over.
    told_finished: HashSet<u64>,
}

/// Counters of refused and skipped messages.
#[derive(Debug, Default)]
pub struct HubCounters {
    /// Messages refused as malformed or from unknown actors.
    pub refused: AtomicU64,
}

/// A sender's highest message number taken ([`Hub::first_arrival`]), when it was last heard, and where that
/// message's answer comes: the channel says `None` while its first copy is being answered, then whether the
/// learner took it; no channel when it was answered as delivered long ago.
struct Taken {
    highest: u64,
    heard: Instant,
    answer: Option<tokio::sync::watch::Receiver<Option<bool>>>,
}

/// How a message arrived ([`Hub::first_arrival`]).
enum Arrival<'a> {
    /// For the first time: its key is taken until [`FirstCopy::answered`] says otherwise.
    First(FirstCopy<'a>),
    /// Again: the first copy's answer to wait for, or `None` when it came back long ago (delivered).
    Again(Option<tokio::sync::watch::Receiver<Option<bool>>>),
}

/// The first copy of a message being answered. [`FirstCopy::answered`] passes its answer on to copies that
/// arrive meanwhile; a copy not taken (or whose call ends unanswered, dropping this) gives its key back.
struct FirstCopy<'a> {
    hub: &'a Hub,
    key: MessageKey,
    /// `None` for a message without a key.
    answer: Option<tokio::sync::watch::Sender<Option<bool>>>,
    /// Whether the learner's queue took it ([`Hub::enqueue`]).
    queued: AtomicBool,
    /// The sender and the env steps [`FirstCopy::count`] put into the account.
    counted: Option<(u64, u64)>,
}

impl FirstCopy<'_> {
    /// Count its `env_steps` from `actor_id` as accepted ([`Hub::accepted`]) before it is queued.
    fn count(&mut self, actor_id: u64, env_steps: u64) {
        self.hub.accepted(actor_id, env_steps);
        self.counted = Some((actor_id, env_steps));
    }

    /// It was not taken after all: its key goes back and its steps leave the account.
    fn not_taken(&mut self) {
        self.hub.give_back(self.key);
        if let Some((actor_id, env_steps)) = self.counted.take() {
            self.hub.returned(actor_id, env_steps);
        }
    }

    /// The first copy was answered `answer`: taken if it is an accepted ack, else [`FirstCopy::not_taken`]
    /// first.
    fn answered(mut self, answer: Result<Ack, RpcError>) -> Result<Ack, RpcError> {
        let taken = answer.as_ref().is_ok_and(|ack| ack.accepted);
        if !taken {
            self.not_taken();
        }
        if let Some(tx) = self.answer.take() {
            tx.send_replace(Some(taken));
        }
        answer
    }
}

impl Drop for FirstCopy<'_> {
    fn drop(&mut self) {
        // Unanswered: the call ended (its caller went away) before the answer. Taken if the queue has it (a
        // copy sent again is answered as delivered); otherwise not taken: the key goes back, so that copy is a
        // first arrival, and copies waiting now see the channel close (`answer` drops with this).
        if self.queued.load(Ordering::SeqCst) {
            if let Some(tx) = self.answer.take() {
                tx.send_replace(Some(true));
            }
        } else if self.answer.is_some() || self.counted.is_some() {
            self.not_taken();
        }
    }
}

/// The shared state behind [`LearnerService`].
pub struct Hub {
    spec: HubSpec,
    actors: Mutex<ActorTable>,
    queue: mpsc::Sender<Delivery>,
    params: RwLock<Params>,
    finished: AtomicBool,
    /// Newest version, and whether the run is over, for acks that wait for an update (synchronous mode).
    progress: tokio::sync::watch::Sender<(u64, bool)>,
    env_steps: AtomicU64,
    /// Refusal counts.
    pub counters: HubCounters,
    /// What the Prometheus endpoint serves (counted whether or not one is listening).
    metrics: Arc<LearnerMetrics>,
    /// Env steps accepted (from the checkpoint the learner started at), and where they are recorded.
    ingested: AtomicU64,
    ledger: std::sync::OnceLock<crate::run_dir::IngestLedger>,
    /// Held while a message's steps are counted and written to the ledger.
    ingest_order: Mutex<()>,
    /// Each sender's highest message number taken, when it was last heard, and that message's answer
    /// ([`Hub::first_arrival`]).
    taken: Mutex<HashMap<u64, Taken>>,
    /// When the learner this one replaces died ([`Hub::restarted_after`]), and the seconds from then to this
    /// hub's first accepted message.
    died_at: std::sync::OnceLock<std::time::SystemTime>,
    restart_secs: std::sync::OnceLock<f64>,
}

impl Hub {
    /// A hub publishing `initial` as version 0, and the receiving end of its ingest queue.
    pub fn new(spec: HubSpec, initial: Vec<f32>) -> (Arc<Hub>, mpsc::Receiver<Delivery>) {
        let (tx, rx) = mpsc::channel(spec.queue);
        let hub = Hub {
            spec,
            actors: Mutex::new(ActorTable::default()),
            queue: tx,
            params: RwLock::new(Versioned { version: 0, value: Arc::new(initial) }),
            finished: AtomicBool::new(false),
            progress: tokio::sync::watch::Sender::new((0, false)),
            env_steps: AtomicU64::new(0),
            counters: HubCounters::default(),
            metrics: LearnerMetrics::new(),
            ingested: AtomicU64::new(0),
            ledger: std::sync::OnceLock::new(),
            ingest_order: Mutex::new(()),
            taken: Mutex::new(HashMap::new()),
            died_at: std::sync::OnceLock::new(),
            restart_secs: std::sync::OnceLock::new(),
        };
        (Arc::new(hub), rx)
    }

    /// The run's facts.
    pub fn spec(&self) -> &HubSpec {
        &self.spec
    }

    /// The learner's Prometheus metrics: the hub counts chunks, transitions, gradients, refusals, actors and
    /// the queue's depth; the learner adds update times and its logged rows.
    pub fn metrics(&self) -> &Arc<LearnerMetrics> {
        &self.metrics
    }

    /// Deliveries waiting in the ingest queue now: at most its capacity (`[learner] queue`), as senders wait
    /// while it is full.
    pub fn queue_depth(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// Record how many deliveries wait in the ingest queue now.
    pub fn note_queue_depth(&self) {
        self.metrics.queue_depth.set(self.queue_depth() as i64);
    }

    /// Publish new parameters; returns their version.
    pub fn publish(&self, values: Vec<f32>) -> u64 {
        let mut p = self.params.write().expect("params lock");
        p.version += 1;
        p.value = Arc::new(values);
        let version = p.version;
        drop(p);
        self.progress.send_modify(|v| v.0 = version);
        self.metrics.policy_version.set(version as i64);
        version
    }

    /// The newest published version.
    pub fn version(&self) -> u64 {
        self.params.read().expect("params lock").version
    }

    /// Record the learner's progress (acks carry it to actors).
    pub fn set_env_steps(&self, env_steps: u64) {
        self.env_steps.store(env_steps, Ordering::Relaxed);
    }

    /// Tell actors the run is over (their next message is answered `finished`).
    pub fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
        self.progress.send_modify(|v| v.1 = true);
    }

    /// Actors registered now.
    pub fn live_actors(&self) -> usize {
        self.actors.lock().expect("actor table").by_id.len()
    }

    fn ack(&self) -> Ack {
        Ack {
            finished: self.finished.load(Ordering::SeqCst),
            policy_version: self.version(),
            env_steps: self.env_steps.load(Ordering::Relaxed),
            total_env_steps: self.spec.total_env_steps,
            accepted: false,
        }
    }

    fn refuse(&self, actor_id: u64, what: &str, problem: String) -> RpcError {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.metrics.refused.inc();
        warn!(actor_id, "refused a {what} from actor {actor_id}: {problem}");
        let mut t = self.actors.lock().expect("actor table");
        let slot = t.by_slot.iter().find(|(_, id)| **id == actor_id).map(|(slot, _)| *slot);
        if let (Some(e), Some(slot)) = (t.by_id.get_mut(&actor_id), slot) {
            self.metrics.actor_refused(slot).inc();
            e.refused_in_a_row += 1;
            let limit = self.spec.max_refused_in_a_row;
            if limit > 0 && e.refused_in_a_row >= limit {
                let (host, pid, n) = (e.host.clone(), e.pid, e.refused_in_a_row);
                t.by_id.remove(&actor_id);
                t.by_slot.remove(&slot);
                self.metrics.actors.set(t.by_id.len() as i64);
                warn!(
                    actor_id,
                    "disconnected actor {actor_id} (slot {slot}, {host} pid {pid}): {n} messages in a row refused, the \
                     last: {what}: {problem}; the slot is free for a new registration"
                );
            }
        }
        RpcError::invalid(format!("{what} from actor {actor_id}: {problem}"))
    }

    /// This hub's learner replaces one that died at `died_at` (a supervisor's restart): its first accepted
    /// message is logged with the seconds since then ([`Hub::restart_secs`]).
    pub fn restarted_after(&self, died_at: std::time::SystemTime) {
        let _ = self.died_at.set(died_at);
    }

    /// Seconds from the previous learner's death ([`Hub::restarted_after`]) to this hub's first accepted message,
    /// once there was one.
    pub fn restart_secs(&self) -> Option<f64> {
        self.restart_secs.get().copied()
    }

    /// A registered actor's message passed every check: its run of refusals ends.
    fn accepted(&self, actor_id: u64, env_steps: u64) {
        if let Some(e) = self.actors.lock().expect("actor table").by_id.get_mut(&actor_id) {
            e.refused_in_a_row = 0;
        }
        if let Some(died) = self.died_at.get()
            && self.restart_secs.get().is_none()
        {
            let secs = died.elapsed().unwrap_or_default().as_secs_f64();
            if self.restart_secs.set(secs).is_ok() {
                info!("accepting actors' data again {secs:.2} s after the previous learner died");
            }
        }
        self.count_ingested(env_steps as i64, format_args!("accepted {env_steps} env steps from actor {actor_id}"));
    }

    /// Take back `env_steps` that [`Hub::accepted`] counted for a message the queue then did not take (the
    /// run ended first, or the call ended while it waited for room): the ledger and the account lines go down.
    fn returned(&self, actor_id: u64, env_steps: u64) {
        let what = format_args!("returned {env_steps} env steps from actor {actor_id}, not queued");
        self.count_ingested(-(env_steps as i64), what);
    }

    /// Add `change` to the env steps taken in, write the new count to the ledger and log the account line
    /// (`what` changed it). One at a time, so the ledger follows the count (two calls writing their totals in
    /// the other order would leave it one message off) and the account lines come in the ledger's order. The
    /// lines are off unless asked for (`RUST_LOG=info,flotilla::ingest=debug`): an account of what was taken in
    /// that an observer (scripts/soak.sh) checks against the ledger.
    fn count_ingested(&self, change: i64, what: std::fmt::Arguments<'_>) {
        let _in_order = self.ingest_order.lock().expect("ingest order");
        let total = match change {
            up @ 0.. => self.ingested.fetch_add(up as u64, Ordering::SeqCst) + up as u64,
            down => self.ingested.fetch_sub(down.unsigned_abs(), Ordering::SeqCst) - down.unsigned_abs(),
        };
        if let Some(ledger) = self.ledger.get()
            && let Err(e) = ledger.record(total)
        {
            warn!("{e}");
        }
        tracing::debug!(target: INGEST_LOG, "ingest account (pid {}): {what}; count {total}", std::process::id());
    }

    /// Whether a message with `key` arrives for the first time, taking the key if so (messages without a key
    /// always do): [`Arrival::First`], whose [`FirstCopy`] must be told how it was answered. An actor sends one
    /// message at a time, numbered in order, so a number at or below its sender's highest taken is a resend:
    /// [`Arrival::Again`], with the first copy's answer to wait for when it is the highest.
    fn first_arrival(&self, key: MessageKey) -> Arrival<'_> {
        if !key.is_some() {
            return Arrival::First(FirstCopy {
                hub: self,
                key,
                answer: None,
                queued: AtomicBool::new(false),
                counted: None,
            });
        }
        let mut taken = self.taken.lock().expect("taken keys");
        if taken.len() >= MAX_SENDERS && !taken.contains_key(&key.sender) {
            taken.retain(|_, t| t.heard.elapsed() < SENDER_MEMORY);
        }
        let t = taken.entry(key.sender).or_insert(Taken { highest: 0, heard: Instant::now(), answer: None });
        t.heard = Instant::now();
        if key.seq <= t.highest {
            // Taken. Below the highest, its sender has sent a later message since, so its answer came back
            // (delivered); at the highest, it gets its first copy's answer.
            return Arrival::Again(if key.seq == t.highest { t.answer.clone() } else { None });
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        (t.highest, t.answer) = (key.seq, Some(rx));
        Arrival::First(FirstCopy { hub: self, key, answer: Some(tx), queued: AtomicBool::new(false), counted: None })
    }

    /// Answer a message that arrived again (`key` taken before) as its first copy was answered, without taking
    /// it twice: once that answer is ready (`first`; `None` when it came back long ago), delivered or not; in
    /// synchronous mode a delivered chunk once the update it feeds (after `version`) is published.
    async fn again(
        &self,
        actor_id: u64,
        what: &str,
        key: MessageKey,
        first: Option<tokio::sync::watch::Receiver<Option<bool>>>,
        version: Option<u64>,
    ) -> Result<Ack, RpcError> {
        self.metrics.duplicates.inc();
        info!(
            actor_id,
            "{what} {} of sender {:016x} (actor {actor_id}) arrived again: answered as its first copy, not taken twice",
            key.seq,
            key.sender
        );
        let taken = match first {
            None => true,
            Some(mut first) => match first.wait_for(Option::is_some).await {
                Ok(answer) => answer.unwrap_or(false),
                // The first copy's call ended unanswered (its caller went away) and gave the key back.
                Err(_) => {
                    return Err(RpcError::new(
                        Code::Unavailable,
                        format!("{what} {} arrived again while its first copy was dropped; send it again", key.seq),
                    ));
                }
            },
        };
        if !taken {
            return Ok(self.ack());
        }
        if let Some(version) = version.filter(|_| self.spec.synchronous) {
            published_after(self.progress.subscribe(), version).await;
        }
        Ok(Ack { accepted: true, ..self.ack() })
    }

    /// Record every accepted env step in `ledger` from now on, counting from `start` (the checkpoint's env steps;
    /// steps accepted before this call count too). A second ledger is ignored.
    pub fn record_ingest_to(&self, ledger: crate::run_dir::IngestLedger, start: u64) {
        let _in_order = self.ingest_order.lock().expect("ingest order");
        let total = self.ingested.fetch_add(start, Ordering::SeqCst) + start;
        if let Err(e) = ledger.record(total) {
            warn!("{e}");
        }
        if self.ledger.set(ledger).is_ok() {
            tracing::debug!(
                target: INGEST_LOG,
                "ingest account (pid {}): ledger opened at {start} env steps; count {total}",
                std::process::id()
            );
        }
    }

    fn check_actor(&self, actor_id: u64, what: &str) -> Result<Call<'_>, RpcError> {
        if let Some(e) = self.actors.lock().expect("actor table").by_id.get_mut(&actor_id) {
            if e.lost {
                e.lost = false;
                let silent = e.last_seen.elapsed().as_secs_f64();
                info!(actor_id, "actor {actor_id} reconnected (silent for {silent:.1} s)");
            }
            e.in_flight += 1;
            Ok(Call { hub: self, actor_id })
        } else {
            Err(self.refuse(actor_id, what, "unknown actor (not registered, or replaced by a restart)".into()))
        }
    }

    /// Log each registered actor that has had no call in flight for [`SILENT_AFTER`] as lost, once per silence
    /// (the update loop calls this between deliveries; nothing is logged once the run is over). Returns the
    /// actors newly lost.
    pub fn note_silent_actors(&self) -> Vec<u64> {
        self.note_silent_for(SILENT_AFTER)
    }

    fn note_silent_for(&self, after: Duration) -> Vec<u64> {
        let mut newly_lost = Vec::new();
        if self.finished.load(Ordering::SeqCst) {
            return newly_lost;
        }
        let mut t = self.actors.lock().expect("actor table");
        let slots: HashMap<u64, u32> = t.by_slot.iter().map(|(slot, id)| (*id, *slot)).collect();
        for (&actor_id, e) in t.by_id.iter_mut() {
            let silent = e.last_seen.elapsed();
            if e.in_flight == 0 && !e.lost && silent > after {
                e.lost = true;
                newly_lost.push(actor_id);
                let slot = slots.get(&actor_id).copied().unwrap_or_default();
                warn!(
                    actor_id,
                    "actor {actor_id} lost (no message for {:.0} s; slot {slot}, {} pid {})",
                    silent.as_secs_f64(),
                    e.host,
                    e.pid
                );
            }
        }
        newly_lost
    }

    /// Remember which actors an ack has told that the run is over.
    fn note_told(&self, actor_id: u64, answer: Result<Ack, RpcError>) -> Result<Ack, RpcError> {
        if answer.as_ref().is_ok_and(|ack| ack.finished) {
            self.actors.lock().expect("actor table").told_finished.insert(actor_id);
        }
        answer
    }

    /// After [`Hub::finish`]: wait, at most `limit`, until every actor still in touch (a call in flight, or one
    /// within [`SILENT_AFTER`]) has been told that the run is over, so that actors on other hosts, a round trip
    /// or more behind, end cleanly instead of finding the learner gone and reconnecting in vain. Returns how
    /// many were not told.
    pub fn wait_until_actors_told(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let t = self.actors.lock().expect("actor table");
            let untold = (t.by_id.iter())
                .filter(|(id, e)| {
                    !t.told_finished.contains(id) && (e.in_flight > 0 || e.last_seen.elapsed() < SILENT_AFTER)
                })
                .count();
            drop(t);
            if untold == 0 || Instant::now() >= deadline {
                return untold;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Undo [`Hub::first_arrival`] for a message that was not taken after all (the run ended before it was
    /// queued, or its call ended first): its sender's highest taken number goes back to the one before it, so
    /// that the message sent again is a first arrival.
    fn give_back(&self, key: MessageKey) {
        if !key.is_some() {
            return;
        }
        let mut taken = self.taken.lock().expect("taken keys");
        if let Some(t) = taken.get_mut(&key.sender)
            && t.highest == key.seq
        {
            // The number before was answered as delivered: its sender sends the next only after that.
            (t.highest, t.answer) = (key.seq.saturating_sub(1), None);
        }
    }

    /// Queue `d` and answer: at once, or in synchronous mode once the update it feeds is published, or (A3C)
    /// once `applied` completes. `accepted` says whether the queue took it; `finished`, that the run is over.
    async fn enqueue(
        &self,
        d: Delivery,
        applied: Option<tokio::sync::oneshot::Receiver<()>>,
        first: &FirstCopy<'_>,
    ) -> Result<Ack, RpcError> {
        // The caller answered a message that arrived after the run's end; one that passed its check as the run
        // ended is answered below (the queue took it, or closed). Subscribed before queueing, so an update that
        // lands right after cannot be missed.
        let progress = match &d {
            Delivery::Chunk(c) if self.spec.synchronous => Some((c.policy_version, self.progress.subscribe())),
            _ => None,
        };
        // Waits while the queue is full: the actor's call does not return, so the actor waits too.
        match self.queue.send(d).await {
            Ok(()) => {
                first.queued.store(true, Ordering::SeqCst);
                self.note_queue_depth();
                if let Some((version, progress)) = progress {
                    published_after(progress, version).await;
                }
                if let Some(applied) = applied {
                    // The receipt is dropped after the gradient is applied, or with the queue when the run ends.
                    let _ = applied.await;
                }
                // The queue took it: delivered (the run accounts for it, trained on or not), whether or not the
                // run ended meanwhile (`finished` then tells the actor to stop).
                Ok(Ack { accepted: true, ..self.ack() })
            }
            // The learner closed the queue because the run is over.
            Err(_) if self.finished.load(Ordering::SeqCst) => Ok(self.ack()),
            Err(_) => Err(RpcError::new(Code::Unavailable, "the learner is shutting down")),
        }
    }
}

/// Synchronous mode's answer to a chunk acting with `version`: wait until the update it feeds (one newer than
/// `version`) is published, or the run ends. `progress` was subscribed before the chunk was queued, so an update
/// that lands right after cannot be missed.
async fn published_after(mut progress: tokio::sync::watch::Receiver<(u64, bool)>, version: u64) {
    let _ = progress.wait_for(|&(v, finished)| v > version || finished).await;
}

impl LearnerService for Hub {
    fn run_info(&self) -> RunInfo {
        self.spec.run.clone()
    }

    fn register(&self, r: Registration) -> Result<Registered, RpcError> {
        let s = &self.spec;
        let precondition = |msg: String| {
            warn!("refused registration from {} (pid {}): {msg}", r.host, r.pid);
            Err(RpcError::new(Code::FailedPrecondition, msg))
        };
        if r.run_id != s.run.run_id {
            return precondition(format!("run id {:?}, this learner runs {:?}", r.run_id, s.run.run_id));
        }
        if r.observation_space != s.chunk.observation_space {
            return precondition(format!(
                "actor observation space {:?} differs from the learner's {:?}",
                r.observation_space, s.chunk.observation_space
            ));
        }
        if r.action_space != s.chunk.action_space {
            return precondition(format!(
                "actor action space {:?} differs from the learner's {:?}",
                r.action_space, s.chunk.action_space
            ));
        }
        if r.n_envs != s.chunk.n_envs {
            return precondition(format!("actor steps {} envs, this run needs {} per actor", r.n_envs, s.chunk.n_envs));
        }
        let mut t = self.actors.lock().expect("actor table");
        let index = match r.actor_index {
            Some(i) if (i as usize) < s.n_actors => i,
            Some(i) => return precondition(format!("actor index {i} outside 0..{}", s.n_actors)),
            None => (t.registrations % s.n_actors as u64) as u32,
        };
        t.registrations += 1;
        let actor_id = t.registrations;
        // A new registration in a slot replaces the old one: a restarted actor's predecessor is gone.
        if let Some(old) = t.by_slot.insert(index, actor_id)
            && let Some(e) = t.by_id.remove(&old)
        {
            let lost =
                if e.lost { format!(", lost {:.0} s ago", e.last_seen.elapsed().as_secs_f64()) } else { "".into() };
            info!("slot {index}: actor {actor_id} replaces actor {old} ({} pid {}{lost})", e.host, e.pid);
        }
        let entry = ActorEntry {
            host: r.host.clone(),
            pid: r.pid,
            last_seen: Instant::now(),
            in_flight: 0,
            lost: false,
            refused_in_a_row: 0,
        };
        t.by_id.insert(actor_id, entry);
        self.metrics.actors.set(t.by_id.len() as i64);
        info!(actor_id, "actor {actor_id} registered in slot {index} from {} (pid {})", r.host, r.pid);
        Ok(Registered {
            actor_id,
            actor_index: index,
            n_actors: s.n_actors as u32,
            // Wrapping: a base seed near u64::MAX must not overflow (and panic in debug builds).
            seed: s.seed.wrapping_add(1000u64.wrapping_mul(actor_id)),
            chunk_steps: s.chunk.n_steps,
            policy_version: self.version(),
            synchronous: s.synchronous,
        })
    }

    async fn ingest(&self, chunk: Chunk, key: MessageKey) -> Result<Ack, RpcError> {
        let _call = self.check_actor(chunk.actor_id, "chunk")?;
        if self.spec.family == Family::Gradients {
            return Err(self.refuse(chunk.actor_id, "chunk", "this run (a3c) takes gradients, not chunks".into()));
        }
        if let Err(problem) = chunk.validate(&self.spec.chunk) {
            return Err(self.refuse(chunk.actor_id, "chunk", problem));
        }
        if chunk.policy_version > self.version() {
            let problem =
                format!("policy version {} was never published (newest {})", chunk.policy_version, self.version());
            return Err(self.refuse(chunk.actor_id, "chunk", problem));
        }
        let mut first = match self.first_arrival(key) {
            Arrival::First(first) => first,
            Arrival::Again(answer) => {
                let version = Some(chunk.policy_version);
                return self.note_told(chunk.actor_id, self.again(chunk.actor_id, "chunk", key, answer, version).await);
            }
        };
        if self.finished.load(Ordering::SeqCst) {
            return self.note_told(chunk.actor_id, first.answered(Ok(self.ack())));
        }
        first.count(chunk.actor_id, (chunk.n_steps * chunk.n_envs) as u64);
        self.metrics.chunks.inc();
        self.metrics.transitions.inc_by((chunk.n_steps * chunk.n_envs) as u64);
        let actor_id = chunk.actor_id;
        self.note_told(actor_id, {
            let answer = self.enqueue(Delivery::Chunk(chunk), None, &first).await;
            first.answered(answer)
        })
    }

    async fn gradient(&self, g: Gradient, key: MessageKey) -> Result<Ack, RpcError> {
        let _call = self.check_actor(g.actor_id, "gradient")?;
        if self.spec.family != Family::Gradients {
            return Err(self.refuse(g.actor_id, "gradient", "this run takes chunks, not gradients".into()));
        }
        if let Err(problem) = g.validate(self.spec.n_params) {
            return Err(self.refuse(g.actor_id, "gradient", problem));
        }
        if g.policy_version > self.version() {
            let problem =
                format!("policy version {} was never published (newest {})", g.policy_version, self.version());
            return Err(self.refuse(g.actor_id, "gradient", problem));
        }
        let mut first = match self.first_arrival(key) {
            Arrival::First(first) => first,
            Arrival::Again(answer) => {
                return self.note_told(g.actor_id, self.again(g.actor_id, "gradient", key, answer, None).await);
            }
        };
        if self.finished.load(Ordering::SeqCst) {
            return self.note_told(g.actor_id, first.answered(Ok(self.ack())));
        }
        let (receipt, applied) = Receipt::new();
        first.count(g.actor_id, g.env_steps);
        self.metrics.gradients.inc();
        let actor_id = g.actor_id;
        self.note_told(actor_id, {
            let answer = self.enqueue(Delivery::Gradient(g, receipt), Some(applied), &first).await;
            first.answered(answer)
        })
    }

    fn params(&self, actor_id: u64, have: Option<u64>) -> Result<Option<Params>, RpcError> {
        let _call = self.check_actor(actor_id, "parameter request")?;
        let p = self.params.read().expect("params lock");
        Ok(if have == Some(p.version) { None } else { Some(p.clone()) })
    }
}

/// Wait at most `timeout` for the next delivery (`None` on timeout or when every sender is gone).
pub fn next_delivery(
    runtime: &tokio::runtime::Handle,
    rx: &mut mpsc::Receiver<Delivery>,
    timeout: Duration,
) -> Option<Delivery> {
    runtime.block_on(async { tokio::time::timeout(timeout, rx.recv()).await.ok().flatten() })
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("run_id", &self.spec.run.run_id).field("version", &self.version()).finish()
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{DType, EpisodeStats, ObsBuf, Space};

    use super::*;

    fn spec(queue: usize) -> HubSpec {
        HubSpec {
            run: RunInfo { run_id: "r".into(), config_toml: String::new() },
            chunk: ChunkSpec {
                observation_space: Space::box1d(vec![-1.0; 2], vec![1.0; 2]),
                action_space: Space::discrete(2),
                obs_dim: 2,
                obs_dtype: DType::F32,
                act_dim: 1,
                n_envs: 1,
                n_steps: 2,
                needs_behaviour: true,
                n_tasks: 0,
                state_dim: 0,
                state_bounded: 0,
            },
            family: Family::OnPolicy,
            n_actors: 2,
            seed: 0,
            n_params: 3,
            queue,
            total_env_steps: 100,
            synchronous: false,
            max_refused_in_a_row: 3,
        }
    }

    fn registration(hub: &Hub) -> Registered {
        let s = hub.spec();
        hub.register(Registration {
            run_id: "r".into(),
            observation_space: s.chunk.observation_space.clone(),
            action_space: s.chunk.action_space.clone(),
            n_envs: 1,
            actor_index: None,
            host: "h".into(),
            pid: 1,
        })
        .unwrap()
    }

    fn chunk(actor_id: u64) -> Chunk {
        Chunk {
            actor_id,
            policy_version: 0,
            n_steps: 2,
            n_envs: 1,
            obs: ObsBuf::F32(vec![0.0; 4]),
            bootstrap_obs: ObsBuf::F32(vec![0.0; 2]),
            actions: vec![0.0, 1.0],
            rewards: vec![1.0, 1.0],
            terminated: vec![false; 2],
            truncated: vec![false; 2],
            log_probs: vec![-0.7; 2],
            values: vec![0.0; 2],
            initial_state: Vec::new(),
            final_index: vec![],
            final_obs: ObsBuf::F32(vec![]),
            episodes: vec![EpisodeStats { episode_return: 1.0, length: 1, env_index: 0, truncated: false, task: None }],
        }
    }

    #[test]
    fn a_full_queue_makes_senders_wait_and_drops_nothing() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (hub, mut rx) = Hub::new(spec(1), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        // The queue (1) is full: the second send waits instead of failing or dropping.
        let h = hub.clone();
        let second = rt.spawn(async move { h.ingest(chunk(id), MessageKey::NONE).await });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!second.is_finished(), "a send into a full queue must wait");
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some());
        rt.block_on(second).unwrap().unwrap();
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some(), "the waiting chunk arrived");
        // After the run ends, waiting senders are answered `finished` rather than left hanging.
        hub.finish();
        rx.close();
        let ack = rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        assert!(ack.finished && !ack.accepted, "after the run ended a chunk is refused: {ack:?}");
    }

    #[test]
    fn in_synchronous_mode_an_ack_waits_for_the_update_its_chunk_feeds() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (hub, mut rx) = Hub::new(HubSpec { synchronous: true, ..spec(4) }, vec![0.0; 3]);
        let r = registration(&hub);
        assert!(r.synchronous);
        let h = hub.clone();
        let pending = rt.spawn(async move { h.ingest(chunk(r.actor_id), MessageKey::NONE).await });
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some(), "queued at once");
        std::thread::sleep(Duration::from_millis(200));
        assert!(!pending.is_finished(), "no ack before the update");
        hub.publish(vec![1.0; 3]);
        let ack = rt.block_on(pending).unwrap().unwrap();
        assert_eq!((ack.policy_version, ack.finished), (1, false));
        // The end of the run releases a waiting ack too.
        let h = hub.clone();
        let mut c = chunk(r.actor_id);
        c.policy_version = 1;
        let pending = rt.spawn(async move { h.ingest(c, MessageKey::NONE).await });
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some());
        hub.finish();
        let ack = rt.block_on(pending).unwrap().unwrap();
        // Queued before the run ended: delivered (the run accounts for it), and the actor is told to stop.
        assert!(ack.finished && ack.accepted, "{ack:?}");
    }

    #[test]
    fn an_a3c_gradient_is_acked_once_the_learner_has_applied_it() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (hub, mut rx) = Hub::new(HubSpec { family: Family::Gradients, synchronous: true, ..spec(4) }, vec![0.0; 3]);
        let r = registration(&hub);
        assert!(r.synchronous, "A3C actors wait for their gradient to be applied");
        let actor_id = r.actor_id;
        let gradient = move |version| Gradient {
            actor_id,
            policy_version: version,
            values: vec![0.5; 3],
            env_steps: 2,
            episodes: vec![],
        };
        let h = hub.clone();
        let pending = rt.spawn(async move { h.gradient(gradient(0), MessageKey::NONE).await });
        let Some(Delivery::Gradient(g, receipt)) = next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)) else {
            panic!("the gradient is queued at once")
        };
        assert_eq!(g.values, vec![0.5; 3]);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!pending.is_finished(), "no ack while the learner holds the receipt");
        hub.publish(vec![1.0; 3]);
        drop(receipt);
        let ack = rt.block_on(pending).unwrap().unwrap();
        assert_eq!((ack.policy_version, ack.finished), (1, false), "the ack names the version it went into");
        // A run that ends with gradients still queued answers their actors too.
        let h = hub.clone();
        let pending = rt.spawn(async move { h.gradient(gradient(1), MessageKey::NONE).await });
        std::thread::sleep(Duration::from_millis(100));
        hub.finish();
        drop(rx);
        assert!(rt.block_on(pending).unwrap().unwrap().finished);
    }

    #[test]
    fn registration_refusals_name_both_sides_and_restarts_replace_their_slot() {
        let (hub, _rx) = Hub::new(spec(4), vec![0.0; 3]);
        let mut r = Registration {
            run_id: "r".into(),
            observation_space: Space::box1d(vec![-1.0; 3], vec![1.0; 3]),
            action_space: Space::discrete(2),
            n_envs: 1,
            actor_index: Some(0),
            host: "h".into(),
            pid: 1,
        };
        let err = hub.register(r.clone()).unwrap_err();
        assert_eq!(err.code, Code::FailedPrecondition);
        assert!(err.message.contains("shape: [3]") && err.message.contains("shape: [2]"), "{}", err.message);
        r.observation_space = hub.spec().chunk.observation_space.clone();
        r.n_envs = 3;
        assert!(hub.register(r.clone()).unwrap_err().message.contains("steps 3 envs, this run needs 1"));
        r.n_envs = 1;
        let first = hub.register(r.clone()).unwrap();
        let again = hub.register(r).unwrap();
        assert_ne!(first.actor_id, again.actor_id);
        assert_eq!(hub.live_actors(), 1, "the restarted actor replaced its predecessor");
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let err = rt.block_on(hub.ingest(chunk(first.actor_id), MessageKey::NONE)).unwrap_err();
        assert!(err.message.contains("unknown actor"), "{}", err.message);
        assert_eq!(hub.counters.refused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn actor_seeds_wrap_instead_of_overflowing() {
        let (hub, _rx) = Hub::new(HubSpec { seed: 7, ..spec(4) }, vec![0.0; 3]);
        assert_eq!(registration(&hub).seed, 1007);
        assert_eq!(registration(&hub).seed, 2007);
        let (hub, _rx) = Hub::new(HubSpec { seed: u64::MAX - 499, ..spec(4) }, vec![0.0; 3]);
        assert_eq!(registration(&hub).seed, 500, "(2⁶⁴ − 500 + 1000) mod 2⁶⁴");
    }

    #[test]
    fn chunks_with_values_outside_the_spaces_are_refused_naming_the_field() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (hub, _rx) = Hub::new(spec(4), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        let mut action = chunk(id);
        action.actions[1] = 7.0;
        let mut observation = chunk(id);
        observation.obs = ObsBuf::F32(vec![0.0, 0.0, 0.0, 1.5]);
        for (bad, expected) in [
            (action, "actions[1] is 7, outside Discrete(2) (expected an integer in 0..2)"),
            (observation, "observations[3] is 1.5, outside the observation space's bounds [-1, 1] for element 1"),
        ] {
            let err = rt.block_on(hub.ingest(bad, MessageKey::NONE)).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{err:?}");
            assert!(err.message.contains(&format!("chunk from actor {id}: {expected}")), "{err:?}");
        }
        assert_eq!(hub.counters.refused.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_actor_refused_too_often_in_a_row_is_disconnected_and_counted_by_slot() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (hub, _rx) = Hub::new(spec(4), vec![0.0; 3]); // max_refused_in_a_row = 3
        let id = registration(&hub).actor_id;
        let bad = || {
            let mut c = chunk(id);
            c.actions[0] = 7.0;
            c
        };
        // Two refusals, then a good chunk: the run of refusals starts again.
        for _ in 0..2 {
            assert_eq!(rt.block_on(hub.ingest(bad(), MessageKey::NONE)).unwrap_err().code, Code::InvalidArgument);
        }
        rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        for _ in 0..2 {
            rt.block_on(hub.ingest(bad(), MessageKey::NONE)).unwrap_err();
        }
        assert_eq!(hub.live_actors(), 1, "4 refusals, but never 3 in a row yet");
        // The third in a row disconnects it: its next chunk, good or not, is from an unknown actor.
        rt.block_on(hub.ingest(bad(), MessageKey::NONE)).unwrap_err();
        assert_eq!(hub.live_actors(), 0);
        let err = rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap_err();
        assert!(err.message.contains("unknown actor"), "{err:?}");
        let text = hub.metrics().encode();
        assert!(text.lines().any(|l| l == "flotilla_actor_refused_messages_total{slot=\"0\"} 5"), "{text}");
        assert!(text.lines().any(|l| l == "flotilla_actors_connected 0"), "{text}");
        // A new registration (a restarted actor) is served again.
        let again = registration(&hub);
        assert_eq!(hub.live_actors(), 1);
        rt.block_on(hub.ingest(chunk(again.actor_id), MessageKey::NONE)).unwrap();
    }

    #[test]
    fn a_message_sent_again_with_its_key_is_answered_as_delivered_and_taken_once() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (hub, mut rx) = Hub::new(spec(16), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        let key = |sender, seq| MessageKey { sender, seq };
        let taken = |hub: &Hub| hub.ingested.load(Ordering::SeqCst);
        let mut queued = 0;
        let mut drain = |want: usize| {
            while rx.try_recv().is_ok() {
                queued += 1;
            }
            assert_eq!(queued, want, "messages in the learner's queue");
        };
        assert!(rt.block_on(hub.ingest(chunk(id), key(9, 1))).unwrap().accepted);
        assert_eq!(taken(&hub), 2);
        // The answer was lost; the actor re-registered (a new id) and sends the same message again.
        let again = registration(&hub).actor_id;
        let ack = rt.block_on(hub.ingest(chunk(again), key(9, 1))).unwrap();
        assert!(ack.accepted, "a resend of a taken message is answered as delivered");
        assert_eq!((taken(&hub), hub.metrics.duplicates.get()), (2, 1), "not counted twice");
        drain(1);
        // Its next message is taken; an older number again is not; another sender's numbers are its own.
        rt.block_on(hub.ingest(chunk(again), key(9, 2))).unwrap();
        rt.block_on(hub.ingest(chunk(again), key(9, 1))).unwrap();
        rt.block_on(hub.ingest(chunk(again), key(10, 1))).unwrap();
        assert_eq!((taken(&hub), hub.metrics.duplicates.get()), (6, 2));
        drain(3);
        // A refused message does not take its key: the corrected message with that number is taken.
        let mut bad = chunk(again);
        bad.actions[0] = 7.0;
        rt.block_on(hub.ingest(bad, key(9, 3))).unwrap_err();
        rt.block_on(hub.ingest(chunk(again), key(9, 3))).unwrap();
        // Messages without a key are taken however often they come.
        rt.block_on(hub.ingest(chunk(again), MessageKey::NONE)).unwrap();
        rt.block_on(hub.ingest(chunk(again), MessageKey::NONE)).unwrap();
        assert_eq!((taken(&hub), hub.metrics.duplicates.get()), (12, 2));
        drain(6);
        // A message the queue did not take because the run ended gives its key back: sent again (its answer
        // lost), it is answered as its first copy was, not taken, rather than as delivered.
        let Arrival::First(copy) = hub.first_arrival(key(9, 4)) else { panic!("a new number is a first arrival") };
        // Taken as ingest takes it; then the run ends before it is queued.
        hub.finish();
        rx.close();
        let answer = rt.block_on(hub.enqueue(Delivery::Chunk(chunk(again)), None, &copy));
        let first = copy.answered(answer).unwrap();
        let resent = rt.block_on(hub.ingest(chunk(again), key(9, 4))).unwrap();
        assert!(first.finished && !first.accepted && resent.finished && !resent.accepted, "{first:?} {resent:?}");
        assert_eq!(hub.taken.lock().unwrap()[&9].highest, 3, "the untaken message's key was given back");
        assert_eq!(hub.metrics.duplicates.get(), 2, "not answered as a duplicate");
    }

    /// A copy that arrives while the first is still being answered (an A3C gradient waiting to be applied; a
    /// chunk waiting for room in the queue) gets the first copy's answer, when it comes; a first copy whose
    /// call ends before the queue took it gives its key back, so the copy sent after it is taken.
    #[test]
    fn a_copy_sent_while_the_first_is_answered_gets_the_same_answer() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (hub, mut rx) = Hub::new(HubSpec { family: Family::Gradients, synchronous: true, ..spec(4) }, vec![0.0; 3]);
        let actor_id = registration(&hub).actor_id;
        let gradient = Gradient { actor_id, policy_version: 0, values: vec![0.5; 3], env_steps: 2, episodes: vec![] };
        let key = MessageKey { sender: 5, seq: 1 };
        let (h, g) = (hub.clone(), gradient.clone());
        let first = rt.spawn(async move { h.gradient(g, key).await });
        let Some(Delivery::Gradient(_, receipt)) = next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)) else {
            panic!("the gradient is queued at once")
        };
        let (h, g) = (hub.clone(), gradient.clone());
        let again = rt.spawn(async move { h.gradient(g, key).await });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!again.is_finished(), "the copy is not answered before the first copy's gradient is applied");
        hub.publish(vec![1.0; 3]);
        drop(receipt);
        let (a, b) = (rt.block_on(first).unwrap().unwrap(), rt.block_on(again).unwrap().unwrap());
        assert!(a.accepted && b.accepted && b.policy_version == 1, "{a:?} {b:?}");
        assert!(rx.try_recv().is_err(), "taken once");

        // Chunks into a full queue (1): the first copy of message 1 waits for room, and its call ends there.
        let (hub, mut rx) = Hub::new(spec(1), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        let key = MessageKey { sender: 6, seq: 1 };
        let h = hub.clone();
        let first = rt.spawn(async move { h.ingest(chunk(id), key).await });
        std::thread::sleep(Duration::from_millis(100));
        let h = hub.clone();
        let again = rt.spawn(async move { h.ingest(chunk(id), key).await });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!first.is_finished() && !again.is_finished(), "both wait: the queue is full");
        first.abort();
        let refused = rt.block_on(again).unwrap().unwrap_err();
        assert_eq!(refused.code, Code::Unavailable, "the copy waiting on a dropped first copy: {refused}");
        assert!(refused.message.contains("send it again"), "{refused}");
        assert_eq!(hub.ingested.load(Ordering::SeqCst), 2, "the dropped copy's steps left the account");
        // Sent again, it is a first arrival: taken once there is room.
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some());
        assert!(rt.block_on(hub.ingest(chunk(id), key)).unwrap().accepted);
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some());
        assert_eq!(hub.metrics.duplicates.get(), 1, "only the copy that waited was a duplicate");
        assert_eq!(hub.ingested.load(Ordering::SeqCst), 4, "counted once");
    }

    #[test]
    fn accepted_env_steps_reach_the_ingest_ledger_refused_ones_do_not() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (hub, _rx) = Hub::new(spec(4), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        // A chunk taken in before the ledger is set counts too (the learner listens before its run directory).
        rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        let dir = std::env::temp_dir().join(format!("flotilla-hub-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        hub.record_ingest_to(crate::run_dir::IngestLedger::open(&dir, 1000).unwrap(), 1000);
        assert_eq!(crate::run_dir::IngestLedger::read(&dir), Some(1002), "the checkpoint's 1000 + one 2-step chunk");
        rt.block_on(hub.ingest(chunk(id), MessageKey::NONE)).unwrap();
        let mut bad = chunk(id);
        bad.actions[0] = 7.0;
        rt.block_on(hub.ingest(bad, MessageKey::NONE)).unwrap_err();
        assert_eq!(crate::run_dir::IngestLedger::read(&dir), Some(1004), "refused steps are not taken in");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parameters_are_versioned_and_only_sent_when_newer() {
        let (hub, _rx) = Hub::new(spec(4), vec![0.0; 3]);
        let id = registration(&hub).actor_id;
        assert_eq!(hub.params(id, None).unwrap().unwrap().version, 0);
        assert!(hub.params(id, Some(0)).unwrap().is_none());
        assert_eq!(hub.publish(vec![1.0; 3]), 1);
        let p = hub.params(id, Some(0)).unwrap().unwrap();
        assert_eq!((p.version, p.value.as_slice()), (1, &[1.0f32; 3][..]));
        // A chunk claiming a version never published is refused.
        let mut c = chunk(id);
        c.policy_version = 7;
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(
            rt.block_on(hub.ingest(c, MessageKey::NONE))
                .unwrap_err()
                .message
                .contains("policy version 7 was never published")
        );
    }

    #[test]
    fn a_silent_actor_is_lost_once_then_reconnects_a_waiting_one_is_not_lost_and_all_hear_the_end() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (hub, mut rx) = Hub::new(HubSpec { synchronous: true, ..spec(4) }, vec![0.0; 3]);
        let (quiet, waiting) = (registration(&hub).actor_id, registration(&hub).actor_id);
        assert!(hub.note_silent_for(Duration::from_millis(50)).is_empty(), "both just registered");
        // `waiting` has a chunk in flight (a synchronous ack waits for the update); `quiet` sends nothing.
        let h = hub.clone();
        let pending = rt.spawn(async move { h.ingest(chunk(waiting), MessageKey::NONE).await });
        assert!(next_delivery(rt.handle(), &mut rx, Duration::from_secs(1)).is_some());
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(hub.note_silent_for(Duration::from_millis(50)), vec![quiet]);
        assert!(hub.note_silent_for(Duration::from_millis(50)).is_empty(), "lost is noted once");
        // Its next message reconnects it: silent again only after another full silence.
        hub.params(quiet, None).unwrap();
        assert!(!hub.actors.lock().unwrap().by_id[&quiet].lost);
        assert!(hub.note_silent_for(Duration::from_millis(50)).is_empty());
        hub.publish(vec![1.0; 3]);
        rt.block_on(pending).unwrap().unwrap();
        assert!(hub.actors.lock().unwrap().by_id.values().all(|e| e.in_flight == 0));
        // Nothing is lost once the run is over.
        std::thread::sleep(Duration::from_millis(100));
        hub.finish();
        assert!(hub.note_silent_for(Duration::from_millis(50)).is_empty());
        // The learner waits for both to hear that the run is over: each is told by its next ack.
        assert_eq!(hub.wait_until_actors_told(Duration::ZERO), 2);
        assert!(rt.block_on(hub.ingest(chunk(quiet), MessageKey::NONE)).unwrap().finished);
        assert_eq!(hub.wait_until_actors_told(Duration::ZERO), 1);
        assert!(rt.block_on(hub.ingest(chunk(waiting), MessageKey::NONE)).unwrap().finished);
        assert_eq!(hub.wait_until_actors_told(Duration::from_secs(5)), 0);
    }
}
