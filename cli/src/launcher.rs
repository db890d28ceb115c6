//! Actor processes kept alive for a run: `flotilla train CONFIG --actors N` (whose supervisor, `supervise`, runs
//! the learner as a child process beside them) and a `flotilla learner` that launches its own actors (a rank of
//! `--learners L`) start N actor processes through a `Launcher` and keep them alive until the run ends.
//!
//! ```text
//! install_stop_signals()        SIGINT/SIGTERM set a flag; a second one exits at once with code 130
//! Launcher::start(n, command, config)
//!   supervisor thread: spawn slots 0..n (stdin null, stdout/stderr inherited, parent-death signal SIGTERM)
//!   every 50 ms, for each slot:
//!     child exited?  warn!, wait the backoff (doubling up to 5 s), respawn, info!
//!                    after max_restarts for that slot: error!, the slot stays empty
//!                    with exit status 0 (the actor finished: the learner ended the run): info!, no restart
//!     stop signal received?  exits are expected: no restarts
//! ... the learner trains, polling the stop flag ...
//! Launcher::stop(grace), or drop
//!   SIGTERM every child, wait up to `grace`, SIGKILL the rest, reap them all
//! ```
//!
//! Children stay in the launcher's process group, so a Ctrl-C in the terminal reaches them too; `stop` does not
//! rely on that and still ends children that ignore SIGTERM. On Linux each child also asks the kernel for
//! SIGTERM when its parent dies (`PR_SET_PDEATHSIG`), so actors do not outlive a launcher that is SIGKILLed.
//! That signal follows the *thread* that spawned the child, which is why every child, the first ones
//! included, is spawned by the supervisor thread, which lives exactly as long as the children should.
//!
//! ```ignore
//! use std::sync::atomic::Ordering;
//! use std::time::Duration;
//! use crate::launcher::{self, ActorCommand, Launcher, LauncherConfig};
//!
//! let stop = launcher::install_stop_signals();
//! let token = launcher::generate_token()?;
//! let exe = std::env::current_exe()?;
//! let mut actors = Launcher::start(
//!     4,
//!     move |slot| ActorCommand {
//!         program: exe.clone(),
//!         args: vec!["actor".into(), "--index".into(), slot.to_string()],
//!         env: vec![("FLOTILLA_TOKEN".into(), token.clone())],
//!     },
//!     LauncherConfig::default(),
//! )?;
//! while !stop.load(Ordering::Relaxed) {
//!     // ... one training iteration ...
//! #   break;
//! }
//! actors.stop(Duration::from_secs(5));
//! # Ok::<(), std::io::Error>(())
//! ```
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

/// How often the supervisor polls its children.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// The restart backoff doubles up to this (or up to `restart_backoff`, if that is longer).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long `Drop` lets children exit after SIGTERM before killing them.
const DROP_GRACE: Duration = Duration::from_secs(2);

/// One actor's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorCommand {
    /// The executable; a bare name is looked up in `PATH`.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to (or replacing ones in) the inherited environment.
    pub env: Vec<(String, String)>,
}

/// How hard the launcher tries to keep actors alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LauncherConfig {
    /// Restarts allowed per slot over the whole run; past that the slot stays empty.
    pub max_restarts: u32,
    /// Delay before a slot's first restart; it doubles with each later restart of that slot, up to 5 s.
    pub restart_backoff: Duration,
}

impl Default for LauncherConfig {
    /// Ten restarts per slot, the first after half a second.
    fn default() -> Self {
        Self { max_restarts: 10, restart_backoff: Duration::from_millis(500) }
    }
}

/// N actor processes, each in a numbered slot, kept alive by a supervisor thread until [`Launcher::stop`] or drop.
pub struct Launcher {
    shared: Arc<Shared>,
    /// `None` once stopped.
    supervisor: Option<JoinHandle<()>>,
}

/// What the caller's thread and the supervisor thread share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the supervisor early when `stop` is requested.
    wake: Condvar,
}

