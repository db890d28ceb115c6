//! Starting an agent from other runs: `[init]` (fine-tune from a run's weights, reinitialise or freeze layers)
//! and a distillation's teachers, each read from its run directory.
use std::path::Path;

use flotilla_algorithms::Algorithm;

use crate::config::ExperimentConfig;
use crate::run_dir::RunDir;
use crate::{Error, Result};

/// Apply `[init]` to a freshly built `agent`: with `fresh`, copy the `from` run's policy weights (all but
/// the `reinit` layers); always freeze the `freeze` layers (a resumed run restores its weights from its
/// checkpoint, but its frozen layers must stay frozen).
/// A distillation's teachers are loaded from their run directories and handed over, fresh or resumed.
pub fn init_agent(config: &ExperimentConfig, agent: &mut dyn Algorithm, fresh: bool) -> Result<()> {
    let teachers = config.algorithm.teachers();
    if !teachers.is_empty() {
        let device = agent.policy_params().flat().device();
        let loaded = teachers.iter().map(|dir| load_teacher(dir, device)).collect::<Result<Vec<_>>>()?;
        let name = agent.name();
        let student = agent.student().ok_or_else(|| {
            Error::Config(format!("[algorithm] with teachers {teachers:?}: {name} learns from no teachers"))
        })?;
        student
            .set_teachers(loaded)
            .map_err(|e| Error::Config(format!("[algorithm] with teachers {teachers:?}: {e}")))?;
    }
    let init = &config.init;
    let source = match (&init.from, fresh) {
        (Some(dir), true) => {
            let path = Path::new(dir).join("model.safetensors");
            if !path.is_file() {
                return Err(Error::Config(format!(
                    "[init] from = {dir:?}: no {} (a run directory written by `flotilla train` holds one)",
                    path.display()
                )));
            }
            flotilla_algorithms::export::read_safetensors(&path)
                .map_err(|e| Error::Config(format!("[init] from = {dir:?}: {e}")))?
                .0
        }
        _ => Vec::new(),
    };
    if source.is_empty() && init.freeze.is_empty() {
        return Ok(());
    }
    let what = format!("[init] from = {:?}", init.from.as_deref().unwrap_or(""));
    let (copied, frozen) =
        agent.transfer(&what, &source, &init.reinit, &init.freeze).map_err(|e| Error::Config(e.to_string()))?;
    if fresh && let Some(dir) = &init.from {
        tracing::info!(
            "started from {dir}: {copied} parameter tensors copied, {:?} reinitialised; {frozen} of {} \
             parameters frozen",
            init.reinit,
            agent.policy_params().numel()
        );
    } else if frozen > 0 {
        tracing::info!("{frozen} of {} parameters frozen ({:?})", agent.policy_params().numel(), init.freeze);
    }
    Ok(())
}

/// A trained agent from the run directory `dir` (its `config.toml` and `model.safetensors`), on `device`.
fn load_teacher(dir: &str, device: tch::Device) -> Result<Box<dyn Algorithm>> {
    let what = |e: &dyn std::fmt::Display| Error::Config(format!("[algorithm] teachers: {dir:?}: {e}"));
    let (run, config) = RunDir::open(Path::new(dir)).map_err(|e| what(&e))?;
    let model = run.model_path();
    if !model.is_file() {
        return Err(what(&format!("no {} (the run has not saved a model yet)", model.display())));
    }
    let (obs, act) = config.env.spaces().map_err(|e| what(&e))?;
    let mut teacher = config.build_agent(&obs, &act, device).map_err(|e| what(&e))?;
    teacher.load_weights(&model).map_err(|e| what(&e))?;
    tracing::info!(
        "teacher {dir}: {} on {}, {} parameters",
        config.algorithm_name(),
        config.env.id,
        teacher.policy_params().numel()
    );
    Ok(teacher)
}
