//! Several tasks as one batch: [`TaskVecEnv`] steps one vector env per task side by side and appends each
//! row's task as a one-hot to its observation, so that one network (a shared torso with a head per task, or a
//! task-conditioned policy) can train on all of them.
//!
//! ```text
//! task 0: CartPole(length 0.5) × 4 ─┐                                  rows 0..4:  [obs₀ | 1 0 0]
//! task 1: CartPole(length 1.0) × 4 ─┼─► TaskVecEnv (12 envs, 4 + 3) ─► rows 4..8:  [obs₁ | 0 1 0]
//! task 2: CartPole(length 2.0) × 4 ─┘                                  rows 8..12: [obs₂ | 0 0 1]
//! ```
//! Observations are 1-D f32 boxes and every task has the same action space. How the tasks' observations share
//! a row is [`TaskInputs`]: in the same columns (`Shared`: equal sizes, one input layer for all), or each task in
//! columns of its own with zeros in the others' (`Separate`):
//!
//! ```text
//! Separate, Acrobot (6 floats) + MountainCar (2):  task 0 rows: [a₀ … a₅ | 0 0 | 1 0]
//!                                                  task 1 rows: [0 … 0   | m₀ m₁ | 0 1]
//! ```
//! so the first layer's weights on task k's columns see task k's observations only: an input layer per task,
//! inside one matrix, for any network (the one-hot gives each task its own bias), and observation sizes may
//! differ. Env `i` of the whole batch is reset with `seed + i`; episode statistics carry batch-wide env indices
//! ([`TaskVecEnv::task_of`] maps them back).
use flotilla_core::{DType, EpisodeStats, Error, ObsRef, Result, Space};

use crate::vec_env::{VecActions, VecEnvSnapshot, VecStep, VectorEnv};

/// How the tasks' observations are laid out in a row, before the one-hot.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskInputs {
    /// Every task in the same columns (their observation sizes must be equal): one input layer for all. The
    /// row's bounds are the widest of these observation spaces (every task's, so that a batch of one task —
    /// an evaluation, an actor assigned one task — has the run's space), or of the batch's own tasks when empty.
    Shared(Vec<Space>),
    /// Task k's observation in columns of its own (the tasks' blocks side by side, in task order), zeros in the
    /// others': an input layer per task. Holds every task's observation space (all `width` of them, also when
    /// the batch steps one task), which gives the row its bounds.
    Separate(Vec<Space>),
}

/// One vector env per task, stepped as one batch with the task one-hot appended to every observation.
pub struct TaskVecEnv {
    tasks: Vec<Box<dyn VectorEnv>>,
    /// Which of the `width` tasks each entry of `tasks` is (the one-hot's hot index).
    index: Vec<usize>,
    /// First batch row of each entry.
    offsets: Vec<usize>,
    width: usize,
    /// Each entry's own observation floats.
    dims: Vec<usize>,
    /// Per task (one-hot index): the column its observation starts at (all 0 with shared inputs).
    blocks: Vec<usize>,
    /// Where the one-hot starts; a row is `hot_at + width` floats.
    hot_at: usize,
    n: usize,
    id: String,
    observation_space: Space,
    action_space: Space,
    obs: Vec<f32>,
    final_obs: Vec<f32>,
    has_final: Vec<bool>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    episodes: Vec<EpisodeStats>,
}

impl std::fmt::Debug for TaskVecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskVecEnv").field("id", &self.id).field("index", &self.index).finish_non_exhaustive()
    }
}

fn bad(detail: String) -> Error {
    Error::BadArgument { env: "tasks".into(), key: "tasks".into(), detail }
}

impl TaskVecEnv {
    /// `tasks`: (task index in `0..width`, its vector env) pairs, in batch order, with [`TaskInputs::Shared`]
    /// inputs. Usually every task once (`index` = 0, 1, …); evaluating one task of a `width`-task run passes
    /// just that one.
    pub fn new(tasks: Vec<(usize, Box<dyn VectorEnv>)>, width: usize) -> Result<Self> {
        Self::with_inputs(tasks, width, &TaskInputs::Shared(Vec::new()))
    }

