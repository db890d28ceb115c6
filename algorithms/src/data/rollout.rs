//! Fixed-size, time-major storage for one on-policy rollout of `n_steps × n_envs` transitions, filled from
//! trajectory chunks ([`Rollout::append_chunks`]: observations, actions, behaviour log-probs and values,
//! rewards and flags, the true final observations of truncated episodes, and with the last step the bootstrap
//! observations); [`Rollout::bootstrap_truncated`] gives the truncated steps `V(final observation)`, and
//! [`Rollout::finish`] with `V` of the bootstrap observations computes GAE advantages and returns. Buffers are
//! allocated once and reused; [`RolloutCollector`] fills them from one-step and whole chunks alike. The final
//! and bootstrap observations are kept so that a learner whose parameters moved on can recompute every
//! `V(x_{t+1})` ([`Rollout::next_values_under`], for V-trace).
use flotilla_core::{Chunk, DType, ObsBuf, ObsRef};

use tch::Tensor;

use crate::checkpoint::Checkpoint;
use crate::data::gae::gae;
use crate::nn::nets::ObsLayout;
use crate::{Error, Result};

/// A rollout's observations already on the learner's device, in the network's input layout
/// ([`Rollout::put_obs_on_device`]).
#[derive(Debug)]
pub struct DeviceObs(Tensor);

/// The shape of an actor-fed learner's rollouts and its network's input layout: what a batch-assembly thread
/// needs to stack chunks and put their observations on the device while the learner updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutLayout {
    /// Rows of the rollout (all stacked chunks' envs).
    pub n_envs: usize,
    /// Steps per row.
    pub n_steps: usize,
    /// Elements of one observation.
    pub obs_dim: usize,
    /// f32 values per action.
    pub act_dim: usize,
    /// The network's input layout and device.
    pub obs: ObsLayout,
}

impl RolloutLayout {
    /// An empty rollout of this layout.
    pub fn empty(&self) -> Rollout {
        Rollout::new(self.n_envs, self.n_steps, self.obs_dim, self.act_dim)
    }
}

