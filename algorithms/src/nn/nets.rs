//! Network torsos: a multi-layer perceptron and the Nature-DQN convolutional torso.
//!
//! Initialisation follows Stable-Baselines3 / CleanRL: orthogonal weights with gain √2 on hidden layers (a
//! caller-chosen gain on the output layer, e.g. 0.01 for policy logits, 1 for values) and zero biases.
use flotilla_core::{DType, Space};
use serde::{Deserialize, Serialize};
use tch::Tensor;
use tch::nn::{self, Init};

pub use crate::nn::activation::Activation;
use crate::nn::host_mlp::{self, HostScratch};

/// Run `build` with libtorch's global generator seeded with `seed`, holding a process-wide lock, so that
/// networks built on several threads at once still get the same weights for the same seed.
pub fn with_torch_seed<T>(seed: u64, build: impl FnOnce() -> T) -> T {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed as i64);
    build()
}

/// How a network takes observations: `[B, obs_dim]` f32 rows for an MLP, `[B, C, H, W]` in the frames' own
/// dtype for the CNN, on `device` (plain data, for the learner's batch-assembly thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObsLayout {
    /// Elements of one observation.
    pub obs_dim: usize,
    /// `[C, H, W]` for a convolutional body (frames are copied as they are; the network scales them).
    pub image: Option<[i64; 3]>,
    /// Where the network lives.
    pub device: tch::Device,
}

impl ObsLayout {
    /// Observations `rows × obs_dim` as the network's input tensor.
    pub fn tensor(&self, obs: flotilla_core::ObsRef<'_>) -> crate::Result<Tensor> {
        let obs_dim = self.obs_dim;
        if obs.is_empty() || !obs.len().is_multiple_of(obs_dim) {
            return Err(crate::Error::length("observation batch", obs.len(), obs_dim));
        }
        let t = match obs {
            flotilla_core::ObsRef::F32(v) => Tensor::from_slice(v),
            flotilla_core::ObsRef::U8(v) => Tensor::from_slice(v),
        };
        Ok(match self.image {
            None => t.view([-1, obs_dim as i64]).to_device(self.device).to_kind(tch::Kind::Float),
            Some([c, h, w]) => t.view([-1, c, h, w]).to_device(self.device),
        })
    }
}

/// Input width of an MLP for this observation space: its size if it is a 1-D box; otherwise an error naming
/// `algorithm` (image observations need a convolutional torso).
pub fn mlp_input_dim(algorithm: &'static str, observation_space: &flotilla_core::Space) -> crate::Result<usize> {
    match observation_space {
        flotilla_core::Space::Box { shape, .. } if shape.len() == 1 => Ok(shape[0]),
        other => Err(crate::Error::space("observation", algorithm, format!("{other:?}: MLP networks take 1-D boxes"))),
    }
}

/// How an MLP's layers are initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LayerInit {
    /// Orthogonal weights (gain √2 on hidden layers, the given gain on the output layer), zero biases: SB3's
    /// on-policy networks.
    Orthogonal {
        /// Gain of the output layer.
        out_gain: f64,
    },
    /// PyTorch's `nn.Linear` default, `U(−1/√fan_in, 1/√fan_in)` for weights and biases: SB3's off-policy
    /// networks (DQN, DDPG, TD3).
    Torch,
}

impl LayerInit {
    /// Weight `[fan_in, fan_out]` (the layout `addmm` takes) and bias `[fan_out]` of one layer.
    fn layer(self, fan_in: i64, fan_out: i64, last: bool) -> (Tensor, Tensor) {
        let cpu = (tch::Kind::Float, tch::Device::Cpu);
        match self {
            LayerInit::Orthogonal { out_gain } => {
                let gain = if last { out_gain } else { 2f64.sqrt() };
                let w = nn::init(Init::Orthogonal { gain }, &[fan_out, fan_in], tch::Device::Cpu);
                (w.transpose(0, 1).contiguous(), Tensor::zeros([fan_out], cpu))
            }
            LayerInit::Torch => {
                let bound = 1.0 / (fan_in as f64).sqrt();
                let w = Tensor::empty([fan_in, fan_out], cpu).uniform_(-bound, bound);
                (w, Tensor::empty([fan_out], cpu).uniform_(-bound, bound))
            }
        }
    }
}

