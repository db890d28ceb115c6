//! Training a population: every member a [`Trainer`] of its own config, advanced in lockstep segments by a few
//! worker threads (member k on thread k mod threads), with PBT's exploit/explore step between segments.
//!
//! ```text
//! main thread                               worker thread t (members k ≡ t mod threads)
//!   plans (configs checked) ─► run dirs       build Trainers (fresh, or resumed from each checkpoint)
//!   loop over segment ends b:
//!     RunTo(b) ──────────────────────────────► each member: Trainer::run(b) (metrics rows, own checkpoints)
//!     ◄── statuses (env steps, recent return)
//!     PBT at b: rank, Save sources ──────────► checkpoint the top members that are copied
//!               Exploit(k ◄ j, perturbed) ───► member k: Trainer::resume(k's new config, j's checkpoint)
//!               member config.toml, lineage.jsonl, population_state.json (PBT's generator)
//!   Finish ──────────────────────────────────► checkpoint + model of every member, final reports
//! ```
//! A member's results do not depend on the thread count or on the other members (without PBT): member k is
//! bit for bit the run `flotilla train` gives with seed `seed + k` and its hyperparameters. Stopping
//! (`stop_at`) checkpoints every member; [`resume`] continues each from its checkpoint and PBT from its saved
//! generator, so an interrupted population ends as an uninterrupted one does.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rand::Rng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::{
    LINEAGE_FILE, LineageEvent, MEMBERS_DIR, MemberPlan, MemberRecord, PopulationConfig, PopulationRecord, read_lineage,
};
use crate::config::ExperimentConfig;
use crate::progress::TrainReport;
use crate::run_dir::{MetricsWriter, RunDir, saved_together, write_atomic};
use crate::train::Trainer;
use crate::{Error, Result};

/// File, in a population's run directory, with where the population stands: the env steps of its last
/// completed segment and PBT's generator there.
pub const STATE_FILE: &str = "population_state.json";

/// Which share of a population this process trains: members `k` with `k mod jobs == index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobShare {
    /// Jobs the population is split into.
    pub jobs: usize,
    /// This job (0-based).
    pub index: usize,
}

impl JobShare {
    /// The whole population in one job.
    pub const ALL: JobShare = JobShare { jobs: 1, index: 0 };
}

/// A trained (or stopped) member.
#[derive(Debug, Clone)]
pub struct MemberResult {
    /// Its index in the population.
    pub index: usize,
    /// Its seed.
    pub seed: u64,
    /// Its hyperparameters at the end (PBT may have changed them).
    pub hyperparameters: BTreeMap<String, f64>,
    /// Its run directory.
    pub dir: PathBuf,
    /// Its counters and evaluations (the last is of the final policy when it finished).
    pub report: TrainReport,
}

#[derive(Debug, Serialize, Deserialize)]
struct PopulationState {
    env_steps: u64,
    rng: Pcg64,
}

enum Command {
    RunTo(u64),
    Save(Vec<usize>),
    Exploit { member: usize, config: Box<ExperimentConfig>, from: PathBuf },
    Finish,
}

struct Status {
    index: usize,
    env_steps: u64,
    /// Mean training episode return over the segment's metrics rows (else the last evaluation).
    fitness: Option<f64>,
    report: TrainReport,
}

struct Member {
    index: usize,
    dir: RunDir,
    metrics: MetricsWriter,
    segment_returns: Vec<f64>,
}

impl Member {
    fn status(&self, trainer: &Trainer) -> Status {
        let report = trainer.report();
        let fitness = if self.segment_returns.is_empty() {
            report.evals.last().map(|e| e.result.mean())
        } else {
            Some(self.segment_returns.iter().sum::<f64>() / self.segment_returns.len() as f64)
        };
        Status { index: self.index, env_steps: report.env_steps, fitness, report }
    }
}

/// How a worker starts a member.
struct MemberStart {
    index: usize,
    config: ExperimentConfig,
    dir: RunDir,
    resume: bool,
}

/// How a worker trains its members in lockstep with batched updates (`[population] batched`).
#[derive(Clone, Copy)]
struct Lockstep {
    /// Acting batched as `[population] batched_acting` says.
    batched_acting: Option<bool>,
    /// `[population] step_threads` (0: automatic).
    step_threads: usize,
    /// The CPU cores left to each worker.
    cores: usize,
}

