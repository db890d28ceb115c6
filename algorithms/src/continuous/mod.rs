//! What the continuous-control off-policy kinds share — DDPG and TD3 ([`crate::td3`]), SAC ([`crate::sac`]):
//! actions moved between a 1-D `Box`'s bounds and `[−1, 1]`, the replay of chunks with their `[−1, 1]`
//! actions and the counters the training schedule reads (`ActionReplay`), `n` critics `Q_j(s, a)` in one
//! parameter buffer (`Critics`), and the Adam and Polyak steps that run as one host loop on the CPU.
//!
//! As in SB3, **replay stores the `[−1, 1]` action** (`buffer_action`): `ActionReplay::observe` rescales the
//! env-unit action a chunk carries with [`scale_action`], so the critics always see `[−1, 1]` actions, from
//! replay and from the actor; truncated episodes bootstrap from the true final observation.
pub mod action_noise;

use flotilla_core::{Chunk, DType, ObsBuf, Space};
use rand::Rng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::continuous::action_noise::ActionNoise;
use crate::data::replay::{Experience, ReplayBuffer, ReplaySample, check_len};
use crate::nn::nets::{Activation, FlatMlp, LayerInit};
use crate::nn::optimiser::Adam;
use crate::nn::params::FlatParams;
use crate::policy::{ActOutput, f32_obs};
use crate::progress::Progress;
use crate::{Error, Result};

/// `a ∈ [−1, 1]` → env units: `low + (a + 1)/2 · (high − low)` (SB3's `unscale_action`).
pub fn unscale_action(a: f32, low: f32, high: f32) -> f32 {
    low + 0.5 * (a + 1.0) * (high - low)
}

/// Env units → `[−1, 1]`: `2 (x − low)/(high − low) − 1` (SB3's `scale_action`), the inverse of
/// [`unscale_action`].
pub fn scale_action(x: f32, low: f32, high: f32) -> f32 {
    2.0 * ((x - low) / (high - low)) - 1.0
}

/// The bounds of a 1-D `Box` action space with finite bounds, `low < high`; otherwise an error naming `name`.
pub(crate) fn action_bounds(name: &'static str, action_space: &Space) -> Result<(Vec<f32>, Vec<f32>)> {
    match action_space {
        Space::Box { low, high, shape, .. }
            if shape.len() == 1 && low.iter().zip(high).all(|(l, h)| l.is_finite() && h.is_finite() && l < h) =>
        {
            Ok((low.clone(), high.clone()))
        }
        other => {
            Err(Error::space("action", name, format!("{other:?}: needs a 1-D box with finite bounds, low < high")))
        }
    }
}

/// A tanh actor's actions for a batch of `obs` (`obs_dim` values a row) in the bounds `(low, high)`: uniformly
/// random in `[−1, 1]` with `warm_up`, else `network(rows, rng, actions)`'s; plus `noise`, clipped to `[−1, 1]`;
/// then scaled to the bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn act_tanh(
    obs: &[f32],
    obs_dim: usize,
    (low, high): (&[f32], &[f32]),
    warm_up: bool,
    noise: Option<&mut ActionNoise>,
    rng: &mut Pcg64,
    out: &mut ActOutput,
    network: impl FnOnce(usize, &mut Pcg64, &mut [f32]) -> Result<()>,
) -> Result<()> {
    if obs.is_empty() || !obs.len().is_multiple_of(obs_dim) {
        return Err(Error::length("observation batch", obs.len(), obs_dim));
    }
    let rows = obs.len() / obs_dim;
    out.log_probs.clear();
    out.values.clear();
    out.q_values.clear();
    out.actions.resize(rows * low.len(), 0.0);
    if warm_up {
        for a in &mut out.actions {
            *a = rng.random_range(-1.0..1.0);
        }
    } else {
        network(rows, rng, &mut out.actions)?;
    }
    if let Some(noise) = noise {
        noise.add_to(&mut out.actions, rng)?;
        for a in &mut out.actions {
            *a = a.clamp(-1.0, 1.0);
        }
    }
    for row in out.actions.chunks_exact_mut(low.len()) {
        for ((a, l), h) in row.iter_mut().zip(low).zip(high) {
            *a = unscale_action(*a, *l, *h);
        }
    }
    Ok(())
}

/// `parts` concatenated along `dim`, or the one part itself.
pub(crate) fn cat_or_one(mut parts: Vec<Tensor>, dim: i64) -> Tensor {
    if parts.len() == 1 { parts.pop().expect("one part") } else { Tensor::cat(&parts, dim) }
}

pub(crate) fn activate(activation: Activation, x: Tensor) -> Tensor {
    match activation {
        Activation::Relu => x.relu(),
        Activation::Tanh => x.tanh(),
    }
}

