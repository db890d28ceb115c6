//! `flotilla train CONFIG --population N`, `[population]` configs, and `flotilla sweep`: a population trained
//! in this process (`flotilla_learner::population`), its results printed member by member.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::population::{self, JobShare, MemberResult, POPULATION_FILE};

/// Train the population `config` describes into `out` (or continue it, when `out` already holds this job's
/// population: a requeued Slurm array task or a retried Kubernetes pod runs the same command again).
pub fn train(config: &ExperimentConfig, out: &Path, job: JobShare, stop_at: u64) -> Result<()> {
    if out.join(POPULATION_FILE).is_file() && job.jobs > 1 {
        tracing::info!("{} holds this job's population already: resuming it", out.display());
        return resume(out, stop_at);
    }
    let results = population::train(config, out, job, stop_at)?;
    print_results(config, &results, out);
    Ok(())
}

/// Continue the population in `dir` from its checkpoints.
pub fn resume(dir: &Path, stop_at: u64) -> Result<()> {
    let results = population::resume(dir, stop_at).with_context(|| format!("resuming {}", dir.display()))?;
    let (_, config) = flotilla_learner::run_dir::RunDir::open(dir)?;
    print_results(&config, &results, dir);
    Ok(())
}

/// This process's share of a sweep: `--job-index`, else `SLURM_ARRAY_TASK_ID` (minus `SLURM_ARRAY_TASK_MIN`),
/// else `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job).
pub fn job_share(jobs: usize, index: Option<usize>) -> Result<JobShare> {
    let from_env = |name: &str| -> Result<Option<usize>> {
        match std::env::var(name) {
            Ok(v) => v.trim().parse().map(Some).with_context(|| format!("{name}={v:?} is not a job index")),
            Err(_) => Ok(None),
        }
    };
    let index = match index {
        Some(i) => i,
        None => match (from_env("SLURM_ARRAY_TASK_ID")?, from_env("JOB_COMPLETION_INDEX")?) {
            (Some(id), _) => {
                let min = from_env("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                id.checked_sub(min)
                    .with_context(|| format!("SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"))?
            }
            (None, Some(i)) => i,
            (None, None) => anyhow::bail!(
                "which job is this? pass --job-index I, or run under a Slurm array (SLURM_ARRAY_TASK_ID) or a \
                 Kubernetes Indexed Job (JOB_COMPLETION_INDEX)"
            ),
        },
    };
    anyhow::ensure!(jobs > 0, "--jobs 0: give the number of jobs the sweep is split into");
    anyhow::ensure!(index < jobs, "job index {index} with --jobs {jobs}: the index must be below {jobs}");
    Ok(JobShare { jobs, index })
}

/// Where job `index` of `jobs` writes inside a sweep's `--out` directory.
pub fn job_dir(out: &Path, job: JobShare) -> PathBuf {
    if job.jobs == 1 { out.to_path_buf() } else { out.join(format!("job-{:03}-of-{:03}", job.index, job.jobs)) }
}

fn print_results(config: &ExperimentConfig, results: &[MemberResult], dir: &Path) {
    let threshold = flotilla_envs::spec(&config.env.id).ok().and_then(|s| s.reward_threshold);
    let total = config.run.total_env_steps;
    let mut finished = Vec::new();
    for r in results {
        let last = r.report.evals.last().map(|e| e.result.mean());
        let hp: Vec<String> = r.hyperparameters.iter().map(|(k, v)| format!("{k} = {v:.4e}")).collect();
        let first = threshold.map(|t| r.report.course(t)).and_then(|c| {
            let held = if c.held()? { "held" } else { "not held" };
            Some(format!("{} ({held})", c.first?))
        });
        println!(
            "member {:>3} seed {:>5}: {} {}{}{}",
            r.index,
            r.seed,
            if r.report.env_steps >= total { "final eval" } else { "last eval" },
            last.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into()),
            first.map(|s| format!(" | first ≥ threshold at {s}")).unwrap_or_default(),
            if hp.is_empty() { String::new() } else { format!(" | {}", hp.join(", ")) }
        );
        if r.report.env_steps >= total {
            finished.extend(last);
        }
    }
    if finished.len() < results.len() {
        println!(
            "stopped: {} of {} members finished; continue with: flotilla train --resume {}",
            finished.len(),
            results.len(),
            dir.display()
        );
        return;
    }
    let solved = threshold.map(|t| finished.iter().filter(|&&v| v >= t).count());
    println!(
        "population of {}: final returns mean {:.1}{}; per-member run directories in {}/members; summary with \
         confidence intervals: flotilla report {}",
        finished.len(),
        finished.iter().sum::<f64>() / finished.len().max(1) as f64,
        solved.map(|s| format!(", {s}/{} at or above the env's threshold", finished.len())).unwrap_or_default(),
        dir.display(),
        dir.display()
    );
}
