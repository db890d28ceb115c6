//! Weights other tools can read: the architecture written into `model.safetensors`, and the acting policy in
//! PyTorch's own layout.
//!
//! A run's `model.safetensors` holds [`Algorithm::policy_params`](crate::Algorithm::policy_params) in
//! Flotilla's layout (linear weights `[in, out]` for `addmm`, PPO's policy and value MLPs stacked `[2, in, out]`
//! for one batched matmul, a Nature CNN's logits and value side by side in one output layer). Its safetensors
//! `__metadata__` says all of that ([`Architecture::to_metadata`]): algorithm, format version, layer widths,
//! activation, the spaces as JSON, which tensors (and which slices of them) the policy reads, and how its
//! output becomes an action. The registry attaches it to every agent it builds, so every save writes it.
//!
//! [`to_pytorch`] turns those weights into what `torch.nn.Sequential(...).state_dict()` holds (`0.weight`,
//! `0.bias`, `2.weight`, …; `nn.Linear` weights `[out, in]`, `nn.Conv2d` for the Nature CNN), with a `layers`
//! metadata entry that rebuilds the module from the file alone:
//!
//! ```text
//! model.safetensors ─► read_safetensors ─► Architecture::from_metadata ─► to_pytorch ─► PytorchPolicy::save
//!   (pi_vf.k [2, in, out], log_std)                                          (0.weight [out, in], …, log_std)
//! ```
//!
//! What the exported module computes, by algorithm (`output` in its metadata):
//! - PPO / A2C / A3C, discrete actions: the policy logits (`logits`; the deterministic action is their argmax);
//! - PPO / A2C / A3C and distillation students on boxes: the Gaussian's mean (`gaussian_mean`; the
//!   state-independent log-std is the separate tensor `log_std`); `flotilla eval` clips the mean to the bounds;
//! - DQN: the Q-values (`q_values`; argmax); a dueling head `Q = V + A − mean(A)` is folded into the last
//!   `nn.Linear` (it is linear in the output layer), so the module outputs Q directly;
//! - DDPG / TD3: the actor, its `nn.Tanh`, then the scaling to the action bounds
//!   `low + (a + 1)/2 · (high − low)` as a final diagonal `nn.Linear` (`action`);
//! - the Nature CNN takes frames as floats 0–255: the network's `/255` is folded into the first convolution.
//!
//! Task heads (a head per task, each row reading its task's by the one-hot ending its observation) select by
//! the input and are not one `nn.Sequential`: [`to_pytorch`] refuses them by name.
use std::collections::BTreeMap;
use std::path::Path;

use flotilla_core::{DType, Space};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::nn::activation::Activation;
use crate::nn::nets::NatureCnn;
pub use crate::weights_file::{read_safetensors, write_safetensors};
use crate::{Error, Result};

/// Version of the `model.safetensors` metadata written by [`Architecture::to_metadata`].
pub const FORMAT_VERSION: u32 = 1;
/// Version of the layout [`PytorchPolicy::save`] writes.
pub const EXPORT_VERSION: u32 = 1;

/// Units of the Nature CNN's hidden linear layer.
fn cnn_features() -> usize {
    NatureCnn::FEATURES as usize
}

/// `(out_channels, kernel, stride)` of each convolution of a CNN of the Nature CNN's shape with `channels` (as
/// [`NatureCnn::init_sized`] builds it).
fn cnn_convs(channels: [i64; 3]) -> Vec<(usize, usize, usize)> {
    NatureCnn::KERNELS.iter().zip(channels).map(|(&(k, s), c)| (c as usize, k as usize, s as usize)).collect()
}

impl Network {
    /// A CNN of the Nature CNN's shape (Nature's own: [`NatureCnn::CHANNELS`], [`NatureCnn::FEATURES`]) on the
    /// frames of `observation`, its output layer `outputs` wide, the policy reading the first `policy_outputs`.
    pub(crate) fn nature_cnn(
        prefix: &str,
        observation: &Space,
        channels: [i64; 3],
        features: i64,
        outputs: usize,
        policy_outputs: usize,
    ) -> Result<Network> {
        Ok(Network::NatureCnn {
            prefix: prefix.into(),
            shape: image_shape(observation)?,
            convs: cnn_convs(channels),
            features: features as usize,
            outputs,
            policy_outputs,
        })
    }

    /// An MLP `inputs → hidden… → outputs`.
    pub(crate) fn mlp(prefix: &str, inputs: usize, hidden: &[i64], outputs: usize, activation: Activation) -> Self {
        Network::Mlp { prefix: prefix.into(), widths: widths(inputs, hidden, outputs), activation }
    }
}

/// How `model.safetensors` stores the acting network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Network {
    /// PPO / A2C / A3C on vectors: a policy MLP and a value MLP of the same hidden widths, stacked. Layer `k` is
    /// `{prefix}.{k}.weight` `[2, widths[k], widths[k+1]]` (`[in, out]` per net: y = x·W + b) and
    /// `{prefix}.{k}.bias` `[2, 1, widths[k+1]]`; index 0 of the first dimension is the policy, 1 the value.
    /// The output layer is as wide as the wider net: the policy reads its first `policy_outputs` columns, the
    /// value its first `value_outputs` (the rest are zero padding).
    TwinMlp {
        /// Tensor name prefix (`pi_vf`).
        prefix: String,
        /// Input width, hidden widths, output width.
        widths: Vec<usize>,
        /// Nonlinearity after every layer but the last.
        activation: Activation,
        /// Output columns of the policy net (logits or means, times the task heads).
        policy_outputs: usize,
        /// Output columns of the value net (one per task head).
        value_outputs: usize,
    },
    /// One MLP (DQN's Q-network, DDPG/TD3's actor, a distillation student): `{prefix}.{k}.weight`
    /// `[widths[k], widths[k+1]]` (`[in, out]`: y = x·W + b) and `{prefix}.{k}.bias` `[widths[k+1]]`.
    Mlp {
        /// Tensor name prefix (`q`, `actor`, `student`).
        prefix: String,
        /// Input width, hidden widths, output width.
        widths: Vec<usize>,
        /// Nonlinearity after every layer but the last.
        activation: Activation,
    },
    /// The Nature CNN on u8 frames `[C, H, W]`, divided by 255 first: `{prefix}.conv{1,2,3}.weight` in
    /// PyTorch's `[out, in, k, k]` layout with `.bias`, each followed by ReLU (`convs` gives out channels,
    /// kernel and stride); the features flattened in C, H, W order; `{prefix}.fc.weight` `[flat, features]`
    /// (`[in, out]`, Nature's 512 features) + ReLU; `{prefix}.out.weight` `[features, outputs]` (`[in, out]`).
    /// The policy reads the first `policy_outputs` output columns (an actor-critic's last column is its value).
    NatureCnn {
        /// Tensor name prefix (`cnn`, `q`, `student`).
        prefix: String,
        /// Observation shape `[C, H, W]`.
        shape: [usize; 3],
        /// `(out_channels, kernel, stride)` of each convolution.
        convs: Vec<(usize, usize, usize)>,
        /// Units of the fc layer (512 in the Nature CNN; absent in files written before smaller CNN students).
        #[serde(default = "cnn_features")]
        features: usize,
        /// Units of the output layer.
        outputs: usize,
        /// Output columns the policy reads.
        policy_outputs: usize,
    },
}

