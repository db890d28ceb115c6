//! `flotilla report` on synthetic population and run directories (no training): every number of `--json`
//! checked against an independent NumPy computation on the same files (`tests/python/report_check.py`), the
//! text output's aggregate line, merging a sweep's jobs, strata, PBT's best schedule, and bad input refused by
//! name.
mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{flotilla, scratch, text};
use flotilla_learner::population::{LINEAGE_FILE, LineageEvent, MemberRecord, PopulationRecord};
use serde_json::Value;

/// Every fixture run's budget: a member is finished when its last evaluation is at this many env steps.
const TOTAL: u64 = 1000;

/// A run directory as `flotilla train` leaves it, without training: `config.toml` and `metrics.csv` with rows
/// `(env_steps, eval/mean_return)` (`None`: a training row with no evaluation).
fn write_run(dir: &Path, env: &str, seed: u64, rows: &[(u64, Option<f64>)]) {
    std::fs::create_dir_all(dir).unwrap();
    let config = format!(
        "[env]\nid = \"{env}\"\n[algorithm]\nkind = \"ppo\"\n[run]\nseed = {seed}\ntotal_env_steps = {TOTAL}\n"
    );
    std::fs::write(dir.join("config.toml"), config).unwrap();
    let mut csv = String::from("env_steps,updates,charts/sps,eval/mean_return,eval/std_return\n");
    for (k, (steps, eval)) in rows.iter().enumerate() {
        let (mean, std) = eval.map_or((String::new(), String::new()), |v| (v.to_string(), "1.5".into()));
        csv += &format!("{steps},{k},1234.5,{mean},{std}\n");
    }
    std::fs::write(dir.join("metrics.csv"), csv).unwrap();
}

/// One member of a fixture population: index, seed, starting hyperparameters, env, metrics rows.
struct Member<'a> {
    index: usize,
    seed: u64,
    hyperparameters: &'a [(&'a str, f64)],
    env: &'a str,
    rows: Vec<(u64, Option<f64>)>,
}

/// A population directory holding `members` (of `size`), as job `job` of `jobs`.
fn write_population(dir: &Path, size: usize, (job, jobs): (usize, usize), pbt: bool, members: &[Member]) -> PathBuf {
    let mut records = Vec::new();
    for m in members {
        let rel = PathBuf::from(format!("members/{:03}", m.index));
        write_run(&dir.join(&rel), m.env, m.seed, &m.rows);
        records.push(MemberRecord {
            index: m.index,
            seed: m.seed,
            dir: rel,
            hyperparameters: m.hyperparameters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        });
    }
    let keys: Vec<String> =
        members.first().map(|m| m.hyperparameters.iter().map(|(k, _)| k.to_string()).collect()).unwrap_or_default();
    let record = PopulationRecord { size, base_seed: 1, sweep_keys: keys, pbt, jobs, job_index: job, members: records };
    record.write(dir).unwrap();
    dir.to_path_buf()
}

fn rows(points: &[(u64, f64)]) -> Vec<(u64, Option<f64>)> {
    points.iter().map(|&(s, v)| (s, Some(v))).collect()
}

/// A grid sweep (learning rate 1e-3 or 3e-4 by index parity, 4 seeds each) split into two jobs, plus a plain
/// run directory: ties at 500, a final return exactly at the threshold, never-solved members, a member stopped
/// at 600 env steps and one that has evaluated nothing yet.
fn grid_sweep(dir: &Path) -> [PathBuf; 3] {
    const LR: &str = "algorithm.learning_rate";
    let fast: &[(&str, f64)] = &[(LR, 1e-3)];
    let slow: &[(&str, f64)] = &[(LR, 3e-4)];
    let evals: [Vec<(u64, Option<f64>)>; 8] = [
        [vec![(100, None)], rows(&[(200, 100.0), (400, 480.0), (600, 450.0), (800, 500.0), (1000, 500.0)])].concat(),
        rows(&[(200, 10.0), (400, 300.0), (600, 476.0), (800, 500.0), (1000, 500.0)]),
        rows(&[(200, 20.0), (500, 100.0), (1000, 230.5)]),
        rows(&[(200, 50.0), (400, 200.0), (600, 490.0)]),
        rows(&[(500, 474.9), (1000, 475.0)]),
        [rows(&[(1000, 500.0)]), vec![(1000, None)]].concat(),
        rows(&[(500, 30.0), (1000, 12.25)]),
        vec![(100, None), (200, None)],
    ];
    let member = |k: usize| Member {
        index: k,
        seed: 1 + k as u64,
        hyperparameters: if k.is_multiple_of(2) { fast } else { slow },
        env: "CartPole-v1",
        rows: evals[k].clone(),
    };
    let jobs = [0, 1].map(|job| {
        let members: Vec<Member> = (job..8).step_by(2).map(member).collect();
        write_population(&dir.join(format!("job-{job:03}-of-002")), 8, (job, 2), false, &members)
    });
    let plain = dir.join("plain");
    write_run(&plain, "CartPole-v1", 42, &rows(&[(500, 200.0), (1000, 321.0)]));
    [jobs[0].clone(), jobs[1].clone(), plain]
}

