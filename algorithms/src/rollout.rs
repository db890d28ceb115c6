//! Fixed-size, time-major storage for one on-policy rollout of `n_steps × n_envs` transitions.
//!
//! The collection loop, for each of `n_steps` steps:
//! 1. [`Rollout::push_policy`] — observations the policy saw, the actions it took, their log-probs and values;
//! 2. [`Rollout::push_outcome`] — rewards, `terminated`, `truncated` from the vectorised env;
//! 3. [`Rollout::set_final_value`] — for each truncated env, `V(true final observation)`.
//!
//! Then [`Rollout::finish`] with the values of the observations after the last step computes GAE advantages
//! and returns. Buffers are allocated once and reused.
use crate::algorithm::Transition;
use crate::checkpoint::Checkpoint;
use crate::gae::gae;
use crate::{Error, Result};

/// One rollout. Index `t · n_envs + env` for per-transition values, times `obs_dim` / `act_dim` for vectors.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// Number of parallel envs.
    pub n_envs: usize,
    /// Steps per env.
    pub n_steps: usize,
    /// Flattened observation size.
    pub obs_dim: usize,
    /// Action size: 1 for discrete actions (stored as f32 indices), `D` for continuous ones.
    pub act_dim: usize,
    /// Observations the policy acted on.
    pub obs: Vec<f32>,
    /// Actions as sampled (continuous actions before clipping to the bounds).
    pub actions: Vec<f32>,
    /// Behaviour log-probabilities of `actions`.
    pub log_probs: Vec<f32>,
    /// `V(obs)` when acting.
    pub values: Vec<f32>,
    /// Rewards.
    pub rewards: Vec<f32>,
    /// Episode reached a terminal state.
    pub terminated: Vec<bool>,
    /// Episode cut by a time limit.
    pub truncated: Vec<bool>,
    /// Value of the observation that truly followed each step (filled by `set_final_value` and `finish`).
    pub next_values: Vec<f32>,
    /// GAE advantages (after `finish`).
    pub advantages: Vec<f32>,
    /// Value targets `advantages + values` (after `finish`).
    pub returns: Vec<f32>,
    steps: usize,
}

impl Rollout {
    /// Empty storage for `n_steps × n_envs` transitions.
    pub fn new(n_envs: usize, n_steps: usize, obs_dim: usize, act_dim: usize) -> Self {
        let n = n_envs * n_steps;
        Rollout {
            n_envs,
            n_steps,
            obs_dim,
            act_dim,
            obs: Vec::with_capacity(n * obs_dim),
            actions: Vec::with_capacity(n * act_dim),
            log_probs: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            next_values: vec![0.0; n],
            advantages: vec![0.0; n],
            returns: vec![0.0; n],
            steps: 0,
        }
    }

    /// Forget the stored transitions, keeping the allocations.
    pub fn clear(&mut self) {
        for v in [&mut self.obs, &mut self.actions, &mut self.log_probs, &mut self.values, &mut self.rewards] {
            v.clear();
        }
        self.terminated.clear();
        self.truncated.clear();
        self.steps = 0;
    }

    /// Number of transitions stored (`steps × n_envs`).
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether all `n_steps` steps are stored.
    pub fn is_full(&self) -> bool {
        self.steps == self.n_steps
    }

    /// Record what the policy saw and did at the current step.
    pub fn push_policy(&mut self, obs: &[f32], actions: &[f32], log_probs: &[f32], values: &[f32]) -> Result<()> {
        check_len("rollout observations", obs.len(), self.n_envs * self.obs_dim)?;
        check_len("rollout actions", actions.len(), self.n_envs * self.act_dim)?;
        check_len("rollout log-probs", log_probs.len(), self.n_envs)?;
        check_len("rollout values", values.len(), self.n_envs)?;
        if self.steps == self.n_steps {
            return Err(Error::BadLength {
                what: "rollout steps (buffer full)".into(),
                got: self.steps + 1,
                expected: self.n_steps,
            });
        }
        self.obs.extend_from_slice(obs);
        self.actions.extend_from_slice(actions);
        self.log_probs.extend_from_slice(log_probs);
        self.values.extend_from_slice(values);
        Ok(())
    }

