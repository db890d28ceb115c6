//! Network torsos: a multi-layer perceptron and the Nature-DQN convolutional torso.
//!
//! Initialisation follows Stable-Baselines3 / CleanRL: orthogonal weights with gain √2 on hidden layers (a
//! caller-chosen gain on the output layer, e.g. 0.01 for policy logits, 1 for values) and zero biases.
use serde::{Deserialize, Serialize};
use tch::nn::{self, Init, LinearConfig, Module};
use tch::Tensor;

/// Run `build` with libtorch's global generator seeded with `seed`, holding a process-wide lock, so that
/// networks built on several threads at once still get the same weights for the same seed.
pub fn with_torch_seed<T>(seed: u64, build: impl FnOnce() -> T) -> T {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed as i64);
    build()
}

/// Hidden-layer nonlinearity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `tanh` (SB3's default for on-policy MLPs).
    #[default]
    Tanh,
    /// `relu`.
    Relu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
        }
    }
}

/// A linear layer with orthogonal weights of the given gain and zero bias.
pub fn orthogonal_linear(p: nn::Path, inputs: i64, outputs: i64, gain: f64) -> nn::Linear {
    let cfg = LinearConfig { ws_init: Init::Orthogonal { gain }, bs_init: Some(Init::Const(0.0)), bias: true };
    nn::linear(p, inputs, outputs, cfg)
}

/// A multi-layer perceptron: `hidden.len()` hidden layers with `activation`, then a linear output layer
/// (no activation). Parameters live under `p / "0"`, `p / "1"`, ... in layer order.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<nn::Linear>,
    activation: Activation,
}

impl Mlp {
    /// Build the layers under `p`; `out_gain` is the orthogonal gain of the output layer.
    pub fn new(p: &nn::Path, inputs: i64, hidden: &[i64], outputs: i64, activation: Activation, out_gain: f64) -> Self {
        let mut layers = Vec::with_capacity(hidden.len() + 1);
        let mut width = inputs;
        for (i, &h) in hidden.iter().enumerate() {
            layers.push(orthogonal_linear(p / i.to_string(), width, h, 2f64.sqrt()));
            width = h;
        }
        layers.push(orthogonal_linear(p / hidden.len().to_string(), width, outputs, out_gain));
        Mlp { layers, activation }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        let (last, hidden) = self.layers.split_last().expect("an MLP has an output layer");
        let mut h = None;
        for layer in hidden {
            h = Some(self.activation.apply(&layer.forward(h.as_ref().unwrap_or(x))));
        }
        last.forward(h.as_ref().unwrap_or(x))
    }
}

/// The convolutional torso of Mnih et al. (2015), "Human-level control through deep reinforcement learning":
/// 32×8×8 stride 4, 64×4×4 stride 2, 64×3×3 stride 1, then a 512-unit linear layer, all ReLU.
/// Takes u8 (or float 0–255) frames `[B, C, 84, 84]` and scales them to `[0, 1]`; outputs `[B, 512]`.
#[derive(Debug)]
pub struct NatureCnn {
    convs: [nn::Conv2D; 3],
    fc: nn::Linear,
}

impl NatureCnn {
    /// Number of features the torso outputs.
    pub const FEATURES: i64 = 512;

    /// Build the torso for `channels` stacked 84×84 frames.
    pub fn new(p: &nn::Path, channels: i64) -> Self {
        let gain = 2f64.sqrt();
        let conv = |name: &str, i, o, k, stride| {
            let cfg = nn::ConvConfig { stride, bs_init: Init::Const(0.0), ..Default::default() };
            let conv = nn::conv2d(p / name, i, o, k, cfg);
            // tch's `Init::Orthogonal` returns a 2-D matrix for 4-D shapes: draw it flat and reshape here.
            let flat = nn::init(Init::Orthogonal { gain }, &[o, i * k * k], p.device());
            tch::no_grad(|| conv.ws.shallow_clone().copy_(&flat.view([o, i, k, k])));
            conv
        };
        let convs = [conv("conv1", channels, 32, 8, 4), conv("conv2", 32, 64, 4, 2), conv("conv3", 64, 64, 3, 1)];
        let fc = orthogonal_linear(p / "fc", 64 * 7 * 7, Self::FEATURES, gain);
        NatureCnn { convs, fc }
    }
}

impl Module for NatureCnn {
    fn forward(&self, frames: &Tensor) -> Tensor {
        let mut h = frames.to_kind(tch::Kind::Float) / 255.0;
        for conv in &self.convs {
            h = conv.forward(&h).relu();
        }
        self.fc.forward(&h.flatten(1, -1)).relu()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn mlp_shapes_and_init() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let mlp = Mlp::new(&vs.root(), 4, &[64, 64], 2, Activation::Tanh, 0.01);
        let y = mlp.forward(&Tensor::ones([5, 4], (Kind::Float, Device::Cpu)));
        assert_eq!(y.size(), vec![5, 2]);
        let vars = vs.variables();
        assert_eq!(vars.len(), 6);
        // Zero biases; orthogonal hidden weights: W Wᵀ = 2 I for a 64×4 matrix with gain √2 (columns orthogonal).
        assert_eq!(f64::try_from(vars["0.bias"].abs().sum(Kind::Float)).unwrap(), 0.0);
        let w = &vars["0.weight"];
        let gram = w.transpose(0, 1).matmul(w);
        let eye = Tensor::eye(4, (Kind::Float, Device::Cpu)) * 2.0;
        assert!(f64::try_from((gram - eye).abs().max()).unwrap() < 1e-4);
        // Small output gain gives near-zero initial logits.
        assert!(f64::try_from(y.abs().max()).unwrap() < 0.2);
    }

    #[test]
    fn nature_cnn_shape_and_size() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cnn = NatureCnn::new(&vs.root(), 4);
        let frames = Tensor::zeros([2, 4, 84, 84], (Kind::Uint8, Device::Cpu));
        assert_eq!(cnn.forward(&frames).size(), vec![2, 512]);
        let params: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
        assert_eq!(params, 8_224 + 32_832 + 36_928 + 1_606_144);
        // Orthogonal rows for each conv kernel bank: W Wᵀ = 2 I with W the kernels flattened.
        let w = vs.variables()["conv1.weight"].view([32, -1]);
        let gram = w.matmul(&w.transpose(0, 1));
        let eye = Tensor::eye(32, (Kind::Float, Device::Cpu)) * 2.0;
        assert!(f64::try_from((gram - eye).abs().max()).unwrap() < 1e-4);
    }
}
