//! `flotilla train CONFIG --actors N` (one learner): this process supervises a learner child process and N actor
//! processes, and restarts the learner from the run's last checkpoint when it dies.
//!
//! ```text
//! supervised_train
//!   check what can be checked (config, TLS files, --out free); pick the address (a port kept for the whole run)
//!   loop:
//!     spawn `flotilla learner --supervised --listen ADDR` (fresh: CONFIG --out RUN_DIR; then: --supervised-resume
//!       RUN_DIR), the token in its environment, bound to this process with PR_SET_PDEATHSIG
//!     first time only, once ADDR accepts connections: Launcher::start(N actors)  (our children, not the learner's)
//!     wait for the learner:
//!       success               stop the actors; done (the learner printed the summary)
//!       SIGINT/SIGTERM to us  SIGTERM to the learner (it checkpoints), stop the actors, exit 130
//!       died (kill -9, OOM, panic, error)
//!         before the run directory was written: give up (its error is the run's)
//!         max_restarts reached: give up, naming the checkpoint to --resume from
//!         else: error!, back off (1 s doubling to 10 s), restart it from the checkpoint (none yet: from the start
//!         in the same directory); the actors reconnect and re-register with it on their own
//! ```
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::run_dir::{CHECKPOINT_FILE, CONFIG_FILE};
use tracing::{error, info, warn};

use crate::launcher::{ActorCommand, Launcher, generate_token, install_stop_signals, spawn};

/// The backoff before the second restart in a row (the first is at once); it doubles with each restart after, up
/// to [`MAX_BACKOFF`]. A learner that ran [`STABLE`] before it died ends the row: its restart is at once again.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const STABLE: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long a learner gets to listen before the actors are launched anyway (they retry connecting).
const LISTEN_WAIT: Duration = Duration::from_secs(60);

/// What the supervised run starts from.
pub enum Start {
    /// A new run: the config file, its overrides (`actors.count` and TLS included) and the run directory, which
    /// the first learner creates once it is built and listening.
    Fresh { config: PathBuf, overrides: Vec<String>, out: PathBuf },
    /// An existing run directory, from its checkpoint.
    Resume(PathBuf),
}

