//! A run directory: everything one training run leaves behind.
//!
//! ```text
//! RUN_DIR/
//!   config.toml         the resolved config (every default written out)
//!   metrics.csv         one row per log interval: env steps, episodic return, losses, steps/s, evaluations
//!   events.out.tfevents.*  the same rows for TensorBoard (x = env steps), and the config as text
//!   model.safetensors   final policy weights
//!   checkpoint.safetensors  the whole training state (agent, envs, counters) for `flotilla train --resume`
//! ```
//! `config.toml` and the weights are written atomically (temporary file, fsync, rename); `metrics.csv` is
//! appended and flushed row by row, so a crash loses at most the row being written; so are the event files (one
//! per training segment: a resumed run adds one).
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flotilla_observe::tensorboard::EventWriter;

use crate::config::ExperimentConfig;
use crate::{Error, Result};

/// File names inside a run directory.
pub const CONFIG_FILE: &str = "config.toml";
/// Metrics CSV file name.
pub const METRICS_FILE: &str = "metrics.csv";
/// Final weights file name.
pub const MODEL_FILE: &str = "model.safetensors";
/// Training-state checkpoint file name.
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";

/// An open run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Create `path` (and parents) for a new run and write the resolved config. Refuses a directory that
    /// already holds a run, so results are never mixed.
    pub fn create(path: &Path, config: &ExperimentConfig) -> Result<Self> {
        if path.join(CONFIG_FILE).exists() {
            return Err(Error::RunDir(format!(
                "{} already holds a run ({CONFIG_FILE} exists); choose another --out",
                path.display()
            )));
        }
        std::fs::create_dir_all(path).map_err(|e| io("creating run directory", path, e))?;
        let config_path = path.join(CONFIG_FILE);
        flotilla_algorithms::atomic_write::save_file(&config_path, |tmp| std::fs::write(tmp, config.to_toml()))
            .map_err(|e| io("writing", &config_path, e))?;
        Ok(RunDir { path: path.to_path_buf() })
    }

    /// The run directory at `path`, as another process of the run sees it (neither created nor read here).
    pub fn at(path: &Path) -> Self {
        RunDir { path: path.to_path_buf() }
    }

    /// Open an existing run directory and read its resolved config.
    pub fn open(path: &Path) -> Result<(Self, ExperimentConfig)> {
        if !path.is_dir() {
            return Err(Error::RunDir(format!("run directory {} does not exist", path.display())));
        }
        let config_path = path.join(CONFIG_FILE);
        if !config_path.is_file() {
            return Err(Error::RunDir(format!("{} is not a run directory: no {CONFIG_FILE}", path.display())));
        }
        let config = ExperimentConfig::load(&config_path, &[])?;
        Ok((RunDir { path: path.to_path_buf() }, config))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the final weights go.
    pub fn model_path(&self) -> PathBuf {
        self.path.join(MODEL_FILE)
    }

    /// Where training-state checkpoints go.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.path.join(CHECKPOINT_FILE)
    }

    /// Start the metrics: the CSV, and a TensorBoard event file with the run's config as text.
    pub fn metrics_writer(&self) -> Result<MetricsWriter> {
        let csv = CsvWriter::create(&self.path.join(METRICS_FILE))?;
        MetricsWriter::new(csv, &self.path, None)
    }

    /// Continue the metrics of a run resumed at `env_steps`: the CSV keeps its header; a new event file joins
    /// the first, starting with a session start past `env_steps` (see [`MetricsWriter`]).
    pub fn metrics_appender(&self, env_steps: u64) -> Result<MetricsWriter> {
        let csv = CsvWriter::append(&self.path.join(METRICS_FILE))?;
        MetricsWriter::new(csv, &self.path, Some(env_steps))
    }
}

impl RunDir {
    /// Continue the metrics of a learner restarted from its checkpoint at `env_steps` (0: it died before its
    /// first checkpoint and starts over): rows past `env_steps` are what the dead learner trained after the
    /// checkpoint and the new one trains again, so they are removed (the file rewritten atomically) before
    /// appending, and no env-steps value appears twice.
    pub fn metrics_rewound(&self, env_steps: u64) -> Result<(MetricsWriter, Rewound)> {
        let path = self.path.join(METRICS_FILE);
        let rewound = rewind_csv(&path, env_steps)?;
        let csv = CsvWriter::append(&path)?;
        Ok((MetricsWriter::new(csv, &self.path, Some(env_steps))?, rewound))
    }
}

