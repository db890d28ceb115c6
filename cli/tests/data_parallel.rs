//! `flotilla train CONFIG --learners L --actors N`: L data-parallel learner processes (gradients all-reduced on
//! libtorch's c10d over Gloo), each serving N/L actor processes, as real processes on loopback.
//!
//! * 2 learners × 2 actors solve CartPole with PPO on a 200 K-step schedule (as many updates as one learner's
//!   100 K): the final evaluation ≥ 475 and it holds over the last two evaluations (2 of seeds 1–3: asynchronous
//!   actors make every run different); only rank 0 writes the run directory, and its metrics count both
//!   learners' env steps;
//! * the same with local SGD (`average_every = 1`: the learners average parameters after each PPO update
//!   instead of all-reducing every gradient), on a 200 K-step schedule;
//! * `kill -9` of learner 1 mid-run: learner 0 fails naming the lost rank (not a hang), the launcher restarts
//!   the group from the last checkpoint, and the run still ends solved;
//! * bad data-parallel settings fail before anything starts, each with a message naming the setting: actors
//!   that do not split evenly, `accumulate = 0`, an unknown compression, NCCL without CUDA, an algorithm that
//!   cannot be spread, `learners` that disagree with the launcher's `WORLD_SIZE` or no launcher at all.
//!
//! Learning runs are skipped in unoptimised builds (CI runs `cargo test --release`).
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{config, flotilla, metric, scratch, solved, text, two_of_three, watchdog};
use flotilla_tests::procfs::children;

