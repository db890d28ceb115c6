//! The `flotilla` command-line tool.
//!
//! ```text
//! flotilla train CONFIG.toml [--set key=value ...] [--out RUN_DIR] [--stop-at N]
//! flotilla train --resume RUN_DIR [--stop-at N]
//! flotilla train CONFIG.toml --population N [...]       # N seeds as one run ([population]: sweeps, PBT)
//! flotilla sweep CONFIG.toml --out DIR --jobs J [--job-index I]   # job I's members of a population sweep
//! flotilla train CONFIG.toml --actors N [--set ...] [--out RUN_DIR] [--stop-at N]  # learner + N actor processes,
//!                                                      # supervised: a dead learner resumes from its checkpoint
//! flotilla train CONFIG.toml --learners L --actors N [...]   # L data-parallel learners, N/L actors each
//! flotilla learner CONFIG.toml [--listen ADDR] [--actors N] [--token T]   # actors join from anywhere
//!     [--tls-cert C --tls-key K [--client-ca CA]] [--insecure]            # TLS, or plaintext off loopback
//! flotilla actor --learner HOST:PORT [--token T | FLOTILLA_TOKEN=T] [--index I]
//!     [--tls-ca CA [--tls-cert C --tls-key K] [--tls-domain NAME]]
//! flotilla eval RUN_DIR [--episodes N] [--seed S] [--render DIR]   # --render: PNG frames of each episode
//! flotilla export RUN_DIR --out policy.safetensors     # the acting policy as a torch nn.Sequential
//! flotilla act RUN_DIR --obs obs.json                  # deterministic actions on observation rows
//! flotilla plot RUN_DIR [RUN_DIR ...] [--metric eval/mean_return] [--out curves.png|.svg] [--group]
//! flotilla report RUN_DIR [RUN_DIR ...] [--json] [--threshold X] [--metric COLUMN] [--at STEPS]   # IQM, CIs
//!                 [--against RUN_DIR ...]   # and P(X > Y), the IQM difference, against other runs
//! ```
mod actor;
mod export;
mod group;
mod launch;
mod launcher;
mod plot;
mod population;
mod progress;
mod render;
mod report;
mod supervise;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::eval::evaluate;
use flotilla_learner::run_dir::RunDir;
use flotilla_learner::train::Trainer;

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
        #[arg(required_unless_present = "resume")]
        config: Option<PathBuf>,
        /// Override a config value, e.g. `--set algorithm.learning_rate=3e-4` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", conflicts_with = "resume")]
        overrides: Vec<String>,
        /// Run directory (default: runs/ENV-ALGO-seedS-TIMESTAMP).
        #[arg(long, conflicts_with = "resume")]
        out: Option<PathBuf>,
        /// Continue the run in RUN_DIR exactly where its checkpoint left it.
        #[arg(long, value_name = "RUN_DIR", conflicts_with = "config")]
        resume: Option<PathBuf>,
        /// Stop (with a checkpoint) once this many env steps are done, keeping the configured budget for the
        /// schedules; `--resume` continues from there.
        #[arg(long, value_name = "ENV_STEPS")]
        stop_at: Option<u64>,
        /// Train with a learner process and N actor processes on loopback, each restarted if it dies (the learner
        /// from its last checkpoint, up to `[learner] max_restarts` times; the actors reconnect to it).
        #[arg(long, value_name = "N", conflicts_with = "resume")]
        actors: Option<usize>,
        /// Train with L data-parallel learner processes (gradients all-reduced on c10d), each serving N/L of the
        /// actors; restarted together from the last checkpoint if one dies (`[learner] max_restarts`).
        #[arg(long, value_name = "L", conflicts_with = "resume", requires = "actors")]
        learners: Option<usize>,
        #[command(flatten)]
        tls: TlsArgs,
        /// Train N members (seeds seed, seed + 1, …) as one run: shorthand for `--set population.size=N`
        /// (`[population]` also sweeps hyperparameters and runs PBT). Each member gets RUN_DIR/members/NNN.
        #[arg(long, value_name = "N", conflicts_with = "resume")]
        population: Option<usize>,
    },
    /// Train one job's share of a population (`[population]` in CONFIG): members k with k mod J = I, into
    /// OUT/job-III-of-JJJ. Slurm arrays and Kubernetes Indexed Jobs give the index through the environment;
    /// running the same job again continues it from its checkpoints; `flotilla report OUT/job-*` merges them.
    Sweep {
        /// Experiment config (TOML) with a [population] table.
        config: PathBuf,
        /// Override a config value (repeatable), e.g. `--set population.size=32`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// The sweep's directory, shared by all its jobs.
        #[arg(long)]
        out: PathBuf,
        /// Jobs the population is split into.
        #[arg(long, value_name = "J")]
        jobs: usize,
        /// This job, 0-based (default: SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN, or JOB_COMPLETION_INDEX).
        #[arg(long, value_name = "I")]
        job_index: Option<usize>,
        /// Stop (with checkpoints) at this many env steps per member.
        #[arg(long, value_name = "ENV_STEPS")]
        stop_at: Option<u64>,
    },
    /// Run a distributed learner that actors join with `flotilla actor` (from this or other machines).
    Learner {
        /// Experiment config (TOML).
        #[arg(required_unless_present = "supervised_resume")]
        config: Option<PathBuf>,
        /// Address to listen on (default: `[learner] listen`, loopback). Other machines need e.g. 0.0.0.0:50051.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Actor slots (default: `[actors] count`).
        #[arg(long, value_name = "N")]
        actors: Option<usize>,
        /// The run token actors must present (default: generated and printed).
        #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Override a config value (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Run directory.
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        tls: TlsArgs,
        /// Set by a `flotilla train --actors N` supervisor: it launched the actors; listen on --listen without
        /// saving it in the run's config.
        #[arg(long, hide = true, requires = "listen")]
        supervised: bool,
        /// Set by a supervisor: continue the run in RUN_DIR from its checkpoint (or from the start, in it, when it
        /// has none yet), cutting metrics.csv back to the checkpoint.
        #[arg(long, hide = true, value_name = "RUN_DIR", requires = "supervised")]
        #[arg(conflicts_with_all = ["config", "out", "overrides", "actors"])]
        supervised_resume: Option<PathBuf>,
        /// Set by a supervisor: how many times it has restarted the learner.
        #[arg(long, hide = true, default_value_t = 0)]
        restarts: u32,
        /// Set by a supervisor restarting the learner: when the previous one died (Unix seconds), to log and
        /// record (`charts/restart_secs`) how long until this one accepts actors' data.
        #[arg(long, hide = true, value_name = "UNIX_SECS", requires = "supervised")]
        died_at: Option<f64>,
        /// Set by a supervisor: stop at this many env steps (`flotilla train --stop-at`).
        #[arg(long, hide = true, value_name = "ENV_STEPS")]
        stop_at: Option<u64>,
    },
    /// Act for a learner: step envs, send trajectory chunks, pick up new parameters.
    Actor {
        /// The learner's address.
        #[arg(long, value_name = "HOST:PORT")]
        learner: String,
        /// The run token.
        #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
        token: String,
        /// Slot to take (launchers set it; default: the learner picks).
        #[arg(long)]
        index: Option<u32>,
        /// Seconds to keep reconnecting to a learner that went away.
        #[arg(long, default_value_t = 60.0)]
        reconnect_secs: f64,
        /// Connect over TLS, trusting this CA certificate (PEM) to have signed the learner's certificate.
        #[arg(long, value_name = "FILE")]
        tls_ca: Option<PathBuf>,
        /// This actor's certificate (PEM), for a learner that requires client certificates (mutual TLS).
        #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Check the learner's certificate against this name instead of the host in --learner.
        #[arg(long, value_name = "NAME", requires = "tls_ca")]
        tls_domain: Option<String>,
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
        /// Also draw each episode (classic-control envs) as PNG frames: DIR/episode-K/frame-NNNN.png.
        #[arg(long, value_name = "DIR")]
        render: Option<PathBuf>,
    },
    /// Draw learning curves of runs: a metric against env steps, ± its std, one colour per run.
    Plot {
        /// Run directories written by `flotilla train`.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// The metrics.csv column to draw (its std column, e.g. eval/std_return, gives the band).
        #[arg(long, default_value = "eval/mean_return")]
        metric: String,
        /// The metrics.csv column on the x axis: env_steps, or e.g. train_secs (training seconds).
        #[arg(long, default_value = "env_steps")]
        x: String,
        /// Output file: SVG if it ends in .svg, else PNG.
        #[arg(long, default_value = "curves.png")]
        out: PathBuf,
        /// Draw runs that differ only in run.seed as one mean line with a ± std band across them.
        #[arg(long)]
        group: bool,
        /// A published curve to draw beside the runs: a CSV with the header `label,env_steps,value`, one line per
        /// label (e.g. docs/benchmarks/atari-table/cleanrl_ppo_atari_pong.csv). May be given more than once.
        #[arg(long = "reference", value_name = "CSV")]
        references: Vec<PathBuf>,
    },
    /// Write a trained run's acting policy in PyTorch's own layout: a torch.nn.Sequential state dict
    /// (`0.weight`, `0.bias`, …) with the layer list in the file's metadata (README: "Taking a policy to PyTorch").
    Export {
        /// Run directory written by `flotilla train`.
        run_dir: PathBuf,
        /// The safetensors file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Print the deterministic actions a trained run's policy takes (those `flotilla eval` takes, before the
    /// env's clipping) on observation rows, as JSON, one per row.
    Act {
        /// Run directory written by `flotilla train`.
        run_dir: PathBuf,
        /// A JSON array of observation rows, each the observation flattened: `[[0.01, -0.02, 0.03, 0.04], …]`.
        /// For a recurrent policy, a sequence of such batches (`[[row, …], …]`, one per step, the same rows
        /// each step) is acted on step by step, carrying each row's state.
        #[arg(long, value_name = "FILE.json")]
        obs: PathBuf,
        /// Recurrent policies: each row's state before the first step, a JSON array of rows (default: zeros,
        /// an episode's start). The state after the last step is printed with the actions.
        #[arg(long, value_name = "FILE.json")]
        state: Option<PathBuf>,
    },
    /// Summarise populations and runs: per member its seed, hyperparameters, final and best return, first step
    /// at the reward threshold and whether it held there; IQM, mean and median with 95 % stratified bootstrap
    /// CIs, the solved fraction and how many reached and held the threshold.
    Report {
        /// Population directories (population.json) or run directories; several are merged (a split sweep's jobs).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Print one JSON object instead of the tables.
        #[arg(long)]
        json: bool,
        /// The threshold (default: the env's registered reward threshold): a member is solved at a final return
        /// ≥ X; it reached X at its first evaluation ≥ X, and held it if no evaluation after that is below.
        #[arg(long, allow_hyphen_values = true)]
        threshold: Option<f64>,
        /// The metrics.csv column whose last value is a member's final return.
        #[arg(long, default_value = "eval/mean_return")]
        metric: String,
        /// Judge every member as of this env step: later rows left out; a run is finished once it has a row at
        /// or after it (so runs still going count, and runs of longer schedules compare at one budget).
        #[arg(long, value_name = "STEPS", value_parser = clap::value_parser!(u64).range(1..))]
        at: Option<u64>,
        /// Compare RUNS (X) with these runs (Y), reported alike: rliable's probability of improvement P(X > Y)
        /// and the IQM difference X − Y of the finished members' final returns, with bootstrap intervals.
        #[arg(long, value_name = "RUNS", num_args = 1..)]
        against: Vec<PathBuf>,
    },
}