/// What the network's policy output means, and how it becomes the deterministic action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyOutput {
    /// Categorical policy logits over `n` actions; the deterministic action is their argmax (first maximum).
    Logits {
        /// Actions.
        n: usize,
    },
    /// A diagonal Gaussian: the network gives the mean (the deterministic action, clipped to the action bounds
    /// by the env side); the log standard deviation is the state-independent tensor `log_std` `[dim]`.
    Gaussian {
        /// Action dimensions.
        dim: usize,
        /// Name of the log-std tensor.
        log_std: String,
    },
    /// Q-values over `n` actions; the greedy action is their argmax (first maximum). `dueling`: the output
    /// layer's first column is V, the next `n` are A, and `Q = V + A − mean(A)`. With `quantiles` > 1 (QR-DQN)
    /// every one of those columns is a group of that many return quantiles, and Q is each group's mean.
    QValues {
        /// Actions.
        n: usize,
        /// Dueling head.
        dueling: bool,
        /// Return quantiles per output (1: expected values; absent in files written before QR-DQN).
        #[serde(default = "one")]
        quantiles: usize,
    },
    /// A deterministic actor: `a = tanh(net(obs))` in `[−1, 1]`, scaled to the bounds as
    /// `low + (a + 1)/2 · (high − low)`.
    TanhScaled {
        /// Lower action bounds.
        low: Vec<f32>,
        /// Upper action bounds.
        high: Vec<f32>,
    },
}

/// The Nature CNN's tensors up to its fc layer (convolutions `[out, in, k, k]`, fc `[in, features]`).
fn cnn_torso_shapes(
    prefix: &str,
    shape: &[usize],
    convs: &[(usize, usize, usize)],
    features: usize,
) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    let (mut c, mut h, mut w) = (shape[0], shape[1], shape[2]);
    for (k, &(o, size, stride)) in convs.iter().enumerate() {
        out.push((format!("{prefix}.conv{}.weight", k + 1), vec![o, c, size, size]));
        out.push((format!("{prefix}.conv{}.bias", k + 1), vec![o]));
        (c, h, w) = (o, (h.saturating_sub(size)) / stride + 1, (w.saturating_sub(size)) / stride + 1);
    }
    out.push((format!("{prefix}.fc.weight"), vec![c * h * w, features]));
    out.push((format!("{prefix}.fc.bias"), vec![features]));
    out
}

/// The Nature CNN up to its fc layer's ReLU as PyTorch modules (Flotilla's division of frames by 255 folded
/// into the first kernels), appended to `layers`.
fn push_cnn_torso(
    layers: &mut Vec<(TorchLayer, Option<(Tensor, Tensor)>)>,
    get: &dyn Fn(String) -> Tensor,
    prefix: &str,
    shape: &[usize],
    convs: &[(usize, usize, usize)],
) {
    let mut channels = shape[0];
    for (k, &(o, size, stride)) in convs.iter().enumerate() {
        let mut w = get(format!("{prefix}.conv{}.weight", k + 1));
        if k == 0 {
            w /= 255.0;
        }
        let b = get(format!("{prefix}.conv{}.bias", k + 1));
        layers.push((TorchLayer::Conv2d(channels, o, size, stride), Some((w, b))));
        layers.push((TorchLayer::Relu, None));
        channels = o;
    }
    layers.push((TorchLayer::Flatten, None));
    let fc = get(format!("{prefix}.fc.weight"));
    let (flat, features) = (fc.size()[0] as usize, fc.size()[1] as usize);
    layers.push((TorchLayer::Linear(flat, features), Some((fc.transpose(0, 1), get(format!("{prefix}.fc.bias"))))));
    layers.push((TorchLayer::Relu, None));
}

/// Everything needed to read a `model.safetensors` without Flotilla: written into its `__metadata__`.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// The algorithm kind, as in configs (`ppo`, `dqn`, …).
    pub algorithm: String,
    /// The acting network's layers and tensor names.
    pub network: Network,
    /// What its output means.
    pub policy: PolicyOutput,
    /// Output heads, one per task (1: none). With `T > 1` each output group (policy, value, Q) holds `T`
    /// consecutive heads and a row reads the head of its task, the one-hot in the last `T` observation values.
    pub task_heads: usize,
    /// The observation space the network takes (rows flattened).
    pub observation_space: Space,
    /// The action space.
    pub action_space: Space,
    /// Observations normalised by running statistics (`[normalize]`), held in the tensors `obs_rms.mean` and
    /// `obs_rms.var` after the network's.
    pub obs_norm: Option<ObsNorm>,
    /// A recurrent core between the observations and `network` (`[algorithm] recurrent`): its tensors come
    /// first, and `network` takes the core's output.
    pub recurrent: Option<RecurrentLayout>,
}

/// A recurrent core's layout: `torch.nn.LSTM` / `torch.nn.GRU` (one layer) tensors `{prefix}.weight_ih_l0`
/// `[G·hidden, inputs]`, `.weight_hh_l0` `[G·hidden, hidden]`, `.bias_ih_l0`, `.bias_hh_l0` (`G` = 4 or 3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RecurrentLayout {
    /// The cell.
    pub cell: crate::nn::recurrent::Recurrence,
    /// Input width (the observation size, or the torso's 512 features).
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Frames `[C, H, W]` go through a Nature-CNN torso before the core (CleanRL's `ppo_atari_lstm`): its
    /// convolutions and fc layer (ReLU after each), tensors `cnn.conv1..3.*` and `cnn.fc.*`, no output layer.
    /// `None`: the core takes the (normalised) observations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torso: Option<[usize; 3]>,
}