/// Run `config`'s distributed training (one learner, `[actors] count` actors) to the end or `stop_at` env steps,
/// restarting a learner that dies up to `[learner] max_restarts` times.
pub fn supervised_train(config: &ExperimentConfig, start: Start, stop_at: u64) -> Result<()> {
    let stop = install_stop_signals();
    let n = config.actors.count;
    // Fail before anything starts: bad TLS files, an address that does not parse.
    let tls = config.transport.server_tls()?;
    let actor_tls = if tls.is_some() { crate::launch::launched_actor_tls(config)? } else { Vec::new() };
    let mut listen: SocketAddr =
        config.learner.listen.parse().with_context(|| format!("[learner] listen = {:?}", config.learner.listen))?;
    if listen.port() == 0 {
        // A port of its own for the whole run, so restarted learners are where the actors reconnect to.
        let probe = TcpListener::bind((listen.ip(), 0)).context("finding a free port for the learner")?;
        listen.set_port(probe.local_addr()?.port());
    }
    let mut reach = listen;
    if reach.ip().is_unspecified() {
        reach.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    // The run token: the operator's (FLOTILLA_TOKEN) where actors started elsewhere must present it, else a new one.
    let token = match std::env::var("FLOTILLA_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t,
        _ if config.actors.remote > 0 => anyhow::bail!(
            "[actors] remote = {}: actors started elsewhere must present the run token; set it in FLOTILLA_TOKEN",
            config.actors.remote
        ),
        _ => generate_token().context("generating the run token")?,
    };
    if config.actors.remote > 0 {
        let (from, to) = (n, n + config.actors.remote);
        info!(
            "remote actor slots {from}..{to} ([actors] remote): start each with FLOTILLA_TOKEN set as here and \
             `flotilla actor --learner {reach} --index I`, I in {from}..{to}"
        );
    }
    let exe = std::env::current_exe().context("locating the flotilla executable")?;
    let out = match &start {
        Start::Fresh { out, .. } => out.clone(),
        Start::Resume(dir) => dir.clone(),
    };
    let learner_args = |resume: bool, restarts: u32, died_at: Option<f64>| -> Vec<String> {
        let mut args: Vec<String> =
            vec!["learner".into(), "--supervised".into(), "--listen".into(), listen.to_string()];
        match (&start, resume) {
            (Start::Fresh { config, overrides, out }, false) => {
                args.push(config.display().to_string());
                for o in overrides {
                    args.extend(["--set".into(), o.clone()]);
                }
                args.extend(["--out".into(), out.display().to_string()]);
            }
            _ => args.extend(["--supervised-resume".into(), out.display().to_string()]),
        }
        args.extend(["--restarts".into(), restarts.to_string()]);
        if let Some(t) = died_at {
            args.extend(["--died-at".into(), format!("{t:.6}")]);
        }
        if stop_at != u64::MAX {
            args.extend(["--stop-at".into(), stop_at.to_string()]);
        }
        args
    };
    let max_restarts = config.learner.max_restarts;
    let mut resume = matches!(start, Start::Resume(_));
    let mut restarts = 0u32;
    // Restarts of learners that each died within STABLE of starting: a crash loop backs off.
    let mut in_a_row = 0u32;
    let mut died_at = None;
    let mut actors: Option<Launcher> = None;
    let result = loop {
        let command = ActorCommand {
            program: exe.clone(),
            args: learner_args(resume, restarts, died_at),
            env: vec![("FLOTILLA_TOKEN".into(), token.clone())],
        };
        let mut learner = match spawn(&command) {
            Ok(child) => child,
            Err(e) => break Err(anyhow::Error::from(e).context("starting the learner process")),
        };
        let started = Instant::now();
        info!("learner process {} started{}", learner.id(), if resume { " (resuming)" } else { "" });
        if actors.is_none() {
            if !wait_listening(&mut learner, reach, &stop) {
                // It ended (or we were stopped) before listening: handled below like any other exit.
            } else {
                match crate::launch::launch_actors(
                    config,
                    n,
                    exe.clone(),
                    &reach.to_string(),
                    &token,
                    actor_tls.clone(),
                ) {
                    Ok(l) => actors = Some(l),
                    Err(e) => {
                        terminate(learner);
                        break Err(anyhow::Error::from(e).context("starting actor processes"));
                    }
                }
            }
        }
        let status = match wait(&mut learner, &stop) {
            Ok(status) => status,
            Err(e) => break Err(e),
        };
        if stop.load(Ordering::SeqCst) {
            break Ok(Some(130));
        }
        if status.success() {
            break Ok(None);
        }
        died_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
        let what = format!("the learner (pid {}) {}", learner.id(), describe(status));
        error!("{what}");
        if !out.join(CONFIG_FILE).is_file() {
            break Err(anyhow::anyhow!("{what} before it started the run"));
        }
        let checkpoint = out.join(CHECKPOINT_FILE);
        if restarts >= max_restarts {
            let resume_hint = if checkpoint.is_file() {
                format!(
                    "; its last checkpoint is in {}: continue with flotilla train --resume {}",
                    out.display(),
                    out.display()
                )
            } else {
                String::new()
            };
            break Err(anyhow::anyhow!(
                "{what}; it was restarted {restarts} times ([learner] max_restarts = {max_restarts}), giving \
                 up{resume_hint}"
            ));
        }
        restarts += 1;
        // At once, unless the learners keep dying soon after they start: then each waits longer.
        in_a_row = if started.elapsed() >= STABLE { 1 } else { in_a_row + 1 };
        let backoff = match in_a_row {
            1 => Duration::ZERO,
            r => (FIRST_BACKOFF * 2u32.saturating_pow(r - 2)).min(MAX_BACKOFF),
        };
        warn!(
            "restarting the learner in {:.1} s ({restarts} of at most {max_restarts}) {}; the actors keep running and \
             reconnect to {reach}",
            backoff.as_secs_f64(),
            if checkpoint.is_file() {
                format!("from {}", checkpoint.display())
            } else {
                "from the start (no checkpoint yet)".into()
            }
        );
        resume = true;
        let until = Instant::now() + backoff;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if stop.load(Ordering::SeqCst) {
            break Ok(Some(130));
        }
    };
    if let Some(l) = actors.as_mut() {
        info!("stopping actors ({} restarts during the run; learner restarts: {restarts})", l.restarts());
        l.stop(Duration::from_secs(5));
    }
    match result? {
        Some(code) => std::process::exit(code),
        None => Ok(()),
    }
}

/// Wait until the learner accepts connections on `addr`: `false` if it ended or a stop came first.
fn wait_listening(learner: &mut Child, addr: SocketAddr, stop: &AtomicBool) -> bool {
    let deadline = Instant::now() + LISTEN_WAIT;
    while Instant::now() < deadline {
        if stop.load(Ordering::SeqCst) || !matches!(learner.try_wait(), Ok(None)) {
            return false;
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    warn!("the learner is not listening on {addr} after {LISTEN_WAIT:?}; launching the actors anyway");
    true
}

/// Wait for the learner to exit; a stop signal to this process is passed on to it (it stops with a checkpoint).
fn wait(learner: &mut Child, stop: &AtomicBool) -> Result<std::process::ExitStatus> {
    let mut signalled = false;
    loop {
        if let Some(status) = learner.try_wait().context("waiting for the learner")? {
            return Ok(status);
        }
        if stop.load(Ordering::SeqCst) && !signalled {
            signalled = true;
            // SAFETY: kill(2) on a child not yet reaped.
            unsafe { libc::kill(learner.id() as libc::pid_t, libc::SIGTERM) };
        }
        // Often: the actors exit as soon as the learner tells them the run is over, and should be stopped
        // before the launcher's restart backoff (200 ms) respawns them.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stop a learner (SIGTERM, then SIGKILL after 10 s) and reap it.
fn terminate(learner: Child) {
    crate::launcher::terminate(vec![(0, learner)], Duration::from_secs(10));
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended: {status}"),
    }
}
