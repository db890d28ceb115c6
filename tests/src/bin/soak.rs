//! `flotilla-soak MINUTES`: a chaos soak of a supervised distributed run (`scripts/soak.sh` builds and runs it).
//!
//! ```text
//!  flotilla train cartpole (supervisor) ─┬─ learner (restarted from its checkpoint when killed)
//!                                        └─ 4 actors (slots 0-3, restarted by the supervisor's launcher)
//!  4 network namespaces ─veth─ proxy here (+20 ms each way) ─► learner   actors in slots 4-7 (restarted by us)
//!  a hostile client (slot 8) ─► learner: the fuzz test's malformed messages, 20 a second, throughout
//! ```
//!
//! PPO trains on a budget far longer than the soak (constant learning rate). Meanwhile every 20 s a random actor
//! is SIGKILLed, every 3 minutes the learner (the first at 1.5 minutes), every 4 minutes one namespaced actor's
//! link goes down for 10 s (the first at 2 minutes). Every 5 s the learner's and the supervisor's RSS and open
//! file descriptors, the ingest queue depth and the connected actors are sampled (`samples.csv`). At the end the
//! run is stopped (SIGTERM: the learner checkpoints), its policy evaluated (`flotilla eval`), and one line
//! printed:
//!
//! `soak: M min, actors killed K, learner killed L, partitions P, hostile messages H, chunks accepted A, ledger
//! A2, lost env steps X (counted X2), rss growth G %, fds growth F, restart median S1 s max S2 s, final eval E`
//!
//! * A: chunks the learners accepted, from their ingest account (`flotilla::ingest` debug lines, one per accepted
//!   message, each with the ledger's count after it), checked line by line per learner: each count follows from
//!   the one before, starts at the checkpoint, and ends at the ledger's last count — or one message short for a
//!   learner SIGKILLed between the ledger write and the account line (two writes; such a message counts in A);
//! * A2: the ingest ledger (`RUN/ingested`): each learner life's last count minus its first (the checkpoint it
//!   started from), read here after each kill and at the end, in chunks;
//! * X: the env steps the learner says it lost (`charts/lost_env_steps`); X2: counted here — at each kill, the
//!   dead learner's ledger minus the checkpoint the next one resumes from;
//! * G, F: growth of RSS (%) and open fds from the first restart's warm-up (its first 20 s skipped, then 30 s) to
//!   the last 30 s, medians, the larger of learner and supervisor (a fresh learner's first 20 s are skipped);
//! * S1, S2: from each learner kill to the restarted learner's first accepted message, as seen here;
//! * E: the final policy's mean return over 10 deterministic episodes.
//!
//! It exits 1 if A ≠ A2, X ≠ X2, G > 5, F > 0, S2 > 5, E < 475, a hostile message was accepted, or a process
//! died that was not killed; 2 if it could not start (it needs root and iproute2 for the namespaces). Logs and
//! the run directory stay in `--out` (default: a temporary directory, printed).
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use flotilla_learner::distributed::DistributedLearner;
use flotilla_tests::hostile::{Dice, KINDS, STEPS, cartpole_registration, hostile};
use flotilla_tests::netns::{Hosts, Proxy, ip, missing_prerequisite};
use flotilla_tests::procfs;
use flotilla_transport::grpc::{GrpcClient, Limits, send_raw_chunk};
use flotilla_transport::{Code, LearnerClient, MessageKey};

/// Actors the supervisor launches (slots 0..LOCAL) and actors in namespaces (slots LOCAL..LOCAL + REMOTE).
const LOCAL: usize = 4;
const REMOTE: usize = 4;
/// Envs per actor: 8 actors × 2 envs, batches of 4 chunks (num_envs = 8).
const ENVS: usize = 2;
const ACTOR_KILL_EVERY: f64 = 20.0;
const LEARNER_KILL_EVERY: f64 = 180.0;
const LEARNER_KILL_FIRST: f64 = 90.0;
const PARTITION_EVERY: f64 = 240.0;
const PARTITION_FIRST: f64 = 120.0;
const PARTITION_SECS: f64 = 10.0;
const SAMPLE_EVERY: f64 = 5.0;
/// Samples of a learner younger than this are its warm-up (not compared).
const WARM_UP: f64 = 20.0;
/// Length of the windows whose medians are compared.
const WINDOW: f64 = 30.0;
const DELAY: Duration = Duration::from_millis(20);
const SOLVED: f64 = 475.0;

