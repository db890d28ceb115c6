//! Latency-v0: CartPole-v1 whose every step takes a fixed wall-clock time, like an expensive simulator.
//!
//! For scaling benchmarks of many actor processes: with a 1 ms step the env itself costs an actor almost no
//! CPU, as a simulator running elsewhere would; how far actors then scale on a few cores depends on their own
//! per-step cost (inference, chunking, sending), which is what the benchmark measures.
//! Not a Gymnasium env; its dynamics, spaces, rewards, reset noise and snapshot layout are those of
//! [`CartPole`] (which it runs inside), under its own id, with the same 500-step time limit.
//!
//! Each step sets a deadline `step_latency` after it starts, runs CartPole's step, then waits for the
//! deadline: the step's own compute counts towards the latency instead of adding to it. The wait only
//! sleeps (the waiting actors must leave the cores to the others; an earlier version spun on `yield_now`
//! for the last 50 µs, which cost each actor ~50 µs of CPU per step). A step therefore never returns before
//! its deadline, and ends after it by the OS timer slack (~50–80 µs on an idle Linux machine); on an
//! oversubscribed one the scheduler's delay adds to that. Resets wait `reset_latency` the same way
//! (0 by default); a step or reset that fails returns at once.
//!
//! [`VecEnv`](crate::VecEnv) steps its envs one after another, so a batch step of `n` Latency envs takes
//! `n` latencies: the benchmark scales with processes, not with the batch.
//!
//! [`LatencyConfig`] takes `step_latency_us` (1000) and `reset_latency_us` (0), non-negative integers, and
//! every argument of [`CartPoleConfig`]. Errors name `Latency-v0`, not the CartPole inside.

use std::thread;
use std::time::{Duration, Instant};

use flotilla_core::{Action, Env, EnvSnapshot, Error, Info, Obs, Result, Space, Step};

use crate::buffered::{BufferedEnv, StepOutcome, reset_via, step_via};
use crate::kwargs::{KwargReader, Kwargs, read_config};
use crate::snapshot::check_id;
use crate::{CartPole, CartPoleConfig};

const ID: &str = "Latency-v0";
const OBS_DIM: usize = 4;

/// Latency-v0's constructor arguments; `Default` is a 1 ms step, an instant reset and Gymnasium's CartPole.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyConfig {
    /// Wall-clock time of each step, its compute included (`step_latency_us`, 1000 µs).
    pub step_latency: Duration,
    /// Wall-clock time of each reset, its compute included (`reset_latency_us`, 0).
    pub reset_latency: Duration,
    /// The dynamics, from CartPole's arguments.
    pub cartpole: CartPoleConfig,
}

impl Default for LatencyConfig {
    fn default() -> Self {
        LatencyConfig {
            step_latency: Duration::from_micros(1000),
            reset_latency: Duration::ZERO,
            cartpole: CartPoleConfig::default(),
        }
    }
}

impl LatencyConfig {
    /// Argument names accepted by [`from_kwargs`](LatencyConfig::from_kwargs): the two latencies, then
    /// [`CartPoleConfig::KWARGS`].
    pub const KWARGS: &'static [&'static str] = &[
        "step_latency_us",
        "reset_latency_us",
        "sutton_barto_reward",
        "gravity",
        "masscart",
        "masspole",
        "length",
        "force_mag",
        "tau",
    ];

    /// The config from `gym.make`-style arguments; unknown keys, wrong types, negative latencies and
    /// non-physical CartPole constants are [`Error::BadArgument`].
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<Self> {
        read_config(ID, kwargs, Self::KWARGS, Self::read)
    }

    pub(crate) fn read(r: &mut KwargReader<'_>) -> Result<Self> {
        let d = LatencyConfig::default();
        Ok(LatencyConfig {
            step_latency: micros(r, "step_latency_us")?.unwrap_or(d.step_latency),
            reset_latency: micros(r, "reset_latency_us")?.unwrap_or(d.reset_latency),
            cartpole: CartPoleConfig::read(r).map_err(renamed)?,
        })
    }
}

/// A duration given in whole microseconds; negative is [`Error::BadArgument`].
fn micros(r: &mut KwargReader<'_>, key: &str) -> Result<Option<Duration>> {
    match r.int(key)? {
        None => Ok(None),
        Some(us) => u64::try_from(us)
            .map(|us| Some(Duration::from_micros(us)))
            .map_err(|_| r.error(key, format!("expected a non-negative number of microseconds, got {us}"))),
    }
}

/// `err` as reported by Latency-v0: the CartPole inside names itself, the caller asked for Latency-v0.
fn renamed(mut err: Error) -> Error {
    match &mut err {
        Error::InvalidAction { env, .. }
        | Error::ResetNeeded { env }
        | Error::BadArgument { env, .. }
        | Error::InvalidState { env, .. }
        | Error::InvalidSnapshot { env, .. }
        | Error::Unsupported { env, .. }
        | Error::Backend { env, .. } => *env = ID.to_string(),
        Error::UnknownEnv { .. } => {}
    }
    err
}