/// An MLP over [`FlatParams`](crate::nn::params::FlatParams): layer `k` is `weight` `[in, out]` and `bias`
/// `[out]`, applied as one `addmm`. Several networks of the same layout (online and target) share one
/// `FlatMlp` and differ only in the parameter buffer they are run with.
#[derive(Debug, Clone)]
pub struct FlatMlp {
    layers: Vec<usize>,
    /// Input width, hidden widths, output width.
    widths: Vec<usize>,
    activation: Activation,
}

impl FlatMlp {
    /// Parameter indices of each layer's weight (its bias follows) and the nonlinearity.
    pub(crate) fn layout(&self) -> (&[usize], Activation) {
        (&self.layers, self.activation)
    }

    /// Initial parameters, named `{prefix}.{k}.weight` / `.bias`, to place in a `FlatParams` at index
    /// `first_index` onwards.
    pub fn init(
        prefix: &str,
        inputs: i64,
        hidden: &[i64],
        outputs: i64,
        activation: Activation,
        init: LayerInit,
        first_index: usize,
    ) -> (Self, Vec<(String, Tensor)>) {
        let layer = |fan_in, fan_out, last| init.layer(fan_in, fan_out, last);
        let (layers, widths, named) = init_layers(prefix, [&[inputs], hidden, &[outputs]].concat(), first_index, layer);
        (FlatMlp { layers, widths, activation }, named)
    }

    /// The network on `x` `[B, inputs]` with the parameters in `params`.
    pub fn forward(&self, params: &crate::nn::params::FlatParams, x: &Tensor) -> Tensor {
        self.forward_in(params, x, false)
    }

    /// [`FlatMlp::forward`] with the hidden layers' matmuls in bf16 where `bf16` (an update's choice, on a CPU with
    /// native bf16: [`cpu_has_native_bf16`]); the output is f32 either way.
    pub(crate) fn forward_in(&self, params: &crate::nn::params::FlatParams, x: &Tensor, bf16: bool) -> Tensor {
        flat_mlp(&self.layers, self.activation, params, x, bf16)
    }

    /// [`FlatMlp::forward`] without libtorch, on `x` (`rows × inputs`, row-major) into `out` (`rows × outputs`),
    /// when `params` live on the CPU; returns false (and leaves `out` alone) when they do not.
    pub fn forward_host(
        &self,
        params: &crate::nn::params::FlatParams,
        x: &[f32],
        rows: usize,
        scratch: &mut HostScratch,
        out: &mut Vec<f32>,
    ) -> bool {
        let Some(v) = params.host_values() else { return false };
        host_mlp::mlp(host_layers(&self.layers, &self.widths, params, v, 0), self.activation, x, rows, scratch, out);
        true
    }
}

/// [`crate::nn::mixed::mlp`] on `x`, layer `k`'s weight at index `layers[k]` of `params` and its bias next.
fn flat_mlp(
    layers: &[usize],
    activation: Activation,
    params: &crate::nn::params::FlatParams,
    x: &Tensor,
    bf16: bool,
) -> Tensor {
    let param = |k: usize, low| {
        let i = layers[k];
        (params.view_in(i, low).shallow_clone(), params.view_in(i + 1, low).shallow_clone())
    };
    crate::nn::mixed::mlp(layers.len(), param, |h| activation.apply(h), x, bf16)
}

/// An MLP's layers for `widths` (input, hidden…, output), made in order by `layer(fan_in, fan_out, last)` and
/// named `{prefix}.{k}.weight` / `.bias` from index `first_index`: each weight's index, the widths, the tensors.
fn init_layers(
    prefix: &str,
    widths: Vec<i64>,
    first_index: usize,
    mut layer: impl FnMut(i64, i64, bool) -> (Tensor, Tensor),
) -> (Vec<usize>, Vec<usize>, Vec<(String, Tensor)>) {
    let (mut layers, mut named) = (Vec::new(), Vec::new());
    for k in 0..widths.len() - 1 {
        let (w, b) = layer(widths[k], widths[k + 1], k == widths.len() - 2);
        layers.push(first_index + named.len());
        named.push((format!("{prefix}.{k}.weight"), w));
        named.push((format!("{prefix}.{k}.bias"), b));
    }
    (layers, widths.iter().map(|&w| w as usize).collect(), named)
}

