//! A MuJoCo env without the `mujoco` package (hidden from this test process's interpreter) is one error that
//! names the env and the set-up script that installs it. (A test binary of its own: hiding the package lasts
//! for the whole process.)
use flotilla_core::Error;
use flotilla_envs_python::GymEnv;
use pyo3::prelude::*;

#[test]
fn a_missing_mujoco_names_the_setup_script() {
    Python::attach(|py| {
        // `import mujoco` now raises ImportError, as where the package is not installed.
        py.import("sys").unwrap().getattr("modules").unwrap().set_item("mujoco", py.None()).unwrap();
    });
    let Err(Error::Backend { env, detail }) = GymEnv::make("HalfCheetah-v5", &[]) else {
        panic!("HalfCheetah-v5 without mujoco must fail as a backend error")
    };
    assert_eq!(env, "HalfCheetah-v5");
    assert!(detail.contains("bash scripts/setup.sh") && detail.contains("mujoco"), "{detail}");
}