/// TLS options of `flotilla learner` and `flotilla train`, the CLI forms of `[transport]`'s keys.
#[derive(Args, Default)]
struct TlsArgs {
    /// The learner's certificate chain (PEM): serve gRPC over TLS ([transport] tls_cert).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM) ([transport] tls_key).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) that signed --tls-cert; actors launched by `train --actors` trust it
    /// ([transport] tls_ca).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Mutual TLS: accept only actors whose certificate this CA (PEM) signed ([transport] client_ca).
    #[arg(long, value_name = "FILE")]
    client_ca: Option<PathBuf>,
    /// Serve plaintext gRPC on an address other machines can reach ([transport] insecure = true).
    #[arg(long, conflicts_with = "tls_cert")]
    insecure: bool,
}

impl TlsArgs {
    /// The options as `--set` overrides of `[transport]`.
    fn overrides(&self) -> Vec<String> {
        let paths = [
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
            ("tls_ca", &self.tls_ca),
            ("client_ca", &self.client_ca),
        ];
        let mut out: Vec<String> = paths
            .iter()
            .filter_map(|(key, path)| path.as_ref().map(|p| format!("transport.{key}={:?}", p.display().to_string())))
            .collect();
        if self.insecure {
            out.push("transport.insecure=true".into());
        }
        out
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(progress::log_writer)
        .init();
    // Configs may name Python Gymnasium envs: `[env] id = "gymnasium:Acrobot-v1"`.
    flotilla_envs_python::register();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    // Switches read later (the fused host kernels' lanes and the batched updates' timing on their first step,
    // the progress line at its first row): refuse a bad value here, by name.
    flotilla_algorithms::host_lanes()?;
    flotilla_algorithms::nn::phases::enabled()?;
    progress::allowed()?;
    let mut command = cli.command;
    if let Command::Train { population: Some(n), overrides, .. } = &mut command {
        overrides.push(format!("population.size={n}"));
    }
    match command {
        Command::Train {
            config: Some(path),
            mut overrides,
            out,
            actors: Some(n),
            learners: Some(l),
            stop_at,
            tls,
            ..
        } if l > 1 && !flotilla_learner::data_parallel::is_rank() => {
            overrides.extend(tls.overrides());
            anyhow::ensure!(
                n >= l && n.is_multiple_of(l),
                "--actors {n} does not split evenly between --learners {l}: give a multiple of {l}"
            );
            overrides.push(format!("learner.learners={l}"));
            let mut checked = overrides.clone();
            checked.push(format!("actors.count={}", n / l));
            // Everything that can be checked before a process starts is checked here.
            let config = ExperimentConfig::load(&path, &checked)?;
            let out = out.unwrap_or_else(|| launch::default_out(&config));
            anyhow::ensure!(
                !out.join("config.toml").exists(),
                "{} already holds a run; choose another --out",
                out.display()
            );
            let start = group::GroupStart::Fresh { config: path, overrides, actors: n / l, out };
            group::group_train(&config, start, stop_at.unwrap_or(u64::MAX), &launcher::install_stop_signals())
        }
        Command::Train { config: Some(path), mut overrides, out, actors: Some(n), learners, stop_at, tls, .. }
            if learners.unwrap_or(1) <= 1 && !flotilla_learner::data_parallel::is_rank() =>
        {
            // One learner: a supervisor process runs it as a child, restarted from its checkpoint if it dies.
            overrides.extend(tls.overrides());
            overrides.push(format!("actors.count={n}"));
            let config = ExperimentConfig::load(&path, &overrides)?;
            if config.learner.learners > 1 {
                // A rank of a data-parallel group started by Slurm (`SLURM_PROCID`): the learner runs here.
                let stop_at = stop_at.unwrap_or(u64::MAX);
                return learner_command(&path, &overrides, out, launch::Actors::Launch, None, stop_at);
            }
            anyhow::ensure!(config.actors.count > 0, "a distributed run needs actors: pass --actors N (N > 0)");
            let out = out.unwrap_or_else(|| launch::default_out(&config));
            anyhow::ensure!(
                !out.join("config.toml").exists(),
                "{} already holds a run ({}/config.toml exists); choose another --out",
                out.display(),
                out.display()
            );
            let start = supervise::Start::Fresh { config: path, overrides, out };
            supervise::supervised_train(&config, start, stop_at.unwrap_or(u64::MAX))
        }
        Command::Train { config: Some(path), mut overrides, out, actors: Some(n), learners, stop_at, tls, .. } => {
            overrides.extend(tls.overrides());
            // torchrun --max-restarts starts a failed group again with the same command line: continue from the
            // run's checkpoint, as `flotilla train --learners` does with `--resume`.
            let restarts = flotilla_learner::data_parallel::restart_count()?;
            if let Some(dir) = out.as_deref().filter(|dir| restarts > 0 && dir.join("checkpoint.safetensors").is_file())
            {
                tracing::info!("restart {restarts} of the group: resuming {}", dir.display());
                return train_command(None, &[], None, Some(dir), stop_at.unwrap_or(u64::MAX));
            }
            if let Some(l) = learners {
                overrides.push(format!("learner.learners={l}"));
            }
            overrides.push(format!("actors.count={n}"));
            learner_command(&path, &overrides, out, launch::Actors::Launch, None, stop_at.unwrap_or(u64::MAX))
        }
        Command::Train { config, overrides, out, resume, stop_at, tls, .. } => {
            anyhow::ensure!(
                tls.overrides().is_empty(),
                "--tls-cert, --tls-key, --tls-ca, --client-ca and --insecure are for distributed runs (--actors N); \
                 a resumed run keeps its config's [transport]"
            );
            train_command(config.as_deref(), &overrides, out, resume.as_deref(), stop_at.unwrap_or(u64::MAX))
        }
        Command::Learner {
            config,
            listen,
            actors,
            token,
            mut overrides,
            out,
            tls,
            supervised,
            supervised_resume,
            restarts,
            died_at,
            stop_at,
        } => {
            let stop_at = stop_at.unwrap_or(u64::MAX);
            if supervised {
                let listen = listen.context("--supervised needs --listen")?;
                let role = launch::Actors::Supervised { listen, restarts, died_at };
                if let Some(dir) = supervised_resume {
                    let (run_dir, config) = RunDir::open(&dir)?;
                    let start = launch::Start::Resume(run_dir);
                    return launch::distributed_train(&config, start, role, token, stop_at);
                }
                overrides.extend(tls.overrides());
                if let Some(n) = actors {
                    overrides.push(format!("actors.count={n}"));
                }
                let path = config.context("give a CONFIG.toml")?;
                return learner_command(&path, &overrides, out, role, token, stop_at);
            }
            let config = config.context("give a CONFIG.toml")?;
            overrides.extend(tls.overrides());
            if let Some(addr) = listen {
                overrides.push(format!("learner.listen={addr:?}"));
            }
            if let Some(n) = actors {
                overrides.push(format!("actors.count={n}"));
            }
            learner_command(&config, &overrides, out, launch::Actors::External, token, u64::MAX)
        }
        Command::Actor { learner, token, index, reconnect_secs, tls_ca, tls_cert, tls_key, tls_domain } => {
            let tls = match &tls_ca {
                None => None,
                Some(ca) => {
                    let identity = tls_cert.as_deref().zip(tls_key.as_deref());
                    let tls = flotilla_transport::tls::ClientTls::from_files(ca, identity)
                        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
                    Some(match tls_domain {
                        Some(name) => tls.with_domain(name),
                        None => tls,
                    })
                }
            };
            actor::actor_command(&learner, &token, index, reconnect_secs, tls).map(|_| ())
        }
        Command::Sweep { config, overrides, out, jobs, job_index, stop_at } => {
            let config = ExperimentConfig::load(&config, &overrides)?;
            anyhow::ensure!(
                config.population.is_some(),
                "flotilla sweep trains a population: give the config a [population] table (size, sweep) or \
                 --set population.size=N"
            );
            let job = population::job_share(jobs, job_index)?;
            population::train(&config, &population::job_dir(&out, job), job, stop_at.unwrap_or(u64::MAX))
        }
        Command::Eval { run_dir, episodes, seed, render } => eval_command(&run_dir, episodes, seed, render.as_deref()),
        Command::Export { run_dir, out } => export::export_command(&run_dir, &out),
        Command::Act { run_dir, obs, state } => export::act_command(&run_dir, &obs, state.as_deref()),
        Command::Plot { runs, metric, x, out, group, references } => {
            plot::plot_command(&runs, &metric, &x, &out, group, &references)
        }
        Command::Report { runs, json, threshold, metric, at, against } => {
            report::report_command(&runs, &against, json, &report::Judge { threshold, metric, at })
        }
    }
}

fn train_command(
    config_path: Option<&Path>,
    overrides: &[String],
    out: Option<PathBuf>,
    resume: Option<&Path>,
    stop_at: u64,
) -> Result<()> {
    let (run_dir, config, mut trainer, mut csv) = match (resume, config_path) {
        (Some(dir), _) => {
            if dir.join(flotilla_learner::population::POPULATION_FILE).is_file() {
                return population::resume(dir, stop_at);
            }
            let (run_dir, config) = RunDir::open(dir)?;
            let checkpoint = run_dir.checkpoint_path();
            anyhow::ensure!(checkpoint.is_file(), "{} has no checkpoint to resume from", dir.display());
            if config.learner.learners > 1 && !flotilla_learner::data_parallel::is_rank() {
                // A data-parallel run: the whole group resumes.
                let stop = launcher::install_stop_signals();
                return group::group_train(&config, group::GroupStart::Resume(dir.to_path_buf()), stop_at, &stop);
            }
            if config.actors.count > 0 && !flotilla_learner::data_parallel::is_rank() {
                // A distributed run: a supervisor resumes its learner and launches its actors again.
                return supervise::supervised_train(&config, supervise::Start::Resume(dir.to_path_buf()), stop_at);
            }
            if config.actors.count > 0 {
                // A rank of a data-parallel group: the learner resumes here and launches its actors again.
                let start = launch::Start::Resume(run_dir);
                return launch::distributed_train(&config, start, launch::Actors::Launch, None, stop_at);
            }
            let trainer = Trainer::resume(&config, &checkpoint)
                .with_context(|| format!("resuming from {}", checkpoint.display()))?;
            tracing::info!("resuming {} at {} env steps", dir.display(), trainer.env_steps());
            let csv = run_dir.metrics_appender(trainer.env_steps())?;
            (run_dir, config, trainer, csv)
        }
        (None, Some(path)) => {
            let config = ExperimentConfig::load(path, overrides)?;
            let out = out.unwrap_or_else(|| launch::default_out(&config));
            if config.population.is_some() {
                let job = flotilla_learner::population::JobShare::ALL;
                return population::train(&config, &out, job, stop_at);
            }
            // Everything that can fail (envs, device, spaces the algorithm cannot take) fails before the run
            // directory is written.
            let trainer = Trainer::new(&config)?;
            let run_dir = RunDir::create(&out, &config)?;
            tracing::info!("run directory {}; resolved config:\n{}", out.display(), config.to_toml());
            let csv = run_dir.metrics_writer()?;
            (run_dir, config, trainer, csv)
        }
        (None, None) => anyhow::bail!("give a CONFIG.toml or --resume RUN_DIR"),
    };
    let checkpoint = run_dir.checkpoint_path();
    let total = config.run.total_env_steps.min(stop_at);
    let on_log = &mut |row: &flotilla_learner::progress::LogRow| {
        progress::update(row, total);
        csv.write_row(&row.columns())
    };
    let result = trainer.run(stop_at, on_log, &mut |t| t.save_checkpoint(&checkpoint));
    progress::finish();
    result?;
    trainer.save_checkpoint(&checkpoint)?;
    let model = run_dir.model_path();
    trainer.agent().save_weights(&model).with_context(|| format!("saving the policy to {}", model.display()))?;
    let report = trainer.report();
    let dir = run_dir.path().display();
    if report.env_steps < config.run.total_env_steps {
        println!(
            "stopped at {} of {} env steps; continue with: flotilla train --resume {dir}",
            report.env_steps, config.run.total_env_steps
        );
        return Ok(());
    }
    launch::print_summary(&config, &report, None, &model, run_dir.path());
    Ok(())
}

fn learner_command(
    path: &Path,
    overrides: &[String],
    out: Option<PathBuf>,
    actors: launch::Actors,
    token: Option<String>,
    stop_at: u64,
) -> Result<()> {
    let config = ExperimentConfig::load(path, overrides)?;
    anyhow::ensure!(config.actors.count > 0, "a distributed run needs actors: pass --actors N or set [actors] count");
    let out = out.unwrap_or_else(|| launch::default_out(&config));
    launch::distributed_train(&config, launch::Start::Fresh(out), actors, token, stop_at)
}

fn eval_command(run_dir: &Path, episodes: usize, seed: Option<u64>, render: Option<&Path>) -> Result<()> {
    anyhow::ensure!(episodes > 0, "--episodes must be at least 1");
    let (dir, config) = RunDir::open(run_dir)?;
    let model = dir.model_path();
    anyhow::ensure!(model.is_file(), "{} has no trained policy ({} is missing)", run_dir.display(), model.display());
    let device = config.run.device.resolve()?;
    tch::set_num_threads(config.run.torch_threads.max(1) as i32);
    let (observation_space, action_space) = config.env.spaces()?;
    let mut agent = config.build_agent(&observation_space, &action_space, device)?;
    agent.load_weights(&model)?;
    if let Some(frames) = render {
        return render::render_command(&config, agent.as_mut(), episodes, seed.unwrap_or(config.eval.seed), frames);
    }
    let result = evaluate(agent.as_mut(), &config.env, episodes, seed.unwrap_or(config.eval.seed))?;
    println!(
        "{}: mean return {:.2} ± {:.2} over {} episodes (deterministic policy, {})",
        config.env.id,
        result.mean(),
        result.std(),
        result.returns.len(),
        model.display()
    );
    for (task, mean) in result.task_means() {
        println!("task {task}: mean return {mean:.2}");
    }
    Ok(())
}
