//! The distributed runtime with real processes over loopback: `flotilla train --actors N` and
//! `flotilla learner` + `flotilla actor`.
//!
//! * PPO and A3C with 4 actor processes end with a deterministic evaluation ≥ 475 on CartPole-v1 that holds
//!   over the last two evaluations (A3C with under 5 % of gradients too stale to apply); DQN with 4 actors
//!   reaches 475 within its budget but does not reliably hold it;
//! * `kill -9` of an actor mid-run: the launcher restarts it and the run still ends solved;
//! * MuJoCo through the Gymnasium bridge with 2 actor processes (SAC on Hopper, Walker2d and Ant; PPO with
//!   `[normalize]` on HalfCheetah): trains on the actors' chunks, broadcasts reach them, evaluates, saves;
//! * `--stop-at` writes a checkpoint and `train --resume` continues the run (metrics appended) to a solved end;
//!
//! Asynchronous actors make every run different, so each of those learning claims is checked on 2 of seeds 1–3
//! (the mechanics — restart, checkpoint, appended metrics — on every seed run).
//! * a wrong or missing token is refused with UNAUTHENTICATED; malformed chunks (wrong shapes, NaN, unknown
//!   actor, another protocol version) with INVALID_ARGUMENT naming the problem; well-formed chunks whose values
//!   lie outside the registered spaces (discrete actions 7, 0.5 or NaN for CartPole's Discrete(2), an
//!   observation outside its bounds or NaN) with INVALID_ARGUMENT naming the field and index, where accepting
//!   them would crash the learner's next update; mismatched env spaces at registration with a message naming
//!   both; and meanwhile a real actor keeps training, and the run ends solved (final evaluation ≥ 475).
//!
//! Learning runs are slow in unoptimised builds and are skipped there (CI runs `cargo test --release`).
//! The heavy tests take a lock so that only one multi-process run uses the CPUs at a time.
mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{config, final_return, metric, scratch, solved, text, two_of_three, watchdog};
use flotilla_core::{Chunk, ObsBuf, Space};
use flotilla_tests::hostile::{Dice, KINDS, cartpole_registration, chunk, hostile};
use flotilla_tests::procfs::learner_and_actors;
use flotilla_transport::grpc::{GrpcClient, Limits, send_raw_chunk};
use flotilla_transport::{Code, LearnerClient, MessageKey, codec};

static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Run to completion, killed after `limit`.
fn output_within(command: &mut Command, limit: Duration) -> Output {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("flotilla runs");
    let done = watchdog(child.id(), limit);
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    out
}

fn train_with_actors(config_name: &str, n: usize, name: &str, extra: &[&str]) -> (Output, PathBuf) {
    let run = scratch("dist", name).join("run");
    let mut args = vec!["train".to_string(), config(config_name), "--actors".into(), n.to_string()];
    args.extend(["--out".to_string(), run.to_str().unwrap().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = output_within(Command::new(env!("CARGO_BIN_EXE_flotilla")).args(&args), Duration::from_secs(240));
    (out, run)
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn ppo_with_four_actor_processes_solves_cartpole() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    two_of_three(|seed| {
        let (out, run) = train_with_actors("cartpole_ppo.toml", 4, &format!("ppo-{seed}"), &["--set", &seed_arg(seed)]);
        // The learner tracked policy lag and had 4 actors registered (whatever the learning outcome).
        let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap_or_else(|_| panic!("{}", text(&out)));
        let header = csv.lines().next().unwrap();
        assert!(header.contains("charts/policy_lag") && header.contains("charts/stale_chunks"), "{header}");
        solved(&out, &run)
    });
}

/// A recurrent (LSTM) policy with 2 actor processes: each actor keeps its envs' states and sends them with every
/// chunk, the hub accepts them (size and finiteness checked), and the learner trains on the re-run sequences
/// with V-trace to its budget, evaluates and saves (cartpole_masked_impala_lstm.toml, a few thousand steps).
#[test]
#[cfg_attr(debug_assertions, ignore = "multi-process runs: run with --release")]
fn a_recurrent_policy_trains_with_actor_processes() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut extra: Vec<&str> = Vec::new();
    for s in ["run.total_env_steps=4096", "eval.interval_steps=2048", "eval.episodes=2", "algorithm.n_epochs=2"] {
        extra.extend(["--set", s]);
    }
    let (out, run) = train_with_actors("cartpole_masked_impala_lstm.toml", 2, "recurrent", &extra);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains("refused a chunk"), "a chunk was refused: {all}");
    let done: Vec<&str> = all.lines().filter(|l| l.contains("actor done:")).collect();
    assert_eq!(done.len(), 2, "{all}");
    for line in done {
        assert!(!line.contains(" 0 messages delivered"), "an actor sent nothing: {line}");
    }
    assert!(*metric(&run, "env_steps").last().unwrap() >= 4096.0, "{all}");
    let evals = metric(&run, "eval/mean_return");
    assert!(evals.len() >= 2 && evals.iter().all(|r| r.is_finite()), "evaluations {evals:?}");
    assert!(run.join("model.safetensors").is_file(), "no saved policy");
}

