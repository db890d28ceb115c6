//! Off-policy replay storage: a fixed-capacity circular buffer (Mnih et al. 2015, "Human-level control through
//! deep reinforcement learning") and proportional prioritized replay on top of it (Schaul et al. 2016,
//! "Prioritized Experience Replay").
//!
//! The loop it lives in (DQN-style, with [`crate::data::n_step::NStep`] in front for multi-step returns):
//!
//! ```text
//! nstep.push(obs, actions, rewards, terminated, truncated, next_obs, |e| replay.push(e))?;
//! if time_to_train {
//!     replay.sample(batch_size, beta, &mut rng, &mut batch)?;      // reuses `batch`'s buffers
//!     target = batch.rewards + batch.discounts · (1 − batch.terminated) · max_a Q̄(batch.next_obs, a);
//!     loss   = mean(batch.weights · huber(Q(batch.obs, batch.actions) − target));
//!     replay.update_priorities(&batch.indices, &td_errors)?;
//! }
//! ```
//!
//! Every array is allocated once at construction, and `sample` copies rows into the caller's [`ReplaySample`] with
//! no allocation once its buffers have grown to the batch size; observations keep their dtype ([`Element`]: Atari
//! u8 frames stay u8). Prioritized replay: priority `p_i = (|δ_i| + ε)^α`; new transitions get the largest priority
//! seen so far (1 at first); a batch of `k` is drawn stratified — one uniform draw in each of `k` equal slices of
//! the total mass, as in the paper's Appendix B.2.1, Dopamine and SB3 — and each row gets the importance weight
//! `w_i = (N · P(i))^(−β) / max_j w_j` with `P(i) = p_i / Σ p` and the maximum over the whole buffer,
//! `max_j w_j = (N · p_min / Σ p)^(−β)`.
use rand::Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::data::sum_tree::SumTree;
use crate::{Error, Result};

/// An observation element type stored as is: `f32` for vector observations, `u8` for image frames.
pub trait Element: tch::kind::Element + Copy + Default + Send + Sync + 'static {
    /// A CPU tensor of this kind holding a copy of `data` with `shape` (whose product must be `data.len()`).
    fn to_tensor(data: &[Self], shape: &[i64]) -> Result<Tensor> {
        Ok(Tensor::f_from_slice(data)?.f_view(shape)?)
    }
}

impl Element for f32 {}
impl Element for u8 {}

/// One transition, borrowed: what [`ReplayBuffer::push`] stores and [`crate::data::n_step::NStep`] emits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experience<'a, O> {
    /// The observation the action was taken in (`obs_dim` values).
    pub obs: &'a [O],
    /// The action (`act_dim` values; a discrete action is one f32 index).
    pub action: &'a [f32],
    /// The (possibly n-step discounted) return `Σ_{k<m} γ^k r_{t+k}`.
    pub reward: f32,
    /// The observation to bootstrap from: the true final one where the episode ended.
    pub next_obs: &'a [O],
    /// The episode reached a terminal state: the target does not bootstrap.
    pub terminated: bool,
    /// The bootstrap discount `γ^m` (γ for one-step transitions).
    pub discount: f32,
}

/// A sampled batch, row-major (`batch_size` rows). Reused between calls: `sample` overwrites every field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplaySample<O: Element> {
    /// Buffer slots the rows came from (pass them back to [`PrioritizedReplay::update_priorities`]).
    pub indices: Vec<usize>,
    /// Observations, `batch_size × obs_dim`.
    pub obs: Vec<O>,
    /// Actions, `batch_size × act_dim`.
    pub actions: Vec<f32>,
    /// Rewards (n-step returns for n-step transitions).
    pub rewards: Vec<f32>,
    /// Observations to bootstrap from, `batch_size × obs_dim`.
    pub next_obs: Vec<O>,
    /// Terminal transitions (no bootstrap).
    pub terminated: Vec<bool>,
    /// Bootstrap discounts `γ^m`.
    pub discounts: Vec<f32>,
    /// Importance-sampling weights: all 1 for uniform sampling, at most 1 for prioritized sampling.
    pub weights: Vec<f32>,
    /// Prioritized sampling's draws, one per row (scratch).
    masses: Vec<f64>,
}

impl<O: Element> ReplaySample<O> {
    /// Size every field for `batch_size` rows (no allocation once grown).
    pub(crate) fn resize(&mut self, batch_size: usize, obs_dim: usize, act_dim: usize) {
        self.indices.resize(batch_size, 0);
        self.obs.resize(batch_size * obs_dim, O::default());
        self.actions.resize(batch_size * act_dim, 0.0);
        self.rewards.resize(batch_size, 0.0);
        self.next_obs.resize(batch_size * obs_dim, O::default());
        self.terminated.resize(batch_size, false);
        self.discounts.resize(batch_size, 0.0);
        self.weights.resize(batch_size, 1.0);
    }
}

