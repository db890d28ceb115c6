//! `TimeLimit`: truncation exactly at the limit, `terminated` winning over it, and the step count.

use flotilla_core::{Action, Env};
use flotilla_envs::{CartPole, Pendulum, TimeLimit};

#[test]
fn truncates_at_the_limit_and_reset_restarts_the_count() {
    let mut env = TimeLimit::new(CartPole::default(), 5);
    assert_eq!(env.max_episode_steps(), Some(5));
    for _ in 0..2 {
        env.reset(Some(1)).unwrap();
        for t in 1..=5 {
            let step = env.step(Action::Discrete(t % 2)).unwrap();
            assert!(!step.terminated);
            assert_eq!(step.truncated, t == 5, "step {t}");
            assert_eq!(env.elapsed_steps(), t as usize);
        }
        // Stepping on past the limit keeps truncating, as Gymnasium's TimeLimit does.
        assert!(env.step(Action::Discrete(0)).unwrap().truncated);
    }
}

#[test]
fn terminating_on_the_last_step_sets_both_flags_as_gymnasium() {
    let mut env = TimeLimit::new(CartPole::default(), 10);
    env.reset(Some(0)).unwrap();
    env.set_elapsed_steps(9);
    env.set_state(&[2.399, 1.0, 0.0, 0.0]).unwrap();
    let step = env.step(Action::Discrete(1)).unwrap();
    assert!(step.terminated);
    assert!(step.truncated, "Gymnasium reports both flags");
}

#[test]
fn errors_do_not_count_as_steps() {
    let mut env = TimeLimit::new(Pendulum::default(), 2);
    env.reset(Some(0)).unwrap();
    assert!(env.step(Action::Continuous(&[f32::NAN])).is_err());
    assert_eq!(env.elapsed_steps(), 0);
    assert!(!env.step(Action::Continuous(&[0.0])).unwrap().truncated);
    assert!(env.step(Action::Continuous(&[0.0])).unwrap().truncated);
    assert!(env.inner().physical_state().is_some());
    let inner = env.into_inner();
    assert_eq!(inner.config().g, 10.0);
}