/// Blocks until `deadline` by sleeping: the waiting actors leave the cores to the others (no spinning).
fn wait_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        thread::sleep(left);
    }
}

/// The Latency environment (unwrapped: [`make`](crate::make) adds the 500-step [`TimeLimit`](crate::TimeLimit)).
#[derive(Debug, Clone)]
pub struct Latency {
    cartpole: CartPole,
    step_latency: Duration,
    reset_latency: Duration,
}

impl Default for Latency {
    fn default() -> Self {
        let d = LatencyConfig::default();
        Latency { cartpole: CartPole::default(), step_latency: d.step_latency, reset_latency: d.reset_latency }
    }
}

impl Latency {
    /// A Latency env with the given latencies and CartPole constants (checked by
    /// [`CartPoleConfig::validate`]).
    pub fn new(config: LatencyConfig) -> Result<Self> {
        Ok(Latency {
            cartpole: CartPole::new(config.cartpole).map_err(renamed)?,
            step_latency: config.step_latency,
            reset_latency: config.reset_latency,
        })
    }

    /// The arguments this env runs with.
    pub fn config(&self) -> LatencyConfig {
        LatencyConfig {
            step_latency: self.step_latency,
            reset_latency: self.reset_latency,
            cartpole: *self.cartpole.config(),
        }
    }

    /// The CartPole inside, e.g. for its typed physical state.
    pub fn inner(&self) -> &CartPole {
        &self.cartpole
    }

    /// The CartPole inside, mutably; stepping it directly skips the latency.
    pub fn inner_mut(&mut self) -> &mut CartPole {
        &mut self.cartpole
    }
}

// Delegates to the CartPole inside, as `TimeLimit` does: `impl_native_env!` needs the physical state and
// RNG as fields of the env itself.
/// The snapshot is CartPole's under this env's id, a native env's layout; the latencies are construction
/// arguments, not saved.
impl Env for Latency {
    fn id(&self) -> &str {
        ID
    }
    fn observation_space(&self) -> &Space {
        self.cartpole.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.cartpole.action_space()
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)> {
        reset_via(self, seed, OBS_DIM)
    }
    fn step(&mut self, action: Action<'_>) -> Result<Step> {
        step_via(self, action, OBS_DIM)
    }
    fn state(&self) -> Result<Vec<f64>> {
        self.cartpole.state().map_err(renamed)
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        self.cartpole.set_state(state).map_err(renamed)
    }
    fn snapshot(&self) -> Result<EnvSnapshot> {
        let mut snapshot = self.cartpole.snapshot().map_err(renamed)?;
        snapshot.id = ID.to_string();
        Ok(snapshot)
    }
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<()> {
        check_id(ID, snapshot)?;
        let mut inner = snapshot.clone();
        inner.id = self.cartpole.id().to_string();
        self.cartpole.restore(&inner).map_err(renamed)
    }
}

