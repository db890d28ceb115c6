//! V-trace off-policy targets (Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
//! Weighted Actor-Learner Architectures", §4.1).
//!
//! Truncated importance weights `ρ_t = min(ρ̄, π(a_t|x_t) / μ(a_t|x_t))` and `c_t = min(c̄, π(a_t|x_t) / μ(a_t|x_t))`
//! (`π` the target policy being learnt, `μ` the behaviour policy that acted),
//! `δ_t = ρ_t (r_t + γ (1 − terminated_t) V(x_{t+1}) − V(x_t))`, and the n-step target
//! `v_s = V(x_s) + Σ_{t=s}^{s+n−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t`, computed backwards as
//! `v_s − V(x_s) = δ_s + γ (1 − done_s) c_s (v_{s+1} − V(x_{s+1}))`.
//! The policy-gradient advantage is `ρ^pg_s (r_s + γ (1 − terminated_s) v_{s+1} − V(x_s))` with its own
//! threshold `ρ^pg_s = min(ρ̄_pg, π/μ)`, as in TorchBeast's `vtrace.py` and DeepMind's `scalable_agent`.
//!
//! `ρ̄` sets the fixed point (the value of a policy between `μ` and `π`, `π` itself when `ρ̄ = ∞`); `c̄` only
//! the speed of contraction and the variance. On-policy with `ρ̄, c̄ ≥ 1`, `v_s` is the n-step bootstrapped
//! return, i.e. GAE with `λ = 1` plus `V(x_s)` ([`crate::data::gae`]).
//!
//! Episode boundaries follow [`crate::data::gae`]: `x_{t+1}` is the observation that truly followed step `t`, so at a
//! truncation the caller passes `V(final observation)` in `next_values`; the bootstrap stays (`terminated` is
//! false) while the correction carry is cut (`done` is true), and `v_{t+1}` there is that plain value. After
//! the rollout's last step `v_{T}` is the bootstrap value `next_values` itself.
//!
//! PPO and A2C apply it when their config sets `vtrace` ([`crate::actor_critic::ActorCritic::targets`]).
use serde::{Deserialize, Serialize};

use crate::data::gae::time_major_steps;
use crate::error::Checks;
use crate::{Metrics, Result};

/// Truncation thresholds of the importance weights. `Default` is the paper's `ρ̄ = c̄ = 1` (and `ρ̄_pg = 1`).
/// A threshold of `inf` disables that clipping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VtraceConfig {
    /// `ρ̄`: clips the weights in `δ_t`, and so chooses the policy whose value `v_s` estimates.
    pub clip_rho_threshold: f64,
    /// `c̄`: clips the trace coefficients `c_i` that carry corrections back in time.
    pub clip_c_threshold: f64,
    /// `ρ̄_pg`: clips the weight of the policy-gradient advantage.
    pub clip_pg_rho_threshold: f64,
}

impl Default for VtraceConfig {
    fn default() -> Self {
        VtraceConfig { clip_rho_threshold: 1.0, clip_c_threshold: 1.0, clip_pg_rho_threshold: 1.0 }
    }
}

impl VtraceConfig {
    /// Check ranges that serde cannot: every threshold must be positive (`inf` allowed: no clipping).
    pub fn validate(&self) -> Result<()> {
        let rule = "must be > 0 (inf disables clipping)";
        let mut checks = Checks::of("vtrace");
        for (field, x) in [
            ("clip_rho_threshold", self.clip_rho_threshold),
            ("clip_c_threshold", self.clip_c_threshold),
            ("clip_pg_rho_threshold", self.clip_pg_rho_threshold),
        ] {
            checks = checks.that(x > 0.0, field, x, rule);
        }
        checks.done()
    }
}

