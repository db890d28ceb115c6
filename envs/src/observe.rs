//! Partial observability as a one-line config: [`ObserveVecEnv`] keeps chosen components of a vector
//! observation (`[env] observe = [0, 2]`: CartPole's position and angle, without their velocities) and drops the
//! rest, for any vector env — native or through the Gymnasium bridge. The envs step as before; only what the
//! agent sees (observations, final observations, the observation space) is cut.
use flotilla_core::{Error, ObsRef, Result, Space};

use crate::vec_env::{VecActions, VecEnvSnapshot, VecStep, VectorEnv};

/// A vector env whose observations keep only the components `keep` of the wrapped env's (in that order).
pub struct ObserveVecEnv {
    inner: Box<dyn VectorEnv>,
    keep: Vec<usize>,
    observation_space: Space,
    obs: Vec<f32>,
    final_obs: Vec<f32>,
    has_final: Vec<bool>,
}

fn bad(inner: &dyn VectorEnv, detail: String) -> Error {
    Error::BadArgument { env: inner.id().to_string(), key: "observe".into(), detail }
}

impl ObserveVecEnv {
    /// `inner` seen through the components `keep` of its observations: indices into a 1-D f32 box observation,
    /// each at most once, at least one. Anything else is an error naming `observe`.
    pub fn new(inner: Box<dyn VectorEnv>, keep: Vec<usize>) -> Result<Self> {
        let space = inner.observation_space().clone();
        let Space::Box { low, high, shape, dtype } = &space else {
            return Err(bad(&*inner, format!("{space:?}: only a box observation can be cut")));
        };
        if shape.len() != 1 || *dtype != flotilla_core::DType::F32 {
            return Err(bad(&*inner, format!("observation shape {shape:?} of {dtype:?}: only 1-D f32 vectors")));
        }
        let dim = shape[0];
        if keep.is_empty() {
            return Err(bad(&*inner, "keeps no component; list at least one index".into()));
        }
        if let Some(i) = keep.iter().find(|&&i| i >= dim) {
            return Err(bad(&*inner, format!("index {i} is out of range: observations have {dim} components")));
        }
        let mut seen = vec![false; dim];
        for &i in &keep {
            if std::mem::replace(&mut seen[i], true) {
                return Err(bad(&*inner, format!("index {i} appears twice")));
            }
        }
        let pick = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
        let observation_space = Space::Box { low: pick(low), high: pick(high), shape: vec![keep.len()], dtype: *dtype };
        let n = inner.num_envs();
        Ok(ObserveVecEnv {
            observation_space,
            obs: vec![0.0; n * keep.len()],
            final_obs: vec![0.0; n * keep.len()],
            has_final: vec![false; n],
            inner,
            keep,
        })
    }

    /// The kept components of `rows` (the wrapped env's `num_envs × dim` observations) into `out`.
    fn cut(keep: &[usize], rows: ObsRef<'_>, out: &mut [f32]) -> Result<()> {
        let rows = rows.as_f32().ok_or_else(|| Error::Unsupported {
            env: "observe".into(),
            what: "cutting u8 observations (the space said f32)".into(),
        })?;
        let dim = rows.len() / (out.len() / keep.len()).max(1);
        for (row, o) in rows.chunks_exact(dim).zip(out.chunks_exact_mut(keep.len())) {
            for (o, &i) in o.iter_mut().zip(keep) {
                *o = row[i];
            }
        }
        Ok(())
    }
}

impl VectorEnv for ObserveVecEnv {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn num_envs(&self) -> usize {
        self.inner.num_envs()
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>> {
        let rows = self.inner.reset(seed)?;
        Self::cut(&self.keep, rows, &mut self.obs)?;
        self.has_final.fill(false);
        Ok(ObsRef::F32(&self.obs))
    }

    fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>> {
        let step = self.inner.step(actions)?;
        Self::cut(&self.keep, step.obs, &mut self.obs)?;
        let k = self.keep.len();
        for (i, has) in self.has_final.iter_mut().enumerate() {
            *has = match step.final_obs(i) {
                Some(row) => {
                    Self::cut(&self.keep, row, &mut self.final_obs[i * k..(i + 1) * k])?;
                    true
                }
                None => false,
            };
        }
        // Rewards, flags and episodes are the wrapped env's own, borrowed as they are; only observations are cut.
        Ok(VecStep::new(
            ObsRef::F32(&self.obs),
            step.rewards,
            step.terminated,
            step.truncated,
            step.episodes,
            ObsRef::F32(&self.final_obs),
            &self.has_final,
            k,
        ))
    }