/// One rollout. Index `t · n_envs + env` for per-transition values, times `obs_dim` / `act_dim` for vectors.
#[derive(Debug)]
#[cfg_attr(test, derive(Clone))]
pub struct Rollout {
    /// Number of parallel envs.
    pub n_envs: usize,
    /// Steps per env.
    pub n_steps: usize,
    /// Flattened observation size.
    pub obs_dim: usize,
    /// Action size: 1 for discrete actions (stored as f32 indices), `D` for continuous ones.
    pub act_dim: usize,
    /// Observations the policy acted on, in the dtype they came in (frames stay u8).
    pub obs: ObsBuf,
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
    /// Value of the observation that truly followed each step (filled by `bootstrap_truncated` and `finish`).
    pub next_values: Vec<f32>,
    /// GAE advantages (after `finish`).
    pub advantages: Vec<f32>,
    /// Value targets `advantages + values` (after `finish`).
    pub returns: Vec<f32>,
    /// True final observations of the steps cut by a time limit (`truncated` and not `terminated`), `obs_dim`
    /// values each, row `k` belonging to transition `final_obs_steps[k]`.
    pub final_obs: ObsBuf,
    /// The transition index (`t · n_envs + env`) of each row of `final_obs`.
    pub final_obs_steps: Vec<usize>,
    /// The observations after the rollout's last step, `n_envs × obs_dim` (empty until set).
    pub bootstrap_obs: ObsBuf,
    /// Recurrent policies: each env's state before the rollout's first step, `n_envs × state_dim`, from the
    /// chunks of that step ([`Chunk::initial_state`]); empty for feed-forward policies.
    pub initial_state: Vec<f32>,
    steps: usize,
    /// `obs` on the device, where an assembly thread put it there ahead of the update.
    device_obs: Option<DeviceObs>,
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
            // Observations adopt their dtype on the first push and keep their allocation across `clear`;
            // nothing is reserved here, so the placeholder `RolloutCollector::finish` leaves costs nothing
            // (for frames a reservation would be n × obs_dim floats, ~116 MB for a Pong rollout).
            obs: ObsBuf::empty(DType::F32),
            actions: Vec::with_capacity(n * act_dim),
            log_probs: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            next_values: vec![0.0; n],
            advantages: vec![0.0; n],
            returns: vec![0.0; n],
            final_obs: ObsBuf::empty(DType::F32),
            final_obs_steps: Vec::new(),
            bootstrap_obs: ObsBuf::empty(DType::F32),
            initial_state: Vec::new(),
            steps: 0,
            device_obs: None,
        }
    }

    /// Forget the stored transitions, keeping the allocations.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keep the first `steps` steps (and the final observations of their truncated episodes); the bootstrap
    /// observations go unless the rollout stays full.
    fn truncate(&mut self, steps: usize) {
        let n = steps * self.n_envs;
        for v in [&mut self.log_probs, &mut self.values, &mut self.rewards] {
            v.truncate(n);
        }
        self.actions.truncate(n * self.act_dim);
        self.obs.truncate(n * self.obs_dim);
        self.terminated.truncate(n);
        self.truncated.truncate(n);
        let finals = self.final_obs_steps.partition_point(|&i| i < n);
        self.final_obs_steps.truncate(finals);
        self.final_obs.truncate(finals * self.obs_dim);
        self.steps = steps;
        if !self.is_full() {
            self.bootstrap_obs.clear();
        }
        if steps == 0 {
            self.initial_state.clear();
        }
        self.device_obs = None;
    }

    /// Copy the observations to the device in `layout` ([`Rollout::device_obs`]) ahead of the update.
    pub fn put_obs_on_device(&mut self, layout: &ObsLayout) -> Result<()> {
        self.device_obs = Some(DeviceObs(layout.tensor(self.obs.as_ref())?));
        Ok(())
    }

    /// The observations on the device, if [`Rollout::put_obs_on_device`] put them there (any later change to
    /// the rollout drops them).
    pub fn device_obs(&self) -> Option<&Tensor> {
        self.device_obs.as_ref().map(|d| &d.0)
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

    /// `dones[i] = terminated[i] || truncated[i]`.
    pub fn dones(&self) -> Vec<bool> {
        self.terminated.iter().zip(&self.truncated).map(|(a, b)| *a || *b).collect()
    }

    /// Where a recurrent policy's state was zeroed before a step, `[len]` as 0/1: 1 at step `t ≥ 1` of an env
    /// whose episode ended at step `t − 1` (the state at step 0 is [`Rollout::initial_state`]).
    pub fn episode_starts(&self) -> Vec<f32> {
        let (n, e) = (self.len(), self.n_envs);
        (0..n).map(|i| if i >= e && (self.terminated[i - e] || self.truncated[i - e]) { 1.0 } else { 0.0 }).collect()
    }

    /// GAE advantages and returns from the rewards, values and the filled `next_values`.
    fn gae_from_next_values(&mut self, gamma: f32, lambda: f32) {
        let n = self.len();
        let dones = self.dones();
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
    }

    /// Fill `next_values` where it follows from `values` (inside an episode), `last_values` (after the last
    /// step) or a termination (0); truncated steps are left as they are.
    fn fill_next_values(&self, values: &[f32], last_values: &[f32], next_values: &mut [f32]) {
        let n = self.len();
        for i in 0..n {
            if self.terminated[i] {
                next_values[i] = 0.0;
            } else if !self.truncated[i] {
                // The next observation is the one the policy saw at the next step (or after the rollout).
                next_values[i] =
                    if i + self.n_envs < n { values[i + self.n_envs] } else { last_values[i + self.n_envs - n] };
            }
        }
    }

    /// Compute next-state values, GAE advantages and returns. `last_values` are `V` of the observations after
    /// the final step (the first observations of new episodes where an env just ended: those are masked).
    pub fn finish(&mut self, last_values: &[f32], gamma: f32, lambda: f32) -> Result<()> {
        check_len("rollout last values", last_values.len(), self.n_envs)?;
        let n = self.len();
        let mut next_values = std::mem::take(&mut self.next_values);
        self.fill_next_values(&self.values, last_values, &mut next_values[..n]);
        self.next_values = next_values;
        self.gae_from_next_values(gamma, lambda);
        Ok(())
    }

    /// `next_values` under another value function (one whose parameters moved on since the rollout was
    /// collected): `values` is its `V` of the stored observations, and `value_fn` computes it for a batch of
    /// the kept final and bootstrap observations (called once). 0 after a termination.
    ///
    /// Needs the final observation of every truncated step and the bootstrap observations unless
    /// every env's last step ended its episode; [`RolloutCollector`] records both.
    pub fn next_values_under(
        &self,
        values: &[f32],
        value_fn: impl FnOnce(ObsRef<'_>) -> Result<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        let n = self.len();
        check_len("rollout values to recompute next values from", values.len(), n)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let cut = |i: usize| self.truncated[i] && !self.terminated[i];
        let needed = (0..n).filter(|&i| cut(i)).count();
        let mut seen = vec![false; n];
        for &i in &self.final_obs_steps {
            if i >= n || !cut(i) || std::mem::replace(&mut seen[i], true) {
                return Err(Error::length(
                    format!("rollout final observations (one per truncated step; transition {i} is not one)"),
                    self.final_obs_steps.len(),
                    needed,
                ));
            }
        }
        if self.final_obs_steps.len() != needed || self.final_obs.len() != needed * self.obs_dim {
            return Err(Error::length(
                "rollout final observations of truncated steps (chunks carry them)",
                self.final_obs_steps.len(),
                needed,
            ));
        }
        let need_bootstrap = (n - self.n_envs..n).any(|i| !self.terminated[i] && !self.truncated[i]);
        if need_bootstrap {
            check_len(
                "rollout bootstrap observations (the chunk of the last step carries them)",
                self.bootstrap_obs.len(),
                self.n_envs * self.obs_dim,
            )?;
        }
        let mut next_values = vec![0.0; n];
        let mut rows = self.final_obs.clone();
        if need_bootstrap {
            append("rollout bootstrap observations", &mut rows, self.bootstrap_obs.as_ref())?;
        }
        let extra = if rows.is_empty() { Vec::new() } else { value_fn(rows.as_ref())? };
        check_len("values of the final and bootstrap observations", extra.len(), rows.len() / self.obs_dim)?;
        let (final_values, last_values) = extra.split_at(needed);
        for (&i, &v) in self.final_obs_steps.iter().zip(final_values) {
            next_values[i] = v;
        }
        let last_values = if need_bootstrap { last_values.to_vec() } else { vec![0.0; self.n_envs] };
        self.fill_next_values(values, &last_values, &mut next_values);
        Ok(next_values)
    }
}

impl Rollout {
    /// Overwrite this rollout with chunks of `n_steps` steps stacked row-wise ([`Rollout::append_chunks`] to an
    /// empty rollout); needs no network, so a batch-assembly thread runs it.
    pub fn stack_chunks(&mut self, chunks: &[Chunk]) -> Result<()> {
        // Columns an earlier use or a failed stack may have left behind.
        self.clear();
        let steps = chunks.first().map_or(0, |c| c.n_steps);
        check_len("chunk steps", steps, self.n_steps)?;
        self.append_chunks(chunks)
    }

    /// Append chunks of the same `T` steps stacked row-wise: chunk `k`'s env `j` becomes row `k · E + j` (the
    /// chunks' envs add up to `n_envs`) of the next `T` steps, observations in their dtype; the true final
    /// observations of truncated episodes are kept, and the step that fills the rollout brings the bootstrap
    /// observations. After an error the rollout holds what it held before.
    pub fn append_chunks(&mut self, chunks: &[Chunk]) -> Result<()> {
        let before = self.steps;
        let appended = self.append_unchecked(chunks);
        if appended.is_err() {
            self.truncate(before);
        }
        appended
    }

    fn append_unchecked(&mut self, chunks: &[Chunk]) -> Result<()> {
        self.device_obs = None;
        let r = self;
        let (e, steps) = chunks.first().map_or((0, 0), |c| (c.n_envs, c.n_steps));
        let (d, a) = (r.obs_dim, r.act_dim);
        check_len("rows of the stacked chunks", chunks.len() * e, r.n_envs)?;
        for c in chunks {
            check_len("chunk steps", c.n_steps, steps)?;
            c.check_lengths(e, d, a, true)?;
        }
        if r.steps + steps > r.n_steps {
            return Err(Error::length("rollout steps after the chunks (it holds n_steps)", r.steps + steps, r.n_steps));
        }
        if r.steps == 0 {
            // The state each env had before the rollout began (recurrent policies): all chunks carry it or none.
            let with = chunks.iter().filter(|c| !c.initial_state.is_empty()).count();
            if with != 0 && with != chunks.len() {
                return Err(Error::length(
                    "chunks carrying an initial recurrent state (all or none)",
                    with,
                    chunks.len(),
                ));
            }
            r.initial_state.clear();
            for c in chunks {
                r.initial_state.extend_from_slice(&c.initial_state);
            }
        }
        for t in 0..steps {
            for (k, c) in chunks.iter().enumerate() {
                let rows = t * e..(t + 1) * e;
                // Where this step's final observations start in the chunk.
                let mut cursor = c.final_index.partition_point(|&i| (i as usize) < rows.start);
                append("chunk observations", &mut r.obs, c.obs.slice(rows.start * d..rows.end * d))?;
                r.actions.extend_from_slice(&c.actions[rows.start * a..rows.end * a]);
                r.log_probs.extend_from_slice(&c.log_probs[rows.clone()]);
                r.values.extend_from_slice(&c.values[rows.clone()]);
                r.rewards.extend_from_slice(&c.rewards[rows.clone()]);
                r.terminated.extend_from_slice(&c.terminated[rows.clone()]);
                r.truncated.extend_from_slice(&c.truncated[rows.clone()]);
                // The chunk's final observations in step order: keep those of truncated episodes.
                while let Some(&i) = c.final_index.get(cursor) {
                    let i = i as usize;
                    if i >= rows.end {
                        break;
                    }
                    if c.truncated[i] && !c.terminated[i] {
                        r.final_obs_steps.push((r.steps + t) * r.n_envs + k * e + (i - rows.start));
                        let row = c.final_obs.slice(cursor * d..(cursor + 1) * d);
                        append("chunk final observations", &mut r.final_obs, row)?;
                    }
                    cursor += 1;
                }
            }
        }
        r.steps += steps;
        if r.is_full() {
            r.bootstrap_obs.clear();
            for c in chunks {
                append("chunk bootstrap observations", &mut r.bootstrap_obs, c.bootstrap_obs.as_ref())?;
            }
        }
        debug_assert_eq!(r.rewards.len(), r.n_envs * r.steps);
        Ok(())
    }

    /// Bootstrap the truncated episodes of a stacked rollout from their true final observations, those from
    /// the `from`-th on: `values` computes `V` of all of them in one batched call.
    pub fn bootstrap_truncated(
        &mut self,
        from: usize,
        values: impl FnOnce(ObsRef<'_>) -> Result<Vec<f32>>,
    ) -> Result<()> {
        let steps = &self.final_obs_steps[from.min(self.final_obs_steps.len())..];
        if steps.is_empty() {
            return Ok(());
        }
        let final_values = values(self.final_obs.slice(from * self.obs_dim..self.final_obs.len()))?;
        check_len("values of the final observations", final_values.len(), steps.len())?;
        for (&i, v) in steps.iter().zip(final_values) {
            self.next_values[i] = v;
        }
        Ok(())
    }

    /// Save the stored transitions under `prefix` (shape and step count included).
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        for (name, v) in [
            ("actions", &self.actions),
            ("log_probs", &self.log_probs),
            ("values", &self.values),
            ("rewards", &self.rewards),
            ("next_values", &self.next_values),
        ] {
            c.put_f32(format!("{prefix}.{name}"), v);
        }
        for (name, v) in [("obs", &self.obs), ("final_obs", &self.final_obs), ("bootstrap_obs", &self.bootstrap_obs)] {
            c.put_obs(format!("{prefix}.{name}"), v.as_ref());
        }
        c.put_meta(format!("{prefix}.final_obs_steps"), &self.final_obs_steps)?;
        if !self.initial_state.is_empty() {
            c.put_f32(format!("{prefix}.initial_state"), &self.initial_state);
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
        self.obs = c.take_obs(&format!("{prefix}.obs"))?;
        self.actions = c.take_f32(&format!("{prefix}.actions"))?;
        self.log_probs = c.take_f32(&format!("{prefix}.log_probs"))?;
        self.values = c.take_f32(&format!("{prefix}.values"))?;
        self.rewards = c.take_f32(&format!("{prefix}.rewards"))?;
        self.next_values = c.take_f32(&format!("{prefix}.next_values"))?;
        self.final_obs = c.take_obs(&format!("{prefix}.final_obs"))?;
        self.bootstrap_obs = c.take_obs(&format!("{prefix}.bootstrap_obs"))?;
        self.final_obs_steps = c.meta(&format!("{prefix}.final_obs_steps"))?;
        let key = format!("{prefix}.initial_state");
        self.initial_state = if c.has_tensor(&key) { c.take_f32(&key)? } else { Vec::new() };
        self.terminated = c.meta(&format!("{prefix}.terminated"))?;
        self.truncated = c.meta(&format!("{prefix}.truncated"))?;
        Ok(())
    }
}

/// The rows of whole env sequences in a time-major rollout of `n_envs` envs: row `t · n_envs + e` for each of
/// `steps` steps `t` of each env `e` in `envs`, step by step (what a recurrent update's minibatch draws).
pub(crate) fn sequence_rows(
    steps: usize,
    n_envs: usize,
    envs: impl Iterator<Item = usize> + Clone,
) -> impl Iterator<Item = usize> {
    (0..steps).flat_map(move |t| envs.clone().map(move |e| t * n_envs + e))
}

/// `V` of observation rows, as a [`NextValues`] source gives it.
pub type RowValues<'a> = dyn FnMut(ObsRef<'_>) -> Result<Vec<f32>> + 'a;

/// Where a [`RolloutCollector`] takes the values of next states from: `V` of observation rows (any
/// `FnMut(ObsRef) -> Result<Vec<f32>>`: final observations as chunks arrive, bootstrap ones when full), or every
/// next-state value of the full rollout at once ([`Sequences`], a recurrent policy's).
pub trait NextValues {
    /// `V` of observation rows; `None` for a source that values whole sequences.
    fn of_rows(&mut self) -> Option<&mut RowValues<'_>>;
    /// Every next-state value of a full rollout; `None` for a source that values observation rows.
    fn of_rollout(&mut self, rollout: &Rollout) -> Option<Result<Vec<f32>>>;
}

impl<F: FnMut(ObsRef<'_>) -> Result<Vec<f32>>> NextValues for F {
    fn of_rows(&mut self) -> Option<&mut RowValues<'_>> {
        Some(self)
    }

    fn of_rollout(&mut self, _: &Rollout) -> Option<Result<Vec<f32>>> {
        None
    }
}

