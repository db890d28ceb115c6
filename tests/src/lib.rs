//! Shared helpers for Flotilla's integration tests and benchmarks.
#![deny(missing_docs)]
pub mod cnn_bench;
pub mod hostile;
pub mod netns;
pub mod procfs;

use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::train::{TrainReport, train};

/// An example config (`examples/configs/NAME`) with `--set`-style overrides applied.
pub fn example_config(name: &str, overrides: &[&str]) -> ExperimentConfig {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs").join(name);
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ExperimentConfig::load(&path, &overrides).unwrap_or_else(|e| panic!("{name} loads: {e}"))
}

/// The quick-start config (`examples/configs/cartpole_ppo.toml`) with overrides applied.
pub fn cartpole_ppo_config(overrides: &[&str]) -> ExperimentConfig {
    example_config("cartpole_ppo.toml", overrides)
}

/// One seed's learning result.
#[derive(Debug, Clone)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// Mean deterministic evaluation return of the final policy.
    pub final_return: f64,
    /// Env steps of the first evaluation at or above the threshold.
    pub first_reaching: Option<u64>,
    /// The whole report.
    pub report: TrainReport,
}

/// Train example config `name` with `overrides` for each seed (in parallel threads) and report each seed's
/// final evaluation and the first evaluation reaching `threshold`.
pub fn train_seeds(name: &str, overrides: &[&str], seeds: &[u64], threshold: f64) -> Vec<SeedResult> {
    std::thread::scope(|s| {
        let handles: Vec<_> = seeds
            .iter()
            .map(|&seed| {
                s.spawn(move || {
                    let seed_override = format!("run.seed={seed}");
                    let mut all = vec![seed_override.as_str()];
                    all.extend_from_slice(overrides);
                    let config = example_config(name, &all);
                    let (_, report) = train(&config, &mut |_| Ok(())).expect("training runs");
                    let first_reaching = report.first_reaching(threshold).map(|e| e.env_steps);
                    SeedResult { seed, final_return: report.final_eval().mean(), first_reaching, report }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("seed thread")).collect()
    })
}

/// Assert that at least `needed` seeds end with a final evaluation ≥ `threshold`, printing every seed.
pub fn assert_solved(label: &str, results: &[SeedResult], threshold: f64, needed: usize) {
    for r in results {
        eprintln!(
            "{label} seed {}: final eval {:.1}, first ≥ {threshold} at {:?} env steps, {:.1} s training",
            r.seed, r.final_return, r.first_reaching, r.report.train_secs
        );
    }
    let solved = results.iter().filter(|r| r.final_return >= threshold).count();
    let finals: Vec<f64> = results.iter().map(|r| r.final_return).collect();
    assert!(solved >= needed, "{label}: {solved} of {} seeds end ≥ {threshold}: {finals:?}", results.len());
}
