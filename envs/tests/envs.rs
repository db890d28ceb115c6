//! Behaviour every native env shares: spaces as Gymnasium builds them, errors instead of panics,
//! reset distributions and seeding, state access.

use std::f64::consts::PI;

use flotilla_core::{Action, DType, Env, Error, Space};
use flotilla_envs::{
    Acrobot, AcrobotState, BufferedEnv, CartPole, CartPoleState, Kwargs, MountainCarContinuous, MountainCarState,
    Pendulum, PendulumState, TimeLimit, make, registered,
};

fn all_envs() -> Vec<Box<dyn Env>> {
    registered().iter().map(|s| make(s.id, &Kwargs::new()).expect("make")).collect()
}

/// A valid action for `space` (index 0, or zeros).
fn valid_action(space: &Space) -> Vec<f32> {
    vec![0.0; space.flat_dim()]
}

fn step_valid(env: &mut dyn Env) -> flotilla_core::Step {
    let zeros = valid_action(env.action_space());
    let action = match env.action_space() {
        Space::Discrete { .. } => Action::Discrete(0),
        Space::Box { .. } => Action::Continuous(&zeros),
    };
    env.step(action).expect("valid action")
}

#[test]
fn spaces_are_gymnasiums() {
    let inf = f32::INFINITY;
    let expect: [(&str, Vec<f32>, Space); 6] = [
        ("CartPole-v1", vec![4.8, inf, 0.41887903, inf], Space::discrete(2)),
        ("Latency-v0", vec![4.8, inf, 0.41887903, inf], Space::discrete(2)),
        ("MountainCar-v0", vec![0.6, 0.07], Space::discrete(3)),
        ("MountainCarContinuous-v0", vec![0.6, 0.07], Space::box1d(vec![-1.0], vec![1.0])),
        ("Pendulum-v1", vec![1.0, 1.0, 8.0], Space::box1d(vec![-2.0], vec![2.0])),
        ("Acrobot-v1", vec![1.0, 1.0, 1.0, 1.0, 12.566371, 28.274334], Space::discrete(3)),
    ];
    for (id, high, action_space) in expect {
        let env = make(id, &Kwargs::new()).unwrap();
        assert_eq!(env.id(), id);
        assert_eq!(env.action_space(), &action_space, "{id}");
        let Space::Box { low: l, high: h, shape, dtype } = env.observation_space() else { panic!("{id}: not a box") };
        assert_eq!(h, &high, "{id}: high");
        assert_eq!(shape, &vec![high.len()], "{id}");
        assert_eq!(*dtype, DType::F32, "{id}");
        if id.starts_with("MountainCar") {
            assert_eq!(l, &vec![-1.2f32, -0.07], "{id}: low");
        } else {
            assert_eq!(l, &high.iter().map(|x| -x).collect::<Vec<_>>(), "{id}: low");
        }
    }
}

#[test]
fn step_and_state_before_reset_are_errors() {
    for mut env in all_envs() {
        let id = env.id().to_string();
        let zeros = valid_action(env.action_space());
        let action = match env.action_space() {
            Space::Discrete { .. } => Action::Discrete(0),
            Space::Box { .. } => Action::Continuous(&zeros),
        };
        assert_eq!(env.step(action), Err(Error::ResetNeeded { env: id.clone() }));
        assert_eq!(env.state(), Err(Error::ResetNeeded { env: id.clone() }));
        let dim = if id.starts_with("MountainCar") || id.starts_with("Pendulum") { 2 } else { 4 };
        assert_eq!(env.set_state(&vec![0.0; dim]), Err(Error::ResetNeeded { env: id.clone() }));
        env.reset(Some(0)).unwrap();
        step_valid(env.as_mut());
    }
}

#[test]
fn invalid_actions_are_errors_and_change_nothing() {
    let nan = [f32::NAN];
    let inf = [f32::INFINITY];
    let neg_inf = [f32::NEG_INFINITY];
    let two = [0.0f32, 0.0];
    let one = [0.0f32];
    for spec in registered() {
        // Limit 1: if a failed step counted, the first valid step would not be the truncating one.
        let mut env = make(spec.id, &Kwargs::new().with("max_episode_steps", 1i64)).unwrap();
        env.reset(Some(3)).unwrap();
        let before = env.state().unwrap();
        let bad: Vec<Action<'_>> = match env.action_space() {
            Space::Discrete { n, .. } => {
                vec![
                    Action::Discrete(-1),
                    Action::Discrete(*n as i64),
                    Action::Discrete(i64::MAX),
                    Action::Continuous(&one),
                ]
            }
            Space::Box { .. } => vec![
                Action::Continuous(&nan),
                Action::Continuous(&inf),
                Action::Continuous(&neg_inf),
                Action::Continuous(&[]),
                Action::Continuous(&two),
                Action::Discrete(0),
            ],
        };
        for action in bad {
            match env.step(action) {
                Err(Error::InvalidAction { env: id, detail }) => {
                    assert_eq!(id, spec.id);
                    assert!(!detail.is_empty());
                }
                other => panic!("{}: {action:?} gave {other:?}", spec.id),
            }
            assert_eq!(env.state().unwrap(), before, "{}: state changed by {action:?}", spec.id);
        }
        let step = step_valid(env.as_mut());
        assert!(step.truncated || step.terminated, "{}: failed steps were counted", spec.id);
    }
}

