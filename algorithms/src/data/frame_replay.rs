//! Replay for stacked image observations that stores each frame once.
//!
//! An Atari observation is a stack of `K` frames (4 × 84 × 84 bytes), and consecutive observations of one game
//! share `K − 1` of them; a transition's `next_obs` shares `K − 1` with its `obs`. Storing both stacks per
//! transition (what [`crate::data::replay::ReplayBuffer`] does) keeps each frame up to `2K` = 8 times. Here a frame is
//! written once into a ring of frames and a transition holds `2K` frame ids; the stacks are rebuilt from the ids
//! when a batch is sampled.
//!
//! ```text
//! push(obs, next_obs):  for each of the 2K frames: hash it; a frame with the same bytes among the last
//!                       `reuse_window` frames written → its id; otherwise write it (a new id)
//! sample(B):            uniform rows; obs / next_obs rebuilt by copying K frames each into the batch
//! ```
//!
//! * **Exact**: a frame is reused only when its bytes are equal (hash, then `==`), so every sampled stack is
//!   byte-identical to the one pushed — after resets, life losses, repeated screens and n-step windows alike.
//!   Nothing assumes how stacks are built (zero padding or repeated first frames after a reset both work).
//! * **Bounded**: frame ids grow by one per write; slot `id % frame_capacity`. A frame is reused only if it is
//!   at most `reuse_window` writes old, so a transition pushed when the newest id was `f` needs ids ≥
//!   `f − reuse_window`; it is evicted (oldest first) before the ring would overwrite them, i.e. once `f +
//!   frame_capacity − reuse_window` is reached. With about one new frame per transition (the usual case), the
//!   buffer holds `capacity` transitions in `capacity + reuse_window` frames plus a margin: about one frame per
//!   transition, ~1/8 of storing both stacks.
use std::collections::HashMap;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::data::replay::{Experience, ReplaySample, check_len, check_not_empty, take_checked};
use crate::{Error, Result};

/// The saved sizes and counters of a [`FrameReplay`] (checkpoint metadata).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct FrameReplayState {
    capacity: usize,
    stack: usize,
    frame_len: usize,
    frame_capacity: usize,
    /// Frame ids written so far (the next id).
    next_frame: u64,
    /// Transitions ever pushed (the next transition's sequence number).
    pushed: u64,
    len: usize,
}

/// Uniform replay of transitions whose observations are stacks of `stack` frames of `frame_len` bytes, each
/// distinct recent frame stored once. Discrete or continuous actions of `act_dim` values.
#[derive(Debug, Clone)]
pub struct FrameReplay {
    capacity: usize,
    stack: usize,
    frame_len: usize,
    act_dim: usize,
    frame_capacity: usize,
    reuse_window: u64,
    frames: Vec<u8>,
    /// Id of the frame in each slot (`u64::MAX`: empty), to drop stale hash entries.
    slot_ids: Vec<u64>,
    /// Hash of the frame in each slot (so that evicting it needs no second hash).
    slot_hashes: Vec<u64>,
    next_frame: u64,
    /// Hash of a frame's bytes → ids of recent frames with that hash.
    by_hash: HashMap<u64, Vec<u64>>,
    /// Per transition slot: `2 · stack` frame ids (obs, then next_obs).
    ids: Vec<u64>,
    /// Per transition slot: the newest frame id when it was pushed (eviction order).
    pushed_at: Vec<u64>,
    actions: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    discounts: Vec<f32>,
    /// Transitions ever pushed; the live ones are `pushed − len .. pushed`, slot `seq % capacity`.
    pushed: u64,
    len: usize,
}

/// A fast hash of a frame's bytes (8 bytes per multiply, FxHash's mixing): it only picks candidates, whose
/// bytes are then compared, so its quality costs speed at worst, never exactness.
fn frame_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mix = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h =
        (&mut words).fold(bytes.len() as u64, |h, w| mix(h, u64::from_le_bytes(w.try_into().expect("8 bytes"))));
    for &b in words.remainder() {
        h = mix(h, u64::from(b));
    }
    h
}

