//! The actor-critic network PPO and A2C share, a categorical head for discrete actions or a diagonal Gaussian
//! with a state-independent log-std for boxes, all in one [`FlatParams`] buffer. Its body follows the
//! observations: separate policy and value MLPs (run as one [`TwinMlp`]) for 1-D boxes; for image
//! observations (a u8 box `[C, H, W]`) CleanRL's `ppo_atari` network, one shared [`NatureCnn`] torso with the
//! policy logits and the value side by side in its output layer. Initialisation follows SB3 and CleanRL:
//! orthogonal, gain √2 on hidden layers, 0.01 on the policy head, 1 on the value head.
//!
//! It also re-evaluates a rollout that older parameters collected, for the V-trace correction both algorithms
//! can apply ([`ActorCritic::targets`]).
pub mod agent;
pub(crate) mod host;
pub(crate) mod members;
use std::borrow::Cow;

use flotilla_core::{ObsRef, Space};
use rand::Rng;
use tch::{Device, Kind, Tensor};

use crate::acting::ActingPolicy;
use crate::data::rollout::Rollout;
use crate::data::vtrace::{ImportanceWeights, VtraceConfig, VtraceTargets, vtrace};
use crate::export::{Architecture, Network, RecurrentLayout, image_shape, policy_head, policy_width, widths};
use crate::nn::distributions::{ActionDist, sample_categorical, sample_diag_gaussian};
use crate::nn::host_mlp::HostScratch;
use crate::nn::members::Coef;
use crate::nn::nets::{
    Activation, CnnOptions, NatureCnn, TwinMlp, is_image, mlp_input_dim, select_task_heads, select_task_heads_tensor,
    with_torch_seed,
};
use crate::nn::params::FlatParams;
use crate::nn::recurrent::{Recurrence, RecurrentCore};
use crate::policy::{ActMode, ActOutput, Policy};
use crate::{Error, Metrics, Result};

/// Buffers [`ActorCritic::act_with_state`] reuses between calls.
#[derive(Debug, Default, Clone)]
pub struct ActScratch {
    samples: Vec<(i64, f32)>,
    host: HostScratch,
    head: Vec<f32>,
}

/// A rollout's training targets (see [`ActorCritic::targets`]).
#[derive(Debug)]
pub struct Targets<'r> {
    rollout: &'r Rollout,
    /// The V-trace targets, when the correction is on (their importance weights give its metrics).
    pub vtrace: Option<VtraceTargets>,
}

impl Targets<'_> {
    /// Advantages, value targets (returns) and the values they were computed with, one per step.
    pub fn advantages_returns_values(&self) -> (&[f32], &[f32], &[f32]) {
        let n = self.rollout.len();
        match &self.vtrace {
            Some(t) => (&t.pg_advantages, &t.vs, &t.values),
            None => (&self.rollout.advantages[..n], &self.rollout.returns[..n], &self.rollout.values),
        }
    }

    /// V-trace's importance-weight metrics (none without V-trace).
    pub(crate) fn vtrace_metrics(&self) -> Metrics {
        let mut m = Metrics::default();
        if let Some(t) = &self.vtrace {
            t.weights.push_metrics(&mut m);
        }
        m
    }
}

/// How actions are represented.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ActionKind {
    Discrete(usize),
    Continuous(usize),
}

/// What turns observations into the policy head and the value.
#[derive(Debug, Clone)]
enum Body {
    /// Separate policy and value MLPs, for 1-D observations.
    Mlp(TwinMlp),
    /// A recurrent core (LSTM or GRU) on the observations — or, for frames, on a Nature-CNN torso's 512
    /// features —, then the policy and value MLPs on its output (SB3-contrib's `RecurrentPPO` with one LSTM
    /// shared by the policy and the value; CleanRL's `ppo_atari_lstm` for frames).
    Recurrent {
        /// The frames' Nature CNN up to its fc layer (`None`: 1-D observations go to the core as they are).
        torso: Option<NatureCnn>,
        core: RecurrentCore,
        twin: TwinMlp,
    },
    /// One Nature-CNN torso whose output layer is `[policy head | value]`, for image observations.
    Cnn(NatureCnn),
}

/// The coefficients of the actor-critic loss (`actor_critic_loss`), each one value (`f64`: the fused host
/// step) or one per member (`Coef`: the libtorch update).
#[derive(Debug, Clone, Copy)]
pub struct LossCoefficients<C = f64> {
    /// PPO's surrogate clipping ε; `None` is A2C's policy-gradient loss `−E[Â ln π(a|s)]`.
    pub clip_range: Option<C>,
    /// Value clipping range, if any.
    pub clip_range_vf: Option<C>,
    /// Entropy coefficient.
    pub ent_coef: C,
    /// Value loss coefficient.
    pub vf_coef: C,
}

/// The loss terms of one minibatch, one per member (`[N]`, differentiable where it matters).
#[derive(Debug)]
pub struct ActorCriticLoss {
    /// `policy + vf_coef · value − ent_coef · entropy`: what is minimised.
    pub total: Tensor,
    /// PPO's clipped surrogate loss `−E[min(ρ Â, clip(ρ, 1±ε) Â)]`, or A2C's `−E[Â ln π(a|s)]`.
    pub policy: Tensor,
    /// `E[(R − V)²]`, or the clipped variant.
    pub value: Tensor,
    /// Mean entropy, when it was given (it is left out of the graph when its coefficient is 0).
    pub entropy: Option<Tensor>,
    /// `ln ρ` per sample (`[N, B]`), for diagnostics.
    pub log_ratio: Tensor,
}

