//! Policy distillation (Rusu et al. 2016, "Policy Distillation"): a student network learns to output what a
//! trained teacher outputs on the same states.
//!
//! ```text
//! [algorithm] kind = "distill", teachers = ["runs/cartpole-ppo"], hidden_sizes = [8], loss = "kl"
//!
//! act (student samples, DAgger; or the teacher acts)  ─► states ─► teacher.teach(states) ─► labelled replay
//! every train_freq steps: minibatch of (state, label) ─► loss(student(state), label) ─► Adam
//! ```
//!
//! What a teacher says ([`Teaching`]) depends on its kind: action logits (PPO/A2C on discrete actions),
//! Q-values (DQN), a diagonal Gaussian (PPO/A2C on boxes) or a deterministic action (DDPG/TD3). The student is
//! a plain MLP policy: logits for discrete actions, a Gaussian (mean and a state-independent log-std) for
//! boxes. The losses ([`DistillLoss`]), as Rusu compares them:
//! - `kl`: `KL(softmax(t/τ) ‖ softmax(s))` on logits or Q-values `t` (τ = 0.01 for Q-values, 1 for logits by
//!   default), `KL(N_teacher ‖ N_student)` for Gaussian teachers;
//! - `nll`: `−log π_student(teacher's greedy / mean action)`;
//! - `mse`: `‖s − t‖²` on the raw outputs (Q-values, logits, means, actions), averaged over outputs.
//!
//! On frames (u8 image observations) the student is a Nature-shaped CNN (`cnn_channels`, one fc layer of
//! `hidden_sizes = [F]` units; e.g. a Pong student of a quarter of the teacher's parameters), its replay keeps
//! the frames as bytes, and teachers label u8 frames.
//!
//! Teachers are loaded by the learner (from run directories) and handed over with
//! [`crate::algorithm::Student::set_teachers`]; they are not part of a checkpoint (a resumed run reloads them). Several
//! teachers (Rusu's multi-task distillation) come one per task of a `[[tasks]]` run, whose observations end
//! with the task's one-hot: each row is labelled by its task's teacher (one-hot stripped) and the student
//! shares its hidden layers between the tasks, with one output head per task.

use flotilla_core::{Chunk, DType, ObsBuf, ObsRef, Space};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::acting::{Acting, ActingPolicy, ActingSetup};
use crate::algorithm::Algorithm;
use crate::checkpoint::Checkpoint;
use crate::error::Checks;
use crate::export::{Architecture, Network, policy_head, policy_width};
use crate::kind::{AlgorithmKind, KindName, not_data_parallel};
use crate::nn::distributions::{sample_categorical, sample_diag_gaussian};
use crate::nn::host_mlp::HostScratch;
use crate::nn::nets::{
    Activation, CnnOptions, FlatMlp, LayerInit, NatureCnn, ObsLayout, is_image, mlp_input_dim, select_task_heads,
    select_task_heads_tensor, with_torch_seed,
};
use crate::nn::optimiser::Adam;
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy, f32_obs};
use crate::progress::Progress;
pub use crate::teaching::{Teaching, TeachingKind};
use crate::{Error, Metrics, Result};

/// The distillation loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistillLoss {
    /// `KL(teacher ‖ student)`, the teacher's logits or Q-values sharpened by the temperature τ.
    #[default]
    Kl,
    /// Negative log-likelihood of the teacher's greedy (discrete) or mean (continuous) action.
    Nll,
    /// Mean squared error between the student's and the teacher's raw outputs.
    Mse,
}

/// Who picks the actions that generate the states to label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActWith {
    /// The student samples its own policy (DAgger: the teacher labels the states the student visits).
    #[default]
    Student,
    /// The teacher acts greedily (Rusu's setting: the teacher's own state distribution). In-process only.
    Teacher,
}

/// `[algorithm] kind = "distill"`: the student network, its loss and its labelled replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistillConfig {
    /// Run directories written by `flotilla train` whose `model.safetensors` and `config.toml` give the
    /// teachers: one, or one per task of a multi-task run (`[[tasks]]`, in order), distilled into one student
    /// with a head per task.
    pub teachers: Vec<String>,
    /// Hidden layer widths of the student MLP (typically far smaller than the teacher's). On frames: one width,
    /// the units of the student CNN's fc layer.
    pub hidden_sizes: Vec<i64>,
    /// On frames: output channels of the student CNN's three convolutions (the Nature CNN's kernels and
    /// strides; default Nature's `[32, 64, 64]`).
    pub cnn_channels: Vec<i64>,
    /// On frames: how the student CNN computes (`[algorithm.cnn]`: bf16 by default where the CPU has it).
    pub cnn: CnnOptions,
    /// Hidden nonlinearity.
    pub activation: Activation,
    /// The loss.
    pub loss: DistillLoss,
    /// τ of the `kl` loss on discrete teachers: `softmax(t/τ)`. Default 0.01 for Q-value teachers (Rusu), 1 for
    /// policy logits. Only the `kl` loss on a discrete teacher uses it; elsewhere setting it is an error.
    pub temperature: Option<f64>,
    /// Who acts to generate the states.
    pub act_with: ActWith,
    /// Labelled states kept (a ring: the oldest go first).
    pub buffer_size: usize,
    /// States per gradient step.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over the run (SB3's `progress_remaining`): late in a run the
    /// student's own states crowd the replay and a constant step size keeps chasing the teacher's label noise.
    pub anneal_lr: bool,
    /// Adam ε.
    pub adam_eps: f64,
    /// Labelled states before the first gradient step.
    pub learning_starts: usize,
    /// Vectorised env steps between training phases.
    pub train_freq: usize,
    /// Gradient steps per training phase.
    pub gradient_steps: usize,
    /// Global gradient-norm limit.
    pub max_grad_norm: f64,
    /// Initial log standard deviation of a Gaussian student.
    pub log_std_init: f64,
}

impl Default for DistillConfig {
    fn default() -> Self {
        DistillConfig {
            teachers: Vec::new(),
            hidden_sizes: vec![16],
            cnn_channels: NatureCnn::CHANNELS.to_vec(),
            cnn: CnnOptions::default(),
            activation: Activation::Tanh,
            loss: DistillLoss::Kl,
            temperature: None,
            act_with: ActWith::Student,
            buffer_size: 50_000,
            batch_size: 64,
            learning_rate: 3e-3,
            anneal_lr: false,
            adam_eps: 1e-8,
            learning_starts: 256,
            train_freq: 1,
            gradient_steps: 1,
            max_grad_norm: 10.0,
            log_std_init: 0.0,
        }
    }
}

impl AlgorithmKind for DistillConfig {
    fn validate(&self, _num_envs: usize) -> Result<()> {
        DistillConfig::validate(self)
    }

    /// Actor processes act with the student (broadcast like any policy), never the teacher.
    fn check_distributed(&self) -> Result<()> {
        if self.act_with == ActWith::Teacher {
            return Err(Error::config(
                "distill",
                "act_with",
                "\"teacher\"",
                "actor processes act with the student (its parameters are what the learner broadcasts); \
                 use act_with = \"student\" with actors, or train in one process",
            ));
        }
        Ok(())
    }

    fn check_assemble_ahead(&self) -> std::result::Result<(), String> {
        Err("distill labels states with its teacher and samples them on the update thread".into())
    }

    fn check_data_parallel(&self) -> std::result::Result<(), String> {
        not_data_parallel(self.name())
    }

    fn learner(&self, o: &Space, a: &Space, _n_envs: usize, device: Device, seed: u64) -> Result<Box<dyn Algorithm>> {
        Ok(Box::new(Distill::new(o, a, self.clone(), device, seed)?))
    }

    fn cnn_options(&self) -> Option<CnnOptions> {
        Some(self.cnn)
    }

    /// The student ([`DistillPolicy`]): one head per teacher.
    fn architecture(&self, o: &Space, a: &Space) -> Result<Architecture> {
        let heads = self.teachers.len().max(1);
        let policy = policy_head(a)?;
        let outputs = policy_width(&policy) * heads;
        let network = if is_image(o) {
            let (channels, features) = self.student_cnn()?;
            Network::nature_cnn("student", o, channels, features, outputs, outputs)?
        } else {
            Network::mlp("student", mlp_input_dim("distill", o)?, &self.hidden_sizes, outputs, self.activation)
        };
        Ok(Architecture::new("distill", network, policy, heads, o, a))
    }

    fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let policy = DistillPolicy::new(setup.observation_space, setup.action_space, self, Device::Cpu, setup.seed)?;
        Ok(Acting::Chunks(Box::new(policy)))
    }

    fn teachers(&self) -> &[String] {
        &self.teachers
    }
}

impl DistillConfig {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<()> {
        let channels = &self.cnn_channels;
        Checks::of("distill")
            .that(!self.teachers.is_empty(), "teachers", "[]", "name the run directory of a trained teacher")
            .that(
                self.act_with != ActWith::Teacher || self.teachers.len() <= 1,
                "act_with",
                "\"teacher\"",
                "one teacher acts for one task; with a teacher per task the student acts (act_with = \"student\")",
            )
            .widths("hidden_sizes", &self.hidden_sizes)
            .that(
                channels.len() == 3 && channels.iter().all(|&c| c > 0),
                "cnn_channels",
                format!("{channels:?}"),
                "three positive channel counts",
            )
            .set(self.temperature, |c, t| c.positive("temperature", t))
            .at_least_one("buffer_size", self.buffer_size)
            .at_least_one("batch_size", self.batch_size)
            .adam(self.learning_rate, self.adam_eps)
            .at_least_one("train_freq", self.train_freq)
            .at_least_one("gradient_steps", self.gradient_steps)
            .limit("max_grad_norm", self.max_grad_norm)
            .finite("log_std_init", self.log_std_init)
            .done()
    }

    /// The student CNN's channels (checked by [`DistillConfig::validate`]) and fc width (`hidden_sizes` must be
    /// one width on frames).
    fn student_cnn(&self) -> Result<([i64; 3], i64)> {
        let bad = |field, value: &[i64], detail: &str| Error::config("distill", field, format!("{value:?}"), detail);
        let channels = <[i64; 3]>::try_from(self.cnn_channels.as_slice())
            .map_err(|_| bad("cnn_channels", &self.cnn_channels, "three positive channel counts"))?;
        match self.hidden_sizes[..] {
            [f] if f > 0 => Ok((channels, f)),
            _ => Err(bad(
                "hidden_sizes",
                &self.hidden_sizes,
                "on frames the student is a CNN with one fc layer: give its width, e.g. [256]",
            )),
        }
    }
}

/// Discrete (`n` logits) or continuous (`D` Gaussian means) actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    Discrete(usize),
    Gaussian(usize),
}

impl Head {
    /// Outputs of one task head: `n` logits or `D` means.
    fn width(self) -> usize {
        match self {
            Head::Discrete(n) | Head::Gaussian(n) => n,
        }
    }
}

/// The student's layers: an MLP on vectors, a Nature-shaped CNN on frames.
#[derive(Debug)]
enum Body {
    Mlp(FlatMlp),
    Cnn(NatureCnn),
}

/// The student and its acting policy (an actor holds one; the learner acts with one): an MLP `obs → logits`
/// or `obs → means` (named `student.{k}`), plus `log_std` for boxes; on frames a CNN (`student.conv1..3`,
/// `student.fc`, `student.out`). With `H > 1` teachers (one per task) the observation ends with the task's
/// one-hot (`H` floats, `flotilla_envs::TaskVecEnv`): the hidden layers are shared by every task (they see the
/// one-hot too) and the output layer holds one head per task, of which each row reads its own task's.
#[derive(Debug)]
pub struct DistillPolicy {
    /// Every parameter (what a broadcast carries and `save_weights` writes).
    params: FlatParams,
    body: Body,
    log_std: Option<usize>,
    head: Head,
    obs_dim: usize,
    /// Heads (tasks); 1 for a single teacher.
    heads: usize,
    /// Action sampling.
    rng: Pcg64,
    host: HostScratch,
    /// The network's outputs for the rows acting.
    outputs: Vec<f32>,
    samples: Vec<(i64, f32)>,
}

impl DistillPolicy {
    /// A student for these spaces (vectors or frames; discrete or 1-D box actions): `seed` fixes its initial
    /// weights and its action sampling.
    pub fn new(obs: &Space, act: &Space, config: &DistillConfig, device: Device, seed: u64) -> Result<Self> {
        let head = match act {
            Space::Discrete { n, .. } => Head::Discrete(*n),
            Space::Box { shape, .. } if shape.len() == 1 => Head::Gaussian(shape[0]),
            other => return Err(Error::space("action", "distill", format!("{other:?}"))),
        };
        let frames = is_image(obs);
        let obs_dim = if frames { obs.flat_dim() } else { mlp_input_dim("distill", obs)? };
        let heads = config.teachers.len().max(1);
        if heads > 1 && frames {
            return Err(Error::space(
                "observation",
                "distill",
                format!("{heads} teachers (one per task) need vector observations with a task one-hot"),
            ));
        }
        if heads > 1 && obs_dim <= heads {
            return Err(Error::space(
                "observation",
                "distill",
                format!("{heads} teachers need observations ending with a {heads}-task one-hot; got {obs_dim} floats"),
            ));
        }
        let outputs = head.width() as i64;
        let (body, mut named) = if frames {
            let (channels, features) = config.student_cnn()?;
            let built = with_torch_seed(seed, || {
                NatureCnn::init_sized("student", obs.shape(), channels, features, &[(outputs, 0.01)], 0)
            });
            let (cnn, named) = built.ok_or_else(|| {
                Error::space(
                    "observation",
                    "distill",
                    format!("{:?}: frames must be [C, H, W] with H, W ≥ 36", obs.shape()),
                )
            })?;
            (Body::Cnn(cnn.with_options(config.cnn)), named)
        } else {
            let (mlp, named) = with_torch_seed(seed, || {
                let init = LayerInit::Orthogonal { out_gain: 0.01 };
                let (inputs, hidden, act) = (obs_dim as i64, &config.hidden_sizes, config.activation);
                FlatMlp::init("student", inputs, hidden, outputs * heads as i64, act, init, 0)
            });
            (Body::Mlp(mlp), named)
        };
        let log_std = match head {
            Head::Discrete(_) => None,
            Head::Gaussian(d) => {
                named.push((
                    "log_std".into(),
                    Tensor::full([d as i64], config.log_std_init, (Kind::Float, Device::Cpu)),
                ));
                Some(named.len() - 1)
            }
        };
        Ok(DistillPolicy {
            params: FlatParams::new(named, device),
            body,
            log_std,
            head,
            obs_dim,
            heads,
            rng: Pcg64::seed_from_u64(seed ^ 0xd157_0001),
            host: HostScratch::default(),
            outputs: Vec::new(),
            samples: Vec::new(),
        })
    }

    /// Logits or means, `[B, outputs]`, on `x` `[B, obs_dim]` (each row's own task's head; frames as u8).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mlp = match &self.body {
            Body::Mlp(mlp) => mlp,
            Body::Cnn(cnn) => {
                let [c, h, w] = cnn.shape();
                return cnn.forward(&self.params, &x.view([-1, c, h, w]));
            }
        };
        let all = mlp.forward(&self.params, x);
        if self.heads == 1 { all } else { select_task_heads_tensor(x, self.heads, &all) }
    }

    /// The task of each row of `x` (`rows × obs_dim`): where its one-hot is hot (0 for a single teacher).
    fn tasks_of(&self, x: &[f32]) -> Vec<usize> {
        let h = self.heads;
        x.chunks_exact(self.obs_dim)
            .map(|row| {
                let hot = &row[self.obs_dim - h..];
                hot.iter().enumerate().fold(0, |best, (i, v)| if *v > hot[best] { i } else { best })
            })
            .collect()
    }

    /// The log-std parameter of a Gaussian student.
    fn log_std(&self) -> Option<&Tensor> {
        self.log_std.map(|i| self.params.view(i))
    }

    /// What the student takes: u8 frames (a CNN) or f32 vectors (an MLP).
    fn dtype(&self) -> DType {
        if matches!(self.body, Body::Cnn(_)) { DType::U8 } else { DType::F32 }
    }

    /// Observations as the network's input on the parameters' device (frames stay u8).
    fn obs_tensor(&self, obs: ObsRef<'_>) -> Result<Tensor> {
        let image = match &self.body {
            Body::Cnn(cnn) => Some(cnn.shape()),
            Body::Mlp(_) => None,
        };
        let x = ObsLayout { obs_dim: self.obs_dim, image, device: self.params.flat().device() }.tensor(obs)?;
        if obs.dtype() != self.dtype() {
            let takes = if self.dtype() == DType::U8 { "u8 frames" } else { "f32 vectors" };
            let detail = format!("{:?} observations for a student that takes {takes}", obs.dtype());
            return Err(Error::space("observation", "distill", detail));
        }
        Ok(x)
    }
}