impl BufferedEnv for Latency {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        let deadline = Instant::now() + self.reset_latency;
        self.cartpole.reset_into(seed, obs).map_err(renamed)?;
        wait_until(deadline);
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let deadline = Instant::now() + self.step_latency;
        let out = self.cartpole.step_into(action, obs).map_err(renamed)?;
        wait_until(deadline);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TimeLimit, make};

    fn latency(step_us: i64) -> Box<dyn Env> {
        make(ID, &Kwargs::new().with("step_latency_us", step_us)).unwrap()
    }

    #[test]
    fn observations_and_rewards_are_cartpoles() {
        let mut cartpole = make("CartPole-v1", &Kwargs::new()).unwrap();
        let mut env = latency(0);
        assert_eq!(env.observation_space(), cartpole.observation_space());
        assert_eq!(env.action_space(), cartpole.action_space());
        assert_eq!(env.max_episode_steps(), Some(500));
        for seed in [0, 7] {
            assert_eq!(env.reset(Some(seed)).unwrap().0, cartpole.reset(Some(seed)).unwrap().0);
            for t in 0..600 {
                let action = Action::Discrete(t * 7 % 3 % 2);
                let (a, b) = (env.step(action).unwrap(), cartpole.step(action).unwrap());
                assert_eq!(
                    (&a.obs, a.reward, a.terminated, a.truncated),
                    (&b.obs, b.reward, b.terminated, b.truncated)
                );
                if a.terminated || a.truncated {
                    break;
                }
            }
            assert_eq!(env.state().unwrap(), cartpole.state().unwrap());
        }
    }

    #[test]
    fn a_step_takes_the_latency_and_not_much_more() {
        let mut env = latency(2000);
        let mut cartpole = CartPole::default();
        assert_eq!(env.reset(Some(0)).unwrap().0, cartpole.reset(Some(0)).unwrap().0);
        for _ in 0..3 {
            let start = Instant::now();
            let step = env.step(Action::Discrete(1)).unwrap();
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(2), "{took:?}");
            assert!(took < Duration::from_millis(50), "{took:?}");
            assert_eq!(step, cartpole.step(Action::Discrete(1)).unwrap(), "waiting changes nothing");
        }
    }

    #[test]
    fn latencies_default_to_a_millisecond_step_and_an_instant_reset() {
        let config = LatencyConfig::from_kwargs(&Kwargs::new()).unwrap();
        assert_eq!(config, LatencyConfig::default());
        assert_eq!((config.step_latency, config.reset_latency), (Duration::from_micros(1000), Duration::ZERO));
        let mut env = Latency::new(config).unwrap();
        let start = Instant::now();
        env.reset(Some(0)).unwrap();
        env.step(Action::Discrete(0)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(1));
    }

    #[test]
    fn reset_latency_and_zero_step_latency() {
        let kwargs = Kwargs::new().with("step_latency_us", 0i64).with("reset_latency_us", 1500i64);
        let mut env = make(ID, &kwargs).unwrap();
        let start = Instant::now();
        env.reset(Some(0)).unwrap();
        assert!(start.elapsed() >= Duration::from_micros(1500));
        let start = Instant::now();
        for t in 0..20 {
            if env.step(Action::Discrete(t % 2)).unwrap().terminated {
                env.reset(None).unwrap();
            }
        }
        assert!(start.elapsed() < Duration::from_millis(20), "zero latency waits for nothing");
    }

    #[test]
    fn bad_latencies_and_unknown_keys_are_bad_arguments() {
        for key in ["step_latency_us", "reset_latency_us"] {
            let err = make(ID, &Kwargs::new().with(key, -1i64)).err().expect("negative latency");
            assert_eq!(
                err,
                Error::BadArgument {
                    env: ID.into(),
                    key: key.into(),
                    detail: "expected a non-negative number of microseconds, got -1".into()
                }
            );
            let err = make(ID, &Kwargs::new().with(key, 1.5)).err().expect("not an integer");
            assert!(matches!(&err, Error::BadArgument { key: k, .. } if k == key), "{err}");
        }
        let err = make(ID, &Kwargs::new().with("latency_us", 10i64)).err().expect("unknown key");
        assert!(
            matches!(&err, Error::BadArgument { env, key, detail }
                if env == ID && key == "latency_us" && detail.contains("step_latency_us")),
            "{err}"
        );
        let err = make(ID, &Kwargs::new().with("masscart", -1.0)).err().expect("non-physical");
        assert!(matches!(&err, Error::BadArgument { env, key, .. } if env == ID && key == "masscart"), "{err}");
    }

    #[test]
    fn cartpole_arguments_pass_through() {
        assert!(LatencyConfig::KWARGS.ends_with(CartPoleConfig::KWARGS));
        let kwargs = Kwargs::new().with("step_latency_us", 0i64).with("sutton_barto_reward", true).with("length", 1.0);
        let config = LatencyConfig::from_kwargs(&kwargs).unwrap();
        assert!(config.cartpole.sutton_barto_reward);
        assert_eq!(Latency::new(config).unwrap().inner().config().length, 1.0);
        let mut env = make(ID, &kwargs).unwrap();
        env.reset(Some(0)).unwrap();
        assert_eq!(env.step(Action::Discrete(0)).unwrap().reward, 0.0);
    }

    #[test]
    fn errors_and_snapshots_carry_this_id() {
        let mut env = TimeLimit::new(
            Latency::new(LatencyConfig { step_latency: Duration::ZERO, ..Default::default() }).unwrap(),
            500,
        );
        assert_eq!(env.step(Action::Discrete(0)), Err(Error::ResetNeeded { env: ID.into() }));
        env.reset(Some(3)).unwrap();
        assert!(matches!(env.step(Action::Discrete(2)), Err(Error::InvalidAction { env, .. }) if env == ID));
        env.step(Action::Discrete(1)).unwrap();
        let snapshot = env.snapshot().unwrap();
        assert_eq!((snapshot.id.as_str(), snapshot.inner.as_ref().unwrap().id.as_str()), (ID, ID));

        let mut resumed = make(ID, &Kwargs::new().with("step_latency_us", 0i64)).unwrap();
        resumed.restore(&snapshot).unwrap();
        assert_eq!(resumed.step(Action::Discrete(0)).unwrap(), env.step(Action::Discrete(0)).unwrap());
        let cartpole = make("CartPole-v1", &Kwargs::new()).unwrap().snapshot().unwrap();
        assert!(matches!(resumed.restore(&cartpole), Err(Error::InvalidSnapshot { env, .. }) if env == ID));
    }
}