/// File name of the [`IngestLedger`].
pub const INGESTED_FILE: &str = "ingested";

/// The env steps a learner's hub has accepted so far (counting from the checkpoint it started from), kept in the
/// run directory as 8 little-endian bytes rewritten in place after every accepted chunk or gradient: a write to
/// the page cache, no fsync, so it survives the learner process (kill -9, a panic, OOM), which is what it is
/// for. A learner restarted from a checkpoint at `C` env steps reads the dead learner's count `N` first: `N − C`
/// env steps were taken in after the checkpoint and died with it — lost, counted once.
#[derive(Debug)]
pub struct IngestLedger {
    file: File,
    path: PathBuf,
}

impl IngestLedger {
    /// Start the ledger of `dir` at `env_steps` (replacing a dead learner's: read it first with [`IngestLedger::read`]).
    pub fn open(dir: &Path, env_steps: u64) -> Result<Self> {
        let path = dir.join(INGESTED_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| io("creating", &path, e))?;
        let ledger = IngestLedger { file, path };
        ledger.record(env_steps)?;
        Ok(ledger)
    }

    /// The count a learner left in `dir`, if it left one.
    pub fn read(dir: &Path) -> Option<u64> {
        let bytes = std::fs::read(dir.join(INGESTED_FILE)).ok()?;
        Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
    }

    /// Record `env_steps` accepted so far.
    pub fn record(&self, env_steps: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(&env_steps.to_le_bytes(), 0).map_err(|e| io("writing", &self.path, e))
    }
}

/// What [`RunDir::metrics_rewound`] removed from `metrics.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rewound {
    /// Rows removed (logged after the checkpoint).
    pub rows: usize,
    /// Env steps the dead learner had logged past the checkpoint (its last removed row's `env_steps` minus the
    /// checkpoint's): trained on, then lost with it. A lower bound (steps ingested after its last row leave no
    /// trace here): the [`IngestLedger`] gives the exact count where the learner kept one.
    pub lost_env_steps: u64,
    /// Env steps lost at earlier restarts: the file's last `charts/lost_env_steps` value, removed rows included.
    pub earlier_lost_env_steps: u64,
}

