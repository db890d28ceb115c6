//! The `flotilla` binary end to end: train writes a complete run directory, eval reads it back, and bad
//! input fails with a message that names the problem.
mod common;

use std::path::Path;

use common::{config, flotilla, scratch, text};

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/cartpole_ppo.toml");

#[test]
fn train_writes_a_run_dir_and_eval_reads_it() {
    let dir = common::scratch("cli", "train");
    let run = dir.join("run");
    let out = flotilla(&[
        "train",
        CONFIG,
        "--set",
        "run.total_env_steps=4096",
        "--set",
        "eval.interval_steps=2048",
        "--set",
        "metrics.log_interval_steps=1024",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("evaluation return:"), "{stdout}");
    assert!(stdout.contains(&format!("saved policy: {}", run.join("model.safetensors").display())), "{stdout}");
    // Progress was visible while it ran.
    assert!(String::from_utf8_lossy(&out.stderr).contains("steps     1024"), "{}", text(&out));

    // The resolved config has every default written out, and the override applied.
    let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(resolved.contains("total_env_steps = 4096") && resolved.contains("gae_lambda = 0.8"), "{resolved}");
    // Metrics: a header and one row per 1024 steps, env steps increasing, evaluations at 2048 and 4096.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "env_steps",
        "charts/episodic_return",
        "charts/sps",
        "losses/policy_loss",
        "losses/value_loss",
        "eval/mean_return",
    ] {
        assert!(header.contains(&col), "missing column {col}: {header:?}");
    }
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let steps: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(steps, ["1024", "2048", "3072", "4096"]);
    let eval_col = header.iter().position(|c| *c == "eval/mean_return").unwrap();
    let evals: Vec<bool> = rows.iter().map(|r| !r[eval_col].is_empty()).collect();
    assert_eq!(evals, [false, true, false, true]);
    assert!(run.join("model.safetensors").is_file());

    let out = flotilla(&["eval", run.to_str().unwrap(), "--episodes", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("mean return") && stdout.contains("over 3 episodes"), "{stdout}");

    // The same run directory is not overwritten.
    let out = flotilla(&["train", CONFIG, "--out", run.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("already holds a run"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn bad_configs_fail_naming_key_value_and_file() {
    let dir = common::scratch("cli", "bad");
    let base = std::fs::read_to_string(CONFIG).unwrap();
    let cases = [
        ("unknown_key.toml", base.replace("n_epochs = 20", "n_epocs = 20"), "n_epocs"),
        ("wrong_type.toml", base.replace("num_envs = 8", "num_envs = \"eight\""), "num_envs"),
        ("unknown_env.toml", base.replace("CartPole-v1", "CartPole-v7"), "CartPole-v7"),
        ("unknown_kind.toml", base.replace("kind = \"ppo\"", "kind = \"ppg\""), "ppg"),
        ("bad_kwarg.toml", format!("{base}\n[env.kwargs]\npole_colour = 3\n"), "pole_colour"),
    ];
    for (name, body, needle) in cases {
        let path = write(&dir, name, &body);
        let out = flotilla(&["train", &path, "--out", dir.join(name).with_extension("run").to_str().unwrap()]);
        assert!(!out.status.success(), "{name} was accepted");
        let msg = text(&out);
        assert!(
            msg.contains(needle) && msg.contains(name),
            "{name}: message does not name {needle:?} and the file: {msg}"
        );
        assert!(!msg.contains("panicked"), "{msg}");
    }
    let out =
        flotilla(&["train", CONFIG, "--set", "algorithm.batch_size=100", "--out", dir.join("x").to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("batch_size"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn eval_of_a_missing_or_incomplete_run_dir_says_so() {
    let dir = common::scratch("cli", "missing");
    let missing = dir.join("nope");
    let out = flotilla(&["eval", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("does not exist") && text(&out).contains("nope"), "{}", text(&out));
    let out = flotilla(&["eval", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("not a run directory"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Config and device errors fail at once, name the key, and leave no run directory behind — for single-process
/// and distributed runs alike (an actor-side panic on a bad `reconnect_secs` used to hang a distributed run).
#[test]
fn bad_values_fail_fast_and_write_nothing() {
    let dir = common::scratch("cli", "fail-fast");
    let cases: [(&[&str], &str); 6] = [
        (&["--set", "actors.reconnect_secs=inf", "--actors", "2"], "actors] reconnect_secs"),
        (&["--set", "actors.reconnect_secs=nan", "--actors", "2"], "actors] reconnect_secs"),
        (&["--set", "actors.reconnect_secs=-1", "--actors", "2"], "actors] reconnect_secs"),
        (&["--set", "run.device=cuda:0"], "cuda:0"),
        (&["--set", "run.device=cuda:0", "--actors", "2"], "cuda:0"),
        (&["--set", "env.num_envs=0", "--actors", "2"], "num_envs"),
    ];
    for (i, (extra, needle)) in cases.iter().enumerate() {
        let run = dir.join(format!("run{i}"));
        let mut args = vec!["train", CONFIG, "--out", run.to_str().unwrap()];
        args.extend_from_slice(extra);
        let started = std::time::Instant::now();
        let out = flotilla(&args);
        let took = started.elapsed();
        assert!(!out.status.success(), "{args:?} should fail: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: the error does not name {needle:?}: {}", text(&out));
        assert!(took < std::time::Duration::from_secs(5), "{args:?} took {took:?}");
        assert!(!run.exists(), "{args:?} left a run directory behind");
    }
    let out = flotilla(&["actor", "--learner", "127.0.0.1:1", "--token", "t", "--reconnect-secs", "inf"]);
    assert!(!out.status.success() && text(&out).contains("--reconnect-secs"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[env] id = "gymnasium:…"`: a Python Gymnasium env trains, stops, resumes (Python envs have no snapshot:
/// replayed from the recorded actions) and evaluates through the same commands as a native one.
#[test]
fn python_gymnasium_envs_train_resume_and_evaluate() {
    let dir = common::scratch("cli", "gymnasium");
    let run = dir.join("run");
    let out = flotilla(&[
        "train",
        CONFIG,
        "--set",
        "env.id=gymnasium:CartPole-v1",
        "--set",
        "run.total_env_steps=4096",
        "--set",
        "eval.interval_steps=2048",
        "--set",
        "eval.episodes=2",
        "--out",
        run.to_str().unwrap(),
        "--stop-at",
        "2048",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped at 2048"), "{}", text(&out));
    let out = flotilla(&["train", "--resume", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // Python envs have no snapshot: the resume replays the recorded actions from the run's seed.
    assert!(text(&out).contains("replayed 2048 env steps"), "the resume replays the envs: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("for 4096 env steps"), "{}", text(&out));
    let out = flotilla(&["eval", run.to_str().unwrap(), "--episodes", "2"]);
    assert!(out.status.success() && text(&out).contains("gymnasium:CartPole-v1: mean return"), "{}", text(&out));
    // A Gymnasium id that does not exist fails before any run directory is written, naming it.
    let bad = dir.join("bad");
    let out = flotilla(&["train", CONFIG, "--set", "env.id=gymnasium:NoSuchEnv-v0", "--out", bad.to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("NoSuchEnv-v0"), "{}", text(&out));
    assert!(!bad.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[env] observe` keeps chosen observation components on native and Python envs alike: CartPole-v1 without
/// its velocities (`[0, 2]`) trains, stops, resumes and evaluates, the saved policy takes 2-component
/// observations, and an index out of range fails naming `observe` before anything is written.
#[test]
fn observe_hides_components_of_native_and_python_envs() {
    let dir = common::scratch("cli", "observe");
    for id in ["CartPole-v1", "gymnasium:CartPole-v1"] {
        let run = dir.join(id.replace(':', "_"));
        let args = |extra: &[&str]| -> Vec<String> {
            let mut a: Vec<String> = vec!["train".into(), CONFIG.into()];
            for s in [format!("env.id={id}"), "env.observe=[0, 2]".into(), "run.total_env_steps=4096".into()]
                .into_iter()
                .chain(["eval.interval_steps=2048".into(), "eval.episodes=2".into()])
            {
                a.extend(["--set".into(), s]);
            }
            a.extend(extra.iter().map(|s| s.to_string()));
            a
        };
        let run_arg = run.to_str().unwrap();
        let a = args(&["--out", run_arg, "--stop-at", "2048"]);
        let out = flotilla(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "{id}: {}", text(&out));
        let out = flotilla(&["train", "--resume", run_arg]);
        assert!(out.status.success() && text(&out).contains("for 4096 env steps"), "{id}: {}", text(&out));
        let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
        assert!(resolved.contains("observe = [0, 2]"), "{id}: {resolved}");
        // The saved policy's metadata: a 2-component observation space.
        let bytes = std::fs::read(run.join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let space = header["__metadata__"]["observation_space"].as_str().unwrap().to_string();
        let space: serde_json::Value = serde_json::from_str(&space).unwrap();
        assert_eq!(space["shape"], serde_json::json!([2]), "{id}: {space}");
        let out = flotilla(&["eval", run_arg, "--episodes", "2"]);
        assert!(out.status.success(), "{id}: {}", text(&out));
        // Drawing needs the whole state: refused by name, not a panic.
        let frames = dir.join("frames");
        let out = flotilla(&["eval", run_arg, "--episodes", "1", "--render", frames.to_str().unwrap()]);
        assert!(!out.status.success() && text(&out).contains("[env] observe"), "{id}: {}", text(&out));
    }
    let bad = dir.join("bad");
    let out = flotilla(&["train", CONFIG, "--set", "env.observe=[0, 7]", "--out", bad.to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("observe") && text(&out).contains("7"), "{}", text(&out));
    assert!(!bad.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `examples/configs/pong_ppo.toml` and `pong_ppo_lstm.toml` (a CNN torso before an LSTM, single frames) for a
/// few thousand steps: PPO on u8 frames with the Nature CNN trains, stops, resumes (the agent exactly, the games
/// anew: ale-py's vector env has no snapshot), evaluates whole games, and the run directory's resolved config
/// records every Atari setting (sticky actions included) and the CPU's bf16 choice.
#[test]
fn atari_ppo_trains_resumes_and_evaluates() {
    for (name, extra) in [("pong_ppo.toml", "stack_num = 4"), ("pong_ppo_lstm.toml", "stack_num = 1")] {
        let dir = common::scratch("cli", &format!("atari_{name}"));
        let run = dir.join("run");
        let config = format!("{}/../examples/configs/{name}", env!("CARGO_MANIFEST_DIR"));
        // One torch thread: tests run side by side, and oversubscribed libtorch threads spin.
        let set = ["run.total_env_steps=2048", "eval.interval_steps=1024", "eval.episodes=1", "run.torch_threads=1"];
        let mut args = vec!["train", &config, "--out", run.to_str().unwrap(), "--stop-at", "1024"];
        for s in &set {
            args.extend(["--set", s]);
        }
        let out = flotilla(&args);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("stopped at 1024"), "{name}: {}", text(&out));
        let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
        // bf16 on exactly where this CPU computes it natively, written down so the resumed run keeps it.
        let bf16 = format!("bf16 = {}", flotilla_algorithms::nn::nets::cpu_has_native_bf16());
        for line in [
            "repeat_action_probability = 0.0",
            "frameskip = 4",
            "noop_max = 30",
            "terminal_on_life_loss = true",
            extra,
            &bf16,
        ] {
            assert!(resolved.contains(line), "{name}: resolved config lacks {line:?}:\n{resolved}");
        }
        let out = flotilla(&["train", "--resume", run.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("for 2048 env steps"), "{name}: {}", text(&out));
        let out = flotilla(&["eval", run.to_str().unwrap(), "--episodes", "1"]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        // A whole game of Pong ends at 21 points for one side: the score is in [-21, 21] and not 0.
        let report = String::from_utf8_lossy(&out.stdout).to_string();
        let score: f64 = report
            .split("mean return ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no score in {report}"));
        assert!((-21.0..=21.0).contains(&score) && score != 0.0, "{name}: {report}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `examples/configs/pong_dqn.toml` for a few thousand steps: DQN with the Nature CNN and the frame replay
/// trains on u8 frames past `learning_starts`, stops, resumes and evaluates whole games.
#[test]
fn atari_dqn_trains_resumes_and_evaluates() {
    let dir = common::scratch("cli", "atari_dqn");
    let run = dir.join("run");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/pong_dqn.toml");
    let set = [
        "run.total_env_steps=1200",
        "run.torch_threads=1",
        "algorithm.learning_starts=400",
        "algorithm.buffer_size=2000",
        "eval.interval_steps=100000",
        "eval.episodes=1",
        "metrics.log_interval_steps=200",
    ];
    let mut args = vec!["train", config, "--out", run.to_str().unwrap(), "--stop-at", "600"];
    for s in &set {
        args.extend(["--set", s]);
    }
    let out = flotilla(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped at 600"), "{}", text(&out));
    assert!(text(&out).contains("td_loss"), "it trained past learning_starts: {}", text(&out));
    let out = flotilla(&["train", "--resume", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("for 1200 env steps"), "{}", text(&out));
    let out = flotilla(&["eval", run.to_str().unwrap(), "--episodes", "1"]);
    assert!(out.status.success() && text(&out).contains("atari:pong: mean return"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fine_tune_starts_from_a_trained_run_in_process_and_with_actors() {
    let dir = scratch("cli", "finetune");
    let source = dir.join("source");
    let src = source.to_str().unwrap();
    let o = flotilla(&["train", &config("cartpole_ppo.toml"), "--out", src, "--stop-at", "2048"]);
    assert!(o.status.success() && source.join("model.safetensors").is_file(), "{}", text(&o));
    let from = format!("init.from={src:?}");
    let finetune = config("cartpole_finetune.toml");
    for (name, extra) in [("tuned", &[][..]), ("tuned-actors", &["--actors", "2"][..])] {
        let out = dir.join(name);
        let mut args = vec!["train", &finetune, "--set", &from, "--out", out.to_str().unwrap(), "--stop-at", "1024"];
        args.extend_from_slice(extra);
        let o = flotilla(&args);
        assert!(o.status.success(), "{name}: {}", text(&o));
        assert!(text(&o).contains(&format!("started from {src}: 6 parameter tensors copied")), "{name}: {}", text(&o));
    }
    // A3C with the first layer frozen and 2 actors: the actors send gradients of the other layers only (the
    // learner refuses gradients of any other length), the learner steps with them, the frozen layer stays.
    let out = dir.join("a3c-frozen");
    let limit = std::time::Duration::from_secs(60);
    let o = common::flotilla_within(
        &[
            "train",
            &config("cartpole_a3c.toml"),
            "--set",
            &from,
            "--set",
            "init.freeze=[\"pi_vf.0\"]",
            "--actors",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--stop-at",
            "4000",
        ],
        limit,
    );
    assert!(o.status.success() && text(&o).contains("parameters frozen"), "{}", text(&o));
    assert!(!text(&o).contains("refused a "), "every gradient was taken: {}", text(&o));
    let weights = |dir: &std::path::Path| tch::Tensor::read_safetensors(dir.join("model.safetensors")).unwrap();
    let (before, after) = (weights(&source), weights(&out));
    let get = |w: &[(String, tch::Tensor)], name: &str| w.iter().find(|(n, _)| n == name).unwrap().1.copy();
    for name in ["pi_vf.0.weight", "pi_vf.0.bias"] {
        assert!(get(&before, name).equal(&get(&after, name)), "{name} frozen");
    }
    assert!(!get(&before, "pi_vf.1.weight").equal(&get(&after, "pi_vf.1.weight")), "the rest trained");
    // A layer the network does not have: refused before anything is written, listing the layers.
    let out = dir.join("bad");
    let o = flotilla(&[
        "train",
        &finetune,
        "--set",
        &from,
        "--set",
        "init.freeze=[\"torso\"]",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("no layer \"torso\"") && text(&o).contains("pi_vf.0"),
        "{}",
        text(&o)
    );
    assert!(!out.exists(), "nothing written");
}

/// `examples/configs/cartpole_distill.toml` end to end: a trained PPO teacher (9,220 parameters) distilled into
/// a 114-parameter student that solves CartPole, in one process and with actor processes; teachers that do
/// not exist or do not fit, and settings that cannot work, are refused before anything is written.
#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn a_small_student_distilled_from_a_trained_teacher_solves_cartpole() {
    let dir = scratch("cli", "distill");
    let teacher = dir.join("teacher");
    let t = teacher.to_str().unwrap();
    let o = flotilla(&["train", &config("cartpole_ppo.toml"), "--out", t]);
    assert!(o.status.success() && common::final_return(&o).is_some_and(|r| r >= 475.0), "teacher: {}", text(&o));
    let teachers = format!("algorithm.teachers=[{t:?}]");
    let distill = config("cartpole_distill.toml");
    for (name, extra) in [("student", &[][..]), ("student-actors", &["--actors", "2"][..])] {
        let out = dir.join(name);
        let mut args = vec!["train", &distill, "--set", &teachers, "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = flotilla(&args);
        assert!(text(&o).contains(&format!("teacher {t}: ppo on CartPole-v1, 9220 parameters")), "{}", text(&o));
        common::solved(&o, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The student's metrics: it agrees with the teacher's greedy action on nearly every state it trains on.
        let agreement = common::metric(&out, "distill/agreement");
        assert!(agreement.last().is_some_and(|a| *a > 0.9), "{name}: agreement {agreement:?}");
        let student = std::fs::metadata(out.join("model.safetensors")).unwrap().len();
        let big = std::fs::metadata(teacher.join("model.safetensors")).unwrap().len();
        assert!(student * 10 < big, "{name}: student {student} bytes, teacher {big}");
    }
    // Refused before anything is written, naming what is wrong.
    let bad = dir.join("bad");
    let refused = |sets: &[&str], extra: &[&str], needle: &str| {
        let mut args = vec!["train", &distill, "--out", bad.to_str().unwrap()];
        for s in sets {
            args.extend(["--set", s]);
        }
        args.extend_from_slice(extra);
        let o = flotilla(&args);
        assert!(!o.status.success() && text(&o).contains(needle), "{sets:?}: no {needle:?} in {}", text(&o));
        assert!(!bad.exists(), "{sets:?} wrote {}", bad.display());
    };
    let missing = dir.join("nowhere");
    let missing_set = format!("algorithm.teachers=[{:?}]", missing.to_str().unwrap());
    refused(&[&missing_set], &[], missing.to_str().unwrap());
    // A Pendulum teacher (3 observation floats, Gaussian actions) cannot teach a CartPole student.
    let pendulum = dir.join("pendulum");
    let p = pendulum.to_str().unwrap();
    let o = flotilla(&["train", &config("pendulum_ppo.toml"), "--out", p, "--stop-at", "512"]);
    assert!(o.status.success(), "{}", text(&o));
    refused(&[&format!("algorithm.teachers=[{p:?}]")], &[], "takes 3 observation floats");
    refused(&[&teachers, "algorithm.act_with=\"teacher\""], &["--actors", "2"], "act_with");
    refused(&[&teachers, "algorithm.loss=\"mse\"", "algorithm.temperature=0.5"], &[], "temperature");
    refused(&[&teachers, &format!("algorithm.teachers=[{t:?}, {t:?}]")], &[], "2 teachers");
}

/// `examples/configs/cartpole_multiteacher.toml`: three PPO teachers, each trained on its own CartPole physics
/// (one with the actions reversed), distilled into one student with a head per task; every task's final
/// evaluation keeps ≥ 90 % of its teacher's, in one process and with actor processes; per-task metrics columns;
/// teachers that do not match the tasks are refused before anything is written.
#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn three_teachers_distilled_into_one_student_keep_each_tasks_score() {
    let dir = scratch("cli", "multiteacher");
    let tasks = [("normal", vec![]), ("long", vec!["env.kwargs.length=1.5", "env.kwargs.masspole=0.3"])];
    let tasks = [&tasks[..], &[("reversed", vec!["env.kwargs.force_mag=-10.0"])]].concat();
    let mut teachers = Vec::new();
    let mut scores = Vec::new();
    for (name, sets) in &tasks {
        let run = dir.join(name);
        let mut args = vec!["train", &config("cartpole_ppo.toml")].into_iter().map(String::from).collect::<Vec<_>>();
        for s in sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        args.extend(["--out".into(), run.display().to_string()]);
        let o = flotilla(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let score = common::final_return(&o).unwrap_or_else(|| panic!("teacher {name}: {}", text(&o)));
        teachers.push(format!("{:?}", run.display().to_string()));
        scores.push(score);
    }
    let teachers = format!("algorithm.teachers=[{}]", teachers.join(", "));
    let cfg = config("cartpole_multiteacher.toml");
    for (label, extra) in [("student", &[][..]), ("student-actors", &["--actors", "2"][..])] {
        let out = dir.join(label);
        let mut args = vec!["train", &cfg, "--set", &teachers, "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = flotilla(&args);
        assert!(o.status.success(), "{label}: {}", text(&o));
        for ((name, _), teacher) in tasks.iter().zip(&scores) {
            let line =
                text(&o).lines().find(|l| l.starts_with(&format!("task {name}: evaluation return"))).map(String::from);
            let score: f64 = line
                .as_deref()
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{label}: no final evaluation of task {name}: {}", text(&o)));
            assert!(score >= 0.9 * teacher, "{label}: task {name} {score} against its teacher's {teacher}");
            let evals = common::metric(&out, &format!("eval/{name}/mean_return"));
            assert!(evals.len() >= 10, "{label}: eval/{name}/mean_return {evals:?}");
            let returns = common::metric(&out, &format!("charts/{name}/episodic_return"));
            assert!(!returns.is_empty(), "{label}: no charts/{name}/episodic_return");
        }
    }
    // Teachers must match the tasks, one each, and fit the student.
    let bad = dir.join("bad");
    let refused = |sets: &[&str], needle: &str| {
        let mut args = vec!["train", &cfg, "--out", bad.to_str().unwrap()];
        for s in sets {
            args.extend(["--set", s]);
        }
        let o = flotilla(&args);
        assert!(!o.status.success() && text(&o).contains(needle), "{sets:?}: no {needle:?} in {}", text(&o));
        assert!(!bad.exists(), "{sets:?} wrote {}", bad.display());
    };
    let two = format!("algorithm.teachers=[{:?}, {:?}]", dir.join("normal"), dir.join("long"));
    refused(&[&two], "2 teachers need 2 [[tasks]]");
    refused(&[&teachers, "env.num_envs=8"], "num_envs = 8 does not split evenly between 3 [[tasks]]");
}

/// `[[tasks]]` whose observation sizes differ (Acrobot's 6 floats, MountainCar's 2; both 3 actions): each task
/// gets an input layer of its own (`[env] task_inputs`, `auto` → `separate`), in one process and with actors,
/// evaluated per task; asking for one shared input layer is refused, naming the sizes and the way out.
#[test]
fn tasks_of_different_observation_sizes_get_an_input_layer_each() {
    let dir = scratch("cli", "task-inputs");
    let cfg = dir.join("tasks.toml");
    std::fs::write(
        &cfg,
        r#"
[run]
seed = 1
total_env_steps = 8192
[env]
id = "Acrobot-v1"
num_envs = 8
[[tasks]]
name = "acrobot"
[[tasks]]
name = "mountaincar"
id = "MountainCar-v0"
[algorithm]
kind = "ppo"
n_steps = 128
batch_size = 256
hidden_sizes = [32]
[eval]
episodes = 2
interval_steps = 4096
"#,
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    for (name, extra) in [("alone", &[][..]), ("actors", &["--actors", "2"][..])] {
        let run = dir.join(name);
        let mut args = vec!["train", cfg, "--out", run.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = flotilla(&args);
        assert!(o.status.success(), "{name}: {}", text(&o));
        for task in ["acrobot", "mountaincar"] {
            let evals = common::metric(&run, &format!("eval/{task}/mean_return"));
            // Both envs give -1 per step: a finished evaluation is a negative return, at most 500 / 200 steps.
            assert!(!evals.is_empty() && evals.iter().all(|r| (-500.0..0.0).contains(r)), "{name} {task}: {evals:?}");
        }
        // The policy's first layer takes 6 + 2 observation floats and the 2-task one-hot: 10 inputs.
        let w = tch::Tensor::read_safetensors(run.join("model.safetensors")).unwrap();
        let first = &w.iter().find(|(n, _)| n == "pi_vf.0.weight").unwrap().1;
        assert_eq!(first.size()[1], 10, "{name}: {:?}", first.size());
        let o = flotilla(&["eval", run.to_str().unwrap(), "--episodes", "1"]);
        assert!(o.status.success() && text(&o).contains("mountaincar"), "{name}: {}", text(&o));
    }
    let bad = dir.join("bad");
    let o = flotilla(&["train", cfg, "--set", "env.task_inputs=\"shared\"", "--out", bad.to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("has 2 observation floats") && text(&o).contains("separate"),
        "{}",
        text(&o)
    );
    assert!(!bad.exists(), "nothing written");
}

/// `examples/configs/pendulum_td3_multitask.toml`, shrunk (64-64 nets, 4 K random steps, 24 K env steps):
/// TD3 with an action head and Q heads per task learns Pendulum under both gravities in one run (each task's
/// final evaluation ≥ −250, the threshold BENCHMARKS.md uses for Pendulum; seed 1 ends at −108 / −118); the
/// actor's output layer holds one action per task; the same config runs with one task per actor process;
/// DDPG's heads without [[tasks]] are refused.
#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn td3_learns_two_gravities_with_a_head_per_task() {
    let dir = scratch("cli", "td3-heads");
    let cfg = config("pendulum_td3_multitask.toml");
    let small = [
        "run.torch_threads=1",
        "algorithm.hidden_sizes=[64,64]",
        "algorithm.learning_starts=4000",
        "run.total_env_steps=24000",
    ];
    let sets: Vec<&str> = small.iter().flat_map(|s| ["--set", s]).collect();
    let run = dir.join("run");
    let mut args = vec!["train", &cfg, "--out", run.to_str().unwrap()];
    args.extend(&sets);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    for task in ["g10", "g13"] {
        let line =
            text(&o).lines().find(|l| l.starts_with(&format!("task {task}: evaluation return"))).map(String::from);
        let score: Option<f64> = line.as_deref().and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert!(score.is_some_and(|s| s >= -250.0), "task {task}: {line:?}\n{}", text(&o));
    }
    let w = tch::Tensor::read_safetensors(run.join("model.safetensors")).unwrap();
    let out_layer = &w.iter().find(|(n, _)| n == "actor.2.weight").unwrap().1;
    assert_eq!(out_layer.size(), [64, 2], "a 1-D action head per task");
    let actors = dir.join("actors");
    let mut args = vec!["train", &cfg, "--actors", "2", "--out", actors.to_str().unwrap()];
    args.extend(&sets);
    // A budget of its own (not --stop-at, which ends a run without its last metrics row): each actor's
    // Pendulum episodes are 200 steps, so both tasks' episodes are in the rows by 12 K steps.
    args.extend(["--set", "run.total_env_steps=12000"]);
    args.extend(["--set", "actors.task_per_actor=true"]);
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    for task in ["g10", "g13"] {
        let returns = common::metric(&actors, &format!("charts/{task}/episodic_return"));
        assert!(!returns.is_empty(), "{task}: no episodes\n{}", text(&o));
    }
    let bad = dir.join("bad");
    let args =
        ["train", &config("pendulum_ddpg.toml"), "--set", "algorithm.task_heads=true", "--out", bad.to_str().unwrap()];
    let o = flotilla(&args);
    assert!(!o.status.success() && text(&o).contains("a head per task needs [[tasks]]"), "{}", text(&o));
    assert!(!bad.exists(), "nothing written");
}

/// `examples/configs/cartpole_multitask.toml`: one PPO network on three CartPole physics (one with the actions
/// reversed) ends with every task at ≥ 450, 90 % of the cap, with one head for all tasks and with a head per task (seed 1, in one process; the long pole ends at
/// 464–480 depending on the final evaluation's start states, BENCHMARKS.md "Shared torso"); the same config runs
/// with actor processes (each stepping every task, or each its own task with `[actors] task_per_actor`) and with
/// two data-parallel learners, writing per-task columns; envs or actors that do not split between the tasks are
/// refused.
#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn one_network_learns_three_tasks_at_once() {
    let dir = scratch("cli", "multitask");
    let cfg = config("cartpole_multitask.toml");
    let run = dir.join("run");
    let o = flotilla(&["train", &cfg, "--out", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for task in ["normal", "long", "reversed"] {
        let line =
            text(&o).lines().find(|l| l.starts_with(&format!("task {task}: evaluation return"))).map(String::from);
        let score: Option<f64> = line.as_deref().and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert!(score.is_some_and(|s| s >= 450.0), "task {task}: {line:?}\n{}", text(&o));
        assert!(!common::metric(&run, &format!("charts/{task}/episodic_return")).is_empty(), "{task}");
    }
    // A head per task on the shared torso (`task_heads`): every task ≥ 450 too, and the actors act with the
    // heads; the output layer holds 3 × 2 logits. Without [[tasks]] it is refused.
    let heads = dir.join("heads");
    let o = flotilla(&["train", &cfg, "--set", "algorithm.task_heads=true", "--out", heads.to_str().unwrap()]);
    for task in ["normal", "long", "reversed"] {
        let line =
            text(&o).lines().find(|l| l.starts_with(&format!("task {task}: evaluation return"))).map(String::from);
        let score: Option<f64> = line.as_deref().and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert!(score.is_some_and(|s| s >= 450.0), "task heads, task {task}: {line:?}\n{}", text(&o));
    }
    let w = tch::Tensor::read_safetensors(heads.join("model.safetensors")).unwrap();
    let out_layer = &w.iter().find(|(n, _)| n == "pi_vf.2.weight").unwrap().1;
    assert_eq!(out_layer.size(), [2, 64, 6], "3 heads of 2 logits (values: 3 of the 6 columns)");
    let heads_actors = dir.join("heads-actors");
    let o = flotilla(&[
        "train",
        &cfg,
        "--set",
        "algorithm.task_heads=true",
        "--actors",
        "2",
        "--stop-at",
        "30000",
        "--out",
        heads_actors.to_str().unwrap(),
    ]);
    assert!(o.status.success() && !common::metric(&heads_actors, "eval/long/mean_return").is_empty(), "{}", text(&o));
    let o = flotilla(&[
        "train",
        &config("cartpole_ppo.toml"),
        "--set",
        "algorithm.task_heads=true",
        "--out",
        dir.join("bad").to_str().unwrap(),
    ]);
    assert!(!o.status.success() && text(&o).contains("a head per task needs [[tasks]]"), "{}", text(&o));
    let actors = dir.join("actors");
    let o = flotilla(&["train", &cfg, "--actors", "2", "--stop-at", "60000", "--out", actors.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!common::metric(&actors, "eval/reversed/mean_return").is_empty(), "{}", text(&o));
    assert!(!common::metric(&actors, "charts/long/episodic_return").is_empty(), "{}", text(&o));
    // Two data-parallel learners: every learner's episodes count in rank 0's per-task columns.
    let group = dir.join("group");
    let args =
        ["train", &cfg, "--learners", "2", "--actors", "2", "--stop-at", "60000", "--out", group.to_str().unwrap()];
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    for task in ["normal", "long", "reversed"] {
        let returns = common::metric(&group, &format!("charts/{task}/episodic_return"));
        assert!(returns.iter().any(|r| *r > 0.0), "{task}: {returns:?}\n{}", text(&o));
    }
    let o = flotilla(&["train", &cfg, "--actors", "3", "--out", dir.join("bad").to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("8 envs per actor do not split evenly between 3 [[tasks]]"),
        "{}",
        text(&o)
    );
    // One task per actor: 3 actors, each stepping its own task's 8 envs (which 3 actors stepping every task
    // cannot, above); every task's episodes arrive and are evaluated.
    let assigned = dir.join("assigned");
    let per_actor = "actors.task_per_actor=true";
    let args =
        ["train", &cfg, "--actors", "3", "--set", per_actor, "--stop-at", "30000", "--out", assigned.to_str().unwrap()];
    let o = flotilla(&args);
    assert!(o.status.success(), "{}", text(&o));
    for task in ["normal", "long", "reversed"] {
        let returns = common::metric(&assigned, &format!("charts/{task}/episodic_return"));
        assert!(returns.iter().any(|r| *r > 0.0), "{task}: {returns:?}\n{}", text(&o));
        assert!(!common::metric(&assigned, &format!("eval/{task}/mean_return")).is_empty(), "{task}");
    }
    let o = flotilla(&["train", &cfg, "--actors", "2", "--set", per_actor, "--out", dir.join("bad").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("2 actors per learner do not split evenly"), "{}", text(&o));
}
