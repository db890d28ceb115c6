//! Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using
//! Generalized Advantage Estimation").
//!
//! `δ_t = r_t + γ (1 − terminated_t) V(s_{t+1}) − V(s_t)`, `Â_t = δ_t + γλ (1 − done_t) Â_{t+1}`, returns
//! `R_t = Â_t + V(s_t)`.
//!
//! Truncation: `s_{t+1}` is the observation that truly followed step `t`. When an episode is cut by a time
//! limit the vectorised env has already reset, so the caller passes `V(final observation)` in `next_values`
//! for that step; the bootstrap stays (`terminated` is false) while the recursion is cut (`done` is true).

/// Advantages and returns for a time-major rollout of `n_envs` envs (`index = t · n_envs + env`).
///
/// * `next_values[i]` — value of the observation that followed step `i` (ignored where `terminated[i]`);
/// * `dones[i]` — `terminated[i] || truncated[i]`: the next row of that env starts a new episode.
///
/// Writes `advantages` and `returns` (each the rollout's length).
#[allow(clippy::too_many_arguments)]
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    terminated: &[bool],
    dones: &[bool],
    n_envs: usize,
    gamma: f32,
    lambda: f32,
    advantages: &mut [f32],
    returns: &mut [f32],
) {
    let lens = [rewards, values, next_values, advantages, returns].map(<[f32]>::len);
    let steps = time_major_steps("gae", &[&lens[..], &[terminated.len(), dones.len()]].concat(), n_envs);
    for env in 0..n_envs {
        let mut next_advantage = 0.0f32;
        for t in (0..steps).rev() {
            let i = t * n_envs + env;
            let bootstrap = if terminated[i] { 0.0 } else { gamma * next_values[i] };
            let delta = rewards[i] + bootstrap - values[i];
            let carry = if dones[i] { 0.0 } else { gamma * lambda * next_advantage };
            next_advantage = delta + carry;
            advantages[i] = next_advantage;
            returns[i] = next_advantage + values[i];
        }
    }
}

/// The steps of a time-major rollout of `n_envs` envs whose buffers have lengths `lens`; panics (naming `what`)
/// unless they are equal and a multiple of `n_envs`.
pub(crate) fn time_major_steps(what: &str, lens: &[usize], n_envs: usize) -> usize {
    let len = lens[0];
    assert!(lens.iter().all(|&l| l == len), "{what}: rollout buffers of different lengths {lens:?}");
    assert_eq!(len % n_envs, 0, "{what}: rollout length {len} is not a multiple of n_envs {n_envs}");
    len / n_envs
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    /// The definition, term by term: Â_t = Σ_{l≥0} (γλ)^l δ_{t+l}, summed until the episode (or rollout) ends.
    #[allow(clippy::too_many_arguments)]
    fn reference(r: &[f32], v: &[f32], nv: &[f32], term: &[bool], done: &[bool], n: usize, g: f64, l: f64) -> Vec<f64> {
        let steps = r.len() / n;
        let delta = |i: usize| r[i] as f64 + if term[i] { 0.0 } else { g * nv[i] as f64 } - v[i] as f64;
        let mut adv = vec![0.0; r.len()];
        for env in 0..n {
            for t in 0..steps {
                let mut sum = 0.0;
                for k in t..steps {
                    let i = k * n + env;
                    sum += (g * l).powi((k - t) as i32) * delta(i);
                    if done[i] {
                        break;
                    }
                }
                adv[t * n + env] = sum;
            }
        }
        adv
    }

    #[test]
    fn matches_definition_with_terminations_and_truncations() {
        let mut rng = Pcg64::seed_from_u64(7);
        let (n, steps) = (3, 40);
        let len = n * steps;
        let r: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let v: Vec<f32> = (0..len).map(|_| rng.random_range(-2.0..2.0)).collect();
        let nv: Vec<f32> = (0..len).map(|_| rng.random_range(-2.0..2.0)).collect();
        let term: Vec<bool> = (0..len).map(|_| rng.random_bool(0.08)).collect();
        let trunc: Vec<bool> = (0..len).map(|i| !term[i] && rng.random_bool(0.08)).collect();
        let done: Vec<bool> = (0..len).map(|i| term[i] || trunc[i]).collect();
        assert!(term.iter().any(|&x| x) && trunc.iter().any(|&x| x));
        let (mut adv, mut ret) = (vec![0.0; len], vec![0.0; len]);
        gae(&r, &v, &nv, &term, &done, n, 0.98, 0.8, &mut adv, &mut ret);
        let want = reference(&r, &v, &nv, &term, &done, n, 0.98, 0.8);
        for i in 0..len {
            assert!((adv[i] as f64 - want[i]).abs() < 1e-4, "step {i}: {} vs {}", adv[i], want[i]);
            assert!((ret[i] - adv[i] - v[i]).abs() < 1e-6);
        }
    }

    #[test]
    fn truncation_bootstraps_from_final_value_termination_does_not() {
        // One env, one step each: reward 1, V(s)=0, V(final obs)=10.
        let (mut adv, mut ret) = (vec![0.0; 1], vec![0.0; 1]);
        gae(&[1.0], &[0.0], &[10.0], &[false], &[true], 1, 0.5, 0.9, &mut adv, &mut ret);
        assert_eq!(adv[0], 1.0 + 0.5 * 10.0);
        gae(&[1.0], &[0.0], &[10.0], &[true], &[true], 1, 0.5, 0.9, &mut adv, &mut ret);
        assert_eq!(adv[0], 1.0);
    }

    #[test]
    fn lambda_one_gives_discounted_return_minus_value() {
        // λ = 1, no dones: Â_0 + V_0 = Σ γ^k r_k + γ^T V(s_T).
        let r = [1.0f32, 2.0, 3.0];
        let v = [0.5f32, -0.5, 1.5];
        let nv = [-0.5f32, 1.5, 4.0];
        let (mut adv, mut ret) = (vec![0.0; 3], vec![0.0; 3]);
        gae(&r, &v, &nv, &[false; 3], &[false; 3], 1, 0.9, 1.0, &mut adv, &mut ret);
        let want = 1.0 + 0.9 * 2.0 + 0.81 * 3.0 + 0.729 * 4.0;
        assert!((ret[0] as f64 - want).abs() < 1e-5);
    }
}