/// Weight and bias slices, layer by layer, of net `j` in the CPU buffer `v` of `params`: layer `k`'s weight
/// is parameter `layers[k]` (`[fan_in, fan_out]`, or a stack of such for a [`TwinMlp`]), its bias the next one.
fn host_layers<'a>(
    layers: &'a [usize],
    widths: &'a [usize],
    params: &'a crate::nn::params::FlatParams,
    v: &'a [f32],
    j: usize,
) -> impl ExactSizeIterator<Item = (&'a [f32], &'a [f32])> + 'a {
    layers.iter().enumerate().map(move |(k, &i)| {
        let (fan_in, fan_out) = (widths[k], widths[k + 1]);
        let (w, b) = (params.offset(i) + j * fan_in * fan_out, params.offset(i + 1) + j * fan_out);
        (&v[w..w + fan_in * fan_out], &v[b..b + fan_out])
    })
}

/// Two MLPs of the same hidden widths (e.g. a policy and a value network) as one chain of batched matmuls over
/// [`FlatParams`](crate::nn::params::FlatParams): half the dispatches, identical maths. Layer `k` holds `weight`
/// `[2, in, out]` and `bias` `[2, 1, out]`; the output layer is padded to the wider of the two outputs (padding
/// columns stay zero and get no gradient).
#[derive(Debug, Clone)]
pub struct TwinMlp {
    /// Index in the parameter buffer of each layer's weight (its bias follows).
    layers: Vec<usize>,
    /// Input width, hidden widths, padded output width.
    widths: Vec<usize>,
    activation: Activation,
    outputs: [i64; 2],
}

impl TwinMlp {
    /// Initial parameters, named `{prefix}.{k}.weight` / `.bias`, to place in a buffer at index `first_index`
    /// onwards; each net's layers are orthogonal (gain √2, then `out_gains[j]` on the output).
    pub fn init(
        prefix: &str,
        inputs: i64,
        hidden: &[i64],
        outputs: [i64; 2],
        activation: Activation,
        out_gains: [f64; 2],
        first_index: usize,
    ) -> (Self, Vec<(String, Tensor)>) {
        let widths = [&[inputs], hidden, &[outputs[0].max(outputs[1])]].concat();
        let layer = |fan_in, fan_out, last: bool| {
            let weights: Vec<Tensor> = (0..2)
                .map(|j| {
                    let rows = if last { outputs[j] } else { fan_out };
                    let (w, _) = LayerInit::Orthogonal { out_gain: out_gains[j] }.layer(fan_in, rows, last);
                    w.constant_pad_nd([0, fan_out - rows])
                })
                .collect();
            (Tensor::stack(&weights, 0), Tensor::zeros([2, 1, fan_out], (tch::Kind::Float, tch::Device::Cpu)))
        };
        let (layers, widths, named) = init_layers(prefix, widths, first_index, layer);
        (TwinMlp { layers, widths, activation, outputs }, named)
    }

    /// Both nets on the same input `[B, inputs]`: `([B, outputs[0]], [B, outputs[1]])`.
    pub fn forward(&self, params: &crate::nn::params::FlatParams, x: &Tensor) -> (Tensor, Tensor) {
        let x = x.unsqueeze(0).expand([2, -1, -1], false);
        let h = flat_mlp(&self.layers, self.activation, params, &x, false);
        (h.get(0).narrow(1, 0, self.outputs[0]), h.get(1).narrow(1, 0, self.outputs[1]))
    }

    /// Parameter indices of each layer's weight (its bias follows), its nonlinearity and the two output widths.
    pub(crate) fn layout(&self) -> (&[usize], Activation, [i64; 2]) {
        (&self.layers, self.activation, self.outputs)
    }

