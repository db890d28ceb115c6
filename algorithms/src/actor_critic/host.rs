//! PPO's and A2C's update on the fused CPU path ([`crate::nn::host_train`]): the same loss, gradient,
//! clipping and optimiser step as their libtorch update ([`crate::actor_critic::members::train`]), for MLP
//! actor-critics on the CPU.
//!
//! The loss's gradient is written out by hand, following libtorch's autograd rules where they choose between
//! equal branches (`minimum`/`maximum` split the gradient half and half on ties; `clamp` passes it on its
//! bounds), so the two paths agree to float rounding (`ppo::tests::fused_cpu_update_matches_libtorch`,
//! `a2c::tests::fused_cpu_update_matches_libtorch`).
use flotilla_core::ObsRef;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64;

use crate::actor_critic::{ActorCritic, LossCoefficients, Settings, StepLoss};
use crate::data::rollout::{Rollout, sequence_rows};
use crate::nn::activation::Activation;
use crate::nn::data_parallel::DataParallel;
use crate::nn::distributions::LOG_SQRT_2PI;
use crate::nn::host_lstm::{HostLstm, LstmTape};
use crate::nn::host_train::{TwinLayer, TwinTape, clip_and_step, twin_backward, twin_forward};
use crate::nn::optimiser::Optimiser;
use crate::{Error, Result};

const LOG_SQRT_2PI_F32: f32 = LOG_SQRT_2PI as f32;

/// The policy head's distribution on the host.
#[derive(Debug, Clone, Copy)]
enum HostDist {
    /// Softmax over `n` logits; actions are indices stored as f32.
    Categorical(usize),
    /// Diagonal Gaussian over `d` means, with the state-independent log-std at `log_std` in the buffer.
    Gaussian { d: usize, log_std: usize },
}

/// One minibatch's columns, row-major (host slices, or the buffers a gather fills): observations
/// `B × obs_dim`, actions `B × act_dim`, and per sample the behaviour log-prob, the (already normalised, where
/// asked) advantage, the old value and the value target. For a recurrent policy the rows are `M` whole env
/// sequences, time-major (`t · M + m`), with each row's episode-start flag in `starts` and each sequence's
/// initial state in `state0` (`M × S`); both are empty for a feed-forward policy.
#[derive(Default)]
pub(crate) struct Minibatch<T> {
    pub obs: T,
    pub starts: T,
    pub state0: T,
    pub actions: T,
    pub old_log_prob: T,
    pub advantages: T,
    pub old_values: T,
    pub returns: T,
}

impl Minibatch<Vec<f32>> {
    fn clear(&mut self) {
        let Minibatch { obs, starts, state0, actions, old_log_prob, advantages, old_values, returns } = self;
        for v in [obs, starts, state0, actions, old_log_prob, advantages, old_values, returns] {
            v.clear();
        }
    }

    fn slices(&self) -> Minibatch<&[f32]> {
        Minibatch {
            obs: &self.obs,
            starts: &self.starts,
            state0: &self.state0,
            actions: &self.actions,
            old_log_prob: &self.old_log_prob,
            advantages: &self.advantages,
            old_values: &self.old_values,
            returns: &self.returns,
        }
    }
}

/// The fused CPU step's layout and reusable buffers, for one actor-critic network.
#[derive(Debug, Clone)]
pub(crate) struct ActorCriticHost {
    layers: Vec<TwinLayer>,
    activation: Activation,
    /// Output layer width (the wider of the two nets' outputs).
    padded: usize,
    dist: HostDist,
    tape: TwinTape,
    grad: Vec<f32>,
    /// Per sample: log π(a|s), entropy, ∂loss/∂ln π, ∂loss/∂V.
    log_prob: Vec<f32>,
    entropy: Vec<f32>,
    d_log_prob: Vec<f32>,
    d_value: Vec<f32>,
    /// Categorical log-softmax, `B × n`.
    log_softmax: Vec<f32>,
    /// A recurrent policy's LSTM before the twin MLP, its tape, and `∂loss/∂(its outputs)`.
    core: Option<(HostLstm, LstmTape)>,
    d_features: Vec<f32>,
}

