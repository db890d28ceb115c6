//! `flotilla export` and `flotilla act`: a trained policy in PyTorch's own layout, and the actions to check it
//! against.
//!
//! ```text
//! flotilla export RUN_DIR --out policy.safetensors   # torch.nn.Sequential state_dict + the layer list
//! flotilla act RUN_DIR --obs obs.json                # [[obs row], …] ─► deterministic actions, one per row
//! ```
//! The conversion itself is `flotilla_algorithms::export`; the README's "Taking a policy to PyTorch" shows the
//! Python side, and `tests/python/export_check.py` runs it against `act`.
use std::path::Path;

use anyhow::{Context, Result};
use flotilla_algorithms::export::{Architecture, read_safetensors, to_pytorch};
use flotilla_algorithms::{ActMode, ActOutput};
use flotilla_core::{DType, ObsBuf, Space};
use flotilla_learner::run_dir::{MODEL_FILE, RunDir};
use serde_json::Value;

/// The trained weights of `run_dir`, or an error saying the run has none.
fn model_of(run_dir: &Path) -> Result<std::path::PathBuf> {
    anyhow::ensure!(run_dir.is_dir(), "run directory {} does not exist", run_dir.display());
    let model = run_dir.join(MODEL_FILE);
    anyhow::ensure!(
        model.is_file(),
        "{} has no trained policy ({} is missing: a run writes it when it finishes)",
        run_dir.display(),
        model.display()
    );
    Ok(model)
}

/// Write the acting policy of `run_dir` to `out` as a PyTorch `nn.Sequential` state dict with the metadata that
/// rebuilds it. The architecture comes from `model.safetensors`' own metadata, or, for weights saved before it
/// had any, from the run's `config.toml`.
pub fn export_command(run_dir: &Path, out: &Path) -> Result<()> {
    let model = model_of(run_dir)?;
    let (tensors, metadata) = read_safetensors(&model)?;
    let arch = match Architecture::from_metadata(&model.display().to_string(), &metadata)? {
        Some(arch) => arch,
        None => {
            let (_, config) = RunDir::open(run_dir)?;
            let (observation_space, action_space) = config.env.spaces()?;
            config.algorithm.architecture(&observation_space, &action_space)?
        }
    };
    let policy = to_pytorch(&arch, &tensors).with_context(|| format!("exporting {}", model.display()))?;
    policy.save(out).with_context(|| format!("writing {}", out.display()))?;
    println!("exported the {} policy of {} to {}", arch.algorithm, run_dir.display(), out.display());
    println!("layers: {}", policy.metadata["layers"]);
    println!("input: {}", policy.metadata["input"]);
    println!("output: {} — action: {}", policy.metadata["output"], policy.metadata["action"]);
    Ok(())
}

/// Print the deterministic actions `flotilla eval` would take on the observation rows of `obs_file` (a JSON
/// array of rows, each the observation flattened): the policy's own output, one per row — a discrete action's
/// index (the env gets `start + index`), or a box action's values (a Gaussian's mean, which eval clips to the
/// bounds before stepping; DDPG/TD3's action already in the bounds).
///
/// A recurrent policy acts on a sequence of batches (`obs_file` holds `[[row, …], …]`, one batch per step; a
/// plain array of rows is one step) from each row's state in `state_file` (zeros without one), and prints
/// `{"actions": [step's actions, …], "state": [[row's state after the last step], …]}`.
pub fn act_command(run_dir: &Path, obs_file: &Path, state_file: Option<&Path>) -> Result<()> {
    let model = model_of(run_dir)?;
    let (_, config) = RunDir::open(run_dir)?;
    let (observation_space, action_space) = config.env.spaces()?;
    tch::set_num_threads(config.run.torch_threads.max(1) as i32);
    let mut agent = config.build_agent(&observation_space, &action_space, tch::Device::Cpu)?;
    agent.load_weights(&model)?;
    let d = agent.act_dim();
    let json = |actions: &[f32]| match action_space {
        Space::Discrete { .. } => serde_json::to_value(actions.iter().map(|a| *a as i64).collect::<Vec<_>>()),
        Space::Box { .. } => serde_json::to_value(actions.chunks_exact(d).collect::<Vec<_>>()),
    };
    let mut out = ActOutput::default();
    let s = agent.state_dim();
    if s == 0 {
        anyhow::ensure!(state_file.is_none(), "--state: {} is not recurrent (it has no state)", run_dir.display());
        let obs = read_observations(obs_file, &observation_space)?;
        agent.act(obs.as_ref(), ActMode::Deterministic, &mut out)?;
        println!("{}", json(&out.actions)?);
        return Ok(());
    }
    let steps = read_sequence(obs_file, &observation_space)?;
    let rows = steps[0].len() / observation_space.flat_dim();
    let mut state = match state_file {
        None => vec![0.0; rows * s],
        Some(path) => {
            let what = path.display();
            let text = std::fs::read_to_string(path).with_context(|| format!("reading the state from {what}"))?;
            let value: Vec<Vec<f32>> = serde_json::from_str(&text)
                .with_context(|| format!("{what}: expected a JSON array of state rows of {s} numbers"))?;
            anyhow::ensure!(
                value.len() == rows && value.iter().all(|r| r.len() == s),
                "{what}: expected {rows} state rows of {s} numbers (this policy's state), one per observation row"
            );
            value.concat()
        }
    };
    let mut actions = Vec::with_capacity(steps.len());
    for obs in &steps {
        agent.act_with_state(obs.as_ref(), &mut state, ActMode::Deterministic, &mut out)?;
        actions.push(json(&out.actions)?);
    }
    let state: Vec<&[f32]> = state.chunks_exact(s).collect();
    println!("{}", serde_json::json!({ "actions": actions, "state": state }));
    Ok(())
}

