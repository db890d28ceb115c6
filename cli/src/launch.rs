//! `flotilla learner` and the learner of `flotilla train --actors N`: a distributed learner, launching its actor
//! processes itself (a rank of a `--learners` group, `--resume` of one), serving actors started elsewhere, or as
//! the child of a `flotilla train --actors N` supervisor (`crate::supervise`) that launched them.
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::launcher::{ActorCommand, Launcher, LauncherConfig, generate_token, install_stop_signals};
use anyhow::{Context, Result};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::distributed::DistributedLearner;
use flotilla_learner::run_dir::{IngestLedger, RunDir};
use flotilla_learner::train::TrainReport;

/// Who starts the actors.
pub enum Actors {
    /// This process launches and supervises `N` actor processes on loopback (a rank of a `--learners` group).
    Launch,
    /// Actors are started elsewhere (`flotilla actor --learner ADDR --token T`).
    External,
    /// This process is the learner child of a `flotilla train --actors N` supervisor (`crate::supervise`), which
    /// launched the actors and restarts this learner when it dies: it listens on `listen` (the address the actors
    /// keep reconnecting to, not saved in the run's config), checkpoints periodically even when
    /// `[checkpoint] interval_steps` is 0, and on a resume cuts `metrics.csv` back to its checkpoint and marks the
    /// new segment. `restarts`: how many times the supervisor has restarted the learner; `died_at`: when the
    /// learner this one replaces died (Unix seconds).
    Supervised { listen: String, restarts: u32, died_at: Option<f64> },
}

/// The checkpoint interval of a supervised run whose config says 0 (never): 5 % of the budget, so a restarted
/// learner redoes at most that much.
pub fn supervised_checkpoint_interval(config: &ExperimentConfig) -> u64 {
    (config.run.total_env_steps / 20).max(1)
}

/// Where a distributed run writes.
pub enum Start {
    /// A new run directory at this path, created once the learner is built (so a config, device or space
    /// error leaves nothing behind).
    Fresh(PathBuf),
    /// Continue the run in this directory from its checkpoint (supervised: from the start, in the same directory,
    /// when the learner died before its first checkpoint).
    Resume(RunDir),
}

