//! A synthetic continuous-control task for the tests of DDPG, TD3 and SAC.
#![cfg(test)]
use flotilla_core::{Chunk, ObsRef, Space};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use crate::Metrics;
use crate::algorithm::Algorithm;
use crate::policy::{ActMode, ActOutput};
use crate::progress::Progress;

/// The synthetic task: 2-D random observations, a 1-D action in the asymmetric box `[−1, 2]`, reward
/// `−(a − 0.3)²` whatever the observation. Episodes end every `episode` steps (`terminal`: terminated, so
/// a bandit; else truncated, so the critics bootstrap).
#[derive(Clone)]
pub(crate) struct Bandit {
    rng: Pcg64,
    pub(crate) obs: Vec<f32>,
    n_envs: usize,
    t: usize,
    episode: usize,
    terminal: bool,
    /// With `tasks` > 0, env e is of task e mod `tasks`: its observation ends in the task's one-hot and its
    /// optimum is [`Bandit::optimum`].
    tasks: usize,
    /// Env steps taken (all envs).
    env_steps: u64,
}

pub(crate) const OPTIMUM: f32 = 0.3;

pub(crate) fn spaces() -> (Space, Space) {
    (Space::box1d(vec![-1.0; 2], vec![1.0; 2]), Space::box1d(vec![-1.0], vec![2.0]))
}

impl Bandit {
    pub(crate) fn new(seed: u64, n_envs: usize, episode: usize, terminal: bool) -> Self {
        let rng = Pcg64::seed_from_u64(seed);
        let mut b = Bandit { rng, obs: Vec::new(), n_envs, t: 0, episode, terminal, tasks: 0, env_steps: 0 };
        b.obs = b.draw();
        b
    }

    /// A bandit of `tasks` tasks whose optima differ.
    pub(crate) fn tasked(seed: u64, n_envs: usize, tasks: usize) -> Self {
        let mut b = Bandit { tasks, ..Bandit::new(seed, n_envs, 1, true) };
        b.obs = b.draw();
        b
    }

    /// The best action of env `e`: `OPTIMUM`, less 0.8 per task index.
    pub(crate) fn optimum(&self, e: usize) -> f32 {
        if self.tasks == 0 { OPTIMUM } else { OPTIMUM - 0.8 * (e % self.tasks) as f32 }
    }

    pub(crate) fn draw(&mut self) -> Vec<f32> {
        let mut obs = Vec::new();
        for e in 0..self.n_envs {
            obs.extend((0..2).map(|_| self.rng.random_range(-1.0f32..1.0)));
            obs.extend((0..self.tasks).map(|k| if k == e % self.tasks { 1.0 } else { 0.0 }));
        }
        obs
    }

    /// `steps` vectorised steps of act → observe → update, as the trainer runs them.
    pub(crate) fn drive(&mut self, agent: &mut dyn Algorithm, steps: usize, total: u64) -> Vec<Metrics> {
        let mut out = ActOutput::default();
        let mut metrics = Vec::new();
        for _ in 0..steps {
            agent.act(ObsRef::F32(&self.obs), ActMode::Explore, &mut out).unwrap();
            let rewards: Vec<f32> =
                out.actions.iter().enumerate().map(|(e, a)| -(a.clamp(-1.0, 2.0) - self.optimum(e)).powi(2)).collect();
            self.t += 1;
            let end = self.t.is_multiple_of(self.episode);
            let terminated = vec![end && self.terminal; self.n_envs];
            let truncated = vec![end && !self.terminal; self.n_envs];
            let next_obs = self.draw();
            let step = Chunk::from_step(
                ObsRef::F32(&self.obs),
                &out.actions,
                &out.log_probs,
                &out.values,
                &rewards,
                &terminated,
                &truncated,
                ObsRef::F32(&next_obs),
            );
            agent.observe(std::slice::from_ref(&step)).unwrap();
            self.env_steps += self.n_envs as u64;
            let progress = Progress { env_steps: self.env_steps, total_env_steps: total };
            metrics.extend(agent.update(&progress).unwrap());
            self.obs = next_obs;
        }
        metrics
    }
}

/// Random transition rows for one `train_on` step: `(obs, actions, rewards, bootstrap, next_obs)`, `b` rows of
/// `obs_dim` observations and `act_dim` actions in `[−1, 1]`.
pub(crate) fn random_rows(seed: u64, b: usize, obs_dim: usize, act_dim: usize) -> [Vec<f32>; 5] {
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (obs, actions, rewards, next_obs) = (draw(b * obs_dim), draw(b * act_dim), draw(b), draw(b * obs_dim));
    [obs, actions, rewards, vec![0.99; b], next_obs]
}

/// The cosine between two parameter changes from the same start, `a − before` and `b − before` (1: the same
/// direction): how the tests tell that a mixed-precision step took the f32 step's direction.
pub(crate) fn cosine_of_changes(before: &[f32], a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for ((x0, x), y) in before.iter().zip(a).zip(b) {
        let (da, db) = (f64::from(x - x0), f64::from(y - x0));
        (dot, na, nb) = (dot + da * db, na + da * da, nb + db * db);
    }
    dot / (na.sqrt() * nb.sqrt()).max(1e-30)
}
