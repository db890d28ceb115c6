//! What an update does differently when several learners train one model, and when one optimiser step
//! accumulates several micro-batches.
//!
//! Synchronous data-parallel training (DD-PPO style): every replica computes the gradient of its own batch,
//! [`GradientSync::mean_gradient`] averages it over the replicas (one all-reduce, `flotilla-collective`), and
//! every replica takes the same step, so they stay identical. Whole-batch statistics (advantage normalisation,
//! PPO's KL early stop) are taken over the union of the replicas' batches ([`GradientSync::sum`]), so L replicas
//! with batch B step exactly as one learner with batch L·B.
//!
//! Gradient accumulation: with `accumulate = k`, each minibatch is split into k equal micro-batches whose
//! gradients (each loss scaled by 1/k) add up in the flat buffer before the one optimiser step — the same step
//! as one batch, at a k-th of the activation memory.
use tch::Tensor;

use crate::nn::params::FlatParams;
use crate::{Error, Result};

/// Averages gradients and sums statistics over the replicas of a data-parallel group.
pub trait GradientSync: Send {
    /// Replace `grad` (a flat f32 gradient buffer) with its mean over all replicas. `slot` names the parameter
    /// set it belongs to (0 for an algorithm with one optimiser; TD3 uses 0 for its critic, 1 for its actor),
    /// so that state a compression keeps between steps (top-k's residual) stays with its own parameters.
    fn mean_gradient(&mut self, slot: usize, grad: &mut Tensor) -> Result<()>;
    /// Sum `values` element-wise over all replicas, in place.
    fn sum(&mut self, values: &mut [f64]) -> Result<()>;
    /// How many replicas take part.
    fn replicas(&self) -> usize;
}

/// How an algorithm's updates are spread: over replicas (optional) and over micro-batches.
pub struct DataParallel {
    sync: Option<Box<dyn GradientSync>>,
    accumulate: usize,
}

impl std::fmt::Debug for DataParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("replicas", &self.replicas())
            .field("accumulate", &self.accumulate)
            .finish()
    }
}

impl Default for DataParallel {
    fn default() -> Self {
        DataParallel { sync: None, accumulate: 1 }
    }
}

impl DataParallel {
    /// Updates synchronised through `sync` (if any), each minibatch in `accumulate` (≥ 1) micro-batches.
    pub fn new(sync: Option<Box<dyn GradientSync>>, accumulate: usize) -> Result<Self> {
        if accumulate == 0 {
            return Err(Error::Unsupported("accumulate = 0: a step needs at least one micro-batch".into()));
        }
        Ok(DataParallel { sync, accumulate })
    }

    /// Micro-batches per optimiser step.
    pub fn accumulate(&self) -> usize {
        self.accumulate
    }

    /// Replicas in the group (1 without one).
    pub fn replicas(&self) -> usize {
        self.sync.as_ref().map_or(1, |s| s.replicas())
    }

    /// Check that a minibatch of `batch` samples splits into equal micro-batches.
    pub fn check_batch(&self, algorithm: &'static str, field: &'static str, batch: usize) -> Result<()> {
        if !batch.is_multiple_of(self.accumulate) || batch < self.accumulate {
            return Err(Error::config(
                algorithm,
                field,
                batch,
                format!("must split into accumulate = {} equal micro-batches", self.accumulate),
            ));
        }
        Ok(())
    }

    /// The `(start, length)` of each micro-batch of a minibatch of `n` samples, and the scale of each one's
    /// loss (the minibatch loss is the mean of the micro-batch means).
    pub(crate) fn micro_batches(&self, n: i64) -> (Vec<(i64, i64)>, f64) {
        let k = self.accumulate as i64;
        let len = n / k;
        ((0..k).map(|j| (j * len, len)).collect(), 1.0 / self.accumulate as f64)
    }

    /// Average the accumulated gradient of the parameter set `slot` ([`GradientSync::mean_gradient`]) over the
    /// replicas (nothing to do alone).
    pub(crate) fn reduce_slot(&mut self, slot: usize, params: &mut FlatParams) -> Result<()> {
        if let Some(sync) = &mut self.sync {
            // Frozen layers' gradients (always zero) stay off the wire: only the trainable scalars go.
            let mut grad = params.trainable_grad();
            sync.mean_gradient(slot, &mut grad)?;
            params.set_trainable_grad(&grad)?;
        }
        Ok(())
    }

    /// The mean of `x` over the replicas.
    pub(crate) fn mean(&mut self, x: f64) -> Result<f64> {
        match &mut self.sync {
            None => Ok(x),
            Some(sync) => {
                let mut v = [x];
                sync.sum(&mut v)?;
                Ok(v[0] / sync.replicas() as f64)
            }
        }
    }

