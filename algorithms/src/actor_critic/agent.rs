//! PPO's and A2C's agent, written once ([`OnPolicyAgent`]): the actor-critic network with its acting RNG, the
//! rollout being collected, the optimiser, data-parallel replicas and the fused CPU step's state, every trait a
//! learner asks of them, and the update — the fused CPU step where it applies, else the libtorch loop over the
//! member axis (`members::train`). What differs is the kind's, answered by its config ([`OnPolicyKind`]:
//! `ppo::PpoConfig`, `a2c::A2cConfig`): the optimiser, the update's settings, the metrics.
use flotilla_core::{Chunk, ObsRef, Space};
use rand::SeedableRng;
use tch::{Device, Tensor};

use crate::actor_critic::host::ActorCriticHost;
use crate::actor_critic::members::{self, Batch, Nets, StackedActorCritic};
use crate::actor_critic::{
    ActScratch, ActorCritic, ActorCriticPolicy, NetConfig, Settings, StepLoss, explained_variance,
};
use crate::algorithm::{Algorithm, OnPolicy, ParameterServer, Replicated};
use crate::checkpoint::Checkpoint;
use crate::data::rollout::{Rollout, RolloutCollector, RolloutLayout, Sequences};
use crate::data::vtrace::VtraceConfig;
use crate::kind::AlgorithmKind;
use crate::nn::data_parallel::DataParallel;
use crate::nn::members::{Rows, Snapshot, check_finite};
use crate::nn::optimiser::{Optimiser, StackedOptimiser};
use crate::nn::params::FlatParams;
use crate::nn::phases;
use crate::policy::{ActMode, ActOutput, Policy};
use crate::progress::Progress;
use crate::teaching::Teaching;
use crate::{Error, Metrics, Result};

/// What makes an on-policy actor-critic agent PPO or A2C: its config.
pub trait OnPolicyKind: AlgorithmKind + Clone + std::fmt::Debug + Send + 'static {
    /// The kind's name, as in configs.
    const NAME: &'static str;
    /// Mixed into the seed of the agent's RNG (acting, and PPO's minibatch shuffles).
    const RNG_SALT: u64;
    /// The network.
    fn net(&self) -> NetConfig<'_>;
    /// The discount γ and GAE λ.
    fn gamma_lambda(&self) -> (f32, f32);
    /// V-trace's correction, where it is on.
    fn vtrace(&self) -> Option<&VtraceConfig>;
    /// Whether an MLP's update on the CPU takes the fused step.
    fn fused_cpu(&self) -> bool;
    /// A fresh optimiser for `params`.
    fn optimiser(&self, params: &FlatParams) -> Optimiser;
    /// The update of a rollout of `n` transitions at `progress_remaining` (1 at the start of training, 0 at
    /// the end).
    fn settings(&self, n: usize, progress_remaining: f64) -> Settings;
    /// Refuse a rollout the update cannot take; `population`: the length every member's must have.
    fn check_rollout(&self, net: &ActorCritic, rollout: &Rollout, population: Option<usize>) -> Result<()>;
    /// Why a member of this config cannot update as one with a member of `first`'s, their networks aside.
    fn unbatchable(&self, first: &Self) -> Option<&'static str>;
    /// An update's metrics (the kind's module docs list them): its last minibatch's loss terms, the explained
    /// variance, V-trace's metrics and the steps taken.
    fn metrics(&self, s: &Settings, loss: &StepLoss, explained: f64, vtrace: &Metrics, steps: usize) -> Metrics;
    /// Refuse replicas that cannot split this agent's batches (a recurrent policy's are refused for every kind).
    fn check_replicas(agent: &OnPolicyAgent<Self>, parallel: &DataParallel) -> Result<()>;
    /// A3C's parameter server (A2C only).
    fn parameter_server(_agent: &mut OnPolicyAgent<Self>) -> Option<&mut dyn ParameterServer> {
        None
    }
}

