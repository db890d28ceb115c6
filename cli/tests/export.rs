//! `flotilla export` and `flotilla act` end to end: tiny trained runs exported and rebuilt in PyTorch from the
//! file alone (`tests/python/export_check.py`, in the venv `scripts/setup_pytorch.sh` makes) act exactly as
//! `flotilla act` says; bad input is refused with a message that names it.
mod common;

use std::path::{Path, PathBuf};

use common::{config, flotilla, scratch, text};

/// The PyTorch venv's python, if `scripts/setup_pytorch.sh` has made it. Missing: a failure under CI (`CI`
/// set), else `None` after a loud message saying how to make it.
fn pytorch_python() -> Option<PathBuf> {
    let cache = std::env::var_os("FLOTILLA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/flotilla"));
    let venv = cache.join("pytorch-venv");
    let python = venv.join("bin/python");
    if python.is_file() && venv.join(".requirements-pytorch.txt").is_file() {
        return Some(python);
    }
    let message = format!(
        "no PyTorch venv at {}: run `bash scripts/setup_pytorch.sh` (scripts/test.sh does) to check exported \
         policies in PyTorch",
        venv.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{message}");
    eprintln!(
        "\n{}\nSKIPPED the PyTorch half of cli/tests/export.rs: {message}\n{}\n",
        "!".repeat(100),
        "!".repeat(100)
    );
    None
}

fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Train `config_name` with `overrides` into `dir/name`, and return the run directory.
fn train(dir: &Path, name: &str, config_name: &str, overrides: &[&str]) -> PathBuf {
    let run = dir.join(name);
    let mut args = vec!["train".to_string(), config(config_name), "--out".into(), run.display().to_string()];
    for o in overrides {
        args.extend(["--set".to_string(), o.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = flotilla(&args);
    assert!(out.status.success(), "{name}: {}", text(&out));
    run
}

const CARTPOLE_OBS: &str = "[[0.01, -0.02, 0.03, 0.04], [0.1, 0.5, -0.05, -0.6], [-0.2, -1.0, 0.1, 1.2], \
                            [1.5, 0.3, 0.2, -0.1], [-2.0, 1.5, -0.2, 0.8], [0.0, 0.0, 0.0, 0.0]]";
const PENDULUM_OBS: &str = "[[1.0, 0.0, 0.0], [0.6, 0.8, -3.0], [-0.7, 0.71, 5.5], [0.0, -1.0, 1.0], \
                            [-1.0, 0.0, -7.9], [0.28, -0.96, 0.3]]";
/// Masked CartPole (position, angle) for a recurrent policy: 5 steps of 3 rows, acted on in sequence.
const MASKED_SEQUENCE: &str = "[[[0.01, 0.03], [0.1, -0.05], [-0.2, 0.1]], [[0.02, 0.05], [0.12, -0.08], [-0.25, 0.12]], \
                               [[0.03, 0.08], [0.15, -0.1], [-0.3, 0.15]], [[0.02, 0.1], [0.2, -0.12], [-0.4, 0.2]], \
                               [[0.0, 0.13], [0.3, -0.15], [-0.5, 0.22]]]";

#[test]
fn exported_policies_act_in_pytorch_as_in_flotilla() {
    let dir = scratch("export", "pytorch");
    let (cartpole, pendulum) = (dir.join("cartpole.json"), dir.join("pendulum.json"));
    std::fs::write(&cartpole, CARTPOLE_OBS).unwrap();
    std::fs::write(&pendulum, PENDULUM_OBS).unwrap();
    let masked = dir.join("masked.json");
    std::fs::write(&masked, MASKED_SEQUENCE).unwrap();
    // Three steps of two 84×84 frames, 0–255.
    let frames = dir.join("frames.json");
    let pixel = |t: usize, r: usize, i: usize| (t * 7919 + r * 104_729 + i * 2_654_435_761) % 256;
    let seq: Vec<Vec<Vec<usize>>> =
        (0..3).map(|t| (0..2).map(|r| (0..84 * 84).map(|i| pixel(t, r, i)).collect()).collect()).collect();
    std::fs::write(&frames, serde_json::to_string(&seq).unwrap()).unwrap();
    // Three rows of 4 stacked 84×84 frames, 0–255 (a feed-forward CNN).
    let stacked = dir.join("stacked.json");
    let rows: Vec<Vec<usize>> = (0..3).map(|r| (0..4 * 84 * 84).map(|i| pixel(r, 1, i)).collect()).collect();
    std::fs::write(&stacked, serde_json::to_string(&rows).unwrap()).unwrap();
    let quick = ["metrics.log_interval_steps=1000", "eval.episodes=1"];
    // A Pong teacher of a few hundred steps, for the CNN student below.
    let teacher = train(
        &dir,
        "ppo-pong",
        "pong_ppo.toml",
        &[&quick[..], &["run.total_env_steps=256", "eval.interval_steps=256", "run.torch_threads=1"]].concat(),
    );
    let teachers = format!("algorithm.teachers=[{:?}]", teacher.display().to_string());
    let runs = [
        (
            train(
                &dir,
                "ppo",
                "cartpole_ppo.toml",
                &[&quick[..], &["run.total_env_steps=2048", "eval.interval_steps=2048"]].concat(),
            ),
            &cartpole,
        ),
        (
            train(
                &dir,
                "ppo-gauss",
                "pendulum_ppo.toml",
                &[&quick[..], &["run.total_env_steps=2048", "eval.interval_steps=2048"]].concat(),
            ),
            &pendulum,
        ),
        (
            train(
                &dir,
                "ppo-normalize",
                "pendulum_ppo.toml",
                &[&quick[..], &["run.total_env_steps=2048", "eval.interval_steps=2048", "normalize.obs=true"]].concat(),
            ),
            &pendulum,
        ),
        (
            train(
                &dir,
                "dqn",
                "cartpole_dqn.toml",
                &[
                    &quick[..],
                    &[
                        "run.total_env_steps=1500",
                        "algorithm.learning_starts=500",
                        "eval.interval_steps=1500",
                        "algorithm.dueling=true",
                    ],
                ]
                .concat(),
            ),
            &cartpole,
        ),
        // Recurrent: the LSTM with observation normalisation folded into `pre_layers`; a GRU without.
        (
            train(
                &dir,
                "ppo-lstm",
                "cartpole_masked_ppo_lstm.toml",
                &[&quick[..], &["run.total_env_steps=768", "eval.interval_steps=768"]].concat(),
            ),
            &masked,
        ),
        // Frames: a Nature-CNN torso in `pre_layers` before the LSTM (CleanRL's ppo_atari_lstm).
        (
            train(
                &dir,
                "ppo-lstm-pong",
                "pong_ppo_lstm.toml",
                // f32: the comparison is with PyTorch's f32 forward (bf16 acting would differ by its rounding).
                &[
                    &quick[..],
                    &[
                        "run.total_env_steps=1024",
                        "eval.interval_steps=1024",
                        "run.torch_threads=1",
                        "algorithm.cnn.bf16=false",
                    ],
                ]
                .concat(),
            ),
            &frames,
        ),
        // A CNN student (16/32/32 channels, fc 192) of that teacher, on stacked frames.
        (
            train(
                &dir,
                "distill-pong",
                "pong_distill_cnn.toml",
                &[
                    &quick[..],
                    &[
                        "run.total_env_steps=512",
                        "eval.interval_steps=512",
                        "run.torch_threads=1",
                        "algorithm.learning_starts=128",
                        "algorithm.buffer_size=1000",
                        "algorithm.cnn.bf16=false",
                        &teachers,
                    ],
                ]
                .concat(),
            ),
            &stacked,
        ),
        (
            train(
                &dir,
                "a2c-gru",
                "cartpole_a2c.toml",
                &[
                    &quick[..],
                    &[
                        "run.total_env_steps=800",
                        "eval.interval_steps=800",
                        "env.observe=[0, 2]",
                        "algorithm.recurrent=\"gru\"",
                        "algorithm.recurrent_hidden=16",
                    ],
                ]
                .concat(),
            ),
            &masked,
        ),
        (
            train(
                &dir,
                "qrdqn",
                "cartpole_qrdqn.toml",
                &[
                    &quick[..],
                    &["run.total_env_steps=1500", "algorithm.learning_starts=500", "eval.interval_steps=1500"],
                ]
                .concat(),
            ),
            &cartpole,
        ),
        (
            train(
                &dir,
                "td3",
                "pendulum_td3.toml",
                &[
                    &quick[..],
                    &[
                        "run.total_env_steps=400",
                        "algorithm.learning_starts=300",
                        "algorithm.hidden_sizes=[64, 64]",
                        "eval.interval_steps=400",
                    ],
                ]
                .concat(),
            ),
            &pendulum,
        ),
    ];
    let python = pytorch_python();
    for (run, obs) in &runs {
        let name = run.file_name().unwrap().to_string_lossy().into_owned();
        // model.safetensors describes itself.
        let (_, meta) = flotilla_algorithms::export::read_safetensors(&run.join("model.safetensors")).unwrap();
        assert_eq!(meta.get("flotilla_format_version").map(String::as_str), Some("1"), "{name}: {meta:?}");
        assert!(meta.contains_key("network") && meta.contains_key("action_space"), "{name}: {meta:?}");

        let policy = dir.join(format!("{name}.safetensors"));
        let out = flotilla(&["export", run.to_str().unwrap(), "--out", policy.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        let first = ["layers: [[\"Linear\"", "layers: [[\"Conv2d\""];
        assert!(first.iter().any(|l| String::from_utf8_lossy(&out.stdout).contains(l)), "{name}: {}", text(&out));
        let out = flotilla(&["act", run.to_str().unwrap(), "--obs", obs.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        let actions = dir.join(format!("{name}.actions.json"));
        std::fs::write(&actions, &out.stdout).unwrap();
        let Some(python) = &python else { continue };
        let check = std::process::Command::new(python)
            .args([repo("tests/python/export_check.py"), policy.display().to_string()])
            .args([obs.as_os_str(), actions.as_os_str()])
            .output()
            .unwrap();
        assert!(check.status.success(), "{name}: PyTorch disagrees with flotilla act:\n{}", text(&check));
        assert!(String::from_utf8_lossy(&check.stdout).contains("ok: "), "{name}: {}", text(&check));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn export_and_act_refuse_what_they_cannot_read() {
    let dir = scratch("export", "refusals");
    let missing = dir.join("nowhere");
    let out = flotilla(&["export", missing.to_str().unwrap(), "--out", dir.join("p.safetensors").to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("does not exist"), "{}", text(&out));
    // A directory without trained weights.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = flotilla(&["export", empty.to_str().unwrap(), "--out", dir.join("p.safetensors").to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("has no trained policy"), "{}", text(&out));
    assert!(text(&out).contains("model.safetensors is missing"), "{}", text(&out));
    let out = flotilla(&["act", empty.to_str().unwrap(), "--obs", "x.json"]);
    assert!(!out.status.success() && text(&out).contains("has no trained policy"), "{}", text(&out));

    let run = train(
        &dir,
        "ppo",
        "cartpole_ppo.toml",
        &["run.total_env_steps=256", "eval.interval_steps=256", "eval.episodes=1", "metrics.log_interval_steps=256"],
    );
    for (content, expected) in [
        ("[[0.1, 0.2, 0.3]]", "row 0 has 3 values; the run's observation space has 4"),
        ("[[0.1, 0.2, 0.3, 0.4], [1, 2, \"x\", 4]]", "row 1, value 2 (\"x\") is not a number"),
        ("[[0.1, 1e39, 0.3, 0.4]]", "row 0, value 1 (1e+39) is beyond f32's range"),
        ("{\"obs\": [0.1, 0.2, 0.3, 0.4]}", "expected a JSON array of observation rows"),
        ("[0.1, 0.2, 0.3, 0.4]", "row 0 is not an array"),
        ("[]", "no observation rows"),
        ("[[0.1, 0.2", "not JSON"),
    ] {
        let obs = dir.join("obs.json");
        std::fs::write(&obs, content).unwrap();
        let out = flotilla(&["act", run.to_str().unwrap(), "--obs", obs.to_str().unwrap()]);
        assert!(!out.status.success(), "{content}: {}", text(&out));
        assert!(text(&out).contains(expected) && text(&out).contains("obs.json"), "{content}: {}", text(&out));
    }
    let out = flotilla(&["act", run.to_str().unwrap(), "--obs", dir.join("none.json").to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("reading observations from"), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's "Taking a policy to PyTorch" shows exactly the lines the check runs.
#[test]
fn the_readme_shows_the_snippet_the_check_runs() {
    let script = std::fs::read_to_string(repo("tests/python/export_check.py")).unwrap();
    let start = script.find("# --- README snippet start ---\n").expect("start marker") + 31;
    let end = script.find("# --- README snippet end ---").expect("end marker");
    let snippet = &script[start..end];
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    assert!(readme.contains(snippet), "README.md must show tests/python/export_check.py's snippet:\n{snippet}");
}
