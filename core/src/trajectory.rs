//! What actors send learners: trajectory chunks, gradients, and versioned parameters.
//!
//! A [`Chunk`] is `T` lock-step steps of `E` envs, time-major (index `t · E + e`). It carries everything a
//! learner needs to use the data on- or off-policy: the observations the policy acted on, the behaviour
//! policy's actions, log-probs and values, rewards and both episode-end flags, the true final observation of
//! every episode that ended inside the chunk (not the auto-reset one), the observations after the last step
//! (to bootstrap from), the parameter version that acted, and the episodes that finished.
//!
//! [`Chunk::validate`] is the single check a learner runs on data from outside: shapes, dtypes, lengths that
//! agree, finite numbers, flags and indices in range, and values that belong to the spaces the actor registered
//! (a discrete action outside `0..n` would otherwise reach libtorch's `gather` and kill the learner). Its error
//! names the field, the index and what was wrong.
use std::sync::Arc;

use crate::obs::{ObsBuf, ObsRef};
use crate::space::{DType, Space};

/// A field of a [`Chunk`] whose length disagrees with the chunk's shape or its reader's ([`Chunk::check_lengths`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthMismatch {
    /// The field, e.g. `chunk actions`.
    pub what: &'static str,
    /// Its length.
    pub got: usize,
    /// The length the shape asks for.
    pub expected: usize,
}

/// One finished episode, reported by the vectorised step that ended it (`VecEnv`) and carried in the chunk
/// that holds that step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeStats {
    /// Undiscounted return (summed in f64 from the unrounded rewards).
    pub episode_return: f64,
    /// Length in env steps.
    pub length: u64,
    /// Which env of the batch (of the actor's envs, in a chunk).
    pub env_index: usize,
    /// Whether it ended by truncation (time limit) rather than termination.
    pub truncated: bool,
    /// The task it ran in, in a multi-task batch (`[[tasks]]`, `TaskVecEnv`); `None` otherwise.
    pub task: Option<u32>,
}

/// `T` steps of `E` envs from one actor. Per-step arrays are time-major: element `t · E + e`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The id the learner gave the actor at registration.
    pub actor_id: u64,
    /// Version of the parameters that acted.
    pub policy_version: u64,
    /// Steps `T`.
    pub n_steps: usize,
    /// Envs `E`.
    pub n_envs: usize,
    /// Observations the policy acted on: `T · E · obs_dim` values.
    pub obs: ObsBuf,
    /// The observations after the last step (`E · obs_dim`): the bootstrap observations.
    pub bootstrap_obs: ObsBuf,
    /// Actions, `T · E · act_dim` (discrete actions as f32 indices; Gaussian samples before clipping).
    pub actions: Vec<f32>,
    /// Rewards, `T · E`.
    pub rewards: Vec<f32>,
    /// Episode reached a terminal state, `T · E`.
    pub terminated: Vec<bool>,
    /// Episode cut by a time limit, `T · E`.
    pub truncated: Vec<bool>,
    /// Behaviour log-probabilities of the actions, `T · E`, or empty for policies without them.
    pub log_probs: Vec<f32>,
    /// Behaviour values `V(obs)`, `T · E`, or empty.
    pub values: Vec<f32>,
    /// Recurrent policies: each env's state before the chunk's first step, `E · state_dim` (zeros where an
    /// episode starts there); empty for feed-forward policies.
    pub initial_state: Vec<f32>,
    /// Index `t · E + e` of each step where an episode ended (terminated or truncated), increasing.
    pub final_index: Vec<u32>,
    /// The true final observation of each of those episodes, `final_index.len() · obs_dim`.
    pub final_obs: ObsBuf,
    /// Episodes that finished in this chunk.
    pub episodes: Vec<EpisodeStats>,
}