/// Transitions in a circular buffer of fixed capacity; once full, each push overwrites the oldest.
#[derive(Debug, Clone)]
pub struct ReplayBuffer<O: Element> {
    capacity: usize,
    obs_dim: usize,
    act_dim: usize,
    obs: Vec<O>,
    actions: Vec<f32>,
    rewards: Vec<f32>,
    next_obs: Vec<O>,
    terminated: Vec<bool>,
    discounts: Vec<f32>,
    /// The slot the next push writes.
    pos: usize,
    len: usize,
}

/// Sizes and cursor saved with a buffer's arrays.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct BufferState {
    capacity: usize,
    obs_dim: usize,
    act_dim: usize,
    len: usize,
    pos: usize,
}

impl<O: Element> ReplayBuffer<O> {
    /// An empty buffer of `capacity` transitions, all memory allocated now.
    pub fn new(capacity: usize, obs_dim: usize, act_dim: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(Error::config("replay", "buffer_size", "0", "the buffer must hold at least one transition"));
        }
        Ok(ReplayBuffer {
            capacity,
            obs_dim,
            act_dim,
            obs: vec![O::default(); capacity * obs_dim],
            actions: vec![0.0; capacity * act_dim],
            rewards: vec![0.0; capacity],
            next_obs: vec![O::default(); capacity * obs_dim],
            terminated: vec![false; capacity],
            discounts: vec![0.0; capacity],
            pos: 0,
            len: 0,
        })
    }

    /// Number of transitions stored (at most the capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Store a transition, overwriting the oldest when full; returns the slot written.
    pub fn push(&mut self, e: &Experience<'_, O>) -> Result<usize> {
        check_len("replay observation", e.obs.len(), self.obs_dim)?;
        check_len("replay next observation", e.next_obs.len(), self.obs_dim)?;
        check_len("replay action", e.action.len(), self.act_dim)?;
        let i = self.pos;
        self.obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(e.obs);
        self.next_obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(e.next_obs);
        self.actions[i * self.act_dim..(i + 1) * self.act_dim].copy_from_slice(e.action);
        self.rewards[i] = e.reward;
        self.terminated[i] = e.terminated;
        self.discounts[i] = e.discount;
        self.pos = (i + 1) % self.capacity;
        self.len = (self.len + 1).min(self.capacity);
        Ok(i)
    }

    /// Draw `batch_size` transitions uniformly with replacement into `out` (importance weights all 1).
    pub fn sample(&self, batch_size: usize, rng: &mut impl Rng, out: &mut ReplaySample<O>) -> Result<()> {
        check_not_empty("replay buffer", self.len, batch_size)?;
        out.resize(batch_size, self.obs_dim, self.act_dim);
        for index in &mut out.indices {
            *index = rng.random_range(0..self.len);
        }
        out.weights.fill(1.0);
        self.gather(out);
        Ok(())
    }

    /// Copy the rows named by `out.indices` into the other fields of `out` (already sized).
    fn gather(&self, out: &mut ReplaySample<O>) {
        let (od, ad) = (self.obs_dim, self.act_dim);
        for (row, &i) in out.indices.iter().enumerate() {
            out.obs[row * od..(row + 1) * od].copy_from_slice(&self.obs[i * od..(i + 1) * od]);
            out.next_obs[row * od..(row + 1) * od].copy_from_slice(&self.next_obs[i * od..(i + 1) * od]);
            out.actions[row * ad..(row + 1) * ad].copy_from_slice(&self.actions[i * ad..(i + 1) * ad]);
            out.rewards[row] = self.rewards[i];
            out.terminated[row] = self.terminated[i];
            out.discounts[row] = self.discounts[i];
        }
    }

    /// Save the stored transitions (slots `0..len`, the only ones written), the write position and the sizes
    /// under `prefix` (`prefix.obs`, `prefix.actions`, ..., `prefix.state`).
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let (n, od, ad) = (self.len, self.obs_dim, self.act_dim);
        let rows = |d: usize| [n as i64, d as i64];
        c.put_tensor(format!("{prefix}.obs"), &O::to_tensor(&self.obs[..n * od], &rows(od))?);
        c.put_tensor(format!("{prefix}.next_obs"), &O::to_tensor(&self.next_obs[..n * od], &rows(od))?);
        c.put_tensor(format!("{prefix}.actions"), &Tensor::f_from_slice(&self.actions[..n * ad])?.f_view(rows(ad))?);
        c.put_f32(format!("{prefix}.rewards"), &self.rewards[..n]);
        c.put_tensor(format!("{prefix}.terminated"), &Tensor::f_from_slice(&self.terminated[..n])?);
        c.put_f32(format!("{prefix}.discounts"), &self.discounts[..n]);
        let state = BufferState { capacity: self.capacity, obs_dim: od, act_dim: ad, len: n, pos: self.pos };
        c.put_meta(format!("{prefix}.state"), &state)
    }

    /// Restore what [`ReplayBuffer::write_to`] saved into a buffer of the same capacity and sizes. Nothing
    /// changes if the checkpoint does not match.
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let state = self.read_state(c, prefix)?;
        let (n, od, ad) = (state.len, self.obs_dim, self.act_dim);
        let obs = take_checked(c, &format!("{prefix}.obs"), O::KIND, &[n, od])?;
        let next_obs = take_checked(c, &format!("{prefix}.next_obs"), O::KIND, &[n, od])?;
        let actions = take_checked(c, &format!("{prefix}.actions"), Kind::Float, &[n, ad])?;
        let rewards = take_checked(c, &format!("{prefix}.rewards"), Kind::Float, &[n])?;
        let terminated = take_checked(c, &format!("{prefix}.terminated"), Kind::Bool, &[n])?;
        let discounts = take_checked(c, &format!("{prefix}.discounts"), Kind::Float, &[n])?;
        obs.f_copy_data(&mut self.obs[..n * od], n * od)?;
        next_obs.f_copy_data(&mut self.next_obs[..n * od], n * od)?;
        actions.f_copy_data(&mut self.actions[..n * ad], n * ad)?;
        rewards.f_copy_data(&mut self.rewards[..n], n)?;
        terminated.f_copy_data(&mut self.terminated[..n], n)?;
        discounts.f_copy_data(&mut self.discounts[..n], n)?;
        self.len = n;
        self.pos = state.pos;
        Ok(())
    }

    /// The saved sizes and cursor, checked against this buffer.
    fn read_state(&self, c: &Checkpoint, prefix: &str) -> Result<BufferState> {
        let state: BufferState = c.meta(&format!("{prefix}.state"))?;
        let saved = (state.capacity, state.obs_dim, state.act_dim);
        let ours = (self.capacity, self.obs_dim, self.act_dim);
        if saved != ours {
            let what = "saved replay buffer has (capacity, obs_dim, act_dim)";
            return Err(Error::Checkpoint(format!("{prefix:?}: {what} = {saved:?}, this one {ours:?}")));
        }
        let full_or_filling =
            if state.len == state.capacity { state.pos < state.capacity } else { state.pos == state.len };
        if state.len > state.capacity || !full_or_filling {
            return Err(Error::Checkpoint(format!("{prefix:?}: inconsistent replay buffer state {state:?}")));
        }
        Ok(state)
    }
}

