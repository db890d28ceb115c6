//! Observation and reward normalisation around any agent (`[normalize]`), as SB3's `VecNormalize` does it
//! (and Gymnasium's `NormalizeObservation` / `NormalizeReward`):
//!
//! * observations: running mean and variance per element (from a count of 1e-4, Chan et al.'s parallel
//!   update), each observation becoming `clip((x − μ) / √(σ² + ε), −clip_obs, clip_obs)`;
//! * rewards: divided by the running standard deviation of the discounted return `G ← γ G + r` (kept per env
//!   and actor, reset where an episode ends), then clipped to `±clip_reward`.
//!
//! Where the statistics live: the learner's [`Normalized`] agent updates them from the chunks it observes —
//! each chunk is normalised with the statistics as they stood when it arrived (those the acting policy used in
//! a single process), then the statistics take in its raw observations. Acting, evaluation and teaching only
//! read them (evaluation is frozen). The observation statistics travel as two more tensors of the policy's
//! parameters (`obs_rms.mean`, `obs_rms.var`, f32): in every broadcast to actors (whose acting policy is a
//! [`NormalizedPolicy`]), in `model.safetensors` (so `flotilla eval` and `act` read raw observations) and in
//! the export, where they become a diagonal `nn.Linear` and an `nn.Hardtanh` in front of the network. The
//! learner's own acting normalises with those same f32 values, so actors act exactly as it does. The f64
//! statistics and the returns are in the checkpoint: a resumed run continues bit for bit.
use std::collections::BTreeMap;
use std::path::Path;

use flotilla_core::{Chunk, DType, ObsBuf, ObsRef, Space};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::acting::{Acting, ActingPolicy, load_flat};
use crate::algorithm::Algorithm;
use crate::checkpoint::Checkpoint;
use crate::error::Checks;
use crate::export::{Architecture, ObsNorm};
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy, f32_obs, not_f32};
use crate::progress::Progress;
use crate::teaching::Teaching;
use crate::{Error, Metrics, Result};

/// `[normalize]`: normalise observations and rewards around the run's agent (the section's presence turns it
/// on; SB3's `VecNormalize` defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NormalizeConfig {
    /// Normalise observations by their running mean and variance.
    pub obs: bool,
    /// Scale rewards by the running standard deviation of the discounted return.
    pub reward: bool,
    /// Normalised observations are clipped to `±clip_obs`.
    pub clip_obs: f64,
    /// Scaled rewards are clipped to `±clip_reward`.
    pub clip_reward: f64,
    /// Added to the variances under the square roots.
    pub epsilon: f64,
    /// The discount of the return whose standard deviation scales rewards (the algorithm's γ, as a rule).
    pub gamma: f64,
}

impl Default for NormalizeConfig {
    fn default() -> Self {
        NormalizeConfig { obs: true, reward: true, clip_obs: 10.0, clip_reward: 10.0, epsilon: 1e-8, gamma: 0.99 }
    }
}

impl NormalizeConfig {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<()> {
        Checks::of("normalize")
            .positive("clip_obs", self.clip_obs)
            .positive("clip_reward", self.clip_reward)
            .positive("epsilon", self.epsilon)
            .unit("gamma", self.gamma)
            .done()
    }
}

/// Running mean and variance of vectors (SB3's `RunningMeanStd`): the population variance, merged batch by
/// batch with Chan et al.'s parallel update, starting from mean 0, variance 1 and a count of 1e-4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningMeanStd {
    /// Per-element means.
    pub mean: Vec<f64>,
    /// Per-element (population) variances.
    pub var: Vec<f64>,
    /// Vectors seen (plus the starting 1e-4).
    pub count: f64,
}

impl RunningMeanStd {
    /// Statistics of `dim`-element vectors, before any.
    pub fn new(dim: usize) -> Self {
        RunningMeanStd { mean: vec![0.0; dim], var: vec![1.0; dim], count: 1e-4 }
    }