/// MuJoCo through the Gymnasium bridge with actor processes: SAC on Hopper-v5, Walker2d-v5 and Ant-v5, and PPO
/// with observation and reward normalisation on HalfCheetah-v5, each with 2 actors (each embedding Python and
/// stepping its own MuJoCo env): the run trains to its budget on the actors' data (every actor sent chunks and
/// took parameter broadcasts), evaluates, and saves a policy. Mechanics only (a few thousand steps).
#[test]
#[cfg_attr(debug_assertions, ignore = "multi-process MuJoCo runs: run with --release")]
fn mujoco_envs_train_with_actor_processes() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sac = ["algorithm.learning_starts=500", "algorithm.hidden_sizes=[64, 64]", "algorithm.batch_size=64"];
    let ppo = ["algorithm.n_steps=256", "algorithm.n_epochs=2", "algorithm.hidden_sizes=[64, 64]"];
    for (env, kind, cfg, sets) in [
        ("Hopper-v5", "sac", "halfcheetah_sac.toml", &sac),
        ("Walker2d-v5", "sac", "halfcheetah_sac.toml", &sac),
        ("Ant-v5", "sac", "halfcheetah_sac.toml", &sac),
        ("HalfCheetah-v5", "ppo", "halfcheetah_ppo.toml", &ppo),
    ] {
        let id = format!("env.id=gymnasium:{env}");
        let mut extra: Vec<&str> = vec!["--set", &id];
        // 4,000 steps: the run must outlast the actors' start-up skew (each imports Gymnasium and MuJoCo into its
        // own Python; on a loaded machine one took seconds longer, and 2,000 steps ended before it sent a chunk).
        for s in sets.iter().chain(&[
            "run.total_env_steps=4000",
            "eval.interval_steps=2000",
            "eval.episodes=2",
            "run.torch_threads=1",
        ]) {
            extra.extend(["--set", s]);
        }
        let (out, run) = train_with_actors(cfg, 2, &format!("mujoco-{env}"), &extra);
        let all = text(&out);
        assert!(out.status.success(), "{env}: {all}");
        assert!(all.contains(&format!("trained gymnasium:{env} with {kind} and 2 actors")), "{env}: {all}");
        // Both actors streamed chunks and received parameter versions.
        let done: Vec<&str> = all.lines().filter(|l| l.contains("actor done:")).collect();
        assert_eq!(done.len(), 2, "{env}: {all}");
        for line in done {
            // "actor done: 94 messages delivered, 3008 env steps delivered, 3040 env steps collected,
            //  33 parameter versions, 0 reconnects"
            let number = |unit: &str| -> u64 {
                let field =
                    line.split([':', ',']).find(|p| p.trim_end().ends_with(unit)).unwrap_or_else(|| panic!("{line}"));
                field.split_whitespace().next().unwrap().parse().unwrap()
            };
            let delivered = number("env steps delivered");
            assert!(number("messages delivered") > 0 && delivered > 0, "{env}: an actor sent nothing: {line}");
            assert!(delivered <= number("env steps collected"), "{env}: {line}");
            assert!(number("parameter versions") > 1, "{env}: an actor never got new parameters: {line}");
        }
        assert!(*metric(&run, "env_steps").last().unwrap() >= 4000.0, "{env}: {all}");
        let evals = metric(&run, "eval/mean_return");
        assert!(evals.len() >= 2 && evals.iter().all(|r| r.is_finite()), "{env}: evaluations {evals:?}");
        assert!(run.join("model.safetensors").is_file(), "{env}: no saved policy");
    }
}

