//! `flotilla-bench-atari`: Atari throughput, side by side in one run.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-atari [-- --only actors|learner --steps N
//!     --games pong,breakout --rounds R --device cpu|cuda]
//! ```
//! `--device cuda` runs the learner table on the GPU instead (Flotilla f32 and bf16 against PyTorch f32, bf16
//! and fp16 autocast on the same GPU; `scripts/gpu_check.sh` runs it on a lent device).
//! **Actors.** Both sides step ale-py's C++ `AtariVectorEnv` (v5 sticky actions, frame skip 4, 84×84 grey, 4
//! stacked frames, noop and fire resets, one emulator thread, 8 envs) with uniformly random actions: Flotilla
//! through `make_vector("atari:<game>")` and the `VectorEnv` contract exactly as the trainer and actors step it
//! (u8 frames copied into its batch, same-step auto-reset, life-loss terminals, clipped and raw rewards),
//! Python through `tests/peers/atari_python.py`; and EnvPool (`tests/peers/atari_envpool.py`, same settings,
//! one worker thread) when `scripts/setup_peers.sh` has installed it. Frames/s count the four emulator frames
//! of each agent step. Rounds alternate the sides; the table shows each round and the median ratio.
//!
//! **Learner.** One PPO update of `examples/configs/pong_ppo.toml`'s shape on a rollout of random u8 frames:
//! 8 envs × 128 steps, 4 epochs of 4 minibatches of 256, Nature-CNN forward, backward, gradient clipping and
//! Adam, on 1 and 2 torch threads. Samples/s count each sample once per epoch. GFLOP/s use the network's
//! analytic multiply-adds (forward 9.35 M MACs per sample; backward counted as twice the forward, the usual
//! estimate) and are set against this machine's measured f32 matmul peak (1024² `matmul`, same threads).
//! PyTorch runs the same update from Python (`tests/peers/ppo_update_torch.py`: CleanRL's network and loss) when
//! `scripts/setup_peers.sh --torch` has installed it, as is (NCHW f32, oneDNN convolutions), in channels-last
//! memory format and under CPU bf16 autocast; the ratio is against its fastest variant. Both sides run under the
//! trainer's glibc malloc setting (`flotilla_learner::tune_allocator`; `GLIBC_TUNABLES` for the Python process).
use std::process::Command;
use std::time::Instant;

use flotilla_algorithms::nn::nets::CnnOptions;
use flotilla_envs::{EnvRole, Kwargs, VecActions, make_vector};
use flotilla_tests::cnn_bench::{PongPpoUpdate, matmul_peak, matmul_peak_on, nature_cnn_gflops};
use tch::{Device, Kind};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Agent steps per second of Flotilla's Atari vector env over `steps` batched steps.
fn flotilla_sps(game: &str, n: usize, steps: usize, seed: u64) -> BenchResult<f64> {
    let mut env = make_vector(&format!("atari:{game}"), &Kwargs::new(), n, EnvRole::Training)?;
    env.reset(Some(seed))?;
    let n_actions = env.action_space().flat_dim() as u64;
    let mut x = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let actions: Vec<i64> = (0..steps * n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % n_actions) as i64
        })
        .collect();
    let start = Instant::now();
    for batch in actions.chunks_exact(n) {
        env.step(&VecActions::Discrete(batch))?;
    }
    Ok((steps * n) as f64 / start.elapsed().as_secs_f64())
}

/// The same from Python (`tests/peers/atari_python.py`), in a process of its own, with ale-py's auto-reset
/// `mode` (`NextStep`: Gymnasium's default; `SameStep`: what Flotilla asks of it).
fn python_sps(game: &str, n: usize, steps: usize, seed: u64, mode: &str) -> BenchResult<f64> {
    let python = option_env!("FLOTILLA_PYTHON").ok_or("FLOTILLA_PYTHON unset at build time: run scripts/setup.sh")?;
    peer_sps(python, "atari_python.py", game, n, steps, seed, &[mode])
}

