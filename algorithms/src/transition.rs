//! One vectorised env step as a learner sees it ([`Transition`]), where training stands ([`Progress`]), and
//! the steps of a trajectory chunk read back as transitions ([`for_each_transition`]).
use flotilla_core::{Chunk, ObsBuf, ObsRef};

use crate::Result;
use crate::policy::ActOutput;

/// One vectorised env step, as the learner saw it. All slices are row-major over `n_envs` rows.
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    /// Observations the policy acted on.
    pub obs: ObsRef<'a>,
    /// What `Policy::act` returned for them (actions, and log-probs/values where the algorithm makes them).
    pub act: &'a ActOutput,
    /// Rewards.
    pub rewards: &'a [f32],
    /// The episode reached a terminal state: do not bootstrap.
    pub terminated: &'a [bool],
    /// The episode was cut by a time limit: bootstrap from `next_obs`.
    pub truncated: &'a [bool],
    /// The observation that truly followed each row: the final observation where an episode ended (not the
    /// auto-reset one), else the next step's observation.
    pub next_obs: ObsRef<'a>,
}

/// Where training stands, for schedules (learning-rate annealing, ε decay, β annealing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Env steps taken so far (all envs), including the step just observed.
    pub env_steps: u64,
    /// The training budget.
    pub total_env_steps: u64,
}

impl Progress {
    /// `1 − env_steps / total`, clamped to [0, 1] (SB3's `progress_remaining`).
    pub fn remaining(&self) -> f64 {
        (1.0 - self.env_steps as f64 / self.total_env_steps.max(1) as f64).clamp(0.0, 1.0)
    }
}

/// Call `f` with each of `chunk`'s `T` steps as a [`Transition`] of its `E` envs, in time order, with the true
/// next observations restored ([`Chunk::next_obs`]), in the chunk's dtype. Only the actions are carried in
/// the transition's [`ActOutput`].
pub fn for_each_transition(chunk: &Chunk, mut f: impl FnMut(&Transition<'_>) -> Result<()>) -> Result<()> {
    let (t_max, e) = (chunk.n_steps, chunk.n_envs);
    let n = chunk.transitions();
    if n == 0 {
        return Ok(());
    }
    let d = chunk.obs.len() / n;
    let act_dim = chunk.actions.len() / n;
    let dtype = chunk.obs.dtype();
    let mut next_obs = ObsBuf::with_capacity(dtype, e * d);
    let mut act = ActOutput::default();
    let mut cursor = 0;
    for t in 0..t_max {
        let rows = t * e..(t + 1) * e;
        next_obs.clear();
        for env in 0..e {
            let same = next_obs.extend(chunk.next_obs(t, env, d, &mut cursor));
            debug_assert!(same, "one dtype per chunk");
        }
        act.actions.clear();
        act.actions.extend_from_slice(&chunk.actions[rows.start * act_dim..rows.end * act_dim]);
        f(&Transition {
            obs: chunk.obs.slice(rows.start * d..rows.end * d),
            act: &act,
            rewards: &chunk.rewards[rows.clone()],
            terminated: &chunk.terminated[rows.clone()],
            truncated: &chunk.truncated[rows],
            next_obs: next_obs.as_ref(),
        })?;
    }
    Ok(())
}
