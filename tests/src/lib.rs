//! Shared helpers for Flotilla's integration tests and benchmarks.
use flotilla_learner::config::ExperimentConfig;

/// The quick-start config (`examples/configs/cartpole_ppo.toml`) with overrides applied.
pub fn cartpole_ppo_config(overrides: &[&str]) -> ExperimentConfig {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs/cartpole_ppo.toml");
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ExperimentConfig::load(&path, &overrides).expect("the quick-start config loads")
}
