//! The one place that knows every algorithm kind: its config, family, validation, name, how to build the
//! learner, and how to build what an actor runs.
//!
//! Adding an algorithm: its own file (config, network, loss, `impl Algorithm`, an acting policy) and one
//! variant here, with its arm in each `match` below. Nothing else in the workspace matches on the kind.
//!
//! ```text
//! [algorithm] kind = "ppo" ─► AlgorithmConfig::Ppo(PpoConfig)       (serde, from the experiment TOML)
//!   .validate(num_envs) · .name() · .family() · .rollout_steps()
//!   .build_learner(spaces, n_envs, device, seed)  ─► Box<dyn Algorithm>    (trainer, learner, eval)
//!   .build_acting(&ActingSetup)                   ─► Acting                 (actor processes)
//! update_members(&mut [&mut dyn Algorithm], progress)  a population's batched update, where its kind has one
//! ```
use flotilla_core::Space;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::a2c::{A2c, A2cConfig, A3cWorker};
use crate::acting::{Acting, ActingSetup};
use crate::actor_critic::{ActorCritic, ActorCriticPolicy, NetConfig};
use crate::algorithm::Algorithm;
use crate::data::rollout::Rollout;
use crate::distill::{Distill, DistillConfig, DistillPolicy};
use crate::dqn::{Dqn, DqnConfig, DqnPolicy};
use crate::export::Architecture;
use crate::metrics::Metrics;
use crate::ppo::{Ppo, PpoConfig};
use crate::progress::Progress;
use crate::td3::{DdpgConfig, Td3, Td3Config, Td3Policy};
use crate::{Error, Result};

/// `[algorithm]`: `kind` picks the algorithm; the other keys are its config struct's fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum AlgorithmConfig {
    /// Proximal Policy Optimization.
    Ppo(PpoConfig),
    /// Deep Q-Networks (double-Q, dueling, prioritized replay, n-step as options).
    Dqn(DqnConfig),
    /// Advantage Actor-Critic (synchronous A3C).
    A2c(A2cConfig),
    /// Asynchronous Advantage Actor-Critic: actors compute A2C gradients on their own chunks and the learner
    /// applies them as a parameter server (needs actors: `--actors N`). Same fields as `a2c`.
    A3c(A2cConfig),
    /// Deep Deterministic Policy Gradient.
    Ddpg(DdpgConfig),
    /// Twin Delayed DDPG.
    Td3(Td3Config),
    /// Policy distillation: a student learns a trained teacher's outputs on the states it visits.
    Distill(DistillConfig),
}

/// How a learner uses what actors send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// PPO, A2C: batches of fresh whole chunks (rollouts of the algorithm's `n_steps`); too-stale chunks are
    /// skipped.
    OnPolicy,
    /// DQN, DDPG, TD3: every chunk goes into replay.
    OffPolicy,
    /// A3C: actors send gradients; the learner applies them.
    Gradients,
}

impl AlgorithmConfig {
    /// Tell the config how many tasks the run has (`[[tasks]]`; 0 without): every algorithm with
    /// `task_heads` builds one head per task (a distillation student has a head per teacher instead).
    pub fn set_tasks(&mut self, tasks: usize) {
        match self {
            AlgorithmConfig::Ppo(c) => c.tasks = tasks,
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => c.tasks = tasks,
            AlgorithmConfig::Dqn(c) => c.tasks = tasks,
            AlgorithmConfig::Ddpg(c) => c.tasks = tasks,
            AlgorithmConfig::Td3(c) => c.tasks = tasks,
            AlgorithmConfig::Distill(_) => {}
        }
    }

