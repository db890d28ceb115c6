//! The `flotilla` command-line tool.
//!
//! ```text
//! flotilla train CONFIG.toml [--set key=value ...] [--out RUN_DIR]
//! flotilla eval RUN_DIR [--episodes N] [--seed S]
//! ```
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use flotilla_algorithms::ppo::Ppo;
use flotilla_learner::config::{AlgorithmConfig, ExperimentConfig};
use flotilla_learner::eval::evaluate;
use flotilla_learner::run_dir::RunDir;
use flotilla_learner::train::train;

#[derive(Parser)]
#[command(name = "flotilla", version, about = "Distributed reinforcement learning on libtorch")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train an agent as CONFIG says; writes the resolved config, metrics and final weights to a run directory.
    Train {
        /// Experiment config (TOML).
        config: PathBuf,
        /// Override a config value, e.g. `--set algorithm.learning_rate=3e-4` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Run directory (default: runs/ENV-ALGO-seedS-TIMESTAMP).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Evaluate a trained run's policy deterministically and print the mean and std of the return.
    Eval {
        /// Run directory written by `flotilla train`.
        run_dir: PathBuf,
        /// Episodes to run.
        #[arg(long, default_value_t = 10)]
        episodes: usize,
        /// Seed of the first evaluation env (env i gets seed + i); default: the run's eval seed.
        #[arg(long)]
        seed: Option<u64>,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train { config, overrides, out } => train_command(&config, &overrides, out),
        Command::Eval { run_dir, episodes, seed } => eval_command(&run_dir, episodes, seed),
    }
}

fn train_command(config_path: &Path, overrides: &[String], out: Option<PathBuf>) -> Result<()> {
    let config = ExperimentConfig::load(config_path, overrides)?;
    let out = out.unwrap_or_else(|| {
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        PathBuf::from("runs").join(format!(
            "{}-{}-seed{}-{stamp}",
            config.env.id,
            config.algorithm_name(),
            config.run.seed
        ))
    });
    let run_dir = RunDir::create(&out, &config)?;
    tracing::info!("run directory {}; resolved config:\n{}", out.display(), config.to_toml());
    let mut csv = run_dir.metrics_writer()?;
    let (agent, report) = train(&config, &mut |row| csv.write_row(&row.columns()))?;
    let model = run_dir.model_path();
    agent.save(&model).with_context(|| format!("saving the trained policy to {}", model.display()))?;
    let e = report.final_eval();
    println!(
        "trained {} with {} for {} env steps in {:.1} s",
        config.env.id,
        config.algorithm_name(),
        report.env_steps,
        report.train_secs
    );
    println!("evaluation return: {:.1} ± {:.1} over {} episodes (deterministic)", e.mean(), e.std(), e.returns.len());
    println!("saved policy: {}", model.display());
    println!("run directory: {}  (evaluate again with: flotilla eval {})", out.display(), out.display());
    Ok(())
}

fn eval_command(run_dir: &Path, episodes: usize, seed: Option<u64>) -> Result<()> {
    anyhow::ensure!(episodes > 0, "--episodes must be at least 1");
    let (dir, config) = RunDir::open(run_dir)?;
    let model = dir.model_path();
    anyhow::ensure!(model.is_file(), "{} has no trained policy ({} is missing)", run_dir.display(), model.display());
    let device = config.run.device.resolve()?;
    tch::set_num_threads(config.run.torch_threads.max(1) as i32);
    let kwargs = config.env.registry_kwargs()?;
    let env = flotilla_envs::make(&config.env.id, &kwargs)?;
    let AlgorithmConfig::Ppo(ppo) = &config.algorithm;
    let mut agent = Ppo::new(env.observation_space(), env.action_space(), ppo.clone(), device, config.run.seed)?;
    agent.load(&model)?;
    let result = evaluate(&mut agent, &config.env, episodes, seed.unwrap_or(config.eval.seed))?;
    println!(
        "{}: mean return {:.2} ± {:.2} over {} episodes (deterministic policy, {})",
        config.env.id,
        result.mean(),
        result.std(),
        episodes,
        model.display()
    );
    Ok(())
}