/// [`ReplayBuffer`] with proportional prioritized sampling over a [`SumTree`].
#[derive(Debug, Clone)]
pub struct PrioritizedReplay<O: Element> {
    buffer: ReplayBuffer<O>,
    tree: SumTree,
    alpha: f64,
    eps: f64,
    /// The largest `p_i` (already raised to α) ever set; new transitions get it.
    max_priority: f64,
}

impl<O: Element> PrioritizedReplay<O> {
    /// An empty buffer of `capacity` transitions with priority exponent `alpha` (≥ 0; 0 is uniform) and
    /// `eps` (> 0) added to `|δ|` so that no transition gets priority 0.
    pub fn new(capacity: usize, obs_dim: usize, act_dim: usize, alpha: f64, eps: f64) -> Result<Self> {
        let invalid = |field, value: f64, detail: &str| Error::config("prioritized replay", field, value, detail);
        if !(alpha.is_finite() && alpha >= 0.0) {
            return Err(invalid("alpha", alpha, "must be finite and ≥ 0"));
        }
        if !(eps.is_finite() && eps > 0.0) {
            return Err(invalid("eps", eps, "must be finite and > 0"));
        }
        let buffer = ReplayBuffer::new(capacity, obs_dim, act_dim)?;
        Ok(PrioritizedReplay { buffer, tree: SumTree::new(capacity), alpha, eps, max_priority: 1.0 })
    }