/// V-trace targets and policy-gradient advantages for a time-major rollout of `n_envs` envs
/// (`index = t · n_envs + env`).
///
/// * `behaviour_log_probs[i]`, `target_log_probs[i]` — `ln μ(a_i|x_i)` and `ln π(a_i|x_i)` of the action taken;
/// * `next_values[i]` — value of the observation that followed step `i` (ignored where `terminated[i]`);
/// * `dones[i]` — `terminated[i] || truncated[i]`: the next row of that env starts a new episode.
///
/// Writes `vs` (the value targets `v_s`) and `pg_advantages` (`ρ^pg_s (r_s + γ v_{s+1} − V(x_s))`), each the
/// rollout's length.
#[allow(clippy::too_many_arguments)]
pub fn vtrace(
    behaviour_log_probs: &[f32],
    target_log_probs: &[f32],
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    terminated: &[bool],
    dones: &[bool],
    n_envs: usize,
    gamma: f32,
    config: &VtraceConfig,
    vs: &mut [f32],
    pg_advantages: &mut [f32],
) {
    let lens =
        [rewards, behaviour_log_probs, target_log_probs, values, next_values, vs, pg_advantages].map(<[f32]>::len);
    let steps = time_major_steps("vtrace", &[&lens[..], &[terminated.len(), dones.len()]].concat(), n_envs);
    let rho_bar = config.clip_rho_threshold as f32;
    let c_bar = config.clip_c_threshold as f32;
    let pg_rho_bar = config.clip_pg_rho_threshold as f32;
    for env in 0..n_envs {
        // v_{s+1} − V(x_{s+1}); zero after the rollout's last step, where v_T is the bootstrap value.
        let mut next_correction = 0.0f32;
        for t in (0..steps).rev() {
            let i = t * n_envs + env;
            let ratio = (target_log_probs[i] - behaviour_log_probs[i]).exp();
            let rho = ratio.min(rho_bar);
            let c = ratio.min(c_bar);
            let pg_rho = ratio.min(pg_rho_bar);
            // v_{s+1}: nothing after a termination, the plain value after a truncation or the last step.
            let carried = if dones[i] { 0.0 } else { next_correction };
            let next_vs = if terminated[i] { 0.0 } else { next_values[i] + carried };
            let bootstrap = if terminated[i] { 0.0 } else { gamma * next_values[i] };
            let delta = rho * (rewards[i] + bootstrap - values[i]);
            next_correction = delta + gamma * c * carried;
            vs[i] = values[i] + next_correction;
            pg_advantages[i] = pg_rho * (rewards[i] + gamma * next_vs - values[i]);
        }
    }
}

/// What V-trace makes of a rollout under the current parameters: the targets and advantages that replace GAE's,
/// and what they were computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct VtraceTargets {
    /// `ln π(a_s|x_s)` of the stored actions under the current parameters.
    pub target_log_probs: Vec<f32>,
    /// `V(x_s)` under the current parameters.
    pub values: Vec<f32>,
    /// `V(x_{s+1})` under the current parameters (0 after a termination).
    pub next_values: Vec<f32>,
    /// Value targets `v_s`: what replaces the rollout's `returns`.
    pub vs: Vec<f32>,
    /// `ρ^pg_s (r_s + γ v_{s+1} − V(x_s))`: what replaces the rollout's `advantages`.
    pub pg_advantages: Vec<f32>,
    /// Statistics of the importance weights, for the logs.
    pub weights: ImportanceWeights,
}

/// Statistics of the importance weights `π(a|x) / μ(a|x)` of a rollout: how far the behaviour policy lags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImportanceWeights {
    /// Mean truncated weight `ρ_t = min(ρ̄, π/μ)`: 1 on-policy (with `ρ̄ ≥ 1`), lower as `μ` falls behind.
    pub mean_rho: f64,
    /// Mean untruncated `π/μ` (1 in expectation under `μ`).
    pub mean_ratio: f64,
    /// Fraction of steps whose `π/μ` exceeds `ρ̄` (and so is clipped in `δ_t`), by more than the f32 rounding
    /// of the two log-probs (`ln(π/μ) > ln ρ̄ + 1e-5`), so that on-policy with `ρ̄ = 1` it reads 0.
    pub rho_clip_fraction: f64,
    /// `E_μ[(π/μ − 1) − ln(π/μ)]`, an unbiased estimate of KL(μ ‖ π) from the behaviour samples.
    pub behaviour_kl: f64,
}

impl ImportanceWeights {
    /// The statistics of `exp(target_log_probs − behaviour_log_probs)` with `config`'s `ρ̄`.
    pub fn new(behaviour_log_probs: &[f32], target_log_probs: &[f32], config: &VtraceConfig) -> Self {
        assert_eq!(behaviour_log_probs.len(), target_log_probs.len(), "importance weights: log-prob lengths differ");
        let n = behaviour_log_probs.len().max(1) as f64;
        let clipped_above = config.clip_rho_threshold.ln() + 1e-5;
        let (mut rho, mut ratio, mut clipped, mut kl) = (0.0, 0.0, 0.0, 0.0);
        for (&mu, &pi) in behaviour_log_probs.iter().zip(target_log_probs) {
            let log_ratio = pi as f64 - mu as f64;
            let r = log_ratio.exp();
            rho += r.min(config.clip_rho_threshold);
            ratio += r;
            clipped += f64::from(u8::from(log_ratio > clipped_above));
            kl += r - 1.0 - log_ratio;
        }
        ImportanceWeights {
            mean_rho: rho / n,
            mean_ratio: ratio / n,
            rho_clip_fraction: clipped / n,
            behaviour_kl: kl / n,
        }
    }

