//! n-step transitions from a vectorised env, for replay (Mnih et al. 2016, "Asynchronous Methods for Deep
//! Reinforcement Learning"; Hessel et al. 2018, "Rainbow: Combining Improvements in Deep Reinforcement
//! Learning", §"Multi-step learning").
//!
//! The transition stored for step `t` is `(s_t, a_t, R_t, s_{t+m}, terminated, γ^m)` with
//! `R_t = Σ_{k<m} γ^k r_{t+k}` and the target `R_t + γ^m (1 − terminated) max_a Q̄(s_{t+m}, a)`. Normally
//! `m = n`. When the episode ends within the window at step `t + m − 1`, the window is cut there: a terminated
//! episode does not bootstrap (`terminated` is true), a truncated one bootstraps from its true final
//! observation with `γ^m`. `n = 1` gives plain one-step transitions with discount γ.
//!
//! Each env keeps a queue of at most `n` pending steps. After every vectorised step the oldest pending step of
//! an env is emitted once its window is full, and every pending step of an env whose episode just ended is
//! emitted (oldest first) and its queue emptied — so each transition leaves as soon as it is known, and at most
//! `n − 1` steps per env wait between calls.
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::data::replay::{Element, Experience, check_len, take_checked};
use crate::{Error, Result};

/// Per-env queues of the last `n` steps, turned into n-step [`Experience`]s.
#[derive(Debug, Clone)]
pub struct NStep<O: Element> {
    n: usize,
    n_envs: usize,
    obs_dim: usize,
    act_dim: usize,
    /// `γ^k` for `k = 0..=n`.
    powers: Vec<f64>,
    /// Ring buffers, env-major: env `e`'s slot `s` is row `e · n + s`.
    obs: Vec<O>,
    actions: Vec<f32>,
    rewards: Vec<f32>,
    /// Slot of each env's oldest pending step.
    head: Vec<usize>,
    /// Pending steps per env (< n between calls).
    pending: Vec<usize>,
}

/// Sizes and queue lengths saved with the queues.
#[derive(Debug, Serialize, Deserialize)]
struct NStepState {
    n: usize,
    n_envs: usize,
    obs_dim: usize,
    act_dim: usize,
    pending: Vec<usize>,
}