impl RecurrentLayout {
    /// The core's tensor prefix.
    pub const PREFIX: &'static str = "core";
}

/// How observations are normalised before the network: `clamp((x − obs_rms.mean) / √(obs_rms.var + epsilon),
/// −clip, clip)` ([`crate::normalize`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ObsNorm {
    /// The clip of normalised observations.
    pub clip: f64,
    /// Added to the variance under the square root.
    pub epsilon: f64,
}

impl Architecture {
    /// The architecture of `algorithm`'s acting `network` with `heads` task heads, whose output means
    /// `policy`, for these spaces (each kind builds its own: `Kind::architecture`).
    pub fn new(algorithm: &str, network: Network, policy: PolicyOutput, heads: usize, o: &Space, a: &Space) -> Self {
        Architecture {
            algorithm: algorithm.into(),
            network,
            policy,
            task_heads: heads,
            observation_space: o.clone(),
            action_space: a.clone(),
            obs_norm: None,
            recurrent: None,
        }
    }

    /// Names and shapes of every tensor `model.safetensors` holds for this architecture, in order.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        if let Some(shape) = self.recurrent.and_then(|r| r.torso) {
            out.extend(cnn_torso_shapes("cnn", &shape, &cnn_convs(NatureCnn::CHANNELS), cnn_features()));
        }
        if let Some(r) = &self.recurrent {
            let g = if r.cell == crate::nn::recurrent::Recurrence::Lstm { 4 } else { 3 };
            let p = RecurrentLayout::PREFIX;
            out.push((format!("{p}.weight_ih_l0"), vec![g * r.hidden, r.inputs]));
            out.push((format!("{p}.weight_hh_l0"), vec![g * r.hidden, r.hidden]));
            out.push((format!("{p}.bias_ih_l0"), vec![g * r.hidden]));
            out.push((format!("{p}.bias_hh_l0"), vec![g * r.hidden]));
        }
        match &self.network {
            Network::TwinMlp { prefix, widths, .. } => {
                for (k, w) in widths.windows(2).enumerate() {
                    out.push((format!("{prefix}.{k}.weight"), vec![2, w[0], w[1]]));
                    out.push((format!("{prefix}.{k}.bias"), vec![2, 1, w[1]]));
                }
            }
            Network::Mlp { prefix, widths, .. } => {
                for (k, w) in widths.windows(2).enumerate() {
                    out.push((format!("{prefix}.{k}.weight"), vec![w[0], w[1]]));
                    out.push((format!("{prefix}.{k}.bias"), vec![w[1]]));
                }
            }
            Network::NatureCnn { prefix, shape, convs, features, outputs, .. } => {
                out.extend(cnn_torso_shapes(prefix, shape, convs, *features));
                out.push((format!("{prefix}.out.weight"), vec![*features, *outputs]));
                out.push((format!("{prefix}.out.bias"), vec![*outputs]));
            }
        }
        if let PolicyOutput::Gaussian { dim, log_std } = &self.policy {
            out.push((log_std.clone(), vec![*dim]));
        }
        if self.obs_norm.is_some() {
            let dim = self.observation_space.flat_dim();
            out.extend([("obs_rms.mean".to_string(), vec![dim]), ("obs_rms.var".to_string(), vec![dim])]);
        }
        out
    }

    /// Which tensors (and slices of them) the policy reads, in words.
    fn layout(&self) -> String {
        let network = match &self.network {
            Network::TwinMlp { prefix, policy_outputs, value_outputs, .. } => format!(
                "{prefix}.{{k}}.weight [2, in, out] and {prefix}.{{k}}.bias [2, 1, out]: index 0 of the first \
                 dimension is the policy MLP, index 1 the value MLP; y = x @ W + b (weights stored [in, out]); \
                 the policy reads the first {policy_outputs} columns of the output layer, the value the first \
                 {value_outputs}"
            ),
            Network::Mlp { prefix, .. } => {
                format!("{prefix}.{{k}}.weight [in, out] and {prefix}.{{k}}.bias [out]: y = x @ W + b")
            }
            Network::NatureCnn { prefix, policy_outputs, outputs, .. } => format!(
                "frames / 255 -> {prefix}.conv1..3 (PyTorch layout [out, in, k, k], ReLU each) -> flatten (C, H, W) \
                 -> {prefix}.fc ([in, out], ReLU) -> {prefix}.out ([in, out], {outputs} columns); the policy reads \
                 the first {policy_outputs}"
            ),
        };
        let heads = if self.task_heads > 1 {
            format!(
                "; {} task heads: each output group holds one head per task in task order, and a row reads the head \
                 of the task whose one-hot ends its observation",
                self.task_heads
            )
        } else {
            String::new()
        };
        let policy = match &self.policy {
            PolicyOutput::Logits { .. } => "output: categorical logits; deterministic action = argmax".to_string(),
            PolicyOutput::Gaussian { log_std, .. } => format!(
                "output: Gaussian mean (the deterministic action, clipped to the action bounds by the env side); \
                 {log_std} [dim] is the state-independent log standard deviation"
            ),
            PolicyOutput::QValues { dueling, quantiles, .. } => {
                let q = if *dueling { "[V, A_1..A_n]; Q = V + A - mean(A)" } else { "Q-values" };
                let z = if *quantiles > 1 {
                    format!(" (each a group of {quantiles} return quantiles; its value = the group's mean)")
                } else {
                    String::new()
                };
                format!("output: {q}{z}; greedy action = argmax Q")
            }
            PolicyOutput::TanhScaled { .. } => {
                "output: a = tanh(y) in [-1, 1], action = low + (a + 1) / 2 * (high - low)".to_string()
            }
        };
        format!("{network}{heads}; {policy}")
    }

    /// The `__metadata__` entries of `model.safetensors` (safetensors metadata is strings; structured values
    /// are JSON). Infinite space bounds are written as the strings `"inf"` / `"-inf"` (`float()` reads them).
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let (activation, hidden): (Activation, Vec<usize>) = match &self.network {
            Network::TwinMlp { widths, activation, .. } | Network::Mlp { widths, activation, .. } => {
                (*activation, widths[1..widths.len() - 1].to_vec())
            }
            Network::NatureCnn { features, .. } => (Activation::Relu, vec![*features]),
        };
        let tensors: Vec<String> = self.tensor_shapes().into_iter().map(|(name, _)| name).collect();
        let mut meta = BTreeMap::from([
            ("flotilla_format".into(), "model".into()),
            ("flotilla_format_version".into(), FORMAT_VERSION.to_string()),
            ("algorithm".into(), self.algorithm.clone()),
            ("network".into(), text(&self.network)),
            ("policy".into(), text(&self.policy)),
            ("activation".into(), text(&activation).trim_matches('"').to_string()),
            ("hidden_sizes".into(), text(&hidden)),
            ("task_heads".into(), self.task_heads.to_string()),
            ("policy_tensors".into(), text(&tensors)),
            ("layout".into(), self.layout()),
            ("observation_space".into(), space_to_json(&self.observation_space)),
            ("action_space".into(), space_to_json(&self.action_space)),
        ]);
        if let Some(norm) = &self.obs_norm {
            meta.insert("obs_norm".into(), text(norm));
        }
        if let Some(r) = &self.recurrent {
            meta.insert("recurrent".into(), text(r));
        }
        meta
    }

    /// Read [`Architecture::to_metadata`] back; `what` names the file in errors. `Ok(None)` when the metadata is
    /// not Flotilla's (a file written before version 1).
    pub fn from_metadata(what: &str, meta: &BTreeMap<String, String>) -> Result<Option<Self>> {
        if meta.get("flotilla_format").map(String::as_str) != Some("model") {
            return Ok(None);
        }
        let bad = |detail: String| Error::Unsupported(format!("{what}: metadata {detail}"));
        let get = |key: &str| meta.get(key).ok_or_else(|| bad(format!("has no {key:?} entry")));
        let version = get("flotilla_format_version")?;
        if version.parse::<u32>().ok() != Some(FORMAT_VERSION) {
            return Err(bad(format!(
                "format version {version} is not one this flotilla reads ({FORMAT_VERSION}); export with the \
                 flotilla that trained it"
            )));
        }
        let parse = |key: &str| -> Result<Value> {
            serde_json::from_str(get(key)?).map_err(|e| bad(format!("{key:?} is not JSON: {e}")))
        };
        fn json<T: DeserializeOwned>(
            parse: &dyn Fn(&str) -> Result<Value>,
            key: &str,
            bad: &dyn Fn(String) -> Error,
        ) -> Result<T> {
            serde_json::from_value(parse(key)?).map_err(|e| bad(format!("{key:?}: {e}")))
        }
        let (network, policy) = (json(&parse, "network", &bad)?, json(&parse, "policy", &bad)?);
        let task_heads = get("task_heads")?.parse().map_err(|e| bad(format!("\"task_heads\": {e}")))?;
        let space = |key: &str| space_from_json(&parse(key)?).map_err(|e| bad(format!("{key:?}: {e}")));
        Ok(Some(Architecture {
            algorithm: get("algorithm")?.clone(),
            network,
            policy,
            task_heads,
            observation_space: space("observation_space")?,
            action_space: space("action_space")?,
            obs_norm: if meta.contains_key("obs_norm") { json(&parse, "obs_norm", &bad)? } else { None },
            recurrent: if meta.contains_key("recurrent") { json(&parse, "recurrent", &bad)? } else { None },
        }))
    }
}

