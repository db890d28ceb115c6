//! The same learner and actor code in one process: a [`DistributedLearner`] and two actor threads joined by
//! the in-process transport (`LocalClient`) train PPO on CartPole to an evaluation of 475, exactly as the
//! multi-process run does over gRPC (`tests/distributed.rs`); its checkpoint restores the learner exactly.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use flotilla_actors::{ActorFactory, ActorOptions, Connector, run_actor};
use flotilla_algorithms::{Acting, ActingSetup};
use flotilla_core::{Chunk, Gradient, Params};
use flotilla_envs::{EnvRole, VectorEnv, make_vector};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::distributed::DistributedLearner;
use flotilla_learner::train::{LogRow, TrainReport};
use flotilla_transport::local::LocalClient;
use flotilla_transport::{Ack, Code, LearnerClient, MessageKey, Registered, Registration, RpcError, RunInfo};

struct PpoActors {
    config: ExperimentConfig,
    envs_per_actor: usize,
}

impl ActorFactory for PpoActors {
    fn envs(&mut self, _run: &RunInfo, _slot: Option<u32>) -> flotilla_actors::Result<Box<dyn VectorEnv>> {
        Ok(make_vector("CartPole-v1", &Default::default(), self.envs_per_actor, EnvRole::Training)?)
    }

    fn acting(&mut self, _run: &RunInfo, r: &Registered, envs: &dyn VectorEnv) -> flotilla_actors::Result<Acting> {
        let setup = ActingSetup {
            observation_space: envs.observation_space(),
            action_space: envs.action_space(),
            n_envs: envs.num_envs(),
            seed: r.seed,
            epsilon_floor: 0.0,
            frozen: &[],
        };
        Ok(self.config.algorithm.build_acting(&setup)?)
    }
}

/// The tests here run one at a time: the learning test's asynchronous actors should not share the cores with
/// another test's learner.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A learner for `examples/configs/cartpole_ppo.toml` with `sets`, trained by `n` in-process actor threads.
fn train_in_process(n: usize, sets: &[&str]) -> (DistributedLearner, ExperimentConfig, TrainReport) {
    let (learner, config, report, _) = train_in_process_logged(n, sets);
    (learner, config, report)
}

/// [`train_in_process`], also returning the metrics rows.
fn train_in_process_logged(
    n: usize,
    sets: &[&str],
) -> (DistributedLearner, ExperimentConfig, TrainReport, Vec<LogRow>) {
    train_config_in_process("cartpole_ppo.toml", n, sets, None, None)
}

/// A client that loses the learner's answer to every `every`-th chunk (counted over all its actor's clients in
/// `sent`) after the learner took it: the call fails as a broken connection does, and the actor reconnects and
/// sends the chunk again.
struct LosesAnswers {
    inner: LocalClient<flotilla_learner::hub::Hub>,
    every: u64,
    sent: Arc<AtomicU64>,
}

impl LearnerClient for LosesAnswers {
    fn run_info(&mut self) -> Result<RunInfo, RpcError> {
        self.inner.run_info()
    }
    fn register(&mut self, registration: &Registration) -> Result<Registered, RpcError> {
        self.inner.register(registration)
    }
    fn send_chunk(&mut self, chunk: &Chunk, key: MessageKey) -> Result<Ack, RpcError> {
        let ack = self.inner.send_chunk(chunk, key)?;
        match self.sent.fetch_add(1, Ordering::SeqCst) % self.every == self.every - 1 {
            true => Err(RpcError::new(Code::Unavailable, "the connection broke before the answer came")),
            false => Ok(ack),
        }
    }
    fn send_gradient(&mut self, gradient: &Gradient, key: MessageKey) -> Result<Ack, RpcError> {
        self.inner.send_gradient(gradient, key)
    }
    fn params(&mut self, actor_id: u64, have: Option<u64>) -> Result<Option<Params>, RpcError> {
        self.inner.params(actor_id, have)
    }
}