    /// Take in `rows` vectors, element `k` of row `r` being `x(r, k)`.
    pub fn update(&mut self, rows: usize, x: impl Fn(usize, usize) -> f64) {
        if rows == 0 {
            return;
        }
        let n = rows as f64;
        let total = self.count + n;
        for k in 0..self.mean.len() {
            let batch_mean = (0..rows).map(|r| x(r, k)).sum::<f64>() / n;
            let batch_var = (0..rows).map(|r| (x(r, k) - batch_mean).powi(2)).sum::<f64>() / n;
            let delta = batch_mean - self.mean[k];
            let m2 = self.var[k] * self.count + batch_var * n + delta * delta * self.count * n / total;
            self.mean[k] += delta * n / total;
            self.var[k] = m2 / total;
        }
        self.count = total;
    }
}

/// Acting's normalisation and the parameters that carry it: the policy's parameters with the f32 observation
/// statistics after them (`obs_rms.mean`, `obs_rms.var`: what a broadcast sends and `model.safetensors` holds),
/// and `clamp((x − μ) / √(σ² + ε), −c, c)` per element from those very values.
struct ObsScale {
    mirror: FlatParams,
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    clip: f32,
    epsilon: f32,
}

impl ObsScale {
    /// A copy of `policy` (its architecture metadata gaining the normalisation) and statistics before any, for
    /// the observations normalisation can take: a float `Box` (frames are scaled by the network already).
    fn new(policy: &FlatParams, observation_space: &Space, c: &NormalizeConfig) -> Result<Self> {
        let Space::Box { dtype: DType::F32, .. } = observation_space else {
            return Err(Error::Unsupported(format!(
                "[normalize] obs needs float Box observations, not {observation_space:?} (image frames are scaled \
                 by the network; set obs = false)"
            )));
        };
        let dim = observation_space.flat_dim();
        let mut named: Vec<(String, Tensor)> = policy
            .names()
            .enumerate()
            .map(|(i, n)| (n.to_string(), policy.view(i).detach().to_device(tch::Device::Cpu).copy()))
            .collect();
        named.push(("obs_rms.mean".into(), Tensor::zeros([dim as i64], (tch::Kind::Float, tch::Device::Cpu))));
        named.push(("obs_rms.var".into(), Tensor::ones([dim as i64], (tch::Kind::Float, tch::Device::Cpu))));
        let mut mirror = FlatParams::new(named, policy.flat().device());
        if let Some(mut arch) = Architecture::from_metadata("the policy", policy.metadata())? {
            arch.obs_norm = Some(ObsNorm { clip: c.clip_obs, epsilon: c.epsilon });
            mirror.set_metadata(arch.to_metadata());
        }
        let epsilon = c.epsilon as f32;
        let inv_std = vec![1.0 / (1.0 + epsilon).sqrt(); dim];
        Ok(ObsScale { mirror, mean: vec![0.0; dim], inv_std, clip: c.clip_obs as f32, epsilon })
    }

    /// Acting's scale from statistics laid out as the mirror's tail: `dim` means, then `dim` variances.
    fn set(&mut self, stats: &[f32]) {
        let (mean, var) = stats.split_at(self.mean.len());
        self.mean.copy_from_slice(mean);
        for (s, v) in self.inv_std.iter_mut().zip(var) {
            *s = 1.0 / (v + self.epsilon).sqrt();
        }
    }

    /// `src` (whole rows of `mean.len()`) normalised into `dst` (cleared first, its capacity kept).
    fn apply_into(&self, src: &[f32], dst: &mut Vec<f32>) {
        dst.clear();
        for row in src.chunks_exact(self.mean.len()) {
            let scaled = row.iter().zip(&self.mean).zip(&self.inv_std);
            dst.extend(scaled.map(|((v, m), s)| ((v - m) * s).clamp(-self.clip, self.clip)));
        }
    }
}

/// The checkpointed state of the statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct State {
    obs: Option<RunningMeanStd>,
    ret: Option<RunningMeanStd>,
    /// `(actor, env, G)`: each env's discounted return so far.
    returns: Vec<(u64, usize, f64)>,
}

