//! Flotilla's benchmark: prints the tables recorded in BENCHMARKS.md.
//!
//! `cargo run --release -p flotilla-tests --bin flotilla-bench [-- --quick]`
//!
//! 1. Env steps/s for every native env: one env through `Env::step` (boxed, as `make` returns it), through
//!    the allocation-free `step_into`, and a `VecEnv` of 8; plus Python Gymnasium's CartPole-v1 measured in
//!    the same run (when the setup venv is present) for the ratio.
//! 2. PPO on CartPole-v1 with the quick-start config, seeds 1–3: env steps and training seconds until the
//!    deterministic 10-episode evaluation (every 1,024 steps) first reaches ≥ 475, whether it stays there
//!    for the rest of the 100 K-step budget, and the final evaluation.
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use flotilla_core::{Action, Space};
use flotilla_envs::{Kwargs, VecActions, VecEnv, make, make_buffered, registered};
use flotilla_tests::cartpole_ppo_config;

/// Cheap varied actions: index `t mod n`, or a sweep over the box.
fn action_for<'a>(space: &Space, t: usize, scratch: &'a mut [f32; 1]) -> Action<'a> {
    match space {
        Space::Discrete { n, .. } => Action::Discrete((t % *n) as i64),
        Space::Box { low, high, .. } => {
            scratch[0] = low[0] + (high[0] - low[0]) * ((t % 17) as f32 / 16.0);
            Action::Continuous(scratch)
        }
    }
}

fn env_table(steps: usize) -> flotilla_core::Result<Option<f64>> {
    println!("## Env steps per second (one core, release)\n");
    println!("| env | Env::step | step_into | VecEnv ×8 (env steps/s) |");
    println!("|---|---:|---:|---:|");
    let mut cartpole = None;
    for spec in registered() {
        let steps = if spec.id.starts_with("Acrobot") { steps / 8 } else { steps };
        let mut x = [0.0f32];
        let mut env = make(spec.id, &Kwargs::new())?;
        env.reset(Some(0))?;
        let start = Instant::now();
        for t in 0..steps {
            let space = env.action_space().clone();
            let step = env.step(action_for(&space, t, &mut x))?;
            if step.terminated || step.truncated {
                env.reset(None)?;
            }
            black_box(&step);
        }
        let single = steps as f64 / start.elapsed().as_secs_f64();

        let mut env = make_buffered(spec.id, &Kwargs::new())?;
        let space = env.action_space().clone();
        let mut obs = vec![0.0f32; env.observation_space().flat_dim()];
        env.reset_into(Some(0), &mut obs)?;
        let start = Instant::now();
        for t in 0..steps {
            let out = env.step_into(action_for(&space, t, &mut x), &mut obs)?;
            if out.terminated || out.truncated {
                env.reset_into(None, &mut obs)?;
            }
            black_box(&obs);
        }
        let buffered = steps as f64 / start.elapsed().as_secs_f64();

        let n = 8;
        let mut venv = VecEnv::make(spec.id, &Kwargs::new(), n)?;
        venv.reset(Some(0))?;
        let discrete: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
        let continuous: Vec<f32> = (0..n).map(|i| i as f32 / n as f32 - 0.5).collect();
        let start = Instant::now();
        for _ in 0..steps / n {
            let actions = match venv.action_space() {
                Space::Discrete { .. } => VecActions::Discrete(&discrete),
                Space::Box { .. } => VecActions::Continuous(&continuous),
            };
            black_box(venv.step(&actions)?.obs);
        }
        let batched = (steps / n * n) as f64 / start.elapsed().as_secs_f64();
        if spec.id == "CartPole-v1" {
            cartpole = Some(single);
        }
        println!("| {} | {:.2} M | {:.2} M | {:.2} M |", spec.id, single / 1e6, buffered / 1e6, batched / 1e6);
    }
    Ok(cartpole)
}

/// Python Gymnasium CartPole-v1 steps/s with random actions, measured now, or None without the venv.
fn python_cartpole_sps() -> Option<f64> {
    let python = option_env!("FLOTILLA_PYTHON")?;
    let script = r#"
import time, gymnasium as gym, numpy as np
env = gym.make("CartPole-v1"); env.reset(seed=0); rng = np.random.default_rng(0)
acts = rng.integers(0, 2, 200_000); t = time.perf_counter()
for a in acts:
    _, _, term, trunc, _ = env.step(int(a))
    if term or trunc: env.reset()
print(len(acts) / (time.perf_counter() - t))
"#;
    let out = Command::new(python).args(["-c", script]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn ppo_table(seeds: &[u64]) {
    println!("\n## PPO CartPole-v1 (quick-start config, 8 envs, 1 torch thread)\n");
    println!(
        "| seed | env steps to eval ≥ 475 | train s to eval ≥ 475 | evals ≥ 475 after that | final eval (100 K) | train s (100 K) | env steps/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &seed in seeds {
        let seed_override = format!("run.seed={seed}");
        let config =
            cartpole_ppo_config(&[&seed_override, "eval.interval_steps=1024", "metrics.log_interval_steps=1000000000"]);
        let (_, report) = flotilla_learner::train::train(&config, &mut |_| Ok(())).expect("training runs");
        let first = report.evals.iter().position(|e| e.result.mean() >= 475.0);
        let (steps, secs, stays) = match first {
            Some(i) => {
                let after = &report.evals[i..];
                let held = after.iter().filter(|e| e.result.mean() >= 475.0).count();
                let e = &report.evals[i];
                (e.env_steps.to_string(), format!("{:.2}", e.train_secs), format!("{held}/{}", after.len()))
            }
            None => ("—".into(), "—".into(), "—".into()),
        };
        println!(
            "| {seed} | {steps} | {secs} | {stays} | {:.1} | {:.2} | {:.0} |",
            report.final_eval().mean(),
            report.train_secs,
            report.env_steps as f64 / report.train_secs
        );
    }
}

fn main() -> flotilla_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    flotilla_learner::tune_allocator();
    let rust_cartpole = env_table(if quick { 400_000 } else { 4_000_000 })?;
    if let (Some(py), Some(rs)) = (python_cartpole_sps(), rust_cartpole) {
        println!(
            "\nPython gymnasium CartPole-v1, same run: {:.0} steps/s; Flotilla Env::step is {:.0}× faster.",
            py,
            rs / py
        );
    }
    ppo_table(if quick { &[1] } else { &[1, 2, 3] });
    Ok(())
}