/// Cut `metrics.csv` back to the rows with `env_steps <= env_steps` (header kept; a missing file is left alone).
fn rewind_csv(path: &Path, env_steps: u64) -> Result<Rewound> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Rewound::default()),
        Err(e) => return Err(io("reading", path, e)),
    };
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Ok(Rewound::default()) };
    let columns: Vec<&str> = header.split(',').collect();
    let column = |name: &str| columns.iter().position(|c| *c == name);
    let cell = |line: &str, col: Option<usize>| col.and_then(|c| line.split(',').nth(c)?.parse::<f64>().ok());
    let (steps_col, lost_col) = (column("env_steps"), column("charts/lost_env_steps"));
    let mut rewound = Rewound::default();
    let mut kept = String::from(header) + "\n";
    for line in lines {
        if let Some(lost) = cell(line, lost_col) {
            rewound.earlier_lost_env_steps = lost as u64;
        }
        match cell(line, steps_col) {
            Some(steps) if steps as u64 > env_steps => {
                rewound.rows += 1;
                rewound.lost_env_steps = steps as u64 - env_steps;
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    if rewound.rows > 0 {
        write_atomic(path, kept.as_bytes())?;
    }
    Ok(rewound)
}

/// A run's metrics sink: each row goes to `metrics.csv` and, as scalars at its env steps, to a TensorBoard event
/// file under the same names (`charts/…`, `losses/…`, `eval/…`; a row's empty cells are not written).
#[derive(Debug)]
pub struct MetricsWriter {
    csv: CsvWriter,
    events: EventWriter,
}

impl MetricsWriter {
    /// A resumed segment's event file (`resumed_at`: the env steps it resumes at) starts with TensorFlow's
    /// `SessionLog.START` at the next step: TensorBoard then drops every earlier file's points from that step
    /// on — what a dead learner logged past its checkpoint — as `metrics.csv` drops those rows.
    fn new(csv: CsvWriter, dir: &Path, resumed_at: Option<u64>) -> Result<Self> {
        let mut events = EventWriter::create(dir)?;
        if let Some(step) = resumed_at {
            events.add_session_start(step + 1)?;
        }
        let config = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config).map_err(|e| io("reading", &config, e))?;
        events.add_text(0, "hyperparameters", &config_table(&text))?;
        Ok(MetricsWriter { csv, events })
    }

    /// Write one row (as [`CsvWriter::write_row`]); its `env_steps` column is the event file's step.
    pub fn write_row<S: AsRef<str>>(&mut self, row: &[(S, Option<f64>)]) -> Result<()> {
        self.csv.write_row(row)?;
        let step = row.iter().find(|(n, _)| n.as_ref() == "env_steps").and_then(|(_, v)| *v).unwrap_or(0.0) as u64;
        let scalars: Vec<(&str, f64)> = row
            .iter()
            .filter(|(n, _)| n.as_ref() != "env_steps")
            .filter_map(|(n, v)| Some((n.as_ref(), (*v)?)))
            .collect();
        self.events.add_scalars(step, &scalars)?;
        Ok(())
    }
}

/// The resolved config as a Markdown table of `section.key | value` rows (TensorBoard's Text tab), by key;
/// a config that does not parse is shown as it is, in a code block.
fn config_table(toml_text: &str) -> String {
    fn flatten(prefix: &str, value: &toml::Value, rows: &mut Vec<(String, String)>) {
        match value {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    flatten(&key, v, rows);
                }
            }
            toml::Value::Array(a) if a.iter().any(|v| v.is_table()) => {
                for (i, v) in a.iter().enumerate() {
                    flatten(&format!("{prefix}[{i}]"), v, rows);
                }
            }
            toml::Value::String(s) => rows.push((prefix.to_string(), s.clone())),
            other => rows.push((prefix.to_string(), other.to_string())),
        }
    }
    match toml_text.parse::<toml::Table>() {
        Ok(table) => {
            let mut rows = Vec::new();
            flatten("", &toml::Value::Table(table), &mut rows);
            flotilla_observe::tensorboard::markdown_table(&rows)
        }
        Err(_) => format!("```toml\n{toml_text}\n```"),
    }
}

/// Write `bytes` to `path` atomically (see [`flotilla_algorithms::atomic_write`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    flotilla_algorithms::atomic_write::write_atomic(path, |tmp| std::fs::write(tmp, bytes))
        .map_err(|e| io("writing", path, e))
}

/// Run `f` with the checkpoints, weights and run configs it saves made durable together at its end
/// ([`flotilla_algorithms::atomic_write::together`]): a population's members saving at once pay the disk's
/// fsync latency once, not per file.
pub fn saved_together<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    flotilla_algorithms::atomic_write::together(f, |e| Error::RunDir(format!("saving files together: {e}")))
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io { action, path: path.display().to_string(), source }
}

/// A CSV file whose header is fixed by the first row; later rows must have the same columns.
#[derive(Debug)]
pub struct CsvWriter {
    out: BufWriter<File>,
    path: PathBuf,
    columns: Option<Vec<String>>,
}