#[test]
fn continuous_envs_clip_finite_out_of_range_actions() {
    // Gymnasium clips: a huge torque moves Pendulum exactly like the maximal one...
    let mut a = Pendulum::default();
    let mut b = Pendulum::default();
    a.reset(Some(1)).unwrap();
    b.reset(Some(1)).unwrap();
    let sa = a.step(Action::Continuous(&[50.0])).unwrap();
    let sb = b.step(Action::Continuous(&[2.0])).unwrap();
    assert_eq!(sa.obs, sb.obs);
    assert_eq!(sa.reward, sb.reward, "Pendulum's cost uses the clipped torque");
    // ...while MountainCarContinuous moves alike but charges the unclipped action (as Gymnasium).
    let mut a = MountainCarContinuous::default();
    let mut b = MountainCarContinuous::default();
    a.reset(Some(1)).unwrap();
    b.reset(Some(1)).unwrap();
    let sa = a.step(Action::Continuous(&[3.0])).unwrap();
    let sb = b.step(Action::Continuous(&[1.0])).unwrap();
    assert_eq!(sa.obs, sb.obs);
    assert!((sa.reward - -0.9).abs() < 1e-6 && (sb.reward - -0.1).abs() < 1e-6, "{} {}", sa.reward, sb.reward);
}

#[test]
fn set_state_validates() {
    for mut env in all_envs() {
        env.reset(Some(0)).unwrap();
        let n = env.state().unwrap().len();
        assert!(matches!(env.set_state(&vec![0.0; n + 1]), Err(Error::InvalidState { .. })));
        let mut bad = vec![0.0; n];
        bad[n - 1] = f64::NAN;
        assert!(matches!(env.set_state(&bad), Err(Error::InvalidState { .. })));
        let good: Vec<f64> = (0..n).map(|i| 0.01 * i as f64).collect();
        env.set_state(&good).unwrap();
        assert_eq!(env.state().unwrap(), good);
    }
}

#[test]
fn typed_state_accessors_match_the_trait() {
    let mut cp = CartPole::default();
    assert!(cp.physical_state().is_none());
    cp.reset(Some(0)).unwrap();
    let s = CartPoleState { x: 0.1, x_dot: -0.2, theta: 0.03, theta_dot: 0.4 };
    cp.set_physical_state(s).unwrap();
    assert_eq!(cp.state().unwrap(), vec![0.1, -0.2, 0.03, 0.4]);
    assert_eq!(cp.physical_state(), Some(s));

    let mut ac = Acrobot::new();
    ac.reset(Some(0)).unwrap();
    ac.set_physical_state(AcrobotState { theta1: 1.0, theta2: 2.0, dtheta1: 3.0, dtheta2: 4.0 }).unwrap();
    assert_eq!(ac.state().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);

    let mut pe = Pendulum::default();
    pe.reset(Some(0)).unwrap();
    pe.set_physical_state(PendulumState { theta: PI, theta_dot: 1.0 }).unwrap();
    assert_eq!(pe.physical_state().map(|s| s.to_array()), Some([PI, 1.0]));

    let mut mc = MountainCarContinuous::default();
    mc.reset(Some(0)).unwrap();
    mc.set_physical_state(MountainCarState { position: -0.5, velocity: 0.01 }).unwrap();
    assert_eq!(mc.state().unwrap(), vec![-0.5, 0.01]);
}

#[test]
fn reset_states_lie_in_gymnasiums_ranges() {
    for seed in 0..300u64 {
        for mut env in all_envs() {
            let id = env.id().to_string();
            let (obs, _) = env.reset(Some(seed)).unwrap();
            let s = env.state().unwrap();
            let obs = obs.as_f32().unwrap().to_vec();
            assert!(env.observation_space().contains_f32(&obs), "{id}: {obs:?} outside the observation space");
            let inside = |x: f64, lo: f64, hi: f64| (lo..=hi).contains(&x);
            match id.as_str() {
                "CartPole-v1" | "Latency-v0" => {
                    assert!(s.iter().all(|&x| inside(x, -0.05, 0.05)), "{id}: {s:?}");
                    assert_eq!(obs, s.iter().map(|&x| x as f32).collect::<Vec<_>>());
                }
                "Acrobot-v1" => {
                    assert!(s.iter().all(|&x| inside(x, -0.1, 0.1)), "{id}: {s:?}");
                    assert!(s.iter().all(|&x| x == x as f32 as f64), "{id}: reset state is rounded to f32");
                }
                "MountainCar-v0" | "MountainCarContinuous-v0" => {
                    assert!(inside(s[0], -0.6, -0.4) && s[1] == 0.0, "{id}: {s:?}");
                }
                "Pendulum-v1" => assert!(inside(s[0], -PI, PI) && inside(s[1], -1.0, 1.0), "{id}: {s:?}"),
                other => panic!("untested env {other}"),
            }
        }
    }
}