impl ActorCriticLoss {
    /// A minibatch's loss from its micro-batches' (`parts`, equal sizes), without gradient: the means of their
    /// terms, all their log-ratios.
    pub(crate) fn merge<D>(parts: &[(ActorCriticLoss, D)]) -> ActorCriticLoss {
        let mean = |f: &dyn Fn(&ActorCriticLoss) -> Tensor| mean_of(parts.iter().map(|(l, _)| f(l)).collect());
        let entropy =
            parts[0].0.entropy.is_some().then(|| mean(&|l| l.entropy.as_ref().expect("all or none").detach()));
        ActorCriticLoss {
            total: mean(&|l| l.total.detach()),
            policy: mean(&|l| l.policy.detach()),
            value: mean(&|l| l.value.detach()),
            entropy,
            log_ratio: Tensor::cat(&parts.iter().map(|(l, _)| l.log_ratio.detach()).collect::<Vec<_>>(), -1),
        }
    }

    /// `E[(ρ − 1) − ln ρ]`, an unbiased low-variance estimate of KL(old ‖ new) (Schulman 2020), no gradient.
    pub fn approx_kl(&self) -> Tensor {
        tch::no_grad(|| (self.log_ratio.exp() - 1.0 - &self.log_ratio).mean_dim(-1, false, Kind::Float))
    }

    /// Fraction of samples whose ratio left `[1 − ε, 1 + ε]`, no gradient.
    pub(crate) fn clip_fraction(&self, clip_range: &Coef) -> Tensor {
        let outside = |x: &Tensor| match clip_range {
            Coef::One(c) => x.gt(*c),
            Coef::Each(c) => x.gt_tensor(&c.unsqueeze(1)),
        };
        tch::no_grad(|| {
            outside(&(self.log_ratio.exp() - 1.0).abs()).to_kind(Kind::Float).mean_dim(-1, false, Kind::Float)
        })
    }
}

/// The mean of equal-shaped tensors, without gradient (one is returned as it is).
pub(crate) fn mean_of(mut tensors: Vec<Tensor>) -> Tensor {
    if tensors.len() == 1 {
        return tensors.pop().expect("one tensor");
    }
    let k = tensors.len() as f64;
    tch::no_grad(|| tensors.into_iter().fold(Tensor::from(0.0f32), |a, b| a + b) / k)
}

/// An update's loss terms on its last minibatch, for the metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepLoss {
    pub(crate) policy: f64,
    pub(crate) value: f64,
    pub(crate) entropy: f64,
    /// `E[(ρ − 1) − ln ρ]` (PPO).
    pub(crate) approx_kl: f64,
    /// Share of samples with `|ρ − 1| > ε` (PPO).
    pub(crate) clip_fraction: f64,
}

/// How one member's update goes over a rollout ([`agent::OnPolicyKind::settings`]), on the fused CPU path and
/// on libtorch alike: PPO's epochs of shuffled minibatches, A2C's one full batch.
#[derive(Debug, Clone)]
pub struct Settings {
    pub(crate) lr: f64,
    pub(crate) coefficients: LossCoefficients,
    pub(crate) n_epochs: usize,
    pub(crate) batch_size: usize,
    pub(crate) normalize_advantage: bool,
    /// Stop early when a step's approximate KL passes `1.5 ·` this.
    pub(crate) target_kl: Option<f64>,
    pub(crate) max_grad_norm: f64,
    /// Shuffle the minibatches each epoch with the agent's RNG (else take them in order, drawing nothing).
    pub(crate) shuffle: bool,
    /// The algorithm's name, for errors.
    pub(crate) algorithm: &'static str,
}

/// The PPO or A2C loss of each member from per-sample tensors (all `[N, B]`, or `[B]` for one): new and old
/// log-probs, advantages (constants, normalised already where asked), entropies (optional), new and old
/// values, and value targets.
#[allow(clippy::too_many_arguments)]
pub(crate) fn actor_critic_loss(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    entropy: Option<&Tensor>,
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    c: &LossCoefficients<Coef>,
) -> ActorCriticLoss {
    let mean = |t: Tensor| t.mean_dim(-1, false, Kind::Float);
    let log_ratio = log_prob - old_log_prob;
    let policy = match &c.clip_range {
        None => -mean(advantages.detach() * log_prob),
        Some(eps) => {
            let ratio = log_ratio.exp();
            let surrogate = advantages * &ratio;
            let clipped = advantages * eps.clamp_around(&ratio, 1.0);
            -mean(surrogate.min_other(&clipped))
        }
    };
    let value = match &c.clip_range_vf {
        None => mean((returns.detach() - values).square()),
        Some(eps) => {
            let clipped_values = old_values + eps.clamp_around(&(values - old_values), 0.0);
            let unclipped = (returns - values).square();
            let clipped = (returns - clipped_values).square();
            mean(unclipped.max_other(&clipped))
        }
    };
    let mut total = &policy + c.vf_coef.mul(&value);
    let entropy = entropy.map(|e| mean(e.shallow_clone()));
    if let Some(e) = &entropy {
        total -= c.ent_coef.mul(e);
    }
    ActorCriticLoss { total, policy, value, entropy, log_ratio }
}