impl Policy for DistillPolicy {
    fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    fn act_dim(&self) -> usize {
        match self.head {
            Head::Discrete(_) => 1,
            Head::Gaussian(d) => d,
        }
    }

    /// Samples the student's policy (or takes its mode); fills actions and their log-probs.
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        if obs.is_empty() || !obs.len().is_multiple_of(self.obs_dim) {
            return Err(Error::length("observation batch", obs.len(), self.obs_dim));
        }
        let rows = obs.len() / self.obs_dim;
        let deterministic = mode == ActMode::Deterministic;
        // MLPs on f32 rows act in plain Rust where they can; CNNs (and the rest) through libtorch.
        let on_host = match (&self.body, obs) {
            (Body::Mlp(mlp), ObsRef::F32(x)) => {
                let done = mlp.forward_host(&self.params, x, rows, &mut self.host, &mut self.outputs);
                if done && self.heads > 1 {
                    select_task_heads(x, self.obs_dim, self.heads, &mut self.outputs);
                }
                done
            }
            _ => false,
        };
        if !on_host {
            let input = self.obs_tensor(obs)?;
            let h = tch::no_grad(|| self.forward(&input));
            self.outputs = Vec::<f32>::try_from(h.flatten(0, -1).to_device(Device::Cpu))?;
        }
        out.values.clear();
        out.q_values.clear();
        match self.head {
            Head::Discrete(n) => {
                sample_categorical(&self.outputs, n, deterministic, &mut self.rng, &mut self.samples);
                out.actions.clear();
                out.log_probs.clear();
                for &(a, lp) in &self.samples {
                    out.actions.push(a as f32);
                    out.log_probs.push(lp);
                }
            }
            Head::Gaussian(_) => {
                let log_std = self.log_std().expect("a Gaussian student has a log-std");
                let log_std = Vec::<f32>::try_from(log_std.detach().to_device(Device::Cpu))?;
                sample_diag_gaussian(
                    &self.outputs,
                    &log_std,
                    deterministic,
                    &mut self.rng,
                    &mut out.actions,
                    &mut out.log_probs,
                );
            }
        }
        Ok(())
    }
}

impl ActingPolicy for DistillPolicy {
    fn params(&self) -> &FlatParams {
        &self.params
    }
}

/// The distillation loss of a student's outputs `student` `[B, n | D]` (and its log-std `[D]` for a Gaussian
/// student) against teacher labels `labels` `[B, L]` of `kind` (as [`Teaching::labels`] lays them out),
/// averaged over the batch. `temperature` is τ of the `kl` loss on discrete teachers. Pairings that have no
/// meaning (a Gaussian student of a discrete teacher, `kl` to a deterministic teacher) are errors.
pub fn distill_loss(
    loss: DistillLoss,
    kind: TeachingKind,
    labels: &Tensor,
    student: &Tensor,
    student_log_std: Option<&Tensor>,
    temperature: f64,
) -> Result<Tensor> {
    let mismatch = |detail: &str| {
        let value = format!("\"{loss:?}\"").to_lowercase();
        Err(Error::config("distill", "loss", value, format!("{detail} (teacher gives {kind:?})")))
    };
    let rows = |t: Tensor| t.sum_dim_intlist(-1, false, Kind::Float).mean(Kind::Float);
    Ok(match (kind, student_log_std) {
        (TeachingKind::Logits | TeachingKind::QValues, None) => match loss {
            DistillLoss::Kl => {
                let log_p = (labels / temperature).log_softmax(-1, Kind::Float);
                let log_q = student.log_softmax(-1, Kind::Float);
                rows(log_p.exp() * (log_p - log_q))
            }
            DistillLoss::Nll => {
                let greedy = labels.argmax(-1, true);
                -student.log_softmax(-1, Kind::Float).gather(1, &greedy, false).mean(Kind::Float)
            }
            DistillLoss::Mse => (student - labels).square().mean(Kind::Float),
        },
        (TeachingKind::Gaussian | TeachingKind::Actions, Some(log_std_s)) => {
            let d = student.size()[1];
            let mean_t = labels.narrow(1, 0, d);
            match loss {
                DistillLoss::Kl if kind == TeachingKind::Actions => {
                    return mismatch("a deterministic teacher has no distribution to match: use nll or mse");
                }
                DistillLoss::Kl => {
                    // KL(N(μt, σt) ‖ N(μs, σs)) = log σs − log σt + (σt² + (μt − μs)²) / (2 σs²) − ½, per dim.
                    let log_std_t = labels.narrow(1, d, d);
                    let var_s = (log_std_s * 2.0).exp();
                    let num = (&log_std_t * 2.0).exp() + (&mean_t - student).square();
                    rows(log_std_s - &log_std_t + num / (var_s * 2.0) - 0.5)
                }
                DistillLoss::Nll => {
                    let z = (&mean_t - student) * (-log_std_s).exp();
                    rows(z.square() * 0.5 + log_std_s + 0.918_938_533_204_672_7)
                }
                DistillLoss::Mse => (student - mean_t).square().mean(Kind::Float),
            }
        }
        (_, None) => return mismatch("a discrete student cannot learn a continuous teacher"),
        (_, Some(_)) => return mismatch("a continuous student cannot learn a discrete teacher"),
    })
}

/// Labelled states in a ring: observation rows (frames as bytes) and the teacher's label rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LabelledReplay {
    obs: ObsBuf,
    labels: Vec<f32>,
    obs_dim: usize,
    label_dim: usize,
    capacity: usize,
    len: usize,
    next: usize,
}

impl LabelledReplay {
    /// An empty ring of `capacity` states of `obs_dim` values of `dtype` (`label_dim` is set by the first push).
    pub fn new(capacity: usize, obs_dim: usize, dtype: DType) -> Self {
        let obs = ObsBuf::empty(dtype);
        LabelledReplay { obs, labels: Vec::new(), obs_dim, label_dim: 0, capacity, len: 0, next: 0 }
    }

    /// States held.
    fn len(&self) -> usize {
        self.len
    }

    /// Add `rows` states and their labels (`labels.len() / rows` floats each), overwriting the oldest when full.
    pub fn push(&mut self, obs: ObsRef<'_>, labels: &[f32]) -> Result<()> {
        let rows = obs.len() / self.obs_dim;
        if rows == 0 || obs.len() != rows * self.obs_dim || !labels.len().is_multiple_of(rows) {
            return Err(Error::length("labelled states", labels.len(), rows));
        }
        if obs.dtype() != self.obs.dtype() {
            let detail = format!("{:?} states for a replay of {:?}", obs.dtype(), self.obs.dtype());
            return Err(Error::space("observation", "distill", detail));
        }
        let l = labels.len() / rows;
        if self.label_dim == 0 {
            self.label_dim = l;
            self.obs = ObsBuf::zeros(self.obs.dtype(), self.capacity * self.obs_dim);
            self.labels = vec![0.0; self.capacity * l];
        } else if l != self.label_dim {
            return Err(Error::length("teacher labels per state", l, self.label_dim));
        }
        let d = self.obs_dim;
        for (r, y) in labels.chunks_exact(l).enumerate() {
            let i = self.next;
            let same = self.obs.write_at(i * d, obs.slice(r * d..(r + 1) * d));
            debug_assert!(same, "dtypes checked above");
            self.labels[i * l..(i + 1) * l].copy_from_slice(y);
            self.next = (i + 1) % self.capacity;
            self.len = (self.len + 1).min(self.capacity);
        }
        Ok(())
    }

    /// `batch` states drawn uniformly with replacement: observations `[B, obs_dim]` (u8 frames or f32) and
    /// labels `[B, L]`.
    pub fn sample(&self, batch: usize, rng: &mut impl Rng) -> (Tensor, Tensor) {
        let (d, l) = (self.obs_dim, self.label_dim);
        let mut obs = ObsBuf::with_capacity(self.obs.dtype(), batch * d);
        let mut labels = Vec::with_capacity(batch * l);
        for _ in 0..batch {
            let i = rng.random_range(0..self.len);
            let same = obs.extend(self.obs.slice(i * d..(i + 1) * d));
            debug_assert!(same, "one dtype");
            labels.extend_from_slice(&self.labels[i * l..(i + 1) * l]);
        }
        let obs = match &obs {
            ObsBuf::F32(x) => Tensor::from_slice(x),
            ObsBuf::U8(x) => Tensor::from_slice(x),
        };
        (obs.view([batch as i64, d as i64]), Tensor::from_slice(&labels).view([batch as i64, l as i64]))
    }