static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `flotilla train CONFIG --learners 2 --actors 4 --out RUN ARGS…`, started with stdout and stderr piped.
fn start_group(run: &Path, seed: u64, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["train", &config("cartpole_ppo.toml"), "--learners", "2", "--actors", "4"])
        .args(["--out", run.to_str().unwrap(), "--set", &format!("run.seed={seed}")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for `child` (within `limit`) with its stderr read line by line into `lines` meanwhile.
fn finish(child: std::process::Child, log: std::thread::JoinHandle<Vec<String>>, done: &AtomicBool) -> Output {
    let out = child.wait_with_output().unwrap();
    done.store(true, Ordering::SeqCst);
    Output { stderr: log.join().unwrap().join("\n").into_bytes(), ..out }
}

/// A whole group run of CartPole PPO (2 learners × 2 actors, seed `seed`, `extra` settings), checked: both
/// learners joined, rank 0's metrics count both learners' env steps (≥ `budget`), and it ends solved.
fn group_solves(name: &str, seed: u64, extra: &[&str], budget: f64) -> Result<(), String> {
    let run = scratch("dp", &format!("{name}-{seed}")).join("run");
    let mut child = start_group(&run, seed, extra);
    let done = watchdog(child.id(), Duration::from_secs(300));
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect());
    let out = finish(child, log, &done);
    let all = text(&out);
    for rank in 0..2 {
        assert!(all.contains(&format!("learner {rank} of 2 joined")), "learner {rank} never joined:\n{all}");
    }
    assert!(all.contains("2 learners and 4 actors"), "{all}");
    // Rank 0 alone wrote the run directory; its env-step count is both learners' (≥ the budget).
    let steps = metric(&run, "env_steps");
    assert!(steps.last().is_some_and(|s| *s >= budget), "env_steps {steps:?}");
    solved(&out, &run)
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn two_learners_with_two_actors_each_solve_cartpole() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // DDP semantics: each learner takes the config's batch, so 2 learners make half as many PPO updates per env
    // step as one. On the quick start's 100 K steps a CI run (2 cores, 7 processes) had seeds 1 and 3 still
    // climbing at 466 and 462 when the annealed learning rate ran out; 200 K steps give the group as many
    // updates as one learner takes in 100 K.
    two_of_three(|seed| group_solves("solve", seed, &["--set", "run.total_env_steps=200000"], 200_000.0));
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn two_learners_averaging_parameters_every_update_solve_cartpole() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Local SGD: each learner takes its own 20 epochs of optimiser steps per PPO update, then the two average.
    // Looser than a per-step all-reduce, it needs a longer schedule (seeds 1–3 reach 475 at 30–100 K env steps
    // of 200 K, against 30–60 K of 100 K synchronously).
    let sets = ["--set", "learner.average_every=1", "--set", "run.total_env_steps=200000"];
    two_of_three(|seed| group_solves("local-sgd", seed, &sets, 200_000.0));
}

/// The pid of the process among `parent`'s children whose environment has `RANK=rank`.
fn rank_pid(parent: u32, rank: usize) -> Option<u32> {
    let want = format!("RANK={rank}");
    children(parent).into_iter().find(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
    })
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn a_killed_learner_restarts_the_group_from_its_checkpoint_and_the_run_still_solves() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The failure, the restart and the resumed metrics are checked on every seed; ending solved on 2 of 1–3.
    // A 150 K-step schedule: a CI run on 2 cores (6 processes) once had two of three restarted 100 K runs touch
    // 480–490 and not yet hold there when the annealed learning rate ran out; uninterrupted runs solve by 60 K.
    two_of_three(|seed| {
        let run = scratch("dp", &format!("kill-{seed}")).join("run");
        let sets = [
            "--set",
            "checkpoint.interval_steps=20000",
            "--set",
            "learner.collective_timeout_secs=30",
            "--set",
            "run.total_env_steps=150000",
        ];
        let mut child = start_group(&run, seed, &sets);
        let done = watchdog(child.id(), Duration::from_secs(300));
        let stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect());
        // Once the first checkpoint is on disk, kill learner 1.
        let started = Instant::now();
        let checkpoint: PathBuf = run.join("checkpoint.safetensors");
        while !checkpoint.is_file() {
            assert!(started.elapsed() < Duration::from_secs(120), "no checkpoint within 120 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let victim = rank_pid(child.id(), 1).expect("learner 1 is running");
        // SAFETY: kill(2) on a pid we just read from /proc.
        assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
        let killed_at = Instant::now();
        let out = finish(child, log, &done);
        let all = text(&out);
        assert!(all.contains("learner 1 (pid") && all.contains("killed by signal 9"), "the loss is not named:\n{all}");
        assert!(all.contains("restarting the group from"), "no restart:\n{all}");
        assert!(all.contains("lost rank 1") || all.contains("learner 0 (pid"), "learner 0 did not fail:\n{all}");
        assert!(killed_at.elapsed() < Duration::from_secs(200), "{:?} after the kill", killed_at.elapsed());
        // The resumed run appended to rank 0's metrics: env steps never go backwards past the checkpoint's.
        let steps = metric(&run, "env_steps");
        assert!(steps.windows(2).filter(|w| w[1] < w[0]).count() <= 1, "env_steps {steps:?}");
        solved(&out, &run)
    });
}

#[test]
fn bad_data_parallel_settings_fail_before_anything_starts() {
    let dir = scratch("dp", "bad");
    let cfg = config("cartpole_ppo.toml");
    let out_dir = dir.join("run");
    let out = out_dir.to_str().unwrap();
    let fails = |args: &[&str], env: &[(&str, &str)], needle: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_flotilla")).args(args).envs(env.iter().copied()).output().unwrap();
        assert!(!o.status.success(), "{args:?} succeeded:\n{}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: no {needle:?} in:\n{}", text(&o));
        assert!(!out_dir.exists(), "{args:?} wrote {out}");
    };
    let group = ["train", &cfg, "--learners", "2", "--out", out];
    fails(&[&group[..], &["--actors", "3"]].concat(), &[], "does not split evenly");
    fails(&[&group[..], &["--actors", "4", "--set", "learner.accumulate=0"]].concat(), &[], "accumulate = 0");
    fails(&[&group[..], &["--actors", "4", "--set", "learner.compression=\"zip\""]].concat(), &[], "zip");
    fails(&[&group[..], &["--actors", "4", "--set", "learner.backend=\"nccl\""]].concat(), &[], "needs CUDA");
    let both = ["--actors", "4", "--set", "learner.average_every=2", "--set", "learner.compression=\"bf16\""];
    fails(&[&group[..], &both].concat(), &[], "set one of them");
    // A3C's learner applies actors' gradients as a parameter server: nothing to spread.
    let a3c = config("cartpole_a3c.toml");
    fails(&["train", &a3c, "--learners", "2", "--actors", "2", "--out", out], &[], "a3c");
    // A learner started by hand (or by torchrun) must agree with its launcher.
    let one = ["train", &cfg, "--actors", "2", "--out", out, "--set", "learner.learners=2"];
    fails(&one, &[], "MASTER_ADDR");
    let alone = ["train", &cfg, "--out", out, "--set", "learner.average_every=2"];
    fails(&alone, &[], "averaging parameters needs learners > 1");
    let env = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511"), ("RANK", "0"), ("WORLD_SIZE", "3")];
    fails(&one, &env, "WORLD_SIZE = 3");
    let env = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511"), ("RANK", "5"), ("WORLD_SIZE", "2")];
    fails(&one, &env, "RANK");
    // Sanity: the same command line without the bad part is accepted as far as its config goes.
    let o = flotilla(&["train", &cfg, "--set", "learner.accumulate=2", "--stop-at", "1", "--out", out]);
    assert!(o.status.success(), "{}", text(&o));
}