/// `1 − Var(returns − values) / Var(returns)`: 1 is a perfect value function, ≤ 0 no better than a constant.
pub fn explained_variance(values: &[f32], returns: &[f32]) -> f64 {
    let var = |xs: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = xs.collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64
    };
    let var_returns = var(&mut returns.iter().map(|&r| r as f64));
    if var_returns == 0.0 {
        return f64::NAN;
    }
    1.0 - var(&mut returns.iter().zip(values).map(|(&r, &v)| (r - v) as f64)) / var_returns
}

/// The network choices of an actor-critic config.
#[derive(Debug, Clone, Copy)]
pub struct NetConfig<'a> {
    /// Hidden widths of the policy and value MLPs (vector observations).
    pub hidden: &'a [i64],
    /// Their nonlinearity.
    pub activation: Activation,
    /// Initial log-std of a Gaussian policy.
    pub log_std_init: f64,
    /// How the Nature CNN computes (image observations).
    pub cnn: CnnOptions,
    /// Output heads, one per task of a multi-task run (1: one head). With `T > 1` heads the observations end in
    /// the task's one-hot (`[[tasks]]`), the MLP's output layer holds `T` policy heads and `T` values, and each
    /// row reads its task's: a shared torso with a head per task.
    pub heads: usize,
    /// A recurrent core before the MLPs (`Recurrence::None`: feed-forward).
    pub recurrent: Recurrence,
    /// Its hidden units.
    pub recurrent_hidden: i64,
}

impl NetConfig<'_> {
    /// The exported architecture of `algorithm`'s actor-critic ([`ActorCritic`]) for these spaces.
    pub fn architecture(&self, algorithm: &str, observation: &Space, action: &Space) -> Result<Architecture> {
        let heads = self.heads.max(1);
        let policy = policy_head(action)?;
        let n = policy_width(&policy);
        let network = if is_image(observation) && !self.recurrent.is_some() {
            Network::nature_cnn("cnn", observation, NatureCnn::CHANNELS, NatureCnn::FEATURES, n + 1, n)?
        } else {
            let inputs = if self.recurrent.is_some() {
                self.recurrent_hidden as usize
            } else {
                mlp_input_dim("actor-critic", observation)?
            };
            let (policy_outputs, value_outputs) = (n * heads, heads);
            Network::TwinMlp {
                prefix: "pi_vf".into(),
                widths: widths(inputs, self.hidden, policy_outputs.max(value_outputs)),
                activation: self.activation,
                policy_outputs,
                value_outputs,
            }
        };
        let mut arch = Architecture::new(algorithm, network, policy, heads, observation, action);
        if self.recurrent.is_some() {
            let torso = if is_image(observation) { Some(image_shape(observation)?) } else { None };
            let inputs = if torso.is_some() { NatureCnn::FEATURES as usize } else { observation.flat_dim() };
            let hidden = self.recurrent_hidden as usize;
            arch.recurrent = Some(RecurrentLayout { cell: self.recurrent, inputs, hidden, torso });
        }
        Ok(arch)
    }
}

/// A plain twin MLP's layer weight indices, nonlinearity and output widths, and the log-std's index.
pub(crate) type TwinLayout<'a> = (&'a [usize], Activation, [i64; 2], Option<usize>);

/// Policy and value networks over one parameter buffer.
#[derive(Debug)]
pub struct ActorCritic {
    /// Every parameter: the body, then the log-std for Gaussian policies.
    pub params: FlatParams,
    body: Body,
    log_std: Option<usize>,
    action: ActionKind,
    obs_dim: usize,
    /// Output heads (one per task; 1 without task heads).
    heads: usize,
    /// Where the parameters live.
    pub device: Device,
}

