//! The time limit that `gym.make` adds, mirroring `gymnasium/wrappers/common.py` (`TimeLimit`).
//!
//! Each successful step counts; once `elapsed >= max_episode_steps` the step reports `truncated`.
//! Where the same step also terminates, both flags are set, exactly as Gymnasium reports them; learners
//! bootstrap from the final observation only when `truncated && !terminated`.
//! Stepping on past the limit (without a reset) keeps reporting `truncated`, as in Gymnasium.
//!
//! Its [`EnvSnapshot`] has one counter, the elapsed steps, and the wrapped env's snapshot as `inner`
//! (the limit itself is a construction argument, not saved).

use flotilla_core::{Action, Env, EnvSnapshot, Info, Obs, Result, Space, Step};

use crate::buffered::{BufferedEnv, StepOutcome};
use crate::snapshot::{check_id, check_lengths, invalid};

/// Truncates episodes of the wrapped env after `max_episode_steps` steps.
#[derive(Debug, Clone)]
pub struct TimeLimit<E> {
    env: E,
    max_episode_steps: usize,
    elapsed_steps: usize,
}

impl<E: Env> TimeLimit<E> {
    /// Wraps `env`. Gymnasium requires `max_episode_steps >= 1`; 0 behaves like 1.
    pub fn new(env: E, max_episode_steps: usize) -> Self {
        TimeLimit { env, max_episode_steps, elapsed_steps: 0 }
    }

    /// The wrapped env.
    pub fn inner(&self) -> &E {
        &self.env
    }

    /// The wrapped env, mutably (e.g. to set its physical state through typed accessors).
    pub fn inner_mut(&mut self) -> &mut E {
        &mut self.env
    }

    /// Unwraps.
    pub fn into_inner(self) -> E {
        self.env
    }

    /// Steps taken since the last reset (Gymnasium's `_elapsed_steps`).
    pub fn elapsed_steps(&self) -> usize {
        self.elapsed_steps
    }

    /// Overwrites the step count, e.g. to test truncation from a chosen point (as setting
    /// `env._elapsed_steps` in Python).
    pub fn set_elapsed_steps(&mut self, elapsed_steps: usize) {
        self.elapsed_steps = elapsed_steps;
    }

    /// Counts a successful step and decides truncation (independent of termination, as Gymnasium).
    #[inline]
    fn count(&mut self, truncated: bool) -> bool {
        self.elapsed_steps += 1;
        truncated || self.elapsed_steps >= self.max_episode_steps
    }
}

impl<E: Env> Env for TimeLimit<E> {
    fn id(&self) -> &str {
        self.env.id()
    }
    fn observation_space(&self) -> &Space {
        self.env.observation_space()
    }
    fn action_space(&self) -> &Space {
        self.env.action_space()
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)> {
        let out = self.env.reset(seed)?;
        self.elapsed_steps = 0;
        Ok(out)
    }
    fn step(&mut self, action: Action<'_>) -> Result<Step> {
        let mut step = self.env.step(action)?;
        step.truncated = self.count(step.truncated);
        Ok(step)
    }
    fn max_episode_steps(&self) -> Option<usize> {
        Some(self.max_episode_steps)
    }
    fn state(&self) -> Result<Vec<f64>> {
        self.env.state()
    }
    fn set_state(&mut self, state: &[f64]) -> Result<()> {
        self.env.set_state(state)
    }
    fn snapshot(&self) -> Result<EnvSnapshot> {
        let mut snapshot = EnvSnapshot::new(self.id());
        snapshot.counters.push(self.elapsed_steps as u64);
        snapshot.inner = Some(Box::new(self.env.snapshot()?));
        Ok(snapshot)
    }
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<()> {
        let id = self.id();
        check_id(id, snapshot)?;
        let Some(inner) = &snapshot.inner else {
            return Err(invalid(
                id,
                "it has no wrapped snapshot, expected a TimeLimit's (taken without a time limit?)",
            ));
        };
        if snapshot.state.is_some() || snapshot.rng.is_some() {
            return Err(invalid(id, "a TimeLimit's snapshot has no state or RNG stream of its own"));
        }
        check_lengths(id, snapshot, 1, 0)?;
        let elapsed = usize::try_from(snapshot.counters[0])
            .map_err(|_| invalid(id, format!("{} elapsed steps do not fit in usize", snapshot.counters[0])))?;
        // The wrapped env checks its part before changing anything; ours is checked, so nothing fails after it.
        self.env.restore(inner)?;
        self.elapsed_steps = elapsed;
        Ok(())
    }
}

impl<E: BufferedEnv> BufferedEnv for TimeLimit<E> {
    fn reset_into(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<()> {
        self.env.reset_into(seed, obs)?;
        self.elapsed_steps = 0;
        Ok(())
    }

    #[inline]
    fn step_into(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<StepOutcome> {
        let mut out = self.env.step_into(action, obs)?;
        out.truncated = self.count(out.truncated);
        Ok(out)
    }
}