/// A recurrent policy's [`NextValues`]: the full rollout's sequences re-run from their initial states give
/// every `V(x_{t+1})` (`ActorCritic::sequence_eval`).
pub struct Sequences<F>(pub F);

impl<F: FnMut(&Rollout) -> Result<Vec<f32>>> NextValues for Sequences<F> {
    fn of_rows(&mut self) -> Option<&mut RowValues<'_>> {
        None
    }

    fn of_rollout(&mut self, rollout: &Rollout) -> Option<Result<Vec<f32>>> {
        Some((self.0)(rollout))
    }
}

/// A [`Rollout`] filled from trajectory chunks (one-step or whole, stacked row-wise), as PPO and A2C collect it:
/// truncated episodes bootstrapped from `V(true final observation)`, finished with `V` of the observations after
/// its last step.
#[derive(Debug)]
pub struct RolloutCollector {
    rollout: Rollout,
    /// The first of the rollout's final observations whose value is not computed yet
    /// ([`RolloutCollector::push_chunks_deferred`]); `None`: every one is valued.
    unvalued_from: Option<usize>,
}

impl RolloutCollector {
    /// Empty storage for `n_steps × n_envs` transitions.
    pub fn new(n_envs: usize, n_steps: usize, obs_dim: usize, act_dim: usize) -> Self {
        RolloutCollector { rollout: Rollout::new(n_envs, n_steps, obs_dim, act_dim), unvalued_from: None }
    }