    /// [`TwinMlp::forward`] without libtorch, on `x` (`rows × inputs`) into `outs[j]` (`rows × outputs[j]`),
    /// when `params` live on the CPU; returns false (and leaves `outs` alone) when they do not.
    pub fn forward_host(
        &self,
        params: &crate::nn::params::FlatParams,
        x: &[f32],
        rows: usize,
        scratch: &mut HostScratch,
        outs: [&mut Vec<f32>; 2],
    ) -> bool {
        let Some(v) = params.host_values() else { return false };
        for (j, out) in outs.into_iter().enumerate() {
            let layers = host_layers(&self.layers, &self.widths, params, v, j);
            host_mlp::mlp(layers, self.activation, x, rows, scratch, out);
            // Drop the padding columns of the narrower net's output layer.
            let (padded, width) = (*self.widths.last().expect("an output layer"), self.outputs[j] as usize);
            if width < padded {
                for r in 0..rows {
                    out.copy_within(r * padded..r * padded + width, r * width);
                }
                out.truncate(rows * width);
            }
        }
        true
    }
}

/// How the Nature CNN computes (`[algorithm.cnn]` in configs). By default NCHW, in bf16 where the CPU computes
/// bf16 natively ([`cpu_has_native_bf16`], read when the config is built, so a run's resolved config records
/// the choice) and in f32 elsewhere; [`CnnOptions::F32`] is plain f32 NCHW everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CnnOptions {
    /// Run the convolutions on channels-last (NHWC) strided tensors, which oneDNN's CPU kernels prefer. Same
    /// maths (and results to f32 rounding) as NCHW.
    pub channels_last: bool,
    /// Mixed precision as PyTorch's CPU autocast: frames, activations and a bf16 copy of the weights through the
    /// layers, outputs back to f32; parameters, gradients and the optimiser stay f32 (results differ by bf16
    /// rounding). Default: on where the CPU computes bf16 natively ([`cpu_has_native_bf16`]), off elsewhere.
    pub bf16: bool,
}

impl CnnOptions {
    /// Plain f32 NCHW convolutions on every CPU: the reference the other settings are compared with.
    pub const F32: CnnOptions = CnnOptions { channels_last: false, bf16: false };
}

impl Default for CnnOptions {
    /// NCHW; bf16 where this CPU computes it natively ([`cpu_has_native_bf16`]).
    fn default() -> Self {
        CnnOptions { channels_last: false, bf16: cpu_has_native_bf16() }
    }
}

/// Whether this CPU computes bf16 natively (AVX512-BF16, which AMX CPUs have too); without it libtorch emulates
/// bf16, several times slower than f32. `ONEDNN_MAX_CPU_ISA` capped below bf16 (e.g. `AVX2`, as
/// `scripts/test.sh`'s second pass sets it) counts as without: oneDNN would then emulate libtorch's bf16 matmuls.
pub fn cpu_has_native_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let capped = std::env::var("ONEDNN_MAX_CPU_ISA").is_ok_and(|isa| {
            let isa = isa.to_ascii_uppercase();
            !(isa == "ALL" || isa == "DEFAULT" || isa.contains("BF16") || isa.contains("FP16") || isa.contains("AMX"))
        });
        std::arch::is_x86_feature_detected!("avx512bf16") && !capped
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `t` (4-D) with channels-last strides: the same values, NHWC memory order.
fn channels_last(t: &Tensor) -> Tensor {
    t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
}

/// The convolutional torso of Mnih et al. (2015): 32×8×8 stride 4, 64×4×4 stride 2, 64×3×3 stride 1, a 512-unit
/// linear layer, all ReLU, then an output layer (e.g. logits and a value, or Q-values), over one
/// [`FlatParams`](crate::nn::params::FlatParams) buffer. It takes u8 frames `[B, C, H, W]` (or floats 0–255) and
/// divides by 255 on the parameters' device. Initialisation is CleanRL's `layer_init`: orthogonal, gain √2,
/// zero biases; the output layer's column groups get their own gains (0.01 for policy logits, 1 for the value).
#[derive(Debug, Clone)]
pub struct NatureCnn {
    /// Index in the parameter buffer of each conv weight (its bias follows), then the fc weight.
    layers: [usize; 4],
    /// Index of the output layer's weight; `None`: a torso that ends at the fc layer's ReLU.
    out: Option<usize>,
    /// Observation shape `[C, H, W]`.
    shape: [i64; 3],
    options: CnnOptions,
}