    /// Append as `losses/vtrace_mean_rho`, `losses/vtrace_mean_ratio`, `losses/vtrace_rho_clip_fraction` and
    /// `losses/vtrace_behaviour_kl`.
    pub fn push_metrics(&self, m: &mut Metrics) {
        m.push("losses/vtrace_mean_rho", self.mean_rho);
        m.push("losses/vtrace_mean_ratio", self.mean_ratio);
        m.push("losses/vtrace_rho_clip_fraction", self.rho_clip_fraction);
        m.push("losses/vtrace_behaviour_kl", self.behaviour_kl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::gae::gae;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    /// A random rollout with terminations and truncations; `next_values` agree with `values` inside episodes.
    struct Rollout {
        mu: Vec<f32>,
        pi: Vec<f32>,
        r: Vec<f32>,
        v: Vec<f32>,
        nv: Vec<f32>,
        term: Vec<bool>,
        done: Vec<bool>,
    }

    fn random_rollout(rng: &mut Pcg64, n: usize, steps: usize, spread: f32) -> Rollout {
        let len = n * steps;
        let mu: Vec<f32> = (0..len).map(|_| rng.random_range(-3.0..0.0)).collect();
        let pi: Vec<f32> = mu.iter().map(|&m| m + rng.random_range(-spread..spread)).collect();
        let r: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let v: Vec<f32> = (0..len).map(|_| rng.random_range(-2.0..2.0)).collect();
        let term: Vec<bool> = (0..len).map(|_| rng.random_bool(0.08)).collect();
        let trunc: Vec<bool> = (0..len).map(|i| !term[i] && rng.random_bool(0.08)).collect();
        let done: Vec<bool> = (0..len).map(|i| term[i] || trunc[i]).collect();
        // Inside an episode x_{t+1} is the next row; at a boundary or after the last row, some other observation.
        let nv: Vec<f32> =
            (0..len).map(|i| if done[i] || i + n >= len { rng.random_range(-2.0..2.0) } else { v[i + n] }).collect();
        Rollout { mu, pi, r, v, nv, term, done }
    }

    /// The definition, term by term: v_s = V(x_s) + Σ_{t=s}^{s+n−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t, summed until
    /// the episode (or rollout) ends; then ρ^pg_s (r_s + γ v_{s+1} − V(x_s)). Returns (v_s, advantages).
    fn reference(ro: &Rollout, n: usize, g: f64, cfg: &VtraceConfig) -> (Vec<f64>, Vec<f64>) {
        let len = ro.r.len();
        let steps = len / n;
        let ratio = |i: usize| (ro.pi[i] as f64 - ro.mu[i] as f64).exp();
        let rho = |i: usize| ratio(i).min(cfg.clip_rho_threshold);
        let c = |i: usize| ratio(i).min(cfg.clip_c_threshold);
        let v_next = |i: usize| if ro.term[i] { 0.0 } else { ro.nv[i] as f64 };
        let delta = |i: usize| rho(i) * (ro.r[i] as f64 + g * v_next(i) - ro.v[i] as f64);
        let mut vs = vec![0.0; len];
        for env in 0..n {
            for s in 0..steps {
                let mut sum = 0.0;
                let mut trace = 1.0;
                for t in s..steps {
                    let i = t * n + env;
                    sum += g.powi((t - s) as i32) * trace * delta(i);
                    if ro.done[i] {
                        break;
                    }
                    trace *= c(i);
                }
                vs[s * n + env] = ro.v[s * n + env] as f64 + sum;
            }
        }
        let adv = (0..len)
            .map(|i| {
                let vs_next = if ro.term[i] {
                    0.0
                } else if ro.done[i] || i + n >= len {
                    ro.nv[i] as f64
                } else {
                    vs[i + n]
                };
                ratio(i).min(cfg.clip_pg_rho_threshold) * (ro.r[i] as f64 + g * vs_next - ro.v[i] as f64)
            })
            .collect();
        (vs, adv)
    }

    fn run(ro: &Rollout, n: usize, gamma: f32, cfg: &VtraceConfig) -> (Vec<f32>, Vec<f32>) {
        let len = ro.r.len();
        let (mut vs, mut adv) = (vec![0.0; len], vec![0.0; len]);
        vtrace(&ro.mu, &ro.pi, &ro.r, &ro.v, &ro.nv, &ro.term, &ro.done, n, gamma, cfg, &mut vs, &mut adv);
        (vs, adv)
    }

    fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((g as f64 - w).abs() <= tol * (1.0 + w.abs()), "{what} step {i}: {g} vs {w}");
        }
    }

