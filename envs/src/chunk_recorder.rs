//! Vectorised env steps recorded into [`Chunk`]s: what an actor process sends its learner and what the
//! single-process trainer hands its agent — the one form in which data enters an algorithm.
use flotilla_core::{Chunk, Error, ObsBuf, ObsRef, Result};

use crate::vec_env::VecStep;

/// Builds [`Chunk`]s of `n_steps` steps from the steps of a vectorised env: the observations the policy acted
/// on, its actions (log-probs and values where it makes them), the env's rewards and flags, the true final
/// observation of every episode that ended, and after the last step the observations to bootstrap from.
///
/// ```text
/// loop { act(obs) ─► step = envs.step(actions) ─► if recorder.record(obs, actions, …, &step)? { use recorder.chunk() } }
/// ```
/// The chunk's buffers are reused: the step after a full chunk starts the next one in them.
#[derive(Debug)]
pub struct ChunkRecorder {
    chunk: Chunk,
    recorded: usize,
}

impl ChunkRecorder {
    /// A recorder of chunks of `n_steps` (≥ 1) steps.
    pub fn new(n_steps: usize) -> Self {
        ChunkRecorder { chunk: empty_chunk(n_steps.max(1)), recorded: 0 }
    }

    /// Record one step: `obs` the policy acted on, its `actions`, `log_probs` and `values` (empty where the
    /// policy makes none), and what the envs returned. `true` when this step completes the chunk
    /// ([`ChunkRecorder::chunk`], its bootstrap observations `step.obs`). An env that ended an episode without
    /// reporting its final observation is an error, and the chunk is started again.
    pub fn record(
        &mut self,
        obs: ObsRef<'_>,
        actions: &[f32],
        log_probs: &[f32],
        values: &[f32],
        step: &VecStep<'_>,
    ) -> Result<bool> {
        let e = step.rewards.len();
        if self.recorded == self.chunk.n_steps || self.recorded == 0 {
            self.start(e, obs);
        }
        let c = &mut self.chunk;
        let t = self.recorded;
        // One dtype per chunk: the env's, which the buffers were started with.
        let mut same = c.obs.extend(obs);
        for i in 0..e {
            if step.terminated[i] || step.truncated[i] {
                let Some(last) = step.final_obs(i) else {
                    self.recorded = 0;
                    return Err(Error::InvalidState {
                        env: "vector env".into(),
                        detail: format!("env {i} ended an episode without reporting its final observation"),
                    });
                };
                c.final_index.push((t * e + i) as u32);
                same &= c.final_obs.extend(last);
            }
        }
        debug_assert!(same, "one dtype per chunk");
        c.episodes.extend_from_slice(step.episodes);
        c.actions.extend_from_slice(actions);
        c.log_probs.extend_from_slice(log_probs);
        c.values.extend_from_slice(values);
        c.rewards.extend_from_slice(step.rewards);
        c.terminated.extend_from_slice(step.terminated);
        c.truncated.extend_from_slice(step.truncated);
        self.recorded += 1;
        if self.recorded < c.n_steps {
            return Ok(false);
        }
        c.bootstrap_obs.clear();
        let same = c.bootstrap_obs.extend(step.obs);
        debug_assert!(same, "one dtype per chunk");
        Ok(true)
    }

    /// Set the chunk's initial recurrent state (each env's state before its first step; see
    /// [`Chunk::initial_state`]), kept until the next call. Feed-forward policies never call it.
    pub fn set_initial_state(&mut self, state: &[f32]) {
        self.chunk.initial_state.clear();
        self.chunk.initial_state.extend_from_slice(state);
    }

    /// Steps recorded into the chunk being built (0: the next [`ChunkRecorder::record`] starts a new one).
    pub fn recorded(&self) -> usize {
        self.recorded
    }

    /// The chunk being recorded: complete right after [`ChunkRecorder::record`] returned `true`.
    pub fn chunk(&self) -> &Chunk {
        &self.chunk
    }

    /// Give up the completed chunk (e.g. to send it); the next step starts a new one in fresh buffers.
    pub fn take(&mut self) -> Chunk {
        self.recorded = 0;
        let fresh = empty_chunk(self.chunk.n_steps);
        std::mem::replace(&mut self.chunk, fresh)
    }

    /// Empty the buffers for a chunk of `n_envs` envs whose observations are like `obs`.
    fn start(&mut self, n_envs: usize, obs: ObsRef<'_>) {
        self.recorded = 0;
        let c = &mut self.chunk;
        c.n_envs = n_envs;
        for buf in [&mut c.obs, &mut c.bootstrap_obs, &mut c.final_obs] {
            if buf.dtype() != obs.dtype() {
                *buf = ObsBuf::with_capacity(obs.dtype(), obs.len() * c.n_steps);
            }
            buf.clear();
        }
        for v in [&mut c.actions, &mut c.rewards, &mut c.log_probs, &mut c.values] {
            v.clear();
        }
        c.terminated.clear();
        c.truncated.clear();
        c.final_index.clear();
        c.episodes.clear();
    }
}

fn empty_chunk(n_steps: usize) -> Chunk {
    let empty = || ObsBuf::empty(flotilla_core::DType::F32);
    Chunk {
        actor_id: 0,
        policy_version: 0,
        n_steps,
        n_envs: 0,
        obs: empty(),
        bootstrap_obs: empty(),
        actions: Vec::new(),
        rewards: Vec::new(),
        terminated: Vec::new(),
        truncated: Vec::new(),
        log_probs: Vec::new(),
        values: Vec::new(),
        initial_state: Vec::new(),
        final_index: Vec::new(),
        final_obs: empty(),
        episodes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EnvRole, Kwargs, VecActions, make_vector};

    /// Three-step chunks of two CartPoles: every column has its length, episode ends carry their final
    /// observation at the right index, the bootstrap observations are the envs' latest, and a second chunk
    /// starts afresh in the same buffers.
    #[test]
    fn chunks_hold_the_steps_their_finals_and_the_bootstrap() {
        let mut envs = make_vector("CartPole-v1", &Kwargs::new(), 2, EnvRole::Training).unwrap();
        let mut obs = envs.reset(Some(3)).unwrap().to_buf();
        let mut recorder = ChunkRecorder::new(3);
        let (mut chunks, mut ended) = (0, 0);
        for step_i in 0..60 {
            let actions = [0.0f32, 1.0];
            let step = envs.step(&VecActions::Discrete(&[0, 1])).unwrap();
            let ended_at = |i: usize| step.terminated[i] || step.truncated[i];
            let expected_finals: Vec<u32> =
                (0..2).filter(|&i| ended_at(i)).map(|i| ((step_i % 3) * 2 + i) as u32).collect();
            ended += expected_finals.len();
            let full = recorder.record(obs.as_ref(), &actions, &[], &[], &step).unwrap();
            let c = recorder.chunk();
            assert!(c.final_index.ends_with(&expected_finals));
            obs = step.obs.to_buf();
            assert_eq!(full, step_i % 3 == 2);
            if full {
                chunks += 1;
                assert_eq!((c.n_steps, c.n_envs, c.obs.len(), c.actions.len(), c.rewards.len()), (3, 2, 24, 6, 6));
                assert_eq!(c.bootstrap_obs, obs);
                assert_eq!(c.final_obs.len(), c.final_index.len() * 4);
                assert!(c.log_probs.is_empty() && c.values.is_empty());
            }
        }
        assert_eq!(chunks, 20);
        assert!(ended > 0, "pushing one way ends CartPole episodes within 60 steps");
    }
}