/// A learning agent with its observations and rewards normalised (see the module's doc).
pub struct Normalized {
    inner: Box<dyn Algorithm>,
    config: NormalizeConfig,
    obs_rms: Option<RunningMeanStd>,
    ret_rms: Option<RunningMeanStd>,
    returns: BTreeMap<(u64, usize), f64>,
    /// Acting's normalisation and the parameters that carry it (with `obs`).
    scale: Option<ObsScale>,
    dim: usize,
    scratch: Vec<f32>,
}

impl Normalized {
    /// `inner`, built for `observation_space`, with normalisation as `config` says.
    pub fn new(inner: Box<dyn Algorithm>, config: &NormalizeConfig, observation_space: &Space) -> Result<Self> {
        config.validate()?;
        let dim = observation_space.flat_dim();
        let scale =
            if config.obs { Some(ObsScale::new(inner.policy_params(), observation_space, config)?) } else { None };
        let mut agent = Normalized {
            obs_rms: config.obs.then(|| RunningMeanStd::new(dim)),
            ret_rms: config.reward.then(|| RunningMeanStd::new(1)),
            returns: BTreeMap::new(),
            scale,
            config: config.clone(),
            dim,
            scratch: Vec::new(),
            inner,
        };
        agent.sync();
        Ok(agent)
    }

    /// The mirror after the inner parameters or the statistics changed: the inner policy's values, then the
    /// f32 statistics, and acting's scale from those.
    fn sync(&mut self) {
        if let Some(scale) = &self.scale {
            let inner = self.inner.policy_params().flat();
            tch::no_grad(|| scale.mirror.flat().narrow(0, 0, inner.numel() as i64).copy_(inner));
        }
        self.sync_stats();
    }

    /// The mirror's statistics after they changed (the inner parameters did not), and acting's scale from them.
    fn sync_stats(&mut self) {
        if let (Some(scale), Some(rms)) = (&mut self.scale, &self.obs_rms) {
            let stats: Vec<f32> = rms.mean.iter().chain(&rms.var).map(|&x| x as f32).collect();
            let (flat, n) = (scale.mirror.flat(), stats.len() as i64);
            tch::no_grad(|| {
                flat.narrow(0, flat.numel() as i64 - n, n).copy_(&Tensor::from_slice(&stats).to_device(flat.device()))
            });
            scale.set(&stats);
        }
    }

    /// A chunk as the inner agent takes it: observations normalised with the current statistics, rewards scaled
    /// by the return's (which take in this chunk's returns step by step).
    fn normalize_chunk(&mut self, chunk: &Chunk) -> Result<Chunk> {
        chunk.check_lengths(chunk.n_envs, self.dim, self.inner.act_dim(), false)?;
        let mut c = chunk.clone();
        if let Some(scale) = &self.scale {
            // Each buffer of the copy refilled from the chunk's own (checked above to be whole rows).
            let pairs = [
                (&chunk.obs, &mut c.obs),
                (&chunk.bootstrap_obs, &mut c.bootstrap_obs),
                (&chunk.final_obs, &mut c.final_obs),
            ];
            for (src, dst) in pairs {
                match (src, dst) {
                    (ObsBuf::F32(x), ObsBuf::F32(y)) => scale.apply_into(x, y),
                    (other, _) => return Err(not_f32("normalize", other.as_ref())),
                }
            }
        }
        if let Some(ret) = &mut self.ret_rms {
            let (e, gamma, clip, eps) = (c.n_envs, self.config.gamma, self.config.clip_reward, self.config.epsilon);
            let mut step = vec![0.0; e];
            for t in 0..c.n_steps {
                for (i, g) in step.iter_mut().enumerate() {
                    let ret = self.returns.entry((c.actor_id, i)).or_insert(0.0);
                    *ret = *ret * gamma + f64::from(c.rewards[t * e + i]);
                    *g = *ret;
                }
                ret.update(e, |r, _| step[r]);
                let std = (ret.var[0] + eps).sqrt();
                for i in 0..e {
                    let j = t * e + i;
                    c.rewards[j] = (f64::from(c.rewards[j]) / std).clamp(-clip, clip) as f32;
                    if c.terminated[j] || c.truncated[j] {
                        self.returns.insert((c.actor_id, i), 0.0);
                    }
                }
            }
        }
        Ok(c)
    }
}