    #[test]
    fn matches_definition_with_terminations_and_truncations() {
        let mut rng = Pcg64::seed_from_u64(11);
        // Distinct thresholds, so that mixing them up shows; then the paper's defaults; then no clipping at all.
        let configs = [
            VtraceConfig { clip_rho_threshold: 1.3, clip_c_threshold: 0.8, clip_pg_rho_threshold: 1.1 },
            VtraceConfig::default(),
            VtraceConfig { clip_rho_threshold: f64::INFINITY, clip_c_threshold: 1.5, clip_pg_rho_threshold: 2.0 },
        ];
        for n in [1, 3, 8] {
            let ro = random_rollout(&mut rng, n, 60, 1.0);
            assert!(ro.term.iter().any(|&x| x) && ro.done.iter().zip(&ro.term).any(|(&d, &t)| d && !t));
            for cfg in &configs {
                let (vs, adv) = run(&ro, n, 0.97, cfg);
                let (want_vs, want_adv) = reference(&ro, n, 0.97, cfg);
                assert_close(&vs, &want_vs, 1e-4, &format!("v_s (n_envs {n}, {cfg:?})"));
                assert_close(&adv, &want_adv, 1e-4, &format!("advantage (n_envs {n}, {cfg:?})"));
            }
        }
    }

    #[test]
    fn on_policy_is_gae_with_lambda_one() {
        let mut rng = Pcg64::seed_from_u64(5);
        for n in [1, 4] {
            let mut ro = random_rollout(&mut rng, n, 30, 1.0);
            ro.pi = ro.mu.clone();
            let len = ro.r.len();
            let (mut gae_adv, mut gae_ret) = (vec![0.0; len], vec![0.0; len]);
            gae(&ro.r, &ro.v, &ro.nv, &ro.term, &ro.done, n, 0.95, 1.0, &mut gae_adv, &mut gae_ret);
            let ret: Vec<f64> = gae_ret.iter().map(|&x| x as f64).collect();
            let adv: Vec<f64> = gae_adv.iter().map(|&x| x as f64).collect();
            for cfg in [
                VtraceConfig::default(),
                VtraceConfig { clip_rho_threshold: 2.0, clip_c_threshold: 1.0, clip_pg_rho_threshold: 3.0 },
            ] {
                let (vs, pg) = run(&ro, n, 0.95, &cfg);
                assert_close(&vs, &ret, 1e-5, "v_s vs GAE(λ=1) return");
                assert_close(&pg, &adv, 1e-5, "pg advantage vs GAE(λ=1) advantage");
            }
        }
    }

    #[test]
    fn clipping_at_thresholds() {
        // One env, two steps, γ = 0.5, r = (1, 2), V(x_0) = V(x_1) = 0, bootstrap V(x_2) = 10; π/μ = (4, 3).
        let (mu, pi) = ([0.0f32, 0.0], [4.0f32.ln(), 3.0f32.ln()]);
        let (r, v, nv) = ([1.0f32, 2.0], [0.0f32, 0.0], [0.0f32, 10.0]);
        let (term, done) = ([false; 2], [false; 2]);
        let go = |cfg: &VtraceConfig| {
            let (mut vs, mut adv) = ([0.0f32; 2], [0.0f32; 2]);
            vtrace(&mu, &pi, &r, &v, &nv, &term, &done, 1, 0.5, cfg, &mut vs, &mut adv);
            (vs, adv)
        };
        let close = |a: [f32; 2], b: [f32; 2]| (0..2).all(|k| (a[k] - b[k]).abs() < 1e-5 * (1.0 + b[k].abs()));
        // Unclipped: δ_1 = 3·(2 + 5) = 21, v_1 = 21; δ_0 = 4·1 = 4, v_0 = 4 + 0.5·4·21 = 46;
        // advantages 3·(2 + 5) = 21 and 4·(1 + 0.5·21) = 46.
        let inf = f64::INFINITY;
        let (vs, adv) =
            go(&VtraceConfig { clip_rho_threshold: inf, clip_c_threshold: inf, clip_pg_rho_threshold: inf });
        assert!(close(vs, [46.0, 21.0]) && close(adv, [46.0, 21.0]), "unclipped: {vs:?} {adv:?}");
        // ρ̄ = 2, c̄ = 1.5, ρ̄_pg = 1.2: δ_1 = 2·7 = 14, v_1 = 14; δ_0 = 2·1 = 2, v_0 = 2 + 0.5·1.5·14 = 12.5;
        // advantages 1.2·7 = 8.4 and 1.2·(1 + 0.5·14) = 9.6.
        let cfg = VtraceConfig { clip_rho_threshold: 2.0, clip_c_threshold: 1.5, clip_pg_rho_threshold: 1.2 };
        let (vs, adv) = go(&cfg);
        assert!(close(vs, [12.5, 14.0]) && close(adv, [9.6, 8.4]), "clipped: {vs:?} {adv:?}");
        // Only c̄ binds (ρ̄ = ρ̄_pg = ∞, c̄ = 1): v_1 = 21 and v_0 = 4 + 0.5·1·21 = 14.5, advantages unchanged.
        let cfg = VtraceConfig { clip_rho_threshold: inf, clip_c_threshold: 1.0, clip_pg_rho_threshold: inf };
        let (vs, adv) = go(&cfg);
        assert!(close(vs, [14.5, 21.0]) && close(adv, [4.0 * 11.5, 21.0]), "c̄ only: {vs:?} {adv:?}");
    }

