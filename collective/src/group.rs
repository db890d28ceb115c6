//! A c10d process group: the rendezvous store, the Gloo (or NCCL) backend, and the collectives a data-parallel
//! learner needs, each returning `Result` — a lost rank or a timeout is an error naming what was lost, never a
//! hang or an abort.
use std::ffi::{CString, c_char};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use crate::ffi::{self, RawGroup, RawStore};
use crate::rendezvous::Rendezvous;
use crate::{Error, Result};

/// Which c10d backend carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors (and CUDA tensors, staged through the host).
    Gloo,
    /// NCCL: CUDA tensors, one GPU per rank.
    Nccl,
}

impl Backend {
    /// NCCL where the device is CUDA and this build has it, Gloo otherwise (as torch.distributed picks).
    pub fn auto(device: Device) -> Backend {
        if device.is_cuda() && has_nccl() { Backend::Nccl } else { Backend::Gloo }
    }

    /// The name torch.distributed gives it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }
}

/// Whether this build can create NCCL groups (built against the CUDA libtorch with `FLOTILLA_CUDA=1`).
pub fn has_nccl() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { ffi::flc_has_nccl() != 0 }
}

/// How a group is made.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// The backend.
    pub backend: Backend,
    /// The longest any collective may wait for the other ranks.
    pub timeout: Duration,
    /// The longest the rendezvous may wait for every rank to join.
    pub rendezvous_timeout: Duration,
    /// How often each rank tells the store it is alive (what names a lost rank after a failure).
    pub heartbeat: Duration,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            backend: Backend::Gloo,
            timeout: Duration::from_secs(60),
            rendezvous_timeout: Duration::from_secs(120),
            heartbeat: Duration::from_millis(500),
        }
    }
}

/// A client of the rendezvous store (a c10d TCPStore, keys under this attempt's prefix).
pub struct Store {
    raw: *mut RawStore,
}

// SAFETY: a c10d store client may move between threads; `Store` is not `Sync`, so one thread uses it at a time.
unsafe impl Send for Store {}

impl Store {
    fn cstring(text: &str) -> Result<CString> {
        CString::new(text).map_err(|_| Error::Store(format!("{text:?} contains a NUL byte")))
    }

    /// Connect to the store of `rendezvous` (serving it if this rank hosts it), waiting up to `timeout`.
    pub fn connect(rendezvous: &Rendezvous, timeout: Duration) -> Result<Store> {
        let addr = Self::cstring(&rendezvous.master_addr)?;
        let prefix = Self::cstring(&format!("flotilla/{}/", rendezvous.restart_count))?;
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid C strings; the shim reports failure through `err`.
        let raw = unsafe {
            ffi::flc_store_connect(
                addr.as_ptr(),
                rendezvous.master_port as i32,
                rendezvous.hosts_store() as i32,
                rendezvous.world_size as i32,
                timeout.as_millis() as i64,
                prefix.as_ptr(),
                &mut err,
            )
        };
        if raw.is_null() {
            let what = if rendezvous.hosts_store() { "serve" } else { "reach" };
            return Err(Error::Rendezvous(format!(
                "rank {} could not {what} the rendezvous store at {}:{} within {:?}: {}",
                rendezvous.rank,
                rendezvous.master_addr,
                rendezvous.master_port,
                timeout,
                ffi::take_error(err)
            )));
        }
        Ok(Store { raw })
    }

    /// Another connection to the same store, for another thread.
    pub fn try_clone(&self) -> Result<Store> {
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `self.raw` is live.
        let raw = unsafe { ffi::flc_store_clone(self.raw, &mut err) };
        if raw.is_null() {
            return Err(Error::Store(ffi::take_error(err)));
        }
        Ok(Store { raw })
    }

    /// Set `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let k = Self::cstring(key)?;
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `value` outlives the call; the shim copies it.
        let rc = unsafe { ffi::flc_store_set(self.raw, k.as_ptr(), value.as_ptr(), value.len(), &mut err) };
        if rc != 0 {
            return Err(Error::Store(format!("set {key:?}: {}", ffi::take_error(err))));
        }
        Ok(())
    }

    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let k = Self::cstring(key)?;
        let mut err: *mut c_char = std::ptr::null_mut();
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: out-pointers are valid; on success the shim malloc'd `len` bytes at `data`.
        let rc = unsafe {
            ffi::flc_store_get(self.raw, k.as_ptr(), timeout.as_millis() as i64, &mut data, &mut len, &mut err)
        };
        if rc != 0 {
            return Err(Error::Store(format!("get {key:?}: {}", ffi::take_error(err))));
        }
        // SAFETY: see above; freed right after the copy.
        let value = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
        unsafe { ffi::flc_free_bytes(data.cast()) };
        Ok(value)
    }

    /// Add `delta` to the counter at `key` (0 when absent); the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let k = Self::cstring(key)?;
        let mut err: *mut c_char = std::ptr::null_mut();
        let mut out = 0i64;
        // SAFETY: valid pointers.
        let rc = unsafe { ffi::flc_store_add(self.raw, k.as_ptr(), delta, &mut out, &mut err) };
        if rc != 0 {
            return Err(Error::Store(format!("add {key:?}: {}", ffi::take_error(err))));
        }
        Ok(out)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { ffi::flc_store_free(self.raw) }
    }
}