/// `obs` as the inner policy takes it: normalised into `scratch` by `scale`, if any. A batch that is not whole
/// rows is refused here, as the inner network would refuse it.
fn scaled<'a>(scale: Option<&ObsScale>, obs: ObsRef<'a>, scratch: &'a mut Vec<f32>) -> Result<ObsRef<'a>> {
    let Some(scale) = scale else { return Ok(obs) };
    let (x, dim) = (f32_obs("normalize", obs)?, scale.mean.len());
    if x.is_empty() || !x.len().is_multiple_of(dim) {
        return Err(Error::length("observation batch", x.len(), dim));
    }
    scale.apply_into(x, scratch);
    Ok(ObsRef::F32(scratch))
}

/// [`Policy`] for a wrapper acting through its `inner` policy on observations normalised by its `scale` (an
/// `Option` in [`Normalized`], always there in [`NormalizedPolicy`]: `Option::from` takes either).
macro_rules! scaled_policy {
    ($wrapper:ty) => {
        impl Policy for $wrapper {
            fn obs_dim(&self) -> usize {
                self.inner.obs_dim()
            }

            fn act_dim(&self) -> usize {
                self.inner.act_dim()
            }

            fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
                let obs = scaled(Option::from(&self.scale), obs, &mut self.scratch)?;
                self.inner.act(obs, mode, out)
            }

            fn state_dim(&self) -> usize {
                self.inner.state_dim()
            }

            fn state_bounded(&self) -> usize {
                self.inner.state_bounded()
            }

            fn act_with_state(
                &mut self,
                obs: ObsRef<'_>,
                state: &mut [f32],
                mode: ActMode,
                out: &mut ActOutput,
            ) -> Result<()> {
                let obs = scaled(Option::from(&self.scale), obs, &mut self.scratch)?;
                self.inner.act_with_state(obs, state, mode, out)
            }
        }
    };
}

scaled_policy!(Normalized);
scaled_policy!(NormalizedPolicy);