/// EnvPool's interpreter, if `scripts/setup_peers.sh` installed it.
fn envpool_python() -> Option<String> {
    let cache = std::env::var("FLOTILLA_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| std::path::Path::new(&h).join(".cache/flotilla")))
        .ok()?;
    let python = cache.join("peers-venv/bin/python");
    python.is_file().then(|| python.display().to_string())
}

/// Agent steps per second a peer script (in `tests/peers/`) reports.
fn peer_sps(
    python: &str,
    script: &str,
    game: &str,
    n: usize,
    steps: usize,
    seed: u64,
    extra: &[&str],
) -> BenchResult<f64> {
    let script = format!("{}/peers/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python)
        .args([&script, game, &n.to_string(), &steps.to_string(), &seed.to_string()])
        .args(extra)
        .output()?;
    if !out.status.success() {
        return Err(format!("{script}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// PyTorch's samples/s for the same update (`tests/peers/ppo_update_torch.py`) on `device` ("cpu" or "cuda").
fn torch_samples_per_sec(python: &str, threads: i32, rounds: usize, variant: &str, device: &str) -> BenchResult<f64> {
    let script = std::env::var("FLOTILLA_PEERS_DIR")
        .unwrap_or_else(|_| format!("{}/peers", env!("CARGO_MANIFEST_DIR")))
        + "/ppo_update_torch.py";
    let out = Command::new(python)
        .args([&script, &threads.to_string(), &rounds.to_string(), variant, device])
        .env("GLIBC_TUNABLES", flotilla_learner::ALLOCATOR_TUNABLES)
        .output()?;
    if !out.status.success() {
        return Err(format!("{script} {variant}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

fn learner_table(rounds: usize) -> BenchResult<()> {
    let torch = envpool_python()
        .filter(|python| Command::new(python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success()));
    let variants = [
        ("f32 NCHW", CnnOptions::F32),
        ("channels-last", CnnOptions { channels_last: true, bf16: false }),
        ("bf16", CnnOptions { channels_last: false, bf16: true }),
        ("channels-last + bf16", CnnOptions { channels_last: true, bf16: true }),
    ];
    println!("\n## Learner: PPO update on u8 frames (8 × 128 rollout, 4 epochs × 4 minibatches of 256), CPU\n");
    println!(
        "Samples/s; GFLOP/s ≈ 3 × the forward pass's FLOPs per sample; peak = measured 1024² matmul in the \
         variant's precision (f32, or bf16 for the bf16 variants).\n"
    );
    println!(
        "| torch threads | variant | Flotilla samples/s | GFLOP/s | matmul peak GFLOP/s (variant's precision) | share of peak | \
         PyTorch samples/s | Flotilla / PyTorch |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for threads in [1, 2] {
        tch::set_num_threads(threads);
        let peaks = (matmul_peak(Kind::Float), matmul_peak(Kind::BFloat16));
        for (i, (name, options)) in variants.iter().enumerate() {
            let peak = if options.bf16 { peaks.1 } else { peaks.0 };
            let sps = PongPpoUpdate::new(*options, None, Device::Cpu)?.samples_per_sec(rounds)?;
            let gflops = nature_cnn_gflops(sps);
            // PyTorch's variants: as is, channels-last, bf16 autocast (channels-last + bf16 is not one of them).
            let peer = ["default", "channels_last", "bf16"].get(i).copied();
            let (peer_cell, ratio) = match (&torch, peer) {
                (Some(python), Some(variant)) => {
                    let theirs = torch_samples_per_sec(python, threads, rounds, variant, "cpu")?;
                    (format!("{theirs:.0}"), format!("**{:.2}**", sps / theirs))
                }
                (None, Some(_)) => ("not installed".to_string(), "—".to_string()),
                (_, None) => ("—".to_string(), "—".to_string()),
            };
            println!(
                "| {threads} | {name} | {sps:.0} | {gflops:.1} | {peak:.1} | {:.0} % | {peer_cell} | {ratio} |",
                100.0 * gflops / peak
            );
        }
    }
    Ok(())
}

/// The learner table on a GPU: Flotilla's update in f32 and bf16 (its `CnnOptions::bf16`: bf16 weights copies and
/// activations, f32 parameters and Adam) against PyTorch's on the same GPU as is (f32; TF32 off, PyTorch's
/// default for matmuls), under CUDA bf16 autocast, and under fp16 autocast with a `GradScaler` (PyTorch's AMP
/// recipe). PyTorch is `$FLOTILLA_TORCH_PYTHON` (default `python3`, as on the lent GPU machines' image).
fn gpu_learner_table(rounds: usize) -> BenchResult<()> {
    if !tch::Cuda::is_available() {
        return Err("--device cuda: libtorch sees no CUDA device".into());
    }
    let device = Device::Cuda(0);
    let python = std::env::var("FLOTILLA_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let peaks = (matmul_peak_on(Kind::Float, device), matmul_peak_on(Kind::BFloat16, device));
    println!("\n## Learner on the GPU: PPO update on u8 frames (8 × 128 rollout, 4 epochs × 4 minibatches of 256)\n");
    println!(
        "Samples/s; GFLOP/s ≈ 3 × the forward pass's FLOPs per sample; peak = measured 8192² matmul on the GPU in \
         the variant's precision (f32 {:.0}, bf16 {:.0} GFLOP/s).\n",
        peaks.0, peaks.1
    );
    println!("| variant | samples/s | GFLOP/s | share of peak | Flotilla / PyTorch (same precision) |");
    println!("|---|---:|---:|---:|---:|");
    let mut theirs = Vec::new();
    for variant in ["default", "bf16", "fp16"] {
        let sps = torch_samples_per_sec(&python, 1, rounds, variant, "cuda")
            .map_err(|e| eprintln!("PyTorch {variant}: {e}"))
            .ok();
        theirs.push(sps);
        let peak = if variant == "default" { peaks.0 } else { peaks.1 };
        match sps {
            Some(sps) => {
                let g = nature_cnn_gflops(sps);
                println!("| PyTorch {variant} | {sps:.0} | {g:.0} | {:.2} % | |", 100.0 * g / peak)
            }
            None => println!("| PyTorch {variant} | failed (stderr) | | | |"),
        }
    }
    for (name, options, peer) in [
        ("Flotilla f32", CnnOptions::F32, theirs[0]),
        ("Flotilla bf16", CnnOptions { channels_last: false, bf16: true }, theirs[1]),
    ] {
        let sps = PongPpoUpdate::new(options, None, device)?.samples_per_sec(rounds)?;
        let g = nature_cnn_gflops(sps);
        let peak = if options.bf16 { peaks.1 } else { peaks.0 };
        let ratio = peer.map_or("—".to_string(), |p| format!("**{:.2}**", sps / p));
        println!("| {name} | {sps:.0} | {g:.0} | {:.2} % | {ratio} |", 100.0 * g / peak);
    }
    Ok(())
}

fn actors_table(games: &[String], steps: usize, rounds: u64) -> BenchResult<()> {
    let n = 8;
    println!(
        "## Atari actor throughput: {n} envs, one emulator thread, random actions, {steps} batched steps per round\n"
    );
    let envpool = envpool_python();
    println!(
        "| game | round | Flotilla frames/s | ale-py from Python frames/s (next-step / same-step) | EnvPool frames/s | \
         Flotilla / Python (next-step) | Flotilla / Python (same-step) | Flotilla / EnvPool |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for game in games {
        let (mut ratios, mut same_ratios, mut pool_ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            let py = python_sps(game, n, steps, round, "NextStep")? * 4.0;
            let same = python_sps(game, n, steps, round, "SameStep")? * 4.0;
            let pool = match &envpool {
                Some(python) => Some(peer_sps(python, "atari_envpool.py", game, n, steps, round, &[])? * 4.0),
                None => None,
            };
            let ours = flotilla_sps(game, n, steps, round)? * 4.0;
            ratios.push(ours / py);
            same_ratios.push(ours / same);
            let (pool_cell, pool_ratio) = match pool {
                Some(p) => {
                    pool_ratios.push(ours / p);
                    (format!("{p:.0}"), format!("{:.2}", ours / p))
                }
                None => ("not installed".into(), "—".into()),
            };
            println!(
                "| {game} | {round} | {ours:.0} | {py:.0} / {same:.0} | {pool_cell} | {:.2} | {:.2} | {pool_ratio} |",
                ours / py,
                ours / same
            );
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).map_or("—".to_string(), |m| format!("**{m:.2}**"))
        };
        let (a, b, c) = (median(&mut ratios), median(&mut same_ratios), median(&mut pool_ratios));
        println!("| {game} | median | | | | {a} | {b} | {c} |");
    }
    Ok(())
}

fn main() -> BenchResult<()> {
    flotilla_learner::tune_allocator();
    let mut steps = 2_000;
    let mut rounds = 3;
    let mut only: Option<String> = None;
    let mut cuda = false;
    let mut games = vec!["pong".to_string(), "breakout".to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().ok_or("--steps N")?.parse()?,
            "--rounds" => rounds = args.next().ok_or("--rounds R")?.parse()?,
            "--only" => only = Some(args.next().ok_or("--only actors|learner")?),
            "--device" => {
                cuda = match args.next().as_deref() {
                    Some("cuda") => true,
                    Some("cpu") => false,
                    other => return Err(format!("--device cpu|cuda, not {other:?}").into()),
                }
            }
            "--games" => games = args.next().ok_or("--games a,b")?.split(',').map(str::to_string).collect(),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: [--only actors|learner] [--steps N] [--rounds R] [--games a,b] \
                     [--device cpu|cuda]"
                )
                .into());
            }
        }
    }
    flotilla_envs_python::register();
    if only.as_deref().is_none_or(|o| o == "actors") {
        actors_table(&games, steps, rounds as u64)?;
    }
    if only.as_deref().is_none_or(|o| o == "learner") {
        if cuda { gpu_learner_table(rounds)? } else { learner_table(rounds)? }
    }
    Ok(())
}