    /// Number of transitions stored.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Store a transition with the largest priority seen so far; returns the slot written.
    pub fn push(&mut self, e: &Experience<'_, O>) -> Result<usize> {
        let i = self.buffer.push(e)?;
        self.tree.set(i, self.max_priority)?;
        Ok(i)
    }

    /// Draw `batch_size` transitions, stratified and proportionally to priority, into `out`, with importance
    /// weights for exponent `beta` (≥ 0) normalised by the largest weight in the buffer.
    pub fn sample(&self, batch_size: usize, beta: f64, rng: &mut impl Rng, out: &mut ReplaySample<O>) -> Result<()> {
        check_not_empty("replay buffer", self.buffer.len, batch_size)?;
        if !(beta.is_finite() && beta >= 0.0) {
            return Err(Error::config("prioritized replay", "beta", beta, "must be finite and ≥ 0"));
        }
        out.resize(batch_size, self.buffer.obs_dim, self.buffer.act_dim);
        // Row j draws uniformly from the j-th of batch_size equal slices of the total mass.
        let segment = self.tree.total() / batch_size as f64;
        out.masses.clear();
        out.masses.extend((0..batch_size).map(|row| (row as f64 + rng.random::<f64>()) * segment));
        self.tree.find_many(&mut out.masses, &mut out.indices);
        // w_i / w_max = (N p_i / Σp)^(−β) / (N p_min / Σp)^(−β) = (p_i / p_min)^(−β): N and Σp cancel.
        let p_min = self.tree.min();
        for (&i, weight) in out.indices.iter().zip(&mut out.weights) {
            debug_assert!(i < self.buffer.len(), "slot {i} found beyond the {} stored", self.buffer.len());
            *weight = (self.tree.get(i) / p_min).powf(-beta) as f32;
        }
        self.buffer.gather(out);
        Ok(())
    }

    /// Set `p_i = (|δ_i| + ε)^α` for each sampled slot `indices[j]` from its TD error `td_errors[j]` (the last
    /// one wins where a slot appears twice). Nothing changes if any input is invalid.
    pub fn update_priorities(&mut self, indices: &[usize], td_errors: &[f32]) -> Result<()> {
        check_len("prioritized replay TD errors (one per index)", td_errors.len(), indices.len())?;
        for (row, (&i, &delta)) in indices.iter().zip(td_errors).enumerate() {
            if i >= self.buffer.len() {
                let what = format!("prioritized replay index {i} (row {row}) into the stored transitions");
                return Err(Error::length(what, i + 1, self.buffer.len()));
            }
            if !delta.is_finite() {
                let detail = format!("TD error of slot {i} (row {row}) must be finite");
                return Err(Error::config("prioritized replay", "td_errors", delta, detail));
            }
        }
        for (&i, &delta) in indices.iter().zip(td_errors) {
            let p = (delta.abs() as f64 + self.eps).powf(self.alpha);
            self.tree.set(i, p)?;
            self.max_priority = self.max_priority.max(p);
        }
        Ok(())
    }

    /// Save the buffer (see [`ReplayBuffer::write_to`]), the priorities of the stored slots (f64, exact) and
    /// the max priority under `prefix`.
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        self.buffer.write_to(c, prefix)?;
        c.put_tensor(format!("{prefix}.priorities"), &Tensor::f_from_slice(&self.tree.priorities()[..self.len()])?);
        c.put_tensor(format!("{prefix}.max_priority"), &Tensor::f_from_slice(&[self.max_priority])?);
        Ok(())
    }

    /// Restore what [`PrioritizedReplay::write_to`] saved; the trees are rebuilt from the saved priorities
    /// and sample exactly as the saved ones did. Nothing changes if the checkpoint does not match (α and ε
    /// stay this object's: they come from the config).
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let n = self.buffer.read_state(c, prefix)?.len;
        let priorities = Vec::<f64>::try_from(&take_checked(c, &format!("{prefix}.priorities"), Kind::Double, &[n])?)?;
        let max_priority =
            take_checked(c, &format!("{prefix}.max_priority"), Kind::Double, &[1])?.f_double_value(&[0])?;
        // Validate before anything changes: the tree refuses non-finite or negative priorities.
        let mut tree = SumTree::new(self.buffer.capacity);
        tree.rebuild(&priorities)?;
        if !(max_priority.is_finite() && max_priority > 0.0) {
            return Err(Error::Checkpoint(format!("{prefix:?}: invalid max priority {max_priority}")));
        }
        self.buffer.read_from(c, prefix)?;
        self.tree = tree;
        self.max_priority = max_priority;
        Ok(())
    }
}

