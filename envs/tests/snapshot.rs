//! Snapshots for exact resume: an env (or `VecEnv`) restored into a fresh, unseeded instance continues bit for
//! bit — observations, rewards, flags, auto-reset noise and episode statistics — and survives JSON; snapshots
//! of another id, count or layout are refused without changing anything.

use flotilla_core::{Action, Env, EnvSnapshot, Error, Space};
use flotilla_envs::{
    CartPole, EpisodeStats, Kwargs, MountainCarContinuous, VecActions, VecEnv, VecEnvSnapshot, make, registered,
};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Steps before the snapshot (0: right after the seeded reset) and after it.
const BEFORE: [usize; 3] = [0, 1, 300];
const AFTER: usize = 1200;

/// One action of a seeded random stream; Box actions reach 1.5 times the bounds, to exercise clipping.
#[derive(Debug, Clone)]
enum OwnedAction {
    Discrete(i64),
    Continuous(Vec<f32>),
}

impl OwnedAction {
    fn as_action(&self) -> Action<'_> {
        match self {
            OwnedAction::Discrete(a) => Action::Discrete(*a),
            OwnedAction::Continuous(a) => Action::Continuous(a),
        }
    }
}

fn random_actions(space: &Space, count: usize, seed: u64) -> Vec<OwnedAction> {
    let mut rng = Pcg64::seed_from_u64(seed);
    (0..count)
        .map(|_| match space {
            Space::Discrete { n, start } => OwnedAction::Discrete(start + rng.random_range(0..*n as i64)),
            Space::Box { low, high, .. } => OwnedAction::Continuous(
                low.iter()
                    .zip(high)
                    .map(|(l, h)| (l + h) / 2.0 + 1.5 * (h - l) / 2.0 * (2.0 * rng.random::<f32>() - 1.0))
                    .collect(),
            ),
        })
        .collect()
}

/// Everything a single env reports, as bits: per step the observation, reward and flags, and after each
/// finished episode the observation of the `reset(None)` that follows.
#[derive(Debug, PartialEq)]
enum Event {
    Step { obs: Vec<u32>, reward: u64, terminated: bool, truncated: bool },
    Reset { obs: Vec<u32> },
}

/// Default arguments, but `Latency-v0` steps without waiting: thousands of 1 ms steps would take seconds,
/// and its waiting is tested next to it.
fn without_latency(id: &str) -> Kwargs {
    match id {
        "Latency-v0" => Kwargs::new().with("step_latency_us", 0i64),
        _ => Kwargs::new(),
    }
}

fn bits(obs: &flotilla_core::Obs) -> Vec<u32> {
    obs.as_f32().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Steps `env` through `actions`, resetting (continuing the stream) whenever an episode ends.
fn run(env: &mut dyn Env, actions: &[OwnedAction]) -> Vec<Event> {
    let mut events = vec![];
    for action in actions {
        let step = env.step(action.as_action()).unwrap();
        let done = step.terminated || step.truncated;
        events.push(Event::Step {
            obs: bits(&step.obs),
            reward: step.reward.to_bits(),
            terminated: step.terminated,
            truncated: step.truncated,
        });
        if done {
            events.push(Event::Reset { obs: bits(&env.reset(None).unwrap().0) });
        }
    }
    events
}

/// `value` through JSON text and through `serde_json::Value` (the path checkpoints take), checked equal.
fn json_round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) -> T {
    let text = serde_json::to_string(value).unwrap();
    let parsed: T = serde_json::from_str(&text).unwrap();
    assert_eq!(&parsed, value, "through JSON text");
    let through_value: T = serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap();
    assert_eq!(&through_value, value, "through serde_json::Value");
    parsed
}