    fn write_to(&self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        c.put_obs(format!("{prefix}.obs"), self.obs.slice(0..self.len * self.obs_dim));
        c.put_f32(format!("{prefix}.labels"), &self.labels[..self.len * self.label_dim]);
        c.put_meta(format!("{prefix}.state"), &(self.len, self.next, self.label_dim))
    }

    fn read_from(&mut self, c: &mut Checkpoint, prefix: &str) -> Result<()> {
        let (len, next, label_dim): (usize, usize, usize) = c.meta(&format!("{prefix}.state"))?;
        let (obs, labels) = (c.take_obs(&format!("{prefix}.obs"))?, c.take_f32(&format!("{prefix}.labels"))?);
        // An empty ring's observations read back as f32 whatever their dtype: only a held state has one.
        if len > 0 && obs.dtype() != self.obs.dtype() {
            return Err(Error::Checkpoint(format!(
                "distill replay: {:?} states for a student that takes {:?}",
                obs.dtype(),
                self.obs.dtype()
            )));
        }
        if len > self.capacity || next >= self.capacity.max(1) || obs.len() != len * self.obs_dim {
            return Err(Error::Checkpoint(format!(
                "distill replay: {len} states of {} floats (next {next}) do not fit a buffer of {} states of {}",
                obs.len() / len.max(1),
                self.capacity,
                self.obs_dim
            )));
        }
        if labels.len() != len * label_dim || (len > 0 && label_dim == 0) {
            return Err(Error::Checkpoint(format!(
                "distill replay: {} label floats for {len} states of {label_dim}",
                labels.len()
            )));
        }
        // The states held, pushed into an empty ring from its start, then the ring's position.
        *self = LabelledReplay::new(self.capacity, self.obs_dim, self.obs.dtype());
        if len > 0 {
            self.push(obs.as_ref(), &labels)?;
        }
        self.next = next;
        Ok(())
    }
}

/// The distillation learner: the student (acting policy and optimiser), the teacher, the labelled replay.
pub struct Distill {
    /// Hyperparameters.
    pub config: DistillConfig,
    pi: DistillPolicy,
    opt: Adam,
    replay: LabelledReplay,
    /// The teachers (one per task) and the kind of teaching they all give; empty before `set_teachers`.
    teachers: Vec<Box<dyn Algorithm>>,
    kind: Option<TeachingKind>,
    /// Replay sampling.
    rng: Pcg64,
    /// Vectorised steps observed, training phases run, states labelled.
    steps: u64,
    phases: u64,
    labelled: u64,
}

impl std::fmt::Debug for Distill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Distill").field("config", &self.config).field("steps", &self.steps).finish_non_exhaustive()
    }
}

/// A teacher's label rows, flat; its teaching must keep the kind it had when it was handed over.
fn labels_of(kind: TeachingKind, teaching: Teaching) -> Result<Vec<f32>> {
    if teaching.kind != kind {
        return Err(Error::Unsupported(format!("distill: the teacher changed from {kind:?} to {:?}", teaching.kind)));
    }
    Ok(Vec::<f32>::try_from(teaching.labels.flatten(0, -1))?)
}

impl Distill {
    /// Label states, each by its task's teacher, and keep them.
    fn label(&mut self, obs: ObsRef<'_>) -> Result<()> {
        let Some(kind) = self.kind else {
            return Err(Error::Unsupported("distill: no teacher loaded (set_teachers was not called)".into()));
        };
        let labels = if self.teachers.len() == 1 {
            labels_of(kind, self.teachers[0].teach(obs)?)?
        } else {
            self.label_by_task(f32_obs("distill", obs)?, kind)?
        };
        self.replay.push(obs, &labels)?;
        self.labelled += (obs.len() / self.pi.obs_dim) as u64;
        Ok(())
    }

    /// A fresh student for these spaces (it cannot learn until [`crate::algorithm::Student::set_teachers`] gives it a
    /// teacher).
    pub fn new(obs: &Space, act: &Space, config: DistillConfig, device: Device, seed: u64) -> Result<Self> {
        config.validate()?;
        let pi = DistillPolicy::new(obs, act, &config, device, seed)?;
        let opt = Adam::new(&pi.params, config.learning_rate, config.adam_eps);
        let replay = LabelledReplay::new(config.buffer_size, pi.obs_dim, pi.dtype());
        Ok(Distill {
            pi,
            opt,
            replay,
            teachers: Vec::new(),
            kind: None,
            rng: Pcg64::seed_from_u64(seed ^ 0xd157_0002),
            steps: 0,
            phases: 0,
            labelled: 0,
            config,
        })
    }

    /// τ for teachers of `kind` under the configured loss (an error where the config sets one that is unused).
    fn temperature(&self, kind: TeachingKind) -> Result<f64> {
        let discrete = matches!(kind, TeachingKind::Logits | TeachingKind::QValues);
        match self.config.temperature {
            Some(t) if self.config.loss == DistillLoss::Kl && discrete => Ok(t),
            Some(t) => Err(Error::config(
                "distill",
                "temperature",
                t,
                format!(
                    "only the kl loss on a discrete teacher uses a temperature (loss = \"{}\", teacher gives {kind:?})",
                    format!("{:?}", self.config.loss).to_lowercase()
                ),
            )),
            None if kind == TeachingKind::QValues => Ok(0.01),
            None => Ok(1.0),
        }
    }

    /// One gradient step on a replay minibatch: the loss, and for discrete students the fraction of states
    /// whose greedy action agrees with the teacher's.
    fn gradient_step(&mut self, kind: TeachingKind, temperature: f64) -> Result<(f64, f64)> {
        let (obs, labels) = self.replay.sample(self.config.batch_size, &mut self.rng);
        let device = self.pi.params.flat().device();
        let (obs, labels) = (obs.to_device(device), labels.to_device(device));
        let out = self.pi.forward(&obs);
        let loss = distill_loss(self.config.loss, kind, &labels, &out, self.pi.log_std(), temperature)?;
        let value = f64::try_from(&loss)?;
        if !value.is_finite() {
            return Err(Error::NonFinite(format!("distill: loss {value}; nothing applied")));
        }
        self.pi.params.backward(&loss);
        self.pi.params.clip_grad_norm(self.config.max_grad_norm);
        self.opt.step(&mut self.pi.params);
        let agreement = match self.pi.head {
            Head::Discrete(_) => f64::try_from(
                out.argmax(-1, false).eq_tensor(&labels.argmax(-1, false)).to_kind(Kind::Float).mean(Kind::Float),
            )?,
            Head::Gaussian(d) => {
                -f64::try_from((out.detach() - labels.narrow(1, 0, d as i64)).abs().mean(Kind::Float))?
            }
        };
        Ok((value, agreement))
    }

    /// Labels for `obs` (rows with a task one-hot at the end): each task's rows, one-hot stripped, taught by
    /// that task's teacher, written back in row order.
    fn label_by_task(&mut self, obs: &[f32], kind: TeachingKind) -> Result<Vec<f32>> {
        let (dim, heads) = (self.pi.obs_dim(), self.pi.heads);
        let tasks = self.pi.tasks_of(obs);
        let mut labels: Vec<f32> = Vec::new();
        let mut width = 0;
        for (k, teacher) in self.teachers.iter_mut().enumerate() {
            let rows: Vec<usize> = (0..tasks.len()).filter(|r| tasks[*r] == k).collect();
            if rows.is_empty() {
                continue;
            }
            let x: Vec<f32> = rows.iter().flat_map(|r| obs[r * dim..(r + 1) * dim - heads].iter().copied()).collect();
            let y = labels_of(kind, teacher.teach(ObsRef::F32(&x))?)?;
            width = y.len() / rows.len();
            labels.resize(tasks.len() * width, 0.0);
            for (i, r) in rows.iter().enumerate() {
                labels[r * width..(r + 1) * width].copy_from_slice(&y[i * width..(i + 1) * width]);
            }
        }
        debug_assert_eq!(labels.len(), tasks.len() * width);
        Ok(labels)
    }
}