/// `n` Q-networks `Q_j(s, a)` of one layout, all in one [`FlatParams`] (online or target): critic `j` is a
/// [`FlatMlp`] named `{prefix}.{j}.{k}.weight` / `.bias`. Run one after the other: libtorch's batched matmul
/// (and especially its transposed form in the backward pass) is slower on the CPU than separate `addmm`s.
#[derive(Debug, Clone)]
pub(crate) struct Critics {
    pub(crate) nets: Vec<FlatMlp>,
    pub(crate) layers: usize,
    pub(crate) activation: Activation,
    /// Q heads per critic (1 without task heads); a row reads its task's, by the one-hot that ends the
    /// observation part of its input.
    pub(crate) heads: usize,
    /// Observation width: the one-hot ends at this column of `[obs | action]`.
    obs_dim: i64,
    /// The hidden layers' matmuls in bf16 ([`crate::nn::mixed::dense`]): critics run only in updates, so the
    /// setting is theirs; the update reads it for its actor too.
    pub(crate) bf16: bool,
}

impl Critics {
    /// Initial parameters: `n` critics, each drawn as its own PyTorch-default MLP of `hidden` widths with one
    /// output per head, on `[obs | action]` (`obs_dim + act_dim` inputs); hidden matmuls in bf16 where `bf16`.
    pub(crate) fn init(
        prefix: &str,
        (obs_dim, act_dim): (i64, i64),
        (n, hidden, activation): (usize, &[i64], Activation),
        heads: usize,
        bf16: bool,
    ) -> (Self, Vec<(String, Tensor)>) {
        let (inputs, outputs) = (obs_dim + act_dim, heads as i64);
        let (mut nets, mut named) = (Vec::with_capacity(n), Vec::new());
        for j in 0..n {
            let (name, start) = (format!("{prefix}.{j}"), named.len());
            let (net, params) = FlatMlp::init(&name, inputs, hidden, outputs, activation, LayerInit::Torch, start);
            nets.push(net);
            named.extend(params);
        }
        (Critics { nets, layers: hidden.len() + 1, activation, heads, obs_dim, bf16 }, named)
    }

    /// Each row's own task's Q head of one critic's output `[B, heads]` → `[B, 1]`.
    fn own_head(&self, x: &Tensor, q: Tensor) -> Tensor {
        if self.heads > 1 { crate::nn::nets::select_task_heads_ending_at(x, self.obs_dim, self.heads, &q) } else { q }
    }

    /// Every critic on the same input `[B, inputs]`: `[B, n]`.
    pub(crate) fn forward(&self, params: &FlatParams, x: &Tensor) -> Tensor {
        cat_or_one(self.nets.iter().map(|net| self.own_head(x, net.forward_in(params, x, self.bf16))).collect(), 1)
    }

    /// The first `critics` critics' weights and biases as detached aliases of `params`' buffer: they follow
    /// every in-place update of the buffer, and a loss through them puts no gradient into it.
    /// Hidden layers read the bf16 copy where the critics run in bf16 and `params` has one.
    pub(crate) fn detached(&self, params: &FlatParams, critics: usize) -> Vec<Tensor> {
        let hidden = |i: usize| (i / 2) % self.layers + 1 < self.layers;
        (0..2 * self.layers * critics).map(|i| params.view_in(i, self.bf16 && hidden(i)).detach()).collect()
    }

    /// The critics whose weights [`Critics::detached`] gave, on `[B, inputs]`: `[B, critics]`.
    pub(crate) fn forward_detached(&self, weights: &[Tensor], x: &Tensor) -> Tensor {
        let bf16 = self.bf16;
        let one = |weights: &[Tensor]| {
            let mut h = x.shallow_clone();
            for k in 0..self.layers {
                h = crate::nn::mixed::dense(&h, &weights[2 * k], &weights[2 * k + 1], bf16 && k + 1 < self.layers);
                if k + 1 < self.layers {
                    h = activate(self.activation, h);
                }
            }
            self.own_head(x, h)
        };
        cat_or_one(weights.chunks(2 * self.layers).map(one).collect(), 1)
    }
}

/// Counters that schedules and triggers depend on (saved in checkpoints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Counters {
    /// Env steps observed (all envs).
    pub(crate) env_steps: u64,
    /// Vectorised steps observed (SB3 counts `train_freq` in these).
    pub(crate) calls: u64,
    /// Critic updates (SB3's `_n_updates`, which times delayed actor and target updates).
    pub(crate) critic_updates: u64,
    /// Actor (and target) updates.
    pub(crate) actor_updates: u64,
    /// The latest actor loss, reported while a delay skips actor updates.
    pub(crate) last_actor_loss: Option<f64>,
    /// Training phases fallen due (every `train_freq` vectorised steps) since the last update.
    #[serde(default)]
    pub(crate) phases: u64,
}