/// A recurrent policy's input: a JSON array of steps, each an array of observation rows (every step the same
/// number of rows), or one step's rows alone.
fn read_sequence(path: &Path, space: &Space) -> Result<Vec<ObsBuf>> {
    let what = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading observations from {what}"))?;
    let value: Value = serde_json::from_str(&text).with_context(|| format!("{what}: not JSON"))?;
    let nested = value.as_array().and_then(|a| a.first()).and_then(|r| r.as_array()).and_then(|r| r.first());
    if !nested.is_some_and(Value::is_array) {
        return Ok(vec![read_observations(path, space)?]);
    }
    let steps = value.as_array().expect("checked");
    let mut out = Vec::with_capacity(steps.len());
    for (t, step) in steps.iter().enumerate() {
        let rows = observations_of(&format!("{what}, step {t}"), step, space)?;
        if let Some(first) = out.first() {
            let first: &ObsBuf = first;
            anyhow::ensure!(rows.len() == first.len(), "{what}: step {t} has another number of rows than step 0");
        }
        out.push(rows);
    }
    Ok(out)
}

/// The rows of a JSON array of observation rows, checked against the observation space (row length; frames:
/// integers 0–255), in the space's dtype.
fn read_observations(path: &Path, space: &Space) -> Result<ObsBuf> {
    let what = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading observations from {what}"))?;
    let value: Value = serde_json::from_str(&text).with_context(|| format!("{what}: not JSON"))?;
    observations_of(&what.to_string(), &value, space)
}

/// The observation rows of `value` (a JSON array of rows), checked against `space`; `what` names them in errors.
fn observations_of(what: &str, value: &Value, space: &Space) -> Result<ObsBuf> {
    let dim = space.flat_dim();
    let example = "a JSON array of observation rows, e.g. [[0.01, -0.02, 0.03, 0.04]]";
    let rows = value.as_array().with_context(|| format!("{what}: expected {example}"))?;
    anyhow::ensure!(!rows.is_empty(), "{what}: no observation rows (expected {example})");
    let frames = matches!(space, Space::Box { dtype: DType::U8, .. });
    let mut obs = if frames { ObsBuf::U8(Vec::new()) } else { ObsBuf::F32(Vec::new()) };
    for (i, row) in rows.iter().enumerate() {
        let row = row.as_array().with_context(|| format!("{what}: row {i} is not an array (expected {example})"))?;
        anyhow::ensure!(
            row.len() == dim,
            "{what}: row {i} has {} values; the run's observation space has {dim} per observation",
            row.len()
        );
        for (j, v) in row.iter().enumerate() {
            let x = v.as_f64().with_context(|| format!("{what}: row {i}, value {j} ({v}) is not a number"))?;
            match &mut obs {
                ObsBuf::U8(b) => {
                    anyhow::ensure!(
                        x.fract() == 0.0 && (0.0..=255.0).contains(&x),
                        "{what}: row {i}, value {j} ({v}) is not a frame byte (an integer 0–255)"
                    );
                    b.push(x as u8);
                }
                ObsBuf::F32(f) => {
                    let x = x as f32;
                    anyhow::ensure!(x.is_finite(), "{what}: row {i}, value {j} ({v}) is beyond f32's range");
                    f.push(x);
                }
            }
        }
    }
    Ok(obs)
}