impl FrameReplay {
    /// Room for `capacity` transitions of `stack × frame_len`-byte observations and `act_dim` action values.
    pub fn new(capacity: usize, stack: usize, frame_len: usize, act_dim: usize) -> Result<Self> {
        if capacity == 0 || stack == 0 || frame_len == 0 {
            let what = "frame replay capacity, stack and frame size (all must be positive)";
            return Err(Error::length(what, capacity.min(stack).min(frame_len), 1));
        }
        // Obs frames come from the last step or two of the same env: a window of a few thousand writes
        // covers hundreds of envs. The margin holds the frames of transitions with more than one new frame
        // (episode starts) so that the ring does not evict below `capacity` transitions.
        let reuse_window = (64 * stack).max(4096).min(capacity / 4 + stack) as u64;
        let frame_capacity = capacity + capacity / 8 + reuse_window as usize + 2 * stack;
        Ok(FrameReplay {
            capacity,
            stack,
            frame_len,
            act_dim,
            frame_capacity,
            reuse_window,
            frames: vec![0; frame_capacity * frame_len],
            slot_ids: vec![u64::MAX; frame_capacity],
            slot_hashes: vec![0; frame_capacity],
            next_frame: 0,
            by_hash: HashMap::new(),
            ids: vec![0; capacity * 2 * stack],
            pushed_at: vec![0; capacity],
            actions: vec![0.0; capacity * act_dim],
            rewards: vec![0.0; capacity],
            terminated: vec![false; capacity],
            discounts: vec![0.0; capacity],
            pushed: 0,
            len: 0,
        })
    }

    /// Transitions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of observation per observation (`stack × frame_len`).
    pub fn obs_dim(&self) -> usize {
        self.stack * self.frame_len
    }

    /// Frames written so far (distinct frames, counting each rewrite after it left the reuse window).
    pub fn frames_written(&self) -> u64 {
        self.next_frame
    }

    fn frame(&self, id: u64) -> &[u8] {
        let slot = (id % self.frame_capacity as u64) as usize;
        &self.frames[slot * self.frame_len..(slot + 1) * self.frame_len]
    }

    /// The id of a frame with these bytes: a recent one's, or a new one written now.
    fn intern(&mut self, bytes: &[u8]) -> u64 {
        let hash = frame_hash(bytes);
        let oldest_reusable = self.next_frame.saturating_sub(self.reuse_window);
        if let Some(ids) = self.by_hash.get(&hash)
            && let Some(&id) = ids.iter().rev().find(|&&id| id >= oldest_reusable && self.frame(id) == bytes)
        {
            return id;
        }
        let id = self.next_frame;
        // Transitions whose frames the ring is about to reach go first (see the module docs).
        let horizon = (self.frame_capacity as u64).saturating_sub(self.reuse_window);
        while self.len > 0 {
            let oldest = ((self.pushed - self.len as u64) % self.capacity as u64) as usize;
            if self.pushed_at[oldest] + horizon > id {
                break;
            }
            self.len -= 1;
        }
        let slot = (id % self.frame_capacity as u64) as usize;
        let old = self.slot_ids[slot];
        if old != u64::MAX {
            let old_hash = self.slot_hashes[slot];
            if let Some(ids) = self.by_hash.get_mut(&old_hash) {
                ids.retain(|&x| x != old);
                if ids.is_empty() {
                    self.by_hash.remove(&old_hash);
                }
            }
        }
        self.frames[slot * self.frame_len..(slot + 1) * self.frame_len].copy_from_slice(bytes);
        self.slot_ids[slot] = id;
        self.slot_hashes[slot] = hash;
        self.by_hash.entry(hash).or_default().push(id);
        self.next_frame += 1;
        id
    }

