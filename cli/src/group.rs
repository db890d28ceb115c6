//! `flotilla train CONFIG --learners L --actors N`: L data-parallel learner processes on this host, each
//! serving N/L actor processes of its own, launched the way torchrun launches ranks (`MASTER_ADDR`,
//! `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`) and supervised like `torchrun --max-restarts`: when a
//! learner dies, the others fail within the collective timeout (naming it), and the whole group is started
//! again from the run's last checkpoint, up to `[learner] max_restarts` times.
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::run_dir::RunDir;
use tracing::{error, info, warn};

use crate::launcher::{ActorCommand, spawn, terminate};

/// What the group is started from.
pub enum GroupStart {
    /// A new run: the config file, its overrides (already including `learner.learners`), the actor processes
    /// of each learner, and the run directory rank 0 creates.
    Fresh { config: PathBuf, overrides: Vec<String>, actors: usize, out: PathBuf },
    /// An existing run directory, from its checkpoint.
    Resume(PathBuf),
}

/// Run the group to the end of the run (or `stop_at`), restarting it from the last checkpoint after a failure.
pub fn group_train(config: &ExperimentConfig, start: GroupStart, stop_at: u64, stop: &AtomicBool) -> Result<()> {
    let learners = config.learner.learners;
    let out = match &start {
        GroupStart::Fresh { out, .. } => out.clone(),
        GroupStart::Resume(dir) => dir.clone(),
    };
    let exe = std::env::current_exe().context("locating the flotilla executable")?;
    let grace = Duration::from_secs_f64(config.learner.collective_timeout_secs) + Duration::from_secs(30);
    let mut resume = matches!(start, GroupStart::Resume(_));
    let mut restarts = 0u32;
    loop {
        let port = free_port()?;
        let args = |_: usize| -> Vec<String> {
            let mut args = vec!["train".to_string()];
            match (&start, resume) {
                (GroupStart::Fresh { config, overrides, actors, out }, false) => {
                    args.push(config.display().to_string());
                    for o in overrides {
                        args.extend(["--set".into(), o.clone()]);
                    }
                    args.extend(["--actors".into(), actors.to_string(), "--out".into(), out.display().to_string()]);
                }
                _ => args.extend(["--resume".into(), out.display().to_string()]),
            }
            if stop_at != u64::MAX {
                args.extend(["--stop-at".into(), stop_at.to_string()]);
            }
            args
        };
        info!(
            "starting {learners} learners (rendezvous 127.0.0.1:{port}){}",
            if resume { format!(", from the checkpoint in {}", out.display()) } else { String::new() }
        );
        let mut ranks: Vec<(usize, Child)> = Vec::with_capacity(learners);
        for rank in 0..learners {
            let command = ActorCommand {
                program: exe.clone(),
                args: args(rank),
                env: vec![
                    ("MASTER_ADDR".into(), "127.0.0.1".into()),
                    ("MASTER_PORT".into(), port.to_string()),
                    ("RANK".into(), rank.to_string()),
                    ("WORLD_SIZE".into(), learners.to_string()),
                    ("LOCAL_RANK".into(), rank.to_string()),
                ],
            };
            match spawn(&command) {
                Ok(child) => ranks.push((rank, child)),
                Err(e) => {
                    terminate(ranks, Duration::from_secs(5));
                    return Err(e).context(format!("starting learner {rank}"));
                }
            }
        }
        match watch(ranks, grace, stop)? {
            Outcome::Finished => return Ok(()),
            Outcome::Stopped => {
                println!("interrupted; continue with: flotilla train --resume {}", out.display());
                std::process::exit(130);
            }
            Outcome::Failed(what) => {
                let checkpoint = RunDir::open(&out).map(|(dir, _)| dir.checkpoint_path()).unwrap_or_default();
                if restarts >= config.learner.max_restarts {
                    bail!("{what}; the group was restarted {restarts} times ([learner] max_restarts), giving up");
                }
                if !checkpoint.is_file() {
                    bail!("{what}, before the run's first checkpoint: nothing to restart from");
                }
                restarts += 1;
                resume = true;
                warn!(
                    "{what}; restarting the group from {} ({restarts} of at most {})",
                    checkpoint.display(),
                    config.learner.max_restarts
                );
            }
        }
    }
}

enum Outcome {
    Finished,
    Stopped,
    Failed(String),
}

/// Wait for the ranks: all succeed, or one fails (then the others get `grace` to fail on their own, naming
/// it, before they are stopped), or a stop signal (passed on to every rank, which stops with a checkpoint).
fn watch(mut ranks: Vec<(usize, Child)>, grace: Duration, stop: &AtomicBool) -> Result<Outcome> {
    let mut failed: Option<(String, Instant)> = None;
    let mut stopping = false;
    loop {
        let mut still = Vec::with_capacity(ranks.len());
        for (rank, mut child) in ranks {
            match child.try_wait().with_context(|| format!("waiting for learner {rank}"))? {
                Some(status) if status.success() => info!("learner {rank} finished"),
                Some(status) => {
                    let what = format!("learner {rank} (pid {}) {}", child.id(), describe(status));
                    error!("{what}");
                    if failed.is_none() {
                        failed = Some((what, Instant::now()));
                    }
                }
                None => still.push((rank, child)),
            }
        }
        ranks = still;
        if ranks.is_empty() {
            return Ok(match failed {
                Some((what, _)) if !stopping => Outcome::Failed(what),
                _ if stopping => Outcome::Stopped,
                _ => Outcome::Finished,
            });
        }
        if stop.load(Ordering::SeqCst) && !stopping {
            stopping = true;
            for (_, child) in &ranks {
                // SAFETY: kill(2) on a child not yet reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        if let Some((what, since)) = &failed
            && since.elapsed() > grace
        {
            let left: Vec<usize> = ranks.iter().map(|(r, _)| *r).collect();
            warn!("learners {left:?} still running {grace:?} after {what}; stopping them");
            terminate(ranks, Duration::from_secs(10));
            return Ok(Outcome::Failed(what.clone()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended: {status}"),
    }
}

/// A port for the rendezvous store that is free now (the store binds it a moment later).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port for the rendezvous")?;
    Ok(listener.local_addr()?.port())
}