/// The default of [`PolicyOutput::QValues`]'s `quantiles`.
fn one() -> usize {
    1
}

/// JSON text of plain data.
fn text<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serialises")
}

pub(crate) fn unsupported(algorithm: &'static str, detail: String) -> Error {
    Error::space("action", algorithm, detail)
}

/// Input width, hidden widths, output width.
pub(crate) fn widths(inputs: usize, hidden: &[i64], outputs: usize) -> Vec<usize> {
    std::iter::once(inputs).chain(hidden.iter().map(|&h| h as usize)).chain([outputs]).collect()
}

/// Logits for discrete actions, a Gaussian for 1-D boxes (the actor-critic's and the student's heads).
pub(crate) fn policy_head(action: &Space) -> Result<PolicyOutput> {
    match action {
        Space::Discrete { n, .. } => Ok(PolicyOutput::Logits { n: *n }),
        Space::Box { shape, .. } if shape.len() == 1 => {
            Ok(PolicyOutput::Gaussian { dim: shape[0], log_std: "log_std".into() })
        }
        other => Err(unsupported("actor-critic", format!("{other:?}"))),
    }
}

/// Output columns of one policy head.
pub(crate) fn policy_width(policy: &PolicyOutput) -> usize {
    match policy {
        PolicyOutput::Logits { n } | PolicyOutput::QValues { n, .. } => *n,
        PolicyOutput::Gaussian { dim, .. } => *dim,
        PolicyOutput::TanhScaled { low, .. } => low.len(),
    }
}

pub(crate) fn image_shape(space: &Space) -> Result<[usize; 3]> {
    <[usize; 3]>::try_from(space.shape()).map_err(|_| Error::space("observation", "cnn", format!("{space:?}")))
}

/// A space as JSON (`{"kind": "discrete", "n": 2, "start": 0}`, `{"kind": "box", "low": [...], ...}`), bounds
/// that are not finite as the strings `"inf"`, `"-inf"`, `"nan"` (JSON has no such numbers).
pub fn space_to_json(space: &Space) -> String {
    let bound = |v: &[f32]| -> Vec<Value> {
        v.iter()
            .map(|x| match x {
                // Rust's shortest form of the f32 (4.8, not 4.800000190734863).
                x if x.is_finite() => Value::Number(x.to_string().parse().expect("a finite float is a JSON number")),
                x if x.is_nan() => json!("nan"),
                x if *x > 0.0 => json!("inf"),
                _ => json!("-inf"),
            })
            .collect()
    };
    let value = match space {
        Space::Discrete { n, start } => json!({"kind": "discrete", "n": n, "start": start}),
        Space::Box { low, high, shape, dtype } => {
            let dtype = match dtype {
                DType::F32 => "f32",
                DType::U8 => "u8",
            };
            json!({"kind": "box", "shape": shape, "dtype": dtype, "low": bound(low), "high": bound(high)})
        }
    };
    value.to_string()
}

