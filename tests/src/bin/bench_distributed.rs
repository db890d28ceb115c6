//! Flotilla's distributed benchmark: the wire, the hub and actor processes, as three markdown tables.
//!
//! `cargo run --release -p flotilla-tests --bin flotilla-bench-distributed [-- --quick]
//! [--only ingest,scaling,broadcast,ppo] [--max-actors N]`
//!
//! 1. **Learner ingest, gRPC vs local** (`ingest`). A [`Hub`] served over loopback gRPC takes CartPole chunks
//!    (8 envs × 128 steps, log-probs, values, episode ends with final observations) from 1, 2 and 4 client
//!    threads, each with its own connection, registered, sending as fast as acks come back. A consumer thread
//!    drains the ingest queue and only counts, so this is encoding, HTTP/2, decoding, validation and the
//!    queue — no training. The same again with in-process [`LocalClient`]s gives the ratio. MiB/s counts the
//!    protobuf-encoded chunk for both carriers. Target: ≥ 1 M transitions/s over loopback gRPC.
//! 2. **Scaling with actor processes** (`scaling`). The real CLI, `flotilla train CONFIG --actors N`, on
//!    Latency-v0 (CartPole with a 1 ms step) with one env per actor, so an actor steps at most ~1000 env
//!    steps/s, for N = 1, 2, 4, … up to `--max-actors` (64; 4 with `--quick`). The learner runs PPO with a
//!    16-unit network, one epoch and one minibatch, so it stays cheap. Steady-state SPS comes from the run's
//!    `metrics.csv` (`env_steps` and `train_secs`), over the rows after every actor has registered and one
//!    more row has passed; the run is stopped with SIGINT once ~5 s (1.5 s quick) of steady state are in.
//!    Efficiency is SPS(N) / (N · SPS(1)); target ≥ 90 % at 64 actors. The CPU columns (from `/proc`, over
//!    the same window) say who used the cores: the learner process, its actor processes, everything else on
//!    the machine. Needs the `flotilla` binary next to this one (`cargo build --release --bin flotilla`).
//! 3. **Parameter broadcast** (`broadcast`). A Nature-CNN for 4×84×84 frames with 18 actions (its real
//!    parameter count, ~1.7 M, built with [`NatureCnn`]) is published on a gRPC hub; 16 registered clients (and
//!    then 1) each fetch the new version at once. Reported: time from `publish` until every client holds it,
//!    median and max over 10 rounds (3 quick) after a warm-up round, and aggregate MB/s (10⁶ bytes of f32
//!    payload per second at the median).
//!
//! 4. **PPO to 475, single-process vs actors** (`ppo`). `flotilla train examples/configs/cartpole_ppo.toml`
//!    without and with `--actors 2` / `--actors 4` (and 4 with `learner.synchronous = true`), seeds 1–3, one after another in this run: training seconds
//!    (wall-clock minus evaluations; for actor runs from the learner's start, actor start-up included) and
//!    env steps at the first evaluation ≥ 475 (every 5 K steps), and whether the last two evaluations held it.
//!
//! Timings are wall-clock on whatever machine runs this: on a small shared machine the client threads, the
//! server's two IO workers and the consumer compete for the same cores.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use flotilla_algorithms::nets::NatureCnn;
use flotilla_core::{Chunk, ChunkSpec, DType, EpisodeStats, ObsBuf, Space};
use flotilla_envs::Kwargs;
use flotilla_learner::config::Family;
use flotilla_learner::hub::{Delivery, Hub, HubSpec, next_delivery};
use flotilla_transport::grpc::{GrpcClient, Limits, ServerHandle, serve};
use flotilla_transport::local::LocalClient;
use flotilla_transport::{LearnerClient, Registration, RunInfo, codec};
use prost::Message;
use tch::nn;
use tokio::sync::mpsc::Receiver;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BenchResult<T> = Result<T, BoxError>;