    fn obs(&self) -> ObsRef<'_> {
        ObsRef::F32(&self.obs)
    }

    /// The wrapped env's snapshot (whole observations: the cut is recomputed on restore).
    fn snapshot(&self) -> Result<VecEnvSnapshot> {
        self.inner.snapshot()
    }

    fn restore(&mut self, snapshot: &VecEnvSnapshot) -> Result<()> {
        self.inner.restore(snapshot)?;
        Self::cut(&self.keep, self.inner.obs(), &mut self.obs)
    }

    fn resolved_kwargs(&self) -> crate::Kwargs {
        self.inner.resolved_kwargs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EnvRole, Kwargs, make_vector};

    fn cartpole(n: usize) -> Box<dyn VectorEnv> {
        make_vector("CartPole-v1", &Kwargs::new(), n, EnvRole::Training).unwrap()
    }

    /// The cut env steps exactly as the whole one (same rewards, flags, episodes) and shows only the kept
    /// components of its observations and final observations, in the order asked; snapshots restore it.
    #[test]
    fn keeps_the_chosen_components_and_steps_as_the_whole_env() {
        let (mut whole, mut cut) = (cartpole(3), ObserveVecEnv::new(cartpole(3), vec![2, 0]).unwrap());
        assert_eq!(cut.observation_space().shape(), &[2]);
        let Space::Box { low, .. } = whole.observation_space().clone() else { panic!("a box") };
        let Space::Box { low: cut_low, .. } = cut.observation_space().clone() else { panic!("a box") };
        assert_eq!(cut_low, vec![low[2], low[0]]);
        let a = whole.reset(Some(4)).unwrap().as_f32().unwrap().to_vec();
        let b = cut.reset(Some(4)).unwrap().as_f32().unwrap().to_vec();
        let pick = |rows: &[f32]| rows.chunks_exact(4).flat_map(|r| [r[2], r[0]]).collect::<Vec<f32>>();
        assert_eq!(b, pick(&a));
        let mut finals = 0;
        for t in 0..300 {
            let actions: Vec<i64> = (0..3).map(|i| ((t * 7 + i * 3) % 5 % 2) as i64).collect();
            let s = whole.step(&VecActions::Discrete(&actions)).unwrap();
            let (obs, rewards, terminated, episodes) =
                (s.obs.as_f32().unwrap().to_vec(), s.rewards.to_vec(), s.terminated.to_vec(), s.episodes.len());
            let whole_finals: Vec<Option<Vec<f32>>> =
                (0..3).map(|i| s.final_obs(i).map(|r| pick(r.as_f32().unwrap()))).collect();
            let c = cut.step(&VecActions::Discrete(&actions)).unwrap();
            assert_eq!(c.obs.as_f32().unwrap(), pick(&obs));
            assert_eq!((c.rewards, c.terminated, c.episodes.len()), (&rewards[..], &terminated[..], episodes));
            for (i, want) in whole_finals.iter().enumerate() {
                assert_eq!(c.final_obs(i).map(|r| r.as_f32().unwrap().to_vec()), *want, "step {t} env {i}");
                finals += usize::from(want.is_some());
            }
        }
        assert!(finals > 3, "episodes ended ({finals})");
        let snapshot = cut.snapshot().unwrap();
        let before = cut.obs().as_f32().unwrap().to_vec();
        cut.step(&VecActions::Discrete(&[0, 1, 0])).unwrap();
        cut.restore(&snapshot).unwrap();
        assert_eq!(cut.obs().as_f32().unwrap(), before);
    }

    #[test]
    fn bad_indices_are_refused_by_name() {
        for (keep, says) in [(vec![], "no component"), (vec![4], "out of range"), (vec![1, 1], "twice")] {
            let err = ObserveVecEnv::new(cartpole(1), keep).err().unwrap().to_string();
            assert!(err.contains("observe") && err.contains(says), "{err}");
        }
    }
}
