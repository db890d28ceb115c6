//! Flotilla's benchmark: prints the tables recorded in BENCHMARKS.md.
//!
//! `cargo run --release -p flotilla-tests --bin flotilla-bench [-- --quick] [--no-envs] [--only ppo,dqn,...]
//! [--set key=value ...]`
//!
//! 1. Env steps/s for every native env: one env through `Env::step` (boxed, as `make` returns it), through
//!    the allocation-free `step_into`, and a `VecEnv` of 8; plus Python Gymnasium's CartPole-v1 measured in
//!    the same run (when the setup venv is present) for the ratio.
//! 2. Every algorithm on its reference task with its example config, seeds 1–3: env steps and training
//!    seconds until the deterministic 10-episode evaluation first reaches the threshold, whether it stays
//!    there for the rest of the budget, the final evaluation, and the learner's gradient steps per second.
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use flotilla_core::{Action, Space};
use flotilla_envs::{Kwargs, VecActions, VecEnv, make, make_buffered, registered};
use flotilla_tests::train_seeds;

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

/// One algorithm on its reference task.
struct Task {
    label: &'static str,
    config: &'static str,
    threshold: f64,
    /// Overrides: budget and a fine evaluation interval.
    overrides: &'static [&'static str],
}

const TASKS: &[Task] = &[
    Task { label: "ppo", config: "cartpole_ppo.toml", threshold: 475.0, overrides: &["eval.interval_steps=1024"] },
    Task { label: "dqn", config: "cartpole_dqn.toml", threshold: 475.0, overrides: &["eval.interval_steps=1000"] },
    Task { label: "a2c", config: "cartpole_a2c.toml", threshold: 475.0, overrides: &["eval.interval_steps=5000"] },
    Task {
        label: "ppo-gauss",
        config: "pendulum_ppo.toml",
        threshold: -250.0,
        overrides: &["eval.interval_steps=4096"],
    },
    Task { label: "ddpg", config: "pendulum_ddpg.toml", threshold: -200.0, overrides: &["eval.interval_steps=1000"] },
    Task { label: "td3", config: "pendulum_td3.toml", threshold: -200.0, overrides: &["eval.interval_steps=1000"] },
];

fn algorithm_table(tasks: &[&Task], seeds: &[u64], extra: &[String]) {
    println!("\n## Algorithms on their reference tasks (\"train s\" excludes evaluation; extra settings: {extra:?})\n");
    println!(
        "| algorithm | env | seed | threshold | env steps to threshold | train s to threshold | evals ≥ threshold after | final eval | train s (budget) | gradient steps/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for task in tasks {
        let mut overrides = vec!["metrics.log_interval_steps=1000000000"];
        overrides.extend_from_slice(task.overrides);
        overrides.extend(extra.iter().map(String::as_str));
        // One seed at a time, so timings are not shared between runs.
        for r in seeds.iter().flat_map(|&seed| train_seeds(task.config, &overrides, &[seed], task.threshold)) {
            let rep = &r.report;
            let first = rep.evals.iter().position(|e| e.result.mean() >= task.threshold);
            let (steps, secs, held) = match first {
                Some(i) => {
                    let after = &rep.evals[i..];
                    let held = after.iter().filter(|e| e.result.mean() >= task.threshold).count();
                    let e = &rep.evals[i];
                    (e.env_steps.to_string(), format!("{:.2}", e.train_secs), format!("{held}/{}", after.len()))
                }
                None => ("—".into(), "—".into(), "—".into()),
            };
            let env = flotilla_tests::example_config(task.config, &[]).env.id;
            println!(
                "| {} | {env} | {} | {} | {steps} | {secs} | {held} | {:.1} | {:.2} | {:.0} |",
                task.label,
                r.seed,
                task.threshold,
                r.final_return,
                rep.train_secs,
                rep.gradient_steps as f64 / rep.update_secs.max(1e-9)
            );
        }
    }
}

fn main() -> flotilla_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    flotilla_learner::tune_allocator();
    let only: Vec<String> = std::env::args().skip_while(|a| a != "--only").skip(1).take(1).collect();
    let tasks: Vec<&Task> =
        TASKS.iter().filter(|t| only.is_empty() || only[0].split(',').any(|o| o == t.label)).collect();
    if !std::env::args().any(|a| a == "--no-envs") {
        let rust_cartpole = env_table(if quick { 400_000 } else { 4_000_000 })?;
        if let (Some(py), Some(rs)) = (python_cartpole_sps(), rust_cartpole) {
            println!(
                "\nPython gymnasium CartPole-v1, same run: {py:.0} steps/s; Flotilla Env::step is {:.0}× faster.",
                rs / py
            );
        }
    }
    // `--set key=value` (repeatable) overrides every task's config, e.g. `--set run.torch_threads=2`.
    let args: Vec<String> = std::env::args().collect();
    let extra: Vec<String> = args.windows(2).filter(|w| w[0] == "--set").map(|w| w[1].clone()).collect();
    algorithm_table(&tasks, if quick { &[1] } else { &[1, 2, 3] }, &extra);
    Ok(())
}