/// A learner for `examples/configs/{config_name}` with `sets`, trained by `n` in-process actor threads,
/// writing checkpoints to `checkpoint` if given; with `lose_answers`, each actor loses the answer to every
/// that-many-th chunk it sends ([`LosesAnswers`]).
fn train_config_in_process(
    config_name: &str,
    n: usize,
    sets: &[&str],
    checkpoint: Option<&std::path::Path>,
    lose_answers: Option<u64>,
) -> (DistributedLearner, ExperimentConfig, TrainReport, Vec<LogRow>) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = format!("{}/../examples/configs/{config_name}", env!("CARGO_MANIFEST_DIR"));
    let mut overrides = vec![format!("actors.count={n}")];
    overrides.extend(sets.iter().map(|s| s.to_string()));
    let config = ExperimentConfig::load(path.as_ref(), &overrides).unwrap();
    let plan = config.plan(n).unwrap();
    let mut learner = DistributedLearner::new(&config, plan).unwrap();
    if let Some(path) = checkpoint {
        learner.checkpoint_to(path.to_path_buf());
    }
    let hub = learner.hub();
    let stop = Arc::new(AtomicBool::new(false));
    let actors: Vec<_> = (0..n as u32)
        .map(|i| {
            let hub = hub.clone();
            let mut factory = PpoActors { config: config.clone(), envs_per_actor: plan.envs_per_actor };
            let options =
                ActorOptions { actor_index: Some(i), reconnect_for: Duration::from_secs(5), stop: stop.clone() };
            std::thread::spawn(move || {
                let sent = Arc::new(AtomicU64::new(0));
                let connect: Connector = Box::new(move || {
                    let inner = LocalClient::new(hub.clone(), "token", "token")?;
                    Ok(match lose_answers {
                        Some(every) => Box::new(LosesAnswers { inner, every, sent: sent.clone() }),
                        None => Box::new(inner) as Box<dyn LearnerClient>,
                    })
                });
                run_actor(connect, &mut factory, &options)
            })
        })
        .collect();
    let mut rows = Vec::new();
    let report = learner
        .run(&AtomicBool::new(false), &mut |row| {
            rows.push(row.clone());
            Ok(())
        })
        .unwrap();
    let mut delivered = 0;
    for a in actors {
        let r = a.join().unwrap().unwrap();
        assert!(r.finished && r.sent > 0 && r.params_loaded > 1, "{r:?}");
        assert!(r.delivered_env_steps <= r.env_steps, "{r:?}");
        delivered += r.delivered_env_steps;
    }
    // Nothing delivered is lost: every env step the learner accepted was counted, or reported as untrained
    // (queued, waiting for a full batch, or held by the batch-assembly thread when the run ended).
    assert!(
        delivered == report.env_steps + report.untrained_env_steps,
        "actors delivered {delivered} env steps; the learner counted {} and left {} untrained",
        report.env_steps,
        report.untrained_env_steps
    );
    (learner, config, report, rows)
}

