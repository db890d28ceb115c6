//! PPO to 475, single process vs actor processes (`--only ppo`): `flotilla train` on the CartPole PPO example
//! config without and with `--actors`, one seed after another; the table gives env steps and training seconds
//! at the first evaluation ≥ 475 (read from each run's `metrics.csv`) and whether the last two evaluations held it.
use std::path::Path;
use std::process::{Command, Stdio};

use crate::{Args, BenchResult};

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

pub(crate) fn ppo_table(args: &Args) -> BenchResult<()> {
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
