//! `make`, `registered` and kwargs: ids, time limits, argument checking, and that arguments reach the
//! dynamics.

use flotilla_core::{Action, Env, Error};
use flotilla_envs::{CartPole, CartPoleConfig, KwargValue, Kwargs, make, make_buffered, registered, spec};

#[test]
fn registrations_match_gymnasium() {
    let got: Vec<_> = registered().iter().map(|s| (s.id, s.max_episode_steps, s.reward_threshold)).collect();
    assert_eq!(
        got,
        [
            ("CartPole-v1", Some(500), Some(475.0)),
            ("MountainCar-v0", Some(200), Some(-110.0)),
            ("MountainCarContinuous-v0", Some(999), Some(90.0)),
            ("Pendulum-v1", Some(200), None),
            ("Acrobot-v1", Some(500), Some(-100.0)),
            ("Latency-v0", Some(500), Some(475.0)),
        ]
    );
    for s in registered() {
        let env = make(s.id, &Kwargs::new()).unwrap();
        assert_eq!(env.max_episode_steps(), s.max_episode_steps, "{}", s.id);
        assert_eq!(make_buffered(s.id, &Kwargs::new()).unwrap().max_episode_steps(), s.max_episode_steps);
    }
}

#[test]
fn unknown_id_lists_known_ids() {
    let err = make("CartPole-v0", &Kwargs::new()).err().expect("unknown id");
    let Error::UnknownEnv { id, known } = &err else { panic!("{err:?}") };
    assert_eq!(id, "CartPole-v0");
    for s in registered() {
        assert!(known.contains(s.id), "{known}");
    }
    assert!(matches!(spec("nope"), Err(Error::UnknownEnv { .. })));
}

#[test]
fn unknown_key_names_key_and_env() {
    let err = make("Pendulum-v1", &Kwargs::new().with("gravity", 9.81)).err().expect("unknown key");
    assert_eq!(
        err,
        Error::BadArgument {
            env: "Pendulum-v1".into(),
            key: "gravity".into(),
            detail: "unknown argument; Pendulum-v1 accepts: g, max_episode_steps".into()
        }
    );
    let err = make("Acrobot-v1", &Kwargs::new().with("book_or_nips", "nips")).err().expect("no kwargs");
    assert!(matches!(&err, Error::BadArgument { key, .. } if key == "book_or_nips"), "{err}");
}

#[test]
fn wrong_types_and_values_are_bad_arguments() {
    let cases = [
        ("Pendulum-v1", "g", KwargValue::Bool(true)),
        ("Pendulum-v1", "g", KwargValue::Str("9.81".into())),
        ("Pendulum-v1", "g", KwargValue::Float(f64::NAN)),
        ("CartPole-v1", "sutton_barto_reward", KwargValue::Int(1)),
        ("CartPole-v1", "masscart", KwargValue::Float(-1.0)),
        ("CartPole-v1", "tau", KwargValue::Float(0.0)),
        ("MountainCar-v0", "goal_velocity", KwargValue::Str("fast".into())),
        ("MountainCarContinuous-v0", "goal_velocity", KwargValue::Float(f64::INFINITY)),
        ("CartPole-v1", "max_episode_steps", KwargValue::Int(0)),
        ("CartPole-v1", "max_episode_steps", KwargValue::Int(-2)),
        ("CartPole-v1", "max_episode_steps", KwargValue::Float(100.0)),
    ];
    for (id, key, value) in cases {
        let err = make(id, &Kwargs::new().with(key, value.clone())).err().expect("bad argument");
        match &err {
            Error::BadArgument { env, key: k, detail } => {
                assert_eq!((env.as_str(), k.as_str()), (id, key), "{err}");
                assert!(!detail.is_empty());
            }
            other => panic!("{id} {key}={value}: {other:?}"),
        }
    }
    // An integer is fine where a float is expected, as in Python.
    assert!(make("Pendulum-v1", &Kwargs::new().with("g", 10i64)).is_ok());
}

#[test]
fn max_episode_steps_overrides_the_limit() {
    let mut env = make("CartPole-v1", &Kwargs::new().with("max_episode_steps", 3i64)).unwrap();
    assert_eq!(env.max_episode_steps(), Some(3));
    env.reset(Some(0)).unwrap();
    let flags: Vec<bool> = (0..3).map(|t| env.step(Action::Discrete(t % 2)).unwrap().truncated).collect();
    assert_eq!(flags, [false, false, true]);
    let env = make("Pendulum-v1", &Kwargs::new().with("max_episode_steps", -1i64)).unwrap();
    assert_eq!(env.max_episode_steps(), None, "-1 removes the time limit, as in gym.make");
}