/// Evaluations reached 475 at some point within the budget (the run need not hold it there).
fn reached(out: &Output, run: &std::path::Path) -> Result<(), String> {
    if !out.status.success() {
        return Err(format!("the run failed:\n{}", text(out)));
    }
    let e = metric(run, "eval/mean_return");
    if e.iter().all(|r| *r < 475.0) {
        return Err(format!("never reached 475: evaluations {e:?}"));
    }
    Ok(())
}

/// `--set run.seed=SEED`.
fn seed_arg(seed: u64) -> String {
    format!("run.seed={seed}")
}

/// 2 of seeds 1–3 of `config_name` with 4 actors pass `check` (see [`two_of_three`]).
fn two_of_three_seeds(config_name: &str, check: fn(&Output, &std::path::Path) -> Result<(), String>) {
    two_of_three(|seed| {
        let name = format!("{config_name}-{seed}");
        let (out, run) = train_with_actors(config_name, 4, &name, &["--set", &seed_arg(seed)]);
        check(&out, &run)
    });
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn dqn_with_four_actor_processes_reaches_475() {
    // Reaching, not holding: DQN on CartPole forgets and relearns, and with actors it does not yet reliably end
    // at 475 (BENCHMARKS.md has the evaluations of each seed).
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    two_of_three_seeds("cartpole_dqn_actors.toml", reached);
}

/// Solved, and A3C's actors waited for their gradients to be applied: under 5 % of gradients were skipped as
/// staler than `max_policy_lag` (when actors kept collecting while a gradient was on the wire, 27 % were).
fn a3c_solved(out: &Output, run: &std::path::Path) -> Result<(), String> {
    solved(out, run)?;
    let last = |column| *metric(run, column).last().unwrap();
    let gradients = last("env_steps") / 40.0; // 8 envs × 5 steps per gradient
    let stale = last("charts/stale_chunks");
    if stale > 0.05 * gradients {
        return Err(format!("{stale} of ~{gradients} gradients were too stale to apply"));
    }
    Ok(())
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn a3c_with_four_actor_processes_solves_cartpole() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    two_of_three_seeds("cartpole_a3c.toml", a3c_solved);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn a_distributed_run_stops_with_a_checkpoint_and_resumes_to_the_end() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The stop, the checkpoint and the appended metrics are checked on every seed; ending solved on 2 of seeds
    // 1–3. Synchronous actors (no policy lag): this test is about resuming; learning with asynchronous actors
    // is the 4-actor test's claim (a CI run on a busy machine had two seeds here fall from 500 to ~300 and 450
    // with lagged chunks).
    two_of_three(|seed| {
        let (out, run) = train_with_actors(
            "cartpole_ppo.toml",
            2,
            &format!("resume-{seed}"),
            &["--stop-at", "20000", "--set", &seed_arg(seed), "--set", "learner.synchronous=true"],
        );
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("continue with: flotilla train --resume"),
            "{}",
            text(&out)
        );
        assert!(run.join("checkpoint.safetensors").is_file(), "no checkpoint after --stop-at");
        let before = metric(&run, "env_steps");
        let stopped_at = *before.last().unwrap();
        assert!((20_000.0..30_000.0).contains(&stopped_at), "stopped at {stopped_at}: {before:?}");

        let resumed = output_within(
            Command::new(env!("CARGO_BIN_EXE_flotilla")).args(["train", "--resume", run.to_str().unwrap()]),
            Duration::from_secs(240),
        );
        assert!(resumed.status.success(), "{}", text(&resumed));
        assert!(String::from_utf8_lossy(&resumed.stderr).contains("resuming"), "{}", text(&resumed));
        // The metrics file goes on from where the first part stopped, to the budget.
        let after = metric(&run, "env_steps");
        assert_eq!(after[..before.len()], before[..]);
        assert!(after.windows(2).all(|w| w[1] > w[0]), "env steps must keep rising: {after:?}");
        assert!(*after.last().unwrap() >= 100_000.0, "{after:?}");
        solved(&resumed, &run)
    });
}

