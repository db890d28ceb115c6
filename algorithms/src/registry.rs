//! The one place that lists every algorithm kind: one line each in `kinds!` below. Each kind's config type
//! answers every per-kind question through [`AlgorithmKind`], in the kind's own folder; nothing else in the workspace
//! matches on the kind.
//!
//! Adding an algorithm: its folder (config with `impl AlgorithmKind`, network, loss, `impl Algorithm`, an acting policy),
//! `pub mod` in `lib.rs`, and its line here.
//!
//! ```text
//! [algorithm] kind = "ppo" ─► AlgorithmConfig::Ppo(PpoConfig)       (serde, from the experiment TOML)
//!   config.algorithm: .validate(num_envs) · .name() · .family() · .rollout_steps() · …   (dyn AlgorithmKind)
//!   .build_learner(spaces, n_envs, device, seed)  ─► Box<dyn Algorithm>    (trainer, learner, eval)
//!   .build_acting(&ActingSetup)                   ─► Acting                 (actor processes)
//!   .update_members(&mut [&mut dyn Algorithm], progress)  a population's batched update, where its kind has one
//! ```
use flotilla_core::Space;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::Result;
use crate::a2c::{A2cConfig, A3cConfig};
use crate::algorithm::Algorithm;
use crate::distill::DistillConfig;
use crate::dqn::DqnConfig;
pub use crate::kind::{AlgorithmKind, Family, KindName};
use crate::ppo::PpoConfig;
use crate::sac::SacConfig;
use crate::td3::{DdpgConfig, Td3Config};

/// The kinds: `Variant(ConfigType) = "name", Family`, its TOML `kind` the name (the variant's in lower case).
macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident($config:ty) = $name:literal, $family:ident;)*) => {
        /// `[algorithm]`: `kind` picks the algorithm; the other keys are its config struct's fields.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        pub enum AlgorithmConfig {
            $($(#[$doc])* $variant($config),)*
        }

        $(impl KindName for $config {
            fn name(&self) -> &'static str {
                $name
            }

            fn family(&self) -> Family {
                Family::$family
            }
        })*

        /// `config.family()`, `config.validate(n)`, … : every [`AlgorithmKind`] question asked of the config itself.
        impl std::ops::Deref for AlgorithmConfig {
            type Target = dyn AlgorithmKind;

            fn deref(&self) -> &(dyn AlgorithmKind + 'static) {
                match self {
                    $(AlgorithmConfig::$variant(c) => c,)*
                }
            }
        }

        /// The same, to change (`set_tasks`).
        impl std::ops::DerefMut for AlgorithmConfig {
            fn deref_mut(&mut self) -> &mut (dyn AlgorithmKind + 'static) {
                match self {
                    $(AlgorithmConfig::$variant(c) => c,)*
                }
            }
        }
    };
}

kinds! {
    /// Proximal Policy Optimization.
    Ppo(PpoConfig) = "ppo", OnPolicy;
    /// Deep Q-Networks (double-Q, dueling, prioritized replay, n-step as options).
    Dqn(DqnConfig) = "dqn", OffPolicy;
    /// Advantage Actor-Critic (synchronous A3C).
    A2c(A2cConfig) = "a2c", OnPolicy;
    /// Asynchronous Advantage Actor-Critic: actors compute A2C gradients on their own chunks and the learner
    /// applies them as a parameter server (needs actors: `--actors N`). Same fields as `a2c`.
    A3c(A3cConfig) = "a3c", Gradients;
    /// Deep Deterministic Policy Gradient.
    Ddpg(DdpgConfig) = "ddpg", OffPolicy;
    /// Twin Delayed DDPG.
    Td3(Td3Config) = "td3", OffPolicy;
    /// Soft Actor-Critic (twin critics, learnt entropy coefficient).
    Sac(SacConfig) = "sac", OffPolicy;
    /// Policy distillation: a student learns a trained teacher's outputs on the states it visits.
    Distill(DistillConfig) = "distill", OffPolicy;
}

