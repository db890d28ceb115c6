//! Helpers the `flotilla` binary's integration tests share (each test file compiles this module for itself, so
//! not every file uses every helper).
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Run the `flotilla` binary with `args` to completion.
pub fn flotilla(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla")).args(args).output().expect("the flotilla binary runs")
}

/// An example config's path.
pub fn config(name: &str) -> String {
    format!("{}/../examples/configs/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, empty directory under the temp dir, named after the test file's `prefix`, `name` and this process.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A finished process's stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The values of one column of a run directory's `metrics.csv`, in row order (rows where it is empty skipped).
pub fn metric(run: &Path, column: &str) -> Vec<f64> {
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let col = lines.next().unwrap().split(',').position(|h| h == column).unwrap_or_else(|| panic!("no {column}"));
    lines.filter_map(|l| l.split(',').nth(col).and_then(|v| v.parse().ok())).collect()
}