/// A `BadLength` error unless `got == expected`.
pub(crate) fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected { Ok(()) } else { Err(Error::length(what, got, expected)) }
}

/// A `BadLength` error if `what` holds nothing to sample `batch_size` transitions from.
pub(crate) fn check_not_empty(what: &str, len: usize, batch_size: usize) -> Result<()> {
    let what = format!("{what} to sample {batch_size} transitions from (it is empty)");
    if len == 0 { Err(Error::length(what, 0, 1)) } else { Ok(()) }
}

/// Take tensor `name` from `c`, checking its kind and shape.
pub(crate) fn take_checked(c: &mut Checkpoint, name: &str, kind: Kind, shape: &[usize]) -> Result<Tensor> {
    let t = c.take_tensor(name)?;
    let want: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let (got, size) = (t.kind(), t.size());
    if got != kind || size != want {
        return Err(Error::Checkpoint(format!(
            "{name:?} is {got:?} of shape {size:?}, expected {kind:?} of shape {want:?}"
        )));
    }
    Ok(t)
}

#[cfg(test)]
impl<O: Element> ReplayBuffer<O> {
    /// The transition in slot `index`, if one is stored there.
    pub(crate) fn get(&self, index: usize) -> Option<Experience<'_, O>> {
        (index < self.len).then(|| Experience {
            obs: &self.obs[index * self.obs_dim..(index + 1) * self.obs_dim],
            action: &self.actions[index * self.act_dim..(index + 1) * self.act_dim],
            reward: self.rewards[index],
            next_obs: &self.next_obs[index * self.obs_dim..(index + 1) * self.obs_dim],
            terminated: self.terminated[index],
            discount: self.discounts[index],
        })
    }
}