impl Policy for Distill {
    fn obs_dim(&self) -> usize {
        self.pi.obs_dim()
    }

    fn act_dim(&self) -> usize {
        self.pi.act_dim()
    }

    /// The student acts; with `act_with = "teacher"` and `Explore`, the teacher acts greedily instead.
    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        match (self.teachers.first_mut(), self.config.act_with, mode) {
            (Some(teacher), ActWith::Teacher, ActMode::Explore) => {
                teacher.act(obs, ActMode::Deterministic, out)?;
                out.values.clear();
                out.q_values.clear();
                out.log_probs.clear();
                Ok(())
            }
            _ => self.pi.act(obs, mode, out),
        }
    }
}

impl Algorithm for Distill {
    fn student(&mut self) -> Option<&mut dyn crate::algorithm::Student> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "distill"
    }

    /// Label the observed states, each by its task's teacher, and keep them.
    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        for chunk in chunks {
            self.label(chunk.obs.as_ref())?;
            self.steps += chunk.n_steps as u64;
        }
        Ok(())
    }

    /// Every `train_freq` observed steps once `learning_starts` states are labelled: `gradient_steps` steps.
    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        let Some(kind) = self.kind else { return Ok(None) };
        if self.replay.len() < self.config.learning_starts.max(1) {
            self.phases = self.steps / self.config.train_freq as u64;
            return Ok(None);
        }
        let due = self.steps / self.config.train_freq as u64;
        if due <= self.phases {
            return Ok(None);
        }
        let temperature = self.temperature(kind)?;
        let remaining = if self.config.anneal_lr { progress.remaining() } else { 1.0 };
        self.opt.lr = self.config.learning_rate * remaining;
        let (mut loss, mut agreement, mut n) = (0.0, 0.0, 0.0f64);
        while self.phases < due {
            for _ in 0..self.config.gradient_steps {
                let (l, a) = self.gradient_step(kind, temperature)?;
                loss += l;
                agreement += a;
                n += 1.0;
            }
            self.phases += 1;
        }
        let mut m = Metrics::default();
        m.push("losses/distill_loss", loss / n.max(1.0));
        match self.pi.head {
            Head::Discrete(_) => m.push("distill/agreement", agreement / n.max(1.0)),
            Head::Gaussian(_) => m.push("distill/mean_abs_error", -agreement / n.max(1.0)),
        }
        m.push("distill/labelled_states", self.labelled as f64);
        m.push("charts/learning_rate", self.opt.lr);
        Ok(Some(m))
    }

    /// The student as a teacher (a distilled policy can teach in turn).
    fn teach(&mut self, obs: ObsRef<'_>) -> Result<Teaching> {
        let x = self.pi.obs_tensor(obs)?;
        let out = tch::no_grad(|| self.pi.forward(&x));
        Ok(match self.pi.log_std() {
            None => Teaching::new(TeachingKind::Logits, &out),
            Some(log_std) => Teaching::gaussian(&out, log_std),
        })
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("params", self.pi.params.flat());
        self.opt.write_to(&mut c, "adam")?;
        self.replay.write_to(&mut c, "replay")?;
        c.put_meta("rng", &self.rng)?;
        c.put_meta("acting_rng", &self.pi.rng)?;
        c.put_meta("counters", &(self.steps, self.phases, self.labelled))?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        c.copy_into("params", self.pi.params.flat())?;
        self.opt.read_from(c, "adam", &self.pi.params)?;
        self.replay.read_from(c, "replay")?;
        self.rng = c.meta("rng")?;
        self.pi.rng = c.meta("acting_rng")?;
        (self.steps, self.phases, self.labelled) = c.meta("counters")?;
        Ok(())
    }

    fn policy_params(&self) -> &FlatParams {
        &self.pi.params
    }

    fn policy_params_mut(&mut self) -> &mut FlatParams {
        &mut self.pi.params
    }
}