    /// Store one transition (its observations `stack × frame_len` bytes each), evicting the oldest when full.
    pub fn push(&mut self, e: &Experience<'_, u8>) -> Result<()> {
        let od = self.obs_dim();
        check_len("frame replay observation", e.obs.len(), od)?;
        check_len("frame replay next observation", e.next_obs.len(), od)?;
        check_len("frame replay action", e.action.len(), self.act_dim)?;
        if self.len == self.capacity {
            self.len -= 1; // the oldest slot is the one this push reuses
        }
        let pushed_at = self.next_frame;
        // The slot is past the live range (`len < capacity` here), so eviction inside `intern` never reads it.
        let slot = (self.pushed % self.capacity as u64) as usize;
        let frames = e.obs.chunks_exact(self.frame_len).chain(e.next_obs.chunks_exact(self.frame_len));
        for (k, frame) in frames.enumerate() {
            self.ids[slot * 2 * self.stack + k] = self.intern(frame);
        }
        self.pushed_at[slot] = pushed_at;
        self.actions[slot * self.act_dim..(slot + 1) * self.act_dim].copy_from_slice(e.action);
        self.rewards[slot] = e.reward;
        self.terminated[slot] = e.terminated;
        self.discounts[slot] = e.discount;
        self.pushed += 1;
        self.len += 1;
        Ok(())
    }

    /// Draw `batch_size` transitions uniformly with replacement into `out`, stacks rebuilt (weights all 1;
    /// `out.indices` are positions from the oldest live transition).
    pub fn sample(&self, batch_size: usize, rng: &mut impl Rng, out: &mut ReplaySample<u8>) -> Result<()> {
        check_not_empty("frame replay", self.len, batch_size)?;
        let (od, ad, fl, k) = (self.obs_dim(), self.act_dim, self.frame_len, self.stack);
        out.resize(batch_size, od, ad);
        let first = self.pushed - self.len as u64;
        for row in 0..batch_size {
            let index = rng.random_range(0..self.len);
            out.indices[row] = index;
            let slot = ((first + index as u64) % self.capacity as u64) as usize;
            let ids = &self.ids[slot * 2 * k..(slot + 1) * 2 * k];
            for (j, &id) in ids.iter().enumerate() {
                let (dst, at) = if j < k { (&mut out.obs, j) } else { (&mut out.next_obs, j - k) };
                dst[row * od + at * fl..row * od + (at + 1) * fl].copy_from_slice(self.frame(id));
            }
            out.actions[row * ad..(row + 1) * ad].copy_from_slice(&self.actions[slot * ad..(slot + 1) * ad]);
            out.rewards[row] = self.rewards[slot];
            out.terminated[row] = self.terminated[slot];
            out.discounts[row] = self.discounts[slot];
        }
        out.weights.fill(1.0);
        Ok(())
    }

    /// Save the live frames and transitions under `prefix` (the whole rings: frames of live transitions may sit
    /// anywhere in them).
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        c.put_tensor(format!("{prefix}.frames"), &Tensor::f_from_slice(&self.frames)?);
        let to_i64 = |v: &[u64]| Tensor::from_slice(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
        c.put_tensor(format!("{prefix}.slot_ids"), &to_i64(&self.slot_ids));
        c.put_tensor(format!("{prefix}.ids"), &to_i64(&self.ids));
        c.put_tensor(format!("{prefix}.pushed_at"), &to_i64(&self.pushed_at));
        c.put_f32(format!("{prefix}.actions"), &self.actions);
        c.put_f32(format!("{prefix}.rewards"), &self.rewards);
        c.put_tensor(format!("{prefix}.terminated"), &Tensor::f_from_slice(&self.terminated)?);
        c.put_f32(format!("{prefix}.discounts"), &self.discounts);
        let FrameReplay { capacity, stack, frame_len, frame_capacity, next_frame, pushed, len, .. } = *self;
        let state = FrameReplayState { capacity, stack, frame_len, frame_capacity, next_frame, pushed, len };
        c.put_meta(format!("{prefix}.state"), &state)
    }