impl ActorCritic {
    /// Build for these spaces (1-D box observations get MLPs of `net.hidden` widths, u8 image observations the
    /// Nature CNN computing as `net.cnn` says; discrete or 1-D box actions). `algorithm` names the caller in
    /// errors; `seed` fixes the initialisation.
    pub fn new(
        algorithm: &'static str,
        observation_space: &Space,
        action_space: &Space,
        net: &NetConfig<'_>,
        device: Device,
        seed: u64,
    ) -> Result<Self> {
        let NetConfig { hidden, activation, log_std_init, cnn: cnn_options, heads, recurrent, recurrent_hidden } = *net;
        let heads = heads.max(1);
        let action = match action_space {
            Space::Discrete { n, .. } => ActionKind::Discrete(*n),
            Space::Box { shape, .. } if shape.len() == 1 => ActionKind::Continuous(shape[0]),
            other => return Err(Error::space("action", algorithm, format!("{other:?}"))),
        };
        let outputs = match action {
            ActionKind::Discrete(n) | ActionKind::Continuous(n) => n as i64,
        };
        if heads > 1 && (is_image(observation_space) || observation_space.flat_dim() <= heads) {
            return Err(Error::space(
                "observation",
                algorithm,
                format!(
                    "{observation_space:?}: {heads} task heads need vector observations ending in the task's \
                     one-hot ([[tasks]])"
                ),
            ));
        }
        if recurrent.is_some() && heads > 1 {
            return Err(Error::space(
                "observation",
                algorithm,
                format!("{observation_space:?}: a recurrent core with task heads is not built (use one or the other)"),
            ));
        }
        let cnn_refused = |shape: &[usize]| {
            Error::space(
                "observation",
                algorithm,
                format!("frames of shape {shape:?}: the Nature CNN takes [C, H, W] with H, W ≥ 36"),
            )
        };
        let (image, shape) = (is_image(observation_space), observation_space.shape());
        let obs_dim = if image { observation_space.flat_dim() } else { mlp_input_dim(algorithm, observation_space)? };
        let (body, mut named) = if recurrent.is_some() {
            let (torso, core, twin, named) = with_torch_seed(seed, || {
                // Frames: the CNN torso first (its tensors `cnn.*`), its 512 features into the core.
                let (torso, mut named) = if image {
                    match NatureCnn::init("cnn", shape, &[], 0) {
                        Some((cnn, named)) => (Some(cnn.with_options(cnn_options)), named),
                        None => return None,
                    }
                } else {
                    (None, Vec::new())
                };
                let inputs = if image { NatureCnn::FEATURES } else { obs_dim as i64 };
                let (core, more) = RecurrentCore::init("core", recurrent, inputs, recurrent_hidden, named.len());
                named.extend(more);
                let (twin, more) = TwinMlp::init(
                    "pi_vf",
                    recurrent_hidden,
                    hidden,
                    [outputs, 1],
                    activation,
                    [0.01, 1.0],
                    named.len(),
                );
                named.extend(more);
                Some((torso, core, twin, named))
            })
            .ok_or_else(|| cnn_refused(shape))?;
            (Body::Recurrent { torso, core, twin }, named)
        } else if image {
            let built = with_torch_seed(seed, || NatureCnn::init("cnn", shape, &[(outputs, 0.01), (1, 1.0)], 0));
            let (cnn, named) = built.ok_or_else(|| cnn_refused(shape))?;
            (Body::Cnn(cnn.with_options(cnn_options)), named)
        } else {
            let (twin, named) = with_torch_seed(seed, || {
                let h = heads as i64;
                TwinMlp::init("pi_vf", obs_dim as i64, hidden, [outputs * h, h], activation, [0.01, 1.0], 0)
            });
            (Body::Mlp(twin), named)
        };
        let log_std = match action {
            ActionKind::Discrete(_) => None,
            ActionKind::Continuous(d) => {
                named.push(("log_std".into(), Tensor::full([d as i64], log_std_init, (Kind::Float, Device::Cpu))));
                Some(named.len() - 1)
            }
        };
        let params = FlatParams::new(named, device);
        Ok(ActorCritic { params, body, log_std, action, obs_dim, heads, device })
    }