#[cfg(test)]
impl<O: Element> PrioritizedReplay<O> {
    /// The priority `p_i` (already raised to α) of slot `index`, if a transition is stored there.
    pub(crate) fn priority(&self, index: usize) -> Option<f64> {
        (index < self.buffer.len()).then(|| self.tree.get(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    /// Transition `k` of a test stream: every field a function of `k`, so a sampled row names its origin.
    fn push_numbered<O: Element + From<u8>>(push: &mut impl FnMut(&Experience<'_, O>) -> Result<usize>, k: usize) {
        let obs = [O::from(k as u8), O::from(1)];
        let next_obs = [O::from(k as u8 + 1), O::from(2)];
        let action = [k as f32, -(k as f32)];
        let e = Experience {
            obs: &obs,
            action: &action,
            reward: k as f32 * 0.5,
            next_obs: &next_obs,
            terminated: k % 3 == 1,
            discount: 0.9,
        };
        push(&e).unwrap();
    }

    fn check_rows<O: Element + From<u8> + PartialEq + std::fmt::Debug>(s: &ReplaySample<O>, n: usize) {
        assert_eq!((s.obs.len(), s.next_obs.len(), s.actions.len()), (2 * n, 2 * n, 2 * n));
        assert_eq!((s.rewards.len(), s.terminated.len(), s.discounts.len(), s.weights.len()), (n, n, n, n));
        for row in 0..n {
            let k = s.actions[2 * row] as usize;
            assert_eq!(s.obs[2 * row..2 * row + 2], [O::from(k as u8), O::from(1)]);
            assert_eq!(s.next_obs[2 * row..2 * row + 2], [O::from(k as u8 + 1), O::from(2)]);
            assert_eq!(s.actions[2 * row + 1], -(k as f32));
            assert_eq!((s.rewards[row], s.terminated[row], s.discounts[row]), (k as f32 * 0.5, k % 3 == 1, 0.9));
        }
    }

    #[test]
    fn capacity_is_never_exceeded_and_oldest_is_overwritten() {
        let capacity = 7;
        let mut buf = ReplayBuffer::<f32>::new(capacity, 2, 2).unwrap();
        let (obs_ptr, obs_cap) = (buf.obs.as_ptr(), buf.obs.capacity());
        for k in 0..3 * capacity {
            push_numbered(&mut |e| buf.push(e), k);
            assert_eq!(buf.len(), (k + 1).min(capacity));
        }
        assert_eq!((buf.len(), buf.capacity), (capacity, capacity));
        assert_eq!((buf.obs.as_ptr(), buf.obs.capacity()), (obs_ptr, obs_cap), "storage never reallocated");
        // Slot i holds the newest transition k ≡ i (mod capacity): transitions 14..21.
        let mut stored: Vec<usize> = (0..capacity).map(|i| buf.get(i).unwrap().action[0] as usize).collect();
        stored.sort();
        assert_eq!(stored, (2 * capacity..3 * capacity).collect::<Vec<_>>());
        assert!(buf.get(capacity).is_none());
        let mut s = ReplaySample::default();
        buf.sample(1000, &mut Pcg64::seed_from_u64(0), &mut s).unwrap();
        check_rows(&s, 1000);
        assert!(s.actions.chunks(2).all(|a| a[0] as usize >= 2 * capacity), "only the newest are sampled");
        assert!(s.weights.iter().all(|&w| w == 1.0));
    }

    #[test]
    fn uniform_sampling_covers_the_buffer_evenly_and_reuses_buffers() {
        let mut buf = ReplayBuffer::<f32>::new(10, 2, 2).unwrap();
        for k in 0..10 {
            push_numbered(&mut |e| buf.push(e), k);
        }
        let mut rng = Pcg64::seed_from_u64(1);
        let mut s = ReplaySample::default();
        let mut counts = [0usize; 10];
        buf.sample(64, &mut rng, &mut s).unwrap();
        let ptrs = (s.obs.as_ptr(), s.next_obs.as_ptr(), s.indices.as_ptr());
        for _ in 0..2000 {
            buf.sample(64, &mut rng, &mut s).unwrap();
            check_rows(&s, 64);
            for (&i, a) in s.indices.iter().zip(s.actions.chunks(2)) {
                assert_eq!(a[0] as usize, i, "row copied from its slot");
                counts[i] += 1;
            }
        }
        assert_eq!((s.obs.as_ptr(), s.next_obs.as_ptr(), s.indices.as_ptr()), ptrs, "no reallocation");
        for c in counts {
            assert!((c as f64 / 128_000.0 - 0.1).abs() < 0.005, "{counts:?}");
        }
    }

    #[test]
    fn u8_observations_stay_u8() {
        let mut buf = ReplayBuffer::<u8>::new(4, 2, 2).unwrap();
        for k in 0..6 {
            push_numbered(&mut |e| buf.push(e), k);
        }
        let mut s: ReplaySample<u8> = ReplaySample::default();
        buf.sample(5, &mut Pcg64::seed_from_u64(2), &mut s).unwrap();
        check_rows(&s, 5);
        let obs: &Vec<u8> = &s.obs;
        let t = u8::to_tensor(obs, &[5, 2]).unwrap();
        assert_eq!((t.kind(), t.size()), (Kind::Uint8, vec![5, 2]));
        assert_eq!(Vec::<u8>::try_from(t.flatten(0, -1)).unwrap(), s.obs);
        assert_eq!(f32::to_tensor(&s.actions, &[5, 2]).unwrap().kind(), Kind::Float);
        assert!(u8::to_tensor(obs, &[3, 2]).is_err(), "a shape that does not fit is an error");
    }

    #[test]
    fn refuses_bad_input() {
        let mut buf = ReplayBuffer::<f32>::new(4, 3, 1).unwrap();
        let mut s = ReplaySample::default();
        let e = buf.sample(2, &mut Pcg64::seed_from_u64(0), &mut s).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let (obs, bad) = ([0.0; 3], [0.0; 2]);
        let good =
            Experience { obs: &obs, action: &[1.0], reward: 0.0, next_obs: &obs, terminated: false, discount: 1.0 };
        for (e, what) in [
            (Experience { obs: &bad, ..good }, "replay observation: got 2 values, expected 3"),
            (Experience { next_obs: &bad, ..good }, "replay next observation: got 2 values, expected 3"),
            (Experience { action: &bad, ..good }, "replay action: got 2 values, expected 1"),
        ] {
            assert_eq!(buf.push(&e).unwrap_err().to_string(), what);
        }
        assert!(buf.is_empty(), "nothing stored on error");
        assert!(ReplayBuffer::<f32>::new(0, 3, 1).is_err());
        let mut per = PrioritizedReplay::<f32>::new(4, 3, 1, 0.6, 1e-6).unwrap();
        assert!(per.sample(2, 0.4, &mut Pcg64::seed_from_u64(0), &mut s).unwrap_err().to_string().contains("empty"));
        per.push(&good).unwrap();
        per.push(&good).unwrap();
        assert!(per.sample(2, f64::NAN, &mut Pcg64::seed_from_u64(0), &mut s).is_err());
        assert!(per.update_priorities(&[0, 1], &[1.0]).is_err(), "lengths differ");
        assert!(per.update_priorities(&[0, 2], &[1.0, 1.0]).is_err(), "slot 2 holds nothing yet");
        let e = per.update_priorities(&[0, 1], &[2.0, f32::NAN]).unwrap_err().to_string();
        assert!(e.contains("NaN") && e.contains("row 1"), "{e}");
        assert_eq!((per.priority(0), per.max_priority), (Some(1.0), 1.0), "nothing changed on error");
        for (alpha, eps) in [(-1.0, 1e-6), (f64::NAN, 1e-6), (0.6, 0.0), (0.6, f64::INFINITY)] {
            assert!(PrioritizedReplay::<f32>::new(4, 3, 1, alpha, eps).is_err());
        }
    }

    /// Four transitions with TD errors `deltas`: priorities `(|δ|+ε)^α`.
    fn four(alpha: f64, eps: f64, deltas: &[f32; 4]) -> PrioritizedReplay<f32> {
        let mut per = PrioritizedReplay::<f32>::new(8, 2, 2, alpha, eps).unwrap();
        for k in 0..4 {
            push_numbered(&mut |e| per.push(e), k);
        }
        per.update_priorities(&[0, 1, 2, 3], deltas).unwrap();
        per
    }

    #[test]
    fn prioritized_sampling_frequencies_follow_priorities() {
        let (alpha, eps, deltas) = (0.6, 1e-6, [0.1f32, 0.5, 1.0, 3.0]);
        let per = four(alpha, eps, &deltas);
        let p: Vec<f64> = deltas.iter().map(|&d| (d.abs() as f64 + eps).powf(alpha)).collect();
        let total: f64 = p.iter().sum();
        let mut rng = Pcg64::seed_from_u64(3);
        let mut s = ReplaySample::default();
        // Stratified batches of 64 (as DQN draws them), then single draws (plain proportional sampling).
        for (batch, batches, tolerance) in [(64, 3125, 0.01), (1, 200_000, 0.03)] {
            let mut counts = [0usize; 4];
            for _ in 0..batches {
                per.sample(batch, 0.4, &mut rng, &mut s).unwrap();
                check_rows(&s, batch);
                for &i in &s.indices {
                    counts[i] += 1;
                }
            }
            for i in 0..4 {
                let (freq, want) = (counts[i] as f64 / 200_000.0, p[i] / total);
                assert!((freq / want - 1.0).abs() < tolerance, "batch {batch}, slot {i}: {freq} vs {want}");
            }
        }
    }

    #[test]
    fn importance_weights_match_the_paper() {
        let (alpha, eps, beta, deltas) = (0.7, 1e-6, 0.5, [0.2f32, -1.5, 0.05, 4.0]);
        let per = four(alpha, eps, &deltas);
        // The paper's notation: P(i) = p_i^α / Σ_k p_k^α with p_i = |δ_i| + ε, w_i = (N · P(i))^(−β) / max_j w_j.
        let n = 4.0;
        let p: Vec<f64> = deltas.iter().map(|&d| d.abs() as f64 + eps).collect();
        let sum: f64 = p.iter().map(|x| x.powf(alpha)).sum();
        let w: Vec<f64> = p.iter().map(|x| (n * x.powf(alpha) / sum).powf(-beta)).collect();
        let w_max = w.iter().cloned().fold(0.0, f64::max);
        let mut s = ReplaySample::default();
        per.sample(256, beta, &mut Pcg64::seed_from_u64(4), &mut s).unwrap();
        for (&i, &weight) in s.indices.iter().zip(&s.weights) {
            assert!((weight as f64 - w[i] / w_max).abs() < 1e-6, "slot {i}: {weight} vs {}", w[i] / w_max);
        }
        assert!(s.weights.iter().all(|&x| x <= 1.0));
        // Slot 2 has the lowest priority, so weight exactly 1; by hand for slot 3 (the largest priority):
        // w = ((4 + ε) / (0.05 + ε))^(−α·β).
        let row = s.indices.iter().position(|&i| i == 2).unwrap();
        assert_eq!(s.weights[row], 1.0);
        let row = s.indices.iter().position(|&i| i == 3).unwrap();
        assert!((s.weights[row] as f64 - ((4.0 + eps) / (0.05 + eps)).powf(-0.35)).abs() < 1e-7);
        // β = 0: no correction.
        per.sample(16, 0.0, &mut Pcg64::seed_from_u64(4), &mut s).unwrap();
        assert!(s.weights.iter().all(|&x| x == 1.0));
    }

    #[test]
    fn new_transitions_get_the_max_priority() {
        let mut per = four(0.5, 1e-6, &[0.1, 8.0, 0.3, 0.2]);
        let max = (8.0f64 + 1e-6).sqrt();
        assert_eq!(per.max_priority, max);
        per.update_priorities(&[1], &[0.0]).unwrap();
        assert_eq!(per.max_priority, max, "the max never decreases");
        push_numbered(&mut |e| per.push(e), 4);
        assert_eq!(per.priority(4), Some(max));
        assert_eq!(per.priority(5), None);
    }

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("flotilla-{name}-{}.safetensors", std::process::id()))
    }

    fn round_trip(name: &str, write: impl FnOnce(&mut Checkpoint)) -> Checkpoint {
        let path = temp_path(name);
        let mut c = Checkpoint::new();
        write(&mut c);
        c.save(&path).unwrap();
        let c = Checkpoint::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        c
    }

    #[test]
    fn buffer_checkpoint_restores_identical_sampling() {
        for pushes in [0, 5, 13, 40] {
            let mut buf = ReplayBuffer::<u8>::new(16, 2, 2).unwrap();
            for k in 0..pushes {
                push_numbered(&mut |e| buf.push(e), k);
            }
            let mut c = round_trip(&format!("replay-{pushes}"), |c| buf.write_to(c, "replay").unwrap());
            let mut back = ReplayBuffer::<u8>::new(16, 2, 2).unwrap();
            back.read_from(&mut c, "replay").unwrap();
            assert_eq!((back.len(), back.pos), (buf.len(), buf.pos));
            // Continue both the same way: the same slots get overwritten and samples are identical.
            for k in 100..105 {
                push_numbered(&mut |e| buf.push(e), k);
                push_numbered(&mut |e| back.push(e), k);
            }
            let (mut a, mut b) = (ReplaySample::default(), ReplaySample::default());
            buf.sample(64, &mut Pcg64::seed_from_u64(5), &mut a).unwrap();
            back.sample(64, &mut Pcg64::seed_from_u64(5), &mut b).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn prioritized_checkpoint_restores_identical_sampling() {
        let mut rng = Pcg64::seed_from_u64(6);
        let mut per = PrioritizedReplay::<f32>::new(50, 2, 2, 0.6, 1e-6).unwrap();
        let mut s = ReplaySample::default();
        for k in 0..130 {
            push_numbered(&mut |e| per.push(e), k);
            if k % 10 == 9 {
                per.sample(32, 0.4, &mut rng, &mut s).unwrap();
                let td: Vec<f32> = s.indices.iter().map(|_| rng.random_range(-3.0..3.0)).collect();
                per.update_priorities(&s.indices, &td).unwrap();
            }
        }
        let mut c = round_trip("per", |c| per.write_to(c, "replay").unwrap());
        let mut back = PrioritizedReplay::<f32>::new(50, 2, 2, 0.6, 1e-6).unwrap();
        back.read_from(&mut c, "replay").unwrap();
        assert_eq!(back.tree, per.tree, "trees rebuilt bit for bit");
        assert_eq!(back.max_priority.to_bits(), per.max_priority.to_bits());
        let (mut a, mut b) = (ReplaySample::default(), ReplaySample::default());
        let (mut ra, mut rb) = (Pcg64::seed_from_u64(7), Pcg64::seed_from_u64(7));
        for k in 200..220 {
            push_numbered(&mut |e| per.push(e), k);
            push_numbered(&mut |e| back.push(e), k);
            per.sample(64, 0.5, &mut ra, &mut a).unwrap();
            back.sample(64, 0.5, &mut rb, &mut b).unwrap();
            assert_eq!(a, b);
            let td: Vec<f32> = a.indices.iter().map(|&i| i as f32 * 0.37 - 4.0).collect();
            per.update_priorities(&a.indices, &td).unwrap();
            back.update_priorities(&b.indices, &td).unwrap();
        }
        // A checkpoint of another size is refused and changes nothing.
        let mut c = round_trip("per-small", |c| per.write_to(c, "replay").unwrap());
        let mut other = PrioritizedReplay::<f32>::new(40, 2, 2, 0.6, 1e-6).unwrap();
        let e = other.read_from(&mut c, "replay").unwrap_err().to_string();
        assert!(e.contains("capacity"), "{e}");
        assert!(other.is_empty());
        let mut wrong_kind = ReplayBuffer::<u8>::new(50, 2, 2).unwrap();
        let e = wrong_kind.read_from(&mut c, "replay").unwrap_err().to_string();
        assert!(e.contains("Uint8"), "{e}");
        assert!(wrong_kind.is_empty());
    }
}