struct State {
    slots: Vec<Slot>,
    /// Restarts attempted so far, over all slots.
    restarts: u32,
    /// Set by `stop`: the grace period the supervisor should give its children.
    stop: Option<Duration>,
}

struct Slot {
    process: Process,
    /// Restarts attempted in this slot so far.
    restarts: u32,
}

enum Process {
    Running(Child),
    /// Exited; respawn at this time.
    Restarting(Instant),
    /// Given up on, or stopped.
    Empty,
}

impl Launcher {
    /// Start `n` children; `command(i)` gives slot i's command line, and is called again for each restart.
    /// Fails, with no child left running, if any of the first `n` cannot be spawned.
    pub fn start(
        n: usize,
        command: impl Fn(usize) -> ActorCommand + Send + 'static,
        config: LauncherConfig,
    ) -> io::Result<Launcher> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { slots: Vec::new(), restarts: 0, stop: None }),
            wake: Condvar::new(),
        });
        let (started_tx, started_rx) = mpsc::sync_channel(1);
        let thread_shared = Arc::clone(&shared);
        let supervisor = thread::Builder::new().name("flotilla-launcher".into()).spawn(move || {
            // Spawned here rather than by the caller: the parent-death signal is tied to the spawning thread.
            let mut children = Vec::with_capacity(n);
            for slot in 0..n {
                match spawn(&command(slot)) {
                    Ok(child) => children.push((slot, child)),
                    Err(e) => {
                        terminate(children, Duration::ZERO);
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                }
            }
            for (slot, child) in &children {
                debug!(slot, "started actor in slot {slot} (pid {})", child.id());
            }
            lock(&thread_shared.state).slots =
                children.into_iter().map(|(_, child)| Slot { process: Process::Running(child), restarts: 0 }).collect();
            let _ = started_tx.send(Ok(()));
            supervise(&thread_shared, &command, config);
        })?;
        match started_rx.recv() {
            Ok(Ok(())) => {
                info!("started {n} actor processes");
                Ok(Launcher { shared, supervisor: Some(supervisor) })
            }
            Ok(Err(e)) => {
                let _ = supervisor.join();
                Err(e)
            }
            Err(_) => {
                let _ = supervisor.join();
                Err(io::Error::other("the launcher thread panicked while starting actors"))
            }
        }
    }

    /// Pids of the live children by slot (`None` while a slot is between restarts, given up on, or stopped).
    #[cfg_attr(not(test), allow(dead_code))] // Only the supervisor's tests look at the pids.
    pub fn pids(&self) -> Vec<Option<u32>> {
        lock(&self.shared.state)
            .slots
            .iter()
            .map(|slot| match &slot.process {
                Process::Running(child) => Some(child.id()),
                Process::Restarting(_) | Process::Empty => None,
            })
            .collect()
    }

    /// Total restarts attempted so far, over all slots.
    pub fn restarts(&self) -> u32 {
        lock(&self.shared.state).restarts
    }

    /// Stop every child: SIGTERM, wait up to `grace`, then SIGKILL; reap all. Returns once every child has
    /// been reaped. Idempotent; also run by `Drop` (with a 2 s grace).
    pub fn stop(&mut self, grace: Duration) {
        let Some(supervisor) = self.supervisor.take() else { return };
        lock(&self.shared.state).stop = Some(grace);
        self.shared.wake.notify_all();
        if supervisor.join().is_err() {
            error!("the launcher thread panicked; stopping its actors from here");
        }
        // Normally empty: the supervisor ends its own children. This covers a supervisor that panicked.
        let left = take_running(&mut lock(&self.shared.state).slots);
        terminate(left, grace);
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.stop(DROP_GRACE);
    }
}