#[test]
#[cfg_attr(debug_assertions, ignore = "learning test: run with --release")]
fn in_process_actors_train_ppo_through_the_local_transport() {
    // Two asynchronous actors make every run different (the seed fixes the envs, not the interleaving): the
    // learning claim is that a run ends solved, checked on the first of seeds 1–3 that does (as the CLI's
    // distributed tests check 2 of 3); one run's evaluations can end at 500, 500, 422 on a loaded machine.
    let mut tries = Vec::new();
    let (mut learner, config, _) = (1..=3u64)
        .find_map(|seed| {
            let set = format!("run.seed={seed}");
            let (learner, config, report) = train_in_process(2, &[set.as_str()]);
            let evals: Vec<f64> = report.evals.iter().map(|e| e.result.mean()).collect();
            tries.push(evals);
            (report.final_eval().mean() >= 475.0).then_some((learner, config, report))
        })
        .unwrap_or_else(|| panic!("no seed ended solved; evaluations {tries:?}"));
    let plan = learner.plan();
    let hub = learner.hub();

    // A checkpoint restores the learner exactly: parameters (republished to actors as version 1 of the new run),
    // counters and evaluations.
    let path = std::env::temp_dir().join(format!("flotilla-local-ckpt-{}.safetensors", std::process::id()));
    learner.save_checkpoint(&path).unwrap();
    let mut resumed = DistributedLearner::resume(&config, plan, &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let flat = |l: &mut DistributedLearner| l.agent().policy_params().flat().detach().copy();
    assert!(flat(&mut resumed).equal(&flat(&mut learner)), "restored parameters differ");
    assert_eq!(resumed.hub().version(), 1);
    let (a, b) = (resumed.report(), learner.report());
    assert_eq!((a.env_steps, a.updates, a.gradient_steps), (b.env_steps, b.updates, b.gradient_steps));
    let means = |r: &flotilla_learner::train::TrainReport| r.evals.iter().map(|e| e.result.mean()).collect::<Vec<_>>();
    assert_eq!(means(&a), means(&b));

    // A client with the wrong token is refused on this carrier too.
    let mut wrong = LocalClient::new(hub, "token", "nope").unwrap();
    assert_eq!(wrong.run_info().unwrap_err().code, flotilla_transport::Code::Unauthenticated);
}

/// The batch-assembly thread (stacking and the device copy ahead of the update) changes when the work is done,
/// not what is trained: with one synchronous actor the data is the same either way, and so are the weights,
/// bit for bit, and the counters.
#[test]
fn assembling_ahead_trains_exactly_as_assembling_between_updates() {
    let sets = [
        "run.total_env_steps=4096",
        "run.torch_threads=1",
        "learner.synchronous=true",
        "eval.interval_steps=100000",
        "eval.episodes=1",
    ];
    let mut ahead = sets.to_vec();
    ahead.push("learner.assemble_ahead=on");
    let mut inline = sets.to_vec();
    inline.push("learner.assemble_ahead=off");
    let (mut a, _, ra) = train_in_process(1, &ahead);
    let (mut b, _, rb) = train_in_process(1, &inline);
    assert_eq!((ra.env_steps, ra.updates), (rb.env_steps, rb.updates));
    assert!(ra.updates >= 3, "{ra:?}");
    assert!(ra.assemble_secs > 0.0 && rb.assemble_secs > 0.0, "both time their batch assembly");
    let flat = |l: &mut DistributedLearner| l.agent().policy_params().flat().detach().copy();
    assert!(flat(&mut a).equal(&flat(&mut b)), "weights differ between assembling ahead and in line");
}

/// With `max_policy_lag = 0` and two actors collecting while the learner updates, the assembly thread refuses
/// chunks from older versions: they are counted as stale (and their env steps count toward the budget, so the
/// run ends), the batches trained on have lag 0, and there still are updates.
#[test]
fn the_assembly_thread_refuses_stale_chunks_and_counts_them() {
    let sets = [
        "run.total_env_steps=8192",
        "run.torch_threads=1",
        "learner.max_policy_lag=0",
        "learner.assemble_ahead=on",
        "eval.episodes=1",
    ];
    let (_, _, report, rows) = train_in_process_logged(2, &sets);
    let last = rows.last().expect("metrics rows");
    let stale = last.update.get("charts/stale_chunks").expect("stale column");
    assert!(stale > 0.0, "two asynchronous actors with max_policy_lag 0 left no stale chunk: {rows:?}");
    assert!(rows.iter().all(|r| r.update.get("charts/policy_lag_max").is_none_or(|lag| lag == 0.0)));
    assert!(report.env_steps >= 8192 && report.updates >= 1, "{report:?}");
}

/// An answer lost after the learner took a chunk (a connection broken at the wrong moment): the actor
/// reconnects and sends the chunk again with its idempotency key, and the learner answers it as delivered
/// without taking it twice — every env step the actors delivered is counted once (the account checked in
/// [`train_config_in_process`]: without the key the learner counted each resent chunk again).
#[test]
fn a_chunk_whose_answer_was_lost_is_sent_again_and_taken_once() {
    let sets = ["run.total_env_steps=8192", "run.torch_threads=1", "eval.episodes=1"];
    let (learner, _, report, _) = train_config_in_process("cartpole_ppo.toml", 2, &sets, None, Some(5));
    let again = learner.hub().metrics().duplicates.get();
    assert!(again > 0, "no chunk arrived twice: {report:?}");
    assert!(report.env_steps >= 8192, "{report:?}");
}

/// DQN's replay fed and sampled on the assembly thread (minibatches on the device ahead of the update) trains
/// exactly as in line: one actor acting uniformly at random (ε = 1, so the data does not depend on which
/// parameters it has) gives both learners the same chunks, and they end with the same weights, bit for bit,
/// and the same counters. Periodic checkpoints pause the thread and train on all it observed first; the agents'
/// whole states (replay, target network, optimiser, RNG, counters) are the same bytes either way.
#[test]
fn dqn_sampling_ahead_trains_exactly_as_sampling_between_updates() {
    let dir = std::env::temp_dir().join(format!("flotilla-dqn-ahead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sets = [
        "run.total_env_steps=4000",
        "run.torch_threads=1",
        "algorithm.prioritized_replay=false",
        "algorithm.learning_starts=500",
        "algorithm.batch_size=64",
        "algorithm.exploration_final_eps=1.0",
        "actors.epsilon=1.0",
        "checkpoint.interval_steps=1000",
        "eval.interval_steps=100000",
        "eval.episodes=1",
    ];
    let run = |mode: &str| {
        let mut with_mode = sets.to_vec();
        let set = format!("learner.assemble_ahead={mode}");
        with_mode.push(&set);
        let path = dir.join(format!("{mode}.safetensors"));
        let (mut learner, _, report, _) =
            train_config_in_process("cartpole_dqn_actors.toml", 1, &with_mode, Some(&path), None);
        assert!(path.is_file(), "no checkpoint written");
        let flat = learner.agent().policy_params().flat().detach().copy();
        let agent = dir.join(format!("{mode}-agent.safetensors"));
        learner.agent().checkpoint().unwrap().save(&agent).unwrap();
        (flat, report, std::fs::read(&agent).unwrap())
    };
    let (wa, ra, ca) = run("on");
    let (wb, rb, cb) = run("off");
    assert!(ra.gradient_steps > 1000, "{ra:?}");
    assert_eq!((ra.env_steps, ra.updates, ra.gradient_steps), (rb.env_steps, rb.updates, rb.gradient_steps));
    assert!(ra.assemble_secs > 0.0, "the assembly thread timed its work: {ra:?}");
    assert!(wa.equal(&wb), "weights differ between sampling ahead and in line");
    assert!(ca == cb, "the agents' states differ");
    std::fs::remove_dir_all(&dir).unwrap();

    // Prioritized replay cannot be sampled ahead: "on" is refused when the config is planned, naming why.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/cartpole_dqn_actors.toml");
    let config = ExperimentConfig::load(path.as_ref(), &["learner.assemble_ahead=on".to_string()]).unwrap();
    let e = config.plan(2).unwrap_err().to_string();
    assert!(e.contains("assemble_ahead") && e.contains("prioritized_replay"), "{e}");
}
