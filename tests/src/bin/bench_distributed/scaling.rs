//! Scaling with actor processes (`--only scaling`): the real CLI, `flotilla train CONFIG --actors N`, on
//! Latency-v0 with one env per actor for N = 1, 2, 4, … up to `--max-actors`; steady-state SPS comes from the
//! run's `metrics.csv`, CPU use over the same window from [`CpuMark`], and the run is stopped with SIGINT.
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cpu_accounting::CpuMark;
use crate::hub::TlsFiles;
use crate::{Args, BenchResult};
use flotilla_tests::procfs::{self, learner_and_actors};

/// Latency-v0 with one env per actor and a PPO learner kept cheap: 16 hidden units, one epoch, one minibatch
/// (`batch_size` = the whole rollout, set per run), evaluation only at the end (and the run is stopped before).
const SCALING_CONFIG: &str = r#"
[run]
seed = 1
device = "cpu"
torch_threads = 1

[env]
id = "Latency-v0"
kwargs = { step_latency_us = 1000 }

[algorithm]
kind = "ppo"
n_steps = 32
n_epochs = 1
hidden_sizes = [16]

[eval]
episodes = 1
interval_steps = 0

[learner]
max_policy_lag = 1000

[actors]
envs_per_actor = 1
"#;

/// Env step of Latency-v0 in this config, and the ideal steps/s of one single-env actor.
const STEP_LATENCY_US: f64 = 1000.0;

/// One scaling run's steady state.
struct Steady {
    sps: f64,
    secs: f64,
    /// The learner process's resident memory at the end of the steady window, MiB.
    learner_rss_mib: f64,
    /// Messages the learner refused over the whole run (none expected from real actors).
    refused: f64,
    /// The deepest the ingest queue was at any logged row of the steady window (its capacity: one learner
    /// batch, N chunks).
    queue_max: f64,
    /// Learner process CPU over the steady window, in cores.
    learner_cores: f64,
    /// All actor processes' CPU over the steady window, in cores.
    actor_cores: f64,
    /// Everything else on the machine (other users included) over the steady window, in cores.
    other_cores: f64,
}

/// The columns of metrics.csv this benchmark reads, in [`Row`]'s order.
const COLUMNS: [&str; 5] =
    ["env_steps", "train_secs", "charts/actors", "charts/refused_messages", "charts/queue_depth"];

/// One metrics row: env steps, train seconds, actors registered, refused messages so far, queue depth.
type Row = [f64; 5];

/// Metrics rows (the [`COLUMNS`]).
fn read_metrics(path: &Path) -> Vec<Row> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Vec::new() };
    let cols: HashMap<&str, usize> = header.split(',').enumerate().map(|(i, c)| (c, i)).collect();
    let Some(at) = COLUMNS.iter().map(|c| cols.get(c).copied()).collect::<Option<Vec<usize>>>() else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let get = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok());
            Some([get(at[0])?, get(at[1])?, get(at[2])?, get(at[3])?, get(at[4])?])
        })
        .collect()
}

/// Resident memory of process `pid`, MiB (0 where /proc does not say).
fn rss_mib(pid: u32) -> f64 {
    procfs::rss_kib(pid).map_or(0.0, |k| k as f64 / 1024.0)
}

/// The first steady row: one row after the first row with all `n` actors registered (that row still
/// covers the ramp-up).
fn steady_start(rows: &[Row], n: usize) -> Option<usize> {
    rows.iter().position(|r| r[2] >= n as f64).map(|i| i + 1).filter(|&i| i < rows.len())
}

