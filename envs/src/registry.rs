//! Environment ids and `gym.make`, mirroring the classic-control registrations in
//! `gymnasium/envs/__init__.py` (Gymnasium 1.2.2) and `gymnasium/envs/registration.py`'s `make`, plus
//! `Latency-v0` (CartPole with a fixed wall-clock time per step, for scaling benchmarks; not Gymnasium's).
//!
//! [`make`] builds the native env from its id and [`Kwargs`], wrapped in its registered
//! [`TimeLimit`]. As in `gym.make`, the extra argument `max_episode_steps` overrides the limit
//! (`-1` removes it). Unknown ids are [`Error::UnknownEnv`]; unknown keys, wrong types and bad values
//! are [`Error::BadArgument`] naming the key and the env.

use flotilla_core::{Env, Error, Result};

use crate::buffered::BufferedEnv;
use crate::kwargs::{KwargReader, Kwargs};
use crate::{
    Acrobot, CartPole, CartPoleConfig, Latency, LatencyConfig, MountainCar, MountainCarConfig, MountainCarContinuous,
    MountainCarContinuousConfig, Pendulum, PendulumConfig, TimeLimit,
};

/// What the registry knows about one id (Gymnasium's `EnvSpec`, the fields that matter here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnvSpec {
    /// Registered id, e.g. `"CartPole-v1"`.
    pub id: &'static str,
    /// Default time limit (`None`: no [`TimeLimit`]).
    pub max_episode_steps: Option<usize>,
    /// Average return over 100 episodes at which the task counts as solved, if Gymnasium sets one.
    pub reward_threshold: Option<f64>,
    /// Constructor arguments [`make`] accepts besides `max_episode_steps`.
    pub kwargs: &'static [&'static str],
}

static REGISTRY: [EnvSpec; 6] = [
    EnvSpec {
        id: "CartPole-v1",
        max_episode_steps: Some(500),
        reward_threshold: Some(475.0),
        kwargs: CartPoleConfig::KWARGS,
    },
    EnvSpec {
        id: "MountainCar-v0",
        max_episode_steps: Some(200),
        reward_threshold: Some(-110.0),
        kwargs: MountainCarConfig::KWARGS,
    },
    EnvSpec {
        id: "MountainCarContinuous-v0",
        max_episode_steps: Some(999),
        reward_threshold: Some(90.0),
        kwargs: MountainCarContinuousConfig::KWARGS,
    },
    EnvSpec { id: "Pendulum-v1", max_episode_steps: Some(200), reward_threshold: None, kwargs: PendulumConfig::KWARGS },
    EnvSpec { id: "Acrobot-v1", max_episode_steps: Some(500), reward_threshold: Some(-100.0), kwargs: &[] },
    EnvSpec {
        id: "Latency-v0",
        max_episode_steps: Some(500),
        reward_threshold: Some(475.0),
        kwargs: LatencyConfig::KWARGS,
    },
];

/// Every native env id, in Gymnasium's registration order, then `Latency-v0`.
pub fn registered() -> &'static [EnvSpec] {
    &REGISTRY
}

/// The spec of `id`, or [`Error::UnknownEnv`] listing the known ids.
pub fn spec(id: &str) -> Result<&'static EnvSpec> {
    REGISTRY.iter().find(|s| s.id == id).ok_or_else(|| Error::UnknownEnv {
        id: id.to_string(),
        known: REGISTRY.iter().map(|s| s.id).collect::<Vec<_>>().join(", "),
    })
}

/// Builds the envs of one backend (`"gymnasium:LunarLander-v3"` → the backend registered as `"gymnasium"`,
/// given `"LunarLander-v3"`). Registered by the crate that knows the backend ([`register_backend`]), so this
/// crate stays free of Python.
pub type BackendMaker = fn(id: &str, kwargs: &Kwargs) -> Result<Box<dyn Env>>;