/// `flotilla report DIRS --json [extra]`, parsed.
fn report_json(dirs: &[&Path], extra: &[&str]) -> (Value, String) {
    let mut args: Vec<&str> = vec!["report"];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
    args.push("--json");
    args.extend(extra);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    (serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}")), stdout)
}

/// `flotilla report DIRS` (text).
fn report_text(dirs: &[&Path], extra: &[&str]) -> String {
    let mut args: Vec<&str> = vec!["report"];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
    args.extend(extra);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// `tests/python/report_check.py DIRS [extra]` on the report's JSON: NumPy's numbers agree.
fn numpy_agrees(json: &str, dirs: &[&Path], extra: &[&str]) {
    let python = std::env::var("FLOTILLA_PYTHON").expect("FLOTILLA_PYTHON (set by scripts/setup.sh)");
    let script = format!("{}/../tests/python/report_check.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(&python)
        .arg(&script)
        .args(dirs)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the setup venv's python runs");
    child.stdin.take().unwrap().write_all(json.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{script} disagrees with flotilla report:\n{}\n{json}", text(&o));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn merged_sweep_jobs_agree_with_numpy() {
    let dir = scratch("report", "grid");
    let [job0, job1, plain] = grid_sweep(&dir);
    let dirs = [job0.as_path(), job1.as_path(), plain.as_path()];
    let (r, json) = report_json(&dirs, &[]);
    numpy_agrees(&json, &dirs, &[]);

    // By hand: finished returns 500, 500, 230.5, 475, 500, 12.25 and the plain run's 321; int(7 / 4) = 1 cut
    // from each end leaves 230.5, 321, 475, 500, 500.
    assert_eq!(r["size"], 7);
    assert_eq!(r["members_total"], 9);
    assert_eq!(r["unfinished"], 2);
    assert_eq!(f(&r["threshold"]), 475.0);
    assert_eq!(r["solved"], 4);
    assert!((f(&r["solved_fraction"]) - 4.0 / 7.0).abs() < 1e-12);
    assert!((f(&r["iqm"]) - 405.3).abs() < 1e-9, "{}", r["iqm"]);
    assert!((f(&r["mean"]) - 2538.75 / 7.0).abs() < 1e-9);
    assert_eq!(f(&r["median"]), 475.0);
    let ci = r["iqm_ci"].as_array().unwrap();
    assert!(ci.len() == 2 && f(&ci[0]) <= 405.3 && 405.3 <= f(&ci[1]), "{ci:?}");
    assert_eq!(r["strata"], serde_json::json!(["CartPole-v1"]));
    assert_eq!(r["missing_members"], serde_json::json!([]));
    let members = r["members"].as_array().unwrap();
    let indices = Value::Array(members.iter().map(|m| m["index"].clone()).collect());
    assert_eq!(indices, serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7, null]), "population order, the plain run last");
    let first: Vec<Option<u64>> = members.iter().map(|m| m["first_step_at_threshold"].as_u64()).collect();
    assert_eq!(first, [Some(400), Some(600), None, Some(600), Some(1000), Some(1000), None, None, None]);
    let finished: Vec<bool> = members.iter().map(|m| m["finished"].as_bool().unwrap()).collect();
    assert_eq!(finished, [true, true, true, false, true, true, true, false, true]);
    // Reaching 475 is not holding it: member 0 fell to 450 after its first 480 and settled at 800; member 3
    // reached it at its last row (held, nothing after it).
    let held: Vec<Option<bool>> = members.iter().map(|m| m["held_after_threshold"].as_bool()).collect();
    assert_eq!(held, [Some(false), Some(true), None, Some(true), Some(true), Some(true), None, None, None]);
    assert_eq!(
        (f(&members[0]["lowest_after_threshold"]), members[0]["evaluations_after_threshold"].as_u64()),
        (450.0, Some(3))
    );
    assert_eq!(members[3]["lowest_after_threshold"], Value::Null);
    let settled: Vec<Option<u64>> = members.iter().map(|m| m["settled_step_at_threshold"].as_u64()).collect();
    assert_eq!(settled, [Some(800), Some(600), None, Some(600), Some(1000), Some(1000), None, None, None]);
    assert_eq!(f(&members[2]["best_return"]), 230.5);
    // Of the 7 finished: 4 reached 475 (members 0, 1, 4, 5), 3 held it.
    assert_eq!((r["reached"].as_u64(), r["held"].as_u64()), (Some(4), Some(3)));
    assert_eq!(members[7]["final_return"], Value::Null);
    assert_eq!(members[8]["seed"], 42);
    // Two grid points and the plain run: one group each.
    let groups = r["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "{groups:?}");
    assert_eq!((groups[0]["size"].as_u64(), groups[0]["solved"].as_u64()), (Some(4), Some(2)));

    let out = report_text(&dirs, &[]);
    let all = out.lines().find(|l| l.starts_with("all members")).unwrap_or_else(|| panic!("{out}"));
    assert!(all.starts_with("all members (CartPole-v1): n = 7, IQM 405.3 ["), "{all}");
    assert!(all.contains("median 475.0 [") && all.ends_with("solved 4/7 (57%), reached 4/7, held 3/7"), "{all}");
    let row0 = out.lines().find(|l| l.contains("members/000")).unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row0.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(cells[3..9], ["500.0", "500.0", "400", "no (450.0)", "800", "yes"], "{out}");
    assert!(out.contains("algorithm.learning_rate = 0.001: n = 4, IQM "), "{out}");
    assert!(out.contains("2 unfinished members left out of the aggregates"), "{out}");
    assert!(out.contains("first step ≥ 475") && out.contains("no (600/1000)"), "{out}");
    assert!(out.contains("(job 2 of 2)"), "{out}");

    // One job alone: the other job's members are named as missing.
    let (r, json) = report_json(&[&job1], &[]);
    numpy_agrees(&json, &[&job1], &[]);
    assert_eq!(r["missing_members"], serde_json::json!([0, 2, 4, 6]));
    assert!(r.get("groups").is_none(), "one grid point here: no groups");

    // A plain run directory is one member.
    let (r, json) = report_json(&[&plain], &[]);
    numpy_agrees(&json, &[&plain], &[]);
    assert_eq!((r["size"].as_u64(), f(&r["iqm"]), r["solved"].as_u64()), (Some(1), 321.0, Some(0)));
    assert_eq!(r["iqm_ci"], serde_json::json!([321.0, 321.0]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn envs_are_strata_and_thresholds_come_from_each_env_or_the_flag() {
    let dir = scratch("report", "strata");
    let [job0, job1, _] = grid_sweep(&dir);
    let acrobot: Vec<Member> = [(-80.0, 0), (-95.5, 1), (-250.0, 2), (-100.0, 3)]
        .into_iter()
        .map(|(r, k)| Member {
            index: k,
            seed: 100 + k as u64,
            hyperparameters: &[],
            env: "Acrobot-v1",
            rows: rows(&[(500, -500.0), (1000, r)]),
        })
        .collect();
    let acrobot = write_population(&dir.join("acrobot"), 4, (0, 1), false, &acrobot);
    let dirs = [job0.as_path(), job1.as_path(), acrobot.as_path()];
    let (r, json) = report_json(&dirs, &[]);
    numpy_agrees(&json, &dirs, &[]);
    assert_eq!(r["strata"], serde_json::json!(["Acrobot-v1", "CartPole-v1"]));
    assert_eq!(r["threshold"], Value::Null, "two envs, two thresholds");
    assert_eq!(r["thresholds"]["Acrobot-v1"], -100.0);
    // CartPole: 4 of 6 finished; Acrobot: -80, -95.5, -100 reach -100.
    assert_eq!((r["size"].as_u64(), r["solved"].as_u64()), (Some(10), Some(7)));

    // Pendulum has no registered threshold: no solved count unless --threshold (negative) is given.
    let pendulum: Vec<Member> = [-150.0, -300.0, -180.5]
        .into_iter()
        .enumerate()
        .map(|(k, r)| Member {
            index: k,
            seed: 1 + k as u64,
            hyperparameters: &[],
            env: "Pendulum-v1",
            rows: rows(&[(500, -1200.0), (1000, r)]),
        })
        .collect();
    let pendulum = write_population(&dir.join("pendulum"), 3, (0, 1), false, &pendulum);
    let (r, json) = report_json(&[&pendulum], &[]);
    numpy_agrees(&json, &[&pendulum], &[]);
    assert_eq!((&r["threshold"], &r["solved"], &r["solved_fraction"]), (&Value::Null, &Value::Null, &Value::Null));
    let out = report_text(&[&pendulum], &[]);
    assert!(out.contains("Pendulum-v1 has no reward threshold; pass --threshold"), "{out}");
    let (r, json) = report_json(&[&pendulum], &["--threshold", "-200"]);
    numpy_agrees(&json, &[&pendulum], &["--threshold", "-200"]);
    assert_eq!((f(&r["threshold"]), r["solved"].as_u64()), (-200.0, Some(2)));
    assert_eq!(r["members"][2]["first_step_at_threshold"], 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pbt_best_schedule_follows_the_inherited_weights() {
    let dir = scratch("report", "pbt");
    const LR: &str = "algorithm.learning_rate";
    let starts = [[(LR, 1e-3)], [(LR, 2e-3)], [(LR, 3e-3)], [(LR, 4e-3)]];
    let members: Vec<Member> = [400.0, 300.0, 500.0, 450.0]
        .into_iter()
        .enumerate()
        .map(|(k, r)| Member {
            index: k,
            seed: 1 + k as u64,
            hyperparameters: &starts[k],
            env: "CartPole-v1",
            rows: rows(&[(250, 100.0), (500, 200.0), (750, 300.0), (1000, r)]),
        })
        .collect();
    let pop = write_population(&dir.join("pbt"), 4, (0, 1), true, &members);
    let event = |env_steps, member, source, lr| LineageEvent {
        env_steps,
        member,
        source,
        hyperparameters: BTreeMap::from([(LR.to_string(), lr)]),
    };
    let lineage =
        [event(250, 0, 3, 0.0048), event(250, 1, 2, 0.0024), event(500, 3, 0, 0.00384), event(750, 2, 3, 0.0046)];
    let lines: Vec<String> = lineage.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    std::fs::write(pop.join(LINEAGE_FILE), lines.join("\n") + "\n").unwrap();

    let (r, json) = report_json(&[&pop], &[]);
    numpy_agrees(&json, &[&pop], &[]);
    // Member 2 (500) copied member 3 at 750, which had copied member 0 at 500, which had copied member 3 at 250;
    // member 3 had trained from the start with its own 4e-3.
    assert_eq!(r["best_member"], 2);
    let schedule: Vec<(u64, u64, f64)> = r["best_schedule"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["env_steps"].as_u64().unwrap(), s["member"].as_u64().unwrap(), f(&s["hyperparameters"][LR])))
        .collect();
    assert_eq!(schedule, [(0, 3, 4e-3), (250, 0, 0.0048), (500, 3, 0.00384), (750, 2, 0.0046)]);
    assert!(r.get("groups").is_none(), "PBT members are not grouped by starting values");
    let out = report_text(&[&pop], &[]);
    assert!(out.contains("best member's hyperparameter schedule (member 2, seed 3, final return 500.0)"), "{out}");
    assert!(out.contains("from 0 env steps: algorithm.learning_rate = 0.004 (weights trained by member 3)"), "{out}");
    assert!(
        out.contains("from 750 env steps: algorithm.learning_rate = 0.0046 (weights trained by member 2)"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_refused_by_name() {
    let dir = scratch("report", "errors");
    let [job0, job1, plain] = grid_sweep(&dir);
    let fails = |args: &[&str]| {
        let o = flotilla(args);
        assert!(!o.status.success(), "{args:?} succeeded: {}", text(&o));
        text(&o)
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();

    // The same job given twice, under another name: its members are counted once only.
    let again = dir.join("job-000-copy");
    std::fs::create_dir_all(&again).unwrap();
    let o = Command::new("cp").arg("-r").arg(format!("{}/.", job0.display())).arg(&again).output().unwrap();
    assert!(o.status.success());
    let err = fails(&["report", &s(&job0), &s(&job1), &s(&again)]);
    assert!(err.contains("member 0 (seed 1)") && err.contains(&s(&job0)) && err.contains(&s(&again)), "{err}");
    let err = fails(&["report", &s(&plain), &format!("{}/.", s(&plain))]);
    assert!(err.contains("the same directory"), "{err}");

    // A metric no metrics.csv has.
    let err = fails(&["report", &s(&job0), "--metric", "eval/nope"]);
    assert!(err.contains("\"eval/nope\"") && err.contains(&format!("{}/members/000/metrics.csv", s(&job0))), "{err}");
    assert!(err.contains("eval/mean_return"), "lists the columns there are: {err}");

    // A member population.json lists that is not there.
    std::fs::remove_dir_all(job1.join("members/003")).unwrap();
    let err = fails(&["report", &s(&job1)]);
    assert!(err.contains(&format!("{}/population.json", s(&job1))) && err.contains("member 3"), "{err}");

    // Neither a population nor a run directory; not a directory at all.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = fails(&["report", &s(&empty)]);
    assert!(err.contains(&s(&empty)) && err.contains("neither a population directory"), "{err}");
    let err = fails(&["report", &s(&dir.join("nowhere"))]);
    assert!(err.contains("nowhere") && err.contains("does not exist"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--at STEPS`: every member as of that step — later rows left out, finished once past it (a run stopped
/// early counts), reached and held as of then; by hand and against NumPy.
#[test]
fn a_budget_judges_every_member_as_of_that_step() {
    let dir = scratch("report", "at");
    let [job0, job1, plain] = grid_sweep(&dir);
    let dirs = [job0.as_path(), job1.as_path(), plain.as_path()];
    let (r, json) = report_json(&dirs, &["--at", "500"]);
    numpy_agrees(&json, &dirs, &["--at", "500"]);
    assert_eq!(r["at"], 500);
    let member = |k: usize| r["members"].as_array().unwrap().iter().find(|m| m["index"] == k).unwrap().clone();
    // Member 0 (100, 480 at 400, then 450…): 480 at 400, reached there and held (nothing after, as of 500).
    let m0 = member(0);
    assert_eq!((f(&m0["final_return"]), m0["first_step_at_threshold"].clone()), (480.0, 400.into()));
    assert_eq!((m0["held_after_threshold"].clone(), m0["finished"].clone()), (true.into(), true.into()));
    // Member 3 stopped at 600 of 1000: unfinished in the whole report, finished as of 500 (200 at 400).
    let m3 = member(3);
    assert_eq!((f(&m3["final_return"]), m3["finished"].clone()), (200.0, true.into()));
    // Member 5's only evaluation is at 1000: nothing as of 500.
    assert_eq!((member(5)["final_return"].clone(), member(5)["finished"].clone()), (Value::Null, false.into()));
    // Finished as of 500: members 0–4 and 6 and the plain run; not 5 (above) nor 7 (no evaluation at all).
    assert_eq!(r["size"], 7);
    let out = report_text(&dirs, &["--at", "500"]);
    assert!(out.contains("metric eval/mean_return, as of 500 env steps (later rows left out)"), "{out}");
    let o = flotilla(&["report", dirs[2].to_str().unwrap(), "--at", "0"]);
    assert!(!o.status.success() && text(&o).contains("--at"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report X --against Y`: each set reported as alone, then P(X > Y) and the IQM difference, env by env; by
/// hand and against NumPy (two strata, ties, an unfinished member left out); sets that cannot be compared are
/// refused by name.
#[test]
fn two_sets_of_runs_are_compared_as_rliable_does() {
    let dir = scratch("report", "against");
    let run = |name: &str, env: &str, seed: u64, last: f64| {
        let d = dir.join(name);
        write_run(&d, env, seed, &rows(&[(500, last / 2.0), (1000, last)]));
        d
    };
    // CartPole: X 30, 10, 20 against Y 20, 5, 25: (1 + 1.5 + 3) / 9 of the pairs. Acrobot: X −90 against
    // Y −100, −80: 1 / 2. P(X > Y) = (5.5 / 9 + 1 / 2) / 2.
    let x = [
        run("x1", "CartPole-v1", 1, 30.0),
        run("x2", "CartPole-v1", 2, 10.0),
        run("x3", "CartPole-v1", 3, 20.0),
        run("x4", "Acrobot-v1", 1, -90.0),
    ];
    let y = [
        run("y1", "CartPole-v1", 1, 20.0),
        run("y2", "CartPole-v1", 2, 5.0),
        run("y3", "CartPole-v1", 3, 25.0),
        run("y4", "Acrobot-v1", 1, -100.0),
        run("y5", "Acrobot-v1", 2, -80.0),
    ];
    // Stopped early: listed, left out of both the aggregates and the comparison.
    let unfinished = dir.join("y6");
    write_run(&unfinished, "CartPole-v1", 4, &rows(&[(500, 1e6)]));
    let mut dirs: Vec<&Path> = x.iter().map(PathBuf::as_path).collect();
    dirs.push(Path::new("--against"));
    dirs.extend(y.iter().map(PathBuf::as_path));
    dirs.push(&unfinished);
    let (r, json) = report_json(&dirs, &[]);
    numpy_agrees(&json, &dirs, &[]);
    let c = &r["comparison"];
    assert!((f(&c["probability_of_improvement"]) - (5.5 / 9.0 + 0.5) / 2.0).abs() < 1e-12, "{c}");
    // Pooled IQMs: X [−90, 10, 20, 30] cut 1 each end → 15; Y [−100, −80, 5, 20, 25] cut 1 → −55 / 3.
    assert!((f(&c["iqm_difference"]) - (15.0 + 55.0 / 3.0)).abs() < 1e-12, "{c}");
    assert_eq!(c["strata"], serde_json::json!(["Acrobot-v1", "CartPole-v1"]));
    assert_eq!(
        (r["x"]["size"].clone(), r["y"]["size"].clone(), r["y"]["unfinished"].clone()),
        (4.into(), 5.into(), 1.into())
    );
    let (lo, hi) = (f(&c["probability_of_improvement_ci"][0]), f(&c["probability_of_improvement_ci"][1]));
    assert!(
        0.0 <= lo && lo < f(&c["probability_of_improvement"]) && f(&c["probability_of_improvement"]) < hi && hi <= 1.0
    );

    let out = report_text(&dirs, &[]);
    assert!(out.starts_with("X: run ") && out.contains("\nY: run "), "{out}");
    let line = out.lines().find(|l| l.contains("probability of improvement")).expect("a P(X > Y) line");
    assert!(line.contains(&format!("P(X > Y) {:.2} [", (5.5 / 9.0 + 0.5) / 2.0)), "{line}");
    assert!(out.contains("X against Y (Acrobot-v1, CartPole-v1)") && out.contains("X n = 4, Y n = 5"), "{out}");
    assert!(out.contains("IQM difference X − Y +33.3 ["), "{out}");

    // Refused by name: envs only one side has, a side with nothing finished, one directory on both sides.
    let fails = |args: &[&Path]| {
        let mut a = vec![Path::new("report")];
        a.extend(args);
        let a: Vec<&str> = a.iter().map(|p| p.to_str().unwrap()).collect();
        let o = flotilla(&a);
        assert!(!o.status.success(), "{a:?} succeeded: {}", text(&o));
        text(&o)
    };
    let against = Path::new("--against");
    let err = fails(&[&x[0], &x[3], against, &y[0]]);
    assert!(err.contains("Acrobot-v1 only in the runs given first"), "{err}");
    let err = fails(&[&x[0], against, &unfinished]);
    assert!(err.contains("no finished member in the --against runs"), "{err}");
    let err = fails(&[&x[0], &x[1], against, &y[0], &x[1]]);
    assert!(err.contains("the same directory") && err.contains(x[1].to_str().unwrap()), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plot_draws_a_population_as_members_or_its_iqm() {
    let dir = scratch("report", "plot");
    let [job0, job1, _] = grid_sweep(&dir);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let svg = dir.join("members.svg");
    let o = flotilla(&["plot", &s(&job0), "--out", &s(&svg)]);
    assert!(o.status.success(), "{}", text(&o));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    for label in ["job-000-of-002/000", "job-000-of-002/006"] {
        assert!(drawn.contains(label), "no {label} in the SVG");
    }
    // --group: the two jobs are one population (member 7 has no evaluation yet: left out).
    let svg = dir.join("jobs.svg");
    let o = flotilla(&["plot", &s(&job0), &s(&job1), "--group", "--out", &s(&svg)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("members/007: no values of eval/mean_return yet; left out"), "{}", text(&o));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("job-000-of-002: IQM of 7 members (95% CI)"), "{drawn}");

    // Members evaluated at the same env steps: an IQM line with its band, a polygon in the line's colour.
    let members: Vec<Member> = (0..5)
        .map(|k| Member {
            index: k,
            seed: 1 + k as u64,
            hyperparameters: &[],
            env: "CartPole-v1",
            rows: rows(&[(250, 10.0 * k as f64), (500, 100.0 + 50.0 * k as f64), (1000, 300.0 + 40.0 * k as f64)]),
        })
        .collect();
    let seeds = write_population(&dir.join("seeds"), 5, (0, 1), false, &members);
    let svg = dir.join("iqm.svg");
    let o = flotilla(&["plot", &s(&seeds), "--group", "--out", &s(&svg)]);
    assert!(o.status.success(), "{}", text(&o));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("seeds: IQM of 5 members (95% CI)"), "{drawn}");
    assert!(drawn.contains("<polygon") && drawn.contains("#1F77B4"), "no band: {drawn}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `flotilla train`'s summary and `flotilla report` on the run it wrote say the same: the first evaluation at
/// the threshold (one from the evaluations in memory, the other from metrics.csv), whether every later one held
/// it, and how many came after.
#[test]
fn the_train_summary_and_report_agree_on_reaching_and_holding() {
    let dir = scratch("report", "summary");
    let run = dir.join("run");
    let config = common::config("cartpole_ppo.toml");
    let o = flotilla(&[
        "train",
        &config,
        "--set",
        "run.total_env_steps=40000",
        "--set",
        "eval.interval_steps=5000",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().find(|l| l.starts_with("first evaluation ≥ 475")).unwrap_or_else(|| {
        panic!("seed 1 reaches 475 within 40 K env steps (at 15-20 K on every CPU so far):\n{stdout}")
    });
    let (r, _) = report_json(&[&run], &[]);
    let m = &r["members"][0];
    let first = m["first_step_at_threshold"].as_u64().expect("report finds the same first step");
    assert!(line.contains(&format!(" at {first} env steps, ")), "{line}\n{m}");
    let after = m["evaluations_after_threshold"].as_u64().unwrap();
    assert_eq!(after, (40000 - first) / 5000, "{m}");
    let clause = match (m["held_after_threshold"].as_bool().unwrap(), after) {
        (true, 1) => "; held at the evaluation after it".to_string(),
        (true, n) => format!("; held at the {n} evaluations after it"),
        (false, n) => {
            format!("; not held: lowest {:.1} at the {n} evaluations after it", f(&m["lowest_after_threshold"]))
        }
    };
    assert!(line.ends_with(&clause), "summary {line:?}, report {m}");
    let _ = std::fs::remove_dir_all(&dir);
}
