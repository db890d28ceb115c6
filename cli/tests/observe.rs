//! What a person watching a run sees: TensorBoard event files in the run directory, read back with TensorBoard's
//! own Python reader (`tests/python/read_events.py`, in the setup venv) and checked against `metrics.csv`.
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{config, flotilla, scratch, text};

/// `metrics.csv` as `column → [(env_steps, value)]`, empty cells left out (`env_steps` itself is the x axis).
fn csv_points(run: &Path) -> BTreeMap<String, Vec<(u64, f64)>> {
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let mut out: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let step: f64 = cells[0].parse().unwrap();
        for (name, cell) in header.iter().zip(&cells).skip(1) {
            if let Ok(v) = cell.parse::<f64>() {
                out.entry(name.to_string()).or_default().push((step as u64, v));
            }
        }
    }
    out
}

/// The event files of `run` as TensorBoard's `EventAccumulator` reads them: scalars and text by tag.
fn tensorboard(run: &Path) -> (BTreeMap<String, Vec<(u64, f64)>>, BTreeMap<String, Vec<String>>) {
    let python = std::env::var("FLOTILLA_PYTHON").expect("FLOTILLA_PYTHON (set by scripts/setup.sh)");
    let script = format!("{}/../tests/python/read_events.py", env!("CARGO_MANIFEST_DIR"));
    let o = Command::new(&python).arg(&script).arg(run).output().expect("the setup venv's python runs");
    assert!(o.status.success(), "{script}: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let scalars = v["scalars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, points)| {
            let points = points.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()));
            (tag.clone(), points.collect())
        })
        .collect();
    let texts = v["text"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, t)| (tag.clone(), t.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()))
        .collect();
    (scalars, texts)
}

/// Every metrics.csv column is a TensorBoard scalar with the same points (values as f32), and the config is
/// there as text.
fn check_events_match_csv(run: &Path, label: &str) {
    let csv = csv_points(run);
    let (tb, texts) = tensorboard(run);
    assert_eq!(csv.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>(), "{label}: the same metric names");
    for (name, points) in &csv {
        let got = &tb[name];
        assert_eq!(got.len(), points.len(), "{label}: {name} has as many points as metrics.csv");
        for ((s, v), (ts, tv)) in points.iter().zip(got) {
            assert_eq!(s, ts, "{label}: {name} steps");
            assert_eq!(*tv as f32, *v as f32, "{label}: {name} at {s}");
        }
    }
    assert!(csv["eval/mean_return"].len() >= 2, "{label}: evaluations logged");
    let hp = texts.get("hyperparameters").unwrap_or_else(|| panic!("{label}: no hyperparameters text: {texts:?}"));
    assert!(
        hp.iter().all(|t| t.contains("|algorithm.kind|ppo|") && t.contains("|env.id|CartPole-v1|")),
        "{label}: {hp:?}"
    );
}

/// The quick start's run directory (the README's config, whole) holds an event file TensorBoard reads, with the
/// same points per metric as metrics.csv; so do a run stopped and resumed (a second event file joins the first)
/// and a distributed run (the learner writes them).
#[test]
#[cfg_attr(debug_assertions, ignore = "trains: run with --release")]
fn run_directories_hold_tensorboard_events_matching_metrics_csv() {
    let dir = scratch("observe", "tensorboard");
    let quick_start = config("cartpole_ppo.toml");
    let quick = dir.join("quick");
    let o = flotilla(&["train", &quick_start, "--out", quick.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    check_events_match_csv(&quick, "quick start");

    let resumed = dir.join("resumed");
    let short = ["--set", "run.total_env_steps=30000", "--set", "eval.interval_steps=10000"];
    let mut args = vec!["train", &quick_start, "--out", resumed.to_str().unwrap()];
    args.extend(short);
    args.extend(["--stop-at", "15000"]);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    let o = flotilla(&["train", "--resume", resumed.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let files = std::fs::read_dir(&resumed)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("events.out.tfevents."))
        .count();
    assert_eq!(files, 2, "one event file per training segment");
    check_events_match_csv(&resumed, "stopped and resumed");

    let actors = dir.join("actors");
    let mut args = vec!["train", &quick_start, "--actors", "2", "--out", actors.to_str().unwrap()];
    args.extend(short);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    check_events_match_csv(&actors, "with actors");
}