    #[test]
    fn truncation_bootstraps_from_final_value_and_cuts_the_carry() {
        // One env, two steps, on-policy, γ = 0.5: step 0 is truncated with V(final obs) = 10, step 1 starts anew.
        let (lp, r, v, nv) = ([0.0f32; 2], [1.0f32, 2.0], [0.0f32, 3.0], [10.0f32, 4.0]);
        let cfg = VtraceConfig::default();
        let (mut vs, mut adv) = ([0.0f32; 2], [0.0f32; 2]);
        vtrace(&lp, &lp, &r, &v, &nv, &[false; 2], &[true, false], 1, 0.5, &cfg, &mut vs, &mut adv);
        assert_eq!(vs, [1.0 + 0.5 * 10.0, 2.0 + 0.5 * 4.0]);
        assert_eq!(adv, [1.0 + 0.5 * 10.0, 2.0 + 0.5 * 4.0 - 3.0]);
        // Terminated instead: no bootstrap at all.
        vtrace(&lp, &lp, &r, &v, &nv, &[true, false], &[true, false], 1, 0.5, &cfg, &mut vs, &mut adv);
        assert_eq!(vs[0], 1.0);
        assert_eq!(adv[0], 1.0);
    }

    #[test]
    fn importance_weight_statistics() {
        // π/μ = (4, 1, 0.5) with ρ̄ = 2: ρ = (2, 1, 0.5), one of three clipped.
        let mu = [0.0f32, -1.0, 0.5];
        let pi = [4.0f32.ln(), -1.0, 0.5 + 0.5f32.ln()];
        let cfg = VtraceConfig { clip_rho_threshold: 2.0, ..VtraceConfig::default() };
        let w = ImportanceWeights::new(&mu, &pi, &cfg);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(close(w.mean_rho, 3.5 / 3.0) && close(w.mean_ratio, 5.5 / 3.0), "{w:?}");
        assert!(close(w.rho_clip_fraction, 1.0 / 3.0), "{w:?}");
        assert!(close(w.behaviour_kl, ((3.0 - 4.0f64.ln()) + (-0.5 - 0.5f64.ln())) / 3.0), "{w:?}");
        // π and μ computed by different code differ in the last bits; that is not clipping.
        let noisy: Vec<f32> = mu.iter().map(|&m| m + 4.0 * f32::EPSILON).collect();
        assert_eq!(ImportanceWeights::new(&mu, &noisy, &VtraceConfig::default()).rho_clip_fraction, 0.0);
        let on_policy = ImportanceWeights::new(&mu, &mu, &VtraceConfig::default());
        assert_eq!(
            on_policy,
            ImportanceWeights { mean_rho: 1.0, mean_ratio: 1.0, rho_clip_fraction: 0.0, behaviour_kl: 0.0 }
        );
        let mut m = Metrics::default();
        w.push_metrics(&mut m);
        assert_eq!(m.get("losses/vtrace_mean_rho"), Some(w.mean_rho));
    }

    #[test]
    fn config_defaults_and_rejects_unknown_fields() {
        let cfg: VtraceConfig = serde_json::from_str(r#"{"clip_rho_threshold": 2.0}"#).unwrap();
        assert_eq!(cfg, VtraceConfig { clip_rho_threshold: 2.0, ..VtraceConfig::default() });
        assert!(serde_json::from_str::<VtraceConfig>(r#"{"clip_rho": 2.0}"#).is_err());
        assert!(cfg.validate().is_ok());
        assert!(VtraceConfig { clip_c_threshold: 0.0, ..cfg.clone() }.validate().is_err());
        assert!(VtraceConfig { clip_pg_rho_threshold: f64::NAN, ..cfg }.validate().is_err());
    }
}
