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
pub fn act_command(run_dir: &Path, obs_file: &Path) -> Result<()> {
    let model = model_of(run_dir)?;
    let (_, config) = RunDir::open(run_dir)?;
    let (observation_space, action_space) = config.env.spaces()?;
    let obs = read_observations(obs_file, &observation_space)?;
    tch::set_num_threads(config.run.torch_threads.max(1) as i32);
    let mut agent = config.build_agent(&observation_space, &action_space, tch::Device::Cpu)?;
    agent.load_weights(&model)?;
    let mut out = ActOutput::default();
    agent.act(obs.as_ref(), ActMode::Deterministic, &mut out)?;
    let actions = match action_space {
        Space::Discrete { .. } => serde_json::to_string(&out.actions.iter().map(|a| *a as i64).collect::<Vec<_>>()),
        Space::Box { .. } => {
            let d = agent.act_dim();
            serde_json::to_string(&out.actions.chunks_exact(d).collect::<Vec<_>>())
        }
    }?;
    println!("{actions}");
    Ok(())
}

/// The rows of a JSON array of observation rows, checked against the observation space (row length; frames:
/// integers 0–255), in the space's dtype.
fn read_observations(path: &Path, space: &Space) -> Result<ObsBuf> {
    let what = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading observations from {what}"))?;
    let value: Value = serde_json::from_str(&text).with_context(|| format!("{what}: not JSON"))?;
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
                ObsBuf::F32(f) => f.push(x as f32),
            }
        }
    }
    Ok(obs)
}