/// Train `config` (with `[actors] count` set) with a distributed learner, from the start or from a run
/// directory's checkpoint, until the budget or `stop_at` env steps. Checkpoints go to the run directory at
/// `[checkpoint] interval_steps` and at the end.
pub fn distributed_train(
    config: &ExperimentConfig,
    start: Start,
    actors: Actors,
    token: Option<String>,
    stop_at: u64,
) -> Result<()> {
    let n = config.actors.count;
    let plan = config.plan(config.actor_slots())?;
    // TLS files are read and checked first: a missing file, one that is not PEM or a key that is not the
    // certificate's fails here, before the learner is built and before a run directory is written.
    let tls = config.transport.server_tls()?;
    let actor_tls = match actors {
        Actors::Launch if tls.is_some() => Some(launched_actor_tls(config)?),
        _ => None,
    };
    let resume = matches!(start, Start::Resume(_));
    // A supervised learner's own config: checkpoints on (saved with a fresh run), the supervisor's address (not).
    let mut saved = config.clone();
    let mut learner_config = None;
    if let Actors::Supervised { listen, .. } = &actors {
        if saved.checkpoint.interval_steps == 0 {
            saved.checkpoint.interval_steps = supervised_checkpoint_interval(config);
            tracing::info!(
                "[checkpoint] interval_steps = 0: a supervised run checkpoints every {} env steps (5 % of the \
                 budget), so a restarted learner resumes close to where the last one died",
                saved.checkpoint.interval_steps
            );
        }
        let mut c = saved.clone();
        c.learner.listen = listen.clone();
        learner_config = Some(c);
    }
    let saved = &saved;
    let config = learner_config.as_ref().unwrap_or(saved);
    let supervised = matches!(actors, Actors::Supervised { .. });
    let mut learner = match &start {
        Start::Resume(run_dir) if supervised && !run_dir.checkpoint_path().is_file() => {
            tracing::warn!("{} has no checkpoint yet: starting the run over in it", run_dir.path().display());
            DistributedLearner::new(config, plan)?
        }
        Start::Resume(run_dir) => {
            let checkpoint = run_dir.checkpoint_path();
            let learner = DistributedLearner::resume(config, plan, &checkpoint)
                .with_context(|| format!("resuming from {}", checkpoint.display()))?;
            tracing::info!("resuming {} at {} env steps", run_dir.path().display(), learner.report().env_steps);
            learner
        }
        Start::Fresh(_) => DistributedLearner::new(config, plan)?,
    };
    let resumed_at = learner.report().env_steps;
    let token = match token {
        Some(t) => t,
        None => generate_token().context("generating the run token")?,
    };
    let addr = learner.listen(&token, tls.as_ref())?;
    // Learners other than rank 0 of a data-parallel group write nothing: rank 0 owns the run directory.
    let writer = learner.rank() == 0;
    // Built and listening: only now is a new run directory written.
    let run_dir = match start {
        Start::Resume(run_dir) => run_dir,
        Start::Fresh(out) if !writer => RunDir::at(&out),
        Start::Fresh(out) => {
            let run_dir = RunDir::create(&out, saved)?;
            tracing::info!("run directory {}; resolved config:\n{}", out.display(), saved.to_toml());
            run_dir
        }
    };
    // The env steps the previous learner of this run directory took in (it may have died with them), read before
    // this learner's own count replaces it.
    let previous_ingested = if resume { IngestLedger::read(run_dir.path()) } else { None };
    if writer {
        learner.hub().record_ingest_to(IngestLedger::open(run_dir.path(), resumed_at)?, resumed_at);
    }
    let stop = install_stop_signals();
    if writer {
        learner.checkpoint_to(run_dir.checkpoint_path());
    }
    learner.stop_at(stop_at);
    let hub = learner.hub();
    let mut restart_pending = false;
    if let Actors::Supervised { died_at: Some(t), .. } = &actors
        && t.is_finite()
        && *t >= 0.0
    {
        hub.restarted_after(std::time::UNIX_EPOCH + Duration::from_secs_f64(*t));
        restart_pending = true;
    }
    let remote = match config.actors.remote {
        0 => String::new(),
        r => format!(" (and {r} remote: slots {n}..{})", n + r),
    };
    tracing::info!(
        "learner listening on {addr}: {n} actors{remote} × {} envs, chunks of {} steps",
        plan.envs_per_actor,
        plan.chunk_steps
    );
    let mut launcher = match &actors {
        Actors::Supervised { .. } => None,
        Actors::Launch => {
            let exe = std::env::current_exe().context("locating the flotilla executable")?;
            // Actors on this machine reach a learner listening on every interface through loopback.
            let mut reach = addr;
            if reach.ip().is_unspecified() {
                reach.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            let tls_args = actor_tls.unwrap_or_default();
            Some(
                launch_actors(config, n, exe, &reach.to_string(), &token, tls_args)
                    .context("starting actor processes")?,
            )
        }
        Actors::External => {
            let t = &config.transport;
            let tls_args = match (&tls, &t.client_ca) {
                (None, _) => String::new(),
                (Some(_), None) => " --tls-ca CA.pem".into(),
                (Some(_), Some(_)) => " --tls-ca CA.pem --tls-cert ACTOR.pem --tls-key ACTOR.key".into(),
            };
            eprintln!("waiting for {n} actors; start each with:");
            eprintln!("  FLOTILLA_TOKEN={token} flotilla actor --learner {addr}{tls_args}");
            if tls.is_some() {
                eprintln!(
                    "  (CA.pem: the CA that signed the learner's certificate{}; if HOST is not a name in its \
                     certificate, add --tls-domain NAME)",
                    if t.client_ca.is_some() { "; ACTOR.pem: a certificate signed by the client CA" } else { "" }
                );
            }
            None
        }
    };
    // A resumed segment of a supervised run is marked: every row carries the learner restarts so far (of this
    // supervisor) and the env steps lost with dead learners (over the run), its first row the env steps it resumed
    // at.
    let mut mark: Option<(f64, f64, Option<f64>)> = None;
    let mut csv = match (writer, resume, &actors) {
        (false, _, _) => None,
        (true, true, Actors::Supervised { restarts, .. }) => {
            let (csv, rewound) = run_dir.metrics_rewound(resumed_at)?;
            // Exact from the previous learner's ingest ledger: what it took in past the checkpoint; the removed
            // rows' count (a lower bound) only where it kept none.
            let lost_now = previous_ingested.map_or(rewound.lost_env_steps, |n| n.saturating_sub(resumed_at));
            let lost = rewound.earlier_lost_env_steps + lost_now;
            if rewound.rows > 0 || lost_now > 0 {
                tracing::warn!(
                    "metrics.csv: removed {} rows past the checkpoint at {resumed_at} env steps; {lost_now} env steps \
                     the previous learner took in after it are lost ({lost} over the run)",
                    rewound.rows
                );
            }
            mark = Some((*restarts as f64, lost as f64, Some(resumed_at as f64)));
            Some(csv)
        }
        (true, true, _) => Some(run_dir.metrics_appender(resumed_at)?),
        (true, false, _) => Some(run_dir.metrics_writer()?),
    };
    let total = config.run.total_env_steps.min(stop_at);
    let result = learner.run(&stop, &mut |row| {
        crate::progress::update(row, total);
        let mut columns = row.columns();
        if let Some((restarts, lost, resumed)) = mark.as_mut() {
            columns.push(("charts/restarts".into(), Some(*restarts)));
            columns.push(("charts/lost_env_steps".into(), Some(*lost)));
            columns.push(("charts/resumed_at".into(), resumed.take()));
        }
        // The restart's latency, on the first row after this learner accepted actors' data.
        if restart_pending && let Some(secs) = hub.restart_secs() {
            columns.push(("charts/restart_secs".into(), Some(secs)));
            restart_pending = false;
        }
        csv.as_mut().map_or(Ok(()), |csv| csv.write_row(&columns))
    });
    crate::progress::finish();
    if let Some(l) = launcher.as_mut() {
        tracing::info!("stopping actors ({} restarts during the run)", l.restarts());
        l.stop(Duration::from_secs(5));
    }
    let report = result?;
    if !writer {
        tracing::info!("learner {} done at {} env steps", learner.rank(), report.env_steps);
        return Ok(());
    }
    let model = run_dir.model_path();
    learner.agent().save_weights(&model).with_context(|| format!("saving the policy to {}", model.display()))?;
    let dir = run_dir.path().display();
    if report.env_steps < config.run.total_env_steps {
        let interrupted = stop.load(std::sync::atomic::Ordering::SeqCst);
        println!(
            "{} at {} of {} env steps; policy saved to {}; continue with: flotilla train --resume {dir}",
            if interrupted { "interrupted" } else { "stopped" },
            report.env_steps,
            config.run.total_env_steps,
            model.display()
        );
        if interrupted {
            std::process::exit(130);
        }
        return Ok(());
    }
    print_summary(config, &report, Some(n), &model, run_dir.path());
    Ok(())
}

/// The TLS options of the actors this process launches, from `[transport]`: they trust `tls_ca` and, under
/// mutual TLS, present `actor_cert` / `actor_key`. The files are checked here, so a bad one fails the run
/// before it starts rather than each actor after it.
pub fn launched_actor_tls(config: &ExperimentConfig) -> Result<Vec<String>> {
    let t = &config.transport;
    let ca = t.tls_ca.as_deref().context(
        "[transport] tls_cert is set but tls_ca is not: the actors this run launches need the CA that signed \
         the learner's certificate (--tls-ca or [transport] tls_ca)",
    )?;
    let identity = match (&t.client_ca, &t.actor_cert, &t.actor_key) {
        (None, _, _) => None,
        (Some(_), Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (Some(_), _, _) => anyhow::bail!(
            "[transport] client_ca is set (mutual TLS) but actor_cert and actor_key are not: the actors this run \
             launches need a certificate the client CA signed (--set transport.actor_cert=FILE \
             --set transport.actor_key=FILE)"
        ),
    };
    flotilla_transport::tls::ClientTls::from_files(ca, identity)
        .map_err(|e| anyhow::anyhow!("[transport]: {}", e.message))?;
    let mut args = vec!["--tls-ca".to_string(), ca.display().to_string()];
    if let Some((cert, key)) = identity {
        args.extend(["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()]);
    }
    if let Some(domain) = &t.tls_domain {
        args.extend(["--tls-domain".into(), domain.clone()]);
    }
    Ok(args)
}

/// What a finished run prints: the budget and time, when it first reached the env's registered reward
/// threshold (where Gymnasium sets one) and whether it held there, the final evaluation, and where the policy
/// went.
pub fn print_summary(config: &ExperimentConfig, report: &TrainReport, actors: Option<usize>, model: &Path, dir: &Path) {
    let with = match (actors, config.learner.learners) {
        (Some(n), l) if l > 1 => format!(", {l} learners and {} actors ({n} each)", n * l),
        (Some(n), _) => format!(" and {n} actors"),
        (None, _) => String::new(),
    };
    println!(
        "trained {} with {}{with} for {} env steps in {:.1} s",
        config.env.id,
        config.algorithm_name(),
        report.env_steps,
        report.train_secs
    );
    if actors.is_none() && report.train_secs > 0.0 {
        let update = 100.0 * report.update_secs / report.train_secs;
        println!("time: {update:.0} % in updates, {:.0} % acting and stepping envs", 100.0 - update);
    }
    if actors.is_some() && report.train_secs > 0.0 {
        let share = |secs: f64| 100.0 * secs / report.train_secs;
        if config.assembles_ahead() {
            println!(
                "learner time: {:.0} % in updates, {:.0} % waiting for the next batch; batch assembly (stacking \
                 chunks or feeding and sampling replay, copy to the device) took {:.1} % on its own thread, overlapped",
                share(report.update_secs),
                share(report.wait_secs),
                share(report.assemble_secs)
            );
        } else {
            println!(
                "learner time: {:.0} % in updates (of which {:.1} % assembling batches), {:.0} % waiting for \
                 actors' data",
                share(report.update_secs),
                share(report.assemble_secs),
                share(report.wait_secs)
            );
        }
    }
    let threshold = flotilla_envs::spec(&config.env.id).ok().and_then(|s| s.reward_threshold);
    if let Some(course) = threshold.map(|t| report.course(t))
        && let Some(i) = course.first_index
    {
        let (threshold, first, held) = (course.threshold, &report.evals[i], course.held_clause());
        println!(
            "first evaluation ≥ {threshold} (the env's reward threshold) at {} env steps, {:.1} s{}",
            first.env_steps,
            first.train_secs,
            if held.is_empty() { String::new() } else { format!("; {held}") }
        );
    }
    let e = report.final_eval();
    println!("evaluation return: {:.1} ± {:.1} over {} episodes (deterministic)", e.mean(), e.std(), e.returns.len());
    for (task, mean) in e.task_means() {
        println!("task {task}: evaluation return {mean:.1}");
    }
    println!("saved policy: {}", model.display());
    let dir = dir.display();
    println!("run directory: {dir}  (evaluate again with: flotilla eval {dir})");
}

/// The run directory's default name.
pub fn default_out(config: &ExperimentConfig) -> std::path::PathBuf {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let name = format!("{}-{}-seed{}-{stamp}", config.env.id, config.algorithm_name(), config.run.seed);
    Path::new("runs").join(name)
}

/// Start `n` `flotilla actor` processes (slots 0..n) for the learner at `addr`, each given the token in its
/// environment (never on the command line), `[actors] reconnect_secs`, and `tls_args`; restarted as
/// `[actors] max_restarts` allows.
pub(crate) fn launch_actors(
    config: &ExperimentConfig,
    n: usize,
    exe: std::path::PathBuf,
    addr: &str,
    token: &str,
    tls_args: Vec<String>,
) -> std::io::Result<Launcher> {
    let (addr, token, reconnect) = (addr.to_string(), token.to_string(), config.actors.reconnect_secs.to_string());
    let command = move |i: usize| ActorCommand {
        program: exe.clone(),
        args: ["actor", "--learner", &addr, "--index", &i.to_string(), "--reconnect-secs", &reconnect]
            .into_iter()
            .map(String::from)
            .chain(tls_args.iter().cloned())
            .collect(),
        env: vec![("FLOTILLA_TOKEN".into(), token.clone())],
    };
    let lc = LauncherConfig { max_restarts: config.actors.max_restarts, restart_backoff: Duration::from_millis(200) };
    Launcher::start(n, command, lc)
}