/// Read [`space_to_json`] back.
pub fn space_from_json(value: &Value) -> std::result::Result<Space, String> {
    let bound = |key: &str| -> std::result::Result<Vec<f32>, String> {
        let items = value.get(key).and_then(Value::as_array).ok_or(format!("no {key:?} list"))?;
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => s.parse::<f32>().map_err(|e| format!("{key}: {s:?}: {e}")),
                v => v.as_f64().map(|x| x as f32).ok_or(format!("{key}: {v} is not a number")),
            })
            .collect()
    };
    match value.get("kind").and_then(Value::as_str) {
        Some("discrete") => Ok(Space::Discrete {
            n: value.get("n").and_then(Value::as_u64).ok_or("no \"n\"")? as usize,
            start: value.get("start").and_then(Value::as_i64).unwrap_or(0),
        }),
        Some("box") => {
            let shape = value.get("shape").and_then(Value::as_array).ok_or("no \"shape\"")?;
            let shape = shape
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize).ok_or("bad shape"))
                .collect::<std::result::Result<_, _>>()?;
            let dtype = match value.get("dtype").and_then(Value::as_str) {
                Some("u8") => DType::U8,
                _ => DType::F32,
            };
            Ok(Space::Box { low: bound("low")?, high: bound("high")?, shape, dtype })
        }
        other => Err(format!("unknown space kind {other:?}")),
    }
}

/// One module of the exported `torch.nn.Sequential`, written as `[name, [args]]` (`getattr(torch.nn,
/// name)(*args)` builds it).
#[derive(Debug, Clone, PartialEq)]
pub enum TorchLayer {
    /// `nn.Linear(in_features, out_features)`.
    Linear(usize, usize),
    /// `nn.Conv2d(in_channels, out_channels, kernel_size, stride)`.
    Conv2d(usize, usize, usize, usize),
    /// `nn.ReLU()`.
    Relu,
    /// `nn.Tanh()`.
    Tanh,
    /// `nn.Flatten()` (dimensions 1 onwards).
    Flatten,
    /// `nn.Hardtanh(−c, c)`: clamps to `[−c, c]`.
    Hardtanh(f64),
}

impl TorchLayer {
    fn json(&self) -> Value {
        match *self {
            TorchLayer::Linear(i, o) => json!(["Linear", [i, o]]),
            TorchLayer::Conv2d(i, o, k, s) => json!(["Conv2d", [i, o, k, s]]),
            TorchLayer::Relu => json!(["ReLU", []]),
            TorchLayer::Tanh => json!(["Tanh", []]),
            TorchLayer::Flatten => json!(["Flatten", []]),
            TorchLayer::Hardtanh(c) => json!(["Hardtanh", [-c, c]]),
        }
    }

    fn of(activation: Activation) -> Self {
        match activation {
            Activation::Tanh => TorchLayer::Tanh,
            Activation::Relu => TorchLayer::Relu,
        }
    }
}

/// The acting policy as a PyTorch `nn.Sequential`: its modules, its `state_dict` (`{index}.weight` /
/// `{index}.bias`, plus `log_std` for a Gaussian policy) and the metadata that rebuilds it.
#[derive(Debug)]
pub struct PytorchPolicy {
    /// The modules in order.
    pub layers: Vec<TorchLayer>,
    /// Tensors under their `state_dict` names, then `log_std` where there is one.
    pub tensors: Vec<(String, Tensor)>,
    /// The file's metadata: `layers` (JSON `[[name, [args]], …]`), `output` (`logits`, `q_values`,
    /// `gaussian_mean` or `action`), `action`, `input`, the spaces, and what was folded in.
    pub metadata: BTreeMap<String, String>,
}

impl PytorchPolicy {
    /// Write to a safetensors file, atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_safetensors(path, &self.tensors, &self.metadata)
    }
}