/// Joint env batches of at least this many envs step on several threads when `step_threads` is automatic:
/// below it one step's work is too short to share out.
const AUTO_STEP_THREADS_ENVS: usize = 1024;

impl Lockstep {
    /// Threads for a worker's joint batch of `envs` envs.
    fn step_threads(&self, envs: usize) -> usize {
        match self.step_threads {
            0 if envs >= AUTO_STEP_THREADS_ENVS => self.cores,
            0 => 1,
            n => n,
        }
    }
}

/// How `workers` worker threads train their members: `None` each as its own run; else in lockstep.
fn lockstep(population: &PopulationConfig, workers: usize) -> Option<Lockstep> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    population.batched.then_some(Lockstep {
        batched_acting: population.batched_acting,
        step_threads: population.step_threads,
        cores: (cores / workers.max(1)).max(1),
    })
}

/// A worker thread: builds its members, then runs the main thread's commands on them.
fn worker(
    starts: Vec<MemberStart>,
    batched: Option<Lockstep>,
    commands: mpsc::Receiver<Command>,
    replies: mpsc::Sender<Result<Vec<Status>>>,
) {
    // The worker's joint env batch (a member's env count is not swept).
    let envs = starts.iter().map(|s| s.config.env.num_envs).sum();
    let build = |s: MemberStart| -> Result<(Member, Trainer)> {
        let checkpoint = s.dir.checkpoint_path();
        let (mut trainer, metrics) = if s.resume && checkpoint.is_file() {
            let trainer = Trainer::resume(&s.config, &checkpoint)
                .map_err(|e| Error::RunDir(format!("resuming {}: {e}", checkpoint.display())))?;
            let (metrics, _) = s.dir.metrics_rewound(trainer.env_steps())?;
            (trainer, metrics)
        } else if s.resume {
            // Stopped before its first checkpoint: it starts again, its rows so far removed.
            (Trainer::new(&s.config)?, s.dir.metrics_rewound(0)?.0)
        } else {
            (Trainer::new(&s.config)?, s.dir.metrics_writer()?)
        };
        trainer.set_quiet(true);
        Ok((Member { index: s.index, dir: s.dir, metrics, segment_returns: Vec::new() }, trainer))
    };
    let built: Result<Vec<(Member, Trainer)>> = starts.into_iter().map(build).collect();
    let (mut members, mut trainers): (Vec<Member>, Vec<Trainer>) = match built {
        Ok(m) => {
            let _ = replies.send(Ok(Vec::new()));
            m.into_iter().unzip()
        }
        Err(e) => {
            let _ = replies.send(Err(e));
            return;
        }
    };
    for command in commands {
        let reply = match command {
            Command::RunTo(target) => (|| {
                for m in members.iter_mut() {
                    m.segment_returns.clear();
                }
                if let Some(lockstep) = batched {
                    // Every member of this thread in lockstep, updates batched where the algorithm can. Members
                    // resumed from checkpoints of different steps (a crash between two members' saves) first
                    // catch up one by one.
                    let checkpoints: Vec<PathBuf> = members.iter().map(|m| m.dir.checkpoint_path()).collect();
                    let ahead = trainers.iter().map(Trainer::env_steps).max().unwrap_or(0).min(target);
                    for ((m, trainer), checkpoint) in members.iter_mut().zip(trainers.iter_mut()).zip(&checkpoints) {
                        if trainer.env_steps() < ahead {
                            let (returns, csv) = (&mut m.segment_returns, &mut m.metrics);
                            trainer.run(
                                ahead,
                                &mut |row| {
                                    returns.extend(row.episodic_return);
                                    csv.write_row(&row.columns())
                                },
                                &mut |t| t.save_checkpoint(checkpoint),
                            )?;
                        }
                    }
                    let members = &mut members;
                    crate::train::run_group(
                        &mut trainers,
                        target,
                        lockstep.batched_acting,
                        lockstep.step_threads(envs),
                        &mut |k, row| {
                            let m = &mut members[k];
                            m.segment_returns.extend(row.episodic_return);
                            m.metrics.write_row(&row.columns())
                        },
                        &mut |k, t| t.save_checkpoint(&checkpoints[k]),
                    )?;
                } else {
                    for (m, trainer) in members.iter_mut().zip(trainers.iter_mut()) {
                        let (returns, csv) = (&mut m.segment_returns, &mut m.metrics);
                        let checkpoint = m.dir.checkpoint_path();
                        trainer.run(
                            target,
                            &mut |row| {
                                returns.extend(row.episodic_return);
                                csv.write_row(&row.columns())
                            },
                            &mut |t| t.save_checkpoint(&checkpoint),
                        )?;
                    }
                }
                Ok(members.iter().zip(&trainers).map(|(m, t)| m.status(t)).collect())
            })(),
            Command::Save(which) => saved_together(|| {
                members
                    .iter()
                    .zip(&trainers)
                    .filter(|(m, _)| which.contains(&m.index))
                    .map(|(m, t)| {
                        t.save_checkpoint(&m.dir.checkpoint_path())?;
                        Ok(m.status(t))
                    })
                    .collect()
            }),
            Command::Exploit { member, config, from } => {
                let k = members.iter().position(|m| m.index == member).expect("the main thread routes by index");
                (|| {
                    let mut trainer = Trainer::resume(&config, &from)
                        .map_err(|e| Error::RunDir(format!("member {member} copying {}: {e}", from.display())))?;
                    trainer.set_quiet(true);
                    trainers[k] = trainer;
                    let m = &members[k];
                    write_atomic(&m.dir.path().join(crate::run_dir::CONFIG_FILE), config.to_toml().as_bytes())?;
                    trainers[k].save_checkpoint(&m.dir.checkpoint_path())?;
                    Ok(vec![m.status(&trainers[k])])
                })()
            }
            Command::Finish => saved_together(|| {
                members
                    .iter()
                    .zip(&trainers)
                    .map(|(m, t)| {
                        t.save_checkpoint(&m.dir.checkpoint_path())?;
                        let model = m.dir.model_path();
                        t.agent().save_weights(&model)?;
                        Ok(m.status(t))
                    })
                    .collect()
            }),
        };
        let failed = reply.is_err();
        if replies.send(reply).is_err() || failed {
            return;
        }
    }
}

