//! Action distributions: categorical (discrete actions) and diagonal Gaussian (continuous actions).
//!
//! Two halves: differentiable `log_prob` and `entropy` for the loss, and plain-Rust sampling for acting (far
//! cheaper than libtorch dispatches on small batches). Tests check the two agree.
use rand::Rng;
use tch::{Kind, Tensor};

/// A batch of action distributions, as produced by a policy head.
#[derive(Debug)]
pub enum ActionDist {
    /// Softmax over `logits` `[B, A]`.
    Categorical {
        /// Unnormalised log-probabilities.
        logits: Tensor,
    },
    /// Independent normals per action dimension.
    DiagGaussian {
        /// Means `[B, D]`.
        mean: Tensor,
        /// Log standard deviations, `[D]` (state-independent) or `[B, D]`.
        log_std: Tensor,
    },
}

pub(crate) const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_7; // ln(√(2π))

impl ActionDist {
    /// Log-probability of `actions` (`[B]` i64 indices or `[B, D]` floats), shape `[B]` (with leading axes,
    /// `[N, B]` from `[N, B]` or `[N, B, D]`: a population's members).
    pub fn log_prob(&self, actions: &Tensor) -> Tensor {
        match self {
            ActionDist::Categorical { logits } => {
                logits.log_softmax(-1, Kind::Float).gather(-1, &actions.unsqueeze(-1), false).squeeze_dim(-1)
            }
            ActionDist::DiagGaussian { mean, log_std } => {
                let z = (actions - mean) * (-log_std).exp();
                (z.square() * -0.5 - log_std - LOG_SQRT_2PI).sum_dim_intlist(-1, false, Kind::Float)
            }
        }
    }

    /// Entropy per row, shape `[B]` (or `[N, B]`).
    pub fn entropy(&self) -> Tensor {
        match self {
            ActionDist::Categorical { logits } => {
                let logp = logits.log_softmax(-1, Kind::Float);
                -(logp.exp() * logp).sum_dim_intlist(-1, false, Kind::Float)
            }
            ActionDist::DiagGaussian { mean, log_std } => {
                let per_dim = log_std + (0.5 + LOG_SQRT_2PI);
                per_dim.expand_as(mean).sum_dim_intlist(-1, false, Kind::Float)
            }
        }
    }
}

/// Sample an index from each row of `logits` (`rows × n`, row-major) and return it with its log-probability.
/// With `deterministic`, take the arg-max instead. Ties resolve to the lowest index, as `argmax`.
pub fn sample_categorical(
    logits: &[f32],
    n: usize,
    deterministic: bool,
    rng: &mut impl Rng,
    out: &mut Vec<(i64, f32)>,
) {
    out.clear();
    for row in logits.chunks_exact(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|l| (l - max).exp()).sum();
        let log_z = max + sum.ln();
        let index = if deterministic {
            row.iter().enumerate().fold(0, |best, (i, l)| if *l > row[best] { i } else { best })
        } else {
            let mut u = rng.random::<f32>() * sum;
            let mut chosen = n - 1;
            for (i, l) in row.iter().enumerate() {
                u -= (l - max).exp();
                if u < 0.0 {
                    chosen = i;
                    break;
                }
            }
            chosen
        };
        out.push((index as i64, row[index] - log_z));
    }
}

/// Sample `mean + exp(log_std) · ε` for each row of `means` (`rows × d`) into `actions`, returning each row's
/// log-probability in `log_probs`. With `deterministic`, the action is the mean (and its log-density).
pub fn sample_diag_gaussian(
    means: &[f32],
    log_std: &[f32],
    deterministic: bool,
    rng: &mut impl Rng,
    actions: &mut Vec<f32>,
    log_probs: &mut Vec<f32>,
) {
    let d = log_std.len();
    actions.clear();
    log_probs.clear();
    for row in means.chunks_exact(d) {
        let mut logp = 0.0f64;
        for (m, ls) in row.iter().zip(log_std) {
            let eps = if deterministic { 0.0 } else { standard_normal(rng) };
            actions.push(m + ls.exp() * eps as f32);
            logp += -0.5 * eps * eps - *ls as f64 - LOG_SQRT_2PI;
        }
        log_probs.push(logp as f32);
    }
}