/// The acting policy of `model.safetensors`' `tensors` (described by `arch`) as a PyTorch `nn.Sequential`.
/// Refuses, naming them, task heads (chosen per row by the input, not one `nn.Sequential`) and tensors that
/// do not have the shapes the architecture says.
pub fn to_pytorch(arch: &Architecture, tensors: &[(String, Tensor)]) -> Result<PytorchPolicy> {
    let refuse = |detail: String| Error::Unsupported(format!("cannot export this {} policy: {detail}", arch.algorithm));
    if arch.task_heads > 1 {
        return Err(refuse(format!(
            "it has {} task heads (each row reads the head of the task its observation's one-hot names), which \
             is no single torch.nn.Sequential; export a run trained without task_heads",
            arch.task_heads
        )));
    }
    for (name, shape) in arch.tensor_shapes() {
        let t = tensors.iter().find(|(n, _)| *n == name).map(|(_, t)| t);
        let Some(t) = t else { return Err(refuse(format!("tensor {name:?} is missing from the weights"))) };
        let got: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        if got != shape {
            return Err(refuse(format!("tensor {name:?} has shape {got:?}, the architecture says {shape:?}")));
        }
    }
    let get = |name: String| -> Tensor {
        let t = &tensors.iter().find(|(n, _)| *n == name).expect("checked above").1;
        t.detach().to_kind(Kind::Double)
    };
    let frames = |[c, h, w]: [usize; 3], first: &str| {
        format!("frames [B, {c}, {h}, {w}] as float32 0-255 (Flotilla's division by 255 is folded into {first} 0)")
    };
    // (weight [out, in], bias [out]) of each affine layer, in f64 until written; modules in order.
    let mut layers: Vec<(TorchLayer, Option<(Tensor, Tensor)>)> = Vec::new();
    let input = match &arch.network {
        Network::TwinMlp { prefix, widths, activation, .. } | Network::Mlp { prefix, widths, activation } => {
            // A twin's policy is its index 0, reading the output layer's first `policy_outputs` columns.
            let (twin, outputs) = match arch.network {
                Network::TwinMlp { policy_outputs, .. } => (true, policy_outputs),
                _ => (false, widths[widths.len() - 1]),
            };
            let last = widths.len() - 2;
            for k in 0..=last {
                let (mut w, mut b) = (get(format!("{prefix}.{k}.weight")), get(format!("{prefix}.{k}.bias")));
                if twin {
                    (w, b) = (w.get(0), b.get(0).get(0));
                }
                let out = if k == last { outputs } else { widths[k + 1] };
                let (w, b) = (w.narrow(1, 0, out as i64), b.narrow(0, 0, out as i64));
                layers.push((TorchLayer::Linear(widths[k], out), Some((w.transpose(0, 1), b))));
                if k < last {
                    layers.push((TorchLayer::of(*activation), None));
                }
            }
            format!("observations [B, {}] float32", widths[0])
        }
        Network::NatureCnn { prefix, shape, convs, features, policy_outputs, .. } => {
            push_cnn_torso(&mut layers, &get, prefix, shape, convs);
            let p = *policy_outputs as i64;
            let (w, b) = (
                get(format!("{prefix}.out.weight")).narrow(1, 0, p),
                get(format!("{prefix}.out.bias")).narrow(0, 0, p),
            );
            layers.push((TorchLayer::Linear(*features, *policy_outputs), Some((w.transpose(0, 1), b))));
            frames(*shape, "layer")
        }
    };
    let mut metadata = BTreeMap::new();
    // A recurrent policy: `pre` (observation normalisation, where there is one) ─► the core ─► `layers`.
    let mut pre = Vec::new();
    let input = match &arch.recurrent {
        None => input,
        Some(r) => {
            let observations = match r.torso {
                None => format!("observations [B, {}] float32", r.inputs),
                Some(shape) => {
                    push_cnn_torso(&mut pre, &get, "cnn", &shape, &cnn_convs(NatureCnn::CHANNELS));
                    frames(shape, "pre_layers")
                }
            };
            let (cell, state, floats) = match r.cell {
                crate::nn::recurrent::Recurrence::Lstm => ("LSTM", "[h | c]", 2 * r.hidden),
                _ => ("GRU", "h", r.hidden),
            };
            let state = format!("{state} per row ({floats} floats): zeros at an episode's start");
            let core = json!({
                "module": cell, "args": [r.inputs, r.hidden], "prefix": RecurrentLayout::PREFIX, "state": state,
            });
            metadata.insert("recurrent".into(), core.to_string());
            format!(
                "{observations} and each row's state; `pre_layers`, then torch.nn.{cell}({}, {}) (tensors core.*, \
                 one step: input [1, B, {}]), then `layers` on its output",
                r.inputs, r.hidden, r.inputs
            )
        }
    };
    let input = match &arch.obs_norm {
        None => input,
        Some(norm) => {
            // clamp((x − μ) / √(σ² + ε), −c, c): a diagonal Linear, then Hardtanh.
            let (mean, var) = (get("obs_rms.mean".into()), get("obs_rms.var".into()));
            let inv_std = (var + norm.epsilon).sqrt().reciprocal();
            let d = mean.size()[0] as usize;
            let bias = -(&mean * &inv_std);
            let target = if arch.recurrent.is_some() { &mut pre } else { &mut layers };
            target.insert(0, (TorchLayer::Linear(d, d), Some((inv_std.diag(0), bias))));
            target.insert(1, (TorchLayer::Hardtanh(norm.clip), None));
            let which = if arch.recurrent.is_some() { "pre_layers" } else { "layers" };
            metadata.insert(
                "obs_norm".into(),
                format!(
                    "folded: {which} 0-1 normalise raw observations, clamp((x - mean) / sqrt(var + {}), -{c}, {c})",
                    norm.epsilon,
                    c = norm.clip
                ),
            );
            format!("{input}, raw (normalised by {which} 0-1)")
        }
    };
    let mut extra = Vec::new();
    let (output, action) = match &arch.policy {
        PolicyOutput::Logits { .. } => ("logits", "argmax over the outputs (first maximum): the action's index"),
        PolicyOutput::Gaussian { log_std, .. } => {
            extra.push((log_std.clone(), get(log_std.clone())));
            metadata.insert(
                "log_std".into(),
                format!("tensor {log_std:?} [D]: the Gaussian's state-independent log standard deviation"),
            );
            (
                "gaussian_mean",
                "the outputs (the Gaussian's mean), clipped to the action space's bounds before an env step",
            )
        }
        PolicyOutput::QValues { n, dueling, quantiles } => {
            if *dueling || *quantiles > 1 {
                // Q = M · y: the quantile means (1/N over each group of N), then Q = V + A − mean(A) with
                // [1 | I − 1/n]; both linear, so M folds into the last layer.
                let Some((TorchLayer::Linear(inputs, _), Some((w, b)))) = layers.pop() else { unreachable!("affine") };
                let (n, z) = (*n as i64, *quantiles as i64);
                let opts = (Kind::Double, tch::Device::Cpu);
                let groups = n + i64::from(*dueling);
                let mut m = Tensor::eye(groups, opts).repeat_interleave_self_int(z, 1, None) / z as f64;
                if *dueling {
                    let combine = Tensor::cat(&[Tensor::ones([n, 1], opts), Tensor::eye(n, opts) - 1.0 / n as f64], 1);
                    m = combine.matmul(&m);
                    metadata.insert(
                        "dueling".into(),
                        "folded: the last layer outputs Q = V + A - mean(A) (Flotilla's output layer is [V, A_1..A_n])"
                            .into(),
                    );
                }
                if z > 1 {
                    metadata.insert(
                        "quantiles".into(),
                        format!("folded: the last layer outputs Q, the mean of each action's {z} return quantiles"),
                    );
                }
                layers.push((TorchLayer::Linear(inputs, n as usize), Some((m.matmul(&w), m.matmul(&b)))));
            }
            ("q_values", "argmax over the outputs (first maximum): the action's index")
        }
        PolicyOutput::TanhScaled { low, high } => {
            // a ∈ [−1, 1] ─► low + (a + 1)/2 · (high − low) = a · (high − low)/2 + (high + low)/2.
            let d = low.len();
            let lo = Tensor::from_slice(low).to_kind(Kind::Double);
            let hi = Tensor::from_slice(high).to_kind(Kind::Double);
            layers.push((TorchLayer::Tanh, None));
            layers.push((TorchLayer::Linear(d, d), Some((((&hi - &lo) / 2.0).diag(0), (&hi + &lo) / 2.0))));
            metadata.insert("action_low".into(), serde_json::to_string(low).expect("floats"));
            metadata.insert("action_high".into(), serde_json::to_string(high).expect("floats"));
            ("action", "the outputs: tanh of the actor, scaled to [action_low, action_high] by the last Linear")
        }
    };
    let mut named = Vec::new();
    let mut write = |prefix: &str, layers: &[(TorchLayer, Option<(Tensor, Tensor)>)]| {
        for (i, (_, params)) in layers.iter().enumerate() {
            if let Some((w, b)) = params {
                named.push((format!("{prefix}{i}.weight"), w.to_kind(Kind::Float).contiguous()));
                named.push((format!("{prefix}{i}.bias"), b.to_kind(Kind::Float).contiguous()));
            }
        }
    };
    write("", &layers);
    if arch.recurrent.is_some() {
        write("pre.", &pre);
        for suffix in ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"] {
            let name = format!("{}.{suffix}", RecurrentLayout::PREFIX);
            named.push((name.clone(), get(name).to_kind(Kind::Float).contiguous()));
        }
        let pre: Vec<Value> = pre.iter().map(|(l, _)| l.json()).collect();
        metadata.insert("pre_layers".into(), Value::Array(pre).to_string());
    }
    named.extend(extra.into_iter().map(|(n, t)| (n, t.to_kind(Kind::Float).contiguous())));
    let layers: Vec<TorchLayer> = layers.into_iter().map(|(l, _)| l).collect();
    let spec = Value::Array(layers.iter().map(TorchLayer::json).collect());
    metadata.extend([
        ("format".to_string(), "pt".to_string()),
        ("flotilla_export_version".into(), EXPORT_VERSION.to_string()),
        ("algorithm".into(), arch.algorithm.clone()),
        ("layers".into(), spec.to_string()),
        ("output".into(), output.into()),
        ("action".into(), action.into()),
        ("input".into(), input),
        ("observation_space".into(), space_to_json(&arch.observation_space)),
        ("action_space".into(), space_to_json(&arch.action_space)),
    ]);
    Ok(PytorchPolicy { layers, tensors: named, metadata })
}