/// A `flotilla actor` process in slot 0 joining the learner at `addr` with the test token, and its watchdog.
fn spawn_actor(addr: &str, extra: &[&str], stderr: Stdio) -> (Child, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let actor = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["actor", "--learner", addr, "--index", "0"])
        .args(extra)
        .env("FLOTILLA_TOKEN", "s3cret")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let watchdog = watchdog(actor.id(), Duration::from_secs(240));
    (actor, watchdog)
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn a_killed_actor_is_restarted_and_the_run_still_solves() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The restart and the clean exit are checked on every seed; ending solved on 2 of seeds 1–3.
    two_of_three(|seed| {
        let run = scratch("dist", &format!("kill-{seed}")).join("run");
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["train", &config("cartpole_ppo.toml"), "--actors", "4", "--out", run.to_str().unwrap()])
            .args(["--set", &seed_arg(seed)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let done = watchdog(child.id(), Duration::from_secs(240));
        // Collect stderr in the background; kill an actor once training is under way.
        let stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
        let started = Instant::now();
        let victim = loop {
            // The train process supervises a learner process and the actors.
            let kids = learner_and_actors(child.id()).1;
            if kids.len() == 4 && started.elapsed() > Duration::from_millis(1500) {
                break kids[1];
            }
            assert!(started.elapsed() < Duration::from_secs(60), "4 actors never started");
            std::thread::sleep(Duration::from_millis(50));
        };
        // SAFETY: kill(2) on a pid we just read; at worst it has exited and the call fails.
        assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
        let out = child.wait_with_output().unwrap();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let log = log.join().unwrap().join("\n");
        let out = Output { stderr: log.into_bytes(), ..out };
        assert!(text(&out).contains("restarted the actor in slot"), "no restart logged:\n{}", text(&out));
        // No actor outlives the run.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signal 0 only checks for existence.
        assert_ne!(unsafe { libc::kill(victim as i32, 0) }, 0, "the killed actor is gone");
        solved(&out, &run)
    });
}

/// A `flotilla learner` process and the address it listens on.
struct Learner {
    child: Child,
    _watchdog: std::sync::Arc<std::sync::atomic::AtomicBool>,
    addr: String,
    log: std::sync::mpsc::Receiver<String>,
}

impl Learner {
    fn start(extra: &[&str]) -> Learner {
        Self::start_in("learner", extra)
    }

    fn start_in(name: &str, extra: &[&str]) -> Learner {
        let run = scratch("dist", name).join("run");
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["learner", &config("cartpole_ppo.toml"), "--actors", "2", "--token", "s3cret"])
            .args(["--out", run.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let line = log.recv_timeout(deadline - Instant::now()).expect("the learner logs its address");
            if let Some(rest) = line.split("learner listening on ").nth(1) {
                break rest.split(':').take(2).collect::<Vec<_>>().join(":");
            }
        };
        Learner { _watchdog: watchdog(child.id(), Duration::from_secs(240)), child, addr, log }
    }

    fn client(&self, token: &str) -> GrpcClient {
        GrpcClient::connect(&self.addr, token, &Limits::default(), Duration::from_secs(5)).unwrap()
    }

    /// Wait for the run to end; its log, after checking it ended well with a final evaluation ≥ 475.
    fn wait_solved(mut self) -> String {
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
        let log = self.drain_log();
        assert!(out.status.success(), "{log}");
        let final_return = final_return(&Output { stderr: log.clone().into_bytes(), ..out }).unwrap_or(f64::NAN);
        assert!(final_return >= 475.0, "the run did not end solved: final evaluation {final_return}\n{log}");
        log
    }

    fn drain_log(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Learner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "multi-process run: run with --release")]
