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
//!    protobuf-encoded chunk for both carriers. Target: ≥ 1 M transitions/s over loopback gRPC. Each gRPC row
//!    is measured again over TLS (a CA and a 127.0.0.1 certificate made at start-up): its ratio to plaintext is
//!    TLS's cost on ingest.
//! 2. **Scaling with actor processes** (`scaling`). The real CLI, `flotilla train CONFIG --actors N`, on
//!    Latency-v0 (CartPole with a 1 ms step) with one env per actor, so an actor steps at most ~1000 env
//!    steps/s, for N = 1, 2, 4, … up to `--max-actors` (64; 4 with `--quick`; 128 and 256 when asked for and
//!    the memory is there, ~80 MiB per actor process). The learner runs PPO with a
//!    16-unit network, one epoch and one minibatch, so it stays cheap. Steady-state SPS comes from the run's
//!    `metrics.csv` (`env_steps` and `train_secs`), over the rows after every actor has registered and one
//!    more row has passed; the run is stopped with SIGINT once ~5 s (1.5 s quick) of steady state are in.
//!    Efficiency is SPS(N) / (N · SPS(1)); target ≥ 90 % at 64 actors. The CPU columns (from `/proc`, over
//!    the same window) say who used the cores: the learner process, its actor processes, everything else on
//!    the machine; the learner's RSS at the end of the window, the messages it refused over the run (none from
//!    real actors) and the ingest queue's deepest logged depth (bounded by one batch, N chunks). Needs the
//!    `flotilla` binary next to this one (`cargo build --release --bin flotilla`).
//! 3. **Parameter broadcast** (`broadcast`). A Nature-CNN for 4×84×84 frames with 18 actions (its real
//!    parameter count, ~1.7 M, built with [`NatureCnn`]) is published on a gRPC hub; 256, 16 and 1 registered
//!    clients (16 and 1 quick) each fetch the new version at once, in plaintext and over TLS. Reported: time
//!    from `publish` until every client holds it, median and max over 10 rounds (3 quick) after a warm-up
//!    round, and aggregate MB/s (10⁶ bytes of f32 payload per second at the median).
//!
//! 4. **PPO to 475, single-process vs actors** (`ppo`). `flotilla train examples/configs/cartpole_ppo.toml`
//!    without and with `--actors 2` / `--actors 4` (and 4 with `learner.synchronous = true`), seeds 1–3, one after
//!    another in this run: training seconds (wall-clock minus evaluations; for actor runs from the learner's
//!    start, actor start-up included) and env steps at the first evaluation ≥ 475 (every 5 K steps), and
//!    whether the last two evaluations held it.
//!
//! Timings are wall-clock on whatever machine runs this: on a small shared machine the client threads, the
//! server's two IO workers and the consumer compete for the same cores.
//!
//! [`Hub`]: flotilla_learner::hub::Hub
//! [`LocalClient`]: flotilla_transport::local::LocalClient
//! [`NatureCnn`]: flotilla_algorithms::nn::nets::NatureCnn
mod broadcast;
mod cpu_accounting;
mod hub;
mod ingest;
mod ppo_actors;
mod scaling;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BenchResult<T> = Result<T, BoxError>;

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
        ingest::ingest_table(&args)?;
    }
    if args.wants("scaling") {
        scaling::scaling_table(&args)?;
    }
    if args.wants("broadcast") {
        broadcast::broadcast_table(&args)?;
    }
    if args.wants("ppo") {
        ppo_actors::ppo_table(&args)?;
    }
    Ok(())
}
