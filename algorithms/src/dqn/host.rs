//! DQN's gradient step on the fused CPU path ([`crate::nn::host_train`]): the same TD target, Huber loss (or
//! QR-DQN's quantile Huber loss), gradient clipping and Adam step as [`crate::dqn::Dqn`]'s libtorch step, for MLP
//! Q-networks on the CPU (no dueling head, no task heads). Agreement with the libtorch step is tested in `dqn`
//! (`fused_cpu_steps_match_libtorch`).
use crate::data::replay::ReplaySample;
use crate::nn::activation::Activation;
use crate::nn::host_train::{TwinLayer, TwinTape, clip_and_step, twin_backward, twin_forward};
use crate::nn::optimiser::Adam;
use crate::nn::params::FlatParams;
use crate::{Error, Result};

/// The fused DQN step's layout and reusable buffers.
#[derive(Debug, Clone, Default)]
pub(crate) struct DqnHost {
    layers: Vec<TwinLayer>,
    activation: Activation,
    n_actions: usize,
    /// Return quantiles per action (1: DQN's expected values).
    quantiles: usize,
    /// The online network's forward pass on the sample's observations (kept for the backward pass); with
    /// double Q, on the observations and then the next observations, stacked.
    tape: TwinTape,
    /// The target network's forward pass (no gradient).
    infer: TwinTape,
    /// With double Q: the observations and the next observations, stacked.
    stacked: Vec<f32>,
    grad: Vec<f32>,
    targets: Vec<f32>,
    /// The last step's TD errors `Q − target` per sample (prioritized replay's new priorities).
    td: Vec<f32>,
}

impl DqnHost {
    /// The fused path for an MLP of these layers (weight indices into `online`, each followed by its bias),
    /// when `online` is a CPU f32 buffer with nothing frozen; `None` otherwise. With `bf16`, the hidden
    /// layers' products (forward passes and gradients) in bf16 ([`TwinTape::set_bf16`]).
    pub(crate) fn new(
        online: &FlatParams,
        layer_indices: &[usize],
        activation: Activation,
        n_actions: usize,
        quantiles: usize,
        bf16: bool,
    ) -> Option<Self> {
        online.host_values()?;
        if online.has_frozen() {
            return None;
        }
        let layers: Vec<TwinLayer> = layer_indices.iter().map(|&i| TwinLayer::of(online, i)).collect();
        if layers.last()?.fan_out != n_actions * quantiles {
            return None;
        }
        let (mut tape, mut infer) = (TwinTape::default(), TwinTape::default());
        tape.set_bf16(bf16);
        infer.set_bf16(bf16);
        Some(DqnHost { layers, activation, n_actions, quantiles, tape, infer, ..Default::default() })
    }