struct Args {
    minutes: f64,
    flotilla: PathBuf,
    out: PathBuf,
    seed: u64,
}

fn usage() -> ! {
    eprintln!("usage: flotilla-soak MINUTES [--flotilla PATH] [--out DIR] [--seed N]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = std::env::args().skip(1);
    let mut minutes = None;
    let mut flotilla = None;
    let mut out = None;
    let mut seed = 1;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--flotilla" => flotilla = args.next().map(PathBuf::from),
            "--out" => out = args.next().map(PathBuf::from),
            "--seed" => seed = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            m if minutes.is_none() => {
                minutes = Some(m.parse::<f64>().ok().filter(|m| m.is_finite() && *m >= 1.0).unwrap_or_else(|| {
                    eprintln!("flotilla-soak: MINUTES = {m:?}: give a number ≥ 1");
                    std::process::exit(2)
                }))
            }
            _ => usage(),
        }
    }
    let minutes = minutes.unwrap_or_else(|| usage());
    // The `flotilla` binary beside this one (one cargo target dir builds both).
    let flotilla =
        flotilla.unwrap_or_else(|| std::env::current_exe().expect("this executable's path").with_file_name("flotilla"));
    let out = out.unwrap_or_else(|| std::env::temp_dir().join(format!("flotilla-soak-{}", std::process::id())));
    Args { minutes, flotilla, out, seed }
}

fn main() {
    let args = parse_args();
    if let Some(why) = missing_prerequisite() {
        eprintln!("flotilla-soak: cannot make network namespaces: {why}");
        std::process::exit(2);
    }
    if !args.flotilla.is_file() {
        eprintln!(
            "flotilla-soak: no flotilla binary at {} (build it, or pass --flotilla PATH)",
            args.flotilla.display()
        );
        std::process::exit(2);
    }
    if args.out.join("run").exists() {
        eprintln!("flotilla-soak: {} exists; choose another --out", args.out.join("run").display());
        std::process::exit(2);
    }
    std::fs::create_dir_all(&args.out).expect("creating the soak's directory");
    match soak(&args) {
        Ok(failures) if failures.is_empty() => {}
        Ok(failures) => {
            for f in failures {
                eprintln!("soak FAILED: {f}");
            }
            eprintln!("logs: {}", args.out.display());
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("flotilla-soak: {e}\nlogs: {}", args.out.display());
            std::process::exit(2);
        }
    }
}

/// What the supervisor's output (its own, the learner's and its actors') says, as it arrives.
#[derive(Default)]
struct Seen {
    /// Pid of the learner now running ("learner process N started").
    learner: Option<u32>,
    /// Each learner's ingest account (the `flotilla::ingest` lines), by pid.
    accounts: std::collections::HashMap<u32, Account>,
    /// When the current learner first accepted data again after a restart (the "accepting actors' data again"
    /// line), for the kill waiting on it.
    accepting_again: Option<Instant>,
    errors: Vec<String>,
    last_lines: VecDeque<String>,
}

/// One learner's ingest account, checked as its lines arrive: each line's count must be the previous one plus
/// what the line adds.
#[derive(Default)]
struct Account {
    /// Where its ledger started (`ledger opened at C`).
    opened_at: Option<u64>,
    /// The count after its last line: what its ledger holds.
    count: u64,
    messages: u64,
    /// Lines that did not follow from the one before.
    broken: Vec<String>,
}

/// Fold one `ingest account (pid P): …; count T` line (`rest` follows "(pid ") into its learner's account.
fn account_line(accounts: &mut std::collections::HashMap<u32, Account>, rest: &str, line: &str) {
    let number = |s: &str| s.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse::<u64>().ok());
    let (Some(pid), Some(count)) = (number(rest), rest.split("; count ").nth(1).and_then(number)) else {
        accounts.entry(0).or_default().broken.push(format!("unreadable: {line}"));
        return;
    };
    let a = accounts.entry(pid as u32).or_default();
    // Lines add a message's steps, take back those of a message the queue then did not take, or open the ledger.
    let (change, opened) = if let Some(r) = rest.split("): accepted ").nth(1) {
        (number(r).map(|n| n as i128), None)
    } else if let Some(r) = rest.split("): returned ").nth(1) {
        (number(r).map(|n| -(n as i128)), None)
    } else if let Some(r) = rest.split("): ledger opened at ").nth(1) {
        (number(r).map(|n| n as i128), number(r))
    } else {
        (None, None)
    };
    match change {
        Some(n) if a.count as i128 + n == count as i128 => {
            a.count = count;
            match (opened, n < 0) {
                (Some(_), _) => a.opened_at = opened,
                (None, true) => a.messages = a.messages.saturating_sub(1),
                (None, false) => a.messages += 1,
            }
        }
        _ => a.broken.push(format!("after count {}: {line}", a.count)),
    }
}