    /// [`TaskVecEnv::new`] with the observation layout `inputs`.
    pub fn with_inputs(tasks: Vec<(usize, Box<dyn VectorEnv>)>, width: usize, inputs: &TaskInputs) -> Result<Self> {
        let Some((_, first)) = tasks.first() else { return Err(bad("needs at least one task".into())) };
        let act0 = first.action_space().clone();
        for (k, env) in tasks.iter().map(|(k, e)| (*k, e)) {
            if k >= width {
                return Err(bad(format!("task index {k} of {width} tasks")));
            }
            let space = env.observation_space();
            if !matches!(space, Space::Box { shape, dtype: DType::F32, .. } if shape.len() == 1) {
                return Err(bad(format!("task observations must be 1-D f32 boxes; {} has {space:?}", env.id())));
            }
            if env.action_space() != &act0 {
                return Err(bad(format!(
                    "every task needs the same action space: task {k} ({}) has {:?}, task {} ({}) has {act0:?}",
                    env.id(),
                    env.action_space(),
                    tasks[0].0,
                    first.id(),
                )));
            }
        }
        let dims: Vec<usize> = tasks.iter().map(|(_, e)| e.observation_space().flat_dim()).collect();
        let bounds = |space: &Space| match space {
            Space::Box { low, high, .. } => (low.clone(), high.clone()),
            _ => unreachable!("checked: 1-D boxes"),
        };
        let (blocks, hot_at, mut lo, mut hi) = match inputs {
            TaskInputs::Shared(spaces) => {
                if let Some(i) = dims.iter().position(|d| *d != dims[0]) {
                    return Err(bad(format!(
                        "tasks sharing their input columns need the same observation size: task {} ({}) has {} \
                         observation floats, task {} ({}) has {}; give each task its own input layer \
                         ([env] task_inputs = \"separate\")",
                        tasks[i].0,
                        tasks[i].1.id(),
                        dims[i],
                        tasks[0].0,
                        first.id(),
                        dims[0]
                    )));
                }
                // Each task's bounds may differ (other physics): the batch's are the widest.
                let own: Vec<Space> = tasks.iter().map(|(_, e)| e.observation_space().clone()).collect();
                let all = if spaces.is_empty() { &own } else { spaces };
                if all.len() != own.len() && all.len() != width || all.iter().any(|s| s.flat_dim() != dims[0]) {
                    return Err(bad(format!(
                        "task observation spaces {all:?} do not fit {width} tasks of {} floats",
                        dims[0]
                    )));
                }
                let (mut lo, mut hi) = bounds(&all[0]);
                for space in &all[1..] {
                    let (l, h) = bounds(space);
                    lo.iter_mut().zip(l).for_each(|(a, b)| *a = a.min(b));
                    hi.iter_mut().zip(h).for_each(|(a, b)| *a = a.max(b));
                }
                (vec![0; width], dims[0], lo, hi)
            }
            TaskInputs::Separate(spaces) => {
                if spaces.len() != width {
                    return Err(bad(format!("{} task observation spaces for {width} tasks", spaces.len())));
                }
                let (mut blocks, mut lo, mut hi) = (Vec::with_capacity(width), Vec::new(), Vec::new());
                for space in spaces {
                    blocks.push(lo.len());
                    let (l, h) = bounds(space);
                    lo.extend(l);
                    hi.extend(h);
                }
                for ((k, env), d) in tasks.iter().zip(&dims) {
                    if spaces[*k].flat_dim() != *d {
                        return Err(bad(format!(
                            "task {k} ({}) has {d} observation floats, its input block {}",
                            env.id(),
                            spaces[*k].flat_dim()
                        )));
                    }
                }
                // Zeros fill the other tasks' columns: widen their bounds to hold 0.
                lo.iter_mut().for_each(|l| *l = l.min(0.0));
                hi.iter_mut().for_each(|h| *h = h.max(0.0));
                let hot_at = lo.len();
                (blocks, hot_at, lo, hi)
            }
        };
        lo.extend(std::iter::repeat_n(0.0, width));
        hi.extend(std::iter::repeat_n(1.0, width));
        let observation_space = Space::box1d(lo, hi);
        let mut offsets = Vec::with_capacity(tasks.len());
        let mut n = 0;
        for (_, env) in &tasks {
            offsets.push(n);
            n += env.num_envs();
        }
        let id = format!("tasks:{}", tasks.iter().map(|(_, e)| e.id()).collect::<Vec<_>>().join("+"));
        let dim = hot_at + width;
        let (index, tasks): (Vec<usize>, Vec<_>) = tasks.into_iter().unzip();
        Ok(TaskVecEnv {
            tasks,
            index,
            offsets,
            width,
            dims,
            blocks,
            hot_at,
            n,
            id,
            observation_space,
            action_space: act0,
            obs: vec![0.0; n * dim],
            final_obs: vec![0.0; n * dim],
            has_final: vec![false; n],
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            episodes: Vec::new(),
        })
    }

