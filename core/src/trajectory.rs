//! What actors send learners: trajectory chunks, gradients, and versioned parameters.
//!
//! A [`Chunk`] is `T` lock-step steps of `E` envs, time-major (index `t · E + e`). It carries everything a
//! learner needs to use the data on- or off-policy: the observations the policy acted on, the behaviour
//! policy's actions, log-probs and values, rewards and both episode-end flags, the true final observation of
//! every episode that ended inside the chunk (not the auto-reset one), the observations after the last step
//! (to bootstrap from), the parameter version that acted, and the episodes that finished.
//!
//! [`Chunk::validate`] is the single check a learner runs on data from outside: shapes, dtypes, lengths that
//! agree, finite numbers, flags and indices in range. Its error names the field and what was wrong.
use std::sync::Arc;

use crate::space::DType;

/// Observation storage: image frames stay `u8` end to end; everything else is `f32`.
#[derive(Debug, Clone, PartialEq)]
pub enum ObsBuf {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// Bytes (image frames).
    U8(Vec<u8>),
}

impl ObsBuf {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            ObsBuf::F32(_) => DType::F32,
            ObsBuf::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ObsBuf::F32(v) => v.len(),
            ObsBuf::U8(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (u8 frames converted), appended to `out`.
    pub fn extend_f32(&self, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
        match self {
            ObsBuf::F32(v) => out.extend_from_slice(&v[range]),
            ObsBuf::U8(v) => out.extend(v[range].iter().map(|&b| f32::from(b))),
        }
    }
}

/// One finished episode, as the actor's env saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeStats {
    /// Undiscounted return.
    pub episode_return: f64,
    /// Length in env steps.
    pub length: u64,
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
    /// Index `t · E + e` of each step where an episode ended (terminated or truncated), increasing.
    pub final_index: Vec<u32>,
    /// The true final observation of each of those episodes, `final_index.len() · obs_dim`.
    pub final_obs: ObsBuf,
    /// Episodes that finished in this chunk.
    pub episodes: Vec<EpisodeStats>,
}

/// What a learner expects of every chunk of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkSpec {
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
}

impl Chunk {
    /// Transitions in the chunk (`T · E`).
    pub fn transitions(&self) -> usize {
        self.n_steps * self.n_envs
    }

    /// Check the chunk against `spec`: every length agrees, dtypes match, numbers are finite, final indices
    /// are increasing, in range and exactly the steps where an episode ended. The error names the problem.
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
        for (what, v) in [
            ("actions", &self.actions),
            ("rewards", &self.rewards),
            ("behaviour log-probs", &self.log_probs),
            ("behaviour values", &self.values),
        ] {
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(format!("{what}[{i}] is {}, must be finite", v[i]));
            }
        }
        for (what, buf) in [
            ("observations", &self.obs),
            ("bootstrap observations", &self.bootstrap_obs),
            ("final observations", &self.final_obs),
        ] {
            if let ObsBuf::F32(v) = buf
                && let Some(i) = v.iter().position(|x| !x.is_finite())
            {
                return Err(format!("{what}[{i}] is {}, must be finite", v[i]));
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
        if let Some(ep) = self.episodes.iter().find(|ep| !ep.episode_return.is_finite()) {
            return Err(format!("episode return {} must be finite", ep.episode_return));
        }
        Ok(())
    }

    /// The observation that truly followed step `t` of env `e`, appended as f32 to `out`: the final
    /// observation where an episode ended there, else the next step's (or the bootstrap) observation.
    /// `final_cursor` walks `final_index` and must start at 0 for a pass in increasing `t · E + e` order.
    pub fn next_obs_into(&self, t: usize, e: usize, obs_dim: usize, final_cursor: &mut usize, out: &mut Vec<f32>) {
        let i = t * self.n_envs + e;
        if self.final_index.get(*final_cursor) == Some(&(i as u32)) {
            let k = *final_cursor;
            *final_cursor += 1;
            self.final_obs.extend_f32(k * obs_dim..(k + 1) * obs_dim, out);
        } else if t + 1 < self.n_steps {
            let j = i + self.n_envs;
            self.obs.extend_f32(j * obs_dim..(j + 1) * obs_dim, out);
        } else {
            self.bootstrap_obs.extend_f32(e * obs_dim..(e + 1) * obs_dim, out);
        }
    }
}

fn abbreviate(v: &[u32]) -> Vec<u32> {
    v.iter().copied().take(8).collect()
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
    /// The flat gradient, in the parameters' layout.
    pub values: Vec<f32>,
    /// Env steps the gradient's chunk covered.
    pub env_steps: u64,
    /// Episodes that finished in that chunk.
    pub episodes: Vec<EpisodeStats>,
}

impl Gradient {
    /// Check length and finiteness against the parameter count.
    pub fn validate(&self, n_params: usize) -> Result<(), String> {
        if self.values.len() != n_params {
            return Err(format!("gradient has {} values, expected {n_params} (one per parameter)", self.values.len()));
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
            final_index: vec![1],
            final_obs: ObsBuf::F32(vec![11.0]),
            episodes: vec![EpisodeStats { episode_return: 12.0, length: 12 }],
        };
        let spec =
            ChunkSpec { obs_dim: 1, obs_dtype: DType::F32, act_dim: 1, n_envs: 2, n_steps: 2, needs_behaviour: true };
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
                c.next_obs_into(t, e, 1, &mut cursor, &mut out);
            }
        }
        assert_eq!(out, vec![1.0, 11.0, 2.0, 21.0]);
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
        ];
        for (break_it, expected) in cases {
            let (mut c, spec) = chunk();
            break_it(&mut c);
            let err = c.validate(&spec).unwrap_err();
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
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
