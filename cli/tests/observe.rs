//! What a person watching a run sees: TensorBoard event files in the run directory, read back with TensorBoard's
//! own Python reader (`tests/python/read_events.py`, in the setup venv) and checked against `metrics.csv`.
mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{check_events_match_csv, config, flotilla, scratch, text};

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
    // Scrape until the first metrics row is in (it carries the logged values) and both actors have connected
    // (the learner trains on the first actor's chunks while a loaded machine still starts the second), then
    // once more later.
    let started = Instant::now();
    let first = loop {
        let (status, samples) = scrape(&addr);
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        let both = samples.get("flotilla_actors_connected").is_some_and(|&n| n >= 2.0);
        if both && samples.contains_key("flotilla_run_metric{name=\"charts/sps\"}") {
            break samples;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no metrics row with both actors connected after 2 minutes: {samples:?}\n{log}"
        );
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

/// A learner restarted from its checkpoint (`RunDir::metrics_rewound`): the rows the dead learner logged past the
/// checkpoint leave metrics.csv, and TensorBoard's reader drops their points too (the resumed event file starts
/// with a session start), so both show the resumed curve alone.
#[test]
fn a_rewound_run_shows_tensorboard_the_points_metrics_csv_keeps() {
    use flotilla_learner::config::ExperimentConfig;
    use flotilla_learner::run_dir::RunDir;
    let dir = scratch("observe", "rewound");
    let experiment = ExperimentConfig::load(std::path::Path::new(&config("cartpole_ppo.toml")), &[]).unwrap();
    let run = RunDir::create(&dir.join("run"), &experiment).unwrap();
    let row = |steps: u64, v: f64| {
        [("env_steps", Some(steps as f64)), ("charts/sps", Some(v)), ("eval/mean_return", Some(v))]
    };
    let mut first = run.metrics_writer().unwrap();
    for steps in [5000, 10000, 15000, 20000] {
        first.write_row(&row(steps, 1.0)).unwrap();
    }
    drop(first);
    // The learner died after logging 20 K; its checkpoint was at 10 K.
    let (mut resumed, rewound) = run.metrics_rewound(10000).unwrap();
    assert_eq!(rewound.rows, 2);
    for steps in [15000, 20000, 25000] {
        resumed.write_row(&row(steps, 2.0)).unwrap();
    }
    drop(resumed);
    check_events_match_csv(run.path(), "rewound");
    let (tb, _) = common::tensorboard(run.path());
    let sps: Vec<(u64, f64)> = tb["charts/sps"].clone();
    assert_eq!(sps, [(5000, 1.0), (10000, 1.0), (15000, 2.0), (20000, 2.0), (25000, 2.0)]);
}
