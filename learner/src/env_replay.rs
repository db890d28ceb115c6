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
    /// Discrete actions, `steps × n_envs` (empty for continuous action spaces).
    discrete: Vec<i64>,
    /// Continuous actions, `steps × n_envs × act_dim` (empty for discrete action spaces).
    continuous: Vec<f32>,
}

/// What the checkpoint's metadata says about the recorded actions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct ReplayInfo {
    /// The seed the envs were reset with.
    seed: u64,
    /// Envs in the batch.
    n_envs: usize,
    /// Batches of actions recorded.
    steps: u64,
    /// Whether the actions are discrete.
    discrete: bool,
}

impl EnvReplay {
    /// Nothing recorded yet for `n_envs` envs reset with `seed`.
    pub(crate) fn new(seed: u64, n_envs: usize, discrete: bool) -> Self {
        EnvReplay {
            info: ReplayInfo { seed, n_envs, steps: 0, discrete },
            discrete: Vec::new(),
            continuous: Vec::new(),
        }
    }

    /// Record the batch of actions the envs are about to be stepped with.
    pub(crate) fn record(&mut self, actions: &VecActions<'_>) {
        match actions {
            VecActions::Discrete(a) => self.discrete.extend_from_slice(a),
            VecActions::Continuous(a) => self.continuous.extend_from_slice(a),
        }
        self.info.steps += 1;
    }

    /// Forget the last recorded batch (the envs refused it, so it had no effect).
    pub(crate) fn unrecord(&mut self, actions: &VecActions<'_>) {
        match actions {
            VecActions::Discrete(a) => self.discrete.truncate(self.discrete.len() - a.len()),
            VecActions::Continuous(a) => self.continuous.truncate(self.continuous.len() - a.len()),
        }
        self.info.steps -= 1;
    }

    /// Add the recording to a checkpoint.
    pub(crate) fn write_to(&self, c: &mut Checkpoint) -> Result<()> {
        c.put_meta(META, &self.info)?;
        let actions =
            if self.info.discrete { Tensor::from_slice(&self.discrete) } else { Tensor::from_slice(&self.continuous) };
        c.put_tensor(ACTIONS, &actions);
        Ok(())
    }

    /// The recording a checkpoint holds, if it has one.
    pub(crate) fn read_from(c: &mut Checkpoint) -> Result<Option<Self>> {
        if !c.has_meta(META) {
            return Ok(None);
        }
        let info: ReplayInfo = c.meta(META)?;
        let actions = c.take_tensor(ACTIONS)?.flatten(0, -1);
        let mut replay = EnvReplay::new(info.seed, info.n_envs, info.discrete);
        replay.info.steps = info.steps;
        let convert = |e: tch::TchError| Error::Runtime(format!("checkpoint {ACTIONS:?}: {e}"));
        if info.discrete {
            replay.discrete = Vec::<i64>::try_from(actions).map_err(convert)?;
        } else {
            replay.continuous = Vec::<f32>::try_from(actions).map_err(convert)?;
        }
        let (stored, per_step) = if info.discrete {
            (replay.discrete.len(), info.n_envs)
        } else {
            (replay.continuous.len(), replay.continuous.len() / info.steps.max(1) as usize)
        };
        if info.steps > 0 && (per_step == 0 || stored != per_step * info.steps as usize) {
            return Err(Error::Runtime(format!(
                "checkpoint {ACTIONS:?}: {stored} actions for {} steps of {} envs",
                info.steps, info.n_envs
            )));
        }
        Ok(Some(replay))
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
            let actions = if self.info.discrete {
                VecActions::Discrete(&self.discrete[s * n..(s + 1) * n])
            } else {
                let k = self.continuous.len() / steps;
                VecActions::Continuous(&self.continuous[s * k..(s + 1) * k])
            };
            envs.step(&actions)?;
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
        let mut replay = EnvReplay::new(7, 3, true);
        for s in 0..steps {
            let a: Vec<i64> = (0..3).map(|i| ((s * 7 + i * 3) % 2) as i64).collect();
            let actions = VecActions::Discrete(&a);
            replay.record(&actions);
            envs.step(&actions).unwrap();
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
    fn a_refused_batch_is_forgotten() {
        let (mut replay, _) = recorded_run("CartPole-v1", 5);
        let before = replay.clone();
        let a = [1i64, 0, 1];
        replay.record(&VecActions::Discrete(&a));
        replay.unrecord(&VecActions::Discrete(&a));
        assert_eq!(replay, before);
        assert!(EnvReplay::read_from(&mut Checkpoint::new()).unwrap().is_none());
    }
}
