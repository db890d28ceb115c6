//! Populations: many seeds (and hyperparameter settings) of one config trained as one run.
//!
//! ```text
//! [population] size = N            members k = 0..N with seeds seed + k (a grid with paired_seeds:
//!                                  every combination on seeds seed, seed + 1, …)
//! [population.sweep]               per-member hyperparameters: a grid, or random draws
//! [population.pbt]                 population-based training: the bottom quantile copies the top's state
//!
//! RUN_DIR/
//!   config.toml          the resolved base config (with [population])
//!   population.json      the members this directory holds: index, seed, directory, hyperparameters
//!   lineage.jsonl        PBT: one line per exploit (env steps, member, source, its new hyperparameters)
//!   members/000/ …       each member a whole run directory (config.toml with its seed and hyperparameters,
//!                        metrics.csv, events, checkpoint, model)
//! ```
//! Only scalars that change no tensor shape and no update schedule may differ between members (see
//! [`SWEEPABLE`]): a batched population program keeps them as per-member values on its leading axis.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub(crate) mod config;
pub mod train;
use config::{Dist, sweep_error};
pub use config::{PbtConfig, PopulationConfig, SWEEPABLE, SweepConfig, SweepMode};
pub use train::{JobShare, MemberResult, resume, train};

/// File, in a population's run directory, that lists the members it holds.
pub const POPULATION_FILE: &str = "population.json";
/// File, in a population's run directory, of PBT's exploit steps (JSON lines of [`LineageEvent`]).
pub const LINEAGE_FILE: &str = "lineage.jsonl";
/// Directory, in a population's run directory, that holds one run directory per member.
pub const MEMBERS_DIR: &str = "members";

/// What `population.json` holds: the members one run directory trained (a sweep split across jobs has one
/// such directory per job; `flotilla report` merges them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PopulationRecord {
    /// Members of the whole population (every job's).
    pub size: usize,
    /// `[run] seed` of the base config: member k has seed `base_seed + k` (paired seeds: see
    /// [`SweepConfig::paired_seeds`]).
    pub base_seed: u64,
    /// The swept keys (`"algorithm.learning_rate"`, …), empty for a seed study.
    pub sweep_keys: Vec<String>,
    /// Whether population-based training changed hyperparameters during the run (see [`LINEAGE_FILE`]).
    pub pbt: bool,
    /// Jobs the population is split into (`flotilla sweep --jobs J`), 1 when one run trains all.
    pub jobs: usize,
    /// Which of them this directory holds (0-based).
    pub job_index: usize,
    /// The members trained here.
    pub members: Vec<MemberRecord>,
}

/// One member of a population.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Index in the whole population, 0-based.
    pub index: usize,
    /// Its `[run] seed`.
    pub seed: u64,
    /// Its run directory, relative to the population's.
    pub dir: PathBuf,
    /// Its starting value of each swept key (PBT may change them later: [`LINEAGE_FILE`]).
    pub hyperparameters: BTreeMap<String, f64>,
}

/// One PBT exploit step: at `env_steps`, `member` took `source`'s weights, optimiser state and hyperparameters
/// and perturbed the latter to `hyperparameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineageEvent {
    /// When (every member's env steps are equal at a PBT step).
    pub env_steps: u64,
    /// The member that was replaced (bottom quantile).
    pub member: usize,
    /// The member it copied (top quantile).
    pub source: usize,
    /// The member's hyperparameters from here on.
    pub hyperparameters: BTreeMap<String, f64>,
}