impl CsvWriter {
    /// Create (truncate) the file.
    pub fn create(path: &Path) -> Result<Self> {
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io("creating", path, e))?;
        Ok(CsvWriter { out: BufWriter::new(f), path: path.to_path_buf(), columns: None })
    }

    /// Append to an existing file, keeping its header (rows must have the same columns).
    pub fn append(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| io("reading", path, e))?;
        let columns = text.lines().next().map(|h| h.split(',').map(str::to_string).collect());
        let f = OpenOptions::new().append(true).open(path).map_err(|e| io("opening", path, e))?;
        Ok(CsvWriter { out: BufWriter::new(f), path: path.to_path_buf(), columns })
    }

    /// Append one row of `(column, value)` pairs (`None` writes an empty cell) and flush it. Columns the
    /// header lacks (an algorithm's losses first appear once learning starts) are added to the header, the
    /// file rewritten atomically with empty cells for the earlier rows; columns a row lacks stay empty.
    pub fn write_row<S: AsRef<str>>(&mut self, row: &[(S, Option<f64>)]) -> Result<()> {
        let columns = self.columns.get_or_insert_with(Vec::new);
        let new: Vec<String> =
            row.iter().map(|(n, _)| n.as_ref().to_string()).filter(|n| !columns.contains(n)).collect();
        if !new.is_empty() {
            let (old_width, had_header) = (columns.len(), !columns.is_empty());
            columns.extend(new);
            self.rewrite_header(old_width, had_header)?;
        }
        let columns = self.columns.as_ref().expect("set above");
        let cells: Vec<String> = columns
            .iter()
            .map(|c| {
                row.iter()
                    .find(|(n, _)| n.as_ref() == c)
                    .and_then(|(_, v)| *v)
                    .map(|x| x.to_string())
                    .unwrap_or_default()
            })
            .collect();
        writeln!(self.out, "{}", cells.join(","))
            .and_then(|_| self.out.flush())
            .map_err(|e| io("writing", &self.path, e))
    }

    /// Write the current header over the file's first line, padding the `old_width`-column rows below it.
    fn rewrite_header(&mut self, old_width: usize, had_header: bool) -> Result<()> {
        self.out.flush().map_err(|e| io("writing", &self.path, e))?;
        let columns = self.columns.as_ref().expect("set by the caller");
        let text = std::fs::read_to_string(&self.path).map_err(|e| io("reading", &self.path, e))?;
        let pad = ",".repeat(columns.len() - old_width);
        let mut out = columns.join(",") + "\n";
        for line in text.lines().skip(usize::from(had_header)) {
            out.push_str(line);
            out.push_str(&pad);
            out.push('\n');
        }
        write_atomic(&self.path, out.as_bytes())?;
        let f = OpenOptions::new().append(true).open(&self.path).map_err(|e| io("opening", &self.path, e))?;
        self.out = BufWriter::new(f);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ingest_ledger_outlives_its_writer_and_restarts_from_a_count() {
        let dir = std::env::temp_dir().join(format!("flotilla-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(IngestLedger::read(&dir), None, "no ledger yet");
        let ledger = IngestLedger::open(&dir, 1000).unwrap();
        assert_eq!(IngestLedger::read(&dir), Some(1000));
        ledger.record(1256).unwrap();
        drop(ledger); // as a killed learner's handle goes
        assert_eq!(IngestLedger::read(&dir), Some(1256));
        let again = IngestLedger::open(&dir, 1128).unwrap();
        again.record(1384).unwrap();
        assert_eq!(IngestLedger::read(&dir), Some(1384));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rewind_removes_the_rows_past_the_checkpoint() {
        let dir = std::env::temp_dir().join(format!("flotilla-rewind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.csv");
        std::fs::write(&path, "env_steps,charts/lost_env_steps\n100,\n200,\n300,40\n400,40\n").unwrap();
        let r = rewind_csv(&path, 200).unwrap();
        assert_eq!(r, Rewound { rows: 2, lost_env_steps: 200, earlier_lost_env_steps: 40 });
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "env_steps,charts/lost_env_steps\n100,\n200,\n");
        assert_eq!(rewind_csv(&path, 200).unwrap(), Rewound::default(), "nothing past the checkpoint");
        assert_eq!(rewind_csv(&path, 0).unwrap().rows, 2, "no checkpoint: every row goes");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "env_steps,charts/lost_env_steps\n");
        assert_eq!(rewind_csv(&dir.join("none.csv"), 5).unwrap(), Rewound::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn csv_header_grows_with_new_columns() {
        let dir = std::env::temp_dir().join(format!("flotilla-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.csv");
        let mut w = CsvWriter::create(&path).unwrap();
        w.write_row(&[("a", Some(1.0)), ("b", None)]).unwrap();
        w.write_row(&[("a", Some(2.5)), ("b", Some(-1.0))]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b\n1,\n2.5,-1\n");
        // A new column extends the header and pads earlier rows; a missing one is an empty cell.
        w.write_row(&[("a", Some(3.0)), ("c", Some(7.0))]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b,c\n1,,\n2.5,-1,\n3,,7\n");
        let mut again = CsvWriter::append(&path).unwrap();
        again.write_row(&[("c", Some(1.0)), ("a", Some(4.0))]).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().ends_with("3,,7\n4,,1\n"));
        write_atomic(&dir.join("x.txt"), b"hello").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("x.txt")).unwrap(), "hello");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
