//! `GymEnv` against the same Gymnasium env stepped from Python: spaces, observations, rewards and flags for
//! a seed and a fixed action sequence (discrete and continuous), u8 image observations, and Python errors
//! turned into env errors.
use flotilla_core::{Action, DType, Env, Error, Obs, Space};
use flotilla_envs_python::GymEnv;
use pyo3::prelude::*;
use pyo3::types::PyModule;

const REFERENCE: &std::ffi::CStr = cr#"
import numpy as np
import gymnasium as gym

def reference(env_id, seed, actions, continuous):
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out = [(np.asarray(obs, dtype=np.float32).ravel().tolist(), 0.0, False, False)]
    for a in actions:
        if continuous:
            a = np.array([a], dtype=np.float32)
        obs, r, te, tr, _ = env.step(a)
        out.append((np.asarray(obs, dtype=np.float32).ravel().tolist(), float(r), bool(te), bool(tr)))
        if te or tr:
            obs, _ = env.reset()
            out.append((np.asarray(obs, dtype=np.float32).ravel().tolist(), 0.0, False, False))
    return out
"#;

type Record = (Vec<f32>, f64, bool, bool);

fn reference(id: &str, seed: u64, actions: Vec<f64>, continuous: bool) -> Vec<Record> {
    Python::attach(|py| {
        let module = PyModule::from_code(py, REFERENCE, c"reference.py", c"reference").unwrap();
        let actions: Vec<Py<PyAny>> = actions
            .iter()
            .map(|&a| {
                if continuous {
                    a.into_pyobject(py).unwrap().into_any().unbind()
                } else {
                    (a as i64).into_pyobject(py).unwrap().into_any().unbind()
                }
            })
            .collect();
        module.getattr("reference").unwrap().call1((id, seed, actions, continuous)).unwrap().extract().unwrap()
    })
}

/// Step `env` through `actions` as the reference does (resetting after an episode ends) and compare.
fn matches_python(id: &str, actions: Vec<f64>, continuous: bool) {
    let mut env = GymEnv::make(id, &[]).unwrap();
    let want = reference(id, 5, actions.clone(), continuous);
    let (obs, _) = env.reset(Some(5)).unwrap();
    let mut got = vec![(obs.as_f32().unwrap().to_vec(), 0.0, false, false)];
    for a in actions {
        let step = if continuous {
            env.step(Action::Continuous(&[a as f32])).unwrap()
        } else {
            env.step(Action::Discrete(a as i64)).unwrap()
        };
        let done = step.terminated || step.truncated;
        got.push((step.obs.as_f32().unwrap().to_vec(), step.reward, step.terminated, step.truncated));
        if done {
            let (obs, _) = env.reset(None).unwrap();
            got.push((obs.as_f32().unwrap().to_vec(), 0.0, false, false));
        }
    }
    assert_eq!(got, want, "{id}");
}

#[test]
fn cartpole_and_pendulum_step_as_in_python() {
    let env = GymEnv::make("CartPole-v1", &[]).unwrap();
    assert_eq!(env.action_space(), &Space::discrete(2));
    assert!(matches!(env.observation_space(), Space::Box { shape, dtype: DType::F32, .. } if shape == &[4]));
    assert_eq!(env.max_episode_steps(), Some(500));
    // 300 steps of a fixed pattern: several CartPole episodes end (terminations).
    matches_python("CartPole-v1", (0..300).map(|t| f64::from((t / 3) % 2)).collect(), false);
    // Pendulum: a Box action, episodes cut by the 200-step limit (truncation).
    matches_python("Pendulum-v1", (0..450).map(|t| ((t as f64) * 0.1).sin() * 2.0).collect(), true);
}

#[test]
fn atari_ids_give_u8_frames() {
    let mut env = GymEnv::make("ALE/Pong-v5", &[("frameskip", "4")]).unwrap();
    assert!(matches!(env.observation_space(), Space::Box { shape, dtype: DType::U8, .. } if shape == &[210, 160, 3]));
    let (obs, _) = env.reset(Some(1)).unwrap();
    assert!(matches!(&obs, Obs::U8(v) if v.len() == 210 * 160 * 3));
    assert!(matches!(env.step(Action::Discrete(1)).unwrap().obs, Obs::U8(_)));
}

#[test]
fn bad_ids_actions_and_python_exceptions_are_errors() {
    let e = GymEnv::make("NoSuchEnv-v0", &[]).unwrap_err();
    assert!(matches!(&e, Error::Backend { env, .. } if env == "NoSuchEnv-v0"), "{e}");
    assert!(e.to_string().contains("gymnasium.make") && e.to_string().contains("NoSuchEnv"), "{e}");
    let mut env = GymEnv::make("CartPole-v1", &[]).unwrap();
    // Gymnasium refuses a step before reset: the Python exception comes back as an error, not a crash.
    let e = env.step(Action::Discrete(0)).unwrap_err().to_string();
    assert!(e.contains("CartPole-v1") && e.contains("reset"), "{e}");
    env.reset(Some(0)).unwrap();
    assert!(matches!(env.step(Action::Discrete(2)), Err(Error::InvalidAction { .. })));
    assert!(matches!(env.step(Action::Continuous(&[0.0])), Err(Error::InvalidAction { .. })));
    let e = GymEnv::make("CartPole-v1", &[("no_such_kwarg", "1")]).unwrap_err().to_string();
    assert!(e.contains("no_such_kwarg"), "{e}");
}