impl<O: Element> NStep<O> {
    /// Empty queues for `n_envs` envs and `n`-step returns with discount `gamma` (in [0, 1]).
    pub fn new(n: usize, n_envs: usize, obs_dim: usize, act_dim: usize, gamma: f64) -> Result<Self> {
        let invalid = |field, value: String, detail: &str| Error::config("n-step returns", field, value, detail);
        if n == 0 {
            return Err(invalid("n_steps", n.to_string(), "must be at least 1"));
        }
        if n_envs == 0 {
            return Err(invalid("num_envs", n_envs.to_string(), "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&gamma) {
            return Err(invalid("gamma", gamma.to_string(), "must be in [0, 1]"));
        }
        let rows = n_envs * n;
        Ok(NStep {
            n,
            n_envs,
            obs_dim,
            act_dim,
            powers: (0..=n as i32).map(|k| gamma.powi(k)).collect(),
            obs: vec![O::default(); rows * obs_dim],
            actions: vec![0.0; rows * act_dim],
            rewards: vec![0.0; rows],
            head: vec![0; n_envs],
            pending: vec![0; n_envs],
        })
    }

    /// Record one vectorised step and pass each transition it completes to `emit`, env by env, oldest first.
    ///
    /// All slices are row-major over `n_envs` rows; `next_obs` holds the observations that truly followed
    /// (the final one where an episode ended, not the auto-reset one). An error from `emit` is returned at
    /// once and leaves the queues part-way through the step.
    #[allow(clippy::too_many_arguments)]
    pub fn push<R>(
        &mut self,
        obs: &[O],
        actions: &[f32],
        rewards: &[f32],
        terminated: &[bool],
        truncated: &[bool],
        next_obs: &[O],
        mut emit: impl FnMut(&Experience<'_, O>) -> Result<R>,
    ) -> Result<()> {
        let (ne, od, ad) = (self.n_envs, self.obs_dim, self.act_dim);
        check_len("n-step observations", obs.len(), ne * od)?;
        check_len("n-step actions", actions.len(), ne * ad)?;
        check_len("n-step rewards", rewards.len(), ne)?;
        check_len("n-step terminated flags", terminated.len(), ne)?;
        check_len("n-step truncated flags", truncated.len(), ne)?;
        check_len("n-step next observations", next_obs.len(), ne * od)?;
        for env in 0..ne {
            let row = env * self.n + (self.head[env] + self.pending[env]) % self.n;
            self.obs[row * od..(row + 1) * od].copy_from_slice(&obs[env * od..(env + 1) * od]);
            self.actions[row * ad..(row + 1) * ad].copy_from_slice(&actions[env * ad..(env + 1) * ad]);
            self.rewards[row] = rewards[env];
            self.pending[env] += 1;
            let next = &next_obs[env * od..(env + 1) * od];
            if terminated[env] || truncated[env] {
                // The episode ended: every pending step's window stops here.
                let len = self.pending[env];
                for j in 0..len {
                    emit(&self.experience(env, j, len - j, next, terminated[env]))?;
                }
                self.head[env] = 0;
                self.pending[env] = 0;
            } else if self.pending[env] == self.n {
                emit(&self.experience(env, 0, self.n, next, false))?;
                self.head[env] = (self.head[env] + 1) % self.n;
                self.pending[env] -= 1;
            }
        }
        Ok(())
    }

    /// The transition of env `env`'s `j`-th pending step over a window of `m` steps ending at `next`.
    fn experience<'a>(&'a self, env: usize, j: usize, m: usize, next: &'a [O], terminated: bool) -> Experience<'a, O> {
        let row = |k: usize| env * self.n + (self.head[env] + k) % self.n;
        let ret: f64 = (0..m).map(|k| self.powers[k] * self.rewards[row(j + k)] as f64).sum();
        let r = row(j);
        Experience {
            obs: &self.obs[r * self.obs_dim..(r + 1) * self.obs_dim],
            action: &self.actions[r * self.act_dim..(r + 1) * self.act_dim],
            reward: ret as f32,
            next_obs: next,
            terminated,
            discount: self.powers[m] as f32,
        }
    }

    /// Save the pending steps (oldest first) and the sizes under `prefix` (`prefix.obs`, `prefix.actions`,
    /// `prefix.rewards`, `prefix.state`).
    pub fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let (n, ne, od, ad) = (self.n, self.n_envs, self.obs_dim, self.act_dim);
        // Queues unrolled so that pending step j of env e is row e · n + j.
        let (mut obs, mut actions, mut rewards) =
            (vec![O::default(); ne * n * od], vec![0.0f32; ne * n * ad], vec![0.0f32; ne * n]);
        for env in 0..ne {
            for j in 0..self.pending[env] {
                let (src, dst) = (env * n + (self.head[env] + j) % n, env * n + j);
                obs[dst * od..(dst + 1) * od].copy_from_slice(&self.obs[src * od..(src + 1) * od]);
                actions[dst * ad..(dst + 1) * ad].copy_from_slice(&self.actions[src * ad..(src + 1) * ad]);
                rewards[dst] = self.rewards[src];
            }
        }
        let shape = |d: usize| [ne as i64, n as i64, d as i64];
        c.put_tensor(format!("{prefix}.obs"), &O::to_tensor(&obs, &shape(od))?);
        c.put_tensor(format!("{prefix}.actions"), &Tensor::f_from_slice(&actions)?.f_view(shape(ad))?);
        c.put_tensor(format!("{prefix}.rewards"), &Tensor::f_from_slice(&rewards)?.f_view([ne as i64, n as i64])?);
        let state = NStepState { n, n_envs: ne, obs_dim: od, act_dim: ad, pending: self.pending.clone() };
        c.put_meta(format!("{prefix}.state"), &state)
    }

    /// Restore what [`NStep::write_to`] saved into an accumulator of the same sizes. Nothing changes if the
    /// checkpoint does not match (γ stays this object's: it comes from the config).
    pub fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let (n, ne, od, ad) = (self.n, self.n_envs, self.obs_dim, self.act_dim);
        let state: NStepState = c.meta(&format!("{prefix}.state"))?;
        let (saved, ours) = ((state.n, state.n_envs, state.obs_dim, state.act_dim), (n, ne, od, ad));
        if saved != ours {
            let what = "saved n-step queues have (n, n_envs, obs_dim, act_dim)";
            return Err(Error::Checkpoint(format!("{prefix:?}: {what} = {saved:?}, these {ours:?}")));
        }
        if state.pending.len() != ne || state.pending.iter().any(|&p| p >= n) {
            return Err(Error::Checkpoint(format!("{prefix:?}: invalid pending counts {:?}", state.pending)));
        }
        let obs = take_checked(c, &format!("{prefix}.obs"), O::KIND, &[ne, n, od])?;
        let actions = take_checked(c, &format!("{prefix}.actions"), Kind::Float, &[ne, n, ad])?;
        let rewards = take_checked(c, &format!("{prefix}.rewards"), Kind::Float, &[ne, n])?;
        obs.f_copy_data(&mut self.obs, ne * n * od)?;
        actions.f_copy_data(&mut self.actions, ne * n * ad)?;
        rewards.f_copy_data(&mut self.rewards, ne * n)?;
        self.head.fill(0);
        self.pending = state.pending;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64;

    /// An emitted transition, owned, with the step at which it was emitted.
    #[derive(Debug, Clone, PartialEq)]
    struct Owned {
        obs: Vec<f32>,
        action: Vec<f32>,
        reward: f32,
        next_obs: Vec<f32>,
        terminated: bool,
        discount: f32,
        emitted_at: usize,
    }

    /// A random vectorised stream: `obs[t][e] = [e, t, noise]`, so an emitted transition names its step.
    struct Stream {
        obs: Vec<Vec<f32>>,
        actions: Vec<Vec<f32>>,
        rewards: Vec<Vec<f32>>,
        terminated: Vec<Vec<bool>>,
        truncated: Vec<Vec<bool>>,
        next_obs: Vec<Vec<f32>>,
    }

    fn stream(n_envs: usize, steps: usize, seed: u64) -> Stream {
        let mut rng = Pcg64::seed_from_u64(seed);
        let mut s = Stream {
            obs: vec![],
            actions: vec![],
            rewards: vec![],
            terminated: vec![],
            truncated: vec![],
            next_obs: vec![],
        };
        for t in 0..steps {
            let mut noise = |e: usize, at: f32| [e as f32, at, rng.random_range(-1.0f32..1.0)];
            s.obs.push((0..n_envs).flat_map(|e| noise(e, t as f32)).collect());
            s.next_obs.push((0..n_envs).flat_map(|e| noise(e, t as f32 + 0.5)).collect());
            s.actions.push((0..2 * n_envs).map(|_| rng.random_range(-1.0..1.0)).collect());
            s.rewards.push((0..n_envs).map(|_| rng.random_range(-2.0..2.0)).collect());
            // Terminations, truncations, and now and then both at once (terminated wins).
            s.terminated.push((0..n_envs).map(|_| rng.random_bool(0.07)).collect());
            s.truncated.push((0..n_envs).map(|_| rng.random_bool(0.05)).collect());
        }
        s
    }

    fn run(ns: &mut NStep<f32>, s: &Stream, steps: std::ops::Range<usize>, out: &mut Vec<Owned>) {
        for t in steps {
            ns.push(&s.obs[t], &s.actions[t], &s.rewards[t], &s.terminated[t], &s.truncated[t], &s.next_obs[t], |e| {
                out.push(Owned {
                    obs: e.obs.to_vec(),
                    action: e.action.to_vec(),
                    reward: e.reward,
                    next_obs: e.next_obs.to_vec(),
                    terminated: e.terminated,
                    discount: e.discount,
                    emitted_at: t,
                });
                Ok(())
            })
            .unwrap();
        }
    }

    /// The definition, per env and step: the window runs n steps or to the end of the episode, whichever
    /// comes first; `R = Σ_{k<m} γ^k r_{t+k}`. Steps whose window is not complete by the end of the stream are
    /// not emitted. Returns (env, t, transition) and the number left pending per env.
    fn reference(s: &Stream, n: usize, n_envs: usize, gamma: f64) -> (Vec<(usize, usize, Owned)>, Vec<usize>) {
        let steps = s.obs.len();
        let mut out = vec![];
        let mut pending = vec![0; n_envs];
        for (e, pending) in pending.iter_mut().enumerate() {
            for t in 0..steps {
                let ends = |u: usize| s.terminated[u][e] || s.truncated[u][e];
                let end = (t..steps).find(|&u| ends(u));
                let m = match end {
                    Some(end) if end < t + n => end - t + 1,
                    _ if t + n <= steps => n,
                    _ => {
                        *pending += 1;
                        continue;
                    }
                };
                let last = t + m - 1;
                let reward: f64 = (0..m).map(|k| gamma.powi(k as i32) * s.rewards[t + k][e] as f64).sum();
                out.push((
                    e,
                    t,
                    Owned {
                        obs: s.obs[t][3 * e..3 * e + 3].to_vec(),
                        action: s.actions[t][2 * e..2 * e + 2].to_vec(),
                        reward: reward as f32,
                        next_obs: s.next_obs[last][3 * e..3 * e + 3].to_vec(),
                        terminated: ends(last) && s.terminated[last][e],
                        discount: gamma.powi(m as i32) as f32,
                        emitted_at: last,
                    },
                ));
            }
        }
        (out, pending)
    }

    #[test]
    fn matches_definition_over_random_episodes() {
        let gamma = 0.9;
        for (n, n_envs) in [(1, 1), (1, 4), (2, 3), (3, 1), (3, 4), (5, 2), (8, 3)] {
            let s = stream(n_envs, 400, (n * 10 + n_envs) as u64);
            let mut ns = NStep::new(n, n_envs, 3, 2, gamma).unwrap();
            let mut got = vec![];
            run(&mut ns, &s, 0..400, &mut got);
            let (want, pending) = reference(&s, n, n_envs, gamma);
            assert_eq!(got.len(), want.len(), "n {n}, n_envs {n_envs}");
            assert!(got.iter().any(|x| x.terminated));
            assert!(n == 1 || got.iter().any(|x| x.discount > gamma.powi(n as i32) as f32), "some windows cut short");
            // Each env's transitions leave in step order; match them up by the step their obs names.
            let mut got: Vec<(usize, usize, Owned)> =
                got.into_iter().map(|x| (x.obs[0] as usize, x.obs[1] as usize, x)).collect();
            got.sort_by_key(|(e, t, _)| (*e, *t));
            let mut want = want;
            want.sort_by_key(|(e, t, _)| (*e, *t));
            for ((ge, gt, g), (we, wt, w)) in got.iter().zip(&want) {
                let at = format!("n {n}, n_envs {n_envs}, env {we}, step {wt}");
                assert_eq!((ge, gt), (we, wt), "{at}");
                assert_eq!((&g.obs, &g.action, &g.next_obs), (&w.obs, &w.action, &w.next_obs), "{at}");
                assert_eq!((g.terminated, g.emitted_at), (w.terminated, w.emitted_at), "{at}");
                assert!((g.reward - w.reward).abs() <= 1e-6 * (1.0 + w.reward.abs()), "{at}: {g:?} vs {w:?}");
                assert!((g.discount - w.discount).abs() <= 1e-7, "{at}: {} vs {}", g.discount, w.discount);
            }
            for (e, &p) in pending.iter().enumerate() {
                assert_eq!(ns.pending[e], p, "n {n}, n_envs {n_envs}, env {e}");
                assert!(p < n);
            }
        }
    }

    #[test]
    fn one_step_gives_plain_transitions() {
        let gamma = 0.99;
        let s = stream(3, 100, 1);
        let mut ns = NStep::new(1, 3, 3, 2, gamma).unwrap();
        let mut got = vec![];
        run(&mut ns, &s, 0..100, &mut got);
        assert_eq!(got.len(), 300);
        for (i, g) in got.iter().enumerate() {
            let (t, e) = (i / 3, i % 3);
            assert_eq!(g.obs, &s.obs[t][3 * e..3 * e + 3]);
            assert_eq!(g.next_obs, &s.next_obs[t][3 * e..3 * e + 3]);
            assert_eq!(g.action, &s.actions[t][2 * e..2 * e + 2]);
            assert_eq!((g.reward, g.terminated, g.discount), (s.rewards[t][e], s.terminated[t][e], gamma as f32));
        }
    }

    #[test]
    fn hand_computed_termination_and_truncation() {
        // One env, n = 3, γ = 0.5, rewards 1, 2, 4, 8, 16; step 3 terminates, step 4 (new episode) truncates.
        let mut ns = NStep::<f32>::new(3, 1, 1, 1, 0.5).unwrap();
        let mut got = vec![];
        let flags = [(false, false), (false, false), (false, false), (true, false), (false, true)];
        for (t, (term, trunc)) in flags.into_iter().enumerate() {
            let r = (1 << t) as f32;
            ns.push(&[t as f32], &[0.0], &[r], &[term], &[trunc], &[t as f32 + 0.5], |e| {
                got.push((e.obs[0], e.reward, e.next_obs[0], e.terminated, e.discount));
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(
            got,
            vec![
                (0.0, 1.0 + 0.5 * 2.0 + 0.25 * 4.0, 2.5, false, 0.125), // full window after step 2
                (1.0, 2.0 + 0.5 * 4.0 + 0.25 * 8.0, 3.5, true, 0.125),  // step 3 terminates: flush
                (2.0, 4.0 + 0.5 * 8.0, 3.5, true, 0.25),
                (3.0, 8.0, 3.5, true, 0.5),
                (4.0, 16.0, 4.5, false, 0.5), // truncated: bootstrap from the final obs with γ¹
            ]
        );
        assert_eq!(ns.pending[0], 0);
    }

    #[test]
    fn refuses_bad_input() {
        let mut ns = NStep::<u8>::new(2, 2, 3, 1, 0.9).unwrap();
        let ok = |_: &Experience<'_, u8>| Ok(());
        let e = ns.push(&[0; 5], &[0.0; 2], &[0.0; 2], &[false; 2], &[false; 2], &[0; 6], ok).unwrap_err();
        assert_eq!(e.to_string(), "n-step observations: got 5 values, expected 6");
        assert!(ns.push(&[0; 6], &[0.0; 2], &[0.0; 2], &[false; 2], &[false; 3], &[0; 6], ok).is_err());
        assert_eq!(ns.pending[0], 0, "nothing recorded on error");
        // An error from the callback is passed on.
        let fail = |_: &Experience<'_, u8>| -> Result<()> { Err(Error::Checkpoint("full".into())) };
        let e = ns.push(&[0; 6], &[0.0; 2], &[0.0; 2], &[true; 2], &[false; 2], &[0; 6], fail).unwrap_err();
        assert_eq!(e.to_string(), "full");
        for (n, n_envs, gamma) in [(0, 1, 0.9), (1, 0, 0.9), (1, 1, 1.5), (1, 1, f64::NAN)] {
            assert!(NStep::<f32>::new(n, n_envs, 3, 1, gamma).is_err());
        }
    }

    #[test]
    fn checkpoint_restores_pending_queues() {
        let (n, n_envs, gamma) = (4, 3, 0.95);
        let s = stream(n_envs, 200, 9);
        let mut ns = NStep::new(n, n_envs, 3, 2, gamma).unwrap();
        let mut before = vec![];
        // Stop where the queues have wrapped and hold a few steps.
        run(&mut ns, &s, 0..123, &mut before);
        assert!((0..n_envs).any(|e| ns.pending[e] > 0));
        let path = std::env::temp_dir().join(format!("flotilla-nstep-{}.safetensors", std::process::id()));
        let mut c = Checkpoint::new();
        ns.write_to(&mut c, "nstep").unwrap();
        c.save(&path).unwrap();
        let mut c = Checkpoint::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut wrong = NStep::<f32>::new(n + 1, n_envs, 3, 2, gamma).unwrap();
        assert!(wrong.read_from(&mut c, "nstep").unwrap_err().to_string().contains("n_envs"));
        let mut back = NStep::new(n, n_envs, 3, 2, gamma).unwrap();
        back.read_from(&mut c, "nstep").unwrap();
        let (mut a, mut b) = (vec![], vec![]);
        run(&mut ns, &s, 123..200, &mut a);
        run(&mut back, &s, 123..200, &mut b);
        assert_eq!(a, b);
        assert!(!a.is_empty());
    }
}
