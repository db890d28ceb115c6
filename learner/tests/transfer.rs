//! `[init]`: starting a run from another run's weights, reinitialising and freezing layers.
//!
//! * a fine-tune starts with the source's weights, except the reinitialised layers;
//! * a source with other shapes (Acrobot's 6 observations and 3 actions from a CartPole run) is refused naming
//!   the layer and both shapes, and works once those layers are reinitialised (the hidden layer carries over);
//! * frozen layers do not move in training while the others do, and stay frozen in a resumed run;
//! * an unknown layer lists the network's layers; `reinit` without `from`, and a `from` without a model, are
//!   config errors naming the key.
use std::path::{Path, PathBuf};

use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::train::Trainer;
use tch::Tensor;

/// A source run: CartPole PPO trained for 2,048 env steps, its weights in `DIR/model.safetensors`.
fn source_run(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-transfer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = config("CartPole-v1", &["run.total_env_steps=2048"]);
    let (agent, _) = flotilla_learner::train::train(&config, &mut |_| Ok(())).unwrap();
    agent.save_weights(&dir.join("model.safetensors")).unwrap();
    dir
}

/// A small PPO config on `env` with `sets` applied.
fn config(env: &str, sets: &[&str]) -> ExperimentConfig {
    let text = format!(
        "[run]\nseed = 3\ntotal_env_steps = 4096\n[env]\nid = \"{env}\"\nnum_envs = 4\n[algorithm]\nkind = \"ppo\"\n\
         n_steps = 64\nbatch_size = 64\nn_epochs = 2\n[eval]\nepisodes = 2\ninterval_steps = 100000\n"
    );
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    ExperimentConfig::parse(&text, &sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"))
}

fn from(dir: &Path) -> String {
    format!("init.from={:?}", dir.display().to_string())
}

/// Parameter `name`'s values in the source run's model.
fn source_tensor(dir: &Path, name: &str) -> Tensor {
    let named = Tensor::read_safetensors(dir.join("model.safetensors")).unwrap();
    named.into_iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1
}

/// The agent's parameter `name`.
fn param(t: &Trainer, name: &str) -> Tensor {
    let p = t.agent().policy_params();
    let i = p.names().position(|n| n == name).unwrap_or_else(|| panic!("no {name}"));
    p.view(i).detach().copy()
}

#[test]
fn a_fine_tune_starts_from_the_source_except_reinitialised_layers() {
    let dir = source_run("start");
    let fresh = Trainer::new(&config("CartPole-v1", &[])).unwrap();
    let tuned = Trainer::new(&config("CartPole-v1", &[&from(&dir), "init.reinit=[\"pi_vf.2\"]"])).unwrap();
    for name in ["pi_vf.0.weight", "pi_vf.0.bias", "pi_vf.1.weight", "pi_vf.1.bias"] {
        assert!(param(&tuned, name).equal(&source_tensor(&dir, name)), "{name} copied");
        assert!(!param(&fresh, name).equal(&source_tensor(&dir, name)), "{name}: the source trained");
    }
    // The reinitialised output layer is what a fresh run of the same seed starts with.
    assert!(param(&tuned, "pi_vf.2.weight").equal(&param(&fresh, "pi_vf.2.weight")));
}

#[test]
fn other_shapes_are_refused_naming_the_layer_until_reinitialised() {
    let dir = source_run("shapes");
    // Acrobot: 6 observations, 3 actions.
    let e = Trainer::new(&config("Acrobot-v1", &[&from(&dir)])).err().unwrap().to_string();
    assert!(e.contains("pi_vf.0.weight") && e.contains("[2, 4, 64]") && e.contains("[2, 6, 64]"), "{e}");
    assert!(e.contains("reinit"), "the message says how to fix it: {e}");
    let t = Trainer::new(&config("Acrobot-v1", &[&from(&dir), "init.reinit=[\"pi_vf.0\", \"pi_vf.2\"]"])).unwrap();
    assert!(param(&t, "pi_vf.1.weight").equal(&source_tensor(&dir, "pi_vf.1.weight")), "the hidden layer carries over");
}

#[test]
fn frozen_layers_stay_put_in_training_and_after_a_resume() {
    let dir = source_run("freeze");
    let config = config("CartPole-v1", &[&from(&dir), "init.freeze=[\"pi_vf.0\"]"]);
    let mut t = Trainer::new(&config).unwrap();
    t.run(2048, &mut |_| Ok(()), &mut |_| Ok(())).unwrap();
    assert!(param(&t, "pi_vf.0.weight").equal(&source_tensor(&dir, "pi_vf.0.weight")), "frozen");
    assert!(!param(&t, "pi_vf.1.weight").equal(&source_tensor(&dir, "pi_vf.1.weight")), "trained");
    let checkpoint = dir.join("checkpoint.safetensors");
    t.save_checkpoint(&checkpoint).unwrap();
    // The resumed run takes its weights from the checkpoint (the source could be gone) and keeps layer 0 frozen.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let mut resumed = Trainer::resume(&config, &checkpoint).unwrap();
    let before = param(&resumed, "pi_vf.1.weight");
    resumed.run(u64::MAX, &mut |_| Ok(()), &mut |_| Ok(())).unwrap();
    assert!(param(&resumed, "pi_vf.0.weight").equal(&param(&t, "pi_vf.0.weight")), "still frozen");
    assert!(!param(&resumed, "pi_vf.1.weight").equal(&before), "the rest still trains");
}

#[test]
fn unknown_layers_and_missing_sources_are_config_errors() {
    let dir = source_run("errors");
    let e = Trainer::new(&config("CartPole-v1", &[&from(&dir), "init.freeze=[\"torso\"]"])).err().unwrap().to_string();
    assert!(e.contains("no layer \"torso\"") && e.contains("\"pi_vf.0\", \"pi_vf.1\", \"pi_vf.2\""), "{e}");
    let e = ExperimentConfig::parse(
        "[env]\nid = \"CartPole-v1\"\n[algorithm]\nkind = \"ppo\"\n[init]\nreinit = [\"pi_vf.2\"]\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("[init] reinit") && e.contains("without [init] from"), "{e}");
    let e = Trainer::new(&config("CartPole-v1", &["init.from=\"/nonexistent/run\""])).err().unwrap().to_string();
    assert!(e.contains("[init] from = \"/nonexistent/run\"") && e.contains("model.safetensors"), "{e}");
}