/// A minibatch of transitions as separate arrays (`B` rows): observations, `[−1, 1]` actions, rewards, the
/// bootstrap factor (γ, 0 where the episode terminated) and the next observations.
pub(crate) struct Transitions<'a> {
    pub(crate) obs: &'a [f32],
    pub(crate) actions: &'a [f32],
    pub(crate) rewards: &'a [f32],
    pub(crate) bootstrap: &'a [f32],
    pub(crate) next_obs: &'a [f32],
}

impl Transitions<'_> {
    /// The rows `[obs | action | next_obs | reward | bootstrap | extra]` into `out` (cleared first), `extra`
    /// appending each row's own floats (noise drawn per row); the row width.
    pub(crate) fn lay_out(
        &self,
        (od, ad): (usize, usize),
        out: &mut Vec<f32>,
        mut extra: impl FnMut(&mut Vec<f32>),
    ) -> usize {
        out.clear();
        for row in 0..self.rewards.len() {
            out.extend_from_slice(&self.obs[row * od..(row + 1) * od]);
            out.extend_from_slice(&self.actions[row * ad..(row + 1) * ad]);
            out.extend_from_slice(&self.next_obs[row * od..(row + 1) * od]);
            out.push(self.rewards[row]);
            out.push(self.bootstrap[row]);
            extra(out);
        }
        out.len() / self.rewards.len().max(1)
    }

    /// Every array's length against `B` rows of `od` / `ad`; errors name `what`.
    pub(crate) fn check(&self, what: &str, (od, ad): (usize, usize)) -> Result<()> {
        let b = self.rewards.len();
        for (field, got, expected) in [
            ("obs", self.obs.len(), b * od),
            ("next_obs", self.next_obs.len(), b * od),
            ("actions", self.actions.len(), b * ad),
            ("bootstrap", self.bootstrap.len(), b),
        ] {
            check_len(&format!("{what} {field}"), got, expected)?;
        }
        Ok(())
    }
}

/// The replay of a continuous-control agent and the counters its schedule reads: chunks go in with their
/// actions scaled to `[−1, 1]` and each step's true next observation; minibatches come out as rows.
#[derive(Debug)]
pub(crate) struct ActionReplay {
    pub(crate) replay: ReplayBuffer<f32>,
    pub(crate) counters: Counters,
    sample: ReplaySample<f32>,
    bootstrap: Vec<f32>,
    /// The action bounds of the env's `Box`.
    pub(crate) low: Vec<f32>,
    pub(crate) high: Vec<f32>,
    /// One `[−1, 1]` action being stored.
    scaled: Vec<f32>,
    /// A step's next observations where episodes ended in it ([`Chunk::next_obs_rows`]).
    next: ObsBuf,
    obs_dim: usize,
    n_envs: usize,
    gamma: f32,
    train_freq: u64,
}

impl ActionReplay {
    /// Room for `capacity` transitions of `obs_dim` observations and actions in `low..high`, from `n_envs`
    /// envs; every `train_freq` vectorised steps a training phase falls due.
    pub(crate) fn new(
        capacity: usize,
        obs_dim: usize,
        (low, high): (&[f32], &[f32]),
        n_envs: usize,
        gamma: f64,
        train_freq: u64,
    ) -> Result<Self> {
        let act_dim = low.len();
        Ok(ActionReplay {
            replay: ReplayBuffer::new(capacity, obs_dim, act_dim)?,
            counters: Counters::default(),
            sample: ReplaySample::default(),
            bootstrap: Vec::new(),
            scaled: vec![0.0; act_dim],
            next: ObsBuf::empty(DType::F32),
            low: low.to_vec(),
            high: high.to_vec(),
            obs_dim,
            n_envs,
            gamma: gamma as f32,
            train_freq,
        })
    }

