//! `[population]`, `[population.sweep]` and `[population.pbt]`: the settings of a population and the reading of
//! its swept values. Plain data, below the experiment config that holds it.
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// `[population]`: train `size` members of this config as one run (seeds `seed`, `seed + 1`, …), optionally
/// with per-member hyperparameters (`[population.sweep]`) and population-based training (`[population.pbt]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PopulationConfig {
    /// Members (`flotilla train CONFIG --population N` sets it).
    pub size: usize,
    /// Members trained at the same time, each on a thread of its own (0: one per CPU core). Results do not
    /// depend on it.
    #[serde(default)]
    pub threads: usize,
    /// Train each thread's members in lockstep with one batched update for all of them where the algorithm
    /// has one (PPO: `flotilla_algorithms::ppo::update_members`; a member then matches its run alone to float
    /// rounding, ~1e-8 relative per update); `false`: each member trains as its own run, bit for bit.
    #[serde(default = "default_batched")]
    pub batched: bool,
    /// With `batched`, whether the members act in one batched pass over their joint env batch where the
    /// algorithm has one (PPO, A2C: plain MLPs of one layout; `flotilla_algorithms::AlgorithmKind::act_members`)
    /// instead of each member's own forward pass. Unset: on where the members live on an accelerator (there `N`
    /// small passes are launch-bound; on the CPU each member's fused host pass is as fast). A member's actions
    /// are its own either way, to float rounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched_acting: Option<bool>,
    /// With `batched`, threads that step each worker's joint env batch and let its members observe their
    /// shares of each step (0: the CPU cores left to each of `threads` where its joint batch has at least
    /// 1,024 envs, else one). Results do not depend on it.
    #[serde(default)]
    pub step_threads: usize,
    /// Per-member hyperparameters; none: a seed study.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepConfig>,
    /// Population-based training over the swept keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbt: Option<PbtConfig>,
}

/// `[population.sweep]`: which hyperparameters differ between members, and how.
///
/// ```toml
/// [population.sweep]
/// mode = "grid"                  # every combination of the listed values; size must be a multiple of
///                                # their count (member k takes combination k mod count)
/// paired_seeds = true            # grid only: every combination on the same seeds (below)
/// [population.sweep.values]
/// "algorithm.learning_rate" = [3e-4, 1e-3]
/// "algorithm.gamma" = [0.98, 0.99]
/// # mode = "random": each member draws each key: a list is a choice, or
/// # { uniform = [a, b] } / { log_uniform = [a, b] }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Grid or random draws.
    pub mode: SweepMode,
    /// Swept keys (dotted config paths, quoted) and their values or distributions.
    pub values: toml::Table,
    /// Grid only: train every combination on the same seeds — member k has seed `seed + k / combinations`
    /// instead of `seed + k` — so values are compared on common seeds (a seed study per combination). Off:
    /// every member has a seed of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paired_seeds: bool,
}

/// How a sweep assigns values to members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepMode {
    /// Every combination of the listed values, cycled over the members.
    Grid,
    /// Independent draws per member, from a generator seeded by `[run] seed`.
    Random,
}

/// `[population.pbt]`: population-based training (Jaderberg et al. 2017).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PbtConfig {
    /// Env steps (per member) between exploit/explore steps.
    pub interval_steps: u64,
    /// Share of the members replaced at each step (the bottom quantile by recent training return), each by a
    /// random member of the top quantile.
    #[serde(default = "default_quantile")]
    pub quantile: f64,
    /// Factors a copied hyperparameter is multiplied by, one drawn per key (then kept inside the sweep's range).
    #[serde(default = "default_perturb")]
    pub perturb: Vec<f64>,
}

fn default_batched() -> bool {
    true
}

fn default_quantile() -> f64 {
    0.25
}

fn default_perturb() -> Vec<f64> {
    vec![0.8, 1.2]
}

/// Hyperparameters that may differ between members: scalars that change no tensor shape and no update
/// schedule (a batched population keeps them as values on its member axis). Keys under `[algorithm]`.
pub const SWEEPABLE: &[&str] = &[
    "learning_rate",
    "gamma",
    "gae_lambda",
    "clip_range",
    "clip_range_vf",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "adam_eps",
    "optimizer_eps",
    "rmsprop_alpha",
    "log_std_init",
    "tau",
    "exploration_initial_eps",
    "exploration_final_eps",
    "exploration_fraction",
    "target_update_interval",
    "noise_std",
    "target_policy_noise",
    "target_noise_clip",
    "per_alpha",
    "per_beta_final",
];

/// One swept key's values.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Dist {
    Values(Vec<f64>),
    Uniform(f64, f64),
    LogUniform(f64, f64),
}