    /// The task (one-hot index) of batch env `env_index`.
    pub fn task_of(&self, env_index: usize) -> usize {
        let entry = self.offsets.partition_point(|&o| o <= env_index) - 1;
        self.index[entry]
    }

    /// Floats per row: the observation columns and the one-hot.
    fn row_dim(&self) -> usize {
        self.hot_at + self.width
    }

    /// Entry `k`'s columns in a row: where its observation starts and ends.
    fn columns(&self, k: usize) -> std::ops::Range<usize> {
        let at = self.blocks[self.index[k]];
        at..at + self.dims[k]
    }

    /// Where entry `k`'s rows go in the batch (plain data, so rows can be written while its env is borrowed).
    fn layout(&self, k: usize) -> RowLayout {
        RowLayout {
            dim: self.row_dim(),
            cols: self.columns(k),
            from: self.offsets[k],
            hot: self.hot_at + self.index[k],
        }
    }
}

/// One entry's place in the batch: rows from `from`, each `dim` wide, its observation in `cols`, its one-hot
/// at column `hot`.
struct RowLayout {
    dim: usize,
    cols: std::ops::Range<usize>,
    from: usize,
    hot: usize,
}

impl RowLayout {
    /// Write the entry's row `r` of `out`: `obs` in its columns (zeros where `None`), zeros elsewhere, the
    /// one-hot.
    fn write(&self, r: usize, obs: Option<&[f32]>, out: &mut [f32]) {
        let out = &mut out[(self.from + r) * self.dim..(self.from + r + 1) * self.dim];
        out.fill(0.0);
        if let Some(obs) = obs {
            out[self.cols.clone()].copy_from_slice(obs);
        }
        out[self.hot] = 1.0;
    }
}

fn f32s(obs: ObsRef<'_>) -> Result<&[f32]> {
    obs.as_f32().ok_or_else(|| bad("a task env gave u8 observations".into()))
}

