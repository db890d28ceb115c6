//! Exact resume for envs that cannot save their state (ale-py's vector env, Python Gymnasium envs).
//!
//! The trainer records every batch of actions it steps the envs with after their seeded reset. A resume
//! builds fresh envs, resets them with the same seed and steps them through the recorded actions: the
//! engines are deterministic given the seed and the actions (sticky actions and no-op resets draw from
//! per-env generators seeded at reset), so this reproduces every env's game, RNG and running episode
//! exactly. The replayed observations are then checked against the ones the checkpoint saved, so a changed
//! engine (another ale-py version) is an error, not a silent divergence.
//!
//! Cost: 8 bytes per env step kept in memory and in the checkpoint, and a resume replays every env step of
//! the run so far (without the agent). `[checkpoint] replay_envs = false` resumes with new episodes instead.
use flotilla_algorithms::Checkpoint;
use flotilla_core::ObsBuf;
use flotilla_envs::{VecActions, VectorEnv};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::{Error, Result};

const META: &str = "trainer.env_replay";
const ACTIONS: &str = "trainer.env_replay.actions";

/// The actions a batch of envs was stepped with since its seeded reset.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EnvReplay {
    info: ReplayInfo,
    actions: Recorded,
}

/// Every recorded batch, one after the other, in the action space's kind.
#[derive(Debug, Clone, PartialEq)]
enum Recorded {
    Discrete(Vec<i64>),
    Continuous(Vec<f32>),
}

/// What the checkpoint's metadata says about the recorded actions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ReplayInfo {
    /// The seed the envs were reset with.
    seed: u64,
    /// Envs in the batch.
    n_envs: usize,
    /// Batches recorded.
    steps: u64,
    /// Whether the actions are discrete (i64 indices) or continuous (f32 values).
    discrete: bool,
    /// Action values per batch: `n_envs`, times the action size for continuous actions.
    per_step: usize,
}

impl EnvReplay {
    /// Nothing recorded yet for `envs`, just reset with `seed`.
    pub(crate) fn new(seed: u64, envs: &dyn VectorEnv) -> Self {
        let n_envs = envs.num_envs();
        let (actions, per_step) = match envs.action_space() {
            flotilla_core::Space::Discrete { .. } => (Recorded::Discrete(Vec::new()), n_envs),
            space => (Recorded::Continuous(Vec::new()), n_envs * space.flat_dim()),
        };
        let discrete = matches!(actions, Recorded::Discrete(_));
        EnvReplay { info: ReplayInfo { seed, n_envs, steps: 0, discrete, per_step }, actions }
    }

    /// Record a batch of actions the envs took.
    pub(crate) fn record(&mut self, actions: &VecActions<'_>) -> Result<()> {
        match (&mut self.actions, actions) {
            (Recorded::Discrete(v), VecActions::Discrete(a)) if a.len() == self.info.per_step => v.extend_from_slice(a),
            (Recorded::Continuous(v), VecActions::Continuous(a)) if a.len() == self.info.per_step => {
                v.extend_from_slice(a)
            }
            _ => {
                return Err(Error::Runtime(format!(
                    "env recording: a batch of actions unlike the action space's {} values",
                    self.info.per_step
                )));
            }
        }
        self.info.steps += 1;
        Ok(())
    }

