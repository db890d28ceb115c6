//! `flotilla train CONFIG --actors N` supervises its learner: a learner killed with SIGKILL is restarted from the
//! run's last checkpoint while the same actor processes keep running and re-register, and metrics.csv goes on
//! without a duplicated env-steps row, the resumed segment marked; with `max_restarts = 0` the run gives up,
//! naming the checkpoint, and `--resume` finishes it.
mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{config, metric, scratch, text, two_of_three, watchdog};
use flotilla_tests::procfs::{children, learner_and_actors};

/// A supervised run writing its stdout and stderr to files in `dir` (a pipe nobody drains would stall it).
fn start(dir: &Path, args: &[&str]) -> Child {
    let file = |name: &str| Stdio::from(std::fs::File::create(dir.join(name)).unwrap());
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .expect("the flotilla binary runs")
}

/// Wait for `child` (bounded by a watchdog) and collect what it wrote.
fn finish(mut child: Child, dir: &Path, limit: Duration) -> Output {
    let done = watchdog(child.id(), limit);
    let status = child.wait().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    Output {
        status,
        stdout: std::fs::read(dir.join("stdout")).unwrap(),
        stderr: std::fs::read(dir.join("stderr")).unwrap(),
    }
}

/// Poll until `ready` holds, failing the test after `limit`.
fn wait_for<T>(what: &str, limit: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = ready() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start a run, wait for its first checkpoint and both actors, SIGKILL the learner: the killed learner's pid and
/// the actors' pids.
fn kill_learner_after_a_checkpoint(supervisor: u32, run: &Path) -> (u32, Vec<u32>) {
    wait_for("the first checkpoint", Duration::from_secs(120), || {
        run.join("checkpoint.safetensors").is_file().then_some(())
    });
    let (learner, actors) = wait_for("the learner and 2 actors", Duration::from_secs(30), || {
        let (learner, actors) = learner_and_actors(supervisor);
        Some((learner?, actors)).filter(|(_, a)| a.len() == 2)
    });
    // SAFETY: kill(2) on a process of this test's run.
    unsafe { libc::kill(learner as i32, libc::SIGKILL) };
    (learner, actors)
}

fn env_steps_strictly_increase(run: &Path) -> Result<(), String> {
    let steps = metric(run, "env_steps");
    if steps.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("env_steps not strictly increasing: {steps:?}"));
    }
    Ok(())
}

#[test]
fn a_killed_learner_is_restarted_from_its_checkpoint_and_the_actors_stay() {
    two_of_three(|seed| {
        let dir = scratch("restart", &format!("killed-{seed}"));
        let run = dir.join("run");
        let seed = format!("run.seed={seed}");
        let args = ["train", &config("cartpole_ppo.toml"), "--actors", "2", "--set", &seed, "--set"];
        let out_arg = run.display().to_string();
        let child = start(&dir, &[&args[..], &["checkpoint.interval_steps=10000", "--out", &out_arg]].concat());
        let supervisor = child.id();
        let (killed, actors) = kill_learner_after_a_checkpoint(supervisor, &run);
        // A new learner, beside the same actor processes.
        let (_, after) = wait_for("a restarted learner", Duration::from_secs(60), || {
            let (learner, actors) = learner_and_actors(supervisor);
            learner.filter(|l| *l != killed).map(|l| (l, actors))
        });
        let out = finish(child, &dir, Duration::from_secs(300));
        let log = text(&out);
        assert!(out.status.success(), "the run failed:\n{log}");
        assert_eq!(after, actors, "the actors were restarted:\n{log}");
        assert!(log.contains(&format!("the learner (pid {killed}) was killed by signal 9")), "{log}");
        assert!(log.contains("restarting the learner in"), "{log}");
        assert!(log.contains("learner restarts: 1)"), "{log}");
        env_steps_strictly_increase(&run)?;
        let resumed = metric(&run, "charts/resumed_at");
        assert_eq!(resumed.len(), 1, "one resumed segment, marked once: {resumed:?}");
        assert!(metric(&run, "charts/restarts").iter().all(|r| *r == 1.0));
        // The restart's latency (death to the new learner's first accepted data), recorded once.
        let latency = metric(&run, "charts/restart_secs");
        assert!(latency.len() == 1 && latency[0] > 0.0, "restart_secs: {latency:?}");
        assert!(log.contains("accepting actors' data again"), "{log}");
        // TensorBoard shows the same points: what the dead learner logged past its checkpoint is dropped by the
        // resumed segment's session start, as metrics.csv dropped those rows.
        common::check_events_match_csv(&run, "restarted");
        common::solved(&out, &run)
    });
}

#[test]
fn with_max_restarts_0_a_dead_learner_ends_the_run_and_resume_finishes_it() {
    let dir = scratch("restart", "give-up");
    let run = dir.join("run");
    let out_arg = run.display().to_string();
    let cfg = config("cartpole_ppo.toml");
    let args = ["train", &cfg, "--actors", "2", "--set", "checkpoint.interval_steps=10000"];
    let child = start(&dir, &[&args[..], &["--set", "learner.max_restarts=0", "--out", &out_arg]].concat());
    let supervisor = child.id();
    let (killed, _) = kill_learner_after_a_checkpoint(supervisor, &run);
    let out = finish(child, &dir, Duration::from_secs(120));
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "error: the learner (pid {killed}) was killed by signal 9; it was restarted 0 times ([learner] \
             max_restarts = 0), giving up"
        )),
        "{log}"
    );
    assert!(log.contains(&format!("flotilla train --resume {out_arg}")), "{log}");
    assert!(children(supervisor).is_empty());
    // The stopped run continues from its checkpoint to the end.
    let resumed = common::flotilla_within(&["train", "--resume", &out_arg], Duration::from_secs(300));
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(text(&resumed).contains("trained CartPole-v1 with ppo and 2 actors"), "{}", text(&resumed));
    env_steps_strictly_increase(&run).unwrap();
    assert_eq!(metric(&run, "charts/resumed_at").len(), 1, "the segment after the dead learner is marked");
    common::check_events_match_csv(&run, "resumed after giving up");
}