/// Observations and rewards of one seeded episode under a fixed action pattern.
fn episode(env: &mut dyn Env, seed: Option<u64>) -> Vec<(Vec<f32>, f64)> {
    let (obs, _) = env.reset(seed).unwrap();
    let mut out = vec![(obs.as_f32().unwrap().to_vec(), 0.0)];
    for t in 0..1000 {
        let x = [((t * 7 % 5) as f32 - 2.0) * 0.7];
        let action = match env.action_space() {
            Space::Discrete { n, .. } => Action::Discrete((t * 7 % 11) as i64 % *n as i64),
            Space::Box { .. } => Action::Continuous(&x),
        };
        let step = env.step(action).unwrap();
        out.push((step.obs.as_f32().unwrap().to_vec(), step.reward));
        if step.terminated || step.truncated {
            break;
        }
    }
    out
}

#[test]
fn same_seed_same_episode_and_streams_continue() {
    for spec in registered() {
        let mut a = make(spec.id, &Kwargs::new()).unwrap();
        let mut b = make(spec.id, &Kwargs::new()).unwrap();
        assert_eq!(episode(a.as_mut(), Some(11)), episode(b.as_mut(), Some(11)), "{}", spec.id);
        // `reset(None)` continues the seeded stream identically in both...
        assert_eq!(episode(a.as_mut(), None), episode(b.as_mut(), None), "{}", spec.id);
        // ...and differs from a reseed.
        let (first, _) = a.reset(Some(11)).unwrap();
        let (next, _) = a.reset(None).unwrap();
        assert_ne!(first, next, "{}", spec.id);
        let (other, _) = b.reset(Some(12)).unwrap();
        assert_ne!(first, other, "{}", spec.id);
        // Unseeded envs draw from entropy: two fresh ones start differently.
        let mut c = make(spec.id, &Kwargs::new()).unwrap();
        let mut d = make(spec.id, &Kwargs::new()).unwrap();
        assert_ne!(c.reset(None).unwrap().0, d.reset(None).unwrap().0, "{}", spec.id);
    }
}

#[test]
fn cartpole_rewards_zero_after_termination() {
    let mut env = CartPole::default();
    env.reset(Some(0)).unwrap();
    env.set_state(&[2.39, 1.0, 0.0, 0.0]).unwrap();
    let first = env.step(Action::Discrete(1)).unwrap();
    assert!(first.terminated);
    assert_eq!(first.reward, 1.0);
    assert_eq!(env.steps_beyond_terminated(), Some(0));
    let after = env.step(Action::Discrete(1)).unwrap();
    assert!(after.terminated);
    assert_eq!(after.reward, 0.0);
    assert_eq!(env.steps_beyond_terminated(), Some(1));
    env.reset(None).unwrap();
    assert_eq!(env.steps_beyond_terminated(), None);
}

#[test]
fn buffered_path_matches_step_and_checks_buffer_length() {
    let mut a = Acrobot::new();
    let mut b = Acrobot::new();
    let mut buf = [0.0f32; 6];
    b.reset_into(Some(5), &mut buf).unwrap();
    assert_eq!(a.reset(Some(5)).unwrap().0.as_f32().unwrap(), &buf);
    for t in 0..50 {
        let step = a.step(Action::Discrete(t % 3)).unwrap();
        let out = b.step_into(Action::Discrete(t % 3), &mut buf).unwrap();
        assert_eq!(step.obs.as_f32().unwrap(), &buf);
        assert_eq!((step.reward, step.terminated, step.truncated), (out.reward, out.terminated, out.truncated));
    }
    let mut short = [0.0f32; 5];
    assert!(matches!(b.step_into(Action::Discrete(0), &mut short), Err(Error::BadArgument { .. })));
    let mut limited = TimeLimit::new(Acrobot::new(), 2);
    limited.reset_into(Some(0), &mut buf).unwrap();
    assert!(!limited.step_into(Action::Discrete(0), &mut buf).unwrap().truncated);
    assert!(limited.step_into(Action::Discrete(0), &mut buf).unwrap().truncated);
}