/// What a learner expects of every chunk of a run. `obs_dim`, `obs_dtype` and `act_dim` describe the two spaces
/// as chunks carry them (`observation_space.flat_dim()`, its `Box` dtype, `action_space.flat_dim()`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkSpec {
    /// The run's observation space: observations must lie within a `Box`'s bounds.
    pub observation_space: Space,
    /// The run's action space: discrete actions must be indices `0..n` (the action minus `start`).
    pub action_space: Space,
    /// Flattened observation size.
    pub obs_dim: usize,
    /// Observation element type.
    pub obs_dtype: DType,
    /// f32 values per action.
    pub act_dim: usize,
    /// Envs per chunk.
    pub n_envs: usize,
    /// Steps per chunk.
    pub n_steps: usize,
    /// Whether behaviour log-probs and values are required (actor-critic algorithms).
    pub needs_behaviour: bool,
    /// Floats of recurrent state per env each chunk carries (`initial_state`); 0 for feed-forward policies.
    pub state_dim: usize,
    /// Of each env's state, the leading floats that must lie in `[−1, 1]` (a recurrent core's `h`; the
    /// LSTM's cell state after them need only be finite).
    pub state_bounded: usize,
    /// Tasks of a multi-task run (`[[tasks]]`; 0 without): every finished episode names one below this, and
    /// without tasks none names one.
    pub n_tasks: usize,
}

impl Chunk {
    /// One vectorised step of `rewards.len()` envs as a one-step chunk, for code that steps its own envs:
    /// `obs` the policy acted on, its `actions` (and `log_probs`, `values`, or empty), what followed.
    /// `next_obs` is the observation that truly followed each env's action; the chunk keeps it as the final
    /// observation where an episode ended, and all of it as the bootstrap rows. (A `VecEnv`'s steps go
    /// through `flotilla_envs::ChunkRecorder`, which keeps the auto-reset observations as the bootstrap.)
    #[allow(clippy::too_many_arguments)]
    pub fn from_step(
        obs: ObsRef<'_>,
        actions: &[f32],
        log_probs: &[f32],
        values: &[f32],
        rewards: &[f32],
        terminated: &[bool],
        truncated: &[bool],
        next_obs: ObsRef<'_>,
    ) -> Chunk {
        let e = rewards.len();
        let d = obs.len() / e.max(1);
        let ended: Vec<usize> = (0..e).filter(|&i| terminated[i] || truncated[i]).collect();
        let mut final_obs = ObsBuf::empty(obs.dtype());
        for &i in &ended {
            let same = final_obs.extend(next_obs.slice(i * d..(i + 1) * d));
            debug_assert!(same, "one dtype per chunk");
        }
        Chunk {
            actor_id: 0,
            policy_version: 0,
            n_steps: 1,
            n_envs: e,
            obs: obs.to_buf(),
            bootstrap_obs: next_obs.to_buf(),
            actions: actions.to_vec(),
            rewards: rewards.to_vec(),
            terminated: terminated.to_vec(),
            truncated: truncated.to_vec(),
            log_probs: log_probs.to_vec(),
            values: values.to_vec(),
            initial_state: Vec::new(),
            final_index: ended.iter().map(|&i| i as u32).collect(),
            final_obs,
            episodes: Vec::new(),
        }
    }

    /// Check every length against the chunk's own shape (`T · E` steps) and the reader's `n_envs`, `obs_dim` and
    /// `act_dim`; with `behaviour`, the behaviour log-probs and values must be there too. The first field that
    /// disagrees comes back, so that no reader indexes past a short field. ([`Chunk::validate`] checks this and
    /// more against the run's spaces; this is what every algorithm checks on any chunk it is handed.)
    pub fn check_lengths(
        &self,
        n_envs: usize,
        obs_dim: usize,
        act_dim: usize,
        behaviour: bool,
    ) -> Result<(), LengthMismatch> {
        let (k, e) = (self.transitions(), self.n_envs);
        // Without `behaviour` the behaviour fields are not read: compare them with themselves.
        let (log_probs, values) = if behaviour { (k, k) } else { (self.log_probs.len(), self.values.len()) };
        for (what, got, expected) in [
            ("chunk envs", e, n_envs),
            ("chunk observations", self.obs.len(), k * obs_dim),
            ("chunk bootstrap observations", self.bootstrap_obs.len(), e * obs_dim),
            ("chunk actions", self.actions.len(), k * act_dim),
            ("chunk rewards", self.rewards.len(), k),
            ("chunk terminated flags", self.terminated.len(), k),
            ("chunk truncated flags", self.truncated.len(), k),
            ("chunk final observations", self.final_obs.len(), self.final_index.len() * obs_dim),
            ("chunk behaviour log-probs", self.log_probs.len(), log_probs),
            ("chunk behaviour values", self.values.len(), values),
        ] {
            if got != expected {
                return Err(LengthMismatch { what, got, expected });
            }
        }
        Ok(())
    }