/// The supervisor loop: poll, restart, and on `stop` end every child.
fn supervise(shared: &Shared, command: &dyn Fn(usize) -> ActorCommand, config: LauncherConfig) {
    let mut state = lock(&shared.state);
    loop {
        if let Some(grace) = state.stop {
            let children = take_running(&mut state.slots);
            drop(state);
            if !children.is_empty() {
                info!("stopping {} actor processes", children.len());
            }
            terminate(children, grace);
            return;
        }
        let now = Instant::now();
        let mut restarted = 0;
        for (index, slot) in state.slots.iter_mut().enumerate() {
            restarted += check_slot(index, slot, command, config, now);
        }
        state.restarts += restarted;
        state = shared.wake.wait_timeout(state, POLL_INTERVAL).unwrap_or_else(PoisonError::into_inner).0;
    }
}

/// Poll one slot: notice an exit, or respawn once the backoff has passed. Returns the restarts attempted (0 or 1).
fn check_slot(
    index: usize,
    slot: &mut Slot,
    command: &dyn Fn(usize) -> ActorCommand,
    config: LauncherConfig,
    now: Instant,
) -> u32 {
    match &mut slot.process {
        Process::Running(child) => {
            let pid = child.id();
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) if status.success() => {
                    // An actor exits 0 only when it is done: the learner told it the run is over.
                    info!(slot = index, pid, "actor in slot {index} (pid {pid}) finished; not restarting it");
                    slot.process = Process::Empty;
                }
                Ok(Some(status)) => slot.process = after_exit(index, slot.restarts, config, now, &exited(pid, status)),
                Err(e) => warn!(slot = index, pid, "cannot poll the actor in slot {index} (pid {pid}): {e}"),
            }
            0
        }
        Process::Restarting(at) if now >= *at => {
            if stop_signalled() {
                info!(slot = index, "not restarting slot {index}: a stop signal was received");
                slot.process = Process::Empty;
                return 0;
            }
            slot.restarts += 1;
            let restart = slot.restarts;
            let command = command(index);
            slot.process = match spawn(&command) {
                Ok(child) => {
                    info!(
                        slot = index,
                        pid = child.id(),
                        "restarted the actor in slot {index} (pid {}, restart {restart} of {})",
                        child.id(),
                        config.max_restarts
                    );
                    Process::Running(child)
                }
                Err(e) => after_exit(index, restart, config, now, &e.to_string()),
            };
            1
        }
        Process::Restarting(_) | Process::Empty => 0,
    }
}

/// What a slot does after its child exited or failed to spawn (`what`): restart after the backoff, or give up.
fn after_exit(index: usize, restarts: u32, config: LauncherConfig, now: Instant, what: &str) -> Process {
    if stop_signalled() {
        info!(slot = index, "actor in slot {index} {what} after a stop signal; not restarting");
        Process::Empty
    } else if restarts >= config.max_restarts {
        warn!(slot = index, "actor in slot {index} {what}");
        error!(slot = index, "slot {index} used all {} restarts; leaving it empty", config.max_restarts);
        Process::Empty
    } else {
        let delay = backoff(config.restart_backoff, restarts);
        warn!(slot = index, "actor in slot {index} {what}; restarting in {delay:?}");
        Process::Restarting(now + delay)
    }
}

/// "(pid 123) exited: exit status: 1" or "(pid 123) exited: signal: 9 (SIGKILL)".
fn exited(pid: u32, status: ExitStatus) -> String {
    format!("(pid {pid}) exited: {status}")
}

/// The delay before a slot's restart number `restarts + 1`: `first`, doubling, capped at 5 s (or `first`).
fn backoff(first: Duration, restarts: u32) -> Duration {
    first.saturating_mul(2u32.saturating_pow(restarts)).min(first.max(MAX_BACKOFF))
}