    /// Restore what [`FrameReplay::write_to`] saved into a buffer of the same sizes (nothing changes if the
    /// checkpoint does not match); the frame index is rebuilt from the frames.
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let state: FrameReplayState = c.meta(&format!("{prefix}.state"))?;
        let saved = (state.capacity, state.stack, state.frame_len, state.frame_capacity);
        let ours = (self.capacity, self.stack, self.frame_len, self.frame_capacity);
        if saved != ours || state.len > self.capacity {
            let what = format!("saved frame replay has sizes {saved:?} and {} transitions", state.len);
            return Err(Error::Checkpoint(format!("{prefix:?}: {what}, this one {ours:?}")));
        }
        let (cap, fc, k, ad) = (self.capacity, self.frame_capacity, self.stack, self.act_dim);
        let frames = take_checked(c, &format!("{prefix}.frames"), Kind::Uint8, &[fc * self.frame_len])?;
        let slot_ids = take_checked(c, &format!("{prefix}.slot_ids"), Kind::Int64, &[fc])?;
        let ids = take_checked(c, &format!("{prefix}.ids"), Kind::Int64, &[cap * 2 * k])?;
        let pushed_at = take_checked(c, &format!("{prefix}.pushed_at"), Kind::Int64, &[cap])?;
        let actions = take_checked(c, &format!("{prefix}.actions"), Kind::Float, &[cap * ad])?;
        let rewards = take_checked(c, &format!("{prefix}.rewards"), Kind::Float, &[cap])?;
        let terminated = take_checked(c, &format!("{prefix}.terminated"), Kind::Bool, &[cap])?;
        let discounts = take_checked(c, &format!("{prefix}.discounts"), Kind::Float, &[cap])?;
        let from_i64 =
            |t: &Tensor| -> Result<Vec<u64>> { Ok(Vec::<i64>::try_from(t)?.into_iter().map(|x| x as u64).collect()) };
        frames.f_copy_data(&mut self.frames, fc * self.frame_len)?;
        self.slot_ids = from_i64(&slot_ids)?;
        self.ids = from_i64(&ids)?;
        self.pushed_at = from_i64(&pushed_at)?;
        actions.f_copy_data(&mut self.actions, cap * ad)?;
        rewards.f_copy_data(&mut self.rewards, cap)?;
        terminated.f_copy_data(&mut self.terminated, cap)?;
        discounts.f_copy_data(&mut self.discounts, cap)?;
        self.next_frame = state.next_frame;
        self.pushed = state.pushed;
        self.len = state.len;
        self.by_hash.clear();
        for slot in 0..fc {
            let id = self.slot_ids[slot];
            if id != u64::MAX {
                let hash = frame_hash(self.frame(id));
                self.slot_hashes[slot] = hash;
                self.by_hash.entry(hash).or_default().push(id);
            }
        }
        for ids in self.by_hash.values_mut() {
            ids.sort_unstable();
        }
        Ok(())
    }
}