    /// Transitions in the chunk (`T · E`).
    pub fn transitions(&self) -> usize {
        self.n_steps * self.n_envs
    }

    /// Check the chunk against `spec`: every length agrees, dtypes match, numbers are finite, final indices
    /// are increasing, in range and exactly the steps where an episode ended, and the values belong to the run's
    /// spaces. The error names the field, the index and what was wrong, e.g. `actions[3] is 7, outside
    /// Discrete(2) (expected an integer in 0..2)`.
    ///
    /// Values, against the spaces:
    /// - discrete actions are integral indices in `0..n` (chunks carry `action − start`, as the actor's policy
    ///   emitted them);
    /// - `Box` actions need only be finite: values outside the bounds are **accepted**, because Gaussian
    ///   policies send their unclipped samples (the env got them clipped) and the learner's log-probabilities
    ///   must be computed on exactly those;
    /// - observations, bootstrap and final observations lie within a `Box`'s bounds (for `u8` frames too);
    ///   infinite bounds hold every finite value;
    /// - finished episodes have a finite return and a length of at least one step.
    ///
    /// Runs on every chunk a learner ingests, so it allocates only to describe a refusal.
    pub fn validate(&self, spec: &ChunkSpec) -> Result<(), String> {
        let (t, e) = (self.n_steps, self.n_envs);
        if t != spec.n_steps || e != spec.n_envs {
            return Err(format!("shape {t} steps × {e} envs, expected {} steps × {} envs", spec.n_steps, spec.n_envs));
        }
        let n = t * e;
        let len = |what: &str, got: usize, expected: usize| {
            if got == expected { Ok(()) } else { Err(format!("{what} has {got} values, expected {expected}")) }
        };
        for (what, buf, rows) in [("observations", &self.obs, n), ("bootstrap observations", &self.bootstrap_obs, e)] {
            if buf.dtype() != spec.obs_dtype {
                return Err(format!("{what} are {:?}, expected {:?}", buf.dtype(), spec.obs_dtype));
            }
            len(what, buf.len(), rows * spec.obs_dim)?;
        }
        len("actions", self.actions.len(), n * spec.act_dim)?;
        len("rewards", self.rewards.len(), n)?;
        len("terminated flags", self.terminated.len(), n)?;
        len("truncated flags", self.truncated.len(), n)?;
        if spec.needs_behaviour {
            len("behaviour log-probs", self.log_probs.len(), n)?;
            len("behaviour values", self.values.len(), n)?;
        } else {
            for (what, v) in [("behaviour log-probs", &self.log_probs), ("behaviour values", &self.values)] {
                if !v.is_empty() && v.len() != n {
                    return Err(format!("{what} has {} values, expected 0 or {n}", v.len()));
                }
            }
        }
        len("initial recurrent state", self.initial_state.len(), e * spec.state_dim)?;
        for (what, v) in [
            ("actions", &self.actions),
            ("rewards", &self.rewards),
            ("behaviour log-probs", &self.log_probs),
            ("behaviour values", &self.values),
            ("initial recurrent state", &self.initial_state),
        ] {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(format!("{what}[{i}] is {}, must be finite", v[i]));
            }
        }
        if spec.state_bounded > 0 {
            for (env, row) in self.initial_state.chunks_exact(spec.state_dim).enumerate() {
                if let Some(k) = row[..spec.state_bounded.min(spec.state_dim)].iter().position(|x| x.abs() > 1.0) {
                    return Err(format!(
                        "initial recurrent state[{}] is {}, outside [-1, 1] (env {env}'s hidden state h, element {k})",
                        env * spec.state_dim + k,
                        row[k]
                    ));
                }
            }
        }
        // No allocation on this path: every chunk a learner ingests passes here.
        let ended = || (0..n).filter(|&i| self.terminated[i] || self.truncated[i]).map(|i| i as u32);
        if !ended().eq(self.final_index.iter().copied()) {
            return Err(format!(
                "final_index {:?} does not list the {} steps where an episode ended",
                abbreviate(&self.final_index),
                ended().count()
            ));
        }
        if self.final_obs.dtype() != spec.obs_dtype {
            return Err(format!("final observations are {:?}, expected {:?}", self.final_obs.dtype(), spec.obs_dtype));
        }
        len("final observations", self.final_obs.len(), self.final_index.len() * spec.obs_dim)?;
        if let Space::Discrete { n, start } = spec.action_space {
            for (i, &a) in self.actions.iter().enumerate() {
                let problem = if a.fract() != 0.0 {
                    "not an integer index of"
                } else if a < 0.0 || a >= n as f32 {
                    "outside"
                } else {
                    continue;
                };
                return Err(format!(
                    "actions[{i}] is {a}, {problem} {} (expected an integer in 0..{n})",
                    discrete_name(n, start)
                ));
            }
        }
        // One pass over every observation: finite, and inside the space's bounds.
        let bounds = match &spec.observation_space {
            Space::Box { low, high, .. } => Some((low.as_slice(), high.as_slice())),
            Space::Discrete { .. } => None,
        };
        for (what, buf) in [
            ("observations", &self.obs),
            ("bootstrap observations", &self.bootstrap_obs),
            ("final observations", &self.final_obs),
        ] {
            if let Some((i, x)) = bad_observation(buf, bounds) {
                return Err(match bounds {
                    Some((low, high)) if x.is_finite() => {
                        let k = i % low.len();
                        format!(
                            "{what}[{i}] is {x}, outside the observation space's bounds [{}, {}] for element {k}",
                            low[k], high[k]
                        )
                    }
                    _ => format!("{what}[{i}] is {x}, must be finite"),
                });
            }
        }
        for (i, ep) in self.episodes.iter().enumerate() {
            if !ep.episode_return.is_finite() {
                return Err(format!("episodes[{i}].episode_return is {}, must be finite", ep.episode_return));
            }
            if ep.length == 0 {
                return Err(format!("episodes[{i}].length is 0, must be at least 1 step"));
            }
            if ep.env_index >= e {
                return Err(format!("episodes[{i}].env_index is {}, the chunk has {e} envs", ep.env_index));
            }
            match (ep.task, spec.n_tasks) {
                (None, 0) => {}
                (Some(k), n) if (k as usize) < n => {}
                (None, n) => return Err(format!("episodes[{i}] names no task; the run has {n} tasks")),
                (Some(k), 0) => return Err(format!("episodes[{i}].task is {k}; the run has no tasks")),
                (Some(k), n) => return Err(format!("episodes[{i}].task is {k}, the run has {n} tasks")),
            }
        }
        Ok(())
    }

    /// The observation that truly followed step `t` of env `e`, in the chunk's dtype: the final observation
    /// where an episode ended there, else the next step's (or the bootstrap) observation. `final_cursor` walks
    /// `final_index` and must start at 0 for a pass in increasing `t · E + e` order.
    pub fn next_obs(&self, t: usize, e: usize, obs_dim: usize, final_cursor: &mut usize) -> ObsRef<'_> {
        let i = t * self.n_envs + e;
        if self.final_index.get(*final_cursor) == Some(&(i as u32)) {
            let k = *final_cursor;
            *final_cursor += 1;
            self.final_obs.slice(k * obs_dim..(k + 1) * obs_dim)
        } else if t + 1 < self.n_steps {
            let j = i + self.n_envs;
            self.obs.slice(j * obs_dim..(j + 1) * obs_dim)
        } else {
            self.bootstrap_obs.slice(e * obs_dim..(e + 1) * obs_dim)
        }
    }

    /// The observations that truly followed step `t` of all `E` envs ([`Chunk::next_obs`] row by row): the
    /// next step's (or the bootstrap) observations as they stand in the chunk where no episode ended at `t`,
    /// else those copied into `scratch` with the final observations in the rows that ended. `final_cursor`
    /// walks `final_index` as in [`Chunk::next_obs`], for steps taken in increasing `t`.
    pub fn next_obs_rows<'a>(
        &'a self,
        t: usize,
        obs_dim: usize,
        scratch: &'a mut ObsBuf,
        final_cursor: &mut usize,
    ) -> ObsRef<'a> {
        let e = self.n_envs;
        let after = if t + 1 < self.n_steps {
            self.obs.slice((t + 1) * e * obs_dim..(t + 2) * e * obs_dim)
        } else {
            self.bootstrap_obs.as_ref()
        };
        let ends = |cursor: usize| self.final_index.get(cursor).is_some_and(|&i| (i as usize) < (t + 1) * e);
        if !ends(*final_cursor) {
            return after;
        }
        if scratch.dtype() != after.dtype() {
            *scratch = ObsBuf::with_capacity(after.dtype(), after.len());
        }
        scratch.clear();
        let mut same = scratch.extend(after);
        while ends(*final_cursor) {
            let k = *final_cursor;
            let env = self.final_index[k] as usize - t * e;
            same &= scratch.write_at(env * obs_dim, self.final_obs.slice(k * obs_dim..(k + 1) * obs_dim));
            *final_cursor += 1;
        }
        debug_assert!(same, "one dtype per chunk");
        scratch.as_ref()
    }
}

