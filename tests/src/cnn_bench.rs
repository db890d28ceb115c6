//! The learner benchmarks' shared workload: one PPO update of `examples/configs/pong_ppo.toml`'s shape on a
//! rollout of random u8 frames (8 envs × 128 steps, 4 epochs of 4 minibatches of 256: Nature-CNN forward,
//! backward, gradient clipping, Adam), and the machine's matmul peak to set it against.
use std::time::Instant;

use flotilla_algorithms::algorithm::Replicated;
use flotilla_algorithms::nn::nets::CnnOptions;
use flotilla_algorithms::ppo::{Ppo, PpoConfig};
use flotilla_algorithms::{ActMode, ActOutput, Algorithm, DataParallel, Policy, Progress};
use flotilla_core::{Chunk, ObsRef};
use tch::{Device, Kind, Tensor};

/// Multiply-adds of one Nature-CNN forward pass on 4×84×84 frames with a 7-unit output (6 logits + value).
/// GFLOP/s count the backward pass as twice the forward (the usual estimate): 3 × 2 × this per sample.
pub const NATURE_CNN_FORWARD_MACS: f64 = (32 * 256 * 400 + 64 * 512 * 81 + 64 * 576 * 49 + 3136 * 512 + 512 * 7) as f64;

/// GFLOP/s of `samples_per_sec` Nature-CNN training samples (forward and backward).
pub fn nature_cnn_gflops(samples_per_sec: f64) -> f64 {
    samples_per_sec * 3.0 * 2.0 * NATURE_CNN_FORWARD_MACS / 1e9
}

/// This machine's matmul peak in GFLOP/s for `kind` (f32 or bf16) on the current torch threads (best of a few
/// 1024² products).
pub fn matmul_peak(kind: Kind) -> f64 {
    matmul_peak_on(kind, Device::Cpu)
}

/// Waits for `device`'s queued kernels (CUDA runs asynchronously; a timer must not stop before they finish).
pub use flotilla_algorithms::nn::phases::synchronize;

/// [`matmul_peak`] on `device`: 1024² products on the CPU, 8192² on a GPU (large enough to fill it).
pub fn matmul_peak_on(kind: Kind, device: Device) -> f64 {
    let n = if device.is_cuda() { 8192i64 } else { 1024 };
    let (a, b) = (Tensor::randn([n, n], (kind, device)), Tensor::randn([n, n], (kind, device)));
    let _ = a.matmul(&b);
    synchronize(device);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..4 {
            let _ = a.matmul(&b);
        }
        synchronize(device);
        best = best.max(4.0 * 2.0 * (n * n * n) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// A PPO agent of pong_ppo.toml's shape and the random frames it trains on.
pub struct PongPpoUpdate {
    ppo: Ppo,
    frames: Vec<u8>,
    device: Device,
}

impl PongPpoUpdate {
    /// Envs × steps per rollout.
    pub const N_ENVS: usize = 8;
    /// Steps per env per rollout.
    pub const N_STEPS: usize = 128;
    /// Epochs per update: each sample is trained on this many times.
    pub const EPOCHS: usize = 4;

    /// The agent (seed 1) with `cnn`'s options on `device`; `parallel` spreads its updates (data-parallel,
    /// accumulation).
    pub fn new(cnn: CnnOptions, parallel: Option<DataParallel>, device: Device) -> flotilla_algorithms::Result<Self> {
        let shape = vec![4usize, 84, 84];
        let dim: usize = shape.iter().product();
        let obs_space = flotilla_core::Space::Box {
            low: vec![0.0; dim],
            high: vec![255.0; dim],
            shape,
            dtype: flotilla_core::DType::U8,
        };
        let config = PpoConfig {
            n_steps: Self::N_STEPS,
            batch_size: 256,
            n_epochs: Self::EPOCHS,
            gamma: 0.99,
            gae_lambda: 0.95,
            learning_rate: 2.5e-4,
            clip_range: 0.1,
            anneal_clip_range: false,
            clip_range_vf: Some(0.1),
            ent_coef: 0.01,
            cnn,
            ..PpoConfig::default()
        };
        let act_space = flotilla_core::Space::discrete(6);
        let mut ppo = Ppo::new(&obs_space, &act_space, Self::N_ENVS, config, device, 1)?;
        if let Some(parallel) = parallel {
            ppo.set_data_parallel(parallel)?;
        }
        let frames: Vec<u8> = (0..Self::N_ENVS * dim).map(|i| (i * 7 % 251) as u8).collect();
        Ok(PongPpoUpdate { ppo, frames, device })
    }

    /// Samples one update trains on (each counted once per epoch).
    pub fn samples_per_update() -> usize {
        Self::EPOCHS * Self::N_ENVS * Self::N_STEPS
    }

    /// Collect a rollout (acting on the frames), then time one update: its seconds.
    pub fn timed_update(&mut self) -> flotilla_algorithms::Result<f64> {
        let (rewards, flags) = (vec![0.0f32; Self::N_ENVS], vec![false; Self::N_ENVS]);
        let mut out = ActOutput::default();
        for _ in 0..Self::N_STEPS {
            self.ppo.act(ObsRef::U8(&self.frames), ActMode::Explore, &mut out)?;
            let step = Chunk::from_step(
                ObsRef::U8(&self.frames),
                &out.actions,
                &out.log_probs,
                &out.values,
                &rewards,
                &flags,
                &flags,
                ObsRef::U8(&self.frames),
            );
            self.ppo.observe(std::slice::from_ref(&step))?;
        }
        synchronize(self.device);
        let start = Instant::now();
        let updated = self.ppo.update(&Progress { env_steps: 0, total_env_steps: 1 })?;
        synchronize(self.device);
        if updated.is_none() {
            return Err(flotilla_algorithms::Error::Unsupported("a full rollout did not update".into()));
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Samples/s over `rounds` updates after a warm-up one (median update time).
    pub fn samples_per_sec(&mut self, rounds: usize) -> flotilla_algorithms::Result<f64> {
        self.timed_update()?;
        let mut times = (0..rounds.max(1)).map(|_| self.timed_update()).collect::<Result<Vec<_>, _>>()?;
        times.sort_by(f64::total_cmp);
        Ok(Self::samples_per_update() as f64 / times[times.len() / 2])
    }
}
