//! Environment throughput: single-env steps through `Env::step` (boxed, as `make` returns it) and
//! through the buffered path, and `VecEnv` batches. Run with
//! `cargo run --release -p flotilla-envs --example steps_per_second`.

use std::hint::black_box;
use std::time::Instant;

use flotilla_core::{Action, Space};
use flotilla_envs::{Kwargs, VecActions, VecEnv, make, make_buffered, registered};

const STEPS: usize = 4_000_000;

fn action_for<'a>(space: &Space, t: usize, x: &'a [f32; 1]) -> Action<'a> {
    match space {
        Space::Discrete { n, .. } => Action::Discrete((t % *n) as i64),
        Space::Box { .. } => Action::Continuous(x),
    }
}

fn main() -> flotilla_core::Result<()> {
    for spec in registered() {
        let steps = if spec.id.starts_with("Acrobot") { STEPS / 8 } else { STEPS };
        let x = [0.3f32];

        let mut env = make(spec.id, &Kwargs::new())?;
        env.reset(Some(0))?;
        let start = Instant::now();
        for t in 0..steps {
            let step = env.step(action_for(env.action_space(), t, &x))?;
            if step.terminated || step.truncated {
                env.reset(None)?;
            }
            black_box(&step);
        }
        let single = steps as f64 / start.elapsed().as_secs_f64();

        let mut env = make_buffered(spec.id, &Kwargs::new())?;
        let mut obs = vec![0.0f32; env.observation_space().flat_dim()];
        env.reset_into(Some(0), &mut obs)?;
        let start = Instant::now();
        for t in 0..steps {
            let out = env.step_into(action_for(env.action_space(), t, &x), &mut obs)?;
            if out.terminated || out.truncated {
                env.reset_into(None, &mut obs)?;
            }
            black_box(&obs);
        }
        let buffered = steps as f64 / start.elapsed().as_secs_f64();

        let n = 16;
        let mut venv = VecEnv::make(spec.id, &Kwargs::new(), n)?;
        venv.reset(Some(0))?;
        let discrete: Vec<i64> = (0..n as i64).map(|i| i % 2).collect();
        let continuous = vec![0.3f32; n];
        let actions = match venv.action_space() {
            Space::Discrete { .. } => VecActions::Discrete(&discrete),
            Space::Box { .. } => VecActions::Continuous(&continuous),
        };
        let start = Instant::now();
        for _ in 0..steps / n {
            black_box(venv.step(&actions)?.obs);
        }
        let batched = (steps / n * n) as f64 / start.elapsed().as_secs_f64();

        println!(
            "{:<26} Env::step {:>6.2} M/s   step_into {:>6.2} M/s   VecEnv x{n} {:>6.2} M/s",
            spec.id,
            single / 1e6,
            buffered / 1e6,
            batched / 1e6
        );
    }
    Ok(())
}