/// A thread that bumps `heartbeat/<rank>` in the store every period, so that after a failed collective the
/// survivors can tell which ranks stopped.
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn start(mut store: Store, rank: usize, period: Duration) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("heartbeat-{rank}"))
            .spawn(move || {
                let key = format!("heartbeat/{rank}");
                while !flag.load(Ordering::Relaxed) {
                    if store.add(&key, 1).is_err() {
                        return; // the store is gone: nothing to report to
                    }
                    let until = Instant::now() + period;
                    while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
            .expect("spawning a thread");
        Heartbeat { stop, thread: Some(thread) }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One rank's membership of a data-parallel group.
pub struct ProcessGroup {
    raw: *mut RawGroup,
    store: Store,
    rendezvous: Rendezvous,
    options: GroupOptions,
    _heartbeat: Heartbeat,
}

// SAFETY: a c10d backend may be driven from any one thread at a time; `ProcessGroup` is not `Sync`.
unsafe impl Send for ProcessGroup {}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rendezvous.rank)
            .field("world_size", &self.rendezvous.world_size)
            .field("backend", &self.options.backend)
            .finish()
    }
}

impl ProcessGroup {
    /// Join the group: connect to the store, check that every rank brings the same `fingerprint` (a hash of
    /// the resolved config: ranks started with different configs are refused here, before any training),
    /// then create the backend, which waits for every rank.
    pub fn connect(rendezvous: &Rendezvous, options: &GroupOptions, fingerprint: &[u8]) -> Result<ProcessGroup> {
        rendezvous.check()?;
        if options.backend == Backend::Nccl && !has_nccl() {
            return Err(Error::Rendezvous(
                "backend nccl: this build has no NCCL (it needs the CUDA libtorch: FLOTILLA_CUDA=1 bash \
                 scripts/setup.sh, on a machine with a GPU); use gloo"
                    .into(),
            ));
        }
        let mut store = Store::connect(rendezvous, options.rendezvous_timeout)?;
        let (rank, world) = (rendezvous.rank, rendezvous.world_size);
        store.set(&format!("fingerprint/{rank}"), fingerprint)?;
        let mut mismatch = None;
        for other in 0..world {
            let theirs = store.get(&format!("fingerprint/{other}"), options.rendezvous_timeout).map_err(|e| {
                Error::Rendezvous(format!(
                    "rank {other} of {world} did not join within {:?} (rank {rank} waited at {}:{}): {e}",
                    options.rendezvous_timeout, rendezvous.master_addr, rendezvous.master_port
                ))
            })?;
            if theirs != fingerprint && mismatch.is_none() {
                mismatch = Some((other, theirs));
            }
        }
        if let Some((other, theirs)) = mismatch {
            // The store's host stays until every rank has read every fingerprint: leaving at once would take
            // the store with it, and the others would report it missing instead of the configs differing.
            store.add("fingerprints_read", 1)?;
            if rendezvous.hosts_store() {
                let deadline = Instant::now() + options.rendezvous_timeout;
                while store.add("fingerprints_read", 0)? < world as i64 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            return Err(Error::Rendezvous(format!(
                "rank {other} was started with a different config than rank {rank} (config hashes {} and {}): \
                 every rank must run the same resolved config",
                hex(&theirs),
                hex(fingerprint)
            )));
        }
        let ifname = CString::new(rendezvous.ifname.clone().unwrap_or_default())
            .map_err(|_| Error::Rendezvous("GLOO_SOCKET_IFNAME contains a NUL byte".into()))?;
        // On one host, bind Gloo to loopback: the address the hostname resolves to may not be routable.
        let host = if rendezvous.ifname.is_none() && rendezvous.is_loopback() { "127.0.0.1" } else { "" };
        let hostname = CString::new(host).expect("no NUL");
        let backend = match options.backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid store and C strings.
        let raw = unsafe {
            ffi::flc_group_new(
                store.raw,
                rank as i32,
                world as i32,
                backend,
                ifname.as_ptr(),
                hostname.as_ptr(),
                rendezvous.local_rank as i32,
                options.timeout.as_millis() as i64,
                &mut err,
            )
        };
        if raw.is_null() {
            return Err(Error::Rendezvous(format!(
                "rank {rank}: creating the {} group of {world} failed: {}",
                options.backend.name(),
                ffi::take_error(err)
            )));
        }
        let heartbeat = Heartbeat::start(store.try_clone()?, rank, options.heartbeat);
        Ok(ProcessGroup { raw, store, rendezvous: rendezvous.clone(), options: options.clone(), _heartbeat: heartbeat })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rendezvous.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.rendezvous.world_size
    }

    /// The backend carrying the collectives.
    pub fn backend(&self) -> Backend {
        self.options.backend
    }

    /// The rendezvous store (for small agreements: keys, counters).
    pub fn store(&mut self) -> &mut Store {
        &mut self.store
    }

    fn check_tensor(&self, op: &str, t: &Tensor) -> Result<()> {
        if !t.is_contiguous() {
            return Err(Error::Tensor(format!("{op}: the tensor must be contiguous")));
        }
        if self.options.backend == Backend::Nccl && !t.device().is_cuda() {
            return Err(Error::Tensor(format!("{op}: NCCL carries CUDA tensors only, got one on {:?}", t.device())));
        }
        Ok(())
    }

    /// Turn a failed collective into an error that names the ranks that stopped, if any did. Each survivor
    /// counts its diagnosis in the store; the rank that serves the store keeps serving it until every survivor
    /// has one (at most a collective timeout and a diagnosis later). Otherwise it would exit first, taking the
    /// store with it, and a survivor whose collective fails later (when the timeout or this rank's exit ends
    /// it) would find the store gone and name this rank instead of the one that was lost.
    fn failed(&mut self, op: &str, message: String) -> Error {
        // Said before the diagnosis: a survivor that exits after its own diagnosis stops its heartbeat too, and
        // another survivor still diagnosing must not count it as lost.
        let _ = self.store.add(&format!("failed/{}", self.rank()), 1);
        let lost = self.lost_ranks();
        let _ = self.store.add("diagnosed", 1);
        if self.rendezvous.hosts_store() {
            let survivors = match &lost {
                Lost::Ranks(r) => self.world_size().saturating_sub(r.len()),
                Lost::Store => self.world_size(),
            } as i64;
            let deadline = Instant::now() + self.options.timeout + self.options.heartbeat * 4;
            while Instant::now() < deadline && self.store.add("diagnosed", 0).is_ok_and(|n| n < survivors) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Error::Collective { op: op.to_string(), rank: self.rank(), lost, message }
    }

    /// The ranks whose heartbeat stopped: read every counter, wait three heartbeat periods, read again. A rank
    /// whose heartbeat stopped after it said its own collective failed was alive at the failure (it diagnosed
    /// and exited) and is not lost. If the store itself is gone, the rank that served it (rank 0, unless an agent
    /// serves it) is the lost one.
    fn lost_ranks(&mut self) -> Lost {
        let world = self.world_size();
        let read = |store: &mut Store| -> Option<Vec<i64>> {
            (0..world).map(|r| store.add(&format!("heartbeat/{r}"), 0).ok()).collect()
        };
        let Some(before) = read(&mut self.store) else {
            return if self.rendezvous.agent_store { Lost::Store } else { Lost::Ranks(vec![0]) };
        };
        std::thread::sleep(self.options.heartbeat * 3);
        let Some(after) = read(&mut self.store) else {
            return if self.rendezvous.agent_store { Lost::Store } else { Lost::Ranks(vec![0]) };
        };
        let me = self.rank();
        let store = &mut self.store;
        Lost::Ranks(
            (0..world)
                .filter(|&r| r != me && after[r] == before[r])
                .filter(|&r| store.add(&format!("failed/{r}"), 0).map_or(true, |n| n == 0))
                .collect(),
        )
    }

    /// Sum `t` over all ranks, in place.
    pub fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<()> {
        self.check_tensor("all_reduce", t)?;
        if self.world_size() == 1 {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: live group and tensor.
        let rc = unsafe { ffi::flc_all_reduce_sum(self.raw, ffi::at(t), &mut err) };
        if rc != 0 {
            let message = ffi::take_error(err);
            return Err(self.failed("all_reduce", message));
        }
        Ok(())
    }

    /// Average `t` over all ranks, in place (Gloo has no average: sum, then scale by 1/world).
    pub fn all_reduce_mean(&mut self, t: &mut Tensor) -> Result<()> {
        self.all_reduce_sum(t)?;
        if self.world_size() > 1 {
            let _ =
                t.f_mul_(&Tensor::from(1.0 / self.world_size() as f64)).map_err(|e| Error::Tensor(e.to_string()))?;
        }
        Ok(())
    }

    /// Make every rank's `t` equal rank `root`'s, in place.
    pub fn broadcast(&mut self, t: &mut Tensor, root: usize) -> Result<()> {
        self.check_tensor("broadcast", t)?;
        if root >= self.world_size() {
            return Err(Error::Tensor(format!("broadcast from rank {root} in a world of {}", self.world_size())));
        }
        if self.world_size() == 1 {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: live group and tensor.
        let rc = unsafe { ffi::flc_broadcast(self.raw, ffi::at(t), root as i32, &mut err) };
        if rc != 0 {
            let message = ffi::take_error(err);
            return Err(self.failed("broadcast", message));
        }
        Ok(())
    }

    /// Every rank's `t`, stacked in rank order: `[world, *t.shape]`.
    pub fn all_gather(&mut self, t: &Tensor) -> Result<Tensor> {
        self.check_tensor("all_gather", t)?;
        let mut shape = vec![self.world_size() as i64];
        shape.extend(t.size());
        let mut out = Tensor::empty(shape.as_slice(), (t.kind(), t.device()));
        if self.world_size() == 1 {
            out.get(0).copy_(t);
            return Ok(out);
        }
        let mut input = t.shallow_clone();
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: live group; `out` has room for every rank's input.
        let rc = unsafe { ffi::flc_all_gather(self.raw, ffi::at(&mut out), ffi::at(&mut input), &mut err) };
        if rc != 0 {
            let message = ffi::take_error(err);
            return Err(self.failed("all_gather", message));
        }
        Ok(out)
    }

    /// Wait until every rank gets here.
    pub fn barrier(&mut self) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: live group.
        let rc = unsafe { ffi::flc_barrier(self.raw, &mut err) };
        if rc != 0 {
            let message = ffi::take_error(err);
            return Err(self.failed("barrier", message));
        }
        Ok(())
    }

    /// Check that every rank holds the same `values` (for example the parameters after a synchronous step):
    /// gather a checksum of each rank's copy and compare them. Silent divergence becomes an error naming the
    /// ranks that differ from rank 0.
    pub fn check_identical(&mut self, what: &str, values: &Tensor) -> Result<()> {
        let sum = checksum(values);
        let all = self.all_gather(&sum)?;
        let sums: Vec<f64> = Vec::<f64>::try_from(all.to_device(Device::Cpu).flatten(0, -1))
            .map_err(|e| Error::Tensor(e.to_string()))?;
        let of_rank = |r: usize| &sums[2 * r..2 * r + 2];
        let differ: Vec<usize> = (1..self.world_size()).filter(|&r| of_rank(r) != of_rank(0)).collect();
        if differ.is_empty() { Ok(()) } else { Err(Error::Diverged { what: what.to_string(), ranks: differ }) }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once; the store outlives it (dropped after).
        unsafe { ffi::flc_group_free(self.raw) }
    }
}

/// A two-number fingerprint of a tensor's values: the sum and the position-weighted sum, in f64 — equal on
/// ranks that hold the same bits, different (with overwhelming likelihood) where any element differs.
fn checksum(values: &Tensor) -> Tensor {
    let flat = values.detach().flatten(0, -1).to_kind(Kind::Double);
    let weights = Tensor::arange(flat.size()[0], (Kind::Double, flat.device())).g_mul_scalar(1e-6).g_add_scalar(1.0);
    Tensor::stack(&[flat.sum(Kind::Double), (&flat * weights).sum(Kind::Double)], 0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What a failed collective lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// These ranks stopped sending heartbeats (empty: none did; the failure was something else, e.g. a timeout).
    Ranks(Vec<usize>),
    /// The rendezvous store (served by torchrun's agent) is unreachable.
    Store,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Ranks(r) if r.is_empty() => write!(f, "no rank stopped its heartbeat"),
            Lost::Ranks(r) if r == &[0] => write!(f, "lost rank 0 (it served the rendezvous store, now unreachable)"),
            Lost::Ranks(r) => {
                let list: Vec<String> = r.iter().map(|r| r.to_string()).collect();
                write!(f, "lost rank{} {}", if r.len() == 1 { "" } else { "s" }, list.join(", "))
            }
            Lost::Store => write!(f, "the rendezvous store is unreachable"),
        }
    }
}