impl Algorithm for Normalized {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        let normed = chunks.iter().map(|c| self.normalize_chunk(c)).collect::<Result<Vec<_>>>()?;
        self.inner.observe(&normed)?;
        if let Some(rms) = &mut self.obs_rms {
            let d = self.dim;
            for c in chunks {
                let x = f32_obs("normalize", c.obs.as_ref())?;
                rms.update(x.len() / d, |r, k| f64::from(x[r * d + k]));
            }
            self.sync_stats();
        }
        Ok(())
    }

    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        let metrics = self.inner.update(progress)?;
        if metrics.is_some() {
            self.sync();
        }
        Ok(metrics)
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = self.inner.checkpoint()?;
        let returns = self.returns.iter().map(|(&(a, e), &g)| (a, e, g)).collect();
        c.put_meta("normalize", &State { obs: self.obs_rms.clone(), ret: self.ret_rms.clone(), returns })?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        let state: State = c.meta("normalize").map_err(|e| {
            Error::Checkpoint(format!("{e}: the checkpoint has no [normalize] statistics (a run trained without it?)"))
        })?;
        if (state.obs.is_some(), state.ret.is_some()) != (self.config.obs, self.config.reward) {
            return Err(Error::Checkpoint(
                "the checkpoint's [normalize] obs / reward settings differ from this run's".into(),
            ));
        }
        self.inner.restore(c)?;
        self.obs_rms = state.obs;
        self.ret_rms = state.ret;
        self.returns = state.returns.into_iter().map(|(a, e, g)| ((a, e), g)).collect();
        self.sync();
        Ok(())
    }

    /// The inner policy's parameters and, with `obs`, the observation statistics.
    fn policy_params(&self) -> &FlatParams {
        self.scale.as_ref().map_or_else(|| self.inner.policy_params(), |s| &s.mirror)
    }

    /// The inner policy's parameters (transfer initialises and freezes those).
    fn policy_params_mut(&mut self) -> &mut FlatParams {
        self.inner.policy_params_mut()
    }

    fn policy_params_changed(&mut self) {
        self.inner.policy_params_changed();
        self.sync();
    }

    /// Weights saved by `save_weights` (the mirror): the inner policy's, and the statistics acting reads.
    fn load_weights(&mut self, path: &Path) -> Result<()> {
        let Some(scale) = &mut self.scale else { return self.inner.load_weights(path) };
        scale.mirror.load(path)?;
        let n = self.inner.policy_params().numel();
        let head = scale.mirror.flat().narrow(0, 0, n).copy();
        tch::no_grad(|| self.inner.policy_params_mut().flat().shallow_clone().copy_(&head));
        self.inner.policy_params_changed();
        let stats =
            Vec::<f32>::try_from(scale.mirror.flat().narrow(0, n, 2 * self.dim as i64).to_device(tch::Device::Cpu))?;
        if let Some(rms) = &mut self.obs_rms {
            let (mean, var) = stats.split_at(self.dim);
            rms.mean = mean.iter().map(|&x| f64::from(x)).collect();
            rms.var = var.iter().map(|&x| f64::from(x)).collect();
        }
        scale.set(&stats);
        Ok(())
    }

    fn teach(&mut self, obs: ObsRef<'_>) -> Result<Teaching> {
        let obs = scaled(self.scale.as_ref(), obs, &mut self.scratch)?;
        self.inner.teach(obs)
    }
}

/// An actor's acting policy with the observation statistics its broadcasts carry (see the module's doc).
pub struct NormalizedPolicy {
    inner: Box<dyn ActingPolicy>,
    scale: ObsScale,
    scratch: Vec<f32>,
}

impl NormalizedPolicy {
    /// `inner` acting on normalised observations of `observation_space`.
    pub fn new(inner: Box<dyn ActingPolicy>, config: &NormalizeConfig, observation_space: &Space) -> Result<Self> {
        config.validate()?;
        let scale = ObsScale::new(inner.params(), observation_space, config)?;
        Ok(NormalizedPolicy { inner, scale, scratch: Vec::new() })
    }
}

impl ActingPolicy for NormalizedPolicy {
    fn params(&self) -> &FlatParams {
        &self.scale.mirror
    }

    fn load_params(&mut self, values: &[f32]) -> Result<()> {
        load_flat(&self.scale.mirror, values)?;
        let n = self.inner.n_params();
        self.inner.load_params(&values[..n])?;
        self.scale.set(&values[n..]);
        Ok(())
    }

    fn set_progress(&mut self, progress: &Progress) {
        self.inner.set_progress(progress);
    }
}

/// The run's learning agent with normalisation, where `[normalize]` asks for it.
pub fn wrap_learner(
    agent: Box<dyn Algorithm>,
    config: Option<&NormalizeConfig>,
    observation_space: &Space,
) -> Result<Box<dyn Algorithm>> {
    let Some(c) = config else { return Ok(agent) };
    Ok(Box::new(Normalized::new(agent, c, observation_space)?))
}

/// An actor's acting policy with normalisation, where `[normalize]` asks for it (A3C's gradient workers
/// cannot: their gradients are the learner's, on its own observations).
pub fn wrap_acting(acting: Acting, config: Option<&NormalizeConfig>, observation_space: &Space) -> Result<Acting> {
    match (config, acting) {
        (None, acting) => Ok(acting),
        (Some(c), Acting::Chunks(p)) if c.obs => {
            Ok(Acting::Chunks(Box::new(NormalizedPolicy::new(p, c, observation_space)?)))
        }
        (Some(_), Acting::Chunks(p)) => Ok(Acting::Chunks(p)),
        (Some(_), Acting::Gradients(_)) => Err(Error::Unsupported(
            "[normalize] with A3C: its actors' gradients cannot see the learner's statistics".into(),
        )),
    }
}