    /// The twin MLP's layout (layer weight indices, nonlinearity, output widths) and the log-std's index, for a
    /// population's batched update; `None` for the CNN body or task heads, which it does not batch.
    pub(crate) fn twin_layout(&self) -> Option<TwinLayout<'_>> {
        match &self.body {
            Body::Mlp(twin) if self.heads == 1 => {
                let (layers, activation, outputs) = twin.layout();
                Some((layers, activation, outputs, self.log_std))
            }
            _ => None,
        }
    }

    /// A recurrent body's core and the [`ActorCritic::twin_layout`] of the twin MLP after it, for the fused CPU
    /// step; `None` for the other bodies (and a recurrent body with a CNN torso, which trains on libtorch).
    pub(crate) fn recurrent_twin_layout(&self) -> Option<(&RecurrentCore, TwinLayout<'_>)> {
        match &self.body {
            Body::Recurrent { torso: None, core, twin } => {
                let (layers, activation, outputs) = twin.layout();
                Some((core, (layers, activation, outputs, self.log_std)))
            }
            _ => None,
        }
    }

    /// Flattened observation size.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// f32 values per action: 1 for discrete actions, `D` for boxes.
    pub fn act_dim(&self) -> usize {
        match self.action {
            ActionKind::Discrete(_) => 1,
            ActionKind::Continuous(d) => d,
        }
    }

    /// Observations `rows × obs_dim` as a tensor on the device, in their own dtype (frames are copied to the
    /// device as bytes; the network scales them there): `[B, obs_dim]`, or `[B, C, H, W]` for the CNN.
    pub fn obs_tensor(&self, obs: ObsRef<'_>) -> Result<Tensor> {
        self.obs_layout().tensor(obs)
    }

    /// How this network takes observations (for a batch-assembly thread).
    pub fn obs_layout(&self) -> crate::nn::nets::ObsLayout {
        let image = match &self.body {
            Body::Mlp(_) | Body::Recurrent { torso: None, .. } => None,
            Body::Cnn(cnn) | Body::Recurrent { torso: Some(cnn), .. } => Some(cnn.shape()),
        };
        crate::nn::nets::ObsLayout { obs_dim: self.obs_dim, image, device: self.device }
    }

    /// A rollout's observations as the network's input: the device copy an assembly thread made
    /// ([`Rollout::put_obs_on_device`]), else copied now.
    pub fn rollout_obs(&self, rollout: &Rollout) -> Result<Tensor> {
        match rollout.device_obs() {
            Some(x) => Ok(x.shallow_clone()),
            None => self.obs_tensor(rollout.obs.as_ref()),
        }
    }

    /// Stored actions as the distribution takes them, on `device`: i64 indices `[B]` or floats `[B, D]`.
    pub fn actions_tensor(&self, actions: &[f32], device: Device) -> Tensor {
        let t = Tensor::from_slice(actions);
        match self.action {
            ActionKind::Discrete(_) => t.to_kind(Kind::Int64).to_device(device),
            ActionKind::Continuous(d) => t.view([-1, d as i64]).to_device(device),
        }
    }

    /// Policy head output (logits or means) and values `[B]`.
    pub fn forward(&self, obs: &Tensor) -> (Tensor, Tensor) {
        match &self.body {
            Body::Mlp(twin) => {
                let (head, value) = twin.forward(&self.params, obs);
                if self.heads == 1 {
                    return (head, value.squeeze_dim(1));
                }
                // Each row's own task's head: weights 1 on its task, 0 on the others (the one-hot).
                (
                    select_task_heads_tensor(obs, self.heads, &head),
                    select_task_heads_tensor(obs, self.heads, &value).squeeze_dim(1),
                )
            }
            Body::Cnn(cnn) => {
                let out = cnn.forward(&self.params, obs);
                let n = out.size()[1] - 1;
                (out.narrow(1, 0, n), out.narrow(1, n, 1).squeeze_dim(1))
            }
            Body::Recurrent { core, .. } => {
                // An episode's first step: from zero state.
                let state = Tensor::zeros([obs.size()[0], core.state_dim() as i64], (Kind::Float, self.device));
                let (head, values, _) = self.forward_with_state(obs, &state);
                (head, values)
            }
        }
    }

    /// Floats of recurrent state per env (0: feed-forward).
    pub fn state_dim(&self) -> usize {
        match &self.body {
            Body::Recurrent { core, .. } => core.state_dim(),
            _ => 0,
        }
    }

    /// One step of the recurrent policy: observations `[B, obs_dim]` and each row's state `[B, S]` → policy
    /// head, values `[B]` and the new state. (A feed-forward network ignores the state and returns it.)
    pub fn forward_with_state(&self, obs: &Tensor, state: &Tensor) -> (Tensor, Tensor, Tensor) {
        match &self.body {
            Body::Recurrent { torso, core, twin } => {
                let x = torso.as_ref().map(|cnn| cnn.forward(&self.params, obs));
                let (h, next) = core.step(&self.params, x.as_ref().unwrap_or(obs), state);
                let (head, value) = twin.forward(&self.params, &h);
                (head, value.squeeze_dim(1), next)
            }
            _ => {
                let (head, values) = self.forward(obs);
                (head, values, state.shallow_clone())
            }
        }
    }

    /// The recurrent policy over sequences: observations `[T · B, obs_dim]` (time-major rows `t · B + b`),
    /// `starts` `[T, B]` (1 where an episode starts: the state is zeroed before that step) and the state before
    /// the first step `[B, S]` → policy heads `[T · B, …]`, values `[T · B]` and the state after each step
    /// `[T, B, S]`. Step for step the arithmetic of [`ActorCritic::forward_with_state`].
    pub fn forward_sequence(&self, obs: &Tensor, starts: &Tensor, state: &Tensor) -> (Tensor, Tensor, Tensor) {
        let Body::Recurrent { torso, core, twin } = &self.body else {
            let (head, values) = self.forward(obs);
            return (head, values, state.shallow_clone());
        };
        let (t, b) = (starts.size()[0], starts.size()[1]);
        let x = torso.as_ref().map(|cnn| cnn.forward(&self.params, obs));
        let (h, states) = core.sequence(&self.params, &x.as_ref().unwrap_or(obs).view([t, b, -1]), starts, state);
        let (head, value) = twin.forward(&self.params, &h.view([t * b, -1]));
        (head, value.squeeze_dim(1), states)
    }

    /// Re-run a rollout's sequences under the current parameters, from the state each env had when the rollout
    /// began ([`Rollout::initial_state`]) with resets where episodes started: the log-probabilities of the
    /// stored actions, the values, and every `V(x_{t+1})` — a truncated episode's final observation from the
    /// state its last step left, the bootstrap observations from the state after the last step (zero where an
    /// episode just ended). No gradient. `obs` is the rollout's observations as the network's input.
    pub fn sequence_eval(&self, rollout: &Rollout, obs: &Tensor) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let (s, e) = (self.state_dim(), rollout.n_envs);
        let n = rollout.len();
        let t = n / e.max(1);
        if rollout.initial_state.len() != e * s {
            return Err(Error::length(
                "rollout initial recurrent state (chunks carry it as initial_state)",
                rollout.initial_state.len(),
                e * s,
            ));
        }
        let d = self.device;
        let starts = Tensor::from_slice(&rollout.episode_starts()).view([t as i64, e as i64]).to_device(d);
        let state0 = Tensor::from_slice(&rollout.initial_state).view([e as i64, s as i64]).to_device(d);
        let a = self.actions_tensor(&rollout.actions, d);
        let (log_probs, values, states) = tch::no_grad(|| {
            let (head, values, states) = self.forward_sequence(obs, &starts, &state0);
            (self.dist(head).log_prob(&a), values, states)
        });
        let cpu = |t: Tensor| Vec::<f32>::try_from(t.to_device(Device::Cpu));
        let (log_probs, values) = (cpu(log_probs)?, cpu(values)?);
        let states = states.view([n as i64, s as i64]);
        let next_values = rollout.next_values_under(&values, |rows| {
            // Rows: the final observations of truncated steps (in `final_obs_steps` order), then the
            // bootstrap observations where they are needed.
            let finals = rollout.final_obs_steps.len();
            let steps: Vec<i64> = rollout.final_obs_steps.iter().map(|&i| i as i64).collect();
            let mut parts = vec![states.index_select(0, &Tensor::from_slice(&steps).to_device(d))];
            if rows.len() / self.obs_dim > finals {
                let dones: Vec<f32> =
                    (n - e..n).map(|i| if rollout.terminated[i] || rollout.truncated[i] { 0.0 } else { 1.0 }).collect();
                let keep = Tensor::from_slice(&dones).to_device(d).unsqueeze(1);
                parts.push(states.narrow(0, (n - e) as i64, e as i64) * keep);
            }
            let x = self.obs_tensor(rows)?;
            let (_, v, _) = tch::no_grad(|| self.forward_with_state(&x, &Tensor::cat(&parts, 0)));
            Ok(cpu(v)?)
        })?;
        Ok((log_probs, values, next_values))
    }

    /// The action distribution for a policy head output.
    pub fn dist(&self, head: Tensor) -> ActionDist {
        match self.log_std {
            None => ActionDist::Categorical { logits: head },
            Some(i) => ActionDist::DiagGaussian { mean: head, log_std: self.params.view(i).shallow_clone() },
        }
    }

    /// Sample (or, with `deterministic`, take the mode of) the policy for a batch; fills actions, their
    /// log-probs and the values. `state` (`rows × state_dim`, empty for a feed-forward network) is each row's
    /// state before the step and is overwritten with the state after. `scratch` is reused between calls. On the
    /// CPU, MLPs on f32 observations run without libtorch ([`crate::nn::host_mlp`]).
    pub fn act_with_state(
        &self,
        obs: ObsRef<'_>,
        state: &mut [f32],
        deterministic: bool,
        rng: &mut impl Rng,
        scratch: &mut ActScratch,
        out: &mut ActOutput,
    ) -> Result<()> {
        if obs.is_empty() || !obs.len().is_multiple_of(self.obs_dim) {
            return Err(Error::length("observation batch", obs.len(), self.obs_dim));
        }
        let (rows, s) = (obs.len() / self.obs_dim, self.state_dim());
        if state.len() != rows * s {
            if state.is_empty() {
                return Err(Error::Unsupported(
                    "a recurrent policy acts from each env's state: call act_with_state (flotilla_algorithms::Memory)"
                        .into(),
                ));
            }
            return Err(Error::length("recurrent state rows", state.len(), rows * s));
        }
        out.q_values.clear();
        let ActScratch { samples, host, head } = scratch;
        let on_host = match (&self.body, obs) {
            (Body::Mlp(twin), ObsRef::F32(x)) => {
                let done = twin.forward_host(&self.params, x, rows, host, [&mut *head, &mut out.values]);
                if done && self.heads > 1 {
                    select_task_heads(x, self.obs_dim, self.heads, head);
                    select_task_heads(x, self.obs_dim, self.heads, &mut out.values);
                }
                done
            }
            _ => false,
        };
        if !on_host {
            let x = self.obs_tensor(obs)?;
            let (h, values) = if s == 0 {
                tch::no_grad(|| self.forward(&x))
            } else {
                let before = Tensor::from_slice(state).view([rows as i64, s as i64]).to_device(self.device);
                let (h, values, after) = tch::no_grad(|| self.forward_with_state(&x, &before));
                state.copy_from_slice(&Vec::<f32>::try_from(after.flatten(0, -1).to_device(Device::Cpu))?);
                (h, values)
            };
            out.values = Vec::<f32>::try_from(values.to_device(Device::Cpu))?;
            *head = Vec::<f32>::try_from(h.flatten(0, -1).to_device(Device::Cpu))?;
        }
        // A Gaussian's log-std, read in place where the parameters are on the host.
        let log_std = match self.log_std {
            None => Cow::Borrowed(&[][..]),
            Some(i) => match self.params.host_values() {
                Some(v) => Cow::Borrowed(&v[self.params.offset(i)..self.params.offset(i) + self.act_dim()]),
                None => Cow::Owned(Vec::<f32>::try_from(self.params.view(i).detach().to_device(Device::Cpu))?),
            },
        };
        self.sample_with(deterministic, rng, samples, head, &log_std, out);
        Ok(())
    }

    /// Sample (or take the mode of) the policy heads in `head` into `out`'s actions and log-probs, with a
    /// Gaussian policy's log-std given (`log_std`, ignored for a categorical one; the members' batched acting
    /// pass fetches every member's at once).
    pub(crate) fn sample_with(
        &self,
        deterministic: bool,
        rng: &mut impl Rng,
        samples: &mut Vec<(i64, f32)>,
        head: &mut [f32],
        log_std: &[f32],
        out: &mut ActOutput,
    ) {
        match self.action {
            ActionKind::Discrete(n) => {
                sample_categorical(head, n, deterministic, rng, samples);
                out.actions.clear();
                out.log_probs.clear();
                for &(a, lp) in samples.iter() {
                    out.actions.push(a as f32);
                    out.log_probs.push(lp);
                }
            }
            ActionKind::Continuous(_) => {
                sample_diag_gaussian(head, log_std, deterministic, rng, &mut out.actions, &mut out.log_probs)
            }
        }
    }

    /// The policy as a distillation teacher: its logits, or its Gaussian's means and log-std.
    pub fn teach(&self, obs: ObsRef<'_>) -> Result<crate::teaching::Teaching> {
        let x = self.obs_tensor(obs)?;
        let (head, _) = tch::no_grad(|| self.forward(&x));
        Ok(match self.log_std {
            None => crate::teaching::Teaching::new(crate::teaching::TeachingKind::Logits, &head),
            Some(i) => crate::teaching::Teaching::gaussian(&head, self.params.view(i)),
        })
    }

    /// `V(obs)` for a batch of observations.
    pub fn values(&self, obs: ObsRef<'_>) -> Result<Vec<f32>> {
        let x = self.obs_tensor(obs)?;
        let (_, v) = tch::no_grad(|| self.forward(&x));
        Ok(Vec::<f32>::try_from(v.to_device(Device::Cpu))?)
    }
    /// Log-probabilities of the stored `actions` and values of `x` (in the network's input layout) under the
    /// current parameters, without gradient.
    fn evaluate(&self, x: &Tensor, actions: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let rows = x.size()[0] as usize;
        if actions.len() != rows * self.act_dim() {
            return Err(Error::length(
                format!("actions of {rows} observations to evaluate"),
                actions.len(),
                rows * self.act_dim(),
            ));
        }
        let a = self.actions_tensor(actions, self.device);
        let (log_probs, values) = tch::no_grad(|| {
            let (head, values) = self.forward(x);
            (self.dist(head).log_prob(&a), values)
        });
        let cpu = |t: Tensor| Vec::<f32>::try_from(t.to_device(Device::Cpu));
        Ok((cpu(log_probs)?, cpu(values)?))
    }

    /// What to train on: with `vtrace`, advantages, value targets and values recomputed under the current
    /// parameters (`vtrace_targets`); without, the rollout's own (GAE). `obs` is the rollout's observations as
    /// the network's input ([`ActorCritic::rollout_obs`]) where the caller has them (else built for V-trace).
    pub fn targets<'r>(
        &self,
        rollout: &'r Rollout,
        obs: Option<&Tensor>,
        gamma: f32,
        vtrace: Option<&VtraceConfig>,
    ) -> Result<Targets<'r>> {
        let Some(config) = vtrace else { return Ok(Targets { rollout, vtrace: None }) };
        let vtrace = match obs {
            Some(obs) => self.vtrace_targets(rollout, obs, gamma, config)?,
            None => self.vtrace_targets(rollout, &self.rollout_obs(rollout)?, gamma, config)?,
        };
        Ok(Targets { rollout, vtrace: Some(vtrace) })
    }

    /// V-trace for a rollout the behaviour policy `μ` collected (its log-probs are the rollout's; `obs` its
    /// observations as the network's input), with the current parameters as the target policy `π` and value
    /// function: recomputes `ln π(a_s|x_s)`, `V(x_s)` and every `V(x_{s+1})` (from the kept final and bootstrap
    /// observations), without gradient, then [`vtrace`]. The rollout's own values and advantages are not read.
    fn vtrace_targets(
        &self,
        rollout: &Rollout,
        obs: &Tensor,
        gamma: f32,
        config: &VtraceConfig,
    ) -> Result<VtraceTargets> {
        let n = rollout.len();
        for (what, got, expected) in [
            ("rollout observations to re-evaluate", rollout.obs.len(), n * self.obs_dim),
            ("rollout behaviour log-probs", rollout.log_probs.len(), n),
        ] {
            if got != expected {
                return Err(Error::length(what, got, expected));
            }
        }
        let (target_log_probs, values, next_values) = if self.state_dim() > 0 {
            self.sequence_eval(rollout, obs)?
        } else {
            let (target_log_probs, values) = self.evaluate(obs, &rollout.actions)?;
            let next_values = rollout.next_values_under(&values, |rows| self.values(rows))?;
            (target_log_probs, values, next_values)
        };
        let (mut vs, mut pg_advantages) = (vec![0.0; n], vec![0.0; n]);
        vtrace(
            &rollout.log_probs,
            &target_log_probs,
            &rollout.rewards,
            &values,
            &next_values,
            &rollout.terminated,
            &rollout.dones(),
            rollout.n_envs,
            gamma,
            config,
            &mut vs,
            &mut pg_advantages,
        );
        let weights = ImportanceWeights::new(&rollout.log_probs, &target_log_probs, config);
        Ok(VtraceTargets { target_log_probs, values, next_values, vs, pg_advantages, weights })
    }
}

