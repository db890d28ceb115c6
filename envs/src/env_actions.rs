//! From policy outputs to env actions.
//!
//! Policies emit f32 rows: an index for discrete spaces, an unclipped Gaussian sample for boxes. Envs take
//! `start + index`, or the sample clipped to the box bounds (as SB3 does); the rollout keeps the unclipped
//! sample, whose log-probability the policy computed.
use crate::VecActions;
use flotilla_core::{Action, Space};

/// The env-facing form of one policy action (clipped into `scratch` for boxes).
pub fn env_action<'a>(space: &Space, action: &[f32], scratch: &'a mut Vec<f32>) -> Action<'a> {
    match space {
        Space::Discrete { start, .. } => Action::Discrete(action[0] as i64 + start),
        Space::Box { low, high, .. } => {
            scratch.clear();
            scratch.extend(clip_row(action, low, high));
            Action::Continuous(scratch)
        }
    }
}

fn clip_row<'a>(row: &'a [f32], low: &'a [f32], high: &'a [f32]) -> impl Iterator<Item = f32> + 'a {
    row.iter().zip(low.iter().zip(high)).map(|(a, (l, h))| a.clamp(*l, *h))
}

/// Reusable buffers for converting a batch of policy actions.
#[derive(Debug, Default)]
pub struct EnvActions {
    discrete: Vec<i64>,
    continuous: Vec<f32>,
}

impl EnvActions {
    /// Convert a row-major batch of policy actions for a `VecEnv` with this action space.
    pub fn convert(&mut self, space: &Space, actions: &[f32]) -> VecActions<'_> {
        match space {
            Space::Discrete { start, .. } => {
                self.discrete.clear();
                self.discrete.extend(actions.iter().map(|a| *a as i64 + start));
                VecActions::Discrete(&self.discrete)
            }
            Space::Box { low, high, .. } => {
                self.continuous.clear();
                for row in actions.chunks_exact(low.len()) {
                    self.continuous.extend(clip_row(row, low, high));
                }
                VecActions::Continuous(&self.continuous)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discrete_offsets_and_box_clips() {
        let mut buf = EnvActions::default();
        let d = Space::Discrete { n: 3, start: -1 };
        assert_eq!(buf.convert(&d, &[0.0, 2.0]), VecActions::Discrete(&[-1, 1]));
        let b = Space::box1d(vec![-2.0, 0.0], vec![2.0, 1.0]);
        assert_eq!(buf.convert(&b, &[3.0, -1.0, 0.5, 0.5]), VecActions::Continuous(&[2.0, 0.0, 0.5, 0.5]));
        let mut s = Vec::new();
        assert_eq!(env_action(&b, &[-9.0, 9.0], &mut s), Action::Continuous(&[-2.0, 1.0]));
    }
}