    /// One gradient step on the replay sample `s`: the TD target from the target network (its argmax taken by
    /// the online network with `double_q`), the Huber loss (weighted by `s.weights`, all 1 for uniform
    /// sampling), backward, gradient clipping to `max_grad_norm`, Adam. A non-finite gradient norm is an
    /// error and no step is taken. Returns the loss and the mean Q of the taken actions; the TD errors are
    /// [`DqnHost::td`] afterwards.
    pub(crate) fn step(
        &mut self,
        online: &mut FlatParams,
        target: &FlatParams,
        opt: &mut Adam,
        s: &ReplaySample<f32>,
        double_q: bool,
        max_grad_norm: f64,
    ) -> Result<(f32, f32)> {
        let rows = s.rewards.len();
        let a = self.n_actions;
        let target_theta =
            target.host_values().ok_or_else(|| Error::Unsupported("fused DQN step off the CPU".into()))?;
        twin_forward(&self.layers, self.activation, target_theta, &s.next_obs, rows, 1, &mut self.infer);
        let theta = online.host_values_mut().ok_or_else(|| Error::Unsupported("fused DQN step off the CPU".into()))?;
        // The online network's Q of the observations (for the loss) and, with double Q, of the next
        // observations (for the argmax): one forward pass of both, stacked. Each row's arithmetic is the same
        // as in a pass of its own (the products sum every element over k alike, whatever the number of rows;
        // the pinned test in `dqn` checks it).
        let (x, x_rows): (&[f32], usize) = if double_q {
            self.stacked.clear();
            self.stacked.extend_from_slice(&s.obs);
            self.stacked.extend_from_slice(&s.next_obs);
            (&self.stacked, 2 * rows)
        } else {
            (&s.obs, rows)
        };
        twin_forward(&self.layers, self.activation, theta, x, x_rows, 1, &mut self.tape);
        let mut d_out = std::mem::take(&mut self.tape.d_out[0]);
        let z = self.quantiles;
        let (q, next_online) = self.tape.out(0).split_at(rows * a * z);
        // TD targets (no gradient): with quantiles, the greedy action's z target quantiles per sample.
        self.targets.clear();
        for (i, row) in self.infer.out(0).chunks_exact(a * z).enumerate() {
            let best = if double_q { greedy(&next_online[i * a * z..][..a * z], z) } else { greedy(row, z) };
            let bootstrap = if s.terminated[i] { 0.0 } else { s.discounts[i] };
            self.targets.extend(row[best * z..][..z].iter().map(|v| s.rewards[i] + bootstrap * v));
        }
        // Q of the taken actions, the loss and its gradient.
        let inv = 1.0 / rows as f32;
        d_out.clear();
        d_out.resize(rows * a * z, 0.0);
        self.td.clear();
        let (mut loss, mut q_sum) = (0f64, 0f64);
        for (i, q_row) in q.chunks_exact(a * z).enumerate() {
            let action = s.actions[i] as usize;
            let w = s.weights[i];
            if z == 1 {
                let x = q_row[action] - self.targets[i];
                // smooth_l1 with β = 1, as libtorch: ½x² inside |x| < 1, |x| − ½ outside; gradient x or sign(x).
                let (huber, slope) = huber(x);
                loss += (huber * w) as f64;
                d_out[i * a + action] = slope * w * inv;
                q_sum += q_row[action] as f64;
                self.td.push(x);
            } else {
                // The quantile Huber loss: δ_kj = t_j − z_k, weights |τ̂_k − 1{δ_kj < 0}|, summed over k, averaged
                // over j; its gradient with respect to z_k is −Σ_j weight · huber′(δ_kj) / z.
                let (current, targets) = (&q_row[action * z..][..z], &self.targets[i * z..][..z]);
                let grad = &mut d_out[(i * a + action) * z..][..z];
                let mut sample = 0f32;
                for (k, (c, g)) in current.iter().zip(grad.iter_mut()).enumerate() {
                    let tau = (k as f32 + 0.5) / z as f32;
                    let mut slope_sum = 0f32;
                    for t in targets {
                        let delta = t - c;
                        let weight = (tau - if delta < 0.0 { 1.0 } else { 0.0 }).abs();
                        let (h, slope) = huber(delta);
                        sample += weight * h;
                        slope_sum += weight * slope;
                    }
                    *g = -slope_sum / z as f32 * w * inv;
                }
                loss += (sample / z as f32 * w) as f64;
                let mean = |v: &[f32]| v.iter().sum::<f32>() / z as f32;
                q_sum += mean(current) as f64;
                self.td.push(mean(current) - mean(targets));
            }
        }
        self.tape.d_out[0] = d_out;
        self.tape.keep_rows(rows);
        let out = ((loss / rows as f64) as f32, (q_sum / rows as f64) as f32);
        self.grad.resize(theta.len(), 0.0);
        twin_backward(&self.layers, self.activation, theta, &s.obs, 1, &mut self.tape, &mut self.grad, None);
        clip_and_step(theta, &mut self.grad, opt, max_grad_norm, "dqn")?;
        Ok(out)
    }

    /// The last step's TD errors `Q − target`, one per sample.
    pub(crate) fn td(&self) -> &[f32] {
        &self.td
    }
}

/// `smooth_l1` with β = 1 at `x` (libtorch's): ½x² inside |x| < 1, |x| − ½ outside; and its slope.
fn huber(x: f32) -> (f32, f32) {
    if x.abs() < 1.0 { (0.5 * x * x, x) } else { (x.abs() - 0.5, x.signum()) }
}

/// The greedy action of a row of Q-values, or (`z` > 1) of per-action groups of `z` quantiles by their means
/// (the first maximum, as libtorch's `argmax`), without allocating: it runs per sample in every gradient step.
fn greedy(row: &[f32], z: usize) -> usize {
    let mean = |g: &[f32]| g.iter().sum::<f32>() / z as f32;
    let (mut best, mut best_q) = (0, f32::NEG_INFINITY);
    for (i, g) in row.chunks_exact(z).enumerate() {
        let q = mean(g);
        if i == 0 || q > best_q {
            (best, best_q) = (i, q);
        }
    }
    best
}