fn abbreviate(v: &[u32]) -> Vec<u32> {
    v.iter().copied().take(8).collect()
}

/// Gymnasium's name for a discrete space: `Discrete(2)`, or `Discrete(3, start=-1)`.
fn discrete_name(n: usize, start: i64) -> String {
    if start == 0 { format!("Discrete({n})") } else { format!("Discrete({n}, start={start})") }
}

/// The first element of `buf`, rows of `low.len()` values, outside `[low, high]` (NaN included): its index and
/// value.
/// The first observation value (index, value) that is not finite or lies outside `bounds` (per element,
/// cycling over the rows). u8 frames are finite by construction and are only read when the bounds do not
/// already cover every byte (Atari's [0, 255] do).
fn bad_observation(buf: &ObsBuf, bounds: Option<(&[f32], &[f32])>) -> Option<(usize, f32)> {
    match (buf, bounds) {
        (ObsBuf::F32(v), None) => v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i])),
        (ObsBuf::F32(v), Some((low, high))) => v
            .iter()
            .zip(low.iter().zip(high).cycle())
            .position(|(x, (l, h))| !(x.is_finite() && x >= l && x <= h))
            .map(|i| (i, v[i])),
        (ObsBuf::U8(_), None) => None,
        (ObsBuf::U8(v), Some((low, high))) => {
            if low.iter().all(|&l| l <= 0.0) && high.iter().all(|&h| h >= 255.0) {
                return None;
            }
            v.iter()
                .zip(low.iter().zip(high).cycle())
                .position(|(&b, (l, h))| !(f32::from(b) >= *l && f32::from(b) <= *h))
                .map(|i| (i, f32::from(v[i])))
        }
    }
}