    /// [`RolloutCollector::push_chunks`] with the final observations' values left to the finish, where one pass
    /// values them with the bootstrap observations ([`RolloutCollector::unvalued_obs`],
    /// [`RolloutCollector::finish_valued`]); the parameters do not change inside a rollout, so the values agree.
    pub fn push_chunks_deferred(&mut self, chunks: &[Chunk]) -> Result<()> {
        let finals = self.rollout.final_obs_steps.len();
        self.rollout.append_chunks(chunks)?;
        if self.unvalued_from.is_none() && self.rollout.final_obs_steps.len() > finals {
            self.unvalued_from = Some(finals);
        }
        Ok(())
    }

    /// The final observations [`RolloutCollector::push_chunks_deferred`] left without a value (empty: none).
    pub fn unvalued_obs(&self) -> ObsRef<'_> {
        let r = &self.rollout;
        let from = self.unvalued_from.unwrap_or(r.final_obs_steps.len());
        r.final_obs.slice(from * r.obs_dim..r.final_obs.len())
    }

    /// [`RolloutCollector::finish`] with the values already computed: `final_values` of
    /// [`RolloutCollector::unvalued_obs`] and `last_values` of [`RolloutCollector::bootstrap_obs`].
    pub fn finish_valued(
        &mut self,
        final_values: Vec<f32>,
        last_values: Vec<f32>,
        gamma: f32,
        lambda: f32,
    ) -> Result<Option<Rollout>> {
        if !self.rollout.is_full() {
            return Ok(None);
        }
        if let Some(from) = self.unvalued_from {
            self.rollout.bootstrap_truncated(from, |_: ObsRef<'_>| Ok(final_values))?;
            self.unvalued_from = None;
        }
        self.finish(|_: ObsRef<'_>| Ok(last_values.clone()), gamma, lambda)
    }

    /// Append chunks stacked row-wise ([`Rollout::append_chunks`]) and, where `values` takes observation rows,
    /// value their truncated episodes' final observations in one call ([`Sequences`] leave them to
    /// [`RolloutCollector::finish`]). After an error the rollout holds what it held before.
    pub fn push_chunks(&mut self, chunks: &[Chunk], mut values: impl NextValues) -> Result<()> {
        let (steps, finals) = (self.rollout.steps, self.rollout.final_obs_steps.len());
        self.rollout.append_chunks(chunks)?;
        let Some(of_rows) = values.of_rows() else { return Ok(()) };
        if let Err(e) = self.rollout.bootstrap_truncated(finals, of_rows) {
            self.rollout.truncate(steps);
            return Err(e);
        }
        Ok(())
    }

    /// Take a whole rollout of the collector's shape stacked elsewhere ([`Rollout::stack_chunks`]), value its
    /// final observations as [`RolloutCollector::push_chunks`] does, and hand back the empty buffer.
    pub fn push_stacked(&mut self, mut rollout: Rollout, mut values: impl NextValues) -> Result<Rollout> {
        let (r, mine) = (&rollout, &self.rollout);
        check_len("rollout steps before push_stacked (it fills a whole rollout)", mine.steps, 0)?;
        check_len("stacked rollout envs", r.n_envs, mine.n_envs)?;
        check_len("stacked rollout steps", r.n_steps, mine.n_steps)?;
        check_len("stacked rollout observation size", r.obs_dim, mine.obs_dim)?;
        check_len("stacked rollout action size", r.act_dim, mine.act_dim)?;
        check_len("stacked rollout filled steps", r.steps, r.n_steps)?;
        if let Some(of_rows) = values.of_rows() {
            rollout.bootstrap_truncated(0, of_rows)?;
        }
        Ok(std::mem::replace(&mut self.rollout, rollout))
    }

    /// The layout of the rollouts [`RolloutCollector::push_stacked`] takes, for a network taking `obs`.
    pub fn layout(&self, obs: ObsLayout) -> RolloutLayout {
        let r = &self.rollout;
        RolloutLayout { n_envs: r.n_envs, n_steps: r.n_steps, obs_dim: r.obs_dim, act_dim: r.act_dim, obs }
    }

    /// When the rollout is full: the values after its last step (or with [`Sequences`] every next-state value),
    /// then GAE advantages and returns; hands the rollout out (back with [`RolloutCollector::recycle`]). `None`
    /// while it is still filling.
    pub fn finish(&mut self, mut values: impl NextValues, gamma: f32, lambda: f32) -> Result<Option<Rollout>> {
        if !self.rollout.is_full() {
            return Ok(None);
        }
        if let (Some(from), Some(of_rows)) = (self.unvalued_from, values.of_rows()) {
            // Final observations left for the finish (push_chunks_deferred), valued here after all.
            self.rollout.bootstrap_truncated(from, of_rows)?;
            self.unvalued_from = None;
        }
        let next = values.of_rollout(&self.rollout).transpose()?;
        let last_values = match (&next, values.of_rows()) {
            (None, Some(of_rows)) => of_rows(self.rollout.bootstrap_obs.as_ref())?,
            _ => Vec::new(),
        };
        let empty = Rollout::new(self.rollout.n_envs, self.rollout.n_steps, self.rollout.obs_dim, self.rollout.act_dim);
        let mut rollout = std::mem::replace(&mut self.rollout, empty);
        match next {
            // Every next-state value given (a recurrent policy's, from the states its sequences reach).
            Some(next) => {
                check_len("rollout next values", next.len(), rollout.len())?;
                rollout.next_values[..next.len()].copy_from_slice(&next);
                rollout.gae_from_next_values(gamma, lambda);
            }
            None => rollout.finish(&last_values, gamma, lambda)?,
        }
        Ok(Some(rollout))
    }

    /// Whether the rollout being collected is full: the next [`RolloutCollector::finish`] hands it out.
    pub fn is_full(&self) -> bool {
        self.rollout.is_full()
    }

    /// The observations after the last step collected: a full rollout's bootstrap values are of these.
    pub fn bootstrap_obs(&self) -> ObsRef<'_> {
        self.rollout.bootstrap_obs.as_ref()
    }

    /// Take back a rollout [`RolloutCollector::finish`] handed out, cleared, to fill again.
    pub fn recycle(&mut self, mut rollout: Rollout) {
        rollout.clear();
        self.rollout = rollout;
        self.unvalued_from = None;
    }

    /// Save the partly filled rollout under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        if let Some(from) = self.unvalued_from {
            c.put_meta(format!("{prefix}.unvalued_from"), &from)?;
        }
        self.rollout.write_to(c, prefix)
    }

    /// Restore what [`RolloutCollector::write_to`] saved.
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        self.rollout.read_from(c, prefix)?;
        let key = format!("{prefix}.unvalued_from");
        self.unvalued_from = if c.has_meta(&key) { Some(c.meta(&key)?) } else { None };
        if self.unvalued_from.is_some_and(|from| from > self.rollout.final_obs_steps.len()) {
            return Err(Error::Checkpoint(format!("{key} is past the rollout's final observations")));
        }
        Ok(())
    }
}