/// PPO's and A2C's acting policy, as an actor holds it: the network on the CPU and an action-sampling RNG; no
/// optimiser, no rollout.
#[derive(Debug)]
pub struct ActorCriticPolicy {
    pub(crate) net: ActorCritic,
    pub(crate) rng: rand_pcg::Pcg64,
    scratch: ActScratch,
}

impl ActorCriticPolicy {
    /// The acting policy of `net` (build it on the CPU: actors act there); `seed` fixes action sampling.
    pub fn new(net: ActorCritic, seed: u64) -> Self {
        let rng = <rand_pcg::Pcg64 as rand::SeedableRng>::seed_from_u64(seed ^ 0xac70_0001);
        ActorCriticPolicy { net, rng, scratch: ActScratch::default() }
    }
}

impl Policy for ActorCriticPolicy {
    fn obs_dim(&self) -> usize {
        self.net.obs_dim()
    }

    fn act_dim(&self) -> usize {
        self.net.act_dim()
    }

    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        self.act_with_state(obs, &mut [], mode, out)
    }

    fn state_dim(&self) -> usize {
        self.net.state_dim()
    }

    fn state_bounded(&self) -> usize {
        match &self.net.body {
            Body::Recurrent { core, .. } => core.hidden() as usize,
            _ => 0,
        }
    }

    fn act_with_state(&mut self, obs: ObsRef<'_>, state: &mut [f32], mode: ActMode, out: &mut ActOutput) -> Result<()> {
        let deterministic = mode == ActMode::Deterministic;
        self.net.act_with_state(obs, state, deterministic, &mut self.rng, &mut self.scratch, out)
    }
}