    /// Record the env's response to the current step's actions.
    pub fn push_outcome(&mut self, rewards: &[f32], terminated: &[bool], truncated: &[bool]) -> Result<()> {
        check_len("rollout rewards", rewards.len(), self.n_envs)?;
        check_len("rollout terminated flags", terminated.len(), self.n_envs)?;
        check_len("rollout truncated flags", truncated.len(), self.n_envs)?;
        check_len("rollout outcomes (push_policy first)", self.rewards.len() + self.n_envs, self.values.len())?;
        self.rewards.extend_from_slice(rewards);
        self.terminated.extend_from_slice(terminated);
        self.truncated.extend_from_slice(truncated);
        self.steps += 1;
        Ok(())
    }

    /// `V(final observation)` of env `env`, truncated at the step just pushed.
    pub fn set_final_value(&mut self, env: usize, value: f32) {
        let i = (self.steps - 1) * self.n_envs + env;
        self.next_values[i] = value;
    }

    /// Compute next-state values, GAE advantages and returns. `last_values` are `V` of the observations after
    /// the final step (the first observations of new episodes where an env just ended: those are masked).
    pub fn finish(&mut self, last_values: &[f32], gamma: f32, lambda: f32) -> Result<()> {
        check_len("rollout last values", last_values.len(), self.n_envs)?;
        let n = self.len();
        let dones: Vec<bool> = self.terminated.iter().zip(&self.truncated).map(|(a, b)| *a || *b).collect();
        for i in 0..n {
            if !dones[i] {
                // The next observation is the one the policy saw at the next step (or after the rollout).
                self.next_values[i] =
                    if i + self.n_envs < n { self.values[i + self.n_envs] } else { last_values[i + self.n_envs - n] };
            } else if self.terminated[i] {
                self.next_values[i] = 0.0;
            }
        }
        let (adv, ret) = (&mut self.advantages[..n], &mut self.returns[..n]);
        gae(
            &self.rewards,
            &self.values,
            &self.next_values[..n],
            &self.terminated,
            &dones,
            self.n_envs,
            gamma,
            lambda,
            adv,
            ret,
        );
        Ok(())
    }
}

impl Rollout {
    /// Save the stored transitions under `prefix` (shape and step count included).
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        for (name, v) in [
            ("obs", &self.obs),
            ("actions", &self.actions),
            ("log_probs", &self.log_probs),
            ("values", &self.values),
            ("rewards", &self.rewards),
            ("next_values", &self.next_values),
        ] {
            c.put_f32(format!("{prefix}.{name}"), v);
        }
        c.put_meta(format!("{prefix}.terminated"), &self.terminated)?;
        c.put_meta(format!("{prefix}.truncated"), &self.truncated)?;
        c.put_meta(format!("{prefix}.shape"), &[self.n_envs, self.n_steps, self.obs_dim, self.act_dim, self.steps])
    }

    /// Restore what [`Rollout::write_to`] saved into a rollout of the same shape.
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let shape: [usize; 5] = c.meta(&format!("{prefix}.shape"))?;
        if shape[..4] != [self.n_envs, self.n_steps, self.obs_dim, self.act_dim] {
            return Err(Error::Checkpoint(format!(
                "rollout of shape {:?} in the checkpoint, this agent's is {:?}",
                &shape[..4],
                [self.n_envs, self.n_steps, self.obs_dim, self.act_dim]
            )));
        }
        self.steps = shape[4];
        self.obs = c.take_f32(&format!("{prefix}.obs"))?;
        self.actions = c.take_f32(&format!("{prefix}.actions"))?;
        self.log_probs = c.take_f32(&format!("{prefix}.log_probs"))?;
        self.values = c.take_f32(&format!("{prefix}.values"))?;
        self.rewards = c.take_f32(&format!("{prefix}.rewards"))?;
        self.next_values = c.take_f32(&format!("{prefix}.next_values"))?;
        self.terminated = c.meta(&format!("{prefix}.terminated"))?;
        self.truncated = c.meta(&format!("{prefix}.truncated"))?;
        Ok(())
    }
}

/// A [`Rollout`] filled from the trainer's [`Transition`]s, as PPO and A2C collect it: truncated episodes are
/// bootstrapped from `V(true final observation)`, and the rollout is finished with `V` of the observations
/// after its last step.
#[derive(Debug, Clone)]
pub struct RolloutCollector {
    rollout: Rollout,
    /// The observations after the rollout's last step, to bootstrap from.
    bootstrap_obs: Vec<f32>,
}

impl RolloutCollector {
    /// Empty storage for `n_steps × n_envs` transitions.
    pub fn new(n_envs: usize, n_steps: usize, obs_dim: usize, act_dim: usize) -> Self {
        RolloutCollector { rollout: Rollout::new(n_envs, n_steps, obs_dim, act_dim), bootstrap_obs: Vec::new() }
    }

