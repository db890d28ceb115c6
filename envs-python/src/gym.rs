//! [`GymEnv`]: a Python Gymnasium environment as a [`flotilla_core::Env`].
use flotilla_core::{Action, DType, Env, Error, Info, Obs, Result, Space, Step};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::interpreter::with_python;

/// `gymnasium.make(id, **kwargs)`, stepped from Rust. Observations are flattened row-major to f32 (or kept
/// u8 for `uint8` boxes); actions go back as a Python int (`Discrete`) or a float32 array (`Box`).
pub struct GymEnv {
    id: String,
    env: Py<PyAny>,
    numpy: Py<PyModule>,
    observation_space: Space,
    action_space: Space,
    max_episode_steps: Option<usize>,
}

impl std::fmt::Debug for GymEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GymEnv").field("id", &self.id).finish_non_exhaustive()
    }
}

/// A Gymnasium space as a Flotilla one (`Box` of any float dtype becomes f32; `uint8` stays u8).
fn space(env: &str, which: &str, s: &Bound<'_, PyAny>) -> PyResult<std::result::Result<Space, Error>> {
    let class: String = s.get_type().name()?.extract()?;
    Ok(match class.as_str() {
        "Discrete" => {
            Ok(Space::Discrete { n: s.getattr("n")?.extract::<i64>()? as usize, start: s.getattr("start")?.extract()? })
        }
        "Box" => {
            let dtype = if s.getattr("dtype")?.str()? == "uint8" { DType::U8 } else { DType::F32 };
            let shape: Vec<usize> = s.getattr("shape")?.extract()?;
            let bound = |name: &str| -> PyResult<Vec<f32>> {
                let flat = s.getattr(name)?.call_method1("astype", ("float32",))?.call_method0("ravel")?;
                Ok(flat.extract::<PyReadonlyArray1<f32>>()?.as_slice()?.to_vec())
            };
            Ok(Space::Box { low: bound("low")?, high: bound("high")?, shape, dtype })
        }
        other => Err(Error::Unsupported { env: env.to_string(), what: format!("a {other} {which} space") }),
    })
}

impl GymEnv {
    /// `gymnasium.make(id, **kwargs)` (`kwargs` as Python literals, e.g. `("continuous", "True")`, read with
    /// `ast.literal_eval`), after
    /// `import ale_py` so the `ALE/…` ids are registered when ale-py is installed.
    pub fn make(id: &str, kwargs: &[(&str, &str)]) -> Result<Self> {
        // One `make` at a time in the process: several threads importing an env's module at once through
        // gymnasium's registry failed with `KeyError: 'gymnasium.envs.classic_control'` (seen in CI, tests
        // making envs on parallel threads). Taken before the GIL, so it never waits while holding it.
        static MAKE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = MAKE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let made = with_python(id, "gymnasium.make", |py| {
            let gym = py.import("gymnasium")?;
            if let Ok(ale) = py.import("ale_py") {
                gym.call_method1("register_envs", (ale,))?;
            }
            let args = PyDict::new(py);
            // Literals only (numbers, strings, booleans, tuples...): nothing a config says is executed.
            let literal_eval = py.import("ast")?.getattr("literal_eval")?;
            for (k, v) in kwargs {
                args.set_item(*k, literal_eval.call1((*v,))?)?;
            }
            let env = gym.call_method("make", (id,), Some(&args))?;
            let observation_space = space(id, "observation", &env.getattr("observation_space")?)?;
            let action_space = space(id, "action", &env.getattr("action_space")?)?;
            let max_steps = env.getattr("spec")?.getattr("max_episode_steps")?.extract::<Option<usize>>()?;
            Ok((env.unbind(), py.import("numpy")?.unbind(), observation_space, action_space, max_steps))
        })?;
        let (env, numpy, observation_space, action_space, max_episode_steps) = made;
        Ok(GymEnv {
            id: id.to_string(),
            env,
            numpy,
            observation_space: observation_space?,
            action_space: action_space?,
            max_episode_steps,
        })
    }