fn bad_tokens_and_malformed_chunks_are_refused_and_the_run_goes_on() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Two slots of 4 envs: a real actor process in slot 0, this test's fake actor in slot 1. The real one
    // alone fills the learner's batches, for the config's whole budget: the run must still end solved.
    let learner = Learner::start(&["--set", "eval.interval_steps=50000"]);
    let (actor, _actor_watchdog) = spawn_actor(&learner.addr, &[], Stdio::null());

    // Wrong and missing tokens: UNAUTHENTICATED, and a log line.
    let err = learner.client("wrong").run_info().unwrap_err();
    assert_eq!(err.code, Code::Unauthenticated, "{err}");
    let mut good = learner.client("s3cret");
    let run = good.run_info().unwrap();
    let err = send_raw_chunk(&mut good, codec::chunk_to_proto(&chunk(1, 4), 1, MessageKey::NONE), None).unwrap_err();
    assert_eq!(err.code, Code::Unauthenticated, "{err}");

    // Registration checks the spaces and names both.
    let mut wrong_space = cartpole_registration(&run.run_id, 4);
    wrong_space.observation_space = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
    let err = good.register(&wrong_space).unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition, "{err}");
    assert!(err.message.contains("differs from the learner's") && err.message.contains("[3]"), "{err}");
    let err = good.register(&cartpole_registration("another-run", 4)).unwrap_err();
    assert!(err.message.contains("another-run"), "{err}");

    // Malformed chunks from a registered (fake) actor: each refused with INVALID_ARGUMENT naming the problem.
    let mut slot1 = cartpole_registration(&run.run_id, 4);
    slot1.actor_index = Some(1);
    let me = good.register(&slot1).unwrap();
    let mut short = chunk(me.actor_id, 4);
    short.rewards.pop();
    let mut nan = chunk(me.actor_id, 4);
    nan.values[3] = f32::NAN;
    let mut shape = chunk(me.actor_id, 4);
    shape.obs = ObsBuf::F32(vec![0.0; 32 * 4 * 3]);
    shape.bootstrap_obs = ObsBuf::F32(vec![0.0; 4 * 3]);
    let mut ended = chunk(me.actor_id, 4);
    ended.terminated[5] = true;
    // Well-formed, but with values outside the spaces. Were it accepted, an action of 7 would reach libtorch's
    // gather in the next update and kill the learner.
    let with = |edit: fn(&mut Chunk)| {
        let mut c = chunk(me.actor_id, 4);
        edit(&mut c);
        c
    };
    let cases = [
        (short, "rewards: 508 bytes for shape [32, 4] of f32"),
        (nan, "behaviour values[3] is NaN"),
        (shape, "observations has 384 values, expected 512"),
        (ended, "final_index [] does not list the 1 steps"),
        (chunk(9999, 4), "unknown actor"),
        (with(|c| c.actions[7] = 7.0), "actions[7] is 7, outside Discrete(2) (expected an integer in 0..2)"),
        (with(|c| c.actions[3] = 0.5), "actions[3] is 0.5, not an integer index of Discrete(2)"),
        (with(|c| c.actions[0] = f32::NAN), "actions[0] is NaN, must be finite"),
        // Element 2 is the pole angle, within ±0.419 rad (twice the termination angle).
        (with(|c| c.obs = ObsBuf::F32([0.01, 0.0, 1.0, 0.0].repeat(32 * 4))), "observations[2] is 1, outside"),
        (
            with(|c| c.bootstrap_obs = ObsBuf::F32([0.01, f32::NAN, 0.01, 0.01].repeat(4))),
            "bootstrap observations[1] is NaN, must be finite",
        ),
    ];
    for (bad, expected) in cases {
        let err = good.send_chunk(&bad, MessageKey::NONE).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument, "{err}");
        assert!(err.message.contains(expected), "{err:?} should name {expected:?}");
    }
    let mut bytes = codec::chunk_to_proto(&chunk(me.actor_id, 4), 1, MessageKey::NONE);
    bytes.rewards.as_mut().unwrap().data.truncate(5);
    let err = send_raw_chunk(&mut good, bytes, Some("s3cret")).unwrap_err();
    assert!(err.message.contains("rewards: 5 bytes"), "{err}");
    let err =
        send_raw_chunk(&mut good, codec::chunk_to_proto(&chunk(me.actor_id, 4), 99, MessageKey::NONE), Some("s3cret"))
            .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("protocol version 99"), "{err}");

    // The real actor was unaffected: the run finishes, solved.
    let log = learner.wait_solved();
    assert!(log.contains("refused GetRunInfo") && log.contains("wrong run token"), "no auth log line:\n{log}");
    assert!(log.contains("refused a chunk from actor"), "no refusal log line:\n{log}");
    let mut actor = actor;
    let status = actor.wait().unwrap();
    assert!(status.success(), "the actor ends cleanly when the run is over: {status}");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "multi-process run: run with --release")]
fn an_actor_reconnects_to_a_restarted_learner() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A fixed port, so the restarted learner is where the actor looks.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let first = Learner::start_in("restart-1", &["--listen", &listen, "--set", "run.total_env_steps=10000000"]);
    let (actor, _actor_watchdog) = spawn_actor(&first.addr, &["--reconnect-secs", "60"], Stdio::piped());
    // Let the first run get going, then kill its learner outright.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !first.drain_log().contains("registered in slot 0") {
        assert!(Instant::now() < deadline, "the actor never registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(first); // SIGKILL
    std::thread::sleep(Duration::from_millis(700));
    // A new learner (a new run) on the same address: the actor rejoins it and the new run finishes.
    let mut second = Learner::start_in(
        "restart-2",
        &["--listen", &listen, "--set", "run.total_env_steps=20000", "--set", "eval.interval_steps=0"],
    );
    let out = std::mem::replace(&mut second.child, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
    let log = second.drain_log();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("evaluation return:"), "{log}");
    let actor = actor.wait_with_output().unwrap();
    let actor_log = String::from_utf8_lossy(&actor.stderr);
    assert!(actor.status.success(), "the actor ends cleanly with the second run:\n{actor_log}");
    assert!(actor_log.contains("re-registered after"), "{actor_log}");
    assert!(actor_log.contains("the learner restarted"), "{actor_log}");
}

