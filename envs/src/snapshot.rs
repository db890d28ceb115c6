//! [`EnvSnapshot`]s of the native envs: what [`impl_native_env!`](crate::buffered::impl_native_env) writes
//! into `snapshot` and reads back in `restore`.
//!
//! A native env's snapshot is its physical state (`None` before the first reset), its [`EnvRng`] (stream
//! and `seeded` flag, as one string) and the env's [`Bookkeeping`] — for CartPole `steps_beyond_terminated`
//! (flags `[is_some]`, counters `[value or 0]`), for MountainCarContinuous `state_is_f32` (flags
//! `[state_is_f32]`), nothing for the others. Restoring checks the id, the layout (no wrapped snapshot, the
//! state's length, the number of counters and flags) and the stream before anything changes. State values
//! are taken as they are, non-finite included: they are what the env held.

use flotilla_core::{EnvSnapshot, Error, Result};

use crate::seeding::EnvRng;

/// Dynamic state of a native env besides its physical state and RNG, as snapshot counters and flags.
pub(crate) trait Bookkeeping: Sized {
    /// Counters it takes.
    const COUNTERS: usize;
    /// Flags it takes.
    const FLAGS: usize;
    /// Appends its counters and flags.
    fn save(&self, counters: &mut Vec<u64>, flags: &mut Vec<bool>);
    /// Reads them back from exactly [`COUNTERS`](Bookkeeping::COUNTERS) counters and
    /// [`FLAGS`](Bookkeeping::FLAGS) flags.
    fn load(counters: &[u64], flags: &[bool]) -> Self;
}

/// No bookkeeping (Acrobot, MountainCar, Pendulum).
impl Bookkeeping for () {
    const COUNTERS: usize = 0;
    const FLAGS: usize = 0;
    fn save(&self, _: &mut Vec<u64>, _: &mut Vec<bool>) {}
    fn load(_: &[u64], _: &[bool]) -> Self {}
}

/// A mode flag (MountainCarContinuous's `state_is_f32`).
impl Bookkeeping for bool {
    const COUNTERS: usize = 0;
    const FLAGS: usize = 1;
    fn save(&self, _: &mut Vec<u64>, flags: &mut Vec<bool>) {
        flags.push(*self);
    }
    fn load(_: &[u64], flags: &[bool]) -> Self {
        flags[0]
    }
}

/// An optional count (CartPole's `steps_beyond_terminated`): flag `is_some`, counter the value or 0.
impl Bookkeeping for Option<u64> {
    const COUNTERS: usize = 1;
    const FLAGS: usize = 1;
    fn save(&self, counters: &mut Vec<u64>, flags: &mut Vec<bool>) {
        flags.push(self.is_some());
        counters.push(self.unwrap_or(0));
    }
    fn load(counters: &[u64], flags: &[bool]) -> Self {
        flags[0].then_some(counters[0])
    }
}

/// [`Error::InvalidSnapshot`] for `env`.
pub(crate) fn invalid(env: &str, detail: impl Into<String>) -> Error {
    Error::InvalidSnapshot { env: env.to_string(), detail: detail.into() }
}

/// Refuses a snapshot taken by an env of another id.
pub(crate) fn check_id(env: &str, snapshot: &EnvSnapshot) -> Result<()> {
    if snapshot.id == env {
        Ok(())
    } else {
        Err(invalid(env, format!("it was taken from {:?}, not {env:?}", snapshot.id)))
    }
}

/// Checks that `snapshot` has `counters` counters and `flags` flags.
pub(crate) fn check_lengths(env: &str, snapshot: &EnvSnapshot, counters: usize, flags: usize) -> Result<()> {
    if snapshot.counters.len() == counters && snapshot.flags.len() == flags {
        Ok(())
    } else {
        Err(invalid(
            env,
            format!(
                "{} counters and {} flags, expected {counters} and {flags}",
                snapshot.counters.len(),
                snapshot.flags.len()
            ),
        ))
    }
}

/// [`Env::snapshot`](flotilla_core::Env::snapshot) of a native env.
pub(crate) fn native_snapshot<const N: usize, B: Bookkeeping>(
    env: &str,
    state: Option<[f64; N]>,
    rng: &EnvRng,
    bookkeeping: &B,
) -> EnvSnapshot {
    let mut snapshot = EnvSnapshot::new(env);
    snapshot.state = state.map(|s| s.to_vec());
    bookkeeping.save(&mut snapshot.counters, &mut snapshot.flags);
    snapshot.rng = Some(rng.to_snapshot());
    snapshot
}

/// What a native env restores, read from its snapshot and checked.
pub(crate) struct NativeState<const N: usize, B> {
    pub(crate) state: Option<[f64; N]>,
    pub(crate) rng: EnvRng,
    pub(crate) bookkeeping: B,
}

/// Reads and checks a native env's snapshot without changing anything; the caller then assigns the parts.
pub(crate) fn native_restore<const N: usize, B: Bookkeeping>(
    env: &str,
    snapshot: &EnvSnapshot,
) -> Result<NativeState<N, B>> {
    check_id(env, snapshot)?;
    if snapshot.inner.is_some() {
        return Err(invalid(env, "it wraps another snapshot (taken through a wrapper such as TimeLimit)"));
    }
    let state = match &snapshot.state {
        None => None,
        Some(s) => Some(
            <[f64; N]>::try_from(s.as_slice())
                .map_err(|_| invalid(env, format!("the physical state has {} elements, expected {N}", s.len())))?,
        ),
    };
    check_lengths(env, snapshot, B::COUNTERS, B::FLAGS)?;
    let rng = snapshot.rng.as_deref().ok_or_else(|| invalid(env, "it has no RNG stream"))?;
    let rng = EnvRng::from_snapshot(rng).map_err(|e| invalid(env, e))?;
    Ok(NativeState { state, rng, bookkeeping: B::load(&snapshot.counters, &snapshot.flags) })
}
