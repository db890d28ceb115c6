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

/// One scrape of `http://{addr}/metrics` with a plain HTTP/1.1 request: the status line and the exposition's
/// samples (`name{labels}` → value), each family's `# TYPE` checked to come before its samples.
fn scrape(addr: &str) -> (String, BTreeMap<String, f64>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_string();
    // Chunked transfer encoding is not used for a fixed body: the body is the exposition itself.
    let mut samples = BTreeMap::new();
    let mut typed = Vec::new();
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            typed.push(t.split(' ').next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample without a value: {line:?}"));
            let family = name.split('{').next().unwrap();
            assert!(typed.iter().any(|t| family.starts_with(t.as_str())), "{family} sampled before its # TYPE");
            samples.insert(name.to_string(), value.parse().unwrap_or_else(|_| panic!("value of {line:?}")));
        }
    }
    assert_eq!(body.lines().last(), Some("# EOF"), "OpenMetrics ends with # EOF");
    (status, samples)
}

/// `[learner] metrics_listen`: during a distributed run (2 actors) the learner's endpoint answers a real HTTP
/// request with chunks and transitions taken in, the actors connected, update times and the logged metrics, and
/// the counters grow between scrapes; a bad address is refused before anything is written.
#[test]
#[cfg_attr(debug_assertions, ignore = "trains: run with --release")]
fn the_learner_serves_prometheus_metrics_during_a_distributed_run() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let dir = scratch("observe", "prometheus");
    let run = dir.join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["train", &config("cartpole_ppo.toml"), "--actors", "2", "--out", run.to_str().unwrap()])
        .args(["--set", "learner.metrics_listen=\"127.0.0.1:0\"", "--set", "run.total_env_steps=300000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let done = common::watchdog(child.id(), Duration::from_secs(240));
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = String::new();
    let addr = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no metrics address:\n{log}"));
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.split("metrics on http://").nth(1) {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    // Scrape until the first metrics row is in (it carries the logged values), then once more later.
    let started = Instant::now();
    let first = loop {
        let (status, samples) = scrape(&addr);
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        if samples.contains_key("flotilla_run_metric{name=\"charts/sps\"}") {
            break samples;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no metrics row after 2 minutes: {samples:?}\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(2));
    let (_, later) = scrape(&addr);
    for (name, at_least) in [
        ("flotilla_ingest_chunks_total", 1.0),
        ("flotilla_ingest_transitions_total", 1.0),
        ("flotilla_actors_connected", 2.0),
        ("flotilla_update_seconds_count", 1.0),
        ("flotilla_policy_version", 1.0),
        ("flotilla_env_steps", 1.0),
        ("flotilla_refused_messages_total", 0.0),
        ("flotilla_ingest_queue_depth", 0.0),
        ("flotilla_run_metric{name=\"charts/policy_lag\"}", 0.0),
        ("flotilla_run_metric{name=\"losses/value_loss\"}", f64::NEG_INFINITY),
    ] {
        let v = first.get(name).unwrap_or_else(|| panic!("no {name} in {first:?}"));
        assert!(*v >= at_least, "{name} = {v}");
    }
    // PPO chunks are 32 steps (the quick start's n_steps) of 4 envs (its 8 envs split between 2 actors).
    assert_eq!(first["flotilla_ingest_transitions_total"], 128.0 * first["flotilla_ingest_chunks_total"]);
    assert!(later["flotilla_ingest_chunks_total"] > first["flotilla_ingest_chunks_total"], "counters grow: {later:?}");
    let status = child.wait().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
    log.extend(rx.try_iter().map(|l| l + "\n"));
    assert!(status.success(), "{log}");
    assert!(std::net::TcpStream::connect(&addr).is_err(), "the endpoint stops with the learner");

    let bad = dir.join("bad");
    let o = flotilla(&[
        "train",
        &config("cartpole_ppo.toml"),
        "--actors",
        "1",
        "--set",
        "learner.metrics_listen=\"localhost\"",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success() && text(&o).contains("[learner] metrics_listen = \"localhost\""), "{}", text(&o));
    assert!(!bad.exists(), "nothing written");
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), `flotilla train` keeps one progress line
/// updated in place — env steps against the budget, rate, last evaluation — with the log lines above it; piped
/// (as in CI), its output has no progress line and no control characters.
#[test]
#[cfg_attr(debug_assertions, ignore = "trains: run with --release")]
fn a_progress_line_on_a_terminal_and_plain_logs_elsewhere() {
    let dir = scratch("observe", "progress");
    let Ok(which) = Command::new("script").arg("--version").output() else {
        assert!(std::env::var_os("CI").is_none(), "util-linux `script` is needed for this test in CI");
        eprintln!("SKIPPED: no `script` (util-linux) to run flotilla under a pseudo-terminal");
        return;
    };
    assert!(which.status.success());
    let run = dir.join("tty");
    let command = format!(
        "{} train {} --set run.total_env_steps=30000 --out {}",
        env!("CARGO_BIN_EXE_flotilla"),
        config("cartpole_ppo.toml"),
        run.display()
    );
    let o = Command::new("script").args(["-q", "-e", "-c", &command, "/dev/null"]).output().unwrap();
    let tty = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{tty}");
    for position in ["5,000/30,000 env steps", "30,000/30,000 env steps", " sps · eval "] {
        assert!(tty.contains(position), "no {position:?} on the terminal:\n{tty}");
    }
    assert!(tty.contains("\x1b[2K"), "the line is redrawn in place (erase-line codes)");
    assert!(tty.contains("INFO") && tty.contains("steps    10000 |"), "log lines still print above it");
    assert!(tty.contains("evaluation return: "), "the summary follows");

    let piped = dir.join("piped");
    let o = flotilla(&[
        "train",
        &config("cartpole_ppo.toml"),
        "--set",
        "run.total_env_steps=30000",
        "--out",
        piped.to_str().unwrap(),
    ]);
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("steps    10000 |"), "the log lines as before:\n{all}");
    assert!(!all.contains("env steps ·") && !all.contains('\x1b') && !all.contains('\r'), "no progress line:\n{all}");
}
