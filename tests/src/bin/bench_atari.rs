//! `flotilla-bench-atari`: actor-side Atari throughput, Flotilla against ale-py driven from Python, side by
//! side in one run.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-atari [-- --steps N --games pong,breakout]
//! ```
//! Both sides step ale-py's C++ `AtariVectorEnv` (v5 sticky actions, frame skip 4, 84×84 grey, 4 stacked
//! frames, noop and fire resets, one emulator thread) with uniformly random actions: Flotilla through
//! `flotilla_envs_python::AtariVecEnv` (u8 frames copied into its batch, same-step auto-reset, life-loss
//! terminals, clipped and raw rewards), Python through `tests/peers/atari_python.py`. Frames/s count the four
//! emulator frames of each agent step. Rounds alternate the two sides; the table shows each round and the
//! median ratio.
use std::process::Command;
use std::time::Instant;

use flotilla_envs_python::{AtariConfig, AtariVecEnv};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Agent steps per second of Flotilla's Atari vector env over `steps` batched steps.
fn flotilla_sps(game: &str, n: usize, steps: usize, seed: u64) -> BenchResult<f64> {
    let mut env = AtariVecEnv::new(AtariConfig::training(game), n)?;
    env.reset(Some(seed))?;
    let n_actions = env.n_actions() as u64;
    let mut x = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let actions: Vec<i64> = (0..steps * n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % n_actions) as i64
        })
        .collect();
    let start = Instant::now();
    for batch in actions.chunks_exact(n) {
        env.step(batch)?;
    }
    Ok((steps * n) as f64 / start.elapsed().as_secs_f64())
}

/// The same from Python (`tests/peers/atari_python.py`), in a process of its own.
fn python_sps(game: &str, n: usize, steps: usize, seed: u64) -> BenchResult<f64> {
    let python = option_env!("FLOTILLA_PYTHON").ok_or("FLOTILLA_PYTHON unset at build time: run scripts/setup.sh")?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/atari_python.py");
    let out =
        Command::new(python).args([script, game, &n.to_string(), &steps.to_string(), &seed.to_string()]).output()?;
    if !out.status.success() {
        return Err(format!("{script}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

fn main() -> BenchResult<()> {
    let mut steps = 2_000;
    let mut games = vec!["pong".to_string(), "breakout".to_string()];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().ok_or("--steps N")?.parse()?,
            "--games" => games = args.next().ok_or("--games a,b")?.split(',').map(str::to_string).collect(),
            other => {
                return Err(format!("unknown argument {other:?}; usage: [--steps N] [--games pong,breakout]").into());
            }
        }
    }
    let n = 8;
    println!(
        "## Atari actor throughput: {n} envs, one emulator thread, random actions, {steps} batched steps per round\n"
    );
    println!("| game | round | Flotilla frames/s | Python frames/s | Flotilla / Python |");
    println!("|---|---:|---:|---:|---:|");
    for game in &games {
        let mut ratios = Vec::new();
        for round in 1..=3u64 {
            let py = python_sps(game, n, steps, round)? * 4.0;
            let ours = flotilla_sps(game, n, steps, round)? * 4.0;
            ratios.push(ours / py);
            println!("| {game} | {round} | {ours:.0} | {py:.0} | {:.2} |", ours / py);
        }
        ratios.sort_by(f64::total_cmp);
        println!("| {game} | median | | | **{:.2}** |", ratios[1]);
    }
    Ok(())
}