/// The worker threads and which members each holds.
struct Workers {
    senders: Vec<mpsc::Sender<Command>>,
    replies: Vec<mpsc::Receiver<Result<Vec<Status>>>>,
    thread_of: BTreeMap<usize, usize>,
}

impl Workers {
    fn start<'s>(
        scope: &'s std::thread::Scope<'s, '_>,
        starts: Vec<MemberStart>,
        threads: usize,
        batched: Option<Lockstep>,
    ) -> Result<Self> {
        let threads = threads.clamp(1, starts.len().max(1));
        let mut shares: Vec<Vec<MemberStart>> = (0..threads).map(|_| Vec::new()).collect();
        let mut thread_of = BTreeMap::new();
        for (i, s) in starts.into_iter().enumerate() {
            thread_of.insert(s.index, i % threads);
            shares[i % threads].push(s);
        }
        let (mut senders, mut replies) = (Vec::new(), Vec::new());
        for (t, share) in shares.into_iter().enumerate() {
            let (command_tx, command_rx) = mpsc::channel();
            let (reply_tx, reply_rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("population-{t}"))
                .spawn_scoped(scope, move || worker(share, batched, command_rx, reply_tx))
                .map_err(|e| Error::Config(format!("starting a population thread: {e}")))?;
            senders.push(command_tx);
            replies.push(reply_rx);
        }
        let workers = Workers { senders, replies, thread_of };
        for t in 0..workers.senders.len() {
            workers.receive(t)?;
        }
        Ok(workers)
    }

    fn receive(&self, t: usize) -> Result<Vec<Status>> {
        self.replies[t].recv().map_err(|_| Error::Config(format!("population thread {t} stopped")))?
    }

    /// Send each thread its command (None: none) and gather every reply.
    fn all(&self, command: impl Fn(usize) -> Option<Command>) -> Result<Vec<Status>> {
        let mut asked = Vec::new();
        for (t, sender) in self.senders.iter().enumerate() {
            if let Some(c) = command(t) {
                sender.send(c).map_err(|_| Error::Config(format!("population thread {t} stopped")))?;
                asked.push(t);
            }
        }
        let mut out = Vec::new();
        let mut first_error = None;
        for t in asked {
            match self.receive(t) {
                Ok(s) => out.extend(s),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => {
                out.sort_by_key(|s| s.index);
                Ok(out)
            }
        }
    }
}