impl AlgorithmConfig {
    /// A fresh learning agent ([`AlgorithmKind::learner`]) whose every save of the policy weights says how to read them
    /// ([`AlgorithmKind::architecture`] in their metadata).
    pub fn build_learner(
        &self,
        observation_space: &Space,
        action_space: &Space,
        n_envs: usize,
        device: Device,
        seed: u64,
    ) -> Result<Box<dyn Algorithm>> {
        let mut agent = self.learner(observation_space, action_space, n_envs, device, seed)?;
        agent.policy_params_mut().set_metadata(self.architecture(observation_space, action_space)?.to_metadata());
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use flotilla_core::{Chunk, EpisodeStats, ObsBuf, ObsRef};

    use super::*;
    use crate::acting::{Acting, ActingSetup};
    use crate::policy::{ActMode, ActOutput};

    fn flat(agent: &dyn Algorithm) -> Vec<f32> {
        Vec::<f32>::try_from(agent.policy_params().flat().detach().view([-1])).unwrap()
    }

    fn observations(rows: usize, dim: usize) -> Vec<f32> {
        (0..rows * dim).map(|i| (i as f32 * 0.37).sin() * 0.5).collect()
    }

    /// Small configs of every kind that learns from chunks, each with the spaces it runs on (CartPole's or
    /// Pendulum's).
    fn chunk_learners() -> Vec<(AlgorithmConfig, (Space, Space))> {
        let cartpole = (Space::box1d(vec![-4.8, -9.0, -0.42, -9.0], vec![4.8, 9.0, 0.42, 9.0]), Space::discrete(2));
        let pendulum = (Space::box1d(vec![-1.0, -1.0, -8.0], vec![1.0, 1.0, 8.0]), Space::box1d(vec![-2.0], vec![2.0]));
        vec![
            (AlgorithmConfig::Ppo(PpoConfig { hidden_sizes: vec![16], ..Default::default() }), cartpole.clone()),
            (AlgorithmConfig::Ppo(PpoConfig::default()), pendulum.clone()),
            (AlgorithmConfig::A2c(A2cConfig::default()), cartpole.clone()),
            (AlgorithmConfig::Dqn(DqnConfig { dueling: true, ..Default::default() }), cartpole),
            (AlgorithmConfig::Ddpg(DdpgConfig { hidden_sizes: vec![32, 32], ..Default::default() }), pendulum.clone()),
            (AlgorithmConfig::Td3(Td3Config { hidden_sizes: vec![32, 32], ..Default::default() }), pendulum.clone()),
            (AlgorithmConfig::Sac(SacConfig { hidden_sizes: vec![32, 32], ..Default::default() }), pendulum),
        ]
    }

    /// Every kind: a chunk whose fields are shorter than its shape says is refused with the field's name, and
    /// the agent takes a good chunk after it.
    #[test]
    fn short_chunk_fields_are_refused_by_name() {
        for (config, (obs_space, act_space)) in chunk_learners() {
            let name = config.name();
            let mut learner = config.build_learner(&obs_space, &act_space, 8, Device::Cpu, 1).unwrap();
            let obs = observations(8, learner.obs_dim());
            let mut out = ActOutput::default();
            learner.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let (lp, v, ended) = (out.log_probs.clone(), out.values.clone(), [1, 0, 0, 1, 0, 0, 0, 0].map(|x| x == 1));
            let (rewards, next) = ([0.5; 8], ObsRef::F32(&obs[..]));
            let good = Chunk::from_step(ObsRef::F32(&obs), &out.actions, &lp, &v, &rewards, &ended, &[false; 8], next);
            let short_final = Chunk { final_obs: ObsBuf::F32(vec![0.0]), ..good.clone() };
            let short_actions = Chunk { actions: good.actions[1..].to_vec(), ..good.clone() };
            for (bad, field) in [(short_final, "chunk final observations"), (short_actions, "chunk actions")] {
                let err = learner.observe(std::slice::from_ref(&bad)).unwrap_err().to_string();
                assert!(err.contains(field), "{name}: {err}");
            }
            learner.observe(std::slice::from_ref(&good)).unwrap();
        }
    }

    /// Every kind: the acting policy an actor builds, given the learner's broadcast, picks the learner's greedy
    /// / mean actions — and it was built without an optimiser, a replay buffer or a rollout to fill.
    #[test]
    fn acting_policies_act_as_their_learner_after_a_broadcast() {
        for (config, (obs_space, act_space)) in chunk_learners() {
            let (obs_space, act_space) = (&obs_space, &act_space);
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
        let config = AlgorithmConfig::A3c(A3cConfig(A2cConfig::default()));
        let AlgorithmConfig::A3c(A3cConfig(a2c_config)) = &config else { unreachable!() };
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
            initial_state: Vec::new(),
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
        collector.push_chunks(std::slice::from_ref(&chunk), |o: ObsRef<'_>| a2c.values(o)).unwrap();
        let (gamma, lambda) = (a2c_config.gamma as f32, a2c_config.gae_lambda as f32);
        let rollout = collector.finish(|o: ObsRef<'_>| a2c.values(o), gamma, lambda).unwrap().unwrap();
        let (want, _) = a2c.compute_gradients(&rollout).unwrap();
        let want = Vec::<f32>::try_from(want.view([-1])).unwrap();
        assert_eq!(grad.len(), want.len());
        for (i, (g, w)) in grad.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "gradient[{i}]: {g} vs {w}");
        }
    }

    /// Every kind's default config with its optional numbers set, so that their checks run too.
    fn every_kind() -> Vec<AlgorithmConfig> {
        use crate::data::vtrace::VtraceConfig;
        let vtrace = Some(VtraceConfig::default());
        vec![
            AlgorithmConfig::Ppo(PpoConfig {
                clip_range_vf: Some(0.2),
                target_kl: Some(0.02),
                vtrace: vtrace.clone(),
                ..Default::default()
            }),
            AlgorithmConfig::A2c(A2cConfig { vtrace, ..Default::default() }),
            AlgorithmConfig::A3c(A3cConfig::default()),
            AlgorithmConfig::Dqn(DqnConfig::default()),
            AlgorithmConfig::Ddpg(DdpgConfig::default()),
            AlgorithmConfig::Td3(Td3Config::default()),
            AlgorithmConfig::Sac(SacConfig { target_entropy: Some(-1.0), ..Default::default() }),
            AlgorithmConfig::Distill(DistillConfig {
                teachers: vec!["teacher".into()],
                temperature: Some(2.0),
                ..Default::default()
            }),
        ]
    }

    /// `(path, value)` of every number in a TOML table, nested tables' as `outer.inner`.
    fn numbers(table: &toml::Table, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
        for (key, value) in table {
            match value {
                toml::Value::Table(t) => numbers(t, &format!("{prefix}{key}."), out),
                toml::Value::Integer(_) | toml::Value::Float(_) => out.push((format!("{prefix}{key}"), value.clone())),
                _ => {}
            }
        }
    }

    /// `config` with the number at `path` replaced by `value`, checked as a run checks it (8 envs): the error's
    /// text, or `None` where it is accepted.
    fn checked_with(config: &AlgorithmConfig, path: &str, value: toml::Value) -> Option<String> {
        let mut table = toml::Table::try_from(config).unwrap();
        let mut t = &mut table;
        let mut keys: Vec<&str> = path.split('.').collect();
        let last = keys.pop().unwrap();
        for k in keys {
            t = t.get_mut(k).and_then(toml::Value::as_table_mut).unwrap();
        }
        t.insert(last.into(), value);
        let edited: AlgorithmConfig = toml::Value::Table(table).try_into().unwrap();
        edited.validate(8).err().map(|e| e.to_string())
    }

    /// Every number of every kind's config is range-checked when the config is read, by name, before anything
    /// runs: NaN and ±inf in every float (inf where it means "no limit": V-trace's thresholds, a gradient-norm
    /// limit), zero in every count but those where zero means something (no warm-up, a target update every
    /// step, DQN's expected values, an LSTM width without an LSTM), and a negative value in every float but
    /// those that may be negative (an entropy bonus, a log-std, SAC's target entropy).
    #[test]
    fn every_number_of_every_kind_is_checked_by_name() {
        let infinite_ok = ["clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold", "max_grad_norm"];
        let zero_ok = ["learning_starts", "target_update_interval", "n_quantiles", "recurrent_hidden"];
        let negative_ok = ["ent_coef", "log_std_init", "target_entropy"];
        let mut checked = 0;
        for config in every_kind() {
            assert_eq!(config.validate(8).map_err(|e| e.to_string()), Ok(()), "{}'s defaults", config.name());
            let mut fields = Vec::new();
            numbers(&toml::Table::try_from(&config).unwrap(), "", &mut fields);
            for (path, value) in fields {
                let field = path.rsplit('.').next().unwrap();
                // SAC's α and its target interval are the exceptions to the exceptions: α > 0, interval ≥ 1.
                let sac_alpha = config.name() == "sac" && field == "ent_coef";
                let target_interval = config.name() == "sac" && field == "target_update_interval";
                let mut bad = Vec::new();
                match value {
                    toml::Value::Float(_) => {
                        bad.push(toml::Value::Float(f64::NAN));
                        if !infinite_ok.contains(&field) {
                            bad.extend([f64::INFINITY, f64::NEG_INFINITY].map(toml::Value::Float));
                        }
                        if !negative_ok.contains(&field) || sac_alpha {
                            bad.push(toml::Value::Float(-1.0));
                        }
                    }
                    _ if !zero_ok.contains(&field) || target_interval => bad.push(toml::Value::Integer(0)),
                    _ => {}
                }
                for b in bad {
                    let error = checked_with(&config, &path, b.clone());
                    let error = error.unwrap_or_else(|| panic!("{} {path} = {b} was accepted", config.name()));
                    assert!(
                        error.contains(field),
                        "{} {path} = {b}: the error does not name it: {error}",
                        config.name()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 150, "only {checked} bad values tried");
    }

    /// Values at the edges that are valid stay accepted: no clipping of gradients, V-trace without clipping, a
    /// discount of 0 or 1, no entropy bonus, a DQN without warm-up.
    #[test]
    fn valid_edge_values_are_accepted() {
        let accepted = |config: &AlgorithmConfig, path: &str, v: toml::Value| {
            assert_eq!(checked_with(config, path, v.clone()), None, "{} {path} = {v}", config.name());
        };
        let kinds = every_kind();
        let (ppo, dqn) = (&kinds[0], &kinds[3]);
        accepted(ppo, "max_grad_norm", toml::Value::Float(f64::INFINITY));
        accepted(ppo, "vtrace.clip_rho_threshold", toml::Value::Float(f64::INFINITY));
        accepted(ppo, "gamma", toml::Value::Float(1.0));
        accepted(ppo, "gae_lambda", toml::Value::Float(0.0));
        accepted(ppo, "ent_coef", toml::Value::Float(0.0));
        accepted(dqn, "max_grad_norm", toml::Value::Float(f64::INFINITY));
        accepted(dqn, "learning_starts", toml::Value::Integer(0));
        accepted(dqn, "exploration_final_eps", toml::Value::Float(0.0));
    }
}