const TOKEN: &str = "bench-token";
const RUN_ID: &str = "bench-distributed";
/// CartPole chunk shape for the ingest table.
const ENVS: usize = 8;
const STEPS: usize = 128;
const OBS_DIM: usize = 4;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

const USAGE: &str =
    "usage: flotilla-bench-distributed [--quick] [--only ingest,scaling,broadcast,ppo] [--max-actors N]";

/// Command-line flags.
struct Args {
    quick: bool,
    only: Option<Vec<String>>,
    max_actors: usize,
}

impl Args {
    fn parse() -> BenchResult<Args> {
        let mut args = std::env::args().skip(1);
        let (mut quick, mut only, mut max_actors) = (false, None, None);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--quick" => quick = true,
                "--only" => {
                    let list = args.next().ok_or(format!("--only needs a list\n{USAGE}"))?;
                    let names: Vec<String> = list.split(',').map(str::to_string).collect();
                    if let Some(bad) =
                        names.iter().find(|n| !["ingest", "scaling", "broadcast", "ppo"].contains(&n.as_str()))
                    {
                        return Err(
                            format!("--only {bad:?}: expected ingest, scaling, broadcast or ppo\n{USAGE}").into()
                        );
                    }
                    only = Some(names);
                }
                "--max-actors" => {
                    let n = args.next().ok_or(format!("--max-actors needs a number\n{USAGE}"))?;
                    max_actors = Some(n.parse().map_err(|e| format!("--max-actors {n:?}: {e}\n{USAGE}"))?);
                }
                other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
            }
        }
        Ok(Args { quick, only, max_actors: max_actors.unwrap_or(if quick { 4 } else { 64 }) })
    }

    fn wants(&self, table: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|t| t == table))
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> BenchResult<()> {
    let args = Args::parse()?;
    flotilla_learner::tune_allocator();
    if args.wants("ingest") {
        ingest_table(&args)?;
    }
    if args.wants("scaling") {
        scaling_table(&args)?;
    }
    if args.wants("broadcast") {
        broadcast_table(&args)?;
    }
    if args.wants("ppo") {
        ppo_table(&args)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// Shared: the hub, its server runtime, clients.

/// The server's IO runtime, shaped like the distributed learner's (two workers).
fn io_runtime() -> BenchResult<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-io").enable_all().build()?)
}

fn cartpole_spaces() -> BenchResult<(Space, Space)> {
    let env = flotilla_envs::make("CartPole-v1", &Kwargs::default())?;
    Ok((env.observation_space().clone(), env.action_space().clone()))
}

/// An on-policy CartPole hub for `n_actors` actors with `params` as version 0.
fn cartpole_hub(n_actors: usize, params: Vec<f32>) -> BenchResult<(Arc<Hub>, Receiver<Delivery>)> {
    let (observation_space, action_space) = cartpole_spaces()?;
    let spec = HubSpec {
        run: RunInfo { run_id: RUN_ID.into(), config_toml: String::new() },
        observation_space,
        action_space,
        chunk: ChunkSpec {
            obs_dim: OBS_DIM,
            obs_dtype: DType::F32,
            act_dim: 1,
            n_envs: ENVS,
            n_steps: STEPS,
            needs_behaviour: true,
        },
        family: Family::OnPolicy,
        n_actors,
        seed: 0,
        n_params: params.len(),
        queue: 64,
        synchronous: false,
        total_env_steps: u64::MAX,
    };
    Ok(Hub::new(spec, params))
}

/// Register `client` in slot `index`; returns its actor id.
fn register(client: &mut dyn LearnerClient, index: usize) -> BenchResult<u64> {
    let (observation_space, action_space) = cartpole_spaces()?;
    let registration = Registration {
        run_id: RUN_ID.into(),
        observation_space,
        action_space,
        n_envs: ENVS,
        actor_index: Some(index as u32),
        host: "localhost".into(),
        pid: std::process::id(),
    };
    Ok(client.register(&registration)?.actor_id)
}

/// Opens one client connection (called on the client's own thread).
type Connect<'a> = &'a (dyn Fn() -> BenchResult<Box<dyn LearnerClient>> + Sync);

fn grpc_connector(addr: SocketAddr, limits: Limits) -> impl Fn() -> BenchResult<Box<dyn LearnerClient>> + Sync {
    let addr = addr.to_string();
    move || Ok(Box::new(GrpcClient::connect(&addr, TOKEN, &limits, CONNECT_TIMEOUT)?) as Box<dyn LearnerClient>)
}

fn serve_grpc(runtime: &tokio::runtime::Runtime, hub: &Arc<Hub>, limits: &Limits) -> BenchResult<ServerHandle> {
    let addr: SocketAddr = "127.0.0.1:0".parse()?;
    Ok(serve(runtime.handle(), hub.clone(), addr, TOKEN, limits)?)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

// ---------------------------------------------------------------------------------------------------------
// (a) Learner ingest.

/// A valid CartPole chunk: 8 envs × 128 steps, discrete actions as f32, behaviour log-probs and values, and an
/// episode end (mostly terminated, every fourth truncated) about every 40 steps per env.
fn cartpole_chunk() -> Chunk {
    let n = STEPS * ENVS;
    let wave = |i: usize, scale: f32| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * scale;
    let ends: Vec<usize> = (0..n).filter(|&i| (i / ENVS + 13 * (i % ENVS)) % 40 == 39).collect();
    let (mut terminated, mut truncated) = (vec![false; n], vec![false; n]);
    for (k, &i) in ends.iter().enumerate() {
        if k % 4 == 3 { truncated[i] = true } else { terminated[i] = true }
    }
    Chunk {
        actor_id: 0,
        policy_version: 0,
        n_steps: STEPS,
        n_envs: ENVS,
        obs: ObsBuf::F32((0..n * OBS_DIM).map(|i| wave(i, 0.2)).collect()),
        bootstrap_obs: ObsBuf::F32((0..ENVS * OBS_DIM).map(|i| wave(i + 3, 0.2)).collect()),
        actions: (0..n).map(|i| (i % 2) as f32).collect(),
        rewards: vec![1.0; n],
        terminated,
        truncated,
        log_probs: (0..n).map(|i| -0.69 + wave(i, 0.01)).collect(),
        values: (0..n).map(|i| 10.0 + wave(i, 5.0)).collect(),
        final_index: ends.iter().map(|&i| i as u32).collect(),
        final_obs: ObsBuf::F32((0..ends.len() * OBS_DIM).map(|i| wave(i + 7, 0.25)).collect()),
        episodes: ends.iter().map(|_| EpisodeStats { episode_return: 40.0, length: 40 }).collect(),
    }
}

/// Chunks and transitions per second that reached the consumer.
struct Rate {
    chunks: f64,
    transitions: f64,
}

/// `clients` threads send `chunk` through `connect`ed clients as fast as they can while a consumer thread drains
/// `rx`; the rate is what the consumer received during `window`, after `warmup`.
fn measure_ingest(
    runtime: &tokio::runtime::Runtime,
    mut rx: Receiver<Delivery>,
    connect: Connect,
    clients: usize,
    chunk: &Chunk,
    (warmup, window): (Duration, Duration),
) -> BenchResult<Rate> {
    let (chunks, transitions) = (AtomicU64::new(0), AtomicU64::new(0));
    let (stop_clients, stop_consumer) = (AtomicBool::new(false), AtomicBool::new(false));
    let handle = runtime.handle();
    thread::scope(|s| {
        let consumer = s.spawn(|| {
            while !stop_consumer.load(Ordering::Relaxed) {
                if let Some(Delivery::Chunk(c)) = next_delivery(handle, &mut rx, Duration::from_millis(20)) {
                    transitions.fetch_add(c.transitions() as u64, Ordering::Relaxed);
                    chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let senders: Vec<_> = (0..clients)
            .map(|i| {
                let stop = &stop_clients;
                s.spawn(move || -> BenchResult<()> {
                    let mut client = connect()?;
                    let mut chunk = chunk.clone();
                    chunk.actor_id = register(client.as_mut(), i)?;
                    while !stop.load(Ordering::Relaxed) {
                        client.send_chunk(&chunk)?;
                    }
                    Ok(())
                })
            })
            .collect();
        thread::sleep(warmup);
        let (c0, t0, start) = (chunks.load(Ordering::Relaxed), transitions.load(Ordering::Relaxed), Instant::now());
        thread::sleep(window);
        let (c1, t1, secs) =
            (chunks.load(Ordering::Relaxed), transitions.load(Ordering::Relaxed), start.elapsed().as_secs_f64());
        // The consumer keeps draining until every sender is out of a possibly full queue.
        stop_clients.store(true, Ordering::Relaxed);
        let results: Vec<BenchResult<()>> =
            senders.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("client thread panicked".into()))).collect();
        stop_consumer.store(true, Ordering::Relaxed);
        consumer.join().map_err(|_| "consumer thread panicked")?;
        results.into_iter().collect::<BenchResult<Vec<()>>>()?;
        Ok(Rate { chunks: (c1 - c0) as f64 / secs, transitions: (t1 - t0) as f64 / secs })
    })
}

fn ingest_table(args: &Args) -> BenchResult<()> {
    let timing = if args.quick {
        (Duration::from_millis(200), Duration::from_millis(500))
    } else {
        (Duration::from_millis(500), Duration::from_secs(2))
    };
    let chunk = cartpole_chunk();
    let bytes = codec::chunk_to_proto(&chunk, flotilla_transport::PROTOCOL_VERSION).encoded_len();
    let runtime = io_runtime()?;
    println!(
        "## Learner ingest: gRPC (loopback) vs in-process ({ENVS} envs × {STEPS} steps CartPole chunks, {:.1} KiB \
         encoded, {} episode ends; {:.1} s per point)\n",
        bytes as f64 / 1024.0,
        chunk.final_index.len(),
        timing.1.as_secs_f64()
    );
    println!("| carrier | clients | chunks/s | transitions/s | MiB/s | gRPC / local |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut best_grpc: f64 = 0.0;
    for clients in [1, 2, 4] {
        let (hub, rx) = cartpole_hub(clients, vec![0.0; 16])?;
        let server = serve_grpc(&runtime, &hub, &Limits::default())?;
        let grpc = measure_ingest(
            &runtime,
            rx,
            &grpc_connector(server.local_addr, Limits::default()),
            clients,
            &chunk,
            timing,
        )?;
        drop(server);

        let (hub, rx) = cartpole_hub(clients, vec![0.0; 16])?;
        let local_hub = hub.clone();
        let connect =
            move || Ok(Box::new(LocalClient::new(local_hub.clone(), TOKEN, TOKEN)?) as Box<dyn LearnerClient>);
        let local = measure_ingest(&runtime, rx, &connect, clients, &chunk, timing)?;

        best_grpc = best_grpc.max(grpc.transitions);
        let mib = |r: &Rate| r.chunks * bytes as f64 / (1 << 20) as f64;
        println!(
            "| gRPC | {clients} | {:.0} | {:.2} M | {:.0} | {:.2} |",
            grpc.chunks,
            grpc.transitions / 1e6,
            mib(&grpc),
            grpc.transitions / local.transitions
        );
        println!(
            "| local | {clients} | {:.0} | {:.2} M | {:.0} | — |",
            local.chunks,
            local.transitions / 1e6,
            mib(&local)
        );
    }
    let verdict = if best_grpc >= 1e6 { "met" } else { "NOT met" };
    println!("\nTarget ≥ 1 M transitions/s over loopback gRPC: {verdict} (best {:.2} M/s).\n", best_grpc / 1e6);
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// (b) Scaling with actor processes.

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
    /// Learner process CPU over the steady window, in cores.
    learner_cores: f64,
    /// All actor processes' CPU over the steady window, in cores.
    actor_cores: f64,
    /// Everything else on the machine (other users included) over the steady window, in cores.
    other_cores: f64,
}

/// Metrics rows as `(env_steps, train_secs, charts/actors)`.
fn read_metrics(path: &Path) -> Vec<(f64, f64, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Vec::new() };
    let cols: HashMap<&str, usize> = header.split(',').enumerate().map(|(i, c)| (c, i)).collect();
    let (Some(&steps), Some(&secs), Some(&actors)) =
        (cols.get("env_steps"), cols.get("train_secs"), cols.get("charts/actors"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let get = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok());
            Some((get(steps)?, get(secs)?, get(actors)?))
        })
        .collect()
}

/// The first steady row: one row after the first row with all `n` actors registered (that row still
/// covers the ramp-up).
fn steady_start(rows: &[(f64, f64, f64)], n: usize) -> Option<usize> {
    rows.iter().position(|r| r.2 >= n as f64).map(|i| i + 1).filter(|&i| i < rows.len())
}

/// User + system CPU seconds of process `pid` (`/proc/PID/stat`, assuming the usual 100 clock ticks/s).
fn process_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3 (state); utime and stime are 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// Child processes of `pid` (any of its threads may have spawned them).
fn child_pids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// CPU counters at one moment: the learner process, its actor processes, and the whole machine (jiffies).
struct CpuMark {
    at: Instant,
    learner: f64,
    actors: f64,
    machine_busy: f64,
}

impl CpuMark {
    fn take(learner: u32) -> CpuMark {
        let actors = child_pids(learner).into_iter().filter_map(process_cpu_secs).sum();
        let machine_busy = machine_jiffies().unwrap_or(f64::NAN);
        CpuMark { at: Instant::now(), learner: process_cpu_secs(learner).unwrap_or(f64::NAN), actors, machine_busy }
    }

    /// Cores busy from `self` to `later`: the learner's, the actors', and everyone else's on the machine.
    fn usage(&self, later: &CpuMark) -> (f64, f64, f64) {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let (learner, actors) = ((later.learner - self.learner) / wall, (later.actors - self.actors) / wall);
        let machine = (later.machine_busy - self.machine_busy) / 100.0 / wall;
        (learner, actors, machine - learner - actors)
    }
}

/// Busy jiffies of the whole machine, all CPUs (`/proc/stat`: everything but idle and iowait).
fn machine_jiffies() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<f64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: f64 = v.iter().sum();
    Some(total - v.get(3)? - v.get(4).unwrap_or(&0.0))
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

/// `flotilla train CONFIG --actors n` until `steady` seconds of steady state are in its metrics.
fn scaling_run(flotilla: &Path, config: &Path, out: &Path, n: usize, steady: f64) -> BenchResult<Steady> {
    // Rows about every 0.5 s at the ideal rate; the budget is only a safety stop (10 min at the ideal rate).
    let ideal = n as f64 * 1e6 / STEP_LATENCY_US;
    let log_path = out.with_extension("log");
    let log = std::fs::File::create(&log_path)?;
    let sets = [
        format!("env.num_envs={n}"),
        format!("algorithm.batch_size={}", 32 * n),
        format!("run.total_env_steps={}", (ideal * 600.0) as u64),
        format!("metrics.log_interval_steps={}", (ideal * 0.5) as u64),
    ];
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
        if last.1 - base.1 >= steady {
            let (learner_cores, actor_cores, other_cores) = mark.usage(&CpuMark::take(child.id()));
            let secs = last.1 - base.1;
            break Ok(Steady { sps: (last.0 - base.0) / secs, secs, learner_cores, actor_cores, other_cores });
        }
    };
    stop_child(&mut child)?;
    Ok(result?)
}

fn scaling_table(args: &Args) -> BenchResult<()> {
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
         actor CPU per step (µs) | other processes (cores) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let counts: Vec<usize> = [1, 2, 4, 8, 16, 32, 64].into_iter().filter(|&n| n <= args.max_actors.max(1)).collect();
    let mut one = None;
    let mut last = None;
    for &n in &counts {
        let s = scaling_run(&flotilla, &config, &dir.join(format!("actors-{n}")), n, steady)?;
        let base = *one.get_or_insert(s.sps);
        let ideal = n as f64 * base;
        println!(
            "| {n} | {:.0} | {ideal:.0} | {:.1} % | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} |",
            s.sps,
            100.0 * s.sps / ideal,
            s.secs,
            s.learner_cores,
            s.actor_cores,
            1e6 * s.actor_cores / s.sps,
            s.other_cores
        );
        last = Some((n, s.sps / ideal));
    }
    if let Some((n, eff)) = last {
        let verdict = match (n, eff >= 0.9) {
            (64, true) => "met".to_string(),
            (64, false) => "NOT met".to_string(),
            _ => format!("not measured (largest run: {n} actors)"),
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

// ---------------------------------------------------------------------------------------------------------
// (c) Parameter broadcast.

/// Parameters of a Nature-CNN torso for 4 stacked 84×84 frames with an 18-action linear head.
fn nature_cnn_params() -> usize {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let root = vs.root();
    let _torso = NatureCnn::new(&(&root / "torso"), 4);
    let _head = nn::linear(&root / "head", NatureCnn::FEATURES, 18, Default::default());
    vs.trainable_variables().iter().map(|t| t.numel()).sum()
}

/// Seconds from `publish` until all `clients` hold the new version, for `rounds` rounds after a warm-up.
fn broadcast_rounds(n_params: usize, clients: usize, rounds: usize) -> BenchResult<Vec<f64>> {
    let limits = Limits { max_message_bytes: 256 << 20 };
    let values: Vec<f32> = (0..n_params).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let (hub, _rx) = cartpole_hub(clients, values.clone())?;
    let runtime = io_runtime()?;
    let server = serve_grpc(&runtime, &hub, &limits)?;
    let connect = grpc_connector(server.local_addr, limits);
    let (start, done) = (Barrier::new(clients + 1), Barrier::new(clients + 1));
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |e: BoxError| {
        failure.lock().expect("failure slot").get_or_insert(e.to_string());
    };
    let mut times = Vec::new();
    thread::scope(|s| {
        for i in 0..clients {
            let (start, done, stop, connect, fail) = (&start, &done, &stop, &connect, &fail);
            s.spawn(move || {
                // Every client takes part in every barrier, even after a failure, so nobody waits forever.
                let setup = || -> BenchResult<(Box<dyn LearnerClient>, u64, u64)> {
                    let mut client = connect()?;
                    let id = register(client.as_mut(), i)?;
                    let have = client.params(id, None)?.ok_or("no initial parameters")?.version;
                    Ok((client, id, have))
                };
                let mut state = setup().map_err(fail).ok();
                start.wait(); // Everyone connected.
                done.wait();
                loop {
                    start.wait();
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Some((client, id, have)) = state.as_mut() {
                        match client.params(*id, Some(*have)) {
                            Ok(Some(p)) if p.value.len() == n_params => *have = p.version,
                            Ok(Some(p)) => fail(format!("{} parameters, expected {n_params}", p.value.len()).into()),
                            Ok(None) => fail("no new version after publish".into()),
                            Err(e) => fail(e.into()),
                        }
                    }
                    done.wait();
                }
            });
        }
        start.wait();
        done.wait();
        for round in 0..=rounds {
            let fresh = values.clone();
            let t0 = Instant::now();
            hub.publish(fresh);
            start.wait();
            done.wait();
            if round > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        stop.store(true, Ordering::SeqCst);
        start.wait();
    });
    drop(server);
    match failure.into_inner().expect("failure slot") {
        Some(e) => Err(format!("broadcast to {clients} clients: {e}").into()),
        None => Ok(times),
    }
}

fn broadcast_table(args: &Args) -> BenchResult<()> {
    let n_params = nature_cnn_params();
    let mb = n_params as f64 * 4.0 / 1e6;
    let rounds = if args.quick { 3 } else { 10 };
    println!(
        "## Parameter broadcast over loopback gRPC: Nature-CNN (4×84×84, 18 actions), {n_params} parameters = \
         {mb:.2} MB of f32; {rounds} rounds after a warm-up\n"
    );
    println!("| clients | median ms (publish → all have it) | max ms | aggregate MB/s (median) |");
    println!("|---:|---:|---:|---:|");
    for clients in [16, 1] {
        let mut times = broadcast_rounds(n_params, clients, rounds)?;
        let max = times.iter().copied().fold(0.0, f64::max);
        let med = median(&mut times);
        println!("| {clients} | {:.1} | {:.1} | {:.0} |", med * 1e3, max * 1e3, clients as f64 * mb / med);
    }
    println!();
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// PPO to 475: single-process against actor processes.

/// `(env_steps, train_secs)` at the first evaluation ≥ 475, and whether the last two evaluations are ≥ 475.
fn first_solved(metrics: &Path) -> BenchResult<(Option<(f64, f64)>, bool)> {
    let text = std::fs::read_to_string(metrics)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty metrics.csv")?.split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).ok_or(format!("no {name} column"));
    let (steps, secs, eval) = (col("env_steps")?, col("train_secs")?, col("eval/mean_return")?);
    let rows: Vec<(f64, f64, f64)> = lines
        .filter_map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            Some((c.get(steps)?.parse().ok()?, c.get(secs)?.parse().ok()?, c.get(eval)?.parse().ok()?))
        })
        .collect();
    let first = rows.iter().find(|r| r.2 >= 475.0).map(|r| (r.0, r.1));
    let held = rows.len() >= 2 && rows[rows.len() - 2..].iter().all(|r| r.2 >= 475.0);
    Ok((first, held))
}

fn ppo_table(args: &Args) -> BenchResult<()> {
    let flotilla = std::env::current_exe()?.with_file_name("flotilla");
    if !flotilla.is_file() {
        return Err("the flotilla binary is missing next to this one: cargo build --release --bin flotilla".into());
    }
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/cartpole_ppo.toml");
    let seeds: &[u64] = if args.quick { &[1] } else { &[1, 2, 3] };
    println!("\n### PPO on CartPole-v1 to an evaluation of 475: single process vs actor processes\n");
    println!("| run | seed | env steps to 475 | train s to 475 | holds at the end |");
    println!("|---|---:|---:|---:|---|");
    for (actors, synchronous) in [(0usize, false), (2, false), (4, false), (4, true)] {
        for &seed in seeds {
            let out = std::env::temp_dir().join(format!("flotilla-bench-ppo-{actors}-{seed}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            let mut cmd = Command::new(&flotilla);
            cmd.arg("train").arg(&config).args(["--set", &format!("run.seed={seed}")]);
            cmd.args(["--set", "eval.interval_steps=5000", "--set", "metrics.log_interval_steps=5000"]);
            if actors > 0 {
                cmd.args(["--actors", &actors.to_string(), "--set", &format!("learner.synchronous={synchronous}")]);
            }
            let status = cmd.arg("--out").arg(&out).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
            if !status.success() {
                return Err(format!("{cmd:?} failed: {status}").into());
            }
            let (first, held) = first_solved(&out.join("metrics.csv"))?;
            let name = match (actors, synchronous) {
                (0, _) => "single process".to_string(),
                (n, false) => format!("{n} actors"),
                (n, true) => format!("{n} actors, synchronous"),
            };
            let (steps, secs) = match first {
                Some((steps, secs)) => (format!("{steps:.0}"), format!("{secs:.2}")),
                None => ("not reached".into(), "—".into()),
            };
            println!("| {name} | {seed} | {steps} | {secs} | {} |", if held { "yes" } else { "no" });
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    Ok(())
}