impl NatureCnn {
    /// Features the Nature torso outputs.
    pub const FEATURES: i64 = 512;
    /// The Nature torso's convolutions' output channels.
    pub const CHANNELS: [i64; 3] = [32, 64, 64];
    /// Kernel and stride of each convolution (8×8/4, 4×4/2, 3×3/1), whatever the channels.
    pub(crate) const KERNELS: [(i64, i64); 3] = [(8, 4), (4, 2), (3, 1)];

    /// Initial parameters for observations of `shape` (`[C, H, W]`, at least 36×36), named `{prefix}.conv1.weight`,
    /// …, `{prefix}.fc.*`, `{prefix}.out.*`, from index `first_index`. The output layer is the column groups
    /// `out_groups` (`(units, gain)` each) side by side; with none, a torso giving the fc layer's 512 features.
    pub fn init(
        prefix: &str,
        shape: &[usize],
        out_groups: &[(i64, f64)],
        first_index: usize,
    ) -> Option<(Self, Vec<(String, Tensor)>)> {
        Self::init_sized(prefix, shape, Self::CHANNELS, Self::FEATURES, out_groups, first_index)
    }

    /// [`NatureCnn::init`] with `channels` out of each convolution and `features` units in the fc layer (a
    /// smaller student; `None` also where a width is not positive).
    pub fn init_sized(
        prefix: &str,
        shape: &[usize],
        channels: [i64; 3],
        features: i64,
        out_groups: &[(i64, f64)],
        first_index: usize,
    ) -> Option<(Self, Vec<(String, Tensor)>)> {
        if channels.iter().any(|&c| c <= 0) || features <= 0 {
            return None;
        }
        let [c, h, w] = <[usize; 3]>::try_from(shape).ok()?.map(|x| x as i64);
        // Spatial size after the convolutions, if the input is large enough (84 → 7).
        let (oh, ow) = Self::KERNELS
            .iter()
            .try_fold((h, w), |(h, w), &(k, s)| (h >= k && w >= k).then(|| ((h - k) / s + 1, (w - k) / s + 1)))?;
        let cpu = tch::Device::Cpu;
        let zeros = |n: i64| Tensor::zeros([n], (tch::Kind::Float, cpu));
        let orthogonal = |rows: i64, cols: i64, gain: f64| nn::init(Init::Orthogonal { gain }, &[rows, cols], cpu);
        let gain = 2f64.sqrt();
        let mut named = Vec::new();
        let mut inputs = c;
        for (k, (&o, &(size, _))) in channels.iter().zip(&Self::KERNELS).enumerate() {
            // tch's `Init::Orthogonal` takes a matrix: draw it flat and reshape to the kernel bank.
            let weight = orthogonal(o, inputs * size * size, gain).view([o, inputs, size, size]);
            named.push((format!("{prefix}.conv{}.weight", k + 1), weight));
            named.push((format!("{prefix}.conv{}.bias", k + 1), zeros(o)));
            inputs = o;
        }
        // Linear weights are stored `[in, out]`, the layout `addmm` takes.
        let flat = channels[2] * oh * ow;
        named.push((format!("{prefix}.fc.weight"), orthogonal(features, flat, gain).transpose(0, 1).contiguous()));
        named.push((format!("{prefix}.fc.bias"), zeros(features)));
        let out = (!out_groups.is_empty()).then(|| {
            let groups: Vec<Tensor> =
                out_groups.iter().map(|&(units, gain)| orthogonal(units, features, gain).transpose(0, 1)).collect();
            let outputs: i64 = out_groups.iter().map(|g| g.0).sum();
            named.push((format!("{prefix}.out.weight"), Tensor::cat(&groups, 1).contiguous()));
            named.push((format!("{prefix}.out.bias"), zeros(outputs)));
            first_index + 8
        });
        let layers = [0, 2, 4, 6].map(|i| first_index + i);
        Some((NatureCnn { layers, out, shape: [c, h, w], options: CnnOptions::F32 }, named))
    }

    /// The same network computing as `options` say.
    pub fn with_options(self, options: CnnOptions) -> Self {
        NatureCnn { options, ..self }
    }

    /// Observation shape `[C, H, W]`.
    pub fn shape(&self) -> [i64; 3] {
        self.shape
    }