#[test]
fn every_env_resumes_bit_for_bit_from_a_snapshot() {
    for spec in registered() {
        for (j, &before) in BEFORE.iter().enumerate() {
            let mut env = make(spec.id, &without_latency(spec.id)).unwrap();
            let actions = random_actions(env.action_space(), before + AFTER, 7 + j as u64);
            env.reset(Some(11)).unwrap();
            run(env.as_mut(), &actions[..before]);
            let snapshot = json_round_trip(&env.snapshot().unwrap());

            let mut resumed = make(spec.id, &without_latency(spec.id)).unwrap();
            resumed.restore(&snapshot).unwrap();
            assert_eq!(resumed.snapshot().unwrap(), snapshot, "{}: a restored env snapshots the same", spec.id);
            let expected = run(env.as_mut(), &actions[before..]);
            let got = run(resumed.as_mut(), &actions[before..]);
            assert_eq!(got, expected, "{} resumed after {before} steps", spec.id);
            let resets = expected.iter().filter(|e| matches!(e, Event::Reset { .. })).count();
            assert!(resets >= 1, "{}: the {AFTER} steps after the snapshot should include a reset", spec.id);

            let state = |e: &dyn Env| e.state().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(state(resumed.as_ref()), state(env.as_ref()), "{}: final state", spec.id);
            for _ in 0..3 {
                assert_eq!(bits(&resumed.reset(None).unwrap().0), bits(&env.reset(None).unwrap().0), "{}", spec.id);
            }
        }
    }
}

#[test]
fn a_snapshot_before_the_first_reset_restores_an_env_that_needs_one() {
    for spec in registered() {
        let fresh = make(spec.id, &Kwargs::new()).unwrap().snapshot().unwrap();
        assert_eq!(fresh.inner.as_ref().unwrap().state, None, "{}", spec.id);
        let mut env = make(spec.id, &Kwargs::new()).unwrap();
        env.reset(Some(3)).unwrap();
        env.restore(&json_round_trip(&fresh)).unwrap();
        let action = random_actions(env.action_space(), 1, 0).remove(0);
        assert_eq!(env.step(action.as_action()).unwrap_err(), Error::ResetNeeded { env: spec.id.into() });
        assert!(env.state().is_err(), "{}", spec.id);
    }
}

#[test]
fn cartpole_keeps_counting_steps_beyond_termination() {
    let mut env = CartPole::default();
    env.reset(Some(5)).unwrap();
    while !env.step(Action::Discrete(1)).unwrap().terminated {}
    assert_eq!(env.steps_beyond_terminated(), Some(0));
    let snapshot = json_round_trip(&env.snapshot().unwrap());
    assert_eq!((snapshot.counters.as_slice(), snapshot.flags.as_slice()), (&[0][..], &[true][..]));

    let mut resumed = CartPole::default();
    resumed.restore(&snapshot).unwrap();
    assert_eq!(resumed.steps_beyond_terminated(), Some(0));
    for _ in 0..3 {
        let (a, b) = (env.step(Action::Discrete(1)).unwrap(), resumed.step(Action::Discrete(1)).unwrap());
        assert_eq!(b, a);
        // A second step past termination earns 0, not the 1 of the terminating step.
        assert_eq!(b.reward, 0.0);
    }
    assert_eq!(resumed.steps_beyond_terminated(), Some(3));
}

#[test]
fn mountain_car_continuous_keeps_the_precision_of_its_state() {
    let mut env = MountainCarContinuous::default();
    env.reset(Some(2)).unwrap();
    assert_eq!(env.snapshot().unwrap().flags, [false]);
    env.step(Action::Continuous(&[0.7])).unwrap();
    let snapshot = env.snapshot().unwrap();
    assert_eq!(snapshot.flags, [true]);
    let mut resumed = MountainCarContinuous::default();
    resumed.restore(&snapshot).unwrap();
    for t in 0..200 {
        let action = [((t % 7) as f32 - 3.0) * 0.4];
        assert_eq!(resumed.step(Action::Continuous(&action)), env.step(Action::Continuous(&action)), "step {t}");
    }
}

/// The `InvalidSnapshot` detail of `result`.
fn refusal(result: Result<(), Error>, env: &str) -> String {
    match result {
        Err(Error::InvalidSnapshot { env: refused_by, detail }) => {
            assert_eq!(refused_by, env);
            detail
        }
        other => panic!("expected InvalidSnapshot from {env}, got {other:?}"),
    }
}