    /// Store the chunks' steps in order (errors name `name`); `episode_end(env)` for every env whose episode
    /// ended at a step.
    pub(crate) fn observe(
        &mut self,
        name: &'static str,
        chunks: &[Chunk],
        mut episode_end: impl FnMut(usize),
    ) -> Result<()> {
        let (n, od, ad) = (self.n_envs, self.obs_dim, self.low.len());
        for chunk in chunks {
            chunk.check_lengths(n, od, ad, false)?;
            let mut cursor = 0;
            for t in 0..chunk.n_steps {
                let obs = f32_obs(name, chunk.obs.slice(t * n * od..(t + 1) * n * od))?;
                let next_obs = f32_obs(name, chunk.next_obs_rows(t, od, &mut self.next, &mut cursor))?;
                for i in 0..n {
                    let j = t * n + i;
                    let action = &chunk.actions[j * ad..(j + 1) * ad];
                    for (((s, a), l), h) in self.scaled.iter_mut().zip(action).zip(&self.low).zip(&self.high) {
                        *s = scale_action(*a, *l, *h).clamp(-1.0, 1.0);
                    }
                    self.replay.push(&Experience {
                        obs: &obs[i * od..(i + 1) * od],
                        action: &self.scaled,
                        reward: chunk.rewards[j],
                        next_obs: &next_obs[i * od..(i + 1) * od],
                        terminated: chunk.terminated[j],
                        discount: self.gamma,
                    })?;
                    if chunk.terminated[j] || chunk.truncated[j] {
                        episode_end(i);
                    }
                }
                let c = &mut self.counters;
                c.env_steps += n as u64;
                c.calls += 1;
                c.phases += u64::from(c.calls.is_multiple_of(self.train_freq));
            }
        }
        Ok(())
    }

    /// The gradient steps due now (an update's trigger): `gradient_steps` for each training phase fallen due
    /// since the last update, none before `learning_starts` (those phases are dropped).
    pub(crate) fn phase_due(&mut self, learning_starts: u64, gradient_steps: usize, progress: &Progress) -> usize {
        let phases = std::mem::take(&mut self.counters.phases) as usize;
        // The run's env steps (every data-parallel learner's, not only those in this replica's replay).
        if progress.env_steps > learning_starts && !self.replay.is_empty() { phases * gradient_steps } else { 0 }
    }

    /// Draw `batch` transitions with `rng` and lay them out in `out` ([`Transitions::lay_out`]); the width.
    pub(crate) fn sample_rows<R: rand::Rng>(
        &mut self,
        batch: usize,
        rng: &mut R,
        out: &mut Vec<f32>,
        mut extra: impl FnMut(&mut R, &mut Vec<f32>),
    ) -> Result<usize> {
        self.replay.sample(batch, rng, &mut self.sample)?;
        let s = &self.sample;
        self.bootstrap.clear();
        self.bootstrap.extend(s.discounts.iter().zip(&s.terminated).map(|(g, t)| if *t { 0.0 } else { *g }));
        let rows = Transitions {
            obs: &s.obs,
            actions: &s.actions,
            rewards: &s.rewards,
            bootstrap: &self.bootstrap,
            next_obs: &s.next_obs,
        };
        Ok(rows.lay_out((self.obs_dim, self.low.len()), out, |out| extra(rng, out)))
    }

    /// The replay and counters into a checkpoint.
    pub(crate) fn write_to(&self, c: &mut Checkpoint) -> Result<()> {
        self.replay.write_to(c, "replay")?;
        c.put_meta("counters", &self.counters)
    }

    /// The checkpoint's counters (read before anything changes).
    pub(crate) fn counters_in(c: &Checkpoint) -> Result<Counters> {
        c.meta("counters")
    }

    /// The replay from a checkpoint, and `counters` ([`ActionReplay::counters_in`] of it).
    pub(crate) fn read_from(&mut self, c: &mut Checkpoint, counters: Counters) -> Result<()> {
        self.replay.read_from(c, "replay")?;
        self.counters = counters;
        Ok(())
    }
}

/// One Adam step on `params` from its gradient: one host loop where `fused` and the buffers allow, else
/// libtorch's ops.
pub(crate) fn adam_step(opt: &mut Adam, params: &mut FlatParams, fused: bool) {
    if fused
        && let Some((theta, grad)) = params.host_values_and_grad_mut()
        && opt.step_host(theta, grad)
    {
        return;
    }
    opt.step(params);
}

/// The Polyak update of `target` towards `online`: one host loop where `fused` and the buffers allow, else
/// libtorch's `lerp_`.
pub(crate) fn polyak(target: &mut FlatParams, online: &FlatParams, tau: f64, fused: bool) {
    if !(fused && target.polyak_from_host(online, tau)) {
        target.polyak_from(online, tau);
    }
}

/// The sum of `[N]` tensors (the one itself when there is one).
pub(crate) fn sum_of(mut parts: Vec<Tensor>) -> Tensor {
    if parts.len() == 1 {
        parts.pop().expect("one")
    } else {
        Tensor::stack(&parts, 0).sum_dim_intlist(0, false, Kind::Float)
    }
}

/// The mean of scalar tensors as a number (the one itself when there is one).
pub(crate) fn mean_of(ts: &[Tensor]) -> Result<f64> {
    Ok(match ts {
        [one] => f64::try_from(one)?,
        _ => f64::try_from(Tensor::stack(ts, 0).mean(Kind::Float))?,
    })
}

#[cfg(test)]
pub(crate) mod bandit;