    /// The output layer on frames `[B, C, H, W]` (u8 or float 0–255): `[B, outputs]` (a torso's `[B, 512]`
    /// features).
    pub fn forward(&self, params: &crate::nn::params::FlatParams, frames: &Tensor) -> Tensor {
        let CnnOptions { channels_last: nhwc, bf16 } = self.options;
        let kind = if bf16 { tch::Kind::BFloat16 } else { tch::Kind::Float };
        let cast = |t: &Tensor| if bf16 { t.to_kind(kind) } else { t.shallow_clone() };
        let mut h = frames.to_kind(kind) / 255.0;
        if nhwc {
            h = channels_last(&h);
        }
        for (k, &(_, stride)) in Self::KERNELS.iter().enumerate() {
            let i = self.layers[k];
            let w = if nhwc { channels_last(&cast(params.view(i))) } else { cast(params.view(i)) };
            h = h.conv2d(&w, Some(cast(params.view(i + 1))), [stride, stride], [0, 0], [1, 1], 1).relu();
        }
        // `flatten` orders features as C, H, W whatever the memory format, so the fc weights fit both.
        let fc = self.layers[3];
        let h = cast(params.view(fc + 1)).addmm(&h.flatten(1, -1), &cast(params.view(fc))).relu();
        let y = match self.out {
            Some(out) => cast(params.view(out + 1)).addmm(&h, &cast(params.view(out))),
            None => h,
        };
        if bf16 { y.to_kind(tch::Kind::Float) } else { y }
    }
}

/// Multi-task heads on the host: of `out`'s `rows × t·H` values keep each row's own task's head (`rows × H`),
/// the one-hot that ends its observation (`x`: `rows × obs_dim`) weighting the heads as the tensor path does.
pub(crate) fn select_task_heads(x: &[f32], obs_dim: usize, t: usize, out: &mut Vec<f32>) {
    let rows = x.len() / obs_dim;
    let h = out.len() / (rows * t);
    let mut row = vec![0.0f32; h];
    for r in 0..rows {
        let hot = &x[(r + 1) * obs_dim - t..(r + 1) * obs_dim];
        row.fill(0.0);
        for (k, w) in hot.iter().enumerate() {
            let at = (r * t + k) * h;
            row.iter_mut().zip(&out[at..at + h]).for_each(|(o, v)| *o += w * v);
        }
        // Row r's heads start at r·t·H ≥ r·H: writing row r never overwrites a later row's heads.
        out[r * h..(r + 1) * h].copy_from_slice(&row);
    }
    out.truncate(rows * h);
}

/// The tensor side of [`select_task_heads`]: `out` `[B, t·H]` → `[B, H]`, each row its task's head, the task
/// being the one-hot in the last `t` columns of `obs` (`[B, obs_dim]`).
pub(crate) fn select_task_heads_tensor(obs: &Tensor, t: usize, out: &Tensor) -> Tensor {
    select_task_heads_ending_at(obs, obs.size()[1], t, out)
}

/// [`select_task_heads_tensor`] where the one-hot ends at column `end` of `x` rather than at its last column
/// (a critic's input `[obs | action]`: the task is the end of the observation part).
pub(crate) fn select_task_heads_ending_at(x: &Tensor, end: i64, t: usize, out: &Tensor) -> Tensor {
    let (t, rows) = (t as i64, out.size()[0]);
    let hot = x.narrow(1, end - t, t);
    (out.view([rows, t, -1]) * hot.unsqueeze(2)).sum_dim_intlist(1, false, tch::Kind::Float)
}