/// Spawn one actor: stdin null, stdout and stderr inherited, SIGTERM on the parent's death (Linux).
pub(crate) fn spawn(actor: &ActorCommand) -> io::Result<Child> {
    let mut command = Command::new(&actor.program);
    command
        .args(&actor.args)
        .envs(actor.env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs between fork and exec, so it only makes async-signal-safe calls (prctl,
        // getppid) and builds errors without allocating.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect; then no signal would ever come.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    command
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start actor {}: {e}", actor.program.display())))
}

/// Take every running child out of `slots`, leaving the slots empty.
fn take_running(slots: &mut [Slot]) -> Vec<(usize, Child)> {
    let mut children = Vec::new();
    for (index, slot) in slots.iter_mut().enumerate() {
        if let Process::Running(child) = std::mem::replace(&mut slot.process, Process::Empty) {
            children.push((index, child));
        }
    }
    children
}

/// SIGTERM every child, wait up to `grace` for them to exit, SIGKILL the rest, and reap them all.
pub(crate) fn terminate(mut children: Vec<(usize, Child)>, grace: Duration) {
    for (_, child) in &children {
        // SAFETY: kill(2) has no memory-safety preconditions. The child is not reaped yet, so its pid
        // cannot have been reused by another process.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    loop {
        children.retain_mut(|(slot, child)| match child.try_wait() {
            Ok(Some(status)) => {
                debug!(slot = *slot, "actor in slot {slot} {}", exited(child.id(), status));
                false
            }
            Ok(None) | Err(_) => true,
        });
        if children.is_empty() || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    for (slot, mut child) in children {
        warn!(slot, "actor in slot {slot} (pid {}) still running {grace:?} after SIGTERM; killing it", child.id());
        let _ = child.kill();
        if let Err(e) = child.wait() {
            error!(slot, "cannot reap the actor in slot {slot} (pid {}): {e}", child.id());
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Stop signals received so far (SIGINT and SIGTERM together).
static STOP_SIGNALS: AtomicU32 = AtomicU32::new(0);
/// The flag `install_stop_signals` returns, leaked so the handler can always reach it.
static STOP_FLAG: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());
/// Write end of the pipe that wakes the thread logging the first signal; -1 without one.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
static INSTALLED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Whether a stop signal has arrived since `install_stop_signals`.
fn stop_signalled() -> bool {
    STOP_SIGNALS.load(Ordering::SeqCst) > 0
}

/// The SIGINT/SIGTERM handler: only atomics, `write` and `_exit`, all async-signal-safe.
extern "C" fn on_stop_signal(_signal: libc::c_int) {
    if STOP_SIGNALS.fetch_add(1, Ordering::SeqCst) > 0 {
        // SAFETY: _exit is async-signal-safe; the second signal means "now".
        unsafe { libc::_exit(130) };
    }
    let flag = STOP_FLAG.load(Ordering::SeqCst);
    if !flag.is_null() {
        // SAFETY: the pointer comes from Arc::into_raw and is never released.
        unsafe { (*flag).store(true, Ordering::SeqCst) };
    }
    let fd = SIGNAL_PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: write(2) from a one-byte buffer on the stack. It runs once (the second signal exits above),
        // so the non-blocking pipe is never full and errno is left alone.
        unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    }
}

/// Install SIGINT and SIGTERM handlers that set the returned flag (and log once); a second Ctrl-C (or SIGTERM)
/// exits the process immediately with code 130. Once the flag is set the launcher stops restarting actors that
/// exit, since a terminal Ctrl-C reaches them too. Calling it again returns the same flag.
pub fn install_stop_signals() -> Arc<AtomicBool> {
    Arc::clone(INSTALLED.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        STOP_FLAG.store(Arc::into_raw(Arc::clone(&flag)).cast_mut(), Ordering::SeqCst);
        match signal_pipe() {
            Ok((read_end, write_end)) => {
                SIGNAL_PIPE.store(write_end, Ordering::SeqCst);
                let spawned = thread::Builder::new().name("flotilla-signals".into()).spawn(move || {
                    let mut byte = [0u8];
                    if read_end.take(1).read_exact(&mut byte).is_ok() {
                        warn!("stop signal received: stopping (press Ctrl-C again to exit immediately)");
                    }
                });
                if let Err(e) = spawned {
                    warn!("cannot start the thread that logs stop signals: {e}");
                }
            }
            Err(e) => warn!("cannot create the pipe that logs stop signals: {e}"),
        }
        // SAFETY: all-zero is a valid `sigaction` (no flags, empty mask); the fields that matter are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
            // SAFETY: `action` is a fully initialised sigaction whose handler is async-signal-safe.
            let installed = unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut())
            };
            if installed != 0 {
                warn!("cannot install a {name} handler: {}", io::Error::last_os_error());
            }
        }
        flag
    }))
}