#[cfg(test)]
impl FrameReplay {
    /// Memory this buffer holds per transition of its capacity (frames, ids and scalars), against
    /// `2 · obs_dim` bytes for storing both stacks.
    pub(crate) fn bytes_per_transition(&self) -> f64 {
        let frames = (self.frame_capacity * (self.frame_len + 8)) as f64;
        let per_row = (2 * self.stack * 8 + 8 + 4 * self.act_dim + 4 + 1 + 4) as f64;
        frames / self.capacity as f64 + per_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    /// 3 × 4-byte frames stacked: frame `t` of env `e`'s episode `ep` is `[e, ep, t, t]`; a reset pads the stack
    /// with copies of the first frame.
    fn stack_at(e: u8, ep: u8, t: u8) -> Vec<u8> {
        (0..3u8)
            .flat_map(|k| {
                let s = t.saturating_sub(2 - k);
                [e, ep, s, s]
            })
            .collect()
    }

    #[test]
    fn stacks_come_back_byte_identical_and_frames_are_stored_once() {
        let mut r = FrameReplay::new(200, 3, 4, 1).unwrap();
        let mut pushed = Vec::new();
        for step in 0..500u32 {
            for e in 0..2u8 {
                let (ep, t) = ((step / 20) as u8, (step % 20) as u8);
                let obs = stack_at(e, ep, t);
                let next = stack_at(e, ep, t + 1);
                let action = [f32::from(e)];
                let x = Experience {
                    obs: &obs,
                    action: &action,
                    reward: step as f32,
                    next_obs: &next,
                    terminated: t == 19,
                    discount: 0.9,
                };
                r.push(&x).unwrap();
                pushed.push((obs, next, step as f32));
            }
        }
        assert_eq!(r.len(), 200);
        // About one new frame per transition (plus the padded ones of episode starts), not 2 × 3.
        let per_transition = r.frames_written() as f64 / 1000.0;
        assert!(per_transition < 1.3, "{per_transition} frames written per transition");
        let mut rng = Pcg64::seed_from_u64(1);
        let mut out = ReplaySample::default();
        r.sample(64, &mut rng, &mut out).unwrap();
        let live = &pushed[pushed.len() - 200..];
        for row in 0..64 {
            let (obs, next, reward) = &live[out.indices[row]];
            assert_eq!(&out.obs[row * 12..(row + 1) * 12], &obs[..], "row {row}");
            assert_eq!(&out.next_obs[row * 12..(row + 1) * 12], &next[..], "row {row}");
            assert_eq!(out.rewards[row], *reward);
        }
        // A checkpoint round trip samples the same rows, and keeps deduplicating afterwards.
        let mut c = Checkpoint::new();
        r.write_to(&mut c, "replay").unwrap();
        let mut back = FrameReplay::new(200, 3, 4, 1).unwrap();
        back.read_from(&mut c, "replay").unwrap();
        let mut again = ReplaySample::default();
        back.sample(64, &mut Pcg64::seed_from_u64(1), &mut again).unwrap();
        assert_eq!(again, out);
        let before = back.frames_written();
        let x = Experience {
            obs: &live[199].1,
            action: &[0.0],
            reward: 0.0,
            next_obs: &live[199].1,
            terminated: false,
            discount: 0.9,
        };
        back.push(&x).unwrap();
        assert_eq!(back.frames_written(), before, "every frame of that stack was stored already");
        assert!(FrameReplay::new(200, 3, 5, 1).unwrap().read_from(&mut Checkpoint::new(), "replay").is_err());
    }

    #[test]
    fn many_new_frames_per_transition_evict_instead_of_corrupting() {
        // Every frame distinct: 6 new frames per transition; the buffer keeps fewer transitions, all intact.
        let mut r = FrameReplay::new(100, 3, 2, 1).unwrap();
        let mut pushed = Vec::new();
        for i in 0..2_000u32 {
            let b = i.to_le_bytes();
            let obs: Vec<u8> = (0..3).flat_map(|k| [b[0] ^ k, b[1]]).collect();
            let next: Vec<u8> = (0..3).flat_map(|k| [b[0] ^ (k + 8), b[1] ^ 0x80]).collect();
            r.push(&Experience {
                obs: &obs,
                action: &[1.0],
                reward: i as f32,
                next_obs: &next,
                terminated: false,
                discount: 1.0,
            })
            .unwrap();
            pushed.push((obs, next));
        }
        assert!(!r.is_empty() && r.len() <= 100);
        let mut out = ReplaySample::default();
        r.sample(256, &mut Pcg64::seed_from_u64(3), &mut out).unwrap();
        for row in 0..256 {
            let i = out.rewards[row] as usize;
            assert!(i >= 2_000 - r.len(), "only live transitions are sampled");
            assert_eq!(&out.obs[row * 6..(row + 1) * 6], &pushed[i].0[..]);
            assert_eq!(&out.next_obs[row * 6..(row + 1) * 6], &pushed[i].1[..]);
        }
    }

    #[test]
    fn bytes_per_transition_are_about_one_frame() {
        let r = FrameReplay::new(100_000, 4, 84 * 84, 1).unwrap();
        let naive = 2.0 * (4 * 84 * 84) as f64;
        let ours = r.bytes_per_transition();
        assert!(ours < naive / 6.0, "{ours} bytes per transition against {naive}");
        let e = r.clone().sample(1, &mut Pcg64::seed_from_u64(0), &mut ReplaySample::default()).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }
}