/// A fuzzing client: 3,000 hostile messages from a registered foreign actor (every kind of [`hostile`], in a
/// seeded random order) and 200 connections of random bytes at the learner's port, while a real actor trains.
/// Every message is refused with INVALID_ARGUMENT (none accepted, none crashing anything); the fake actor is
/// disconnected after `max_refused_in_a_row` refusals, its connection closed (the next call reconnects), and it
/// re-registers; and the run still ends solved.
#[test]
#[cfg_attr(debug_assertions, ignore = "multi-process run: run with --release")]
fn a_fuzzing_client_cannot_take_the_learner_down() {
    use std::io::{Read, Write};
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let learner = Learner::start_in("fuzz", &["--set", "eval.interval_steps=50000"]);
    let (actor, _actor_watchdog) = spawn_actor(&learner.addr, &[], Stdio::null());
    let mut client = learner.client("s3cret");
    let run = client.run_info().unwrap();
    let mut slot1 = cartpole_registration(&run.run_id, 4);
    slot1.actor_index = Some(1);
    // A connection closed for refusals in a row is answered Unavailable once; the next call reconnects.
    let register = |client: &mut GrpcClient, cut: &mut usize| loop {
        match client.register(&slot1) {
            Ok(me) => break me,
            Err(e) if e.code == Code::Unavailable => *cut += 1,
            Err(e) => panic!("registration: {e}"),
        }
    };
    let (mut refused, mut disconnected, mut cut) = (0, 0, 0);
    let mut me = register(&mut client, &mut cut);
    let mut dice = Dice(2026);
    for i in 0..3000 {
        let kind = dice.below(KINDS);
        let result = match hostile(kind, me.actor_id, 4, &mut dice) {
            Ok(c) => client.send_chunk(&c, MessageKey::NONE),
            Err(p) => send_raw_chunk(&mut client, *p, Some("s3cret")),
        };
        let err = result.err().unwrap_or_else(|| panic!("message {i} (mutation {kind}) was accepted"));
        if err.code == Code::Unavailable {
            cut += 1;
            continue;
        }
        assert_eq!(err.code, Code::InvalidArgument, "message {i} (mutation {kind}): {err}");
        refused += 1;
        if err.message.contains("unknown actor") {
            // Disconnected for too many refusals in a row: come back, as a restarted actor would.
            disconnected += 1;
            me = register(&mut client, &mut cut);
        }
    }
    // Random bytes straight at the port: some as raw TCP, some after HTTP/2's connection preface.
    for i in 0..200 {
        let Ok(mut s) = std::net::TcpStream::connect(&learner.addr) else { panic!("connection {i} refused") };
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        if i % 2 == 0 {
            let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        }
        let len = 1 + dice.below(4096);
        let _ = s.write_all(&dice.bytes(len));
        let _ = s.read(&mut [0u8; 256]);
    }
    assert!(refused + cut >= 3000 && cut <= 2 * (refused / 20 + 1), "refused {refused}, cut off {cut} times");
    // 20 refusals in a row ([learner] max_refused_in_a_row), by the hub or at the wire, disconnect the actor
    // (the hub's) and close its connection (the transport's).
    assert!((10..=3000 / 20).contains(&disconnected), "disconnected {disconnected} times");
    // The learner still serves: run info answers. The last refusals may have closed this client's connection
    // (the transport closes it after the response; whether the next call finds it closed is a race), and a closed
    // connection answers Unavailable once, as in the loop above: then the next call reconnects.
    let info = match client.run_info() {
        Err(e) if e.code == Code::Unavailable => client.run_info(),
        other => other,
    };
    assert_eq!(info.unwrap().run_id, run.run_id);

    let log = learner.wait_solved();
    assert!(log.contains("disconnected actor") && log.contains("messages in a row refused"), "no disconnect logged");
    assert!(log.contains("closed the connection from") && log.contains("calls in a row refused"), "no close logged");
    let mut actor = actor;
    assert!(actor.wait().unwrap().success(), "the real actor ends cleanly when the run is over");
}