impl ActingPolicy for ActorCriticPolicy {
    fn params(&self) -> &FlatParams {
        &self.net.params
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    /// An actor-critic on 4 floats + a 3-task one-hot, 2 actions, with `heads` heads.
    fn net(heads: usize) -> ActorCritic {
        let obs = Space::box1d(vec![-5.0; 7], vec![5.0; 7]);
        let cnn = CnnOptions::default();
        let net = NetConfig {
            hidden: &[8],
            activation: Activation::Tanh,
            log_std_init: 0.0,
            cnn,
            heads,
            recurrent: Recurrence::None,
            recurrent_hidden: 0,
        };
        ActorCritic::new("ppo", &obs, &Space::discrete(2), &net, Device::Cpu, 1).unwrap()
    }

    /// 6 rows; row r is of task r mod 3.
    fn rows() -> Vec<f32> {
        (0..6)
            .flat_map(|r| {
                let mut row: Vec<f32> = (0..4).map(|i| ((r * 4 + i) as f32 * 0.37).sin()).collect();
                row.extend((0..3).map(|k| if k == r % 3 { 1.0 } else { 0.0 }));
                row
            })
            .collect()
    }

    #[test]
    fn each_row_reads_its_own_tasks_head_when_training_and_when_acting() {
        let ac = net(3);
        let x = rows();
        let xt = Tensor::from_slice(&x).view([6, 7]);
        let (head, values) = ac.forward(&xt);
        assert_eq!((head.size(), values.size()), (vec![6, 2], vec![6]));
        // Row r's head is columns 2k..2k+2 of the policy output (k its task), its value column k.
        let Body::Mlp(twin) = &ac.body else { unreachable!("an MLP") };
        let (raw_h, raw_v) = twin.forward(&ac.params, &xt);
        assert_eq!((raw_h.size(), raw_v.size()), (vec![6, 6], vec![6, 3]));
        for r in 0..6 {
            let k = r % 3;
            assert!(head.get(r).equal(&raw_h.get(r).narrow(0, 2 * k, 2)), "row {r}");
            assert_eq!(values.double_value(&[r]), raw_v.double_value(&[r, k]));
        }
        // Acting on the host (no libtorch) reads the same heads: same values, same greedy actions.
        let (mut out, mut scratch, mut rng) = (ActOutput::default(), ActScratch::default(), Pcg64::seed_from_u64(0));
        ac.act(ObsRef::F32(&x), true, &mut rng, &mut scratch, &mut out).unwrap();
        let want: Vec<f32> = Vec::try_from(&values).unwrap();
        assert!(out.values.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5), "{:?} vs {want:?}", out.values);
        let greedy: Vec<f32> = Vec::try_from(head.argmax(1, false).to_kind(Kind::Float)).unwrap();
        assert_eq!(out.actions, greedy);
        // A loss on task 0's rows trains head 0 only: the other heads' output columns get no gradient.
        let mut ac = ac;
        let task0 = Tensor::from_slice(&[0i64, 3]);
        let loss = head.index_select(0, &task0).sum(Kind::Float) + values.index_select(0, &task0).sum(Kind::Float);
        ac.params.backward(&loss);
        let i = ac.params.names().position(|n| n == "pi_vf.1.weight").unwrap();
        let g = ac.params.flat().grad().narrow(0, ac.params.offset(i) as i64, 2 * 8 * 6).view([2, 8, 6]);
        let sum = |t: Tensor| t.abs().sum(Kind::Float).double_value(&[]);
        assert!(sum(g.get(0).narrow(1, 0, 2)) > 0.0 && sum(g.get(1).narrow(1, 0, 1)) > 0.0, "head 0 trains");
        assert_eq!(sum(g.get(0).narrow(1, 2, 4)) + sum(g.get(1).narrow(1, 1, 2)), 0.0, "heads 1 and 2 do not");
    }