    /// An observation as Flotilla's flat `Obs`, converted by NumPy in one call.
    fn obs(&self, py: Python<'_>, obs: &Bound<'_, PyAny>) -> PyResult<Obs> {
        let np = self.numpy.bind(py);
        Ok(match &self.observation_space {
            Space::Box { dtype: DType::U8, .. } => {
                let a = np.call_method1("ascontiguousarray", (obs, "uint8"))?.call_method0("ravel")?;
                Obs::U8(a.extract::<PyReadonlyArray1<u8>>()?.as_slice()?.to_vec())
            }
            _ => {
                let a = np.call_method1("ascontiguousarray", (obs, "float32"))?.call_method0("ravel")?;
                Obs::F32(a.extract::<PyReadonlyArray1<f32>>()?.as_slice()?.to_vec())
            }
        })
    }
}

/// Gymnasium's info dict, numbers only.
fn info(d: &Bound<'_, PyAny>) -> Info {
    let mut out = Info::new();
    if let Ok(d) = d.cast::<PyDict>() {
        for (k, v) in d.iter() {
            if let (Ok(k), Ok(v)) = (k.extract::<String>(), v.extract::<f64>()) {
                out.insert(k, v);
            }
        }
    }
    out
}

impl Env for GymEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        &self.action_space
    }

    fn max_episode_steps(&self) -> Option<usize> {
        self.max_episode_steps
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)> {
        with_python(&self.id, "reset", |py| {
            let kwargs = PyDict::new(py);
            kwargs.set_item("seed", seed)?;
            let out = self.env.bind(py).call_method("reset", (), Some(&kwargs))?;
            let out = out.cast::<PyTuple>()?;
            Ok((self.obs(py, &out.get_item(0)?)?, info(&out.get_item(1)?)))
        })
    }

    fn step(&mut self, action: Action<'_>) -> Result<Step> {
        let bad = |detail: String| Err(Error::InvalidAction { env: self.id.clone(), detail });
        match (&self.action_space, action) {
            (Space::Discrete { n, start }, Action::Discrete(a)) if (*start..*start + *n as i64).contains(&a) => {}
            (Space::Box { shape, .. }, Action::Continuous(a)) if a.len() == shape.iter().product::<usize>() => {
                if let Some(x) = a.iter().find(|x| !x.is_finite()) {
                    return bad(format!("{x} is not finite"));
                }
            }
            (space, a) => return bad(format!("{a:?} is not in {space:?}")),
        }
        with_python(&self.id, "step", |py| {
            let env = self.env.bind(py);
            let out = match action {
                Action::Discrete(a) => env.call_method1("step", (a,))?,
                Action::Continuous(a) => {
                    let shape: Vec<usize> = self.action_space.shape().to_vec();
                    let array = PyArray1::from_slice(py, a).reshape(shape)?;
                    env.call_method1("step", (array,))?
                }
            };
            let out = out.cast::<PyTuple>()?;
            Ok(Step {
                obs: self.obs(py, &out.get_item(0)?)?,
                reward: out.get_item(1)?.extract()?,
                terminated: out.get_item(2)?.extract()?,
                truncated: out.get_item(3)?.extract()?,
                info: info(&out.get_item(4)?),
            })
        })
    }
}

/// Make `"gymnasium:<id>"` ids buildable by [`flotilla_envs::make`] (and so usable in configs:
/// `[env] id = "gymnasium:Acrobot-v1"`, `[env] kwargs` passed to `gymnasium.make`), and `"atari:<game>"` ids
/// by [`flotilla_envs::make_vector`] (ale-py's vector env, `[env] kwargs` read by
/// [`AtariConfig::from_kwargs`](crate::AtariConfig::from_kwargs)). Call once at start-up; the `flotilla`
/// binary does.
pub fn register() {
    flotilla_envs::register_backend("gymnasium", make_backend);
    flotilla_envs::register_vector_backend("atari", crate::atari::make_vector);
}

fn make_backend(id: &str, kwargs: &flotilla_envs::Kwargs) -> Result<Box<dyn Env>> {
    let literals: Vec<(String, String)> = kwargs.iter().map(|(k, v)| (k.to_string(), python_literal(v))).collect();
    let pairs: Vec<(&str, &str)> = literals.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Ok(Box::new(GymEnv::make(id, &pairs)?))
}

/// A config value as the Python literal `ast.literal_eval` reads back.
fn python_literal(v: &flotilla_envs::KwargValue) -> String {
    use flotilla_envs::KwargValue;
    match v {
        KwargValue::Float(x) => format!("{x:?}"),
        KwargValue::Int(i) => i.to_string(),
        KwargValue::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        KwargValue::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
    }
}