impl VectorEnv for TaskVecEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn num_envs(&self) -> usize {
        self.n
    }

    fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    fn action_space(&self) -> &Space {
        &self.action_space
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>> {
        for k in 0..self.tasks.len() {
            let (s, layout, d) = (seed.map(|s| s.wrapping_add(self.offsets[k] as u64)), self.layout(k), self.dims[k]);
            for (r, row) in f32s(self.tasks[k].reset(s)?)?.chunks_exact(d).enumerate() {
                layout.write(r, Some(row), &mut self.obs);
            }
        }
        self.has_final.fill(false);
        Ok(ObsRef::F32(&self.obs))
    }

    fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>> {
        // Every task's actions are checked before any task steps: a bad batch changes nothing.
        let per_env = match &self.action_space {
            Space::Box { .. } => self.action_space.flat_dim(),
            _ => 1,
        };
        crate::vec_env::check_vec_actions(&self.id, &self.action_space, per_env, self.n, actions)?;
        let (mut obs, mut final_obs) = (std::mem::take(&mut self.obs), std::mem::take(&mut self.final_obs));
        self.episodes.clear();
        let stepped = self.step_tasks(actions, per_env, &mut obs, &mut final_obs);
        (self.obs, self.final_obs) = (obs, final_obs);
        stepped?;
        let dim = self.row_dim();
        Ok(VecStep::new(
            ObsRef::F32(&self.obs),
            &self.rewards,
            &self.terminated,
            &self.truncated,
            &self.episodes,
            ObsRef::F32(&self.final_obs),
            &self.has_final,
            dim,
        ))
    }

    fn obs(&self) -> ObsRef<'_> {
        ObsRef::F32(&self.obs)
    }

    /// The tasks' snapshots in batch order (each env's), with the batch's observations.
    fn snapshot(&self) -> Result<VecEnvSnapshot> {
        let mut all =
            VecEnvSnapshot { id: self.id.clone(), envs: vec![], obs: vec![], returns: vec![], lengths: vec![] };
        for task in &self.tasks {
            let s = task.snapshot()?;
            all.envs.extend(s.envs);
            all.returns.extend(s.returns);
            all.lengths.extend(s.lengths);
        }
        all.obs = self.obs.clone();
        Ok(all)
    }

    fn restore(&mut self, snapshot: &VecEnvSnapshot) -> Result<()> {
        let dim = self.row_dim();
        if snapshot.id != self.id
            || snapshot.envs.len() != self.n
            || snapshot.obs.len() != self.n * dim
            || snapshot.returns.len() != self.n
            || snapshot.lengths.len() != self.n
        {
            return Err(Error::InvalidSnapshot {
                env: self.id.clone(),
                detail: format!(
                    "a snapshot of {} ({} envs) does not fit {} envs",
                    snapshot.id,
                    snapshot.envs.len(),
                    self.n
                ),
            });
        }
        for k in 0..self.tasks.len() {
            let (from, rows) = (self.offsets[k], self.tasks[k].num_envs());
            let cols = self.columns(k);
            let obs = snapshot.obs[from * dim..(from + rows) * dim]
                .chunks_exact(dim)
                .flat_map(|row| row[cols.clone()].iter().copied())
                .collect();
            let part = VecEnvSnapshot {
                id: self.tasks[k].id().to_string(),
                envs: snapshot.envs[from..from + rows].to_vec(),
                obs,
                returns: snapshot.returns[from..from + rows].to_vec(),
                lengths: snapshot.lengths[from..from + rows].to_vec(),
            };
            self.tasks[k].restore(&part)?;
        }
        self.obs.copy_from_slice(&snapshot.obs);
        self.has_final.fill(false);
        Ok(())
    }
}