    /// Short name, as in configs (`"ppo"`).
    pub fn name(&self) -> &'static str {
        match self {
            AlgorithmConfig::Ppo(_) => "ppo",
            AlgorithmConfig::Dqn(_) => "dqn",
            AlgorithmConfig::A2c(_) => "a2c",
            AlgorithmConfig::A3c(_) => "a3c",
            AlgorithmConfig::Ddpg(_) => "ddpg",
            AlgorithmConfig::Td3(_) => "td3",
            AlgorithmConfig::Distill(_) => "distill",
        }
    }

    /// How a learner fed by actors uses their data.
    pub fn family(&self) -> Family {
        match self {
            AlgorithmConfig::Ppo(_) | AlgorithmConfig::A2c(_) => Family::OnPolicy,
            AlgorithmConfig::A3c(_) => Family::Gradients,
            AlgorithmConfig::Dqn(_)
            | AlgorithmConfig::Ddpg(_)
            | AlgorithmConfig::Td3(_)
            | AlgorithmConfig::Distill(_) => Family::OffPolicy,
        }
    }

    /// Range checks serde cannot express; `num_envs` envs feed each update.
    pub fn validate(&self, num_envs: usize) -> Result<()> {
        match self {
            AlgorithmConfig::Ppo(c) => c.validate(num_envs),
            AlgorithmConfig::Dqn(c) => c.validate(),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => c.validate(num_envs),
            AlgorithmConfig::Ddpg(c) => c.validate(),
            AlgorithmConfig::Td3(c) => c.validate(),
            AlgorithmConfig::Distill(c) => c.validate(),
        }
    }

    /// Steps per rollout of an on-policy algorithm (and A3C's per-gradient rollout): the length every actor
    /// chunk must have. `None` for replay-based algorithms, whose chunks may be any length.
    pub fn rollout_steps(&self) -> Option<usize> {
        match self {
            AlgorithmConfig::Ppo(c) => Some(c.n_steps),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => Some(c.n_steps),
            AlgorithmConfig::Dqn(_)
            | AlgorithmConfig::Ddpg(_)
            | AlgorithmConfig::Td3(_)
            | AlgorithmConfig::Distill(_) => None,
        }
    }

    /// Whether the config can train with actor processes feeding one learner; the error says why not.
    pub fn check_distributed(&self) -> Result<()> {
        match self {
            AlgorithmConfig::Dqn(c) if c.n_step > 1 => Err(Error::InvalidConfig {
                algorithm: "dqn",
                field: "n_step",
                value: c.n_step.to_string(),
                detail: "n-step returns need one queue per actor env, which the distributed learner does not keep \
                         yet; use n_step = 1 with actors"
                    .into(),
            }),
            AlgorithmConfig::Distill(c) => c.check_distributed(),
            _ => Ok(()),
        }
    }

    /// Whether the update can be spread over data-parallel learners or accumulated micro-batches (its gradient
    /// steps sum gradients through [`crate::DataParallel`]); the reason where not.
    pub fn check_data_parallel(&self) -> std::result::Result<(), String> {
        match self {
            AlgorithmConfig::Ppo(_)
            | AlgorithmConfig::A2c(_)
            | AlgorithmConfig::Dqn(_)
            | AlgorithmConfig::Ddpg(_)
            | AlgorithmConfig::Td3(_) => Ok(()),
            AlgorithmConfig::A3c(_) | AlgorithmConfig::Distill(_) => Err(format!(
                "{} updates cannot be spread over learners or micro-batches (PPO, A2C, DQN, DDPG and TD3 can)",
                self.name()
            )),
        }
    }

    /// The Nature CNN's options (`[algorithm.cnn]`) of the algorithms that have them.
    pub fn cnn_options(&self) -> Option<crate::nn::nets::CnnOptions> {
        match self {
            AlgorithmConfig::Ppo(c) => Some(c.cnn),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => Some(c.cnn),
            AlgorithmConfig::Dqn(c) => Some(c.cnn),
            AlgorithmConfig::Ddpg(_) | AlgorithmConfig::Td3(_) | AlgorithmConfig::Distill(_) => None,
        }
    }

    /// Whether a distributed learner can assemble this algorithm's batches on a thread of its own (stack
    /// on-policy chunks, or feed and sample replay through [`crate::algorithm::ReplayAhead::replay_feed`]); the reason
    /// where not.
    pub fn check_assemble_ahead(&self) -> std::result::Result<(), String> {
        match self {
            AlgorithmConfig::Ppo(_) | AlgorithmConfig::A2c(_) => Ok(()),
            AlgorithmConfig::Dqn(c) if c.prioritized_replay => Err("dqn with prioritized_replay = true draws each \
                 minibatch by the priorities the update before it sets, so it cannot be sampled ahead"
                .into()),
            AlgorithmConfig::Dqn(_) => Ok(()),
            AlgorithmConfig::A3c(_) => Err("a3c's learner applies actors' gradients; it assembles no batches".into()),
            AlgorithmConfig::Ddpg(_) | AlgorithmConfig::Td3(_) => {
                Err(format!("{} samples its replay on the update thread (it has no replay feed)", self.name()))
            }
            AlgorithmConfig::Distill(_) => {
                Err("distill labels states with its teacher and samples them on the update thread".into())
            }
        }
    }

    /// A fresh learning agent for these spaces fed by `n_envs` env rows per observed step, seeded with `seed`.
    /// A3C's is the parameter server: an A2C agent that applies actors' gradients.
    pub fn build_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        device: Device,
        seed: u64,
    ) -> Result<Box<dyn Algorithm>> {
        let (o, a) = (observation_space, action_space);
        let mut agent: Box<dyn Algorithm> = match self {
            AlgorithmConfig::Ppo(c) => Box::new(Ppo::new(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::Dqn(c) => Box::new(Dqn::new(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::A2c(c) | AlgorithmConfig::A3c(c) => {
                Box::new(A2c::new(o, a, n_envs, c.clone(), device, seed)?)
            }
            AlgorithmConfig::Ddpg(c) => Box::new(Td3::ddpg(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::Td3(c) => Box::new(Td3::td3(o, a, n_envs, c.clone(), device, seed)?),
            AlgorithmConfig::Distill(c) => Box::new(Distill::new(o, a, c.clone(), device, seed)?),
        };
        // Every save of the policy weights then says how to read them.
        agent.policy_params_mut().set_metadata(self.architecture(o, a)?.to_metadata());
        Ok(agent)
    }

    /// How the acting network of an agent built for these spaces lays out its weights and reads its output
    /// (written into `model.safetensors`; [`crate::export`]).
    pub fn architecture(&self, observation_space: &Space, action_space: &Space) -> Result<Architecture> {
        let (o, a) = (observation_space, action_space);
        match self {
            AlgorithmConfig::Ppo(c) => Architecture::actor_critic("ppo", o, a, &c.net()),
            AlgorithmConfig::A2c(c) => Architecture::actor_critic("a2c", o, a, &c.net()),
            AlgorithmConfig::A3c(c) => Architecture::actor_critic("a3c", o, a, &c.net()),
            AlgorithmConfig::Dqn(c) => Architecture::dqn(o, a, c),
            AlgorithmConfig::Ddpg(c) => Architecture::td3("ddpg", o, a, &c.clone().into()),
            AlgorithmConfig::Td3(c) => Architecture::td3("td3", o, a, c),
            AlgorithmConfig::Distill(c) => Architecture::distill(o, a, c),
        }
    }

    /// What an actor process runs (on the CPU): the acting policy alone — weights and the forward pass, no
    /// optimiser, replay or rollout buffers — or, for A3C, a gradient worker.
    pub fn build_acting(&self, setup: &ActingSetup<'_>) -> Result<Acting> {
        let ActingSetup { observation_space: o, action_space: a, n_envs, seed, epsilon_floor, frozen } = *setup;
        let actor_critic = |name, net: &NetConfig<'_>| {
            let net = ActorCritic::new(name, o, a, net, Device::Cpu, seed)?;
            Ok::<_, Error>(ActorCriticPolicy::new(net, seed))
        };
        Ok(match self {
            AlgorithmConfig::Ppo(c) => Acting::Chunks(Box::new(actor_critic("ppo", &c.net())?)),
            AlgorithmConfig::A2c(c) => Acting::Chunks(Box::new(actor_critic("a2c", &c.net())?)),
            AlgorithmConfig::A3c(c) => {
                let mut worker = A3cWorker::new(o, a, n_envs, c.clone(), seed)?;
                worker.freeze(frozen)?;
                Acting::Gradients(Box::new(worker))
            }
            AlgorithmConfig::Dqn(c) => Acting::Chunks(Box::new(DqnPolicy::new(o, a, c.clone(), epsilon_floor, seed)?)),
            AlgorithmConfig::Ddpg(c) => {
                Acting::Chunks(Box::new(Td3Policy::new("ddpg", o, a, n_envs, &c.clone().into(), seed)?))
            }
            AlgorithmConfig::Td3(c) => Acting::Chunks(Box::new(Td3Policy::new("td3", o, a, n_envs, c, seed)?)),
            AlgorithmConfig::Distill(c) => Acting::Chunks(Box::new(DistillPolicy::new(o, a, c, seed)?)),
        })
    }

    /// The run directories of a distillation's teachers (empty for every other kind): the learner loads them
    /// and hands them over with [`crate::algorithm::Student::set_teachers`].
    pub fn teachers(&self) -> &[String] {
        match self {
            AlgorithmConfig::Distill(c) => &c.teachers,
            _ => &[],
        }
    }
}

/// One batched update for a population's members where their kind has one (members batching: PPO and A2C
/// once every member's rollout is complete, DQN, DDPG and TD3 when their training phases fall due), each
/// member's metrics in order (`None` where no update was due). `None` where the members cannot batch (one
/// member, mixed kinds, or a kind without a batched update): then each updates alone.
pub fn update_members(members: &mut [&mut dyn Algorithm], progress: &Progress) -> Result<Option<Vec<Option<Metrics>>>> {
    if members.len() < 2 {
        return Ok(None);
    }
    if let Some(mut dqns) = all_of::<Dqn>(members) {
        return crate::dqn::update_members(&mut dqns, progress).map(Some);
    }
    if let Some(mut td3s) = all_of::<Td3>(members) {
        return crate::td3::update_members(&mut td3s, progress).map(Some);
    }
    if let Some(ppos) = all_of::<Ppo>(members) {
        let update = crate::ppo::update_members;
        return update_rollouts("PPO", ppos, Ppo::finish_rollout, Ppo::recycle, update, progress).map(Some);
    }
    if let Some(a2cs) = all_of::<A2c>(members) {
        let update = crate::a2c::update_members;
        return update_rollouts("A2C", a2cs, A2c::finish_rollout, A2c::recycle, update, progress).map(Some);
    }
    Ok(None)
}

/// Every member as an `A`, or `None` if any is another kind.
fn all_of<'a, A: Algorithm>(members: &'a mut [&mut dyn Algorithm]) -> Option<Vec<&'a mut A>> {
    // `(**m)`: the agent itself, not the reference to it (which is `Any` too).
    if !members.iter_mut().all(|m| (**m).as_any_mut().is::<A>()) {
        return None;
    }
    Some(members.iter_mut().map(|m| (**m).as_any_mut().downcast_mut::<A>().expect("checked just above")).collect())
}

/// [`update_members`] for on-policy members: once every member's rollout is complete (`finish`), one batched
/// `update` of them all, then each rollout's storage back to its member (`recycle`); nothing before.
fn update_rollouts<A>(
    kind: &str,
    mut members: Vec<&mut A>,
    finish: impl Fn(&mut A) -> Result<Option<Rollout>>,
    recycle: impl Fn(&mut A, Rollout),
    update: impl FnOnce(&mut [&mut A], &[&Rollout], f64) -> Result<Vec<Metrics>>,
    progress: &Progress,
) -> Result<Vec<Option<Metrics>>> {
    let mut rollouts = Vec::with_capacity(members.len());
    for m in members.iter_mut() {
        rollouts.push(finish(m)?);
    }
    if rollouts.iter().all(Option::is_none) {
        return Ok(vec![None; members.len()]);
    }
    let Some(rollouts) = rollouts.into_iter().collect::<Option<Vec<_>>>() else {
        return Err(Error::Unsupported(format!(
            "a population's {kind} members completed their rollouts at different steps"
        )));
    };
    let metrics = update(&mut members, &rollouts.iter().collect::<Vec<_>>(), progress.remaining())?;
    for (m, r) in members.iter_mut().zip(rollouts) {
        recycle(m, r);
    }
    Ok(metrics.into_iter().map(Some).collect())
}

#[cfg(test)]
mod tests {
    use flotilla_core::{Chunk, EpisodeStats, ObsBuf, ObsRef};

    use super::*;
    use crate::policy::{ActMode, ActOutput};

    fn flat(agent: &dyn Algorithm) -> Vec<f32> {
        Vec::<f32>::try_from(agent.policy_params().flat().detach().view([-1])).unwrap()
    }

    fn observations(rows: usize, dim: usize) -> Vec<f32> {
        (0..rows * dim).map(|i| (i as f32 * 0.37).sin() * 0.5).collect()
    }

    /// Every kind: the acting policy an actor builds, given the learner's broadcast, picks the learner's greedy
    /// / mean actions — and it was built without an optimiser, a replay buffer or a rollout to fill.
    #[test]
    fn acting_policies_act_as_their_learner_after_a_broadcast() {
        let cartpole = (Space::box1d(vec![-4.8, -9.0, -0.42, -9.0], vec![4.8, 9.0, 0.42, 9.0]), Space::discrete(2));
        let pendulum = (Space::box1d(vec![-1.0, -1.0, -8.0], vec![1.0, 1.0, 8.0]), Space::box1d(vec![-2.0], vec![2.0]));
        let configs = [
            (AlgorithmConfig::Ppo(PpoConfig { hidden_sizes: vec![16], ..Default::default() }), &cartpole),
            (AlgorithmConfig::Ppo(PpoConfig::default()), &pendulum),
            (AlgorithmConfig::A2c(A2cConfig::default()), &cartpole),
            (AlgorithmConfig::Dqn(DqnConfig { dueling: true, ..Default::default() }), &cartpole),
            (AlgorithmConfig::Ddpg(DdpgConfig { hidden_sizes: vec![32, 32], ..Default::default() }), &pendulum),
            (AlgorithmConfig::Td3(Td3Config { hidden_sizes: vec![32, 32], ..Default::default() }), &pendulum),
        ];
        for (config, (obs_space, act_space)) in configs {
            let name = config.name();
            // Different seeds: the actor's own initial weights differ until the broadcast arrives.
            let mut learner = config.build_learner(obs_space, act_space, 8, Device::Cpu, 1).unwrap();
            let setup = ActingSetup {
                observation_space: obs_space,
                action_space: act_space,
                n_envs: 8,
                seed: 2,
                epsilon_floor: 0.0,
                frozen: &[],
            };
            let Acting::Chunks(mut policy) = config.build_acting(&setup).unwrap() else {
                panic!("{name}: an acting policy, not a gradient worker")
            };
            let params = flat(learner.as_ref());
            assert_eq!(policy.n_params(), params.len(), "{name}");
            let obs = observations(8, policy.obs_dim());
            let (mut want, mut got) = (ActOutput::default(), ActOutput::default());
            learner.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut want).unwrap();
            policy.load_params(&params).unwrap();
            policy.act(ObsRef::F32(&obs), ActMode::Deterministic, &mut got).unwrap();
            assert_eq!(got.actions, want.actions, "{name}");
            // Values (actor-critics) and Q-values (DQN) too: real numbers, not just argmaxes that might agree.
            assert_eq!((&got.values, &got.q_values), (&want.values, &want.q_values), "{name}");
            assert!(
                !(got.values.is_empty() && got.q_values.is_empty() && got.actions.iter().all(|a| a.fract() == 0.0))
            );
            assert!(policy.load_params(&params[1..]).is_err(), "{name}: a short broadcast is refused");
        }
    }

    /// A3C: the worker's gradient on a chunk is the learner's A2C gradient on the same data and parameters.
    #[test]
    fn the_a3c_worker_computes_the_a2c_gradient_of_its_chunk() {
        // Also with the first layer frozen: the gradient then holds the other layers only.
        for frozen in [vec![], vec!["pi_vf.0".to_string()]] {
            a3c_worker_gradient(&frozen);
        }
    }

    fn a3c_worker_gradient(frozen: &[String]) {
        let (obs_space, act_space) = (Space::box1d(vec![-1.0; 4], vec![1.0; 4]), Space::discrete(2));
        let config = AlgorithmConfig::A3c(A2cConfig::default());
        let AlgorithmConfig::A3c(a2c_config) = &config else { unreachable!() };
        let (e, t) = (2, a2c_config.n_steps);
        let mut learner = config.build_learner(&obs_space, &act_space, e, Device::Cpu, 1).unwrap();
        let n_frozen = learner.transfer("test", &[], &[], frozen).unwrap().1 as usize;
        let setup = ActingSetup {
            observation_space: &obs_space,
            action_space: &act_space,
            n_envs: e,
            seed: 2,
            epsilon_floor: 0.0,
            frozen,
        };
        let Acting::Gradients(mut worker) = config.build_acting(&setup).unwrap() else { panic!("a gradient worker") };
        worker.policy().load_params(&flat(learner.as_ref())).unwrap();
        // A chunk the worker collected: env 1 is truncated at step 1 (its final observation kept).
        let obs = observations(t * e, 4);
        let mut out = ActOutput::default();
        worker.policy().act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
        let mut truncated = vec![false; t * e];
        truncated[e + 1] = true;
        let chunk = Chunk {
            actor_id: 1,
            policy_version: 0,
            n_steps: t,
            n_envs: e,
            obs: ObsBuf::F32(obs),
            bootstrap_obs: ObsBuf::F32(observations(e, 4)),
            actions: out.actions.clone(),
            rewards: (0..t * e).map(|i| (i % 3) as f32).collect(),
            terminated: vec![false; t * e],
            truncated,
            log_probs: out.log_probs.clone(),
            values: out.values.clone(),
            final_index: vec![(e + 1) as u32],
            final_obs: ObsBuf::F32(vec![0.1, -0.2, 0.3, -0.4]),
            episodes: vec![EpisodeStats { episode_return: 2.0, length: 2, env_index: 1, truncated: true, task: None }],
        };
        let (grad, _) = worker.gradient(&chunk).unwrap();
        assert_eq!(grad.len() + n_frozen, learner.policy_params().numel() as usize, "trainable values only");
        // The learner's side: the same chunk through its own rollout, then its gradient.
        let params_before = flat(learner.as_ref());
        let m = learner
            .parameter_server()
            .expect("A3C's learner is a parameter server")
            .apply_gradient(&grad, &crate::progress::Progress { env_steps: 1, total_env_steps: 2 });
        assert!(m.is_ok(), "the parameter server takes the worker's gradient");
        assert_ne!(flat(learner.as_ref()), params_before, "and steps with it");
        assert_eq!(flat(learner.as_ref())[..n_frozen], params_before[..n_frozen], "frozen layers stay");
        assert!(
            learner
                .parameter_server()
                .unwrap()
                .apply_gradient(&grad[1..], &crate::progress::Progress { env_steps: 1, total_env_steps: 2 })
                .is_err(),
            "short"
        );
        let mut a2c = crate::a2c::A2c::new(&obs_space, &act_space, e, a2c_config.clone(), Device::Cpu, 1).unwrap();
        a2c.transfer("test", &[], &[], frozen).unwrap();
        let mut collector = crate::data::rollout::RolloutCollector::new(e, t, 4, 1);
        collector.push_chunks(std::slice::from_ref(&chunk), |o| a2c.values(o)).unwrap();
        let (gamma, lambda) = (a2c_config.gamma as f32, a2c_config.gae_lambda as f32);
        let rollout = collector.finish(|o| a2c.values(o), gamma, lambda).unwrap().unwrap();
        let (want, _) = a2c.compute_gradients(&rollout).unwrap();
        let want = Vec::<f32>::try_from(want.view([-1])).unwrap();
        assert_eq!(grad.len(), want.len());
        for (i, (g, w)) in grad.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "gradient[{i}]: {g} vs {w}");
        }
    }
}