#[test]
fn snapshots_of_another_id_or_layout_are_refused_and_change_nothing() {
    let mut cartpole = make("CartPole-v1", &Kwargs::new()).unwrap();
    cartpole.reset(Some(0)).unwrap();
    let snapshot = cartpole.snapshot().unwrap();

    let mut pendulum = make("Pendulum-v1", &Kwargs::new()).unwrap();
    pendulum.reset(Some(1)).unwrap();
    let before = pendulum.snapshot().unwrap();
    let detail = refusal(pendulum.restore(&snapshot), "Pendulum-v1");
    assert!(detail.contains("CartPole-v1"), "{detail}");
    assert_eq!(pendulum.snapshot().unwrap(), before);

    // A wrapped (TimeLimit) snapshot into a bare env, and a bare one into a TimeLimit.
    let mut bare = CartPole::default();
    assert!(refusal(bare.restore(&snapshot), "CartPole-v1").contains("wraps"));
    let inner = snapshot.inner.as_deref().unwrap();
    assert!(refusal(cartpole.restore(inner), "CartPole-v1").contains("no wrapped snapshot"));

    // Damaged snapshots: the wrapped env's part is checked before the elapsed count changes.
    let elapsed_before = cartpole.snapshot().unwrap();
    let mut wrong_state = snapshot.clone();
    wrong_state.counters = vec![123];
    wrong_state.inner.as_mut().unwrap().state = Some(vec![0.0; 3]);
    assert!(refusal(cartpole.restore(&wrong_state), "CartPole-v1").contains("3 elements, expected 4"));
    let mut wrong_rng = snapshot.clone();
    wrong_rng.inner.as_mut().unwrap().rng = Some("{}".into());
    assert!(refusal(cartpole.restore(&wrong_rng), "CartPole-v1").contains("RNG stream"));
    let mut wrong_counters = snapshot.clone();
    wrong_counters.inner.as_mut().unwrap().counters.clear();
    assert!(refusal(cartpole.restore(&wrong_counters), "CartPole-v1").contains("0 counters and 1 flags"));
    assert_eq!(cartpole.snapshot().unwrap(), elapsed_before);
}

/// Everything a `VecEnv` step reports, as bits, including kept final observations and finished episodes.
#[derive(Debug, PartialEq)]
struct VecEvent {
    obs: Vec<u32>,
    rewards: Vec<u32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    final_obs: Vec<Option<Vec<u32>>>,
    episodes: Vec<(usize, u64, usize, bool)>,
}

/// One step's actions for a batch of envs.
#[derive(Debug, Clone)]
enum Batch {
    Discrete(Vec<i64>),
    Continuous(Vec<f32>),
}

fn batch_actions(space: &Space, n: usize, steps: usize, seed: u64) -> Vec<Batch> {
    let singles = random_actions(space, n * steps, seed);
    let batch = |chunk: &[OwnedAction]| match space {
        Space::Discrete { .. } => {
            Batch::Discrete(chunk.iter().map(|a| if let OwnedAction::Discrete(x) = a { *x } else { 0 }).collect())
        }
        Space::Box { .. } => Batch::Continuous(
            chunk.iter().flat_map(|a| if let OwnedAction::Continuous(x) = a { x.clone() } else { vec![] }).collect(),
        ),
    };
    singles.chunks_exact(n).map(batch).collect()
}

fn run_vec(venv: &mut VecEnv, actions: &[Batch]) -> Vec<VecEvent> {
    let n = venv.num_envs();
    let to_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut events = vec![];
    for batch in actions {
        let step = venv
            .step(&match batch {
                Batch::Discrete(a) => VecActions::Discrete(a),
                Batch::Continuous(a) => VecActions::Continuous(a),
            })
            .unwrap();
        events.push(VecEvent {
            obs: to_bits(step.obs.as_f32().unwrap()),
            rewards: to_bits(step.rewards),
            terminated: step.terminated.to_vec(),
            truncated: step.truncated.to_vec(),
            final_obs: (0..n).map(|i| step.final_obs(i).map(|o| to_bits(o.as_f32().unwrap()))).collect(),
            episodes: (step.episodes.iter())
                .map(|e: &EpisodeStats| (e.env_index, e.episode_return.to_bits(), e.length as usize, e.truncated))
                .collect(),
        });
    }
    events
}

