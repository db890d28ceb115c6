//! Exact resume, across processes: for every algorithm, training T env steps in one go gives the same
//! weights, bit for bit, as training to S < T with `--stop-at`, then `flotilla train --resume` in a fresh
//! process (CPU, one torch thread). The stop points fall mid-rollout / between training phases, so the
//! checkpoint must carry rollouts, replay contents, n-step queues, optimiser moments, target networks, RNG
//! streams, env states and counters.
mod common;

use std::path::Path;
use std::process::Output;

use common::{config, flotilla, text};

fn ok(out: Output) -> String {
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    text
}

/// Train `cfg` with `sets` to its budget in one process and, separately, to `stop_at` then resumed; returns
/// what the resumed process printed.
fn check_resume(label: &str, cfg: &str, sets: &[&str], stop_at: u64) -> String {
    let dir = std::env::temp_dir().join(format!("flotilla-resume-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (one, two) = (dir.join("one_go"), dir.join("resumed"));
    let mut args: Vec<String> = vec!["train".into(), config(cfg)];
    for s in sets.iter().chain(&["run.device=cpu", "run.torch_threads=1"]) {
        args.extend(["--set".into(), s.to_string()]);
    }
    let with_out = |out: &Path, extra: &[String]| {
        let mut a = args.clone();
        a.extend(["--out".into(), out.display().to_string()]);
        a.extend(extra.iter().cloned());
        a
    };
    let run = |a: Vec<String>| flotilla(&a.iter().map(String::as_str).collect::<Vec<_>>());
    ok(run(with_out(&one, &[])));
    let stopped = ok(run(with_out(&two, &["--stop-at".into(), stop_at.to_string()])));
    assert!(stopped.contains(&format!("stopped at {stop_at} of")), "{label}: {stopped}");
    let resumed = ok(flotilla(&["train", "--resume", two.to_str().unwrap()]));
    let a = std::fs::read(one.join("model.safetensors")).unwrap();
    let b = std::fs::read(two.join("model.safetensors")).unwrap();
    assert!(a == b, "{label}: resumed weights differ from the uninterrupted run");
    std::fs::remove_dir_all(&dir).unwrap();
    resumed
}

/// PPO on Atari Pong (ale-py's vector env, which cannot save its games): the resume replays the recorded
/// actions from the run's seed, so the envs, and with them the weights, continue bit for bit. The stop falls
/// mid-rollout (125 of 128 steps).
#[test]
fn ppo_on_pong_resumes_exactly_by_replaying_the_envs() {
    let sets =
        ["run.total_env_steps=2048", "eval.interval_steps=100000", "eval.episodes=1", "metrics.log_interval_steps=512"];
    let resumed = check_resume("ppo-pong", "pong_ppo.toml", &sets, 1000);
    assert!(resumed.contains("replayed 1000 env steps"), "{resumed}");
}

/// The same with a CNN torso before an LSTM (`pong_ppo_lstm.toml`): the replayed envs and the checkpointed
/// recurrent states (each env's, and the partial rollout's initial ones) continue the run bit for bit.
#[test]
fn recurrent_ppo_on_pong_resumes_exactly_by_replaying_the_envs() {
    let sets = [
        "run.total_env_steps=2048",
        "eval.interval_steps=100000",
        "eval.episodes=1",
        "metrics.log_interval_steps=512",
        "run.torch_threads=1",
    ];
    let resumed = check_resume("ppo-lstm-pong", "pong_ppo_lstm.toml", &sets, 1000);
    assert!(resumed.contains("replayed 1000 env steps"), "{resumed}");
}

#[test]
fn ppo_resumes_exactly_mid_rollout() {
    let _ = check_resume("ppo", "cartpole_ppo.toml", &["run.total_env_steps=2048", "eval.interval_steps=1024"], 1000);
}

/// Recurrent PPO (LSTM) on masked CartPole: the checkpoint carries each env's recurrent state and the partly
/// filled rollout's initial states; the stop falls mid-rollout.
#[test]
fn recurrent_ppo_resumes_exactly_mid_rollout() {
    let sets = ["run.total_env_steps=1536", "eval.interval_steps=768"];
    let _ = check_resume("ppo-lstm", "cartpole_masked_ppo_lstm.toml", &sets, 1000);
}

/// Recurrent A2C (GRU) on masked CartPole, stopped mid-rollout.
#[test]
fn recurrent_a2c_resumes_exactly_mid_rollout() {
    let sets = [
        "run.total_env_steps=1200",
        "eval.interval_steps=600",
        "algorithm.recurrent=\"gru\"",
        "algorithm.recurrent_hidden=16",
        "env.observe=[0, 2]",
    ];
    let _ = check_resume("a2c-gru", "cartpole_a2c.toml", &sets, 608);
}

#[test]
fn dqn_resumes_exactly_with_prioritized_n_step_replay() {
    let sets = [
        "run.total_env_steps=3000",
        "algorithm.learning_starts=500",
        "algorithm.prioritized_replay=true",
        "algorithm.n_step=3",
        "algorithm.double_q=true",
        "algorithm.dueling=true",
        "eval.interval_steps=1000",
    ];
    let _ = check_resume("dqn", "cartpole_dqn.toml", &sets, 1777);
}

#[test]
fn a2c_resumes_exactly_mid_rollout() {
    let _ = check_resume("a2c", "cartpole_a2c.toml", &["run.total_env_steps=4000", "eval.interval_steps=2000"], 1208);
}

#[test]
fn td3_resumes_exactly_with_delayed_updates() {
    let sets = ["run.total_env_steps=1200", "algorithm.learning_starts=300", "eval.interval_steps=600"];
    let _ = check_resume("td3", "pendulum_td3.toml", &sets, 777);
}

#[test]
fn ddpg_resumes_exactly_with_ou_noise() {
    let sets = [
        "run.total_env_steps=1200",
        "algorithm.learning_starts=300",
        "algorithm.noise_type=ornstein_uhlenbeck",
        "eval.interval_steps=600",
    ];
    let _ = check_resume("ddpg", "pendulum_ddpg.toml", &sets, 701);
}

#[test]
fn sac_resumes_exactly_with_its_learnt_entropy_coefficient() {
    let sets = ["run.total_env_steps=1200", "algorithm.hidden_sizes=[64, 64]", "eval.interval_steps=600"];
    let _ = check_resume("sac", "pendulum_sac.toml", &sets, 777);
}

/// MuJoCo through the Gymnasium bridge (a smoke run of a few thousand steps): SAC trains on HalfCheetah-v5,
/// evaluates, and resumes exactly by replaying the envs (Python envs cannot save their state).
#[test]
fn sac_on_halfcheetah_trains_evaluates_and_resumes_exactly() {
    let sets = [
        "run.total_env_steps=2500",
        "algorithm.learning_starts=1000",
        "algorithm.hidden_sizes=[64, 64]",
        "eval.interval_steps=2500",
        "eval.episodes=1",
    ];
    let resumed = check_resume("sac-halfcheetah", "halfcheetah_sac.toml", &sets, 1777);
    assert!(resumed.contains("replayed 1777 env steps"), "{resumed}");
    assert!(resumed.contains("evaluation return:"), "{resumed}");
}

/// The other MuJoCo tasks people start with, through the same bridge: SAC trains, evaluates and resumes exactly
/// on Hopper-v5 and Walker2d-v5 (episodes that end when the robot falls: terminations and resets are replayed
/// too) and Ant-v5 (105-wide observations).
#[test]
fn sac_on_hopper_walker_and_ant_trains_evaluates_and_resumes_exactly() {
    for (name, id) in [("hopper", "Hopper-v5"), ("walker2d", "Walker2d-v5"), ("ant", "Ant-v5")] {
        let env = format!("env.id=\"gymnasium:{id}\"");
        let sets = [
            env.as_str(),
            "run.total_env_steps=1500",
            "algorithm.learning_starts=500",
            "algorithm.hidden_sizes=[32, 32]",
            "eval.interval_steps=1500",
            "eval.episodes=1",
        ];
        let resumed = check_resume(&format!("sac-{name}"), "halfcheetah_sac.toml", &sets, 900);
        assert!(resumed.contains("replayed 900 env steps"), "{id}: {resumed}");
        assert!(resumed.contains("evaluation return:"), "{id}: {resumed}");
    }
}

/// `[normalize]` (observation and reward statistics, each env's discounted return) continues bit for bit: PPO on
/// MuJoCo's HalfCheetah-v5, stopped mid-rollout.
#[test]
fn ppo_with_normalisation_on_halfcheetah_resumes_exactly() {
    let sets = ["run.total_env_steps=2048", "eval.interval_steps=2048", "eval.episodes=1", "algorithm.n_epochs=2"];
    let resumed = check_resume("ppo-normalize", "halfcheetah_ppo.toml", &sets, 1300);
    assert!(resumed.contains("replayed 1300 env steps"), "{resumed}");
}

/// Distillation: the student's parameters, Adam moments, labelled replay and both RNGs are checkpointed; the
/// teacher is not (the resumed process reloads it from the run directory named in the config).
#[test]
fn distill_resumes_exactly_with_its_labelled_replay() {
    let dir = common::scratch("resume", "teacher");
    let teacher = dir.join("teacher");
    let o = flotilla(&["train", &config("cartpole_ppo.toml"), "--out", teacher.to_str().unwrap(), "--stop-at", "2048"]);
    assert!(o.status.success(), "{}", text(&o));
    let teachers = format!("algorithm.teachers=[{:?}]", teacher.to_str().unwrap());
    let sets = [teachers.as_str(), "run.total_env_steps=3000", "eval.interval_steps=1000"];
    let resumed = check_resume("distill", "cartpole_distill.toml", &sets, 1232);
    assert!(resumed.contains(&format!("teacher {}: ppo on CartPole-v1", teacher.display())), "{resumed}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `[[tasks]]` run (multi-teacher distillation over three CartPole physics): every task's envs are in the
/// checkpoint, so the resumed run continues bit for bit.
#[test]
fn a_multi_task_run_resumes_exactly() {
    let dir = common::scratch("resume", "task-teachers");
    let mut teachers = Vec::new();
    for (name, sets) in
        [("a", "env.kwargs.length=0.5"), ("b", "env.kwargs.length=1.5"), ("c", "env.kwargs.force_mag=-10.0")]
    {
        let run = dir.join(name);
        let o = flotilla(&[
            "train",
            &config("cartpole_ppo.toml"),
            "--set",
            sets,
            "--out",
            run.to_str().unwrap(),
            "--stop-at",
            "1024",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        teachers.push(format!("{:?}", run.to_str().unwrap()));
    }
    let teachers = format!("algorithm.teachers=[{}]", teachers.join(", "));
    let sets = [teachers.as_str(), "run.total_env_steps=3000", "eval.interval_steps=1200"];
    let resumed = check_resume("tasks", "cartpole_multiteacher.toml", &sets, 1500);
    assert!(resumed.contains("task reversed: evaluation return"), "{resumed}");
    std::fs::remove_dir_all(&dir).unwrap();
}