/// Append `obs` to `buf`; an empty buffer takes the dtype of what it is given (a rollout holds whatever its
/// env produces), a non-empty one refuses another dtype.
fn append(what: &str, buf: &mut ObsBuf, obs: ObsRef<'_>) -> Result<()> {
    if buf.is_empty() && buf.dtype() != obs.dtype() {
        *buf = ObsBuf::with_capacity(obs.dtype(), obs.len());
    }
    if buf.extend(obs) { Ok(()) } else { Err(dtype_mismatch(what, buf, obs)) }
}

fn dtype_mismatch(what: &str, buf: &ObsBuf, obs: ObsRef<'_>) -> Error {
    Error::length(format!("{what}: {:?} values into a rollout holding {:?}", obs.dtype(), buf.dtype()), obs.len(), 0)
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected { Ok(()) } else { Err(Error::length(what.to_string(), got, expected)) }
}

#[cfg(test)]
impl Clone for DeviceObs {
    fn clone(&self) -> Self {
        DeviceObs(self.0.shallow_clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ActOutput;

    #[test]
    fn next_values_follow_time_and_truncation() {
        // 2 envs × 2 steps; env 1 is truncated at step 0 with V(final obs) = 7.
        let mut r = Rollout::new(2, 2, 1, 1);
        r.push_step(&[0.0, 0.0], &[0.0, 1.0], &[0.0, 0.0], &[1.0, 2.0], &[false, false], &[false, true], &[0.0, 0.0]);
        r.bootstrap_truncated(0, |rows| Ok(vec![7.0; rows.len()])).unwrap();
        r.push_step(&[0.0, 0.0], &[0.0, 1.0], &[0.0, 0.0], &[3.0, 4.0], &[true, false], &[false, false], &[0.0, 0.0]);
        assert!(r.is_full());
        r.finish(&[5.0, 6.0], 1.0, 1.0).unwrap();
        assert_eq!(r.next_values, vec![3.0, 7.0, 0.0, 6.0]);
        // env 1: step 0 truncated => Â = 1 + 7 - 2; step 1 => Â = 1 + 6 - 4.
        assert_eq!(r.advantages[1], 6.0);
        assert_eq!(r.advantages[3], 3.0);
        // env 0: step 1 terminated => Â = 1 - 3 = -2; step 0 => δ = 1 + 3 - 1 = 3, Â = 3 + (-2) = 1.
        assert_eq!(r.advantages[2], -2.0);
        assert_eq!(r.advantages[0], 1.0);
        let full = r.clone();
        let more = Chunk::from_step(
            ObsRef::F32(&[0.0, 0.0]),
            &[0.0, 1.0],
            &[0.0; 2],
            &[3.0, 4.0],
            &[1.0; 2],
            &[false; 2],
            &[false; 2],
            ObsRef::F32(&[0.0; 2]),
        );
        assert!(r.append_chunks(&[more]).is_err(), "full buffer refuses");
        assert_eq!((r.len(), &r.bootstrap_obs), (full.len(), &full.bootstrap_obs), "and keeps what it held");
        assert!(matches!(r.finish(&[1.0], 1.0, 1.0), Err(Error::BadLength { .. })));
    }

    /// 2 envs × 2 steps, `obs_dim` 1: env 1 truncated at step 0 (final observation 9), env 0 terminated at
    /// step 1, bootstrap observations (5, 6).
    fn cut_rollout() -> Rollout {
        let mut r = Rollout::new(2, 2, 1, 1);
        r.push_step(&[1.0, 2.0], &[0.0, 1.0], &[-0.1, -0.2], &[1.0, 2.0], &[false, false], &[false, true], &[3.0, 9.0]);
        r.bootstrap_truncated(0, |rows| Ok(vec![7.0; rows.len()])).unwrap();
        r.push_step(&[3.0, 4.0], &[0.0, 1.0], &[-0.3, -0.4], &[3.0, 4.0], &[true, false], &[false, false], &[5.0, 6.0]);
        r
    }

    impl Rollout {
        /// Test data: one step of `obs` (1-D observations) with actions `a`, log-probs 0, values `v`, rewards 1,
        /// its flags and the observations that truly followed (`next`, the bootstrap ones at the last step).
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn push_step(
            &mut self,
            obs: &[f32],
            a: &[f32],
            log_probs: &[f32],
            v: &[f32],
            terminated: &[bool],
            truncated: &[bool],
            next: &[f32],
        ) {
            let rewards = vec![1.0; v.len()];
            let (obs, next) = (ObsRef::F32(obs), ObsRef::F32(next));
            let chunk = Chunk::from_step(obs, a, log_probs, v, &rewards, terminated, truncated, next);
            self.append_chunks(&[chunk]).unwrap();
        }

        /// Test data: one step acted as `out` says on `obs`, its rewards and terminations (no time limits).
        pub(crate) fn push_acted(&mut self, obs: &[f32], out: &ActOutput, rewards: &[f32], terminated: &[bool]) {
            let (truncated, obs) = (vec![false; rewards.len()], ObsRef::F32(obs));
            let (a, lp, v) = (&out.actions, &out.log_probs, &out.values);
            self.append_chunks(&[Chunk::from_step(obs, a, lp, v, rewards, terminated, &truncated, obs)]).unwrap();
        }
    }

    #[test]
    fn next_values_under_new_values_use_the_kept_observations() {
        let r = cut_rollout();
        // A "new" value function V(x) = 100 x, given for the stored observations as (10, 20, 30, 40).
        let mut calls = 0;
        let next = r
            .next_values_under(&[10.0, 20.0, 30.0, 40.0], |rows| {
                calls += 1;
                assert_eq!(rows, ObsRef::F32(&[9.0, 5.0, 6.0]), "final observations, then the bootstrap ones");
                Ok(rows.as_f32().unwrap().iter().map(|x| 100.0 * x).collect())
            })
            .unwrap();
        assert_eq!(calls, 1);
        // env 0: the next row's value, then terminated; env 1: V(final obs), then V(bootstrap obs).
        assert_eq!(next, vec![30.0, 900.0, 0.0, 600.0]);
        // Without the final observation (a rollout filled by hand), the values cannot be recomputed.
        let mut bare = r.clone();
        bare.final_obs.clear();
        bare.final_obs_steps.clear();
        let e = bare.next_values_under(&[0.0; 4], |rows| Ok(vec![0.0; rows.len()])).unwrap_err().to_string();
        assert!(e.contains("final observations of truncated steps"), "{e}");
        let mut bare = r.clone();
        bare.bootstrap_obs.clear();
        let e = bare.next_values_under(&[0.0; 4], |rows| Ok(vec![0.0; rows.len()])).unwrap_err().to_string();
        assert!(e.contains("bootstrap observations"), "{e}");
    }

    #[test]
    fn checkpoint_keeps_final_and_bootstrap_observations() {
        let r = cut_rollout();
        let mut c = Checkpoint::new();
        r.write_to(&mut c, "rollout").unwrap();
        let mut back = Rollout::new(2, 2, 1, 1);
        back.read_from(&mut c, "rollout").unwrap();
        assert!(back.is_full());
        assert_eq!((back.final_obs.clone(), back.final_obs_steps.clone()), (ObsBuf::F32(vec![9.0]), vec![1]));
        assert_eq!(back.bootstrap_obs, ObsBuf::F32(vec![5.0, 6.0]));
        assert_eq!((back.obs.clone(), back.log_probs.clone()), (r.obs.clone(), r.log_probs.clone()));
        back.clear();
        assert!(back.final_obs.is_empty() && back.final_obs_steps.is_empty() && back.bootstrap_obs.is_empty());
    }

    /// Two chunks of 2 envs × 3 steps (obs_dim 1): chunk 0's env 1 is truncated at step 0 (final obs 90),
    /// chunk 1's env 0 terminates at step 1 (final obs 91) and env 1 is truncated at step 2 (final obs 92).
    fn two_chunks() -> Vec<Chunk> {
        use flotilla_core::{EpisodeStats, ObsBuf};
        let chunk = |base: f32,
                     terminated: Vec<bool>,
                     truncated: Vec<bool>,
                     final_index: Vec<u32>,
                     finals: Vec<f32>| Chunk {
            actor_id: 1,
            policy_version: 0,
            n_steps: 3,
            n_envs: 2,
            obs: ObsBuf::F32((0..6).map(|i| base + i as f32).collect()),
            bootstrap_obs: ObsBuf::F32(vec![base + 6.0, base + 7.0]),
            actions: (0..6).map(|i| (i % 2) as f32).collect(),
            rewards: vec![1.0; 6],
            terminated,
            truncated,
            log_probs: (0..6).map(|i| -0.1 * i as f32).collect(),
            values: (0..6).map(|i| base + 0.5 * i as f32).collect(),
            initial_state: Vec::new(),
            final_index,
            final_obs: ObsBuf::F32(finals),
            episodes: vec![EpisodeStats { episode_return: 3.0, length: 3, env_index: 0, truncated: false, task: None }],
        };
        let f = false;
        vec![
            chunk(0.0, vec![f; 6], vec![f, true, f, f, f, f], vec![1], vec![90.0]),
            chunk(100.0, vec![f, f, true, f, f, f], vec![f, f, f, f, f, true], vec![2, 5], vec![91.0, 92.0]),
        ]
    }

    #[test]
    fn chunks_fill_the_rollout_as_the_same_steps_observed_one_by_one() {
        let chunks = two_chunks();
        let value = |rows: ObsRef<'_>| Ok(rows.as_f32().unwrap().iter().map(|x| 10.0 * x).collect::<Vec<f32>>());
        let mut from_chunks = RolloutCollector::new(4, 3, 1, 1);
        let mut calls = 0;
        from_chunks
            .push_chunks(&chunks, |rows: ObsRef<'_>| {
                calls += 1;
                value(rows)
            })
            .unwrap();
        assert_eq!(calls, 1, "V of every final observation in one call");
        // The same data as the trainer's per-step transitions, rows stacked chunk by chunk.
        let mut by_step = RolloutCollector::new(4, 3, 1, 1);
        let mut cursors = [0usize; 2];
        for t in 0..3 {
            let (mut obs, mut next_obs, mut act) = (vec![], vec![], crate::ActOutput::default());
            let (mut rewards, mut terminated, mut truncated) = (vec![], vec![], vec![]);
            for (c, cursor) in chunks.iter().zip(&mut cursors) {
                let r = t * 2..t * 2 + 2;
                c.obs.extend_f32(r.clone(), &mut obs);
                for e in 0..2 {
                    next_obs.extend_from_slice(c.next_obs(t, e, 1, cursor).as_f32().unwrap());
                }
                act.actions.extend_from_slice(&c.actions[r.clone()]);
                act.log_probs.extend_from_slice(&c.log_probs[r.clone()]);
                act.values.extend_from_slice(&c.values[r.clone()]);
                rewards.extend_from_slice(&c.rewards[r.clone()]);
                terminated.extend_from_slice(&c.terminated[r.clone()]);
                truncated.extend_from_slice(&c.truncated[r]);
            }
            let step = Chunk::from_step(
                ObsRef::F32(&obs),
                &act.actions,
                &act.log_probs,
                &act.values,
                &rewards,
                &terminated,
                &truncated,
                ObsRef::F32(&next_obs),
            );
            by_step.push_chunks(std::slice::from_ref(&step), value).unwrap();
        }
        let a = from_chunks.finish(value, 0.9, 0.8).unwrap().expect("full");
        let b = by_step.finish(value, 0.9, 0.8).unwrap().expect("full");
        assert_eq!(a.obs, b.obs);
        assert_eq!((a.actions.clone(), a.log_probs.clone(), a.values.clone()), (b.actions, b.log_probs, b.values));
        assert_eq!((a.terminated.clone(), a.truncated.clone()), (b.terminated, b.truncated));
        assert_eq!((a.final_obs.clone(), a.final_obs_steps.clone()), (ObsBuf::F32(vec![90.0, 92.0]), vec![1, 11]));
        assert_eq!((a.final_obs.clone(), a.final_obs_steps.clone()), (b.final_obs, b.final_obs_steps));
        assert_eq!(a.next_values, b.next_values);
        assert_eq!(a.advantages, b.advantages);
        assert_eq!(a.returns, b.returns);
        // A batch of the wrong width is refused; so is a push into a rollout already filled.
        let mut collector = RolloutCollector::new(4, 3, 1, 1);
        assert!(collector.push_chunks(&chunks[..1], value).is_err());
        // A push that fails half-way (here: the value function) leaves nothing behind: the next one works.
        let failing = |_: ObsRef<'_>| Err(Error::NonFinite("value function failed".into()));
        assert!(collector.push_chunks(&chunks, failing).is_err());
        collector.push_chunks(&chunks, value).unwrap();
        assert!(collector.push_chunks(&chunks, value).is_err(), "already full");
        let again = collector.finish(value, 0.9, 0.8).unwrap().expect("full");
        assert_eq!((again.obs, again.advantages), (a.obs, a.advantages));
    }

    /// What the learner's assembly thread does (stack, copy the observations to the device) and the agent
    /// then takes gives the rollout `push_chunks` fills, with the device copy of its observations.
    #[test]
    fn a_rollout_stacked_elsewhere_equals_one_pushed_from_chunks() {
        let chunks = two_chunks();
        let value = |rows: ObsRef<'_>| Ok(rows.as_f32().unwrap().iter().map(|x| 10.0 * x).collect::<Vec<f32>>());
        let mut pushed = RolloutCollector::new(4, 3, 1, 1);
        pushed.push_chunks(&chunks, value).unwrap();
        let a = pushed.finish(value, 0.9, 0.8).unwrap().expect("full");

        let mut collector = RolloutCollector::new(4, 3, 1, 1);
        let layout = collector.layout(ObsLayout { obs_dim: 1, image: None, device: tch::Device::Cpu });
        // A buffer with leftovers of an earlier batch: stacking overwrites it.
        let mut staged = layout.empty();
        staged.stack_chunks(&chunks[1..]).unwrap_err();
        staged.stack_chunks(&chunks).unwrap();
        staged.put_obs_on_device(&layout.obs).unwrap();
        let spare = collector.push_stacked(staged, value).unwrap();
        assert!(spare.is_empty() && spare.device_obs().is_none());
        let b = collector.finish(value, 0.9, 0.8).unwrap().expect("full");
        assert_eq!(a.obs, b.obs);
        assert_eq!(
            (a.actions.clone(), a.log_probs.clone(), a.values.clone()),
            (b.actions.clone(), b.log_probs.clone(), b.values.clone())
        );
        assert_eq!((a.final_obs.clone(), a.final_obs_steps.clone()), (b.final_obs.clone(), b.final_obs_steps.clone()));
        assert_eq!(
            (a.next_values.clone(), a.advantages.clone(), a.returns.clone()),
            (b.next_values.clone(), b.advantages.clone(), b.returns.clone())
        );
        let on_device = Vec::<f32>::try_from(b.device_obs().expect("device copy").flatten(0, -1)).unwrap();
        assert_eq!(ObsBuf::F32(on_device), b.obs);
        // A rollout of another shape, or one not stacked in full, is refused.
        let mut narrow = RolloutCollector::new(2, 3, 1, 1);
        let mut full = layout.empty();
        full.stack_chunks(&chunks).unwrap();
        assert!(narrow.push_stacked(full, value).unwrap_err().to_string().contains("envs"));
        assert!(collector.push_stacked(layout.empty(), value).unwrap_err().to_string().contains("filled steps"));
    }
}