#[cfg(test)]
impl PytorchPolicy {
    /// The module's output as PyTorch computes it (`nn.Linear`: x·Wᵀ + b), for checks in Rust.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        let param = |name: String| &self.tensors.iter().find(|(n, _)| *n == name).expect("exported tensor").1;
        let mut h = x.to_kind(Kind::Float);
        for (i, layer) in self.layers.iter().enumerate() {
            h = match *layer {
                TorchLayer::Linear(..) => h.linear(param(format!("{i}.weight")), Some(param(format!("{i}.bias")))),
                TorchLayer::Conv2d(_, _, _, s) => {
                    let (w, b) = (param(format!("{i}.weight")), param(format!("{i}.bias")));
                    h.conv2d(w, Some(b), [s as i64, s as i64], [0, 0], [1, 1], 1)
                }
                TorchLayer::Relu => h.relu(),
                TorchLayer::Tanh => h.tanh(),
                TorchLayer::Flatten => h.flatten(1, -1),
                TorchLayer::Hardtanh(c) => h.clamp(-c, c),
            };
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2c::{A2cConfig, A3cConfig};
    use crate::distill::DistillConfig;
    use crate::dqn::DqnConfig;
    use crate::ppo::PpoConfig;
    use crate::registry::AlgorithmConfig;
    use crate::sac::SacConfig;
    use crate::td3::{DdpgConfig, Td3Config};
    use crate::{ActMode, ActOutput};
    use flotilla_core::ObsRef;
    use tch::Device;

    fn cartpole() -> (Space, Space) {
        (
            Space::box1d(
                vec![-4.8, f32::NEG_INFINITY, -0.42, f32::NEG_INFINITY],
                vec![4.8, f32::INFINITY, 0.42, f32::INFINITY],
            ),
            Space::discrete(2),
        )
    }

    fn pendulum() -> (Space, Space) {
        (Space::box1d(vec![-1.0, -1.0, -8.0], vec![1.0, 1.0, 8.0]), Space::box1d(vec![-2.0], vec![2.0]))
    }

    fn frames() -> (Space, Space) {
        let n = 4 * 44 * 44;
        (
            Space::Box { low: vec![0.0; n], high: vec![255.0; n], shape: vec![4, 44, 44], dtype: DType::U8 },
            Space::discrete(3),
        )
    }

    /// Every kind the registry builds: the architecture names every weight with its shape, survives the
    /// metadata round trip, and the exported `nn.Sequential` (run as PyTorch runs it) gives the agent's own
    /// deterministic actions.
    #[test]
    fn exported_policies_act_as_the_agent() {
        let small = vec![16, 8];
        // The CNNs in f32: the exported policy runs PyTorch's f32 forward (bf16 acting differs by its rounding).
        let f32 = crate::nn::nets::CnnOptions::F32;
        let configs = [
            (AlgorithmConfig::Ppo(PpoConfig { hidden_sizes: small.clone(), ..Default::default() }), cartpole()),
            (AlgorithmConfig::Ppo(PpoConfig { hidden_sizes: small.clone(), ..Default::default() }), pendulum()),
            (AlgorithmConfig::A2c(A2cConfig::default()), cartpole()),
            (AlgorithmConfig::A3c(A3cConfig(A2cConfig::default())), pendulum()),
            (AlgorithmConfig::Ppo(PpoConfig { cnn: f32, ..Default::default() }), frames()),
            (AlgorithmConfig::Dqn(DqnConfig { hidden_sizes: small.clone(), ..Default::default() }), cartpole()),
            (
                AlgorithmConfig::Dqn(DqnConfig { dueling: true, hidden_sizes: small.clone(), ..Default::default() }),
                cartpole(),
            ),
            (AlgorithmConfig::Dqn(DqnConfig { dueling: true, cnn: f32, ..Default::default() }), frames()),
            (
                AlgorithmConfig::Dqn(DqnConfig { n_quantiles: 5, hidden_sizes: small.clone(), ..Default::default() }),
                cartpole(),
            ),
            (
                AlgorithmConfig::Dqn(DqnConfig {
                    n_quantiles: 3,
                    dueling: true,
                    hidden_sizes: small.clone(),
                    ..Default::default()
                }),
                cartpole(),
            ),
            (AlgorithmConfig::Dqn(DqnConfig { n_quantiles: 4, cnn: f32, ..Default::default() }), frames()),
            (AlgorithmConfig::Ddpg(DdpgConfig { hidden_sizes: small.clone(), ..Default::default() }), pendulum()),
            (AlgorithmConfig::Td3(Td3Config { hidden_sizes: small.clone(), ..Default::default() }), pendulum()),
            (AlgorithmConfig::Sac(SacConfig { hidden_sizes: small.clone(), ..Default::default() }), pendulum()),
            (AlgorithmConfig::Distill(DistillConfig { teachers: vec!["t".into()], ..Default::default() }), cartpole()),
            (AlgorithmConfig::Distill(DistillConfig { teachers: vec!["t".into()], ..Default::default() }), pendulum()),
            (
                AlgorithmConfig::Distill(DistillConfig {
                    teachers: vec!["t".into()],
                    hidden_sizes: vec![32],
                    cnn_channels: vec![8, 16, 16],
                    cnn: f32,
                    ..Default::default()
                }),
                frames(),
            ),
        ];
        let dir = std::env::temp_dir().join(format!("flotilla-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, (config, (o, a))) in configs.iter().enumerate() {
            let name = format!("{} #{i}", config.name());
            let mut agent = config.build_learner(o, a, 8, Device::Cpu, 7).unwrap();
            // Non-zero biases and log-std, so the check covers them.
            tch::no_grad(|| {
                let flat = agent.policy_params().flat().shallow_clone();
                let r = crate::nn::nets::with_torch_seed(60 + i as u64, || {
                    Tensor::randn(flat.size(), (Kind::Float, Device::Cpu))
                });
                let _ = flat.shallow_clone().g_add_(&(r * 0.05));
            });
            let arch = config.architecture(o, a).unwrap();
            let params = agent.policy_params();
            let (have, training_only): (Vec<(String, Vec<usize>)>, Vec<_>) = params
                .names()
                .enumerate()
                .map(|(i, n)| (n.to_string(), params.view(i).size().iter().map(|&d| d as usize).collect()))
                .partition(|(n, _)| arch.tensor_shapes().iter().any(|(a, _)| a == n));
            assert_eq!(arch.tensor_shapes(), have, "{name}");
            // The one head the deterministic policy does not read: SAC's log standard deviation.
            assert!(training_only.iter().all(|(n, _)| n.starts_with("log_std.")), "{name}: {training_only:?}");
            // What save_weights writes carries the architecture.
            let path = dir.join(format!("model{i}.safetensors"));
            agent.save_weights(&path).unwrap();
            let (tensors, meta) = read_safetensors(&path).unwrap();
            assert_eq!(Architecture::from_metadata("test", &meta).unwrap().as_ref(), Some(&arch), "{name}");
            agent.load_weights(&path).unwrap();
            // Same weights, same bytes (metadata keys in a fixed order).
            let again = dir.join(format!("again{i}.safetensors"));
            agent.save_weights(&again).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(&again).unwrap(), "{name}");

            let policy = to_pytorch(&arch, &tensors).unwrap();
            let rows = 5;
            let obs_dim = o.flat_dim();
            let (mut want, x) = (ActOutput::default(), Vec::<f32>::new());
            let x = if matches!(o, Space::Box { dtype: DType::U8, .. }) {
                let bytes: Vec<u8> = (0..rows * obs_dim).map(|k| ((k * 37 + i) % 256) as u8).collect();
                agent.act(ObsRef::U8(&bytes), ActMode::Deterministic, &mut want).unwrap();
                Tensor::from_slice(&bytes).to_kind(Kind::Float).view([rows as i64, 4, 44, 44])
            } else {
                let mut x = x;
                x.extend((0..rows * obs_dim).map(|k| ((k as f32 + i as f32) * 0.71).sin()));
                agent.act(ObsRef::F32(&x), ActMode::Deterministic, &mut want).unwrap();
                Tensor::from_slice(&x).view([rows as i64, obs_dim as i64])
            };
            let y = policy.forward(&x);
            let got: Vec<f32> = match policy.metadata["output"].as_str() {
                "logits" | "q_values" => {
                    Vec::<i64>::try_from(y.argmax(-1, false)).unwrap().iter().map(|&a| a as f32).collect()
                }
                _ => Vec::<f32>::try_from(y.flatten(0, -1)).unwrap(),
            };
            assert_eq!(got.len(), want.actions.len(), "{name}");
            for (g, w) in got.iter().zip(&want.actions) {
                assert!((g - w).abs() <= 1e-5, "{name}: exported {got:?}, agent {:?}", want.actions);
            }
            if !want.q_values.is_empty() {
                let q = Vec::<f32>::try_from(y.flatten(0, -1)).unwrap();
                assert!(q.iter().zip(&want.q_values).all(|(a, b)| (a - b).abs() < 1e-4), "{name}: Q {q:?}");
            }
            // The layer list is PyTorch's: weights [out, in] under `{index}.weight`.
            if let TorchLayer::Linear(i, o) = policy.layers[0] {
                assert_eq!(policy.tensors[0].0, "0.weight");
                assert_eq!(policy.tensors[0].1.size(), [o as i64, i as i64], "{name}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn task_heads_are_refused_by_name_and_spaces_round_trip() {
        let (o, a) = cartpole();
        let config =
            AlgorithmConfig::Dqn(DqnConfig { task_heads: true, tasks: 2, hidden_sizes: vec![8], ..Default::default() });
        let arch = config.architecture(&o, &a).unwrap();
        let agent = config.build_learner(&o, &a, 1, Device::Cpu, 1).unwrap();
        let p = agent.policy_params();
        let tensors: Vec<(String, Tensor)> =
            p.names().enumerate().map(|(i, n)| (n.to_string(), p.view(i).detach())).collect();
        let e = to_pytorch(&arch, &tensors).unwrap_err().to_string();
        assert!(e.contains("2 task heads") && e.contains("dqn"), "{e}");
        // A tensor of another shape is named.
        let arch = AlgorithmConfig::Dqn(DqnConfig { hidden_sizes: vec![9], ..Default::default() })
            .architecture(&o, &a)
            .unwrap();
        let e = to_pytorch(&arch, &tensors).unwrap_err().to_string();
        assert!(e.contains("\"q.0.weight\"") && e.contains("[4, 9]"), "{e}");
        // Infinite bounds survive JSON.
        let json: Value = serde_json::from_str(&space_to_json(&o)).unwrap();
        assert_eq!(space_from_json(&json).unwrap(), o);
    }
}