/// Whether observations of this space are images for a convolutional body: a u8 box of shape `[C, H, W]`.
pub fn is_image(space: &Space) -> bool {
    matches!(space, Space::Box { shape, dtype: DType::U8, .. } if shape.len() == 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn twin_mlp_equals_two_separate_mlps() {
        // Every draw from libtorch's global generator under the crate's lock (tests run on several threads).
        let (twin, named) =
            with_torch_seed(11, || TwinMlp::init("t", 3, &[5, 4], [2, 1], Activation::Tanh, [0.01, 1.0], 0));
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["t.0.weight", "t.0.bias", "t.1.weight", "t.1.bias", "t.2.weight", "t.2.bias"]);
        let params = crate::nn::params::FlatParams::new(named, Device::Cpu);
        // Random biases, so the check covers them too.
        tch::no_grad(|| {
            for i in [1, 3, 5] {
                let r =
                    with_torch_seed(12 + i as u64, || Tensor::randn(params.view(i).size(), (Kind::Float, Device::Cpu)));
                params.view(i).shallow_clone().copy_(&r);
            }
        });
        let x = with_torch_seed(20, || Tensor::randn([7, 3], (Kind::Float, Device::Cpu)));
        let (a, b) = twin.forward(&params, &x);
        for (j, out, width) in [(0, a, 2), (1, b, 1)] {
            let mut h = x.shallow_clone();
            for layer in 0..3 {
                let w = params.view(2 * layer).get(j);
                let bias = params.view(2 * layer + 1).get(j).squeeze_dim(0);
                h = h.matmul(&w) + bias;
                if layer < 2 {
                    h = h.tanh();
                }
            }
            let want = h.narrow(1, 0, width);
            let diff = f64::try_from((out - want).abs().max()).unwrap();
            assert!(diff < 1e-5, "net {j}: {diff}");
        }
        // The value net's padding column starts at zero.
        assert_eq!(f64::try_from(params.view(4).get(1).narrow(1, 1, 1).abs().sum(Kind::Float)).unwrap(), 0.0);
    }

    fn randomise_biases(params: &crate::nn::params::FlatParams, biases: &[usize]) {
        tch::no_grad(|| {
            for &i in biases {
                let r =
                    with_torch_seed(30 + i as u64, || Tensor::randn(params.view(i).size(), (Kind::Float, Device::Cpu)));
                params.view(i).shallow_clone().copy_(&r);
            }
        });
    }

    #[test]
    fn host_forward_passes_equal_libtorch() {
        for activation in [Activation::Tanh, Activation::Relu] {
            for rows in [1usize, 8] {
                let x =
                    with_torch_seed(3 + rows as u64, || Tensor::randn([rows as i64, 4], (Kind::Float, Device::Cpu)));
                let xs = Vec::<f32>::try_from(x.flatten(0, -1)).unwrap();
                let mut scratch = HostScratch::default();
                // FlatMlp, as DQN and TD3 use it (torch init has non-zero biases).
                let (mlp, named) =
                    with_torch_seed(40, || FlatMlp::init("q", 4, &[64, 32], 3, activation, LayerInit::Torch, 0));
                let params = crate::nn::params::FlatParams::new(named, Device::Cpu);
                let want = Vec::<f32>::try_from(mlp.forward(&params, &x).flatten(0, -1)).unwrap();
                let mut got = Vec::new();
                assert!(mlp.forward_host(&params, &xs, rows, &mut scratch, &mut got));
                assert_eq!(got.len(), want.len());
                let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(diff < 1e-5, "FlatMlp {activation:?} rows {rows}: {diff}");
                // TwinMlp, as PPO and A2C use it: a 2-wide head and a padded 1-wide value.
                let (twin, named) =
                    with_torch_seed(41, || TwinMlp::init("t", 4, &[64, 64], [2, 1], activation, [0.01, 1.0], 0));
                let params = crate::nn::params::FlatParams::new(named, Device::Cpu);
                randomise_biases(&params, &[1, 3, 5]);
                let (h, v) = twin.forward(&params, &x);
                let (mut gh, mut gv) = (Vec::new(), Vec::new());
                assert!(twin.forward_host(&params, &xs, rows, &mut scratch, [&mut gh, &mut gv]));
                for (what, got, want) in [("head", &gh, h), ("value", &gv, v)] {
                    let want = Vec::<f32>::try_from(want.contiguous().flatten(0, -1)).unwrap();
                    assert_eq!(got.len(), want.len(), "{what}");
                    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(diff < 1e-5, "TwinMlp {what} {activation:?} rows {rows}: {diff}");
                }
                // An in-place update of the buffer shows in the next host pass (no stale copy).
                let _ = tch::no_grad(|| params.flat().shallow_clone().g_mul_scalar_(0.5));
                let (h, _) = twin.forward(&params, &x);
                assert!(twin.forward_host(&params, &xs, rows, &mut scratch, [&mut gh, &mut gv]));
                let want = Vec::<f32>::try_from(h.contiguous().flatten(0, -1)).unwrap();
                assert!(gh.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5));
            }
        }
    }

    #[test]
    fn nature_cnn_shape_size_and_init() {
        let (cnn, named) =
            with_torch_seed(50, || NatureCnn::init("cnn", &[4, 84, 84], &[(6, 0.01), (1, 1.0)], 0)).unwrap();
        let params = crate::nn::params::FlatParams::new(named, Device::Cpu);
        let frames = Tensor::zeros([2, 4, 84, 84], (Kind::Uint8, Device::Cpu));
        assert_eq!(cnn.forward(&params, &frames).size(), vec![2, 7]);
        assert_eq!(params.numel(), 8_224 + 32_832 + 36_928 + 1_606_144 + 512 * 7 + 7);
        // Orthogonal rows for each conv kernel bank: W Wᵀ = 2 I with W the kernels flattened.
        let w = params.view(0).view([32, -1]);
        let gram = w.matmul(&w.transpose(0, 1));
        let eye = Tensor::eye(32, (Kind::Float, Device::Cpu)) * 2.0;
        assert!(f64::try_from((gram - eye).abs().max()).unwrap() < 1e-4);
        // The output groups keep their own gains: logits columns of norm 0.01, the value column of norm 1.
        let out = params.view(8);
        let norms = Vec::<f32>::try_from(out.square().sum_dim_intlist(0, false, Kind::Float).sqrt()).unwrap();
        assert!(norms[..6].iter().all(|n| (n - 0.01).abs() < 1e-4) && (norms[6] - 1.0).abs() < 1e-4, "{norms:?}");
        // u8 frames and the same frames as floats give the same output; too small an image is refused.
        let x = with_torch_seed(51, || Tensor::randint(256, [3, 4, 84, 84], (Kind::Int64, Device::Cpu)));
        let a = cnn.forward(&params, &x.to_kind(Kind::Uint8));
        let b = cnn.forward(&params, &x.to_kind(Kind::Float));
        assert!(f64::try_from((a - b).abs().max()).unwrap() < 1e-5);
        assert!(NatureCnn::init("cnn", &[4, 30, 30], &[(1, 1.0)], 0).is_none());
    }

    #[test]
    fn channels_last_is_the_same_maths_and_bf16_stays_close() {
        // Seeded under the crate's lock: unseeded draws would depend on which tests ran before, and race them.
        let ((cnn, named), frames) = with_torch_seed(1, || {
            let built = NatureCnn::init("cnn", &[4, 84, 84], &[(6, 0.01), (1, 1.0)], 0).unwrap();
            (built, Tensor::randint(256, [5, 4, 84, 84], (Kind::Int64, Device::Cpu)).to_kind(Kind::Uint8))
        });
        let params = crate::nn::params::FlatParams::new(named, Device::Cpu);
        let run = |options: CnnOptions| {
            let named = params.names().enumerate().map(|(i, n)| (n.to_string(), params.view(i).detach().copy()));
            let mut params = crate::nn::params::FlatParams::new(named.collect(), Device::Cpu);
            let y = cnn.clone().with_options(options).forward(&params, &frames);
            params.backward(&y.square().sum(Kind::Float));
            (y.detach(), params.flat().grad().copy())
        };
        let (y, g) = run(CnnOptions::F32);
        let (y_nhwc, g_nhwc) = run(CnnOptions { channels_last: true, bf16: false });
        let close = |a: &Tensor, b: &Tensor| {
            f64::try_from((a - b).abs().max()).unwrap() / f64::try_from(b.abs().max()).unwrap()
        };
        assert!(close(&y_nhwc, &y) < 1e-5 && close(&g_nhwc, &g) < 1e-4, "channels-last changes only rounding");
        for options in [CnnOptions { channels_last: false, bf16: true }, CnnOptions { channels_last: true, bf16: true }]
        {
            let (y16, g16) = run(options);
            assert_eq!(y16.kind(), Kind::Float, "outputs come back as f32");
            assert!(close(&y16, &y) < 5e-2, "{options:?}: outputs within bf16 rounding ({})", close(&y16, &y));
            assert!(close(&g16, &g) < 1e-1, "{options:?}: gradients within bf16 rounding ({})", close(&g16, &g));
        }
    }
}