/// A PPO or A2C agent (`ppo::Ppo`, `a2c::A2c`).
#[derive(Debug)]
pub struct OnPolicyAgent<K: OnPolicyKind> {
    /// Hyperparameters.
    pub config: K,
    /// The acting half: network, sampling RNG (also drawing minibatch shuffles), buffers.
    pub(crate) pi: ActorCriticPolicy,
    pub(crate) opt: Optimiser,
    /// The rollout being collected by [`Algorithm::observe`].
    pub(crate) collector: RolloutCollector,
    /// Replicas to average gradients with, and micro-batches per step.
    pub(crate) parallel: DataParallel,
    /// The fused CPU step's layout and buffers, once an update took that path.
    pub(crate) host: Option<ActorCriticHost>,
    /// Leave truncated episodes' final-observation values to the finish ([`OnPolicyAgent::defer_final_values`]).
    defer_values: bool,
}

impl<K: OnPolicyKind> OnPolicyAgent<K> {
    /// A fresh agent for these spaces, collecting rollouts from `n_envs` envs. `seed` fixes the weights'
    /// initialisation (through libtorch's global generator), action sampling and minibatch shuffling.
    pub fn new(
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        config: K,
        device: Device,
        seed: u64,
    ) -> Result<Self> {
        config.validate(n_envs)?;
        let net = ActorCritic::new(K::NAME, observation_space, action_space, &config.net(), device, seed)?;
        let opt = config.optimiser(&net.params);
        let n_steps = config.rollout_steps().expect("on-policy kinds collect rollouts");
        let collector = RolloutCollector::new(n_envs, n_steps, net.obs_dim(), net.act_dim());
        let rng = rand_pcg::Pcg64::seed_from_u64(seed ^ K::RNG_SALT);
        let pi = ActorCriticPolicy { net, rng, scratch: ActScratch::default() };
        let parallel = DataParallel::default();
        Ok(OnPolicyAgent { config, pi, opt, collector, parallel, host: None, defer_values: false })
    }

    /// One update on a finished rollout (advantages computed): the fused CPU step where it applies, else the
    /// libtorch update over the member axis as a population of one. `progress_remaining` goes from 1 (start of
    /// training) to 0 (end) and drives the annealing. [`Algorithm::update`] calls this on the rollout
    /// [`Algorithm::observe`] collected.
    ///
    /// With `vtrace` set, the rollout's advantages, returns and values are not used: V-trace recomputes them
    /// under the current parameters (the rollout itself is left as the behaviour policy's record).
    pub fn update_from(&mut self, rollout: &Rollout, progress_remaining: f64) -> Result<Metrics> {
        let fused = self.config.fused_cpu();
        let Some(mut host) = ActorCriticHost::for_update(&mut self.host, fused, &self.parallel, &self.pi.net) else {
            return Ok(update_torch(&mut [self], &[rollout], progress_remaining)?.pop().expect("one member"));
        };
        let metrics = self.update_fused(&mut host, rollout, progress_remaining);
        self.host = Some(host);
        metrics
    }

    /// [`OnPolicyAgent::update_from`] on the fused CPU path: the same targets, advantage normalisation, loss,
    /// clipping and optimiser steps, on host slices of the parameter buffer.
    fn update_fused(
        &mut self,
        host: &mut ActorCriticHost,
        rollout: &Rollout,
        progress_remaining: f64,
    ) -> Result<Metrics> {
        let c = &self.config;
        c.check_rollout(&self.pi.net, rollout, None)?;
        let s = c.settings(rollout.len(), progress_remaining);
        let targets = self.pi.net.targets(rollout, None, c.gamma_lambda().0, c.vtrace())?;
        let (advantages, returns, values) = targets.advantages_returns_values();
        self.opt.lr = s.lr;
        let rng = s.shuffle.then_some(&mut self.pi.rng);
        let targets_host = (advantages, returns, values);
        let (loss, steps) = host.train(&mut self.pi.net, &mut self.opt, rollout, targets_host, &s, rng)?;
        Ok(c.metrics(&s, &loss, explained_variance(values, returns), &targets.vtrace_metrics(), steps))
    }