/// Read `stream` line by line into `seen` and `log`.
fn follow(stream: impl Read + Send + 'static, seen: Arc<Mutex<Seen>>, log: Arc<Mutex<std::fs::File>>) {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let mut s = seen.lock().expect("seen");
            if let Some(rest) = line.split("ingest account (pid ").nth(1) {
                account_line(&mut s.accounts, rest, &line);
                continue; // The account is not copied to the log: thousands of lines.
            }
            if let Some(pid) = line
                .split("learner process ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|p| p.parse().ok())
            {
                s.learner = Some(pid);
            }
            if line.contains("accepting actors' data again") && s.accepting_again.is_none() {
                s.accepting_again = Some(Instant::now());
            }
            if line.contains(" ERROR ") && !line.contains("the learner (pid") {
                s.errors.push(line.clone());
            }
            s.last_lines.push_back(line.clone());
            if s.last_lines.len() > 200 {
                s.last_lines.pop_front();
            }
            drop(s);
            let _ = writeln!(log.lock().expect("log"), "{line}");
        }
    });
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A second octet `N` such that no address of this machine is in 10.N.0.0/16: the links to the namespaces use
/// 10.N.k.0/24, apart from another soak's running beside this one.
fn free_net() -> Result<u8, String> {
    let out = Command::new("ip").args(["-4", "-o", "addr"]).output().map_err(|e| format!("ip -4 -o addr: {e}"))?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = (std::process::id() % 100) as u8;
    (0..100u8)
        .map(|i| 100 + (start + i) % 100)
        .find(|n| !used.contains(&format!(" 10.{n}.")))
        .ok_or_else(|| "no free 10.N.0.0/16 network for the namespaces' links".to_string())
}