impl Dist {
    /// The smallest and largest value it can give.
    pub(super) fn range(&self) -> (f64, f64) {
        match self {
            Dist::Values(v) => {
                (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            }
            Dist::Uniform(a, b) | Dist::LogUniform(a, b) => (*a, *b),
        }
    }

    pub(super) fn draw(&self, rng: &mut impl rand::Rng) -> f64 {
        match self {
            Dist::Values(v) => v[rng.random_range(0..v.len())],
            Dist::Uniform(a, b) => rng.random_range(*a..=*b),
            Dist::LogUniform(a, b) => rng.random_range(a.ln()..=b.ln()).exp(),
        }
    }
}

pub(super) fn sweep_error(key: &str, detail: impl std::fmt::Display) -> Error {
    Error::Config(format!("[population.sweep] {key:?}: {detail}"))
}

impl SweepConfig {
    /// The swept keys in order, with their values; nested tables (`[population.sweep.values.algorithm]`) read as
    /// dotted keys.
    pub(super) fn dims(&self) -> Result<Vec<(String, Dist)>> {
        let mut flat = Vec::new();
        flatten("", &self.values, &mut flat);
        if flat.is_empty() {
            return Err(Error::Config("[population.sweep] values: no keys to sweep".into()));
        }
        let mut dims = Vec::new();
        for (key, value) in flat {
            check_sweepable(&key)?;
            let number = |v: &toml::Value| match v {
                toml::Value::Float(f) => Some(*f),
                toml::Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            let dist = match &value {
                toml::Value::Array(values) => {
                    let values: Option<Vec<f64>> = values.iter().map(number).collect();
                    match values {
                        Some(v) if !v.is_empty() && v.iter().all(|x| x.is_finite()) => Dist::Values(v),
                        _ => return Err(sweep_error(&key, "give a non-empty list of finite numbers")),
                    }
                }
                toml::Value::Table(t) if t.len() == 1 => {
                    let (name, bounds) = t.iter().next().expect("one entry");
                    let pair: Option<Vec<f64>> = bounds.as_array().map(|a| a.iter().filter_map(number).collect());
                    let (a, b) = match pair.as_deref() {
                        Some([a, b]) if a.is_finite() && b.is_finite() && a < b => (*a, *b),
                        _ => return Err(sweep_error(&key, format!("{name} = [low, high] with low < high, finite"))),
                    };
                    match name.as_str() {
                        "uniform" => Dist::Uniform(a, b),
                        "log_uniform" if a > 0.0 => Dist::LogUniform(a, b),
                        "log_uniform" => return Err(sweep_error(&key, "log_uniform needs 0 < low < high")),
                        other => {
                            return Err(sweep_error(
                                &key,
                                format!("unknown distribution {other:?}: use uniform or log_uniform"),
                            ));
                        }
                    }
                }
                other => {
                    return Err(sweep_error(
                        &key,
                        format!(
                            "{other}: give a list of values or {{ uniform = [a, b] }} / {{ log_uniform = [a, b] }}"
                        ),
                    ));
                }
            };
            if self.mode == SweepMode::Grid && !matches!(dist, Dist::Values(_)) {
                return Err(sweep_error(&key, "a grid takes a list of values; distributions need mode = \"random\""));
            }
            dims.push((key, dist));
        }
        Ok(dims)
    }
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            // A distribution is a one-entry table whose key names it; anything else nested is a path.
            toml::Value::Table(t) if !(t.len() == 1 && t.keys().all(|n| n.contains("uniform"))) => {
                flatten(&key, t, out)
            }
            _ => out.push((key, v.clone())),
        }
    }
}

/// Refuse keys that cannot differ between members of one population.
pub(super) fn check_sweepable(key: &str) -> Result<()> {
    const SHAPES: &[&str] = &[
        "n_steps",
        "batch_size",
        "n_epochs",
        "hidden_sizes",
        "buffer_size",
        "train_freq",
        "gradient_steps",
        "learning_starts",
        "policy_delay",
        "n_critics",
        "n_step",
    ];
    let field = key.strip_prefix("algorithm.");
    match field {
        Some(f) if SWEEPABLE.contains(&f) => Ok(()),
        Some(f) if SHAPES.contains(&f) => Err(sweep_error(
            key,
            "cannot vary inside one population: it sets a tensor shape or the update schedule, which all \
             members share — run one population per value (or split them across `flotilla sweep` jobs)",
        )),
        _ if key.starts_with("env.") || key.starts_with("run.") => Err(sweep_error(
            key,
            "cannot vary inside one population: members share the env vector's shape and the run's budget \
             (seeds are already seed, seed + 1, …)",
        )),
        _ => Err(sweep_error(
            key,
            format!("not a per-member hyperparameter; these are: algorithm.{}", SWEEPABLE.join(", algorithm.")),
        )),
    }
}