/// A close-on-exec pipe whose write end does not block: (read end, write end).
fn signal_pipe() -> io::Result<(File, libc::c_int)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    for fd in fds {
        // SAFETY: fcntl on descriptors this function owns. (A child forked before this call cannot see them;
        // one forked between pipe and here inherits them, which is harmless.)
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the read end is a fresh descriptor that nothing else owns.
    Ok((unsafe { File::from_raw_fd(fds[0]) }, fds[1]))
}

/// A random run token: 32 hex characters from `/dev/urandom`.
pub fn generate_token() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_restarts: u32) -> LauncherConfig {
        LauncherConfig { max_restarts, restart_backoff: Duration::from_millis(10) }
    }

    fn sh(script: &str) -> ActorCommand {
        ActorCommand { program: "/bin/sh".into(), args: vec!["-c".into(), script.into()], env: Vec::new() }
    }

    /// Poll `condition` every 10 ms for up to 2 s.
    fn eventually(mut condition: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if condition() {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        condition()
    }

    fn is_gone(pid: u32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        let result = unsafe { libc::kill(pid as libc::pid_t, 0) };
        result == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }

    #[test]
    fn a_killed_child_is_restarted_in_its_slot() {
        let mut launcher = Launcher::start(3, |_| sh("exec sleep 30"), config(3)).unwrap();
        let before = launcher.pids();
        assert!(before.iter().all(Option::is_some), "{before:?}");
        let victim = before[1].unwrap();
        // SAFETY: kill(2) on our own unreaped child.
        assert_eq!(unsafe { libc::kill(victim as libc::pid_t, libc::SIGKILL) }, 0);
        assert!(eventually(|| matches!(launcher.pids()[1], Some(pid) if pid != victim)), "{:?}", launcher.pids());
        let after = launcher.pids();
        assert_eq!((after[0], after[2]), (before[0], before[2]));
        assert_eq!(launcher.restarts(), 1);
        launcher.stop(Duration::from_millis(500));
    }

    #[test]
    fn stop_leaves_no_child_alive_even_if_it_ignores_sigterm() {
        let commands = ["exec sleep 30", "trap '' TERM; exec sleep 30"];
        let mut launcher = Launcher::start(2, move |slot| sh(commands[slot]), config(3)).unwrap();
        // Let the second shell install its trap before it is signalled.
        thread::sleep(Duration::from_millis(100));
        let pids: Vec<u32> = launcher.pids().into_iter().map(Option::unwrap).collect();
        let started = Instant::now();
        launcher.stop(Duration::from_millis(200));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200), "the SIGTERM-ignoring child got no grace: {took:?}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(pids.iter().all(|&pid| is_gone(pid)), "{pids:?}");
        assert_eq!(launcher.pids(), [None, None]);
        launcher.stop(Duration::from_millis(200));
        assert_eq!(launcher.restarts(), 0);
    }

    #[test]
    fn drop_stops_the_children() {
        let launcher = Launcher::start(2, |_| sh("exec sleep 30"), config(3)).unwrap();
        let pids: Vec<u32> = launcher.pids().into_iter().map(Option::unwrap).collect();
        drop(launcher);
        assert!(pids.iter().all(|&pid| is_gone(pid)), "{pids:?}");
    }

    #[test]
    fn a_child_that_exits_0_has_finished_and_is_not_restarted() {
        let mut launcher =
            Launcher::start(2, |slot| sh(if slot == 0 { "exit 0" } else { "exec sleep 30" }), config(3)).unwrap();
        assert!(eventually(|| launcher.pids()[0].is_none()));
        // Backoffs are 10 ms and up: a (wrong) restart would have happened by now.
        thread::sleep(Duration::from_millis(300));
        assert_eq!(launcher.restarts(), 0);
        assert!(launcher.pids()[0].is_none() && launcher.pids()[1].is_some());
        launcher.stop(Duration::from_millis(100));
    }

    #[test]
    fn a_crashing_child_is_restarted_at_most_max_restarts_times() {
        let mut launcher = Launcher::start(1, |_| sh("exit 3"), config(2)).unwrap();
        assert!(eventually(|| launcher.restarts() == 2));
        // Backoffs are 10 and 20 ms; give a third restart ample time to (wrongly) happen.
        thread::sleep(Duration::from_millis(300));
        assert_eq!(launcher.restarts(), 2);
        assert_eq!(launcher.pids(), [None]);
        launcher.stop(Duration::from_millis(100));
    }

    #[test]
    fn start_fails_cleanly_when_a_program_is_missing() {
        let result = Launcher::start(
            3,
            |slot| match slot {
                2 => ActorCommand { program: "/nonexistent/flotilla-actor".into(), args: Vec::new(), env: Vec::new() },
                _ => sh("exec sleep 30"),
            },
            config(3),
        );
        let error = result.err().expect("start should fail");
        assert!(error.to_string().contains("/nonexistent/flotilla-actor"), "{error}");
    }

    #[test]
    fn children_see_the_extra_environment() {
        let path = std::env::temp_dir().join(format!("flotilla-launcher-env-{}", std::process::id()));
        let file = path.to_string_lossy().into_owned();
        let command = ActorCommand {
            env: vec![("FLOTILLA_TEST_VALUE".into(), "slot-value".into())],
            ..sh(&format!("printf %s \"$FLOTILLA_TEST_VALUE\" > {file}.tmp && mv {file}.tmp {file}; exec sleep 30"))
        };
        let mut launcher = Launcher::start(1, move |_| command.clone(), config(0)).unwrap();
        assert!(eventually(|| path.exists()));
        launcher.stop(Duration::from_millis(500));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "slot-value");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn backoff_doubles_up_to_five_seconds() {
        let first = Duration::from_millis(500);
        let delays: Vec<Duration> = (0..6).map(|n| backoff(first, n)).collect();
        let millis: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(backoff(Duration::from_secs(8), 3), Duration::from_secs(8));
        assert_eq!(backoff(first, u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn tokens_are_32_hex_chars_and_differ() {
        let (a, b) = (generate_token().unwrap(), generate_token().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn installing_stop_signals_twice_returns_the_same_flag() {
        let (a, b) = (install_stop_signals(), install_stop_signals());
        assert!(Arc::ptr_eq(&a, &b));
    }

    /// Signals are process-wide, so delivering them here would stop the other tests' launchers from restarting:
    /// this re-runs the test binary to check, in a process of its own, that the first SIGINT sets the flag and
    /// the second exits with code 130.
    #[test]
    fn a_second_stop_signal_exits_with_130() {
        const CHILD: &str = "FLOTILLA_LAUNCHER_SIGNAL_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let flag = install_stop_signals();
            // SAFETY: raise(3) runs the handler installed above.
            unsafe { libc::raise(libc::SIGINT) };
            assert!(flag.load(Ordering::SeqCst) && stop_signalled());
            // SAFETY: as above; this time the handler calls _exit(130).
            unsafe { libc::raise(libc::SIGINT) };
            unreachable!("the second SIGINT should have exited");
        }
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "launcher::tests::a_second_stop_signal_exits_with_130", "--test-threads=1"])
            .env(CHILD, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(130), "{status}");
    }
}
