//! Populations: many seeds (and hyperparameter settings) of one config trained as one run.
//!
//! ```text
//! [population] size = N            members k = 0..N with seeds seed + k
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
    /// `[run] seed` of the base config: member k has seed `base_seed + k`.
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
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::RunDir(format!("reading {}: {e}", path.display())))?;
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