#[test]
fn a_vec_env_resumes_bit_for_bit_with_its_episode_statistics() {
    let n = 4;
    for spec in registered() {
        let mut venv = VecEnv::make(spec.id, &without_latency(spec.id), n).unwrap();
        assert_eq!(venv.snapshot().unwrap_err(), Error::ResetNeeded { env: spec.id.into() });
        let before = 300;
        let actions = batch_actions(venv.action_space(), n, before + AFTER, 21);
        venv.reset(Some(9)).unwrap();
        run_vec(&mut venv, &actions[..before]);
        let snapshot = json_round_trip(&venv.snapshot().unwrap());

        let mut resumed = VecEnv::make(spec.id, &without_latency(spec.id), n).unwrap();
        resumed.restore(&snapshot).unwrap();
        assert_eq!(resumed.obs(), venv.obs());
        let expected = run_vec(&mut venv, &actions[before..]);
        let got = run_vec(&mut resumed, &actions[before..]);
        assert!(expected.iter().any(|e| !e.episodes.is_empty()), "{}: episodes end after the snapshot", spec.id);
        assert_eq!(got, expected, "{}", spec.id);
        assert_eq!(resumed.snapshot().unwrap(), venv.snapshot().unwrap(), "{}", spec.id);
        let reset =
            |v: &mut VecEnv| v.reset(None).unwrap().as_f32().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(reset(&mut resumed), reset(&mut venv), "{}: later resets", spec.id);
    }
}

#[test]
fn a_vec_env_refuses_another_id_or_count_and_rolls_back_a_partial_restore() {
    let mut venv = VecEnv::make("CartPole-v1", &Kwargs::new(), 4).unwrap();
    venv.reset(Some(0)).unwrap();
    let before: VecEnvSnapshot = venv.snapshot().unwrap();

    let mut three = VecEnv::make("CartPole-v1", &Kwargs::new(), 3).unwrap();
    three.reset(Some(1)).unwrap();
    assert!(refusal(venv.restore(&three.snapshot().unwrap()), "CartPole-v1").contains("3 envs"));
    let mut other = VecEnv::make("Acrobot-v1", &Kwargs::new(), 4).unwrap();
    other.reset(Some(1)).unwrap();
    let other = other.snapshot().unwrap();
    assert!(refusal(venv.restore(&other), "CartPole-v1").contains("Acrobot-v1"));
    let mut short = before.clone();
    short.obs.pop();
    assert!(refusal(venv.restore(&short), "CartPole-v1").contains("15 observations, expected 16"));

    // Envs 0 and 1 take their part, env 2 refuses its (another id): 0 and 1 are put back.
    let mut target = VecEnv::make("CartPole-v1", &Kwargs::new(), 4).unwrap();
    target.reset(Some(77)).unwrap();
    let mut mixed = target.snapshot().unwrap();
    mixed.envs[2] = other.envs[0].clone();
    let detail = refusal(venv.restore(&mixed), "CartPole-v1");
    assert!(detail.starts_with("env 2 of the batch") && detail.contains("Acrobot-v1"), "{detail}");
    assert_eq!(venv.snapshot().unwrap(), before);
    let step = venv.step(&VecActions::Discrete(&[0, 1, 0, 1])).unwrap();
    assert_eq!(step.obs.len(), 16);
}

#[test]
fn a_restored_vec_env_reads_as_after_a_reset_until_it_steps() {
    let mut venv = VecEnv::make("CartPole-v1", &Kwargs::new(), 2).unwrap();
    venv.reset(Some(4)).unwrap();
    for _ in 0..40 {
        venv.step(&VecActions::Discrete(&[1, 1])).unwrap();
    }
    let snapshot = venv.snapshot().unwrap();
    let mut resumed = VecEnv::make("CartPole-v1", &Kwargs::new(), 2).unwrap();
    resumed.restore(&snapshot).unwrap();
    assert_eq!(resumed.rewards(), [0.0, 0.0]);
    assert_eq!((resumed.terminated(), resumed.truncated()), (&[false, false][..], &[false, false][..]));
    assert!(resumed.episodes().is_empty() && resumed.final_obs(0).is_none());
}

#[test]
fn env_snapshots_carry_their_id_and_layout() {
    let mut env = make("Acrobot-v1", &Kwargs::new()).unwrap();
    env.reset(Some(8)).unwrap();
    for _ in 0..5 {
        env.step(Action::Discrete(2)).unwrap();
    }
    let snapshot: EnvSnapshot = env.snapshot().unwrap();
    assert_eq!((snapshot.id.as_str(), snapshot.counters.as_slice()), ("Acrobot-v1", &[5u64][..]));
    let inner = snapshot.inner.as_deref().unwrap();
    assert_eq!(inner.state.as_deref(), Some(env.state().unwrap().as_slice()));
    assert!(inner.counters.is_empty() && inner.flags.is_empty() && inner.rng.is_some() && inner.inner.is_none());
}
