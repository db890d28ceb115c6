//! MuJoCo through the bridge: `HalfCheetah-v5` (float64 observations, a 6-D action) steps as Gymnasium steps it
//! from Python, observations converted to f32 in one NumPy call.
use flotilla_core::{Action, DType, Env, Space};
use flotilla_envs_python::GymEnv;
use pyo3::prelude::*;
use pyo3::types::PyModule;

const REFERENCE: &std::ffi::CStr = cr#"
import numpy as np
import gymnasium as gym

def reference(env_id, seed, actions):
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out = [(np.asarray(obs, dtype=np.float32).tolist(), 0.0, False, False)]
    for a in actions:
        obs, r, te, tr, _ = env.step(np.array(a, dtype=np.float32))
        out.append((np.asarray(obs, dtype=np.float32).tolist(), float(r), bool(te), bool(tr)))
    return out
"#;

type Record = (Vec<f32>, f64, bool, bool);

#[test]
fn halfcheetah_steps_as_in_python() {
    let id = "HalfCheetah-v5";
    let mut env = GymEnv::make(id, &[]).unwrap();
    let Space::Box { shape, dtype, .. } = env.observation_space() else { panic!("a box") };
    assert_eq!((shape.as_slice(), dtype), (&[17][..], &DType::F32));
    assert_eq!(env.action_space(), &Space::box1d(vec![-1.0; 6], vec![1.0; 6]));
    let actions: Vec<Vec<f32>> =
        (0..40).map(|t| (0..6).map(|k| ((t * 7 + k * 3) as f32 * 0.37).sin()).collect()).collect();
    let want: Vec<Record> = Python::attach(|py| {
        let module = PyModule::from_code(py, REFERENCE, c"reference.py", c"reference").unwrap();
        module.getattr("reference").unwrap().call1((id, 3, actions.clone())).unwrap().extract().unwrap()
    });
    let (obs, _) = env.reset(Some(3)).unwrap();
    let mut got = vec![(obs.as_f32().unwrap().to_vec(), 0.0, false, false)];
    for a in &actions {
        let step = env.step(Action::Continuous(a)).unwrap();
        got.push((step.obs.as_f32().unwrap().to_vec(), step.reward, step.terminated, step.truncated));
    }
    assert_eq!(got, want);
}