/// Ask the learner to stop (it stops its actors), then wait for it; kill it if it does not exit.
fn stop_child(child: &mut Child) -> BenchResult<()> {
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// `flotilla train CONFIG --actors n` until `steady` seconds of steady state are in its metrics; over TLS when
/// `tls` is given (the learner serves its certificate, the launched actors trust its CA).
fn scaling_run(
    flotilla: &Path,
    config: &Path,
    out: &Path,
    n: usize,
    steady: f64,
    tls: Option<&TlsFiles>,
) -> BenchResult<Steady> {
    // Rows about every 0.5 s at the ideal rate; the budget is only a safety stop (10 min at the ideal rate).
    let ideal = n as f64 * 1e6 / STEP_LATENCY_US;
    let log_path = out.with_extension("log");
    let log = std::fs::File::create(&log_path)?;
    let mut sets = vec![
        format!("env.num_envs={n}"),
        format!("algorithm.batch_size={}", 32 * n),
        format!("run.total_env_steps={}", (ideal * 600.0) as u64),
        format!("metrics.log_interval_steps={}", (ideal * 0.5) as u64),
    ];
    if let Some(t) = tls {
        sets.push(format!("transport.tls_cert={}", t.cert.display()));
        sets.push(format!("transport.tls_key={}", t.key.display()));
        sets.push(format!("transport.tls_ca={}", t.ca.display()));
    }
    let mut cmd = Command::new(flotilla);
    cmd.arg("train").arg(config).args(["--actors", &n.to_string()]).arg("--out").arg(out);
    for s in &sets {
        cmd.args(["--set", s]);
    }
    let mut child = cmd.stdout(Stdio::from(log.try_clone()?)).stderr(Stdio::from(log)).spawn()?;
    let metrics = out.join("metrics.csv");
    let started = Instant::now();
    let timeout = Duration::from_secs(180) + Duration::from_secs_f64(steady * 4.0);
    // CPU counters from when the first steady row appeared.
    let mut mark: Option<CpuMark> = None;
    let result = loop {
        thread::sleep(Duration::from_millis(100));
        if let Some(status) = child.try_wait()? {
            break Err(format!("flotilla train --actors {n} exited early ({status}); see {}", log_path.display()));
        }
        if started.elapsed() > timeout {
            break Err(format!("flotilla train --actors {n}: no steady state within {timeout:?}"));
        }
        let rows = read_metrics(&metrics);
        let Some(first) = steady_start(&rows, n) else { continue };
        let mark = mark.get_or_insert_with(|| CpuMark::take(child.id()));
        let (last, base) = (rows[rows.len() - 1], rows[first]);
        if last[1] - base[1] >= steady {
            let (learner_cores, actor_cores, other_cores) = mark.usage(&CpuMark::take(child.id()));
            let secs = last[1] - base[1];
            let queue_max = rows[first..].iter().map(|r| r[4]).fold(0.0, f64::max);
            break Ok(Steady {
                sps: (last[0] - base[0]) / secs,
                secs,
                learner_rss_mib: learner_and_actors(child.id()).0.map_or(f64::NAN, rss_mib),
                refused: last[3],
                queue_max,
                learner_cores,
                actor_cores,
                other_cores,
            });
        }
    };
    stop_child(&mut child)?;
    Ok(result?)
}

/// One row of the scaling table.
fn print_row(actors: &str, s: &Steady, ideal: f64) {
    println!(
        "| {actors} | {:.0} | {ideal:.0} | {:.1} % | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} |",
        s.sps,
        100.0 * s.sps / ideal,
        s.secs,
        s.learner_cores,
        s.actor_cores,
        1e6 * s.actor_cores / s.sps,
        s.other_cores,
        s.learner_rss_mib,
        s.refused,
        s.queue_max
    );
}

/// `MemAvailable` from /proc/meminfo, GiB.
fn mem_available_gib() -> f64 {
    procfs::kib("/proc/meminfo", "MemAvailable").map_or(0.0, |k| k as f64 / (1024.0 * 1024.0))
}

pub(crate) fn scaling_table(args: &Args) -> BenchResult<()> {
    let flotilla = std::env::current_exe()?.with_file_name("flotilla");
    if !flotilla.is_file() {
        return Err(format!(
            "{} is missing: build it first with `cargo build --release --bin flotilla`",
            flotilla.display()
        )
        .into());
    }
    let dir = std::env::temp_dir().join(format!("flotilla-bench-distributed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("latency_ppo.toml");
    std::fs::write(&config, SCALING_CONFIG)?;
    let steady = if args.quick { 1.5 } else { 5.0 };
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "## Scaling: `flotilla train --actors N` on Latency-v0 (1 ms steps, 1 env per actor, ideal 1000 steps/s \
         per actor; PPO n_steps 32, 1 epoch, 1 minibatch, hidden [16]; ≥ {steady} s steady state per point; \
         {cores} cores)\n"
    );
    println!(
        "| actors | SPS | ideal (N × SPS(1)) | efficiency | steady s | learner CPU (cores) | actors CPU (cores) | \
         actor CPU per step (µs) | other processes (cores) | learner RSS (MiB) | refused | queue max (of N) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let counts: Vec<usize> =
        [1, 2, 4, 8, 16, 32, 64, 128, 256].into_iter().filter(|&n| n <= args.max_actors.max(1)).collect();
    let (mut one, mut last, mut at64) = (None, None, None);
    for &n in &counts {
        // An actor process holds ~77 MiB (its proportional share of resident memory, measured: 60 MiB of it
        // private, most of that libtorch's operator registry); 1.5 GiB for the learner and headroom.
        let need = (n as f64 * 80.0 + 1536.0) / 1024.0;
        let available = mem_available_gib();
        if available < need {
            println!(
                "| {n} | not run: needs ~{need:.1} GiB of memory, {available:.1} GiB available | | | | | | | | | | |"
            );
            break;
        }
        let s = scaling_run(&flotilla, &config, &dir.join(format!("actors-{n}")), n, steady, None)?;
        let base = *one.get_or_insert(s.sps);
        let ideal = n as f64 * base;
        print_row(&n.to_string(), &s, ideal);
        last = Some((n, s.sps / ideal));
        if n == 64 {
            at64 = Some(s.sps / ideal);
        }
    }
    // The largest count again over TLS (and 64, where that is larger): TLS's cost on a loaded learner.
    if let Some((n, _)) = last {
        let tls = TlsFiles::write(&dir.join("tls"))?;
        for m in [n.min(64), n].into_iter().filter(|&m| m > 1).collect::<std::collections::BTreeSet<_>>() {
            let s = scaling_run(&flotilla, &config, &dir.join(format!("actors-{m}-tls")), m, steady, Some(&tls))?;
            print_row(&format!("{m}, TLS"), &s, m as f64 * one.unwrap_or(0.0));
        }
    }
    if let Some((n, eff)) = last {
        let verdict = match at64 {
            Some(e) if e >= 0.9 => format!("met ({:.1} %)", 100.0 * e),
            Some(e) => format!("NOT met ({:.1} %)", 100.0 * e),
            None => format!("not measured (largest run: {n} actors)"),
        };
        println!(
            "\nTarget ≥ 90 % efficiency at 64 actors: {verdict}; {:.1} % at {n} actors. SPS(1) is {:.0} of an ideal \
             {:.0}: each step is the 1 ms latency plus the actor's policy forward pass and chunk sending. Learner \
             CPU near 1 core would mean the learner is the bottleneck; learner + actors + other processes near \
             {cores} cores means the machine is (CPU from /proc, 100 ticks/s assumed).\n",
            100.0 * eff,
            one.unwrap_or(0.0),
            1e6 / STEP_LATENCY_US
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
