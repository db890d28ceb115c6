use serde::{Deserialize, Serialize};

/// The complete dynamic state of an environment: what [`Env::snapshot`](crate::Env::snapshot) takes and
/// [`Env::restore`](crate::Env::restore) puts back, so that a resumed run continues bit for bit — the same
/// observations, rewards, flags and reset noise as the original would have produced.
///
/// Plain data, serialisable with serde (checkpoints store it as JSON). Construction arguments are not part
/// of it: restore into an env made with the same id and arguments. What each env keeps in `counters` and
/// `flags` is documented with the env; the order matters and the lengths are checked on restore.
///
/// ```text
/// CartPole-v1 under gym.make's TimeLimit, mid-episode:
/// { id: "CartPole-v1", state: None, counters: [37], flags: [], rng: None,      <- TimeLimit: elapsed steps
///   inner: { id: "CartPole-v1", state: [x, x_dot, theta, theta_dot],           <- CartPole itself
///            counters: [0], flags: [false], rng: "<opaque>", inner: None } }
/// ```
///
/// Non-finite numbers in `state` survive a restore but not JSON (which has no NaN or infinity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSnapshot {
    /// Registered id of the env that took it; an env of another id refuses it.
    pub id: String,
    /// The physical state in the env's [`Env::state`](crate::Env::state) order; `None` before the first
    /// reset (and for wrappers, whose wrapped env holds it).
    pub state: Option<Vec<f64>>,
    /// Integer bookkeeping that decides the future (step counts, ...), in an order the env documents.
    pub counters: Vec<u64>,
    /// Boolean bookkeeping (which branch an `Option` is on, precision modes, ...), in an order the env
    /// documents.
    pub flags: Vec<bool>,
    /// The reset-noise stream and whether it was seeded, serialised opaquely by the env that owns it;
    /// `None` for envs without randomness and for wrappers.
    pub rng: Option<String>,
    /// For a wrapper (e.g. a time limit), the snapshot of the env it wraps; `None` for an unwrapped env.
    pub inner: Option<Box<EnvSnapshot>>,
}

impl EnvSnapshot {
    /// A snapshot of `id` with no state, counters, flags, stream or wrapped env, to fill in.
    pub fn new(id: impl Into<String>) -> Self {
        EnvSnapshot { id: id.into(), state: None, counters: Vec::new(), flags: Vec::new(), rng: None, inner: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Action, Env, Error, Info, Obs, Result, Space, Step};

    /// An env that implements only the required methods.
    struct Minimal(Space);

    impl Env for Minimal {
        fn id(&self) -> &str {
            "Minimal-v0"
        }
        fn observation_space(&self) -> &Space {
            &self.0
        }
        fn action_space(&self) -> &Space {
            &self.0
        }
        fn reset(&mut self, _: Option<u64>) -> Result<(Obs, Info)> {
            Ok((Obs::F32(vec![]), Info::new()))
        }
        fn step(&mut self, _: Action<'_>) -> Result<Step> {
            Ok(Step { obs: Obs::F32(vec![]), reward: 0.0, terminated: false, truncated: false, info: Info::new() })
        }
    }

    #[test]
    fn snapshots_are_unsupported_unless_an_env_provides_them() {
        let mut env = Minimal(Space::discrete(2));
        let unsupported = |what: &str| Error::Unsupported { env: "Minimal-v0".into(), what: what.into() };
        assert_eq!(env.snapshot(), Err(unsupported("taking a snapshot")));
        assert_eq!(env.restore(&EnvSnapshot::new("Minimal-v0")), Err(unsupported("restoring a snapshot")));
    }

    #[test]
    fn serialises_nested_snapshots() {
        let inner = EnvSnapshot {
            state: Some(vec![0.1, -2.5]),
            counters: vec![3],
            flags: vec![true],
            rng: Some("opaque".into()),
            ..EnvSnapshot::new("Env-v0")
        };
        let outer = EnvSnapshot { counters: vec![7], inner: Some(Box::new(inner)), ..EnvSnapshot::new("Env-v0") };
        let text = toml::to_string(&outer).unwrap();
        assert_eq!(toml::from_str::<EnvSnapshot>(&text).unwrap(), outer);
    }
}