    /// `(x − mean) / (std + 1e-8)` with the unbiased std over the union of the replicas' `x` (as SB3 does
    /// over one batch).
    pub(crate) fn normalize(&mut self, x: &Tensor) -> Result<Tensor> {
        let Some(sync) = &mut self.sync else {
            return Ok((x - x.mean(tch::Kind::Float)) / (x.std(true) + 1e-8));
        };
        let x64 = x.to_kind(tch::Kind::Double);
        let mut stats = [
            x64.sum(tch::Kind::Double).double_value(&[]),
            x64.square().sum(tch::Kind::Double).double_value(&[]),
            x.numel() as f64,
        ];
        sync.sum(&mut stats)?;
        let [sum, sum_sq, n] = stats;
        let mean = sum / n;
        let var = ((sum_sq - n * mean * mean) / (n - 1.0).max(1.0)).max(0.0);
        Ok((x - mean) / (var.sqrt() + 1e-8))
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{ObsRef, Space};
    use tch::Device;

    use super::*;
    use crate::a2c::A2cConfig;
    use crate::dqn::DqnConfig;
    use crate::policy::{ActMode, ActOutput};
    use crate::ppo::PpoConfig;
    use crate::progress::Progress;
    use crate::registry::AlgorithmConfig;
    use crate::td3::{DdpgConfig, Td3Config};
    use flotilla_core::Chunk;

    /// Two agents of `config` (same seed), the second with `accumulate = k`, trained on the same stream: the
    /// first agent acts, both observe and update. Their parameters must agree to float rounding.
    fn accumulation_matches_one_batch(config: AlgorithmConfig, act_space: Space, k: usize, steps: u64) {
        let obs_space = Space::box1d(vec![-1.0; 4], vec![1.0; 4]);
        let n_envs = 4;
        let build = || config.build_learner(&obs_space, &act_space, n_envs, Device::Cpu, 7).unwrap();
        let (mut one, mut split) = (build(), build());
        split
            .replicated()
            .expect("a kind with data-parallel updates")
            .set_data_parallel(DataParallel::new(None, k).unwrap())
            .unwrap();
        let (mut out, mut scratch) = (ActOutput::default(), ActOutput::default());
        let mut updates = 0;
        let obs_at =
            |t: u64| -> Vec<f32> { (0..n_envs * 4).map(|i| (t as f32 * 0.37 + i as f32 * 1.3).sin()).collect() };
        for t in 0..steps {
            let (obs, next) = (obs_at(t), obs_at(t + 1));
            one.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            // The second agent acts too (its actions unused) so that its RNG, which also shuffles minibatches,
            // stays in step with the first's.
            split.act(ObsRef::F32(&obs), ActMode::Explore, &mut scratch).unwrap();
            let rewards: Vec<f32> = out.actions.iter().zip(&obs).map(|(a, o)| a * o).collect();
            let terminated: Vec<bool> = (0..n_envs).map(|e| (t + e as u64).is_multiple_of(13)).collect();
            let step = Chunk::from_step(
                ObsRef::F32(&obs),
                &out.actions,
                &out.log_probs,
                &out.values,
                &rewards,
                &terminated,
                &[false; 4],
                ObsRef::F32(&next),
            );
            let progress = Progress { env_steps: (t + 1) * n_envs as u64, total_env_steps: steps * n_envs as u64 };
            one.observe(std::slice::from_ref(&step)).unwrap();
            split.observe(std::slice::from_ref(&step)).unwrap();
            let (a, b) = (one.update(&progress).unwrap(), split.update(&progress).unwrap());
            assert_eq!(a.is_some(), b.is_some(), "both update at the same steps");
            updates += a.is_some() as usize;
        }
        assert!(updates >= 3, "{updates} updates");
        let (p, q) = (one.policy_params().flat(), split.policy_params().flat());
        let scale = p.abs().max().double_value(&[]);
        let diff = (p - q).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-5 * scale,
            "{}: accumulate = {k} moved the parameters by {diff} (scale {scale})",
            config.name()
        );
        assert!(!p.equal(&p.zeros_like()), "trained");
    }

    #[test]
    fn accumulated_micro_batches_step_as_one_batch() {
        let ppo = PpoConfig { n_steps: 16, batch_size: 32, n_epochs: 3, hidden_sizes: vec![16], ..Default::default() };
        accumulation_matches_one_batch(AlgorithmConfig::Ppo(ppo), Space::discrete(2), 4, 64);
        let a2c = A2cConfig { n_steps: 8, hidden_sizes: vec![16], normalize_advantage: true, ..Default::default() };
        accumulation_matches_one_batch(AlgorithmConfig::A2c(a2c), Space::discrete(2), 2, 40);
        let dqn = DqnConfig {
            bf16: false,
            learning_starts: 32,
            train_freq: 4,
            gradient_steps: 2,
            batch_size: 32,
            buffer_size: 500,
            target_update_interval: 40,
            hidden_sizes: vec![16],
            ..Default::default()
        };
        accumulation_matches_one_batch(AlgorithmConfig::Dqn(dqn), Space::discrete(2), 4, 120);
        // TD3 with its delayed actor (critic and actor both accumulate); target-action noise off, since the
        // split agent's acting draws from the same generator in a different order.
        let td3 = Td3Config {
            learning_starts: 32,
            batch_size: 32,
            buffer_size: 500,
            policy_delay: 2,
            target_policy_noise: 0.0,
            hidden_sizes: vec![16],
            // f32: bf16's rounding of a row may differ with the matmul's row count (oneDNN's blocking).
            bf16: false,
            ..Default::default()
        };
        let pendulum_like = Space::box1d(vec![-2.0], vec![2.0]);
        accumulation_matches_one_batch(AlgorithmConfig::Td3(td3), pendulum_like.clone(), 4, 60);
        let ddpg = DdpgConfig {
            learning_starts: 32,
            batch_size: 32,
            buffer_size: 500,
            hidden_sizes: vec![16],
            bf16: false,
            ..Default::default()
        };
        accumulation_matches_one_batch(AlgorithmConfig::Ddpg(ddpg), pendulum_like, 2, 60);
    }

    #[test]
    fn batches_that_do_not_split_evenly_are_refused() {
        let (obs_space, act_space) = (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2));
        let ppo = PpoConfig { n_steps: 16, batch_size: 30, ..Default::default() };
        let mut agent = AlgorithmConfig::Ppo(ppo).build_learner(&obs_space, &act_space, 15, Device::Cpu, 1).unwrap();
        let e =
            agent.replicated().unwrap().set_data_parallel(DataParallel::new(None, 4).unwrap()).unwrap_err().to_string();
        assert!(e.contains("batch_size = 30") && e.contains("accumulate = 4"), "{e}");
        assert!(DataParallel::new(None, 0).is_err());
    }
}