    /// The collected rollout with its advantages, once it is complete (what [`Algorithm::update`] trains on);
    /// `None` before. Hand it back with [`OnPolicyAgent::recycle`] after updating.
    pub fn finish_rollout(&mut self) -> Result<Option<Rollout>> {
        let (gamma, lambda) = self.config.gamma_lambda();
        let net = &self.pi.net;
        if net.state_dim() > 0 {
            return self.collector.finish(sequence_values(net), gamma, lambda);
        }
        self.collector.finish(|obs: ObsRef<'_>| net.values(obs), gamma, lambda)
    }

    /// A recurrent agent's check of the chunks it is handed: each carries a finite initial state of the
    /// network's size for each of its envs, its `h` part within `[−1, 1]` (the hub checks actors' chunks on
    /// arrival too).
    fn check_initial_states(&self, chunks: &[Chunk]) -> Result<()> {
        let (s, bounded) = (self.pi.net.state_dim(), self.pi.state_bounded());
        for c in chunks {
            if c.initial_state.len() != c.n_envs * s {
                let what = "chunk initial recurrent state (recurrent policies send it with every chunk)";
                return Err(Error::length(what, c.initial_state.len(), c.n_envs * s));
            }
            if let Some(i) = c.initial_state.iter().position(|x| !x.is_finite()) {
                return Err(Error::Unsupported(format!(
                    "chunk initial recurrent state [{i}] is {}, must be finite",
                    c.initial_state[i]
                )));
            }
            for (env, row) in c.initial_state.chunks_exact(s.max(1)).enumerate() {
                if let Some(k) = row[..bounded].iter().position(|x| x.abs() > 1.0) {
                    return Err(Error::Unsupported(format!(
                        "chunk initial recurrent state [{}] is {}, outside [-1, 1] (env {env}'s hidden state h)",
                        env * s + k,
                        row[k]
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every member's [`OnPolicyAgent::finish_rollout`]; with `batched` (or values left to the finish by
    /// members acting as one), the bootstrap values of members whose networks stack, and those of their
    /// truncated episodes' final observations, come from one pass for all ([`members::values_stacked`]: on an
    /// accelerator, one pass instead of `N` launch-bound ones), else each member's own.
    pub(crate) fn finish_rollouts(agents: &mut [&mut Self], batched: bool) -> Result<Vec<Option<Rollout>>> {
        let full = agents.iter().all(|a| a.collector.is_full() && a.pi.net.state_dim() == 0);
        let deferred = agents.iter().any(|a| !a.collector.unvalued_obs().is_empty());
        let mut finals = Vec::new();
        let values = if (batched || deferred) && full {
            let nets: Vec<&ActorCritic> = agents.iter().map(|a| &a.pi.net).collect();
            // Each member's rows: its unvalued final observations, then its bootstrap observations.
            let mut rows: Vec<Vec<f32>> = Vec::with_capacity(agents.len());
            for a in agents.iter() {
                let (ObsRef::F32(f), ObsRef::F32(b)) = (a.collector.unvalued_obs(), a.collector.bootstrap_obs()) else {
                    return agents.iter_mut().map(|a| a.finish_rollout()).collect();
                };
                finals.push(f.len() / a.pi.net.obs_dim());
                rows.push([f, b].concat());
            }
            let obs: Vec<ObsRef<'_>> = rows.iter().map(|r| ObsRef::F32(r)).collect();
            members::values_stacked(&nets, &obs)?
        } else {
            None
        };
        let Some(values) = values else { return agents.iter_mut().map(|a| a.finish_rollout()).collect() };
        agents
            .iter_mut()
            .zip(values.into_iter().zip(finals))
            .map(|(a, (mut v, f))| {
                let (gamma, lambda) = a.config.gamma_lambda();
                let last = v.split_off(f);
                a.collector.finish_valued(v, last, gamma, lambda)
            })
            .collect()
    }

    /// Leave the values of truncated episodes' final observations to the rollout's finish
    /// ([`crate::data::rollout::RolloutCollector::push_chunks_deferred`]): a population's members acting as one
    /// value them with their bootstrap observations in one pass ([`OnPolicyAgent::finish_rollouts`]).
    pub(crate) fn defer_final_values(&mut self) {
        self.defer_values = true;
    }

    /// Give a finished rollout's storage back for the next one.
    pub fn recycle(&mut self, rollout: Rollout) {
        self.collector.recycle(rollout);
    }
}

impl<K: OnPolicyKind> Policy for OnPolicyAgent<K> {
    fn obs_dim(&self) -> usize {
        self.pi.net.obs_dim()
    }

    fn act_dim(&self) -> usize {
        self.pi.net.act_dim()
    }

    fn act(&mut self, obs: ObsRef<'_>, mode: ActMode, out: &mut ActOutput) -> Result<()> {
        self.pi.act(obs, mode, out)
    }

    fn state_dim(&self) -> usize {
        self.pi.state_dim()
    }

    fn state_bounded(&self) -> usize {
        self.pi.state_bounded()
    }

    fn act_with_state(&mut self, obs: ObsRef<'_>, state: &mut [f32], mode: ActMode, out: &mut ActOutput) -> Result<()> {
        self.pi.act_with_state(obs, state, mode, out)
    }
}

impl<K: OnPolicyKind> Algorithm for OnPolicyAgent<K> {
    fn on_policy(&mut self) -> Option<&mut dyn OnPolicy> {
        Some(self)
    }

    fn replicated(&mut self) -> Option<&mut dyn Replicated> {
        Some(self)
    }

    fn parameter_server(&mut self) -> Option<&mut dyn ParameterServer> {
        K::parameter_server(self)
    }

    fn name(&self) -> &'static str {
        K::NAME
    }

    fn teach(&mut self, obs: ObsRef<'_>) -> Result<Teaching> {
        self.pi.net.teach(obs)
    }

    fn observe(&mut self, chunks: &[Chunk]) -> Result<()> {
        let net = &self.pi.net;
        if net.state_dim() > 0 {
            self.check_initial_states(chunks)?;
            return self.collector.push_chunks(chunks, sequence_values(net));
        }
        if self.defer_values {
            return self.collector.push_chunks_deferred(chunks);
        }
        self.collector.push_chunks(chunks, |obs: ObsRef<'_>| net.values(obs))
    }

    fn update(&mut self, progress: &Progress) -> Result<Option<Metrics>> {
        let Some(rollout) = self.finish_rollout()? else {
            return Ok(None);
        };
        let metrics = self.update_from(&rollout, progress.remaining());
        self.recycle(rollout);
        metrics.map(Some)
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("params", self.pi.net.params.flat());
        self.opt.write_to(&mut c, self.opt.rule.name())?;
        self.collector.write_to(&mut c, "rollout")?;
        c.put_meta("rng", &self.pi.rng)?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        c.copy_into("params", self.pi.net.params.flat())?;
        self.opt.read_from(c, self.opt.rule.name(), &self.pi.net.params)?;
        self.collector.read_from(c, "rollout")?;
        self.pi.rng = c.meta("rng")?;
        Ok(())
    }

    fn policy_params(&self) -> &FlatParams {
        &self.pi.net.params
    }

    fn policy_params_mut(&mut self) -> &mut FlatParams {
        &mut self.pi.net.params
    }
}

impl<K: OnPolicyKind> OnPolicy for OnPolicyAgent<K> {
    fn rollout_layout(&self) -> RolloutLayout {
        self.collector.layout(self.pi.net.obs_layout())
    }

    fn observe_rollout(&mut self, rollout: Rollout) -> Result<Rollout> {
        if self.pi.net.state_dim() > 0 {
            // Truncated episodes' values come with the sequences' states at `finish_rollout`.
            let s = self.pi.net.state_dim() * rollout.n_envs;
            if rollout.initial_state.len() != s || rollout.initial_state.iter().any(|x| !x.is_finite()) {
                let what = "stacked rollout's initial recurrent state (finite)";
                return Err(Error::length(what, rollout.initial_state.len(), s));
            }
            return self.collector.push_stacked(rollout, sequence_values(&self.pi.net));
        }
        self.collector.push_stacked(rollout, |obs: ObsRef<'_>| self.pi.net.values(obs))
    }
}

impl<K: OnPolicyKind> Replicated for OnPolicyAgent<K> {
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()> {
        if self.pi.net.state_dim() > 0 && (parallel.replicas() > 1 || parallel.accumulate() > 1) {
            return Err(Error::Unsupported(format!(
                "{} with `recurrent`: data-parallel learners and gradient accumulation are not built for \
                 recurrent policies (they split minibatches by transitions, not by env sequences)",
                K::NAME
            )));
        }
        K::check_replicas(self, &parallel)?;
        self.parallel = parallel;
        Ok(())
    }
}

/// Why these members cannot be stacked into one update (`None`: they can): not plain MLPs of one layout, the
/// fused CPU step, data-parallel replicas, accumulation or frozen layers, different parameter counts,
/// optimiser steps or devices, or what their kind refuses ([`OnPolicyKind::unbatchable`]). Members that cannot
/// are updated one by one, with the same results, only slower.
pub fn unbatchable<K: OnPolicyKind>(members: &[&OnPolicyAgent<K>]) -> Option<String> {
    let first = members.first()?;
    let l0 = first.pi.net.twin_layout();
    if l0.is_none() {
        return Some("the network is not a plain MLP (a CNN, or task heads)".into());
    }
    for m in members {
        let (net, net0) = (&m.pi.net, &first.pi.net);
        if net.twin_layout() != l0 {
            return Some("members' networks differ".into());
        }
        if m.config.fused_cpu() && net.device == Device::Cpu {
            // One fused step per minibatch has no per-op dispatch for a batch to share, and one member's
            // activations stay in the caches: members update in turn, each exactly as alone.
            return Some("members take the fused CPU step (`fused_cpu`)".into());
        }
        if m.parallel.replicas() > 1 || m.parallel.accumulate() > 1 || net.params.has_frozen() {
            return Some("data-parallel replicas, gradient accumulation or frozen layers".into());
        }
        if net.params.numel() != net0.params.numel() || m.opt.steps() != first.opt.steps() || net.device != net0.device
        {
            return Some("members' parameter counts, optimiser steps or devices differ".into());
        }
    }
    members.iter().find_map(|m| m.config.unbatchable(&first.config)).map(String::from)
}

/// One update of every member on its finished rollout (advantages computed): stacked into one batched program
/// where [`unbatchable`] allows, else one by one ([`OnPolicyAgent::update_from`]). `progress_remaining`
/// (1 → 0) anneals each member's settings. Returns each member's metrics.
pub fn update_members<K: OnPolicyKind>(
    members: &mut [&mut OnPolicyAgent<K>],
    rollouts: &[&Rollout],
    progress_remaining: f64,
) -> Result<Vec<Metrics>> {
    if members.len() != rollouts.len() {
        return Err(Error::length("population rollouts", rollouts.len(), members.len()));
    }
    let refs: Vec<&OnPolicyAgent<K>> = members.iter().map(|m| &**m).collect();
    if members.len() == 1 || unbatchable(&refs).is_some() {
        return members.iter_mut().zip(rollouts).map(|(m, r)| m.update_from(r, progress_remaining)).collect();
    }
    update_torch(members, rollouts, progress_remaining)
}

/// The update on libtorch, written once over the member axis: a member alone (any network, replicas,
/// micro-batches, V-trace, a KL early stop) or several stacked ([`Nets`]).
fn update_torch<K: OnPolicyKind>(
    members: &mut [&mut OnPolicyAgent<K>],
    rollouts: &[&Rollout],
    progress_remaining: f64,
) -> Result<Vec<Metrics>> {
    let n = rollouts[0].len();
    for (m, r) in members.iter().zip(rollouts) {
        m.config.check_rollout(&m.pi.net, r, Some(n))?;
    }
    let settings: Vec<Settings> = members.iter().map(|m| m.config.settings(n, progress_remaining)).collect();
    let batch = {
        let (c0, nets) = (&members[0].config, members.iter().map(|m| &m.pi.net).collect::<Vec<_>>());
        Batch::new(&nets, rollouts, c0.gamma_lambda().0, c0.vtrace())?
    };
    phases::mark("preparing the batch");
    // Members stacked: their parameters and optimiser states are rows of shared stacks (made at the first
    // batched update, kept after), so the steps are theirs with nothing to write back; a snapshot puts them
    // back if the update fails.
    let stacked = (members.len() > 1).then(|| {
        let rows = Rows::of(&mut members.iter_mut().map(|m| &mut m.pi.net.params).collect::<Vec<_>>());
        let opt = StackedOptimiser::of(&mut members.iter_mut().map(|m| &mut m.opt).collect::<Vec<_>>(), &rows.params);
        let undo = Snapshot::of(&std::iter::once(&rows.params).chain(opt.state()).collect::<Vec<_>>());
        let nets: Vec<&ActorCritic> = members.iter().map(|m| &m.pi.net).collect();
        let net = StackedActorCritic::new(&nets, rows.views.iter().map(Tensor::shallow_clone).collect());
        (Nets::Stacked(net, rows, opt), undo)
    });
    phases::mark("sharing rows");

    // Each member's shuffling RNG (where the kind shuffles), and the networks: a member alone lends its own.
    let mut rngs = Vec::with_capacity(members.len());
    let (mut nets, undo) = stacked.map_or((None, None), |(nets, undo)| (Some(nets), Some(undo)));
    for (m, s) in members.iter_mut().zip(&settings) {
        let OnPolicyAgent { pi, opt, parallel, .. } = &mut **m;
        opt.lr = s.lr;
        if s.shuffle {
            rngs.push(&mut pi.rng);
        }
        if nets.is_none() {
            nets = Some(Nets::Alone { net: &mut pi.net, parallel, opt: Some(opt) });
        }
    }
    let mut nets = nets.expect("at least one member");
    let mut trained = members::train(&mut nets, rngs, &batch, &settings);
    if let (Nets::Stacked(_, rows, opt), Some(undo)) = (&nets, undo) {
        // A member's non-finite gradient norm fails the whole update, as any error does: every member's
        // parameters and optimiser state are put back.
        trained = trained.and_then(|t| check_finite(&rows.nonfinite, K::NAME).map(|()| t));
        match &trained {
            Err(_) => undo.restore(),
            Ok(_) => members.iter_mut().for_each(|m| opt.finish(&mut m.opt)),
        }
        phases::mark("finishing");
    }
    let (losses, steps) = trained?;
    let each = members.iter().zip(&settings).zip(losses).enumerate();
    Ok(each
        .map(|(k, ((m, s), loss))| m.config.metrics(s, &loss, batch.explained[k], &batch.vtrace[k], steps))
        .collect())
}

/// A population's batched update (`AlgorithmKind::update_members`): once every member's rollout is complete,
/// one [`update_members`] of them all, then each rollout's storage back to its member; nothing before.
pub(crate) fn update_population<K: OnPolicyKind>(
    mut agents: Vec<&mut OnPolicyAgent<K>>,
    progress: &Progress,
) -> Result<Option<Vec<Option<Metrics>>>> {
    // One bootstrap pass for all where each member's own is launch-bound.
    let device = agents[0].pi.net.device;
    // Timed (where `nn::phases` is on) once the rollouts are complete: the update's own seconds.
    let _timing = phases::start(device, || agents.iter().all(|a| a.collector.is_full()))?;
    let rollouts = OnPolicyAgent::finish_rollouts(&mut agents, device != Device::Cpu)?;
    phases::mark("finishing rollouts");
    if rollouts.iter().all(Option::is_none) {
        return Ok(Some(vec![None; agents.len()]));
    }
    let Some(rollouts) = rollouts.into_iter().collect::<Option<Vec<_>>>() else {
        return Err(Error::Unsupported(format!(
            "a population's {} members completed their rollouts at different steps",
            K::NAME
        )));
    };
    let metrics = update_members(&mut agents, &rollouts.iter().collect::<Vec<_>>(), progress.remaining())?;
    for (a, r) in agents.iter_mut().zip(rollouts) {
        a.recycle(r);
    }
    phases::mark("recycling rollouts");
    Ok(Some(metrics.into_iter().map(Some).collect()))
}

/// `impl OnPolicyKind` for a PPO or A2C config (`$config`), with the answers that read the fields both have
/// written once here, its network, and `impl AlgorithmKind` with the answers PPO and A2C share.
macro_rules! on_policy_kind {
    (impl OnPolicyKind for $config:ty { $($kind:tt)* }) => {
        impl $config {
            /// The checks of the fields PPO and A2C share (the rollout, the loss, the network), after `checks`.
            fn shared_checks(&self, checks: $crate::error::Checks) -> $crate::error::Checks {
                let (recurrent, hidden) = (self.recurrent.is_some(), self.recurrent_hidden);
                checks
                    .task_heads(self.task_heads, self.tasks)
                    .at_least_one("n_steps", self.n_steps)
                    .unit("gamma", self.gamma)
                    .unit("gae_lambda", self.gae_lambda)
                    .positive("learning_rate", self.learning_rate)
                    .finite("ent_coef", self.ent_coef)
                    .non_negative("vf_coef", self.vf_coef)
                    .limit("max_grad_norm", self.max_grad_norm)
                    .finite("log_std_init", self.log_std_init)
                    .widths("hidden_sizes", &self.hidden_sizes)
                    .that(!recurrent || hidden >= 1, "recurrent_hidden", hidden, "must be at least 1")
                    .and(self.vtrace.as_ref().map_or(Ok(()), |v| v.validate()))
            }

            /// The network this config describes.
            pub fn net(&self) -> $crate::actor_critic::NetConfig<'_> {
                $crate::actor_critic::NetConfig {
                    hidden: &self.hidden_sizes,
                    activation: self.activation,
                    log_std_init: self.log_std_init,
                    cnn: self.cnn,
                    heads: if self.task_heads { self.tasks.max(1) } else { 1 },
                    recurrent: self.recurrent,
                    recurrent_hidden: self.recurrent_hidden,
                }
            }
        }

        impl $crate::actor_critic::agent::OnPolicyKind for $config {
            fn net(&self) -> $crate::actor_critic::NetConfig<'_> {
                <$config>::net(self)
            }

            fn gamma_lambda(&self) -> (f32, f32) {
                (self.gamma as f32, self.gae_lambda as f32)
            }

            fn vtrace(&self) -> Option<&$crate::data::vtrace::VtraceConfig> {
                self.vtrace.as_ref()
            }

            fn fused_cpu(&self) -> bool {
                self.fused_cpu
            }

            $($kind)*
        }

        impl $crate::kind::AlgorithmKind for $config {
            fn validate(&self, num_envs: usize) -> $crate::Result<()> {
                <$config>::validate(self, num_envs)
            }

            fn set_tasks(&mut self, tasks: usize) {
                self.tasks = tasks;
            }

            fn rollout_steps(&self) -> Option<usize> {
                Some(self.n_steps)
            }

            fn cnn_options(&self) -> Option<$crate::nn::nets::CnnOptions> {
                Some(self.cnn)
            }

            fn learner(
                &self,
                o: &flotilla_core::Space,
                a: &flotilla_core::Space,
                n_envs: usize,
                device: tch::Device,
                seed: u64,
            ) -> $crate::Result<Box<dyn $crate::algorithm::Algorithm>> {
                let agent = $crate::actor_critic::agent::OnPolicyAgent::new(o, a, n_envs, self.clone(), device, seed);
                Ok(Box::new(agent?))
            }

            fn architecture(
                &self,
                o: &flotilla_core::Space,
                a: &flotilla_core::Space,
            ) -> $crate::Result<$crate::export::Architecture> {
                <$config>::net(self).architecture(self.name(), o, a)
            }

            fn build_acting(&self, setup: &$crate::acting::ActingSetup<'_>) -> $crate::Result<$crate::acting::Acting> {
                use $crate::actor_critic::{ActorCritic, ActorCriticPolicy, agent::OnPolicyKind};
                let (o, a, seed) = (setup.observation_space, setup.action_space, setup.seed);
                let net = ActorCritic::new(Self::NAME, o, a, &<$config>::net(self), tch::Device::Cpu, seed)?;
                Ok($crate::acting::Acting::Chunks(Box::new(ActorCriticPolicy::new(net, seed))))
            }

            fn update_members(
                &self,
                members: &mut [&mut dyn $crate::algorithm::Algorithm],
                progress: &$crate::progress::Progress,
            ) -> $crate::Result<Option<Vec<Option<$crate::Metrics>>>> {
                type Agent = $crate::actor_critic::agent::OnPolicyAgent<$config>;
                let Some(agents) = $crate::kind::members_as::<Agent>(members) else { return Ok(None) };
                $crate::actor_critic::agent::update_population(agents, progress)
            }

            fn act_members(
                &self,
                members: &mut [&mut dyn $crate::algorithm::Algorithm],
                obs: &[flotilla_core::ObsRef<'_>],
                mode: $crate::policy::ActMode,
                outs: &mut [&mut $crate::policy::ActOutput],
                stack: &mut $crate::nn::MemberStack,
            ) -> $crate::Result<bool> {
                type Agent = $crate::actor_critic::agent::OnPolicyAgent<$config>;
                let Some(mut agents) = $crate::kind::members_as::<Agent>(members) else { return Ok(false) };
                let mut pis: Vec<_> = agents.iter_mut().map(|a| &mut a.pi).collect();
                let deterministic = mode == $crate::policy::ActMode::Deterministic;
                let acted = $crate::actor_critic::members::act_stacked(&mut pis, obs, deterministic, outs, stack)?;
                if acted {
                    // They finish together too: their truncated episodes' values in the same one pass.
                    agents.iter_mut().for_each(|a| a.defer_final_values());
                }
                Ok(acted)
            }
        }
    };
}
pub(crate) use on_policy_kind;

/// A recurrent network's next-state values: its sequences re-run from the rollout's initial states
/// ([`ActorCritic::sequence_eval`]), so truncated episodes and the bootstrap are valued from the states reached.
fn sequence_values(net: &ActorCritic) -> Sequences<impl FnMut(&Rollout) -> Result<Vec<f32>> + '_> {
    Sequences(move |r: &Rollout| Ok(net.sequence_eval(r, &net.rollout_obs(r)?)?.2))
}

#[cfg(test)]
impl<K: OnPolicyKind> OnPolicyAgent<K> {
    /// The network's parameters.
    pub(crate) fn params(&self) -> &FlatParams {
        &self.pi.net.params
    }

    /// `V(obs)` for a batch of observations.
    pub(crate) fn values(&self, obs: ObsRef<'_>) -> Result<Vec<f32>> {
        self.pi.net.values(obs)
    }
}