#[cfg(test)]
impl Normalized {
    /// The observation statistics (with `obs`).
    pub(crate) fn obs_rms(&self) -> Option<&RunningMeanStd> {
        self.obs_rms.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acting::ActingSetup;
    use crate::continuous::bandit::{Bandit, spaces};
    use crate::registry::AlgorithmConfig;
    use crate::sac::SacConfig;

    fn rows(seed: u64, n: usize, d: usize) -> Vec<f32> {
        (0..n * d).map(|i| ((i as u64 * 7919 + seed * 104_729) % 1000) as f32 / 100.0 - 3.0 + (i % d) as f32).collect()
    }

    /// Each number of `[normalize]` is checked by name: a clip or ε that is not finite and positive, a discount
    /// outside `[0, 1]`.
    #[test]
    fn bad_settings_are_refused_by_name() {
        type Edit = fn(&mut NormalizeConfig);
        let edits: [(&str, Edit); 5] = [
            ("clip_obs", |c| c.clip_obs = 0.0),
            ("clip_reward", |c| c.clip_reward = f64::INFINITY),
            ("epsilon", |c| c.epsilon = f64::NAN),
            ("gamma", |c| c.gamma = 1.5),
            ("gamma", |c| c.gamma = f64::NAN),
        ];
        assert!(NormalizeConfig::default().validate().is_ok());
        for (field, edit) in edits {
            let mut c = NormalizeConfig::default();
            edit(&mut c);
            let error = c.validate().expect_err(field).to_string();
            assert!(error.contains(&format!("normalize config: {field} =")), "{error}");
        }
    }

    /// Acting's normalisation is `clamp((x − μ)·s, −c, c)` element by element over whole rows, and a batch that is
    /// not whole rows is refused by length rather than cut short.
    #[test]
    fn acting_normalises_whole_rows_and_refuses_partial_ones() {
        let mirror = FlatParams::new(
            vec![("w".into(), Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu)))],
            tch::Device::Cpu,
        );
        let scale = ObsScale { mirror, mean: vec![1.0, -2.0], inv_std: vec![0.5, 4.0], clip: 3.0, epsilon: 1e-8 };
        let x = [3.0f32, -2.5, -9.0, 0.0, 1.0, -2.0];
        let mut scratch = vec![7.0; 11];
        let expected = [1.0, -2.0, -3.0, 3.0, 0.0, 0.0];
        assert_eq!(scaled(Some(&scale), ObsRef::F32(&x), &mut scratch).unwrap().as_f32().unwrap(), expected);
        for bad in [&x[..5], &x[..0]] {
            let err = scaled(Some(&scale), ObsRef::F32(bad), &mut scratch).unwrap_err().to_string();
            assert!(err.contains("observation batch") && err.contains(&format!("got {}", bad.len())), "{err}");
        }
        let frames = [0u8; 4];
        assert!(scaled(Some(&scale), ObsRef::U8(&frames), &mut scratch).is_err());
    }

    /// Merging batches one after the other gives the statistics of all of them at once, with SB3's prior (a
    /// count of 1e-4 at mean 0, variance 1) as one more pseudo-batch.
    #[test]
    fn running_statistics_merge_batches_exactly() {
        let (d, x) = (3, rows(1, 50, 3));
        let mut merged = RunningMeanStd::new(d);
        for part in x.chunks(d * 10) {
            merged.update(part.len() / d, |r, k| f64::from(part[r * d + k]));
        }
        let mut once = RunningMeanStd::new(d);
        once.update(50, |r, k| f64::from(x[r * d + k]));
        for k in 0..d {
            let col: Vec<f64> = (0..50).map(|r| f64::from(x[r * d + k])).collect();
            let n = 50.0;
            let (m, c0) = (col.iter().sum::<f64>() / n, 1e-4);
            let v = col.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
            let total = c0 + n;
            let (mean, var) = (n * m / total, (c0 + n * v + c0 * n * m * m / total) / total);
            for rms in [&merged, &once] {
                assert!(
                    (rms.mean[k] - mean).abs() < 1e-9 && (rms.var[k] - var).abs() < 1e-9,
                    "{rms:?} vs {mean} {var}"
                );
            }
        }
        assert!((merged.count - 50.0001).abs() < 1e-9);
    }

    fn sac_config() -> AlgorithmConfig {
        AlgorithmConfig::Sac(SacConfig {
            batch_size: 32,
            buffer_size: 1_000,
            learning_starts: 64,
            hidden_sizes: vec![32, 32],
            ..SacConfig::default()
        })
    }

    fn normalized(config: &AlgorithmConfig, n_envs: usize, seed: u64) -> Normalized {
        let (o, a) = spaces();
        let inner = config.build_learner(&o, &a, n_envs, tch::Device::Cpu, seed).unwrap();
        Normalized::new(inner, &NormalizeConfig { gamma: 0.9, ..Default::default() }, &o).unwrap()
    }

    /// Rewards reach the agent divided by the running standard deviation of each env's discounted return (reset
    /// where its episode ends) and clipped; observations by their statistics before the chunk, which then take
    /// it in.
    #[test]
    fn chunks_reach_the_agent_normalised() {
        let mut agent = normalized(&sac_config(), 2, 1);
        let (obs, next) = (rows(2, 2, 2), rows(3, 2, 2));
        let chunk = |rewards: [f32; 2], ended: [bool; 2]| {
            Chunk::from_step(
                ObsRef::F32(&obs),
                &[0.5, -0.5],
                &[],
                &[],
                &rewards,
                &ended,
                &[false, false],
                ObsRef::F32(&next),
            )
        };
        let first = agent.normalize_chunk(&chunk([1.0, 2.0], [false, true])).unwrap();
        // Before any statistics: x / √(1 + ε), clipped.
        for (a, b) in first.obs.as_ref().as_f32().unwrap().iter().zip(&obs) {
            assert!((a - (b / (1.0f32 + 1e-8).sqrt()).clamp(-10.0, 10.0)).abs() < 1e-6);
        }
        let mut ret = RunningMeanStd::new(1);
        ret.update(2, |r, _| [1.0, 2.0][r]);
        let std = (ret.var[0] + 1e-8).sqrt();
        assert!((f64::from(first.rewards[0]) - 1.0 / std).abs() < 1e-5, "{:?}", first.rewards);
        // Env 0's return carries on (0.9 · 1 + 3), env 1's was reset by its episode's end.
        let second = agent.normalize_chunk(&chunk([3.0, 3.0], [false, false])).unwrap();
        ret.update(2, |r, _| [0.9 * 1.0 + 3.0, 3.0][r]);
        let std = (ret.var[0] + 1e-8).sqrt();
        assert!((f64::from(second.rewards[1]) - 3.0 / std).abs() < 1e-5, "{:?}", second.rewards);
        assert_eq!(agent.returns[&(0, 0)], 0.9 * 1.0 + 3.0);
        // observe() normalises with the statistics as they stand, then takes the raw observations in.
        agent.observe(std::slice::from_ref(&chunk([0.0, 0.0], [false, false]))).unwrap();
        let rms = agent.obs_rms().unwrap();
        assert!((rms.mean[0] - f64::from(obs[0] + obs[2]) / 2.0).abs() < 1e-3, "{rms:?}");
    }

    /// The actor's acting policy, given the learner's broadcast (the policy and the statistics), acts exactly as
    /// the learner; a resumed learner continues bit for bit.
    #[test]
    fn actors_act_as_the_learner_and_resume_is_exact() {
        let config = sac_config();
        let mut agent = normalized(&config, 2, 4);
        let mut env = Bandit::new(4, 2, 7, false);
        env.drive(&mut agent, 120, 1_000);
        let (o, a) = spaces();
        let setup = ActingSetup {
            observation_space: &o,
            action_space: &a,
            n_envs: 2,
            seed: 9,
            epsilon_floor: 0.0,
            frozen: &[],
        };
        let norm = NormalizeConfig { gamma: 0.9, ..Default::default() };
        let Acting::Chunks(mut policy) = wrap_acting(config.build_acting(&setup).unwrap(), Some(&norm), &o).unwrap()
        else {
            panic!("an acting policy")
        };
        let flat = Vec::<f32>::try_from(agent.policy_params().flat().detach()).unwrap();
        policy.load_params(&flat).unwrap();
        let x = [3.0f32, -2.0, 0.4, 9.0];
        let (mut want, mut got) = (ActOutput::default(), ActOutput::default());
        agent.act(ObsRef::F32(&x), ActMode::Deterministic, &mut want).unwrap();
        policy.act(ObsRef::F32(&x), ActMode::Deterministic, &mut got).unwrap();
        assert_eq!(want.actions, got.actions);
        assert!(policy.load_params(&flat[1..]).is_err());

        let path = std::env::temp_dir().join(format!("flotilla-normalize-ckpt-{}.safetensors", std::process::id()));
        agent.checkpoint().unwrap().save(&path).unwrap();
        let mut back = normalized(&config, 2, 99);
        back.restore(&mut Checkpoint::load(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut env_copy = env.clone();
        assert_eq!(env.drive(&mut agent, 40, 1_000), env_copy.drive(&mut back, 40, 1_000));
        assert_eq!((&agent.obs_rms, &agent.ret_rms, &agent.returns), (&back.obs_rms, &back.ret_rms, &back.returns));
        let values = |a: &Normalized| Vec::<f32>::try_from(a.policy_params().flat().detach()).unwrap();
        assert_eq!(values(&agent), values(&back));
        // A checkpoint without statistics is refused by name.
        let plain = config.build_learner(&o, &a, 2, tch::Device::Cpu, 1).unwrap();
        let err = back.restore(&mut plain.checkpoint().unwrap()).unwrap_err().to_string();
        assert!(err.contains("[normalize]"), "{err}");
    }

    /// `model.safetensors` of a normalised agent carries the statistics; its export takes raw observations and
    /// gives the agent's deterministic actions.
    #[test]
    fn the_export_folds_the_statistics_in() {
        let config = sac_config();
        let mut agent = normalized(&config, 1, 2);
        Bandit::new(2, 1, 5, false).drive(&mut agent, 100, 1_000);
        let dir = std::env::temp_dir().join(format!("flotilla-normalize-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        agent.save_weights(&path).unwrap();
        let (tensors, meta) = crate::export::read_safetensors(&path).unwrap();
        let arch = Architecture::from_metadata("test", &meta).unwrap().unwrap();
        assert!(arch.obs_norm.is_some());
        let policy = crate::export::to_pytorch(&arch, &tensors).unwrap();
        let x = [3.0f32, -2.0, 0.4, 9.0, -30.0, 1.0];
        let mut want = ActOutput::default();
        agent.act(ObsRef::F32(&x), ActMode::Deterministic, &mut want).unwrap();
        let y = Vec::<f32>::try_from(policy.forward(&Tensor::from_slice(&x).view([3, 2])).flatten(0, -1)).unwrap();
        for (g, w) in y.iter().zip(&want.actions) {
            assert!((g - w).abs() < 1e-5, "exported {y:?}, agent {:?}", want.actions);
        }
        // A fresh agent loading the file acts the same (flotilla eval / act).
        let mut fresh = normalized(&config, 1, 77);
        fresh.load_weights(&path).unwrap();
        let mut got = ActOutput::default();
        fresh.act(ObsRef::F32(&x), ActMode::Deterministic, &mut got).unwrap();
        assert_eq!(got.actions, want.actions);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