impl ActorCriticHost {
    /// The fused step's state for an update that can take it — `enabled` (the config's `fused_cpu`), one
    /// data-parallel replica without gradient accumulation, nothing frozen (now: layers can be frozen after the
    /// agent is built), and an MLP actor-critic (one head) whose parameters are a CPU f32 buffer — reusing
    /// `cached`'s buffers. `None`: the update runs on libtorch.
    pub(crate) fn for_update(
        cached: &mut Option<Self>,
        enabled: bool,
        parallel: &DataParallel,
        net: &ActorCritic,
    ) -> Option<Self> {
        let single = parallel.replicas() == 1 && parallel.accumulate() == 1;
        if !enabled || !single || net.params.has_frozen() {
            return None;
        }
        if let Some(host) = cached.take() {
            return Some(host);
        }
        let params = &net.params;
        params.host_values()?;
        let (core, (indices, activation, outputs, log_std)) = match net.recurrent_twin_layout() {
            Some((core, layout)) => (Some((HostLstm::of(core, params)?, LstmTape::default())), layout),
            None => (None, net.twin_layout()?),
        };
        let layers: Vec<TwinLayer> = indices.iter().map(|&i| TwinLayer::of(params, i)).collect();
        let padded = layers.last()?.fan_out;
        let dist = match log_std {
            None => HostDist::Categorical(outputs[0] as usize),
            Some(i) => HostDist::Gaussian { d: outputs[0] as usize, log_std: params.offset(i) },
        };
        if outputs[1] != 1 {
            return None;
        }
        Some(ActorCriticHost {
            layers,
            activation,
            padded,
            dist,
            tape: TwinTape::default(),
            grad: Vec::new(),
            log_prob: Vec::new(),
            entropy: Vec::new(),
            d_log_prob: Vec::new(),
            d_value: Vec::new(),
            log_softmax: Vec::new(),
            core,
            d_features: Vec::new(),
        })
    }

