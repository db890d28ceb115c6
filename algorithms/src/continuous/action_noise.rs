//! Exploration noise for deterministic continuous-control policies (DDPG, TD3), added to the actor's action
//! in `[−1, 1]` units before it is clipped and scaled to the env's bounds:
//! * Gaussian: `ε ~ N(0, σ²)`, drawn afresh each step (SB3's `NormalActionNoise`, TD3's choice);
//! * Ornstein–Uhlenbeck (Uhlenbeck & Ornstein 1930), the temporally correlated noise of Lillicrap et al. 2016:
//!   `x ← x + θ (μ − x) dt + σ √dt · ε` with `μ = 0`, `θ = 0.15`, `dt = 0.01`, one process per env, reset to
//!   0 when that env's episode ends (SB3's `OrnsteinUhlenbeckActionNoise` inside `VectorizedActionNoise`).
//!
//! Draws come from the caller's RNG (the agent's `Pcg64` stream), so they are reproducible and checkpointed
//! with it; the OU state is kept in f64 as NumPy does.
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Which exploration noise to add to the actor's actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoiseType {
    /// Independent Gaussian noise each step.
    #[default]
    Normal,
    /// Temporally correlated Ornstein–Uhlenbeck noise, per env.
    OrnsteinUhlenbeck,
    /// No noise: the deterministic policy explores only through random warm-up actions.
    None,
}

/// Mean-reversion rate θ of the OU process (SB3's default).
pub const OU_THETA: f64 = 0.15;
/// Time step of the OU process (SB3's default).
pub const OU_DT: f64 = 1e-2;

/// Exploration noise for `n_envs` envs with `act_dim`-dimensional actions.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionNoise {
    kind: NoiseType,
    /// σ, in units of the `[−1, 1]` action.
    std: f64,
    n_envs: usize,
    act_dim: usize,
    /// OU state `x`, `n_envs × act_dim` (all zeros and unused for the other kinds).
    state: Vec<f64>,
}

impl ActionNoise {
    /// Noise of `kind` with standard deviation `std` (the Gaussian's σ; the OU process's σ).
    pub fn new(kind: NoiseType, std: f64, n_envs: usize, act_dim: usize) -> Self {
        ActionNoise { kind, std, n_envs, act_dim, state: vec![0.0; n_envs * act_dim] }
    }

    /// Add one noise draw to each of the `rows × act_dim` values in `actions` (row-major). OU noise needs one
    /// row per env (`rows = n_envs`), since each env has its own process.
    pub fn add_to(&mut self, actions: &mut [f32], rng: &mut impl Rng) -> Result<()> {
        match self.kind {
            NoiseType::None => {}
            NoiseType::Normal => {
                fill_standard_normal(rng, actions.len(), |i, eps| actions[i] += (self.std * eps) as f32);
            }
            NoiseType::OrnsteinUhlenbeck => {
                if actions.len() != self.state.len() {
                    let (n, a) = (self.n_envs, self.act_dim);
                    let what = format!("actions to add Ornstein–Uhlenbeck noise to ({n} envs × {a} action values)");
                    return Err(Error::length(what, actions.len(), self.state.len()));
                }
                let (state, std) = (&mut self.state, self.std);
                fill_standard_normal(rng, actions.len(), |i, eps| {
                    let x = state[i];
                    state[i] = x + OU_THETA * (0.0 - x) * OU_DT + std * OU_DT.sqrt() * eps;
                    actions[i] += state[i] as f32;
                });
            }
        }
        Ok(())
    }

    /// Restart env `env`'s process at 0 (its episode ended). Gaussian noise has no state.
    pub fn reset(&mut self, env: usize) {
        if let Some(row) = self.state.get_mut(env * self.act_dim..(env + 1) * self.act_dim) {
            row.fill(0.0);
        }
    }

    /// The OU state, `n_envs × act_dim`, for checkpoints.
    pub fn state(&self) -> &[f64] {
        &self.state
    }

    /// Restore a state saved from [`ActionNoise::state`].
    pub fn set_state(&mut self, state: &[f64]) -> Result<()> {
        let (got, want, n, a) = (state.len(), self.state.len(), self.n_envs, self.act_dim);
        if got != want {
            let what = format!("action noise state has {got} values, expected {want} ({n} envs × {a} action values)");
            return Err(Error::Checkpoint(what));
        }
        self.state.copy_from_slice(state);
        Ok(())
    }
}