    #[test]
    fn task_heads_need_vector_observations_with_room_for_the_one_hot() {
        let net = NetConfig {
            hidden: &[8],
            activation: Activation::Tanh,
            log_std_init: 0.0,
            cnn: CnnOptions::default(),
            heads: 3,
            recurrent: Recurrence::None,
            recurrent_hidden: 0,
        };
        let obs = Space::box1d(vec![0.0; 3], vec![1.0; 3]);
        let e = ActorCritic::new("ppo", &obs, &Space::discrete(2), &net, Device::Cpu, 1).unwrap_err().to_string();
        assert!(e.contains("3 task heads need vector observations"), "{e}");
        assert_eq!(net_one_head_outputs(), 2);
    }

    /// Without task heads the output layer is the plain policy (2 logits) and value.
    fn net_one_head_outputs() -> i64 {
        let ac = net(1);
        let (head, values) = ac.forward(&Tensor::from_slice(&rows()).view([6, 7]));
        assert_eq!(values.size(), [6]);
        head.size()[1]
    }
}

#[cfg(test)]
mod recurrent_tests;

#[cfg(test)]
impl ActorCritic {
    /// [`ActorCritic::act_with_state`] for a feed-forward network.
    pub(crate) fn act(
        &self,
        obs: ObsRef<'_>,
        deterministic: bool,
        rng: &mut impl Rng,
        scratch: &mut ActScratch,
        out: &mut ActOutput,
    ) -> Result<()> {
        self.act_with_state(obs, &mut [], deterministic, rng, scratch, out)
    }
}