    /// The fused update on a rollout with its targets `(advantages, returns, values)`: `s.n_epochs` passes over
    /// minibatches of `s.batch_size` samples (for a recurrent policy, whole env sequences), in an order `rng`
    /// shuffles each epoch (`None`: in order, no draw), advantages normalised where asked (per minibatch, or
    /// once for a full batch); each a forward, loss, backward, clipping and optimiser step, until the
    /// approximate KL passes `1.5 · s.target_kl`. A non-finite gradient norm is an error and no step is taken.
    /// Returns the last step's loss terms (before it) and the steps taken.
    pub(crate) fn train(
        &mut self,
        net: &mut ActorCritic,
        opt: &mut Optimiser,
        rollout: &Rollout,
        (advantages, returns, values): (&[f32], &[f32], &[f32]),
        s: &Settings,
        mut rng: Option<&mut Pcg64>,
    ) -> Result<(StepLoss, usize)> {
        let n = rollout.len();
        let ObsRef::F32(obs) = rollout.obs.as_ref() else {
            return Err(Error::Unsupported("the fused CPU step takes f32 observations".into()));
        };
        let (act_dim, obs_dim, batch_size) = (rollout.act_dim, rollout.obs_dim, s.batch_size);
        let mut adv = advantages.to_vec();
        let normalize_minibatch = s.normalize_advantage && batch_size != n;
        if s.normalize_advantage && batch_size == n {
            normalize_host(&mut adv);
        }
        // What a minibatch draws: transitions, or for a recurrent policy whole env sequences (as the libtorch
        // update: the same shuffles of the same units).
        let state_dim = net.state_dim();
        if rollout.initial_state.len() != rollout.n_envs * state_dim {
            let what = "rollout initial recurrent state (chunks carry it as initial_state)";
            let (got, expected) = (rollout.initial_state.len(), rollout.n_envs * state_dim);
            return Err(Error::length(what, got, expected));
        }
        let recurrent = state_dim > 0;
        let (units, unit_rows) = if recurrent { (rollout.n_envs, n / rollout.n_envs) } else { (n, 1) };
        let starts = if recurrent { rollout.episode_starts() } else { Vec::new() };
        let mut order: Vec<usize> = (0..units).collect();
        let mut rows = Vec::with_capacity(batch_size);
        let mut gathered = Minibatch::<Vec<f32>>::default();
        let mut last = None;
        let mut gradient_steps = 0usize;
        'epochs: for _ in 0..s.n_epochs {
            if let Some(rng) = rng.as_deref_mut() {
                order.shuffle(rng);
            }
            for minibatch in order.chunks(batch_size / unit_rows) {
                let mb: Minibatch<&[f32]> = if batch_size == n {
                    // Every sample: no gather (the loss is a mean, so order does not matter; sequences stay whole).
                    Minibatch {
                        obs,
                        starts: &starts,
                        state0: &rollout.initial_state,
                        actions: &rollout.actions,
                        old_log_prob: &rollout.log_probs,
                        advantages: &adv,
                        old_values: values,
                        returns,
                    }
                } else {
                    let g = &mut gathered;
                    g.clear();
                    rows.clear();
                    if !recurrent {
                        rows.extend_from_slice(minibatch);
                    } else {
                        // Time-major rows t · E + e of the drawn envs, and their initial states.
                        let e = rollout.n_envs;
                        rows.extend(sequence_rows(unit_rows, e, minibatch.iter().copied()));
                        g.starts.extend(rows.iter().map(|&i| starts[i]));
                        for &env in minibatch {
                            g.state0.extend_from_slice(&rollout.initial_state[env * state_dim..(env + 1) * state_dim]);
                        }
                    }
                    for &i in &rows {
                        g.obs.extend_from_slice(&obs[i * obs_dim..(i + 1) * obs_dim]);
                        g.actions.extend_from_slice(&rollout.actions[i * act_dim..(i + 1) * act_dim]);
                        g.old_log_prob.push(rollout.log_probs[i]);
                        g.advantages.push(adv[i]);
                        g.old_values.push(values[i]);
                        g.returns.push(returns[i]);
                    }
                    if normalize_minibatch && rows.len() > 1 {
                        normalize_host(&mut g.advantages);
                    }
                    g.slices()
                };
                let theta = net
                    .params
                    .host_values_mut()
                    .ok_or_else(|| Error::Unsupported("fused CPU step off the CPU".into()))?;
                let loss = self.gradient(theta, &mb, &s.coefficients);
                clip_and_step(theta, &mut self.grad, opt, s.max_grad_norm, s.algorithm)?;
                gradient_steps += 1;
                last = Some(loss);
                if s.target_kl.is_some_and(|t| loss.approx_kl > 1.5 * t) {
                    break 'epochs;
                }
            }
        }
        Ok((last.expect("at least one minibatch"), gradient_steps))
    }

    /// The loss terms at `theta` on `mb` and their gradient, left in `self.grad` (the flat buffer's layout,
    /// every slot written): forward, loss, backward; no step.
    fn gradient(&mut self, theta: &[f32], mb: &Minibatch<&[f32]>, c: &LossCoefficients) -> StepLoss {
        let rows = mb.advantages.len();
        // Every slot is written below: the twin layers (and a core) by the backward pass, a log-std by the loss.
        self.grad.resize(theta.len(), 0.0);
        let Some((core, mut core_tape)) = self.core.take() else {
            twin_forward(&self.layers, self.activation, theta, mb.obs, rows, 2, &mut self.tape);
            let loss = self.loss_and_output_gradients(theta, mb, c);
            twin_backward(&self.layers, self.activation, theta, mb.obs, 2, &mut self.tape, &mut self.grad, None);
            return loss;
        };
        // Recurrent: the LSTM over the sequences, the twin MLP on its outputs, and back through both.
        core.forward(theta, mb.obs, mb.starts, mb.state0, &mut core_tape);
        let features = &core_tape.out;
        twin_forward(&self.layers, self.activation, theta, features, rows, 2, &mut self.tape);
        let loss = self.loss_and_output_gradients(theta, mb, c);
        let (layers, activation) = (&self.layers, self.activation);
        let d_features = Some(&mut self.d_features);
        twin_backward(layers, activation, theta, features, 2, &mut self.tape, &mut self.grad, d_features);
        core.backward(theta, mb.obs, &self.d_features, &mut core_tape, &mut self.grad);
        self.core = Some((core, core_tape));
        loss
    }

    /// The distribution's log-probs and entropies, the loss terms, and `∂loss/∂ln π`, `∂loss/∂V` per sample;
    /// `∂loss/∂V` goes into the value net's output gradient.
    fn loss_and_output_gradients(&mut self, theta: &[f32], mb: &Minibatch<&[f32]>, c: &LossCoefficients) -> StepLoss {
        let rows = mb.advantages.len();
        let inv = 1.0 / rows as f32;
        self.dist_forward(theta, mb.actions, rows);
        let (vf, ent) = (c.vf_coef as f32, c.ent_coef as f32);
        let clip_range = c.clip_range.unwrap_or(0.0);
        let (lo, hi) = ((1.0 - clip_range) as f32, (1.0 + clip_range) as f32);
        self.d_log_prob.clear();
        self.d_value.clear();
        let (mut policy, mut value, mut entropy, mut kl, mut clipped) = (0f64, 0f64, 0f64, 0f64, 0usize);
        for i in 0..rows {
            let a = mb.advantages[i];
            let (v, r) = (self.tape.out(1)[i * self.padded], mb.returns[i]);
            entropy += self.entropy[i] as f64;
            if c.clip_range.is_none() {
                // A2C: −Â ln π and (R − V)².
                policy -= (a * self.log_prob[i]) as f64;
                self.d_log_prob.push(-inv * a);
                value += ((r - v) * (r - v)) as f64;
                self.d_value.push(vf * inv * -2.0 * (r - v));
                continue;
            }
            let log_ratio = self.log_prob[i] - mb.old_log_prob[i];
            let ratio = log_ratio.exp();
            let (s, cl) = (a * ratio, a * ratio.clamp(lo, hi));
            policy -= s.min(cl) as f64;
            // ∂min/∂s and ∂min/∂cl as libtorch's `minimum` backward: all to the smaller, half each on a tie.
            let (ws, wc) = if s < cl {
                (1.0, 0.0)
            } else if s > cl {
                (0.0, 1.0)
            } else {
                (0.5, 0.5)
            };
            let in_range = if (lo..=hi).contains(&ratio) { 1.0 } else { 0.0 };
            let d_ratio = -inv * (ws * a + wc * a * in_range);
            self.d_log_prob.push(d_ratio * ratio);
            let d_v = match c.clip_range_vf {
                None => {
                    value += ((r - v) * (r - v)) as f64;
                    -2.0 * (r - v)
                }
                Some(eps) => {
                    let eps = eps as f32;
                    let old = mb.old_values[i];
                    let delta = v - old;
                    let cv = old + delta.clamp(-eps, eps);
                    let (u, k) = ((r - v) * (r - v), (r - cv) * (r - cv));
                    value += u.max(k) as f64;
                    let (wu, wk) = if u > k {
                        (1.0, 0.0)
                    } else if u < k {
                        (0.0, 1.0)
                    } else {
                        (0.5, 0.5)
                    };
                    let pass = if (-eps..=eps).contains(&delta) { 1.0 } else { 0.0 };
                    wu * -2.0 * (r - v) + wk * -2.0 * (r - cv) * pass
                }
            };
            self.d_value.push(vf * inv * d_v);
            kl += (ratio - 1.0 - log_ratio) as f64;
            if (ratio - 1.0).abs() > clip_range as f32 {
                clipped += 1;
            }
        }
        self.dist_backward(theta, mb.actions, rows, -ent * inv);
        let n = rows as f64;
        // The value net's output gradient (its padding columns get none).
        let d1 = &mut self.tape.d_out[1];
        d1.clear();
        d1.resize(rows * self.padded, 0.0);
        for (row, d) in d1.chunks_exact_mut(self.padded).zip(&self.d_value) {
            row[0] = *d;
        }
        StepLoss {
            policy: policy / n,
            value: value / n,
            entropy: entropy / n,
            approx_kl: kl / n,
            clip_fraction: clipped as f64 / n,
        }
    }

    /// Log-probs of the taken actions and entropies, per sample, from the policy net's output.
    fn dist_forward(&mut self, theta: &[f32], actions: &[f32], rows: usize) {
        let head = self.tape.out(0);
        self.log_prob.clear();
        self.entropy.clear();
        match self.dist {
            HostDist::Categorical(n) => {
                self.log_softmax.clear();
                for (r, row) in head.chunks_exact(self.padded).take(rows).enumerate() {
                    let logits = &row[..n];
                    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let sum: f32 = logits.iter().map(|&v| (v - max).exp()).sum();
                    let lse = max + sum.ln();
                    let start = self.log_softmax.len();
                    self.log_softmax.extend(logits.iter().map(|&v| v - lse));
                    let ls = &self.log_softmax[start..];
                    self.log_prob.push(ls[actions[r] as usize]);
                    self.entropy.push(-ls.iter().map(|&l| l.exp() * l).sum::<f32>());
                }
            }
            HostDist::Gaussian { d, log_std } => {
                let ls = &theta[log_std..log_std + d];
                let per_dim_entropy: f32 = ls.iter().map(|&l| l + (0.5 + LOG_SQRT_2PI_F32)).sum();
                for (row, a) in head.chunks_exact(self.padded).take(rows).zip(actions.chunks_exact(d)) {
                    let mut lp = 0.0f32;
                    for k in 0..d {
                        let z = (a[k] - row[k]) * (-ls[k]).exp();
                        lp += z * z * -0.5 - ls[k] - LOG_SQRT_2PI_F32;
                    }
                    self.log_prob.push(lp);
                    self.entropy.push(per_dim_entropy);
                }
            }
        }
    }

    /// The policy net's output gradient (into the tape) from `∂loss/∂ln π` and the entropy bonus
    /// (`−ent_coef/B` per sample's entropy); a Gaussian's log-std gradient into its slot of the flat gradient.
    fn dist_backward(&mut self, theta: &[f32], actions: &[f32], rows: usize, d_entropy: f32) {
        let mut d0 = std::mem::take(&mut self.tape.d_out[0]);
        d0.clear();
        d0.resize(rows * self.padded, 0.0);
        let head = self.tape.out(0);
        match self.dist {
            HostDist::Categorical(n) => {
                for r in 0..rows {
                    let ls = &self.log_softmax[r * n..(r + 1) * n];
                    let (g, h, a) = (self.d_log_prob[r], self.entropy[r], actions[r] as usize);
                    for (k, d) in d0[r * self.padded..r * self.padded + n].iter_mut().enumerate() {
                        let p = ls[k].exp();
                        let onehot = if k == a { 1.0 } else { 0.0 };
                        *d = g * (onehot - p) + d_entropy * (-p * (ls[k] + h));
                    }
                }
            }
            HostDist::Gaussian { d, log_std } => {
                let ls = &theta[log_std..log_std + d];
                let d_ls = &mut self.grad[log_std..log_std + d];
                d_ls.fill(0.0);
                for (r, (row, a)) in head.chunks_exact(self.padded).take(rows).zip(actions.chunks_exact(d)).enumerate()
                {
                    let g = self.d_log_prob[r];
                    for k in 0..d {
                        let inv_std = (-ls[k]).exp();
                        let z = (a[k] - row[k]) * inv_std;
                        d0[r * self.padded + k] = g * z * inv_std;
                        d_ls[k] += g * (z * z - 1.0) + d_entropy;
                    }
                }
            }
        }
        self.tape.d_out[0] = d0;
    }
}

/// `(x − mean) / (std + 1e-8)` in place, with the unbiased std, as [`DataParallel`]'s normalisation of one
/// replica's advantages.
pub(crate) fn normalize_host(x: &mut [f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let (mean, std) = (mean as f32, var.sqrt() as f32);
    x.iter_mut().for_each(|v| *v = (*v - mean) / (std + 1e-8));
}