    /// Batch `s` of the recording.
    fn batch(&self, s: usize) -> VecActions<'_> {
        let rows = s * self.info.per_step..(s + 1) * self.info.per_step;
        match &self.actions {
            Recorded::Discrete(v) => VecActions::Discrete(&v[rows]),
            Recorded::Continuous(v) => VecActions::Continuous(&v[rows]),
        }
    }

    /// Add the recording to a checkpoint.
    pub(crate) fn write_to(&self, c: &mut Checkpoint) -> Result<()> {
        c.put_meta(META, &self.info)?;
        let actions = match &self.actions {
            Recorded::Discrete(v) => Tensor::from_slice(v),
            Recorded::Continuous(v) => Tensor::from_slice(v),
        };
        c.put_tensor(ACTIONS, &actions);
        Ok(())
    }

    /// The recording a checkpoint holds, if it has one.
    pub(crate) fn read_from(c: &mut Checkpoint) -> Result<Option<Self>> {
        if !c.has_meta(META) {
            return Ok(None);
        }
        let info: ReplayInfo = c.meta(META)?;
        let tensor = c.take_tensor(ACTIONS)?.flatten(0, -1);
        let convert = |e: tch::TchError| Error::Runtime(format!("checkpoint {ACTIONS:?}: {e}"));
        let (actions, stored) = if info.discrete {
            let v = Vec::<i64>::try_from(tensor).map_err(convert)?;
            let n = v.len();
            (Recorded::Discrete(v), n)
        } else {
            let v = Vec::<f32>::try_from(tensor).map_err(convert)?;
            let n = v.len();
            (Recorded::Continuous(v), n)
        };
        if stored as u64 != info.per_step as u64 * info.steps {
            return Err(Error::Runtime(format!(
                "checkpoint {ACTIONS:?}: {stored} action values for {} batches of {}",
                info.steps, info.per_step
            )));
        }
        Ok(Some(EnvReplay { info, actions }))
    }

    /// Step `envs` — fresh, made like the recorded ones — from their seeded reset through every recorded
    /// batch; their observations must then equal `expected` (what the checkpoint saved).
    pub(crate) fn replay(&self, envs: &mut dyn VectorEnv, expected: &ObsBuf) -> Result<()> {
        let n = envs.num_envs();
        if n != self.info.n_envs {
            return Err(Error::Runtime(format!(
                "the checkpoint's env recording is for {} envs, the config has {n}",
                self.info.n_envs
            )));
        }
        envs.reset(Some(self.info.seed))?;
        let steps = self.info.steps as usize;
        for s in 0..steps {
            envs.step(&self.batch(s))?;
        }
        if envs.obs() != expected.as_ref() {
            return Err(Error::Runtime(format!(
                "{}: replaying the run's {steps} recorded steps from seed {} did not reproduce the saved \
                 observations (a different engine version?); set [checkpoint] replay_envs = false to resume \
                 with new episodes",
                envs.id(),
                self.info.seed
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use flotilla_envs::{EnvRole, Kwargs, make_vector};

    use super::*;

    fn recorded_run(id: &str, steps: usize) -> (EnvReplay, Box<dyn VectorEnv>) {
        let mut envs = make_vector(id, &Kwargs::new(), 3, EnvRole::Training).unwrap();
        envs.reset(Some(7)).unwrap();
        let mut replay = EnvReplay::new(7, envs.as_ref());
        for s in 0..steps {
            let a: Vec<i64> = (0..3).map(|i| ((s * 7 + i * 3) % 2) as i64).collect();
            let actions = VecActions::Discrete(&a);
            envs.step(&actions).unwrap();
            replay.record(&actions).unwrap();
        }
        (replay, envs)
    }

    #[test]
    fn replay_reproduces_the_envs_and_survives_a_checkpoint() {
        let (replay, envs) = recorded_run("CartPole-v1", 300);
        let expected = envs.obs().to_buf();
        let mut c = Checkpoint::new();
        replay.write_to(&mut c).unwrap();
        let back = EnvReplay::read_from(&mut c).unwrap().expect("recorded");
        assert_eq!(back, replay);
        let mut fresh = make_vector("CartPole-v1", &Kwargs::new(), 3, EnvRole::Training).unwrap();
        back.replay(fresh.as_mut(), &expected).unwrap();
        assert!(fresh.obs() == expected.as_ref());
        // Other observations than the saved ones: the replay says it diverged.
        let (_, other) = recorded_run("CartPole-v1", 299);
        let e = back.replay(fresh.as_mut(), &other.obs().to_buf()).unwrap_err().to_string();
        assert!(e.contains("did not reproduce") && e.contains("300 recorded steps"), "{e}");
        let mut four = make_vector("CartPole-v1", &Kwargs::new(), 4, EnvRole::Training).unwrap();
        let e = back.replay(four.as_mut(), &expected).unwrap_err().to_string();
        assert!(e.contains("for 3 envs") && e.contains("has 4"), "{e}");
    }

    #[test]
    fn batches_unlike_the_action_space_are_refused() {
        let (mut replay, _) = recorded_run("CartPole-v1", 5);
        let before = replay.clone();
        assert!(replay.record(&VecActions::Discrete(&[1, 0])).is_err(), "two actions for three envs");
        assert!(replay.record(&VecActions::Continuous(&[0.5, 0.5, 0.5])).is_err(), "continuous for discrete");
        assert_eq!(replay, before);
        assert!(EnvReplay::read_from(&mut Checkpoint::new()).unwrap().is_none());
    }
}