/// One standard normal draw (Box–Muller; the second value is discarded to keep the stream simple).
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn categorical_sampling_matches_tensor_log_prob_and_frequencies() {
        let logits = [0.3f32, -1.2, 2.0, 0.0, 0.0, 0.0];
        let mut rng = Pcg64::seed_from_u64(1);
        let mut out = Vec::new();
        let mut counts = [0usize; 3];
        let draws = 60_000;
        for _ in 0..draws {
            sample_categorical(&logits, 3, false, &mut rng, &mut out);
            counts[out[0].0 as usize] += 1;
        }
        let dist = ActionDist::Categorical { logits: Tensor::from_slice(&logits).view([2, 3]) };
        let lp = dist.log_prob(&Tensor::from_slice(&[0i64, 1]));
        let lp: Vec<f32> = Vec::try_from(lp).unwrap();
        let probs: Vec<f64> = (0..3).map(|i| (logits[i] as f64).exp()).collect();
        let z: f64 = probs.iter().sum();
        assert!(close(lp[0] as f64, (probs[0] / z).ln(), 1e-5));
        for i in 0..3 {
            let freq = counts[i] as f64 / draws as f64;
            assert!(close(freq, probs[i] / z, 0.01), "action {i}: {freq} vs {}", probs[i] / z);
        }
        // The log-prob returned with a sample is the tensor log-prob of that sample.
        sample_categorical(&logits, 3, true, &mut rng, &mut out);
        assert_eq!(out[0].0, 2);
        assert_eq!(out[1].0, 0, "ties break to the lowest index");
        assert!(close(out[1].1 as f64, (1.0f64 / 3.0).ln(), 1e-6));
    }

    #[test]
    fn categorical_entropy() {
        let dist = ActionDist::Categorical { logits: Tensor::from_slice(&[0.0f32, 0.0, 5.0, 5.0]).view([2, 2]) };
        let h: Vec<f32> = Vec::try_from(dist.entropy()).unwrap();
        assert!(close(h[0] as f64, 2f64.ln(), 1e-6) && close(h[1] as f64, 2f64.ln(), 1e-6));
    }

    #[test]
    fn gaussian_sampling_matches_tensor_log_prob() {
        let means = [0.5f32, -1.0, 0.0, 2.0];
        let log_std = [-0.5f32, 0.3];
        let mut rng = Pcg64::seed_from_u64(2);
        let (mut acts, mut lps) = (Vec::new(), Vec::new());
        sample_diag_gaussian(&means, &log_std, false, &mut rng, &mut acts, &mut lps);
        let dist = ActionDist::DiagGaussian {
            mean: Tensor::from_slice(&means).view([2, 2]),
            log_std: Tensor::from_slice(&log_std),
        };
        let lp: Vec<f32> = Vec::try_from(dist.log_prob(&Tensor::from_slice(&acts).view([2, 2]))).unwrap();
        for i in 0..2 {
            assert!(close(lp[i] as f64, lps[i] as f64, 1e-5), "{lp:?} vs {lps:?}");
        }
        // Entropy of N(μ, σ²) per dimension is ½ + ln(σ√(2π)).
        let h: Vec<f32> = Vec::try_from(dist.entropy()).unwrap();
        let want = (0.5 + LOG_SQRT_2PI - 0.5) + (0.5 + LOG_SQRT_2PI + 0.3);
        assert!(close(h[0] as f64, want, 1e-5));
        // Sample moments.
        let n = 40_000;
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for _ in 0..n {
            sample_diag_gaussian(&means[..2], &log_std, false, &mut rng, &mut acts, &mut lps);
            sum += acts[1] as f64;
            sq += (acts[1] as f64 + 1.0).powi(2);
        }
        assert!(close(sum / n as f64, -1.0, 0.03));
        assert!(close((sq / n as f64).sqrt(), 0.3f64.exp(), 0.03));
        sample_diag_gaussian(&means, &log_std, true, &mut rng, &mut acts, &mut lps);
        assert_eq!(acts, means.to_vec());
    }
}