impl TaskVecEnv {
    /// Step every task with its slice of `actions` (`per_env` values per env), writing the batch's rows into
    /// `obs` and `final_obs` (taken out of `self` meanwhile) and the rewards, flags and episodes into `self`.
    fn step_tasks(
        &mut self,
        actions: &VecActions<'_>,
        per_env: usize,
        obs: &mut [f32],
        final_obs: &mut [f32],
    ) -> Result<()> {
        for k in 0..self.tasks.len() {
            let (from, rows) = (self.offsets[k], self.tasks[k].num_envs());
            let slice = match actions {
                VecActions::Discrete(a) => VecActions::Discrete(&a[from * per_env..(from + rows) * per_env]),
                VecActions::Continuous(a) => VecActions::Continuous(&a[from * per_env..(from + rows) * per_env]),
            };
            let (task, layout, d) = (self.index[k] as u32, self.layout(k), self.dims[k]);
            // Rows go straight from the task's step into the batch: no copy per task per step.
            let step = self.tasks[k].step(&slice)?;
            for (r, row) in f32s(step.obs)?.chunks_exact(d).enumerate() {
                layout.write(r, Some(row), obs);
            }
            self.rewards[from..from + rows].copy_from_slice(step.rewards);
            self.terminated[from..from + rows].copy_from_slice(step.terminated);
            self.truncated[from..from + rows].copy_from_slice(step.truncated);
            for r in 0..rows {
                let last = step.final_obs(r);
                self.has_final[from + r] = last.is_some();
                layout.write(r, last.and_then(|o| o.as_f32()), final_obs);
            }
            let episodes = step.episodes.iter();
            self.episodes.extend(episodes.map(|e| EpisodeStats {
                env_index: e.env_index + from,
                task: Some(task),
                ..*e
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kwargs::{KwargValue, Kwargs};
    use crate::vec_env::{EnvRole, make_vector};

    fn cartpole(force_mag: f64, n: usize) -> Box<dyn VectorEnv> {
        let mut kwargs = Kwargs::new();
        kwargs.insert("force_mag", KwargValue::Float(force_mag));
        make_vector("CartPole-v1", &kwargs, n, EnvRole::Training).unwrap()
    }

    fn two_tasks() -> TaskVecEnv {
        TaskVecEnv::new(vec![(0, cartpole(10.0, 2)), (1, cartpole(-10.0, 3))], 2).unwrap()
    }

    /// Actions for step `t` of 5 envs: a fixed pattern that ends episodes now and then.
    fn actions(t: usize) -> Vec<i64> {
        (0..5).map(|i| ((t / 7 + i) % 2) as i64).collect()
    }

    #[test]
    fn tasks_step_as_their_own_envs_with_a_one_hot_appended() {
        let mut tasks = two_tasks();
        let (mut a, mut b) = (cartpole(10.0, 2), cartpole(-10.0, 3));
        assert_eq!(tasks.observation_space().flat_dim(), 6);
        assert_eq!(tasks.num_envs(), 5);
        let first = tasks.reset(Some(9)).unwrap().as_f32().unwrap().to_vec();
        let (ra, rb) = (a.reset(Some(9)).unwrap().to_buf(), b.reset(Some(11)).unwrap().to_buf());
        let row = |v: &[f32], r: usize| v[r * 6..r * 6 + 6].to_vec();
        assert_eq!(row(&first, 0), [ra.as_ref().as_f32().unwrap()[..4].to_vec(), vec![1.0, 0.0]].concat());
        assert_eq!(row(&first, 2), [rb.as_ref().as_f32().unwrap()[..4].to_vec(), vec![0.0, 1.0]].concat());
        let mut ended = 0;
        for t in 0..300 {
            let acts = actions(t);
            let step = tasks.step(&VecActions::Discrete(&acts)).unwrap();
            let (obs, rewards, term) =
                (step.obs.as_f32().unwrap().to_vec(), step.rewards.to_vec(), step.terminated.to_vec());
            let finals: Vec<Option<Vec<f32>>> =
                (0..5).map(|i| step.final_obs(i).map(|o| o.as_f32().unwrap().to_vec())).collect();
            let episodes: Vec<usize> = step.episodes.iter().map(|e| e.env_index).collect();
            let sa = a.step(&VecActions::Discrete(&acts[..2])).unwrap();
            let mut want_eps: Vec<usize> = sa.episodes.iter().map(|e| e.env_index).collect();
            for i in 0..2 {
                assert_eq!(obs[i * 6..i * 6 + 4], sa.obs.as_f32().unwrap()[i * 4..i * 4 + 4], "step {t} env {i}");
                assert_eq!(
                    finals[i].as_ref().map(|f| f[..4].to_vec()),
                    sa.final_obs(i).map(|o| o.as_f32().unwrap().to_vec())
                );
                assert_eq!(rewards[i], sa.rewards[i]);
                assert_eq!(term[i], sa.terminated[i]);
            }
            let sb = b.step(&VecActions::Discrete(&acts[2..])).unwrap();
            want_eps.extend(sb.episodes.iter().map(|e| e.env_index + 2));
            for i in 0..3 {
                assert_eq!(obs[(i + 2) * 6..(i + 2) * 6 + 4], sb.obs.as_f32().unwrap()[i * 4..i * 4 + 4]);
                assert_eq!(obs[(i + 2) * 6 + 4..(i + 3) * 6], [0.0, 1.0]);
                assert_eq!(term[i + 2], sb.terminated[i]);
            }
            assert_eq!(episodes, want_eps, "episode env indices are the batch's");
            ended += episodes.len();
        }
        assert!(ended > 10, "only {ended} episodes ended: the test saw too few resets");
        assert_eq!((tasks.task_of(0), tasks.task_of(1), tasks.task_of(2), tasks.task_of(4)), (0, 0, 1, 1));
    }

    #[test]
    fn a_bad_action_in_any_task_steps_no_task() {
        let mut tasks = two_tasks();
        tasks.reset(Some(5)).unwrap();
        tasks.step(&VecActions::Discrete(&actions(0))).unwrap();
        let before = (tasks.snapshot().unwrap(), tasks.obs().as_f32().unwrap().to_vec());
        // Env 4 (task 1's last) gets action 2 of 0..2; too few actions; continuous values for a discrete space.
        for (bad, want) in [
            (VecActions::Discrete(&[0, 1, 0, 1, 2]), "action 2 for env 4 is outside 0..2"),
            (VecActions::Discrete(&[0, 1, 0, 1]), "4 discrete actions for 5 envs"),
            (VecActions::Continuous(&[0.0; 5]), "continuous actions given"),
        ] {
            let e = tasks.step(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert_eq!(tasks.obs().as_f32().unwrap(), before.1, "observations unchanged after: {e}");
        }
        // Nothing stepped: the batch continues exactly as a copy restored from before the bad batches.
        let mut copy = two_tasks();
        copy.restore(&before.0).unwrap();
        for t in 1..30 {
            let a = tasks.step(&VecActions::Discrete(&actions(t))).unwrap().obs.as_f32().unwrap().to_vec();
            assert_eq!(a, copy.step(&VecActions::Discrete(&actions(t))).unwrap().obs.as_f32().unwrap(), "step {t}");
        }
    }

    #[test]
    fn a_snapshot_continues_bit_for_bit() {
        let mut tasks = two_tasks();
        tasks.reset(Some(3)).unwrap();
        for t in 0..40 {
            tasks.step(&VecActions::Discrete(&actions(t))).unwrap();
        }
        let snap = tasks.snapshot().unwrap();
        let run = |env: &mut TaskVecEnv| -> Vec<f32> {
            (40..140)
                .flat_map(|t| env.step(&VecActions::Discrete(&actions(t))).unwrap().obs.as_f32().unwrap().to_vec())
                .collect()
        };
        let expected = run(&mut tasks);
        let mut fresh = two_tasks();
        fresh.restore(&snap).unwrap();
        assert_eq!(run(&mut fresh), expected);
        // A snapshot of another batch is refused.
        let mut other = TaskVecEnv::new(vec![(0, cartpole(10.0, 2))], 2).unwrap();
        assert!(other.restore(&snap).is_err());
    }

    fn env(id: &str, n: usize) -> Box<dyn VectorEnv> {
        make_vector(id, &Kwargs::new(), n, EnvRole::Training).unwrap()
    }

    #[test]
    fn separate_inputs_give_each_task_its_own_columns_and_sizes_may_differ() {
        // Acrobot (6 floats, 3 actions) and MountainCar (2 floats, 3 actions): rows of 6 + 2 + 2 one-hot.
        let spaces = vec![
            env("Acrobot-v1", 1).observation_space().clone(),
            env("MountainCar-v0", 1).observation_space().clone(),
        ];
        let inputs = TaskInputs::Separate(spaces);
        let build = || {
            TaskVecEnv::with_inputs(vec![(0, env("Acrobot-v1", 2)), (1, env("MountainCar-v0", 2))], 2, &inputs).unwrap()
        };
        let mut tasks = build();
        let (mut a, mut m) = (env("Acrobot-v1", 2), env("MountainCar-v0", 2));
        assert_eq!(tasks.observation_space().flat_dim(), 10);
        tasks.reset(Some(5)).unwrap();
        a.reset(Some(5)).unwrap();
        m.reset(Some(7)).unwrap();
        for t in 0..250 {
            let acts: Vec<i64> = (0..4).map(|i| ((t / 5 + i) % 3) as i64).collect();
            let step = tasks.step(&VecActions::Discrete(&acts)).unwrap();
            let obs = step.obs.as_f32().unwrap().to_vec();
            let finals: Vec<Option<Vec<f32>>> =
                (0..4).map(|i| step.final_obs(i).map(|o| o.as_f32().unwrap().to_vec())).collect();
            let sa = a.step(&VecActions::Discrete(&acts[..2])).unwrap();
            for i in 0..2 {
                let row = &obs[i * 10..(i + 1) * 10];
                assert_eq!(row[..6], sa.obs.as_f32().unwrap()[i * 6..(i + 1) * 6], "step {t}: Acrobot's columns");
                assert_eq!(row[6..], [0.0, 0.0, 1.0, 0.0], "MountainCar's columns zero, then the one-hot");
                let want = sa.final_obs(i).map(|o| o.as_f32().unwrap().to_vec());
                assert_eq!(finals[i].as_ref().map(|f| f[..6].to_vec()), want);
            }
            let sm = m.step(&VecActions::Discrete(&acts[2..])).unwrap();
            for i in 0..2 {
                let row = &obs[(i + 2) * 10..(i + 3) * 10];
                assert_eq!(row[..6], [0.0; 6], "Acrobot's columns zero");
                assert_eq!(row[6..8], sm.obs.as_f32().unwrap()[i * 2..(i + 1) * 2], "MountainCar's own columns");
                assert_eq!(row[8..], [0.0, 1.0]);
            }
        }
        // A snapshot continues bit for bit.
        let snap = tasks.snapshot().unwrap();
        let run = |env: &mut TaskVecEnv| -> Vec<f32> {
            (0..60)
                .flat_map(|t| {
                    let acts: Vec<i64> = (0..4).map(|i| ((t + i) % 3) as i64).collect();
                    env.step(&VecActions::Discrete(&acts)).unwrap().obs.as_f32().unwrap().to_vec()
                })
                .collect()
        };
        let expected = run(&mut tasks);
        let mut fresh = build();
        fresh.restore(&snap).unwrap();
        assert_eq!(run(&mut fresh), expected);
        // One task alone (a per-task evaluation) has the whole run's layout and observation space.
        let alone = TaskVecEnv::with_inputs(vec![(1, env("MountainCar-v0", 1))], 2, &inputs).unwrap();
        assert_eq!(alone.observation_space(), tasks.observation_space());
        // A task whose size is not its block's is refused.
        let err = TaskVecEnv::with_inputs(vec![(1, env("Acrobot-v1", 1))], 2, &inputs).unwrap_err().to_string();
        assert!(err.contains("task 1 (Acrobot-v1) has 6 observation floats, its input block 2"), "{err}");
    }

    #[test]
    fn tasks_must_share_spaces() {
        let pendulum = make_vector("Pendulum-v1", &Kwargs::new(), 1, EnvRole::Training).unwrap();
        let err = TaskVecEnv::new(vec![(0, cartpole(10.0, 1)), (1, pendulum)], 2).unwrap_err().to_string();
        assert!(err.contains("same action space") && err.contains("task 1 (Pendulum-v1)"), "{err}");
        let err =
            TaskVecEnv::new(vec![(0, env("MountainCar-v0", 1)), (1, env("Acrobot-v1", 1))], 2).unwrap_err().to_string();
        assert!(err.contains("task 1 (Acrobot-v1) has 6 observation floats") && err.contains("separate"), "{err}");
        let err = TaskVecEnv::new(vec![(2, cartpole(10.0, 1))], 2).unwrap_err().to_string();
        assert!(err.contains("task index 2 of 2"), "{err}");
    }
}