impl PopulationRecord {
    /// Read `dir/population.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(POPULATION_FILE);
        let text =
            std::fs::read_to_string(&path).map_err(|e| Error::RunDir(format!("reading {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| Error::RunDir(format!("{}: {e}", path.display())))
    }

    /// Write `dir/population.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("plain data serialises");
        crate::run_dir::write_atomic(&dir.join(POPULATION_FILE), text.as_bytes())
    }
}

/// Read `dir/lineage.jsonl` (empty when the run had no PBT step).
pub fn read_lineage(dir: &Path) -> Result<Vec<LineageEvent>> {
    let path = dir.join(LINEAGE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::RunDir(format!("reading {}: {e}", path.display()))),
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| Error::RunDir(format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// A member before it is trained: its place, seed, hyperparameters and whole config.
#[derive(Debug, Clone)]
pub struct MemberPlan {
    /// Index in the population.
    pub index: usize,
    /// Its `[run] seed`.
    pub seed: u64,
    /// Its value of each swept key.
    pub hyperparameters: BTreeMap<String, f64>,
    /// The base config with its seed and hyperparameters, without `[population]`.
    pub config: crate::config::ExperimentConfig,
}

impl PopulationConfig {
    /// Range checks of the population's own settings (each member's config is checked as it is built).
    pub fn check(&self) -> Result<()> {
        if self.size == 0 {
            return Err(Error::Config("[population] size = 0: a population needs at least one member".into()));
        }
        if let Some(sweep) = &self.sweep {
            let dims = sweep.dims()?;
            if sweep.paired_seeds && sweep.mode != SweepMode::Grid {
                return Err(Error::Config(
                    "[population.sweep] paired_seeds = true: needs mode = \"grid\" (random draws share no \
                     combination to pair seeds on)"
                        .into(),
                ));
            }
            if sweep.mode == SweepMode::Grid {
                let points = grid_points(&dims);
                if !self.size.is_multiple_of(points) {
                    return Err(Error::Config(format!(
                        "[population] size = {}: the grid has {points} combinations; give a multiple of {points} \
                         (seeds per combination × {points})",
                        self.size
                    )));
                }
            }
        }
        if let Some(pbt) = &self.pbt {
            if self.sweep.is_none() {
                return Err(Error::Config(
                    "[population.pbt]: PBT perturbs the swept hyperparameters; give [population.sweep] too".into(),
                ));
            }
            if self.size < 2 {
                return Err(Error::Config("[population.pbt]: needs at least two members".into()));
            }
            if pbt.interval_steps == 0 {
                return Err(Error::Config("[population.pbt] interval_steps = 0: must be at least 1".into()));
            }
            if !(pbt.quantile > 0.0 && pbt.quantile <= 0.5) {
                return Err(Error::Config(format!(
                    "[population.pbt] quantile = {}: must be in (0, 0.5] (the bottom and top quantiles must not overlap)",
                    pbt.quantile
                )));
            }
            if pbt.perturb.is_empty() || pbt.perturb.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
                return Err(Error::Config(format!(
                    "[population.pbt] perturb = {:?}: give one or more positive factors",
                    pbt.perturb
                )));
            }
        }
        Ok(())
    }

    /// Every member's plan: seed `base.run.seed + k` (with paired seeds `base.run.seed + k / combinations`), its
    /// swept values, its whole config (checked like any config). Fails, naming the member and key, before
    /// anything is written.
    pub fn members(&self, base: &crate::config::ExperimentConfig) -> Result<Vec<MemberPlan>> {
        self.check()?;
        let dims = match &self.sweep {
            Some(s) => s.dims()?,
            None => Vec::new(),
        };
        let mut rng = rand_pcg::Pcg64::new(0xcafe_f00d_d15e_a5e5 ^ u128::from(base.run.seed), 0xa02b_dbf7_bb3c_0a7a);
        let points = grid_points(&dims);
        let mut plain = base.clone();
        plain.population = None;
        let text = plain.to_toml();
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        (0..self.size)
            .map(|k| {
                let mut hyperparameters = BTreeMap::new();
                let mut point = k % points;
                for (key, dist) in &dims {
                    let value = match (self.sweep.as_ref().map(|s| s.mode), dist) {
                        (Some(SweepMode::Grid), Dist::Values(v)) => {
                            let value = v[point % v.len()];
                            point /= v.len();
                            value
                        }
                        _ => dist.draw(&mut rng),
                    };
                    hyperparameters.insert(key.clone(), value);
                }
                let paired = self.sweep.as_ref().is_some_and(|s| s.paired_seeds);
                let seed = base.run.seed.wrapping_add(if paired { k / points } else { k } as u64);
                let config = member_config(&text, &table, seed, &hyperparameters)
                    .map_err(|e| Error::Config(format!("population member {k}: {e}")))?;
                let hyperparameters = read_back(&config, &hyperparameters)?;
                Ok(MemberPlan { index: k, seed, hyperparameters, config })
            })
            .collect()
    }

    /// The smallest and largest value each swept key may take (PBT keeps perturbed values inside).
    pub fn ranges(&self) -> Result<BTreeMap<String, (f64, f64)>> {
        let dims = match &self.sweep {
            Some(s) => s.dims()?,
            None => Vec::new(),
        };
        Ok(dims.into_iter().map(|(k, d)| (k, d.range())).collect())
    }
}

fn grid_points(dims: &[(String, Dist)]) -> usize {
    dims.iter().map(|(_, d)| if let Dist::Values(v) = d { v.len() } else { 1 }).product::<usize>().max(1)
}

/// The base config (as TOML text and table) with `seed` and the swept values set. Integer fields take the
/// value rounded; a key the config does not have is an error.
pub(crate) fn member_config(
    text: &str,
    table: &toml::Table,
    seed: u64,
    values: &BTreeMap<String, f64>,
) -> Result<crate::config::ExperimentConfig> {
    let mut overrides = vec![format!("run.seed={seed}")];
    for (key, value) in values {
        let mut cursor = Some(table);
        let mut found = None;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let v = cursor.and_then(|t| t.get(*part));
            if i + 1 == parts.len() {
                found = v;
            } else {
                cursor = v.and_then(|v| v.as_table());
            }
        }
        let rendered = match found {
            Some(toml::Value::Integer(_)) => {
                let rounded = value.round();
                if rounded < 1.0 {
                    return Err(sweep_error(key, format!("{value} rounds to {rounded}: this integer must be ≥ 1")));
                }
                format!("{}", rounded as i64)
            }
            Some(toml::Value::Float(_)) => format!("{value:?}"),
            Some(other) => return Err(sweep_error(key, format!("the config's value {other} is not a number"))),
            None => {
                return Err(sweep_error(
                    key,
                    "this algorithm has no such setting (or it is unset: set it in [algorithm] to sweep it)",
                ));
            }
        };
        overrides.push(format!("{key}={rendered}"));
    }
    crate::config::ExperimentConfig::parse(text, &overrides)
}

/// The swept values as the member's config holds them (integers rounded).
fn read_back(
    config: &crate::config::ExperimentConfig,
    values: &BTreeMap<String, f64>,
) -> Result<BTreeMap<String, f64>> {
    let table: toml::Table = config.to_toml().parse().map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
    values
        .iter()
        .map(|(key, value)| {
            let mut v = table.get(key.split('.').next().unwrap_or(key));
            for part in key.split('.').skip(1) {
                v = v.and_then(|v| v.get(part));
            }
            let read = match v {
                Some(toml::Value::Integer(i)) => *i as f64,
                Some(toml::Value::Float(f)) => *f,
                _ => *value,
            };
            Ok((key.clone(), read))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ExperimentConfig;

    const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/cartpole_ppo.toml");

    fn base(population: &str) -> ExperimentConfig {
        let text = std::fs::read_to_string(EXAMPLE).unwrap() + population;
        ExperimentConfig::parse(&text, &["run.seed=7".to_string()]).unwrap()
    }

    const GRID: &str = "\n[population]\nsize = 6\n[population.sweep]\nmode = \"grid\"\n{paired}\n\
                        [population.sweep.values]\n\"algorithm.learning_rate\" = [1e-3, 2e-3]\n";

    fn plans(paired: &str) -> Result<Vec<(u64, f64)>> {
        let config = base(&GRID.replace("{paired}", paired));
        let members = config.population.as_ref().unwrap().members(&config)?;
        Ok(members.iter().map(|m| (m.seed, m.hyperparameters["algorithm.learning_rate"])).collect())
    }

    #[test]
    fn paired_seeds_train_every_grid_combination_on_the_same_seeds() {
        let own = plans("").unwrap();
        assert_eq!(own, [(7, 1e-3), (8, 2e-3), (9, 1e-3), (10, 2e-3), (11, 1e-3), (12, 2e-3)]);
        let paired = plans("paired_seeds = true").unwrap();
        assert_eq!(paired, [(7, 1e-3), (7, 2e-3), (8, 1e-3), (8, 2e-3), (9, 1e-3), (9, 2e-3)]);
        // The member's own config carries its seed.
        let config = base(&GRID.replace("{paired}", "paired_seeds = true"));
        let members = config.population.as_ref().unwrap().members(&config).unwrap();
        assert_eq!(members[3].config.run.seed, 8);
    }

    #[test]
    fn paired_seeds_need_a_grid() {
        let text = std::fs::read_to_string(EXAMPLE).unwrap()
            + "\n[population]\nsize = 4\n[population.sweep]\nmode = \"random\"\npaired_seeds = true\n\
               [population.sweep.values]\n\"algorithm.learning_rate\" = { log_uniform = [1e-4, 1e-2] }\n";
        let e = ExperimentConfig::parse(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("paired_seeds") && e.contains("grid"), "{e}");
    }
}