/// Call `sink(i, ε_i)` for `i in 0..n` with independent standard normal draws (Box–Muller, both values of
/// each pair used; an odd last draw discards its partner, so every call uses `2 ⌈n/2⌉` uniforms).
pub fn fill_standard_normal(rng: &mut impl Rng, n: usize, mut sink: impl FnMut(usize, f64)) {
    let mut i = 0;
    while i < n {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln stays finite
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        sink(i, r * cos);
        if i + 1 < n {
            sink(i + 1, r * sin);
        }
        i += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    fn mean_std(x: &[f64]) -> (f64, f64) {
        let m = x.iter().sum::<f64>() / x.len() as f64;
        (m, (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / x.len() as f64).sqrt())
    }

    #[test]
    fn standard_normal_moments() {
        let mut rng = Pcg64::seed_from_u64(0);
        let mut x = vec![0.0; 200_001];
        fill_standard_normal(&mut rng, x.len(), |i, e| x[i] = e);
        let (m, s) = mean_std(&x);
        assert!(m.abs() < 0.01 && (s - 1.0).abs() < 0.01, "mean {m}, std {s}");
        // Pairs are independent: lag-1 correlation near 0.
        let c = x.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / (x.len() - 1) as f64;
        assert!(c.abs() < 0.01, "lag-1 correlation {c}");
    }

    #[test]
    fn gaussian_noise_has_the_configured_std_and_no_state() {
        let mut noise = ActionNoise::new(NoiseType::Normal, 0.1, 3, 2);
        let mut rng = Pcg64::seed_from_u64(1);
        let mut all = Vec::new();
        for _ in 0..20_000 {
            let mut a = [0.5f32; 6];
            noise.add_to(&mut a, &mut rng).unwrap();
            all.extend(a.iter().map(|v| *v as f64 - 0.5));
        }
        let (m, s) = mean_std(&all);
        assert!(m.abs() < 0.002 && (s - 0.1).abs() < 0.002, "mean {m}, std {s}");
        // Any number of rows is fine for stateless noise (e.g. a different batch size).
        noise.add_to(&mut [0.0; 5], &mut rng).unwrap();
        assert!(noise.state().iter().all(|x| *x == 0.0));
        let mut quiet = ActionNoise::new(NoiseType::None, 0.1, 3, 2);
        let mut a = [0.25f32; 6];
        quiet.add_to(&mut a, &mut rng).unwrap();
        assert_eq!(a, [0.25; 6]);
    }

    #[test]
    fn ornstein_uhlenbeck_reverts_to_the_mean_and_resets() {
        let (sigma, n_envs) = (0.3, 2);
        let mut noise = ActionNoise::new(NoiseType::OrnsteinUhlenbeck, sigma, n_envs, 1);
        let mut rng = Pcg64::seed_from_u64(2);
        // Mean reversion: from x₀ = 1, E[x_t] = (1 − θ dt)^t; averaged over many independent paths.
        let paths = 4_000;
        let steps = 200;
        let mut mean_at = vec![0.0; steps];
        for _ in 0..paths / n_envs {
            noise.set_state(&[1.0, 1.0]).unwrap();
            for m in mean_at.iter_mut() {
                let mut a = [0.0f32; 2];
                noise.add_to(&mut a, &mut rng).unwrap();
                *m += (a[0] as f64 + a[1] as f64) / paths as f64;
            }
        }
        for t in [0, 49, 199] {
            let want = (1.0 - OU_THETA * OU_DT).powi(t as i32 + 1);
            // The spread of the mean of 4000 paths is at most σ √(t dt) / √4000 ≈ 0.007.
            assert!((mean_at[t] - want).abs() < 0.03, "step {t}: mean {} vs {want}", mean_at[t]);
        }
        assert!(mean_at[199] < 0.8 && mean_at[199] > 0.7, "decays towards 0: {}", mean_at[199]);
        // Stationary: mean 0, std σ / √(2θ − θ² dt), lag-1 autocorrelation 1 − θ dt (Gaussian noise: 0);
        // measured across 500 independent envs after 3000 steps (4.5 relaxation times 1/(θ dt)), one draw each.
        let envs = 500;
        let mut noise = ActionNoise::new(NoiseType::OrnsteinUhlenbeck, sigma, envs, 1);
        let mut a = vec![0.0f32; envs];
        for _ in 0..3_000 {
            a.fill(0.0);
            noise.add_to(&mut a, &mut rng).unwrap();
        }
        let x0: Vec<f64> = noise.state().to_vec();
        noise.add_to(&mut vec![0.0; envs], &mut rng).unwrap();
        let (m, s) = mean_std(&x0);
        let want = sigma / (2.0 * OU_THETA - OU_THETA * OU_THETA * OU_DT).sqrt();
        assert!(m.abs() < 0.1 && (s / want - 1.0).abs() < 0.1, "mean {m}, std {s} vs {want}");
        // The regression slope of x_{t+1} on x_t, whose sampling error is σ √dt / √(Σ x²) ≈ 0.0025 here.
        let c = x0.iter().zip(noise.state()).map(|(x, y)| x * y).sum::<f64>() / x0.iter().map(|x| x * x).sum::<f64>();
        assert!((c - (1.0 - OU_THETA * OU_DT)).abs() < 0.01, "lag-1 autocorrelation {c}");
        let mut noise = ActionNoise::new(NoiseType::OrnsteinUhlenbeck, sigma, n_envs, 1);
        // Reset zeroes only the env whose episode ended.
        noise.set_state(&[0.4, -0.2]).unwrap();
        noise.reset(1);
        assert_eq!(noise.state(), &[0.4, 0.0]);
        // OU needs one row per env.
        assert!(noise.add_to(&mut [0.0; 3], &mut rng).is_err());
        assert!(noise.set_state(&[0.0]).is_err());
    }
}
