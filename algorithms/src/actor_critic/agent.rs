//! PPO's and A2C's agent, written once ([`OnPolicyAgent`]): the actor-critic network with its acting RNG, the
//! rollout being collected, the optimiser, data-parallel replicas and the fused CPU step's state, and every
//! trait a learner asks of them. What differs — the config, the optimiser, the update — is the kind's
//! ([`OnPolicyKind`]: `ppo::PpoKind`, `a2c::A2cKind`).
use flotilla_core::{Chunk, ObsRef};

use crate::actor_critic::ActorCritic;
use crate::actor_critic::ActorCriticPolicy;
use crate::actor_critic::host::ActorCriticHost;
use crate::actor_critic::members;
use crate::algorithm::{Algorithm, OnPolicy, ParameterServer, Replicated};
use crate::checkpoint::Checkpoint;
use crate::data::rollout::{Rollout, RolloutCollector, RolloutLayout, Sequences};
use crate::nn::data_parallel::DataParallel;
use crate::nn::params::FlatParams;
use crate::policy::{ActMode, ActOutput, Policy};
use crate::progress::Progress;
use crate::teaching::Teaching;
use crate::{Metrics, Result};

/// What makes an on-policy actor-critic agent PPO or A2C.
pub trait OnPolicyKind: Sized + std::fmt::Debug + Send + 'static {
    /// Its hyperparameters.
    type Config: Clone + std::fmt::Debug + Send + 'static;
    /// Its optimiser.
    type Optimizer: std::fmt::Debug + Send + 'static;
    /// The kind's name, as in configs.
    const NAME: &'static str;
    /// The discount and GAE λ of `config`.
    fn gamma_lambda(config: &Self::Config) -> (f32, f32);
    /// One update on a finished rollout; `progress_remaining` goes from 1 to 0 over the run.
    fn update_from(agent: &mut OnPolicyAgent<Self>, rollout: &Rollout, progress_remaining: f64) -> Result<Metrics>;
    /// Save the optimiser's state.
    fn write_optimizer(opt: &Self::Optimizer, c: &mut Checkpoint) -> Result<()>;
    /// Restore what [`OnPolicyKind::write_optimizer`] saved, for `params`.
    fn read_optimizer(opt: &mut Self::Optimizer, c: &mut Checkpoint, params: &FlatParams) -> Result<()>;
    /// Refuse replicas that cannot split this agent's batches.
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
    pub config: K::Config,
    /// The acting half: network, sampling RNG (also drawing minibatch shuffles), buffers.
    pub(crate) pi: ActorCriticPolicy,
    pub(crate) opt: K::Optimizer,
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
    /// An agent acting with `pi`, collecting `n_envs × n_steps` rollouts.
    pub(crate) fn with(
        config: K::Config,
        pi: ActorCriticPolicy,
        opt: K::Optimizer,
        n_envs: usize,
        n_steps: usize,
    ) -> Self {
        let collector = RolloutCollector::new(n_envs, n_steps, pi.net.obs_dim(), pi.net.act_dim());
        let parallel = DataParallel::default();
        OnPolicyAgent { config, pi, opt, collector, parallel, host: None, defer_values: false }
    }

    /// The collected rollout with its advantages, once it is complete (what [`Algorithm::update`] trains on);
    /// `None` before. Hand it back with [`OnPolicyAgent::recycle`] after updating.
    pub fn finish_rollout(&mut self) -> Result<Option<Rollout>> {
        let (gamma, lambda) = K::gamma_lambda(&self.config);
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
                return Err(crate::Error::length(what, c.initial_state.len(), c.n_envs * s));
            }
            if let Some(i) = c.initial_state.iter().position(|x| !x.is_finite()) {
                return Err(crate::Error::Unsupported(format!(
                    "chunk initial recurrent state [{i}] is {}, must be finite",
                    c.initial_state[i]
                )));
            }
            for (env, row) in c.initial_state.chunks_exact(s.max(1)).enumerate() {
                if let Some(k) = row[..bounded].iter().position(|x| x.abs() > 1.0) {
                    return Err(crate::Error::Unsupported(format!(
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
                let (gamma, lambda) = K::gamma_lambda(&a.config);
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

    /// Samples from the policy (or takes its mode); fills actions, log-probs and values.
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
        let metrics = K::update_from(self, &rollout, progress.remaining());
        self.recycle(rollout);
        metrics.map(Some)
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        let mut c = Checkpoint::new();
        c.put_tensor("params", self.pi.net.params.flat());
        K::write_optimizer(&self.opt, &mut c)?;
        self.collector.write_to(&mut c, "rollout")?;
        c.put_meta("rng", &self.pi.rng)?;
        Ok(c)
    }

    fn restore(&mut self, c: &mut Checkpoint) -> Result<()> {
        c.copy_into("params", self.pi.net.params.flat())?;
        K::read_optimizer(&mut self.opt, c, &self.pi.net.params)?;
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
                return Err(crate::Error::length(what, rollout.initial_state.len(), s));
            }
            return self.collector.push_stacked(rollout, sequence_values(&self.pi.net));
        }
        self.collector.push_stacked(rollout, |obs: ObsRef<'_>| self.pi.net.values(obs))
    }
}

impl<K: OnPolicyKind> Replicated for OnPolicyAgent<K> {
    fn set_data_parallel(&mut self, parallel: DataParallel) -> Result<()> {
        K::check_replicas(self, &parallel)?;
        self.parallel = parallel;
        Ok(())
    }
}

/// `impl AlgorithmKind` for an on-policy kind's config (`$config`, the config of `$kind`): the answers PPO and
/// A2C share, with `$update` their batched update over the member axis; and the config's network.
macro_rules! on_policy_kind {
    ($config:ty, $kind:ty, $update:path) => {
        impl $config {
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
                let agent =
                    $crate::actor_critic::agent::OnPolicyAgent::<$kind>::new(o, a, n_envs, self.clone(), device, seed);
                Ok(Box::new(agent?))
            }

            fn architecture(
                &self,
                o: &flotilla_core::Space,
                a: &flotilla_core::Space,
            ) -> $crate::Result<$crate::export::Architecture> {
                self.net().architecture(self.name(), o, a)
            }

            fn build_acting(&self, setup: &$crate::acting::ActingSetup<'_>) -> $crate::Result<$crate::acting::Acting> {
                self.net().acting(<$kind as $crate::actor_critic::agent::OnPolicyKind>::NAME, setup)
            }

            fn update_members(
                &self,
                members: &mut [&mut dyn $crate::algorithm::Algorithm],
                progress: &$crate::progress::Progress,
            ) -> $crate::Result<Option<Vec<Option<$crate::Metrics>>>> {
                type Agent = $crate::actor_critic::agent::OnPolicyAgent<$kind>;
                let Some(agents) = $crate::kind::members_as::<Agent>(members) else { return Ok(None) };
                // One bootstrap pass for all where each member's own is launch-bound.
                let batched = agents[0].pi.net.device != tch::Device::Cpu;
                let finish = |a: &mut [&mut Agent]| Agent::finish_rollouts(a, batched);
                $crate::actor_critic::update_rollouts(self.name(), agents, finish, Agent::recycle, $update, progress)
            }

            fn act_members(
                &self,
                members: &mut [&mut dyn $crate::algorithm::Algorithm],
                obs: &[flotilla_core::ObsRef<'_>],
                mode: $crate::policy::ActMode,
                outs: &mut [&mut $crate::policy::ActOutput],
            ) -> $crate::Result<bool> {
                type Agent = $crate::actor_critic::agent::OnPolicyAgent<$kind>;
                let Some(mut agents) = $crate::kind::members_as::<Agent>(members) else { return Ok(false) };
                let mut pis: Vec<_> = agents.iter_mut().map(|a| &mut a.pi).collect();
                let deterministic = mode == $crate::policy::ActMode::Deterministic;
                let acted = $crate::actor_critic::members::act_stacked(&mut pis, obs, deterministic, outs)?;
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