/// A value tagged with the parameter version it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// Monotonic version: 0 for the initial parameters, +1 per published update.
    pub version: u64,
    /// The value.
    pub value: T,
}

/// Flat policy parameters as the learner publishes them (shared, never copied per reader).
pub type Params = Versioned<Arc<Vec<f32>>>;

/// A3C: a gradient an actor computed on its own chunk with the parameters of `policy_version`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradient {
    /// The id the learner gave the actor.
    pub actor_id: u64,
    /// Version of the parameters the gradient was computed with.
    pub policy_version: u64,
    /// The flat gradient of the trainable parameters, in the parameters' layout with frozen layers left out.
    pub values: Vec<f32>,
    /// Env steps the gradient's chunk covered.
    pub env_steps: u64,
    /// Episodes that finished in that chunk.
    pub episodes: Vec<EpisodeStats>,
}

impl Gradient {
    /// Check length and finiteness against the trainable parameter count.
    pub fn validate(&self, n_params: usize) -> Result<(), String> {
        if self.values.len() != n_params {
            return Err(format!(
                "gradient has {} values, expected {n_params} (one per trainable parameter)",
                self.values.len()
            ));
        }
        if let Some(i) = self.values.iter().position(|x| !x.is_finite()) {
            return Err(format!("gradient[{i}] is {}, must be finite", self.values[i]));
        }
        if self.env_steps == 0 {
            return Err("gradient covers 0 env steps".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> (Chunk, ChunkSpec) {
        // 2 steps × 2 envs, obs_dim 1; env 1 ends at step 0.
        let c = Chunk {
            actor_id: 1,
            policy_version: 3,
            n_steps: 2,
            n_envs: 2,
            obs: ObsBuf::F32(vec![0.0, 10.0, 1.0, 20.0]),
            bootstrap_obs: ObsBuf::F32(vec![2.0, 21.0]),
            actions: vec![0.0, 1.0, 1.0, 0.0],
            rewards: vec![1.0; 4],
            terminated: vec![false, true, false, false],
            truncated: vec![false; 4],
            log_probs: vec![-0.7; 4],
            values: vec![0.5; 4],
            initial_state: Vec::new(),
            final_index: vec![1],
            final_obs: ObsBuf::F32(vec![11.0]),
            episodes: vec![EpisodeStats {
                episode_return: 12.0,
                length: 12,
                env_index: 0,
                truncated: false,
                task: None,
            }],
        };
        let spec = ChunkSpec {
            observation_space: Space::box1d(vec![-30.0], vec![30.0]),
            action_space: Space::discrete(2),
            obs_dim: 1,
            obs_dtype: DType::F32,
            act_dim: 1,
            n_envs: 2,
            n_steps: 2,
            needs_behaviour: true,
            n_tasks: 0,
            state_dim: 0,
            state_bounded: 0,
        };
        (c, spec)
    }

    #[test]
    fn a_good_chunk_passes_and_yields_true_next_observations() {
        let (c, spec) = chunk();
        c.validate(&spec).unwrap();
        let mut out = Vec::new();
        let mut cursor = 0;
        for t in 0..2 {
            for e in 0..2 {
                c.next_obs(t, e, 1, &mut cursor).to_f32(&mut out);
            }
        }
        assert_eq!(out, vec![1.0, 11.0, 2.0, 21.0]);
        // Whole steps: the same rows, copied only at the step where an episode ended.
        let (mut rows, mut scratch, mut cursor) = (Vec::new(), ObsBuf::empty(DType::F32), 0);
        for t in 0..2 {
            c.next_obs_rows(t, 1, &mut scratch, &mut cursor).to_f32(&mut rows);
        }
        assert_eq!(rows, vec![1.0, 11.0, 2.0, 21.0]);
    }

    #[test]
    fn each_defect_is_named() {
        type Defect = fn(&mut Chunk);
        let cases: Vec<(Defect, &str)> = vec![
            (|c| c.rewards.pop().map(drop).unwrap_or(()), "rewards has 3 values, expected 4"),
            (|c| c.rewards[2] = f32::NAN, "rewards[2] is NaN"),
            (|c| c.obs = ObsBuf::U8(vec![0; 4]), "observations are U8, expected F32"),
            (|c| c.bootstrap_obs = ObsBuf::F32(vec![0.0; 3]), "bootstrap observations has 3 values"),
            (|c| c.final_index = vec![], "final_index [] does not list the 1 steps"),
            (|c| c.final_obs = ObsBuf::F32(vec![]), "final observations has 0 values, expected 1"),
            (|c| c.n_steps = 3, "shape 3 steps × 2 envs, expected 2 steps × 2 envs"),
            (|c| c.log_probs.clear(), "behaviour log-probs has 0 values"),
            (|c| c.obs = ObsBuf::F32(vec![0.0, f32::INFINITY, 0.0, 0.0]), "observations[1] is inf"),
            // Values against the spaces: Discrete(2) actions, observations within [-30, 30].
            (|c| c.actions[3] = 7.0, "actions[3] is 7, outside Discrete(2) (expected an integer in 0..2)"),
            (|c| c.actions[2] = -1.0, "actions[2] is -1, outside Discrete(2)"),
            (|c| c.actions[1] = 0.5, "actions[1] is 0.5, not an integer index of Discrete(2)"),
            (|c| c.actions[0] = f32::NAN, "actions[0] is NaN, must be finite"),
            (
                |c| c.obs = ObsBuf::F32(vec![0.0, 10.0, 31.0, 20.0]),
                "observations[2] is 31, outside the observation space's bounds [-30, 30] for element 0",
            ),
            (|c| c.bootstrap_obs = ObsBuf::F32(vec![2.0, -40.0]), "bootstrap observations[1] is -40, outside"),
            (|c| c.final_obs = ObsBuf::F32(vec![99.0]), "final observations[0] is 99, outside"),
            (|c| c.final_obs = ObsBuf::F32(vec![f32::NAN]), "final observations[0] is NaN, must be finite"),
            // Episode statistics.
            (|c| c.episodes[0].episode_return = f64::INFINITY, "episodes[0].episode_return is inf, must be finite"),
            (
                |c| {
                    c.episodes.push(EpisodeStats {
                        episode_return: 1.0,
                        length: 0,
                        env_index: 0,
                        truncated: false,
                        task: None,
                    })
                },
                "episodes[1].length is 0",
            ),
            (|c| c.episodes[0].env_index = 2, "episodes[0].env_index is 2, the chunk has 2 envs"),
            (|c| c.episodes[0].task = Some(0), "episodes[0].task is 0; the run has no tasks"),
            // Final indices: out of order, out of range.
            (
                |c| {
                    c.terminated[0] = true;
                    c.final_index = vec![1, 0];
                    c.final_obs = ObsBuf::F32(vec![11.0, 1.0]);
                },
                "final_index [1, 0] does not list the 2 steps",
            ),
            (|c| c.final_index = vec![1, 9], "final_index [1, 9] does not list the 1 steps"),
        ];
        for (break_it, expected) in cases {
            let (mut c, spec) = chunk();
            break_it(&mut c);
            let err = c.validate(&spec).unwrap_err();
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
        }
    }

    /// A recurrent policy's chunks carry `E · state_dim` finite floats of initial state; feed-forward ones none.
    #[test]
    fn the_initial_recurrent_state_is_checked_for_size_and_finiteness() {
        let (mut c, mut spec) = chunk();
        spec.state_dim = 3;
        c.initial_state = vec![0.1; 2 * 3];
        c.validate(&spec).unwrap();
        c.initial_state.pop();
        assert!(c.validate(&spec).unwrap_err().contains("initial recurrent state has 5 values, expected 6"));
        c.initial_state = vec![0.1, 0.2, f32::NAN, 0.0, 0.0, 0.0];
        assert!(c.validate(&spec).unwrap_err().contains("initial recurrent state[2] is NaN, must be finite"));
        // The leading `state_bounded` floats of each env's row (h) lie in [−1, 1]; the rest (c) need not.
        spec.state_bounded = 2;
        c.initial_state = vec![0.5, -1.0, 7.0, 1.0, 0.0, -9.0];
        c.validate(&spec).unwrap();
        c.initial_state[4] = -1.5;
        assert!(
            c.validate(&spec).unwrap_err().contains("initial recurrent state[4] is -1.5, outside [-1, 1] (env 1"),
            "{}",
            c.validate(&spec).unwrap_err()
        );
        spec.state_dim = 0;
        spec.state_bounded = 0;
        c.initial_state = vec![0.0; 6];
        assert!(c.validate(&spec).unwrap_err().contains("initial recurrent state has 6 values, expected 0"));
    }

    #[test]
    fn box_actions_may_lie_outside_their_bounds_but_must_be_finite() {
        // Gaussian policies send unclipped samples: the learner needs them for the log-probabilities.
        let (mut c, mut spec) = chunk();
        spec.action_space = Space::box1d(vec![-2.0], vec![2.0]);
        c.actions = vec![-9.0, 0.5, 3.0, 2.0];
        c.validate(&spec).unwrap();
        c.actions[2] = f32::NEG_INFINITY;
        assert!(c.validate(&spec).unwrap_err().contains("actions[2] is -inf, must be finite"));
    }

    #[test]
    fn discrete_actions_are_indices_from_start() {
        // Discrete(3, start=-1): the env takes -1, 0, 1; chunks carry the indices 0, 1, 2.
        let (mut c, mut spec) = chunk();
        spec.action_space = Space::Discrete { n: 3, start: -1 };
        c.actions = vec![0.0, 1.0, 2.0, 0.0];
        c.validate(&spec).unwrap();
        c.actions[0] = 3.0;
        let err = c.validate(&spec).unwrap_err();
        assert!(err.contains("actions[0] is 3, outside Discrete(3, start=-1) (expected an integer in 0..3)"), "{err}");
    }

    #[test]
    fn observation_bounds_hold_per_element_for_floats_and_frames() {
        // Infinite bounds (CartPole's velocities) hold every finite value; finite ones are checked per element.
        let (mut c, mut spec) = chunk();
        spec.observation_space = Space::box1d(vec![-1.0, f32::NEG_INFINITY], vec![1.0, f32::INFINITY]);
        spec.obs_dim = 2;
        c.obs = ObsBuf::F32(vec![0.5, 1e30, -1.0, -1e30, 1.0, 0.0, 0.0, 0.0]);
        c.bootstrap_obs = ObsBuf::F32(vec![0.0; 4]);
        c.final_obs = ObsBuf::F32(vec![0.0, 7.0]);
        c.validate(&spec).unwrap();
        c.obs = ObsBuf::F32(vec![0.5, 1e30, -1.0, -1e30, 1.0, 0.0, -1.5, 0.0]);
        assert!(c.validate(&spec).unwrap_err().contains("observations[6] is -1.5, outside"));
        c.obs = ObsBuf::F32(vec![0.5, 1e30, 1.5, -1e30, 1.0, 0.0, 0.0, 0.0]);
        assert!(c.validate(&spec).unwrap_err().contains("bounds [-1, 1] for element 0"));
        // u8 frames against a box of bytes in [0, 200].
        let (mut c, mut spec) = chunk();
        spec.observation_space = Space::Box { low: vec![0.0], high: vec![200.0], shape: vec![1], dtype: DType::U8 };
        spec.obs_dtype = DType::U8;
        c.obs = ObsBuf::U8(vec![0, 10, 200, 20]);
        c.bootstrap_obs = ObsBuf::U8(vec![2, 21]);
        c.final_obs = ObsBuf::U8(vec![11]);
        c.validate(&spec).unwrap();
        c.bootstrap_obs = ObsBuf::U8(vec![2, 255]);
        assert!(c.validate(&spec).unwrap_err().contains("bootstrap observations[1] is 255, outside"));
    }

    #[test]
    fn validating_a_good_chunk_allocates_nothing() {
        let (c, spec) = chunk();
        let before = alloc_counter::allocations();
        c.validate(&spec).unwrap();
        assert_eq!(alloc_counter::allocations(), before, "validate allocated on the success path");
        // The counter does see this thread's allocations: describing a refusal allocates.
        let (mut bad, _) = chunk();
        bad.actions[0] = 7.0;
        let before = alloc_counter::allocations();
        assert!(bad.validate(&spec).is_err());
        assert!(alloc_counter::allocations() > before);
    }

    /// Counts this thread's allocations (tests run on several threads at once).
    mod alloc_counter {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
        }

        struct Counting;

        // SAFETY: forwards to the system allocator; the counter is a const-initialised thread-local without a
        // destructor, so touching it never allocates.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
                // SAFETY: the caller's contract is the system allocator's.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: as above.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        pub fn allocations() -> u64 {
            ALLOCATIONS.with(Cell::get)
        }
    }

    #[test]
    fn gradients_are_checked() {
        let g =
            Gradient { actor_id: 1, policy_version: 0, values: vec![0.0, f32::NAN], env_steps: 5, episodes: vec![] };
        assert!(g.validate(2).unwrap_err().contains("gradient[1] is NaN"));
        assert!(g.validate(3).unwrap_err().contains("expected 3"));
    }
}