static BACKENDS: std::sync::RwLock<Vec<(&'static str, BackendMaker)>> = std::sync::RwLock::new(Vec::new());

/// Let [`make`] build ids of the form `"<prefix>:<id>"` with `maker` (registering a prefix again replaces
/// its maker). The `flotilla` binary registers `"gymnasium"` (any Python Gymnasium env, through
/// flotilla-envs-python).
pub fn register_backend(prefix: &'static str, maker: BackendMaker) {
    let mut backends = BACKENDS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    backends.retain(|(p, _)| *p != prefix);
    backends.push((prefix, maker));
}

/// The backend env for an id with a `prefix:` if it has one (`None`: a native id).
fn make_backend(id: &str, kwargs: &Kwargs) -> Option<Result<Box<dyn Env>>> {
    let (prefix, rest) = id.split_once(':')?;
    let backends = BACKENDS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    Some(match backends.iter().find(|(p, _)| *p == prefix) {
        Some((_, maker)) => maker(rest, kwargs),
        None => Err(Error::UnknownEnv {
            id: id.to_string(),
            known: format!(
                "{}; backends: {} (the `flotilla` binary registers \"gymnasium:\")",
                REGISTRY.iter().map(|s| s.id).collect::<Vec<_>>().join(", "),
                if backends.is_empty() {
                    "none registered".to_string()
                } else {
                    backends.iter().map(|(p, _)| format!("{p}:")).collect::<Vec<_>>().join(", ")
                }
            ),
        }),
    })
}

/// `gym.make(id, **kwargs)`: the native env, inside its time limit; or, for `"<backend>:<id>"`, the env a
/// registered backend builds ([`register_backend`]).
///
/// ```
/// use flotilla_envs::{make, Kwargs};
/// let mut env = make("Pendulum-v1", &Kwargs::new().with("g", 9.81))?;
/// assert_eq!(env.max_episode_steps(), Some(200));
/// let (obs, _) = env.reset(Some(0))?;
/// assert_eq!(obs.len(), 3);
/// # Ok::<(), flotilla_core::Error>(())
/// ```
pub fn make(id: &str, kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    if let Some(env) = make_backend(id, kwargs) {
        return env;
    }
    Ok(match build(id, kwargs)? {
        (Native::CartPole(e), limit) => boxed_env(e, limit),
        (Native::Acrobot(e), limit) => boxed_env(e, limit),
        (Native::MountainCar(e), limit) => boxed_env(e, limit),
        (Native::MountainCarContinuous(e), limit) => boxed_env(e, limit),
        (Native::Pendulum(e), limit) => boxed_env(e, limit),
        (Native::Latency(e), limit) => boxed_env(e, limit),
    })
}

/// [`make`], as a [`BufferedEnv`] for the allocation-free path of [`VecEnv`](crate::VecEnv).
pub fn make_buffered(id: &str, kwargs: &Kwargs) -> Result<Box<dyn BufferedEnv>> {
    if let Some(env) = make_backend(id, kwargs) {
        return Ok(Box::new(crate::buffered::BoxedEnv::new(env?)));
    }
    Ok(match build(id, kwargs)? {
        (Native::CartPole(e), limit) => boxed_buffered(e, limit),
        (Native::Acrobot(e), limit) => boxed_buffered(e, limit),
        (Native::MountainCar(e), limit) => boxed_buffered(e, limit),
        (Native::MountainCarContinuous(e), limit) => boxed_buffered(e, limit),
        (Native::Pendulum(e), limit) => boxed_buffered(e, limit),
        (Native::Latency(e), limit) => boxed_buffered(e, limit),
    })
}

/// One freshly built native env, before boxing.
enum Native {
    CartPole(CartPole),
    Acrobot(Acrobot),
    MountainCar(MountainCar),
    MountainCarContinuous(MountainCarContinuous),
    Pendulum(Pendulum),
    Latency(Latency),
}

fn boxed_env<E: BufferedEnv + 'static>(env: E, limit: Option<usize>) -> Box<dyn Env> {
    match limit {
        Some(steps) => Box::new(TimeLimit::new(env, steps)),
        None => Box::new(env),
    }
}

fn boxed_buffered<E: BufferedEnv + 'static>(env: E, limit: Option<usize>) -> Box<dyn BufferedEnv> {
    match limit {
        Some(steps) => Box::new(TimeLimit::new(env, steps)),
        None => Box::new(env),
    }
}

fn build(id: &str, kwargs: &Kwargs) -> Result<(Native, Option<usize>)> {
    let spec = spec(id)?;
    let mut reader = KwargReader::new(spec.id, kwargs);
    let limit = match reader.int("max_episode_steps")? {
        None => spec.max_episode_steps,
        Some(-1) => None,
        Some(n) if n >= 1 => Some(
            usize::try_from(n)
                .map_err(|_| reader.error("max_episode_steps", format!("{n} does not fit in this platform's usize")))?,
        ),
        Some(n) => {
            return Err(reader
                .error("max_episode_steps", format!("expected a positive step count or -1 (no time limit), got {n}")));
        }
    };
    let native = match spec.id {
        "CartPole-v1" => Native::CartPole(CartPole::new(CartPoleConfig::read(&mut reader)?)?),
        "Acrobot-v1" => Native::Acrobot(Acrobot::new()),
        "MountainCar-v0" => Native::MountainCar(MountainCar::new(MountainCarConfig::read(&mut reader)?)?),
        "MountainCarContinuous-v0" => {
            Native::MountainCarContinuous(MountainCarContinuous::new(MountainCarContinuousConfig::read(&mut reader)?)?)
        }
        "Pendulum-v1" => Native::Pendulum(Pendulum::new(PendulumConfig::read(&mut reader)?)?),
        "Latency-v0" => Native::Latency(Latency::new(LatencyConfig::read(&mut reader)?)?),
        other => {
            return Err(Error::Unsupported { env: other.to_string(), what: "building from the registry".into() });
        }
    };
    let mut accepted = spec.kwargs.to_vec();
    accepted.push("max_episode_steps");
    reader.finish(&accepted)?;
    Ok((native, limit))
}