/// Train a new population as `base` (with `[population]`) says: this job's share of the members, into `out`
/// (refused if it already holds a run). Every member's config is built and checked before anything is written.
pub fn train(base: &ExperimentConfig, out: &Path, job: JobShare, stop_at: u64) -> Result<Vec<MemberResult>> {
    let population = base.population.clone().ok_or_else(|| Error::Config("no [population] in the config".into()))?;
    if job.jobs == 0 || job.index >= job.jobs {
        return Err(Error::Config(format!("job {} of {}: the index must be below the job count", job.index, job.jobs)));
    }
    if job.jobs > 1 && population.pbt.is_some() {
        return Err(Error::Config(
            "[population.pbt] with several jobs: PBT copies members into each other, so one process must train \
             the whole population (jobs = 1)"
                .into(),
        ));
    }
    if job.jobs > population.size {
        return Err(Error::Config(format!(
            "{} jobs for {} members: some jobs would have no member",
            job.jobs, population.size
        )));
    }
    let plans: Vec<MemberPlan> =
        population.members(base)?.into_iter().filter(|p| p.index % job.jobs == job.index).collect();
    base.run.device.resolve()?;
    if out.join(crate::run_dir::CONFIG_FILE).exists() {
        return Err(Error::RunDir(format!("{} already holds a run; choose another --out", out.display())));
    }
    RunDir::create(out, base)?;
    let record = PopulationRecord {
        size: population.size,
        base_seed: base.run.seed,
        sweep_keys: population.ranges()?.into_keys().collect(),
        pbt: population.pbt.is_some(),
        jobs: job.jobs,
        job_index: job.index,
        members: plans
            .iter()
            .map(|p| MemberRecord {
                index: p.index,
                seed: p.seed,
                dir: member_dir(p.index),
                hyperparameters: p.hyperparameters.clone(),
            })
            .collect(),
    };
    let starts = saved_together(|| {
        let create = |p: &MemberPlan| {
            let dir = RunDir::create(&out.join(member_dir(p.index)), &p.config)?;
            Ok(MemberStart { index: p.index, config: p.config.clone(), dir, resume: false })
        };
        plans.iter().map(create).collect::<Result<Vec<_>>>()
    })?;
    record.write(out)?;
    let state = PopulationState { env_steps: 0, rng: pbt_rng(base.run.seed) };
    write_state(out, &state)?;
    info!(
        "population of {} ({} here) in {}: members/NNN are its members' run directories",
        population.size,
        plans.len(),
        out.display()
    );
    run(base, &population, out, &record, starts, state, stop_at)
}