    /// Store one vectorised step; `values` computes `V` for a batch of observations.
    pub fn observe(&mut self, step: &Transition<'_>, values: impl FnOnce(&[f32]) -> Result<Vec<f32>>) -> Result<()> {
        let r = &mut self.rollout;
        r.push_policy(step.obs, &step.act.actions, &step.act.log_probs, &step.act.values)?;
        r.push_outcome(step.rewards, step.terminated, step.truncated)?;
        // Bootstrap truncated episodes from their true final observation, in one batched call.
        let d = r.obs_dim;
        let cut: Vec<usize> = (0..r.n_envs).filter(|&i| step.truncated[i] && !step.terminated[i]).collect();
        if !cut.is_empty() {
            let rows: Vec<f32> = cut.iter().flat_map(|&i| step.next_obs[i * d..(i + 1) * d].iter().copied()).collect();
            for (&i, v) in cut.iter().zip(values(&rows)?) {
                r.set_final_value(i, v);
            }
        }
        if r.is_full() {
            self.bootstrap_obs.clear();
            self.bootstrap_obs.extend_from_slice(step.next_obs);
        }
        Ok(())
    }

    /// When the rollout is full: compute GAE advantages and returns and hand it out (give it back with
    /// [`RolloutCollector::recycle`] to reuse its buffers). `None` while it is still filling.
    pub fn finish(
        &mut self,
        values: impl FnOnce(&[f32]) -> Result<Vec<f32>>,
        gamma: f32,
        lambda: f32,
    ) -> Result<Option<Rollout>> {
        if !self.rollout.is_full() {
            return Ok(None);
        }
        let last_values = values(&self.bootstrap_obs)?;
        let empty = Rollout::new(self.rollout.n_envs, self.rollout.n_steps, self.rollout.obs_dim, self.rollout.act_dim);
        let mut rollout = std::mem::replace(&mut self.rollout, empty);
        rollout.finish(&last_values, gamma, lambda)?;
        Ok(Some(rollout))
    }

    /// Take back a rollout [`RolloutCollector::finish`] handed out, cleared, to fill again.
    pub fn recycle(&mut self, mut rollout: Rollout) {
        rollout.clear();
        self.rollout = rollout;
    }

    /// Save the partly filled rollout and the bootstrap observations under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        self.rollout.write_to(c, prefix)?;
        c.put_f32(format!("{prefix}.bootstrap_obs"), &self.bootstrap_obs);
        Ok(())
    }

    /// Restore what [`RolloutCollector::write_to`] saved.
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        self.rollout.read_from(c, prefix)?;
        self.bootstrap_obs = c.take_f32(&format!("{prefix}.bootstrap_obs"))?;
        Ok(())
    }
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected { Ok(()) } else { Err(Error::BadLength { what: what.to_string(), got, expected }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_values_follow_time_and_truncation() {
        // 2 envs × 2 steps; env 1 is truncated at step 0 with V(final obs) = 7.
        let mut r = Rollout::new(2, 2, 1, 1);
        r.push_policy(&[0.0, 0.0], &[0.0, 1.0], &[0.0, 0.0], &[1.0, 2.0]).unwrap();
        r.push_outcome(&[1.0, 1.0], &[false, false], &[false, true]).unwrap();
        r.set_final_value(1, 7.0);
        r.push_policy(&[0.0, 0.0], &[0.0, 1.0], &[0.0, 0.0], &[3.0, 4.0]).unwrap();
        r.push_outcome(&[1.0, 1.0], &[true, false], &[false, false]).unwrap();
        assert!(r.is_full());
        r.finish(&[5.0, 6.0], 1.0, 1.0).unwrap();
        assert_eq!(r.next_values, vec![3.0, 7.0, 0.0, 6.0]);
        // env 1: step 0 truncated => Â = 1 + 7 - 2; step 1 => Â = 1 + 6 - 4.
        assert_eq!(r.advantages[1], 6.0);
        assert_eq!(r.advantages[3], 3.0);
        // env 0: step 1 terminated => Â = 1 - 3 = -2; step 0 => δ = 1 + 3 - 1 = 3, Â = 3 + (-2) = 1.
        assert_eq!(r.advantages[2], -2.0);
        assert_eq!(r.advantages[0], 1.0);
        assert!(r.push_policy(&[0.0, 0.0], &[0.0, 1.0], &[0.0, 0.0], &[3.0, 4.0]).is_err(), "full buffer refuses");
        assert!(matches!(r.finish(&[1.0], 1.0, 1.0), Err(Error::BadLength { .. })));
    }
}