/// VmRSS (KiB) and open fds of `pid`, if it is alive.
fn rss_and_fds(pid: u32) -> Option<(u64, u64)> {
    Some((procfs::rss_kib(pid)?, procfs::fd_count(pid)?))
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid this soak started or found among its children's children.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// The env steps of the checkpoint in `run`.
fn checkpoint_env_steps(run: &Path) -> Result<u64, String> {
    let path = run.join(flotilla_learner::run_dir::CHECKPOINT_FILE);
    DistributedLearner::checkpoint_env_steps(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The ingest ledger's count in `run` (0 where there is none yet).
fn ledger(run: &Path) -> u64 {
    flotilla_learner::run_dir::IngestLedger::read(run).unwrap_or(0)
}

/// `GET /metrics` from the learner's Prometheus endpoint: (queue depth, actors connected).
fn scrape(port: u16) -> Option<(f64, f64)> {
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let value =
        |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
    Some((value("flotilla_ingest_queue_depth")?, value("flotilla_actors_connected")?))
}

/// An actor in a namespace (`ip netns exec` execs flotilla: the child's pid is the actor's).
struct RemoteActor {
    ns: String,
    slot: usize,
    addr: String,
    child: Option<Child>,
    /// When it exited (restarted 200 ms later, as the supervisor's launcher does).
    exited: Option<Instant>,
    killed: bool,
}

impl RemoteActor {
    fn spawn(&mut self, flotilla: &Path, token: &str, log: &Path) -> Result<(), String> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let slot = self.slot.to_string();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(flotilla)
            .args(["actor", "--learner", &self.addr, "--index", &slot, "--reconnect-secs", "120"])
            .env("FLOTILLA_TOKEN", token)
            .env("RUST_LOG", "info")
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting the actor in {}: {e}", self.ns))?;
        self.child = Some(child);
        self.exited = None;
        self.killed = false;
        Ok(())
    }
}

/// One learner life: its pid, where its ledger started (the checkpoint) and its last count.
struct Life {
    pid: Option<u32>,
    start: u64,
    end: u64,
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

struct Sample {
    t: f64,
    /// Seconds since the learner sampled here started (restarts reset it).
    learner_age: f64,
    learner: Option<(u64, u64)>,
    supervisor: Option<(u64, u64)>,
}

fn soak(args: &Args) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let duration = args.minutes * 60.0;
    let run = args.out.join("run");
    let log = Arc::new(Mutex::new(std::fs::File::create(args.out.join("supervisor.log")).map_err(|e| e.to_string())?));
    let mut samples_csv = std::fs::File::create(args.out.join("samples.csv")).map_err(|e| e.to_string())?;
    writeln!(
        samples_csv,
        "secs,learner_pid,learner_rss_kib,learner_fds,supervisor_rss_kib,supervisor_fds,queue_depth,actors"
    )
    .map_err(|e| e.to_string())?;

    // Hosts: each namespace reaches only its own link's address here, where a proxy forwards to the learner.
    let mut hosts = Hosts::new();
    let (port, metrics_port) = (free_port(), free_port());
    let upstream: SocketAddr = ([127, 0, 0, 1], port).into();
    let tag = std::process::id() % 100_000;
    let net = free_net()?;
    let mut proxies = Vec::new();
    let mut remote = Vec::new();
    for k in 1..=REMOTE {
        let ns = hosts.add(&format!("soak{k}"))?;
        let (here, there) = (format!("10.{net}.{k}.1"), format!("10.{net}.{k}.2"));
        Hosts::link_here(&format!("sk{tag}a{k}"), &format!("{here}/24"), &ns, "eth0", &format!("{there}/24"))?;
        let listen: SocketAddr = format!("{here}:{port}").parse().expect("an address");
        proxies.push(Proxy::start(None, listen, upstream, DELAY)?);
        remote.push(RemoteActor {
            ns,
            slot: LOCAL + k - 1,
            addr: listen.to_string(),
            child: None,
            exited: None,
            killed: false,
        });
    }

    let token = format!("soak-{:016x}", Dice(args.seed ^ u64::from(std::process::id())).roll());
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/cartpole_ppo.toml");
    #[rustfmt::skip]
    let sets = [
        // A budget far past the soak, at a constant learning rate: the run is mid-way when the soak stops it.
        "run.total_env_steps=1000000000".to_string(), "algorithm.anneal_lr=false".into(),
        "algorithm.anneal_clip_range=false".into(),
        format!("actors.remote={}", REMOTE + 1), format!("actors.envs_per_actor={ENVS}"),
        "actors.reconnect_secs=120".into(), "actors.max_restarts=1000000".into(), "learner.max_restarts=10000".into(),
        format!("learner.listen=\"127.0.0.1:{port}\""), format!("learner.metrics_listen=\"127.0.0.1:{metrics_port}\""),
        "checkpoint.interval_steps=50000".into(), "eval.interval_steps=0".into(),
        "metrics.log_interval_steps=20000".into(),
    ];
    let mut command = Command::new(&args.flotilla);
    command.arg("train").arg(&config).args(["--actors", &LOCAL.to_string(), "--out"]).arg(&run);
    for s in &sets {
        command.args(["--set", s]);
    }
    let mut supervisor = command
        .env("FLOTILLA_TOKEN", &token)
        .env("RUST_LOG", "info,flotilla::ingest=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", args.flotilla.display()))?;
    let sup_pid = supervisor.id();
    let seen = Arc::new(Mutex::new(Seen::default()));
    follow(supervisor.stdout.take().expect("piped"), seen.clone(), log.clone());
    follow(supervisor.stderr.take().expect("piped"), seen.clone(), log.clone());
    let started = Instant::now();
    let secs = || started.elapsed().as_secs_f64();
    let tail =
        |seen: &Mutex<Seen>| seen.lock().expect("seen").last_lines.iter().cloned().collect::<Vec<_>>().join("\n");

    // Wait for the learner to listen, then start the namespaced actors and the hostile client.
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect_timeout(&upstream, Duration::from_millis(200)).is_err() {
        if Instant::now() > deadline || !matches!(supervisor.try_wait(), Ok(None)) {
            kill(sup_pid, libc::SIGKILL);
            return Err(format!("the learner never listened on {upstream}:\n{}", tail(&seen)));
        }
        thread::sleep(Duration::from_millis(100));
    }
    for (k, a) in remote.iter_mut().enumerate() {
        a.spawn(&args.flotilla, &token, &args.out.join(format!("actor-{}.log", LOCAL + k)))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hostile_sent = Arc::new(AtomicU64::new(0));
    let hostile_accepted = Arc::new(AtomicU64::new(0));
    let hostile = {
        let (stop, sent, accepted, token, seed) =
            (stop.clone(), hostile_sent.clone(), hostile_accepted.clone(), token.clone(), args.seed);
        thread::spawn(move || hostile_client(upstream, &token, seed, &stop, &sent, &accepted))
    };

    // The schedule.
    let mut dice = Dice(args.seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let (mut next_actor_kill, mut next_learner_kill, mut next_partition, mut next_sample) =
        (ACTOR_KILL_EVERY, LEARNER_KILL_FIRST, PARTITION_FIRST, 0.0);
    let mut partition: Option<(usize, f64)> = None;
    let (mut actors_killed, mut learner_killed, mut partitions) = (0u64, 0u64, 0u64);
    let mut lives = vec![Life { pid: None, start: 0, end: 0 }];
    let mut lost_counted = 0u64;
    let mut restart_secs: Vec<f64> = Vec::new();
    let mut waiting_restart: Option<Instant> = None;
    let mut first_restart: Option<f64> = None;
    let mut learner_started = (None::<u32>, 0.0f64);
    let mut samples: Vec<Sample> = Vec::new();
    let mut unexpected: Vec<String> = Vec::new();

    while secs() < duration {
        let t = secs();
        if let Ok(Some(status)) = supervisor.try_wait() {
            unexpected.push(format!("the supervisor exited at {t:.0} s ({status}):\n{}", tail(&seen)));
            break;
        }
        let learner = seen.lock().expect("seen").learner;
        if learner != learner_started.0 {
            learner_started = (learner, t);
        }
        // A restarted learner's first accepted message ends the wait for it.
        if let Some(killed_at) = waiting_restart {
            let again = seen.lock().expect("seen").accepting_again;
            if let Some(again) = again {
                restart_secs.push(again.saturating_duration_since(killed_at).as_secs_f64());
                waiting_restart = None;
            }
        }
        // Namespaced actors: restart those that exited; one that exited without being killed is a finding.
        for a in remote.iter_mut() {
            if let Some(child) = a.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                if !a.killed {
                    unexpected.push(format!("the actor in slot {} exited by itself at {t:.0} s: {status}", a.slot));
                }
                a.child = None;
                a.exited = Some(Instant::now());
            }
            if a.child.is_none() && a.exited.is_some_and(|e| e.elapsed() >= Duration::from_millis(200)) {
                let log = args.out.join(format!("actor-{}.log", a.slot));
                a.spawn(&args.flotilla, &token, &log)?;
            }
        }
        if t >= next_actor_kill {
            next_actor_kill += ACTOR_KILL_EVERY;
            let slot = dice.below(LOCAL + REMOTE);
            let pid = if slot < LOCAL {
                // The launcher's children are in slot order of their start, not necessarily of their slots: any
                // of them is a random actor.
                let local = procfs::learner_and_actors(sup_pid).1;
                local.get(dice.below(local.len().max(1))).copied()
            } else {
                let a = &mut remote[slot - LOCAL];
                a.killed = true;
                a.child.as_ref().map(Child::id)
            };
            if let Some(pid) = pid {
                kill(pid, libc::SIGKILL);
                actors_killed += 1;
            }
        }
        if t >= next_learner_kill {
            next_learner_kill += LEARNER_KILL_EVERY;
            if let Some(pid) = learner.filter(|&p| procfs::alive(p)) {
                seen.lock().expect("seen").accepting_again = None;
                let killed_at = Instant::now();
                kill(pid, libc::SIGKILL);
                while procfs::alive(pid) {
                    thread::sleep(Duration::from_micros(200));
                }
                // Before the supervisor's next learner opens the ledger again (it loads libtorch first).
                let end = ledger(&run);
                let resumes_at = checkpoint_env_steps(&run).unwrap_or(0);
                let life = lives.last_mut().expect("a life");
                (life.end, life.pid) = (end, Some(pid));
                lost_counted += end.saturating_sub(resumes_at);
                lives.push(Life { pid: None, start: resumes_at, end: resumes_at });
                learner_killed += 1;
                waiting_restart = Some(killed_at);
                first_restart.get_or_insert(t);
            }
        }
        if partition.is_none() && t >= next_partition {
            next_partition += PARTITION_EVERY;
            let k = dice.below(REMOTE);
            ip(&["-n", &remote[k].ns, "link", "set", "eth0", "down"])?;
            partition = Some((k, t));
            partitions += 1;
        }
        if let Some((k, since)) = partition
            && t >= since + PARTITION_SECS
        {
            ip(&["-n", &remote[k].ns, "link", "set", "eth0", "up"])?;
            partition = None;
        }
        if t >= next_sample {
            next_sample += SAMPLE_EVERY;
            let l = learner.and_then(rss_and_fds);
            let s = rss_and_fds(sup_pid);
            let (queue, actors) = scrape(metrics_port).map_or((f64::NAN, f64::NAN), |(q, a)| (q, a));
            let cell = |v: Option<(u64, u64)>, i: usize| v.map_or(String::new(), |v| [v.0, v.1][i].to_string());
            let _ = writeln!(
                samples_csv,
                "{t:.1},{},{},{},{},{},{queue},{actors}",
                learner.map_or(String::new(), |p| p.to_string()),
                cell(l, 0),
                cell(l, 1),
                cell(s, 0),
                cell(s, 1)
            );
            samples.push(Sample { t, learner_age: t - learner_started.1, learner: l, supervisor: s });
        }
        thread::sleep(Duration::from_millis(20));
    }
    if let Some((k, _)) = partition {
        ip(&["-n", &remote[k].ns, "link", "set", "eth0", "up"])?;
    }
    stop.store(true, Ordering::SeqCst);
    let _ = hostile.join();
    if let Some(killed_at) = waiting_restart {
        let again = seen.lock().expect("seen").accepting_again;
        match again {
            Some(again) => restart_secs.push(again.saturating_duration_since(killed_at).as_secs_f64()),
            None => unexpected.push("the last restarted learner never accepted data before the soak ended".into()),
        }
    }

    // Stop the run: the learner checkpoints, the supervisor stops its actors; then ours.
    kill(sup_pid, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(60);
    while matches!(supervisor.try_wait(), Ok(None)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    if matches!(supervisor.try_wait(), Ok(None)) {
        unexpected.push("the supervisor did not stop within 60 s of SIGTERM".into());
        kill(sup_pid, libc::SIGKILL);
        let _ = supervisor.wait();
    }
    for a in remote.iter_mut() {
        if let Some(mut c) = a.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    drop(proxies);
    drop(hosts);
    thread::sleep(Duration::from_millis(300)); // the output readers drain
    let last = lives.last_mut().expect("a life");
    (last.end, last.pid) = (ledger(&run), seen.lock().expect("seen").learner);

    // The account.
    let s = seen.lock().expect("seen");
    let chunk_steps = (STEPS * ENVS) as u64;
    let ledger_steps: u64 = lives.iter().map(|l| l.end.saturating_sub(l.start)).sum();
    let ledger_chunks = ledger_steps as f64 / chunk_steps as f64;
    // Each life's account against its ledger: it started where the soak read the checkpoint, its lines follow
    // one from another, and it ends at the ledger's count — or, for a learner killed between writing a message
    // to the ledger and its account line (two writes; SIGKILL can fall between them), one message short.
    let mut reconcile = Vec::new();
    let (mut accepted, mut at_kill) = (0u64, 0u64);
    let n_lives = lives.len();
    for (i, life) in lives.iter().enumerate() {
        let killed = i + 1 < n_lives;
        let Some(a) = life.pid.and_then(|pid| s.accounts.get(&pid)) else {
            reconcile.push(format!("learner life {i} (pid {:?}) left no ingest account", life.pid));
            continue;
        };
        accepted += a.messages;
        if a.opened_at != Some(life.start) {
            reconcile.push(format!(
                "learner life {i}: its ledger opened at {:?}, the checkpoint was at {}",
                a.opened_at, life.start
            ));
        }
        reconcile.extend(a.broken.iter().take(3).map(|b| format!("learner life {i}: account line out of step: {b}")));
        match life.end.checked_sub(a.count) {
            Some(0) => {}
            Some(n) if killed && n == chunk_steps => at_kill += 1,
            _ => reconcile.push(format!(
                "learner life {i}: its ledger ends at {}, its account at {}{}",
                life.end,
                a.count,
                if killed { "" } else { " (not killed)" }
            )),
        }
    }
    if let Some(stray) = s.accounts.get(&0) {
        reconcile.extend(stray.broken.iter().take(3).cloned());
    }
    let accepted = accepted + at_kill;
    let lost_said = last_value(&run.join("metrics.csv"), "charts/lost_env_steps").unwrap_or(0.0) as u64;
    let errors = s.errors.clone();
    drop(s);
    // Medians of the first restart's warm-up window and of the last window: growth in % (RSS) or count (fds).
    let growth = |pick: fn(&Sample) -> Option<(u64, u64)>, what: usize, learner: bool| -> Option<f64> {
        let from = first_restart? + WARM_UP;
        let window = |lo: f64, hi: f64| {
            let xs = samples.iter().filter(|x| x.t >= lo && x.t < hi && (!learner || x.learner_age >= WARM_UP));
            median(xs.filter_map(|x| pick(x).map(|v| [v.0, v.1][what] as f64)).collect())
        };
        let (base, end) = (window(from, from + WINDOW)?, window((duration - WINDOW).max(from + WINDOW), f64::MAX)?);
        Some(if what == 0 { 100.0 * (end - base) / base } else { end - base })
    };
    let rss_growth = [growth(|x| x.learner, 0, true), growth(|x| x.supervisor, 0, false)];
    let fds_growth = [growth(|x| x.learner, 1, true), growth(|x| x.supervisor, 1, false)];
    let worst = |xs: [Option<f64>; 2]| xs.iter().flatten().copied().reduce(f64::max);
    let (g, f) = (worst(rss_growth), worst(fds_growth));
    let s1 = median(restart_secs.clone());
    let s2 = restart_secs.iter().copied().reduce(f64::max);
    let final_eval = evaluate(&args.flotilla, &run);
    let hostile_n = hostile_sent.load(Ordering::SeqCst);
    let fmt = |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    println!(
        "soak: {} min, actors killed {actors_killed}, learner killed {learner_killed}, partitions {partitions}, hostile \
         messages {hostile_n}, chunks accepted {accepted}, ledger {}, lost env steps {lost_said} (counted \
         {lost_counted}), rss growth {} %, fds growth {}, restart median {} s max {} s, final eval {}",
        args.minutes,
        if ledger_chunks.fract() == 0.0 { format!("{ledger_chunks:.0}") } else { format!("{ledger_chunks:.2}") },
        fmt(g, 1),
        fmt(f, 0),
        fmt(s1, 2),
        fmt(s2, 2),
        fmt(final_eval.as_ref().ok().copied(), 1),
    );
    eprintln!(
        "soak details: learner rss growth {} %, supervisor {} %; fds growth learner {}, supervisor {}; {} learner lives \
         (ledger start..end: {}); {at_kill} chunks accepted as a learner was killed, in its ledger before their \
         account line; restarts (s): {restart_secs:.2?}; samples in {}",
        fmt(rss_growth[0], 1),
        fmt(rss_growth[1], 1),
        fmt(fds_growth[0], 0),
        fmt(fds_growth[1], 0),
        lives.len(),
        lives.iter().map(|l| format!("{}..{}", l.start, l.end)).collect::<Vec<_>>().join(", "),
        args.out.join("samples.csv").display()
    );
    if accepted * chunk_steps != ledger_steps {
        failures.push(format!(
            "chunks accepted ({accepted}) ≠ the ledger ({ledger_steps} env steps = {ledger_chunks} chunks)"
        ));
    }
    failures.extend(reconcile);
    if lost_said != lost_counted {
        failures.push(format!("the learner says {lost_said} env steps were lost; counted here: {lost_counted}"));
    }
    match g {
        Some(g) if g > 5.0 => failures.push(format!("RSS grew {g:.1} % (more than 5 %)")),
        None => failures.push("RSS growth not measured (no learner restart, or too short a soak)".into()),
        _ => {}
    }
    match f {
        Some(f) if f > 0.0 => failures.push(format!("open file descriptors grew by {f}")),
        None => failures.push("fd growth not measured".into()),
        _ => {}
    }
    match s2 {
        Some(s2) if s2 > 5.0 => failures.push(format!("a restart took {s2:.2} s (more than 5 s)")),
        None => failures.push("no learner restart was measured".into()),
        _ => {}
    }
    match final_eval {
        Ok(e) if e < SOLVED => failures.push(format!("the final policy scores {e:.1}, below {SOLVED}")),
        Err(e) => failures.push(format!("evaluating the final policy: {e}")),
        _ => {}
    }
    let n = hostile_accepted.load(Ordering::SeqCst);
    if n > 0 {
        failures.push(format!("{n} hostile messages were accepted"));
    }
    if hostile_n == 0 {
        failures.push("the hostile client sent nothing".into());
    }
    failures.extend(unexpected);
    failures.extend(errors.into_iter().take(5).map(|e| format!("error logged: {e}")));
    Ok(failures)
}

/// The last value of `column` in a metrics CSV.
fn last_value(csv: &Path, column: &str) -> Option<f64> {
    let text = std::fs::read_to_string(csv).ok()?;
    let mut lines = text.lines();
    let col = lines.next()?.split(',').position(|h| h == column)?;
    lines.filter_map(|l| l.split(',').nth(col)?.parse::<f64>().ok()).next_back()
}

/// `flotilla eval RUN --episodes 10`: the mean return.
fn evaluate(flotilla: &Path, run: &Path) -> Result<f64, String> {
    let out =
        Command::new(flotilla).arg("eval").arg(run).args(["--episodes", "10"]).output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split("mean return ").nth(1)?.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| {
            format!("no mean return in flotilla eval's output:\n{text}{}", String::from_utf8_lossy(&out.stderr))
        })
}

/// The fake actor: registered in the last slot, it sends hostile messages (every kind of
/// [`flotilla_tests::hostile::hostile`], seeded) at about 20 a second until `stop`, registering again when it is
/// disconnected for refusals and reconnecting when its connection is closed or the learner restarts. Counts what
/// it sent, and what was accepted (nothing should be).
fn hostile_client(addr: SocketAddr, token: &str, seed: u64, stop: &AtomicBool, sent: &AtomicU64, accepted: &AtomicU64) {
    let mut dice = Dice(seed ^ 0x5eed);
    let slot = (LOCAL + REMOTE) as u32;
    while !stop.load(Ordering::SeqCst) {
        let joined = GrpcClient::connect(&addr.to_string(), token, &Limits::default(), Duration::from_secs(2))
            .and_then(|mut c| {
                let run = c.run_info()?;
                let mut r = cartpole_registration(&run.run_id, ENVS);
                r.actor_index = Some(slot);
                let me = c.register(&r)?;
                Ok((c, me.actor_id))
            });
        let Ok((mut client, mut id)) = joined else {
            thread::sleep(Duration::from_millis(500));
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            let kind = dice.below(KINDS);
            let result = match hostile(kind, id, ENVS, &mut dice) {
                Ok(c) => client.send_chunk(&c, MessageKey::NONE).map(|_| ()),
                Err(p) => send_raw_chunk(&mut client, *p, Some(token)).map(|_| ()),
            };
            sent.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(50));
            match result {
                Ok(()) => {
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) if e.code == Code::InvalidArgument && e.message.contains("unknown actor") => {
                    // Disconnected for refusals in a row (or a restarted learner): register again.
                    let mut r = match client.run_info() {
                        Ok(run) => cartpole_registration(&run.run_id, ENVS),
                        Err(_) => break,
                    };
                    r.actor_index = Some(slot);
                    match client.register(&r) {
                        Ok(me) => id = me.actor_id,
                        Err(_) => break,
                    }
                }
                Err(e) if e.code == Code::Unavailable || e.code == Code::Unauthenticated => break,
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The account follows the hub's lines: the ledger opening, accepted messages, a message's steps returned
    /// when the queue did not take it; a line whose count does not follow from the one before is kept as broken.
    #[test]
    fn the_ingest_account_adds_accepted_and_subtracts_returned_steps() {
        let mut accounts = std::collections::HashMap::new();
        let feed = |accounts: &mut std::collections::HashMap<u32, Account>, line: &str| {
            let rest = line.split("ingest account (pid ").nth(1).unwrap();
            account_line(accounts, rest, line);
        };
        feed(&mut accounts, "ingest account (pid 7): ledger opened at 1000 env steps; count 1000");
        feed(&mut accounts, "ingest account (pid 7): accepted 128 env steps from actor 1; count 1128");
        feed(&mut accounts, "ingest account (pid 7): accepted 128 env steps from actor 2; count 1256");
        feed(&mut accounts, "ingest account (pid 7): returned 128 env steps from actor 2, not queued; count 1128");
        let a = &accounts[&7];
        assert_eq!((a.opened_at, a.count, a.messages), (Some(1000), 1128, 1));
        assert!(a.broken.is_empty(), "{:?}", a.broken);
        feed(&mut accounts, "ingest account (pid 7): returned 128 env steps from actor 1, not queued; count 1100");
        assert_eq!(accounts[&7].broken.len(), 1, "a count that does not follow is reported");
    }
}