/// Continue the population in `dir` from its members' checkpoints (and PBT from its saved generator).
pub fn resume(dir: &Path, stop_at: u64) -> Result<Vec<MemberResult>> {
    let (_, base) = RunDir::open(dir)?;
    let population = base
        .population
        .clone()
        .ok_or_else(|| Error::RunDir(format!("{}: its config.toml has no [population]", dir.display())))?;
    let record = PopulationRecord::read(dir)?;
    let state: PopulationState = {
        let path = dir.join(STATE_FILE);
        let text =
            std::fs::read_to_string(&path).map_err(|e| Error::RunDir(format!("reading {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| Error::RunDir(format!("{}: {e}", path.display())))?
    };
    // PBT steps past the state's were not completed: drop them from the lineage.
    let lineage = read_lineage(dir)?;
    if lineage.iter().any(|e| e.env_steps > state.env_steps) {
        let kept: String = lineage
            .iter()
            .filter(|e| e.env_steps <= state.env_steps)
            .map(|e| serde_json::to_string(e).expect("plain data") + "\n")
            .collect();
        write_atomic(&dir.join(LINEAGE_FILE), kept.as_bytes())?;
    }
    let mut starts = Vec::new();
    for m in &record.members {
        let (member_dir, config) = RunDir::open(&dir.join(&m.dir))?;
        starts.push(MemberStart { index: m.index, config, dir: member_dir, resume: true });
    }
    info!("resuming the population in {} ({} members) from env step {}", dir.display(), starts.len(), state.env_steps);
    run(&base, &population, dir, &record, starts, state, stop_at)
}

fn member_dir(index: usize) -> PathBuf {
    Path::new(MEMBERS_DIR).join(format!("{index:03}"))
}

fn pbt_rng(seed: u64) -> Pcg64 {
    Pcg64::new(0x5eed_0f9b_7a11_ce55 ^ u128::from(seed), 0xa02b_dbf7_bb3c_0a7a)
}

fn write_state(dir: &Path, state: &PopulationState) -> Result<()> {
    write_atomic(&dir.join(STATE_FILE), serde_json::to_string(state).expect("plain data").as_bytes())
}

#[allow(clippy::too_many_arguments)]
fn run(
    base: &ExperimentConfig,
    population: &PopulationConfig,
    out: &Path,
    record: &PopulationRecord,
    starts: Vec<MemberStart>,
    mut state: PopulationState,
    stop_at: u64,
) -> Result<Vec<MemberResult>> {
    let total = base.run.total_env_steps;
    let end = total.min(stop_at);
    let segment = match &population.pbt {
        Some(pbt) => pbt.interval_steps,
        None => (total / 20).max(1),
    };
    let threads = match population.threads {
        0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        n => n,
    };
    let ranges = population.ranges()?;
    // Each member's config as text and table, and its current hyperparameters (for PBT's copies).
    let mut current: BTreeMap<usize, (u64, BTreeMap<String, f64>)> = BTreeMap::new();
    for m in &record.members {
        let (_, config) = RunDir::open(&out.join(&m.dir))?;
        current.insert(m.index, (m.seed, super::read_back(&config, &m.hyperparameters)?));
    }
    let mut plain = base.clone();
    plain.population = None;
    let text = plain.to_toml();
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
    let dirs: BTreeMap<usize, PathBuf> = record.members.iter().map(|m| (m.index, out.join(&m.dir))).collect();

    std::thread::scope(|scope| -> Result<Vec<MemberResult>> {
        let lockstep = lockstep(population, threads.clamp(1, starts.len().max(1)));
        let workers = Workers::start(scope, starts, threads, lockstep)?;
        let mut at = state.env_steps;
        while at < end {
            let next = (at / segment + 1) * segment;
            let target = next.min(end);
            let statuses = workers.all(|_| Some(Command::RunTo(target)))?;
            at = statuses.iter().map(|s| s.env_steps).min().unwrap_or(target);
            log_segment(at, total, &statuses);
            if let Some(pbt) = &population.pbt
                && target == next
                && at < total
            {
                let events = pbt_step(pbt, &statuses, &mut state.rng, &mut current, &ranges, &text, &table, at)?;
                let sources: Vec<usize> = events.iter().map(|(e, _)| e.source).collect();
                let of = |i: &usize| workers.thread_of[i];
                workers.all(|t| {
                    let mine: Vec<usize> = sources.iter().copied().filter(|i| of(i) == t).collect();
                    (!mine.is_empty()).then_some(Command::Save(mine))
                })?;
                for (event, config) in &events {
                    let from = dirs[&event.source].join(crate::run_dir::CHECKPOINT_FILE);
                    let t = of(&event.member);
                    workers.all(|u| {
                        (u == t).then(|| Command::Exploit {
                            member: event.member,
                            config: Box::new(config.clone()),
                            from: from.clone(),
                        })
                    })?;
                    info!(
                        "pbt at {at} env steps: member {} ◄ member {} ({})",
                        event.member,
                        event.source,
                        format_hyperparameters(&event.hyperparameters)
                    );
                }
                append_lineage(out, events.iter().map(|(e, _)| e))?;
            }
            state.env_steps = at;
            if target == next || at >= end {
                write_state(out, &state)?;
            }
        }
        let statuses = workers.all(|_| Some(Command::Finish))?;
        write_state(out, &state)?;
        Ok(statuses
            .into_iter()
            .map(|s| MemberResult {
                index: s.index,
                seed: current[&s.index].0,
                hyperparameters: current[&s.index].1.clone(),
                dir: dirs[&s.index].clone(),
                report: s.report,
            })
            .collect())
    })
}

fn format_hyperparameters(h: &BTreeMap<String, f64>) -> String {
    h.iter().map(|(k, v)| format!("{k} = {v:.4e}")).collect::<Vec<_>>().join(", ")
}

fn log_segment(at: u64, total: u64, statuses: &[Status]) {
    let fit: Vec<f64> = statuses.iter().filter_map(|s| s.fitness).collect();
    let evals: Vec<f64> = statuses.iter().filter_map(|s| s.report.evals.last().map(|e| e.result.mean())).collect();
    // Before a member's first metrics row (or evaluation) there is nothing to summarise.
    let iqm = |v: &[f64]| if v.is_empty() { "-".to_string() } else { format!("{:.1}", crate::stats::iqm(v)) };
    info!(
        "population {at}/{total} env steps | {} members | recent training return IQM {} | last evaluation IQM {}",
        statuses.len(),
        iqm(&fit),
        iqm(&evals)
    );
}

/// PBT's exploit/explore at `env_steps`: the bottom quantile (by fitness) each copy a random member of the top
/// quantile, its hyperparameters multiplied by perturbation factors and kept inside the sweep's ranges.
#[allow(clippy::too_many_arguments)]
fn pbt_step(
    pbt: &super::PbtConfig,
    statuses: &[Status],
    rng: &mut Pcg64,
    current: &mut BTreeMap<usize, (u64, BTreeMap<String, f64>)>,
    ranges: &BTreeMap<String, (f64, f64)>,
    text: &str,
    table: &toml::Table,
    env_steps: u64,
) -> Result<Vec<(LineageEvent, ExperimentConfig)>> {
    let mut ranked: Vec<(f64, usize)> =
        statuses.iter().map(|s| (s.fitness.unwrap_or(f64::NEG_INFINITY), s.index)).collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let n = ((pbt.quantile * ranked.len() as f64).floor() as usize).max(1).min(ranked.len() / 2);
    if n == 0 {
        return Ok(Vec::new());
    }
    let bottom: Vec<usize> = ranked[..n].iter().map(|r| r.1).collect();
    let top: Vec<usize> = ranked[ranked.len() - n..].iter().map(|r| r.1).collect();
    let mut events = Vec::new();
    let mut bottom_sorted = bottom.clone();
    bottom_sorted.sort_unstable();
    for member in bottom_sorted {
        let source = top[rng.random_range(0..top.len())];
        let mut hyperparameters = current[&source].1.clone();
        for (key, value) in hyperparameters.iter_mut() {
            let factor = pbt.perturb[rng.random_range(0..pbt.perturb.len())];
            let (lo, hi) = ranges.get(key).copied().unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
            *value = (*value * factor).clamp(lo, hi);
        }
        let seed = current[&member].0;
        let config = super::member_config(text, table, seed, &hyperparameters)
            .map_err(|e| Error::Config(format!("pbt: member {member}: {e}")))?;
        let hyperparameters = super::read_back(&config, &hyperparameters)?;
        current.insert(member, (seed, hyperparameters.clone()));
        events.push((LineageEvent { env_steps, member, source, hyperparameters }, config));
    }
    Ok(events)
}

fn append_lineage<'a>(dir: &Path, events: impl Iterator<Item = &'a LineageEvent>) -> Result<()> {
    let path = dir.join(LINEAGE_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::RunDir(format!("opening {}: {e}", path.display())))?;
    let mut text = String::new();
    for e in events {
        text += &serde_json::to_string(e).expect("plain data");
        text.push('\n');
    }
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_data())
        .map_err(|e| Error::RunDir(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_step_threads_share_the_cores_only_for_large_joint_batches() {
        let auto = Lockstep { batched_acting: None, step_threads: 0, cores: 16 };
        assert_eq!(auto.step_threads(16_384), 16, "2,048 members × 8 envs: every core left to the worker");
        assert_eq!(auto.step_threads(AUTO_STEP_THREADS_ENVS), 16);
        assert_eq!(auto.step_threads(AUTO_STEP_THREADS_ENVS - 1), 1, "a small batch steps on its own thread");
        let set = Lockstep { step_threads: 3, ..auto };
        assert_eq!((set.step_threads(24), set.step_threads(16_384)), (3, 3), "a set count is taken as it is");
        // The cores are shared among the worker threads.
        let population: PopulationConfig = toml::from_str("size = 64").unwrap();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let l = lockstep(&population, 2).expect("batched by default");
        assert_eq!(l.cores, (cores / 2).max(1));
        assert!(lockstep(&PopulationConfig { batched: false, ..population }, 1).is_none());
    }
}