/// Observation after one step from `state` with `action`.
fn one_step(env: &mut dyn Env, state: &[f64], action: Action<'_>) -> Vec<f32> {
    env.reset(Some(0)).unwrap();
    env.set_state(state).unwrap();
    env.step(action).unwrap().obs.as_f32().unwrap().to_vec()
}

#[test]
fn pendulum_g_changes_the_dynamics() {
    let state = [1.0, 0.5];
    let act = [0.3f32];
    let mut default = make("Pendulum-v1", &Kwargs::new()).unwrap();
    let mut explicit = make("Pendulum-v1", &Kwargs::new().with("g", 10.0)).unwrap();
    let mut earth = make("Pendulum-v1", &Kwargs::new().with("g", 9.81)).unwrap();
    let a = one_step(default.as_mut(), &state, Action::Continuous(&act));
    assert_eq!(a, one_step(explicit.as_mut(), &state, Action::Continuous(&act)));
    let b = one_step(earth.as_mut(), &state, Action::Continuous(&act));
    // thdot' = thdot + (3g/2 sin th + 3u) dt: the difference is 3 * 0.19 / 2 * sin(1) * 0.05.
    let expected = 3.0 * (10.0 - 9.81) / 2.0 * 1.0f64.sin() * 0.05;
    assert!(((a[2] - b[2]) as f64 - expected).abs() < 1e-6, "{a:?} vs {b:?}");
}

#[test]
fn cartpole_length_changes_the_dynamics() {
    let state = [0.0, 0.0, 0.1, 0.0];
    let mut default = make("CartPole-v1", &Kwargs::new()).unwrap();
    let mut long = make("CartPole-v1", &Kwargs::new().with("length", 1.0)).unwrap();
    let a = one_step(default.as_mut(), &state, Action::Discrete(1));
    let b = one_step(long.as_mut(), &state, Action::Discrete(1));
    assert_eq!(a[2], b[2], "angle moves by theta_dot * tau, unchanged in the first step");
    assert!(b[3] > a[3], "a longer pole falls slower, so the push rights it more: {a:?} vs {b:?}");
    let config = CartPoleConfig::from_kwargs(&Kwargs::new().with("length", 1.0)).unwrap();
    assert_eq!(CartPole::new(config).unwrap().config().length, 1.0);
}

#[test]
fn sutton_barto_reward_flag() {
    let mut env = make("CartPole-v1", &Kwargs::new().with("sutton_barto_reward", true)).unwrap();
    env.reset(Some(0)).unwrap();
    assert_eq!(env.step(Action::Discrete(0)).unwrap().reward, 0.0);
    env.set_state(&[2.4, 1.0, 0.0, 0.0]).unwrap();
    let step = env.step(Action::Discrete(0)).unwrap();
    assert!(step.terminated);
    assert_eq!(step.reward, -1.0);
}

/// A backend registered under a prefix builds `"<prefix>:<id>"` ids (for `make`, `make_buffered` and so
/// `VecEnv`); an unregistered prefix is an unknown id that lists the backends there are.
#[test]
fn backends_build_prefixed_ids() {
    fn fake(id: &str, kwargs: &flotilla_envs::Kwargs) -> flotilla_core::Result<Box<dyn flotilla_core::Env>> {
        // A stand-in for a Python bridge: the native env of the same id.
        flotilla_envs::make(id, kwargs)
    }
    let e = flotilla_envs::make("nowhere:CartPole-v1", &Kwargs::new()).err().expect("an unknown backend").to_string();
    assert!(e.contains("nowhere:CartPole-v1") && e.contains("backends"), "{e}");
    flotilla_envs::register_backend("fake", fake);
    let env = flotilla_envs::make("fake:CartPole-v1", &Kwargs::new()).unwrap();
    assert_eq!(env.id(), "CartPole-v1");
    let mut envs = flotilla_envs::VecEnv::make("fake:Pendulum-v1", &Kwargs::new().with("g", 9.81), 2).unwrap();
    assert_eq!(envs.reset(Some(0)).unwrap().len(), 6);
    let e = flotilla_envs::make("nowhere:CartPole-v1", &Kwargs::new()).err().expect("an unknown backend").to_string();
    assert!(e.contains("fake:"), "{e}");
}