impl crate::algorithm::Student for Distill {
    /// One teacher per head (task), in task order; each must take the task's observations (the student's
    /// without the one-hot) and give the kind of teaching the student's head and loss can learn.
    fn set_teachers(&mut self, mut teachers: Vec<Box<dyn Algorithm>>) -> Result<()> {
        let heads = self.pi.heads;
        if teachers.len() != heads {
            return Err(Error::Unsupported(format!(
                "distill: {} teachers for a student with {heads} heads (one per task)",
                teachers.len()
            )));
        }
        let task_dim = self.pi.obs_dim() - if heads > 1 { heads } else { 0 };
        let mut kind = None;
        for (k, teacher) in teachers.iter_mut().enumerate() {
            let who = if heads > 1 { format!("teacher {k}") } else { "the teacher".into() };
            let which = format!("{who} ({})", teacher.name());
            if teacher.state_dim() > 0 {
                return Err(Error::Unsupported(format!(
                    "distill: {which} is recurrent; distilling a recurrent teacher (its labels depend on each \
                     env's state) is not built"
                )));
            }
            if teacher.obs_dim() != task_dim || teacher.act_dim() != self.pi.act_dim() {
                return Err(Error::Unsupported(format!(
                    "distill: {which} takes {} observation floats and gives {} action floats; the student's \
                     env has {task_dim} and {}",
                    teacher.obs_dim(),
                    teacher.act_dim(),
                    self.pi.act_dim()
                )));
            }
            let teaching = teacher.teach(ObsBuf::zeros(self.pi.dtype(), task_dim).as_ref())?;
            let width = teaching.labels.size()[1];
            let outputs = self.pi.head.width() as i64;
            let k_kind = teaching.kind;
            // A discrete student learns logits or Q-values, a Gaussian one a Gaussian or actions.
            let discrete = matches!(k_kind, TeachingKind::Logits | TeachingKind::QValues);
            let learns = discrete == matches!(self.pi.head, Head::Discrete(_));
            if !learns || (k_kind != TeachingKind::Gaussian && width != outputs) {
                return Err(Error::Unsupported(format!(
                    "distill: {which} gives {k_kind:?} of {width} values per state; this student has {outputs} \
                     outputs ({:?})",
                    self.pi.head
                )));
            }
            if let Some(first) = kind
                && first != k_kind
            {
                return Err(Error::Unsupported(format!(
                    "distill: {which} gives {k_kind:?}, teacher 0 {first:?}: one loss needs one kind of teaching"
                )));
            }
            self.temperature(k_kind)?;
            // Loss and teacher must pair up (e.g. kl has nothing to match in a deterministic teacher).
            let labels = teaching.labels.to_device(self.pi.params.flat().device());
            let probe = ObsBuf::zeros(self.pi.dtype(), self.pi.obs_dim);
            let out = tch::no_grad(|| self.pi.forward(&self.pi.obs_tensor(probe.as_ref()).expect("one row")));
            let _ = distill_loss(self.config.loss, k_kind, &labels, &out, self.pi.log_std(), 1.0)?;
            kind = Some(k_kind);
        }
        self.teachers = teachers;
        self.kind = kind;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Student;
    use crate::dqn::{Dqn, DqnConfig};
    use crate::ppo::{Ppo, PpoConfig};

    fn rows(v: &[f32], width: usize) -> Tensor {
        Tensor::from_slice(v).view([(v.len() / width) as i64, width as i64])
    }

    fn loss_of(loss: DistillLoss, kind: TeachingKind, labels: &Tensor, s: &Tensor, ls: Option<&Tensor>, t: f64) -> f64 {
        f64::try_from(distill_loss(loss, kind, labels, s, ls, t).unwrap()).unwrap()
    }

    fn log_softmax(v: &[f64]) -> Vec<f64> {
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z = v.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m;
        v.iter().map(|x| x - z).collect()
    }

    #[test]
    fn discrete_losses_match_scalar_references() {
        let t = [1.0f32, -0.5, 0.25, 0.0, 2.0, -1.0];
        let s = [0.3f32, 0.1, -0.2, 1.5, -0.5, 0.7];
        let (labels, student) = (rows(&t, 3), rows(&s, 3));
        for tau in [1.0, 0.5] {
            let mut kl = 0.0;
            for r in 0..2 {
                let tr: Vec<f64> = t[r * 3..r * 3 + 3].iter().map(|x| *x as f64 / tau).collect();
                let sr: Vec<f64> = s[r * 3..r * 3 + 3].iter().map(|x| *x as f64).collect();
                let (lp, lq) = (log_softmax(&tr), log_softmax(&sr));
                kl += (0..3).map(|i| lp[i].exp() * (lp[i] - lq[i])).sum::<f64>() / 2.0;
            }
            let got = loss_of(DistillLoss::Kl, TeachingKind::QValues, &labels, &student, None, tau);
            assert!((got - kl).abs() < 1e-5, "kl τ={tau}: {got} vs {kl}");
        }
        // nll of the teacher's greedy actions (0 in row 0, 1 in row 1).
        let lq0 = log_softmax(&[0.3, 0.1, -0.2]);
        let lq1 = log_softmax(&[1.5, -0.5, 0.7]);
        let nll = -(lq0[0] + lq1[1]) / 2.0;
        let got = loss_of(DistillLoss::Nll, TeachingKind::Logits, &labels, &student, None, 1.0);
        assert!((got - nll).abs() < 1e-5, "nll: {got} vs {nll}");
        let mse = t.iter().zip(&s).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / 6.0;
        let got = loss_of(DistillLoss::Mse, TeachingKind::QValues, &labels, &student, None, 1.0);
        assert!((got - mse).abs() < 1e-6, "mse: {got} vs {mse}");
        // Identical distributions have zero KL.
        let same = loss_of(DistillLoss::Kl, TeachingKind::Logits, &student, &student, None, 1.0);
        assert!(same.abs() < 1e-6, "KL(p‖p) = {same}");
    }

    #[test]
    fn gaussian_losses_match_scalar_references() {
        // Two states, two action dims; labels are means then log-stds.
        let mu_t = [0.5f32, -1.0, 0.0, 2.0];
        let ls_t = [-0.5f32, 0.2, -0.5, 0.2];
        let mu_s = [0.1f32, -0.8, 0.4, 1.0];
        let ls_s = [0.3f32, -0.1];
        let labels = Tensor::cat(&[rows(&mu_t, 2), rows(&ls_t, 2)], 1);
        let (student, log_std) = (rows(&mu_s, 2), Tensor::from_slice(&ls_s));
        let (mut kl, mut nll) = (0.0, 0.0);
        for r in 0..2 {
            for d in 0..2 {
                let (mt, lt, ms, lss) =
                    (mu_t[r * 2 + d] as f64, ls_t[r * 2 + d] as f64, mu_s[r * 2 + d] as f64, ls_s[d] as f64);
                let (vt, vs) = ((2.0 * lt).exp(), (2.0 * lss).exp());
                kl += (lss - lt + (vt + (mt - ms).powi(2)) / (2.0 * vs) - 0.5) / 2.0;
                nll += (0.5 * (mt - ms).powi(2) / vs + lss + 0.5 * (2.0 * std::f64::consts::PI).ln()) / 2.0;
            }
        }
        let g = TeachingKind::Gaussian;
        let got = loss_of(DistillLoss::Kl, g, &labels, &student, Some(&log_std), 1.0);
        assert!((got - kl).abs() < 1e-5, "gaussian kl: {got} vs {kl}");
        let got = loss_of(DistillLoss::Nll, g, &labels, &student, Some(&log_std), 1.0);
        assert!((got - nll).abs() < 1e-5, "gaussian nll: {got} vs {nll}");
        let mse = mu_t.iter().zip(&mu_s).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / 4.0;
        let got = loss_of(DistillLoss::Mse, g, &labels, &student, Some(&log_std), 1.0);
        assert!((got - mse).abs() < 1e-6, "gaussian mse: {got} vs {mse}");
        // A deterministic teacher has means only: nll/mse work, kl is refused with the reason.
        let actions = rows(&mu_t, 2);
        let got = loss_of(DistillLoss::Mse, TeachingKind::Actions, &actions, &student, Some(&log_std), 1.0);
        assert!((got - mse).abs() < 1e-6);
        let err = distill_loss(DistillLoss::Kl, TeachingKind::Actions, &actions, &student, Some(&log_std), 1.0);
        assert!(err.unwrap_err().to_string().contains("deterministic teacher"));
        let err = distill_loss(DistillLoss::Kl, TeachingKind::Logits, &actions, &student, Some(&log_std), 1.0);
        assert!(err.unwrap_err().to_string().contains("continuous student cannot learn a discrete teacher"));
        let err = distill_loss(DistillLoss::Nll, g, &labels, &student, None, 1.0);
        assert!(err.unwrap_err().to_string().contains("discrete student cannot learn a continuous teacher"));
    }

    /// In both observation dtypes (vectors as f32, frames as u8).
    #[test]
    fn labelled_replay_is_a_ring_and_survives_a_checkpoint() {
        for dtype in [DType::F32, DType::U8] {
            let rows = |v: &[u8]| match dtype {
                DType::F32 => ObsBuf::F32(v.iter().map(|&x| x as f32).collect()),
                DType::U8 => ObsBuf::U8(v.to_vec()),
            };
            let mut r = LabelledReplay::new(3, 2, dtype);
            r.push(rows(&[1, 1, 2, 2]).as_ref(), &[10.0, 20.0]).unwrap();
            r.push(rows(&[3, 3, 4, 4]).as_ref(), &[30.0, 40.0]).unwrap();
            assert_eq!(r.len(), 3);
            // State 1 was overwritten by state 4: every sample pairs an observation with its own label.
            let (obs, labels) = r.sample(200, &mut Pcg64::seed_from_u64(0));
            assert_eq!(obs.kind(), if dtype == DType::U8 { Kind::Uint8 } else { Kind::Float }, "{dtype:?}");
            let obs = Vec::<f32>::try_from(obs.to_kind(Kind::Float).flatten(0, -1)).unwrap();
            let labels = Vec::<f32>::try_from(labels.flatten(0, -1)).unwrap();
            let mut seen = std::collections::BTreeSet::new();
            for (o, l) in obs.chunks(2).zip(&labels) {
                assert_eq!(o[0] * 10.0, *l);
                seen.insert(*l as i64);
            }
            assert_eq!(seen.into_iter().collect::<Vec<_>>(), [20, 30, 40]);
            // Labels of another width, observations that do not split into rows, or of the other dtype, are
            // refused.
            let e = r.push(rows(&[5, 5]).as_ref(), &[1.0, 2.0]).unwrap_err().to_string();
            assert!(e.contains("teacher labels per state"), "{e}");
            assert!(r.push(rows(&[5, 5, 5]).as_ref(), &[1.0]).is_err());
            let other = if dtype == DType::U8 { ObsBuf::F32(vec![5.0, 5.0]) } else { ObsBuf::U8(vec![5, 5]) };
            assert!(r.push(other.as_ref(), &[1.0]).is_err());
            let mut c = Checkpoint::new();
            r.write_to(&mut c, "replay").unwrap();
            let mut back = LabelledReplay::new(3, 2, dtype);
            back.read_from(&mut c, "replay").unwrap();
            assert_eq!(back, r);
            // A checkpoint from a larger buffer does not fit a smaller one.
            let mut c = Checkpoint::new();
            r.write_to(&mut c, "replay").unwrap();
            let err = LabelledReplay::new(2, 2, dtype).read_from(&mut c, "replay").unwrap_err();
            assert!(err.to_string().contains("do not fit a buffer of 2 states"), "{err}");
        }
    }

    fn obs_space(d: usize) -> Space {
        Space::box1d(vec![-1.0; d], vec![1.0; d])
    }

    /// Observe one batch of 8 states (vectors or frames; nothing else in the transition matters to a student).
    fn observe_rows(student: &mut Distill, obs: ObsRef<'_>) -> Result<()> {
        let (act, zeros, flags) = (ActOutput::default(), [0.0f32; 8], [false; 8]);
        let chunk = Chunk::from_step(obs, &act.actions, &act.log_probs, &act.values, &zeros, &flags, &flags, obs);
        student.observe(&[chunk])
    }

    /// [`observe_rows`] of 8 rows of floats.
    fn observe(student: &mut Distill, obs: &[f32]) -> Result<()> {
        observe_rows(student, ObsRef::F32(obs))
    }

    /// Feed `steps` batches of 8 random states (uniform in [-1, 1]⁴) to `student`, updating after each.
    fn distil_on_random_states(student: &mut Distill, steps: usize, seed: u64) {
        let mut rng = Pcg64::seed_from_u64(seed);
        for i in 0..steps {
            let obs: Vec<f32> = (0..8 * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
            observe(student, &obs).unwrap();
            let progress = Progress { env_steps: 8 * (i as u64 + 1), total_env_steps: 8 * steps as u64 };
            student.update(&progress).unwrap();
        }
    }

    #[test]
    fn a_student_learns_a_q_value_teachers_greedy_actions() {
        let (obs, act) = (obs_space(4), Space::discrete(3));
        let teacher =
            Dqn::new(&obs, &act, 8, DqnConfig { hidden_sizes: vec![32], ..Default::default() }, Device::Cpu, 7)
                .unwrap();
        let config = DistillConfig { teachers: vec!["t".into()], hidden_sizes: vec![32], ..Default::default() };
        let mut student = Distill::new(&obs, &act, config, Device::Cpu, 1).unwrap();
        student.set_teachers(vec![Box::new(teacher)]).unwrap();
        // Held-out states: how often does the student's greedy action equal the teacher's?
        let mut rng = Pcg64::seed_from_u64(99);
        let probe: Vec<f32> = (0..512 * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
        let agreement = |s: &mut Distill| {
            let t = s.teachers[0].teach(ObsRef::F32(&probe)).unwrap().labels.argmax(-1, false);
            let Teaching { kind: TeachingKind::Logits, labels: l } = s.teach(ObsRef::F32(&probe)).unwrap() else {
                panic!("a discrete student")
            };
            f64::try_from(l.argmax(-1, false).eq_tensor(&t).to_kind(Kind::Float).mean(Kind::Float)).unwrap()
        };
        let before = agreement(&mut student);
        distil_on_random_states(&mut student, 600, 3);
        let after = agreement(&mut student);
        assert!(after > 0.9 && after > before + 0.2, "agreement {before:.3} → {after:.3}");
        assert_eq!(student.opt.lr, 3e-3, "a constant learning rate by default");
        // With anneal_lr the step size falls linearly with the run's progress, to 0 at the last update.
        let teacher = Dqn::new(&obs, &act, 8, DqnConfig::default(), Device::Cpu, 7).unwrap();
        let config = DistillConfig { teachers: vec!["t".into()], anneal_lr: true, ..Default::default() };
        let mut annealed = Distill::new(&obs, &act, config, Device::Cpu, 1).unwrap();
        annealed.set_teachers(vec![Box::new(teacher)]).unwrap();
        distil_on_random_states(&mut annealed, 600, 3);
        assert!(annealed.opt.lr == 0.0, "learning rate at the end: {}", annealed.opt.lr);
    }

    /// `rows` random states of `d` floats in [-1, 1], each followed by a random `tasks`-wide one-hot.
    fn tasked_states(rows: usize, d: usize, tasks: usize, rng: &mut Pcg64) -> Vec<f32> {
        let mut x = Vec::with_capacity(rows * (d + tasks));
        for _ in 0..rows {
            x.extend((0..d).map(|_| rng.random_range(-1.0f32..1.0)));
            let hot = rng.random_range(0..tasks);
            x.extend((0..tasks).map(|k| if k == hot { 1.0 } else { 0.0 }));
        }
        x
    }

    #[test]
    fn a_two_headed_student_learns_each_tasks_teacher() {
        let (task_obs, act) = (obs_space(4), Space::discrete(3));
        let teacher = |seed| {
            let config = DqnConfig { hidden_sizes: vec![32], ..Default::default() };
            Box::new(Dqn::new(&task_obs, &act, 8, config, Device::Cpu, seed).unwrap()) as Box<dyn Algorithm>
        };
        let config = DistillConfig {
            teachers: vec!["a".into(), "b".into()],
            hidden_sizes: vec![32],
            activation: Activation::Relu,
            ..Default::default()
        };
        let mut student = Distill::new(&obs_space(6), &act, config, Device::Cpu, 1).unwrap();
        student.set_teachers(vec![teacher(7), teacher(8)]).unwrap();
        let mut rng = Pcg64::seed_from_u64(5);
        for i in 0..800 {
            observe(&mut student, &tasked_states(8, 4, 2, &mut rng)).unwrap();
            student.update(&Progress { env_steps: 8 * (i + 1), total_env_steps: 6400 }).unwrap();
        }
        // Per task: the student's greedy action (host forward, through act) against that task's teacher.
        let probe = tasked_states(1000, 4, 2, &mut rng);
        let mut out = ActOutput::default();
        student.act(ObsRef::F32(&probe), ActMode::Deterministic, &mut out).unwrap();
        let Teaching { kind: TeachingKind::Logits, labels: logits } = student.teach(ObsRef::F32(&probe)).unwrap()
        else {
            panic!()
        };
        let greedy = Vec::<i64>::try_from(logits.argmax(-1, false)).unwrap();
        let acted: Vec<i64> = out.actions.iter().map(|a| *a as i64).collect();
        assert_eq!(acted, greedy, "the host path and libtorch pick the same head");
        let tasks = student.pi.tasks_of(&probe);
        for k in 0..2 {
            let rows: Vec<usize> = (0..1000).filter(|r| tasks[*r] == k).collect();
            let x: Vec<f32> = rows.iter().flat_map(|r| probe[r * 6..r * 6 + 4].iter().copied()).collect();
            let t = student.teachers[k].teach(ObsRef::F32(&x)).unwrap().labels.argmax(-1, false);
            let t = Vec::<i64>::try_from(t).unwrap();
            let agree = rows.iter().zip(&t).filter(|(r, a)| greedy[**r] == **a).count() as f64 / rows.len() as f64;
            // The other teacher's actions agree far less often: the heads really are per task.
            let other = student.teachers[1 - k].teach(ObsRef::F32(&x)).unwrap().labels.argmax(-1, false);
            let other = Vec::<i64>::try_from(other).unwrap();
            let cross = rows.iter().zip(&other).filter(|(r, a)| greedy[**r] == **a).count() as f64 / rows.len() as f64;
            assert!(
                agree > 0.85 && agree > cross + 0.2,
                "task {k}: agreement {agree:.3}, with the other teacher {cross:.3}"
            );
        }
    }

    #[test]
    fn a_gaussian_student_matches_a_gaussian_teacher_and_resumes_exactly() {
        let (obs, act) = (obs_space(4), Space::box1d(vec![-2.0; 2], vec![2.0; 2]));
        let teacher = || {
            let mut t = Ppo::new(&obs, &act, 8, PpoConfig::default(), Device::Cpu, 5).unwrap();
            // Spread the teacher's means (its log-std is 0; the student's starts at −1).
            let mut flat = t.policy_params_mut().flat().shallow_clone();
            let _ = tch::no_grad(|| flat.g_mul_scalar_(3.0));
            Box::new(t) as Box<dyn Algorithm>
        };
        let config = DistillConfig {
            teachers: vec!["t".into()],
            hidden_sizes: vec![32],
            learning_starts: 64,
            log_std_init: -1.0,
            ..Default::default()
        };
        let mut a = Distill::new(&obs, &act, config.clone(), Device::Cpu, 1).unwrap();
        a.set_teachers(vec![teacher()]).unwrap();
        let mut rng = Pcg64::seed_from_u64(4);
        let probe: Vec<f32> = (0..256 * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
        let error = |s: &mut Distill| {
            let Teaching { kind: TeachingKind::Gaussian, labels: t } =
                s.teachers[0].teach(ObsRef::F32(&probe)).unwrap()
            else {
                panic!("a PPO teacher on boxes is Gaussian")
            };
            let Teaching { kind: TeachingKind::Gaussian, labels: own } = s.teach(ObsRef::F32(&probe)).unwrap() else {
                panic!()
            };
            let d = t.size()[1] / 2;
            let (t, tl, mean, log_std) =
                (t.narrow(1, 0, d), t.narrow(1, d, d), own.narrow(1, 0, d), own.narrow(1, d, d));
            let mean_err = f64::try_from((&mean - &t).abs().mean(Kind::Float)).unwrap();
            let std_err = f64::try_from((log_std.expand_as(&t) - tl.expand_as(&t)).abs().mean(Kind::Float)).unwrap();
            (mean_err, std_err)
        };
        let before = error(&mut a);
        distil_on_random_states(&mut a, 300, 3);
        // Checkpoint mid-run, restore into a fresh student, and continue both on the same data.
        let mut c = a.checkpoint().unwrap();
        let mut b = Distill::new(&obs, &act, config, Device::Cpu, 2).unwrap();
        b.set_teachers(vec![teacher()]).unwrap();
        b.restore(&mut c).unwrap();
        distil_on_random_states(&mut a, 300, 8);
        distil_on_random_states(&mut b, 300, 8);
        assert!(a.policy_params().flat().equal(b.policy_params().flat()), "a restored student diverged");
        let after = error(&mut a);
        assert!(after.0 < 0.3 * before.0 && after.1 < 0.3 * before.1, "|Δmean|, |Δlog σ|: {before:?} → {after:?}");
    }

    /// 8 frames `[4, 44, 44]`: black, with a bright 6 × 6 block at a random place (what a CNN can locate).
    fn block_frames(rng: &mut Pcg64) -> Vec<u8> {
        let mut x = vec![0u8; 8 * 4 * 44 * 44];
        for f in x.chunks_mut(4 * 44 * 44) {
            let (r, c) = (rng.random_range(0..38), rng.random_range(0..38));
            for plane in f.chunks_mut(44 * 44) {
                for i in r..r + 6 {
                    plane[i * 44 + c..i * 44 + c + 6].fill(200);
                }
            }
        }
        x
    }

    /// On frames: a CNN student (8/16/16 channels, fc 32; the teacher is the Nature CNN) learns the teacher's
    /// greedy actions from u8 frames its replay keeps as bytes; a restored student continues bit for bit; the
    /// architecture names the student's CNN; a student on frames refuses an MLP-shaped `hidden_sizes`.
    #[test]
    fn a_cnn_student_learns_a_cnn_teacher_on_frames_and_resumes_exactly() {
        let n = 4 * 44 * 44;
        let obs = Space::Box { low: vec![0.0; n], high: vec![255.0; n], shape: vec![4, 44, 44], dtype: DType::U8 };
        let act = Space::discrete(3);
        let f32 = CnnOptions::F32;
        let teacher = || {
            let mut t = Ppo::new(&obs, &act, 8, PpoConfig { cnn: f32, ..Default::default() }, Device::Cpu, 5).unwrap();
            // Sharpen the teacher's near-uniform initial logits (ReLU layers scale: 2⁵ through five layers).
            let mut flat = t.policy_params_mut().flat().shallow_clone();
            let _ = tch::no_grad(|| flat.g_mul_scalar_(2.0));
            Box::new(t) as Box<dyn Algorithm>
        };
        let config = DistillConfig {
            teachers: vec!["t".into()],
            hidden_sizes: vec![32],
            cnn_channels: vec![8, 16, 16],
            cnn: f32,
            learning_starts: 64,
            learning_rate: 1e-3,
            ..Default::default()
        };
        let arch = config.architecture(&obs, &act).unwrap();
        let Network::NatureCnn { convs, features, .. } = &arch.network else { panic!("{:?}", arch.network) };
        assert_eq!((convs.clone(), *features), (vec![(8, 8, 4), (16, 4, 2), (16, 3, 1)], 32));
        let mut a = Distill::new(&obs, &act, config.clone(), Device::Cpu, 1).unwrap();
        a.set_teachers(vec![teacher()]).unwrap();
        assert_eq!(a.replay.obs.dtype(), DType::U8);
        let mut rng = Pcg64::seed_from_u64(99);
        let probe: Vec<u8> = (0..32).flat_map(|_| block_frames(&mut rng)).collect();
        let agreement = |s: &mut Distill| {
            let t = s.teachers[0].teach(ObsRef::U8(&probe)).unwrap().labels.argmax(-1, false);
            let Teaching { kind: TeachingKind::Logits, labels: l } = s.teach(ObsRef::U8(&probe)).unwrap() else {
                panic!("a discrete student")
            };
            f64::try_from(l.argmax(-1, false).eq_tensor(&t).to_kind(Kind::Float).mean(Kind::Float)).unwrap()
        };
        let run = |s: &mut Distill, steps: usize, seed: u64| {
            let mut rng = Pcg64::seed_from_u64(seed);
            for _ in 0..steps {
                observe_rows(s, ObsRef::U8(&block_frames(&mut rng))).unwrap();
                s.update(&Progress { env_steps: 0, total_env_steps: 1 }).unwrap();
            }
        };
        let before = agreement(&mut a);
        run(&mut a, 150, 3);
        let mut c = a.checkpoint().unwrap();
        let mut b = Distill::new(&obs, &act, config.clone(), Device::Cpu, 2).unwrap();
        b.set_teachers(vec![teacher()]).unwrap();
        b.restore(&mut c).unwrap();
        run(&mut a, 150, 8);
        run(&mut b, 150, 8);
        assert!(a.policy_params().flat().equal(b.policy_params().flat()), "a restored student diverged");
        let after = agreement(&mut a);
        assert!(after > 0.8 && after > before + 0.2, "agreement {before:.3} → {after:.3}");
        // The student acts on frames too (and refuses float rows).
        let mut out = ActOutput::default();
        a.act(ObsRef::U8(&probe[..2 * n]), ActMode::Deterministic, &mut out).unwrap();
        assert_eq!(out.actions.len(), 2);
        assert!(a.act(ObsRef::F32(&vec![0.0; n]), ActMode::Deterministic, &mut out).is_err());
        let e = Distill::new(&obs, &act, DistillConfig { hidden_sizes: vec![32, 32], ..config }, Device::Cpu, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_sizes") && e.contains("one fc layer"), "{e}");
    }

    #[test]
    fn teachers_that_do_not_fit_are_refused() {
        let (obs, act) = (obs_space(4), Space::discrete(3));
        let one =
            |loss, temperature| DistillConfig { teachers: vec!["t".into()], loss, temperature, ..Default::default() };
        let dqn = |o: &Space, a: &Space| Box::new(Dqn::new(o, a, 8, DqnConfig::default(), Device::Cpu, 0).unwrap());
        // Another observation size or action count.
        let mut s = Distill::new(&obs, &act, one(DistillLoss::Kl, None), Device::Cpu, 0).unwrap();
        let err = s.set_teachers(vec![dqn(&obs_space(5), &act)]).unwrap_err().to_string();
        assert!(err.contains("takes 5 observation floats"), "{err}");
        let err = s.set_teachers(vec![dqn(&obs, &Space::discrete(4))]).unwrap_err().to_string();
        assert!(err.contains("4 values per state") && err.contains("3 outputs"), "{err}");
        // A continuous teacher for a discrete student.
        let boxed = Space::box1d(vec![-1.0; 3], vec![1.0; 3]);
        let ppo = Ppo::new(&obs, &boxed, 8, PpoConfig::default(), Device::Cpu, 0).unwrap();
        let mut g = Distill::new(&obs, &boxed, one(DistillLoss::Kl, None), Device::Cpu, 0).unwrap();
        g.set_teachers(vec![Box::new(ppo)]).unwrap();
        let ppo = Ppo::new(&obs, &boxed, 8, PpoConfig::default(), Device::Cpu, 0).unwrap();
        assert!(s.set_teachers(vec![Box::new(ppo)]).is_err());
        // A temperature the loss does not use.
        let mut s = Distill::new(&obs, &act, one(DistillLoss::Mse, Some(0.5)), Device::Cpu, 0).unwrap();
        let err = s.set_teachers(vec![dqn(&obs, &act)]).unwrap_err().to_string();
        assert!(err.contains("temperature") && err.contains("mse"), "{err}");
        // None or several teachers in the config.
        let none = DistillConfig::default().validate().unwrap_err().to_string();
        assert!(none.contains("teachers"), "{none}");
        let acting =
            DistillConfig { teachers: vec!["a".into(), "b".into()], act_with: ActWith::Teacher, ..Default::default() };
        assert!(acting.validate().unwrap_err().to_string().contains("one teacher acts for one task"));
        // Two teachers make a two-headed student, which takes exactly two.
        let two = DistillConfig { teachers: vec!["a".into(), "b".into()], ..Default::default() };
        let mut s = Distill::new(&obs_space(6), &act, two, Device::Cpu, 0).unwrap();
        let err = s.set_teachers(vec![dqn(&obs, &act)]).unwrap_err().to_string();
        assert!(err.contains("1 teachers for a student with 2 heads"), "{err}");
        // Without a teacher the student cannot label anything, and says so.
        let mut s = Distill::new(&obs, &act, one(DistillLoss::Kl, None), Device::Cpu, 0).unwrap();
        let err = observe(&mut s, &[0.0; 32]).unwrap_err().to_string();
        assert!(err.contains("no teacher loaded"), "{err}");
    }
}
