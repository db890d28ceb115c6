//! Deterministic evaluation: run the greedy policy for whole episodes and report the returns.
use flotilla_algorithms::nn::MemberStack;
use flotilla_algorithms::{ActMode, ActOutput, Algorithm, AlgorithmConfig, Memory, Policy};
use flotilla_core::ObsRef;
use flotilla_envs::env_actions::EnvActions;
use flotilla_envs::{EnvRole, VectorEnv};
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::config::EnvConfig;

/// Returns and lengths of evaluation episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Undiscounted return of each episode.
    pub returns: Vec<f64>,
    /// Length of each episode.
    pub lengths: Vec<usize>,
    /// A multi-task run's tasks: each one's name and how many of the episodes (in order) were its.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<(String, usize)>,
}

impl EvalResult {
    /// Each task's name and mean return (empty for a single-task run).
    pub fn task_means(&self) -> Vec<(String, f64)> {
        let mut at = 0;
        self.tasks
            .iter()
            .map(|(name, n)| {
                let mean = self.returns[at..at + n].iter().sum::<f64>() / (*n).max(1) as f64;
                at += n;
                (name.clone(), mean)
            })
            .collect()
    }

    /// Mean return.
    pub fn mean(&self) -> f64 {
        self.returns.iter().sum::<f64>() / self.returns.len() as f64
    }

    /// Population standard deviation of the returns.
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.returns.iter().map(|r| (r - m).powi(2)).sum::<f64>() / self.returns.len() as f64).sqrt()
    }
}

/// Run `episodes` episodes, one per env of a batch built for evaluation (env `i` reset with `seed + i`; for
/// Atari that means whole games, unclipped scores), acting deterministically in one batch per step, and return
/// each env's first episode. Episodes end on termination or the env's time limit; an env that has finished
/// keeps stepping with the batch, but its later episodes are not counted.
/// A multi-task run evaluates every task this way in turn, `episodes` each (same seeds), and reports all of
/// them, with each task's share in [`EvalResult::tasks`].
pub fn evaluate(agent: &mut dyn Policy, env: &EnvConfig, episodes: usize, seed: u64) -> Result<EvalResult> {
    if env.tasks.is_empty() {
        return evaluate_on(agent, env.make_vector(episodes, EnvRole::Evaluation)?, episodes, seed);
    }
    let mut all = EvalResult { returns: Vec::new(), lengths: Vec::new(), tasks: Vec::new() };
    for (k, task) in env.tasks.iter().enumerate() {
        let envs = env.make_task_vector(k, episodes, EnvRole::Evaluation)?;
        let one = evaluate_on(agent, envs, episodes, seed)?;
        all.returns.extend(one.returns);
        all.lengths.extend(one.lengths);
        all.tasks.push((task.name.clone(), episodes));
    }
    Ok(all)
}

/// [`evaluate`] on a built batch of `episodes` envs.
fn evaluate_on(agent: &mut dyn Policy, envs: Box<dyn VectorEnv>, episodes: usize, seed: u64) -> Result<EvalResult> {
    let mut memory = Memory::new(agent, episodes);
    let results = run_lanes(vec![envs], episodes, &[seed], |obs, ends, outs| {
        memory.end_episodes(&ends[0].0, &ends[0].1);
        memory.act(agent, obs[0], ActMode::Deterministic, &mut outs[0])?;
        Ok(true)
    })?;
    Ok(results.and_then(|mut r| r.pop()).expect("one lane, which always acts"))
}

/// [`evaluate`] for a population's members at once: member `k` on its own `episodes` envs reset from `seeds[k]`,
/// every step's actions from one batched pass of their kind (`AlgorithmKind::act_members`), so each member's
/// result is its evaluation alone's (deterministic actions take no random draw; the batched forward may round
/// differently, which changes an action only at an exact tie). `None` where the kind cannot act them as one, or
/// for multi-task runs and recurrent policies: then each evaluates alone.
pub(crate) fn evaluate_members(
    kind: &AlgorithmConfig,
    agents: &mut [&mut dyn Algorithm],
    env: &EnvConfig,
    episodes: usize,
    seeds: &[u64],
) -> Result<Option<Vec<EvalResult>>> {
    if !env.tasks.is_empty() || agents.iter().any(|a| a.state_dim() > 0) {
        return Ok(None);
    }
    let envs = seeds.iter().map(|_| env.make_vector(episodes, EnvRole::Evaluation)).collect::<Result<_>>()?;
    // Stacked once: nothing changes the parameters while they are evaluated.
    let mut stack = MemberStack::default();
    run_lanes(envs, episodes, seeds, |obs, _, outs| {
        let mut outs: Vec<&mut ActOutput> = outs.iter_mut().collect();
        Ok(kind.act_members(agents, obs, ActMode::Deterministic, &mut outs, &mut stack)?)
    })
}

/// The evaluation loop over lanes: lane `k` steps `envs[k]` (`episodes` envs, reset from `seeds[k]`) until each
/// of its envs has ended one episode, which is what counts; a lane whose episodes have all ended stops stepping.
/// Each step `act` fills every lane's actions from its observations, given each lane's (terminated, truncated)
/// flags of its last step; it returns false where it cannot act, and then so does this (`None`).
fn run_lanes(
    mut envs: Vec<Box<dyn VectorEnv>>,
    episodes: usize,
    seeds: &[u64],
    mut act: impl FnMut(&[ObsRef<'_>], &[(Vec<bool>, Vec<bool>)], &mut [ActOutput]) -> Result<bool>,
) -> Result<Option<Vec<EvalResult>>> {
    let lanes = envs.len();
    let mut obs = Vec::with_capacity(lanes);
    for (e, &seed) in envs.iter_mut().zip(seeds) {
        obs.push(e.reset(Some(seed))?.to_buf());
    }
    let Some(first) = envs.first() else { return Ok(Some(Vec::new())) };
    let action_space = first.action_space().clone();
    let mut outs = vec![ActOutput::default(); lanes];
    let mut ends = vec![(vec![false; episodes], vec![false; episodes]); lanes];
    let mut env_actions = EnvActions::default();
    let fresh = EvalResult { returns: vec![0.0; episodes], lengths: vec![0; episodes], tasks: Vec::new() };
    let mut results = vec![fresh; lanes];
    let (mut done, mut left) = (vec![vec![false; episodes]; lanes], vec![episodes; lanes]);
    while left.iter().any(|&l| l > 0) {
        let refs: Vec<ObsRef<'_>> = obs.iter().map(|o| o.as_ref()).collect();
        if !act(&refs, &ends, &mut outs)? {
            return Ok(None);
        }
        for k in 0..lanes {
            if left[k] == 0 {
                continue;
            }
            let step = envs[k].step(&env_actions.convert(&action_space, &outs[k].actions))?;
            ends[k].0.copy_from_slice(step.terminated);
            ends[k].1.copy_from_slice(step.truncated);
            for ep in step.episodes {
                if !std::mem::replace(&mut done[k][ep.env_index], true) {
                    results[k].returns[ep.env_index] = ep.episode_return;
                    results[k].lengths[ep.env_index] = ep.length as usize;
                    left[k] -= 1;
                }
            }
            obs[k].clear();
            let same = obs[k].extend(step.obs);
            debug_assert!(same, "one dtype per batch");
        }
    }
    Ok(Some(results))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ExperimentConfig;

    /// Members evaluated as one (one batched acting pass per step over their own eval envs) score what each
    /// scores evaluated alone, episode by episode: PPO CartPole members of three seeds, untrained (short, varied
    /// episodes) — and after `act_members` refuses (members of different layouts), `None`.
    #[test]
    fn members_evaluated_as_one_score_as_each_alone() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/cartpole_ppo.toml"))
                .unwrap();
        let config = ExperimentConfig::parse(&text, &["run.device=cpu".into()]).unwrap();
        let envs = config.env.make_vector(1, EnvRole::Evaluation).unwrap();
        let (o, a) = (envs.observation_space().clone(), envs.action_space().clone());
        let build = |seed: u64| {
            let mut c = config.clone();
            c.run.seed = seed;
            c.build_agent(&o, &a, tch::Device::Cpu).unwrap()
        };
        let mut members: Vec<Box<dyn Algorithm>> = (1..=3).map(build).collect();
        let seeds = [7u64, 70, 700];
        let mut refs: Vec<&mut dyn Algorithm> = members.iter_mut().map(|m| m.as_mut()).collect();
        let together = evaluate_members(&config.algorithm, &mut refs, &config.env, 4, &seeds).unwrap().unwrap();
        let mut lengths = Vec::new();
        for (k, member) in members.iter_mut().enumerate() {
            let alone = evaluate(member.as_mut(), &config.env, 4, seeds[k]).unwrap();
            assert_eq!(together[k], alone, "member {k}");
            lengths.extend(alone.lengths);
        }
        assert!(lengths.iter().any(|&l| l != lengths[0]), "episodes of different lengths: {lengths:?}");
        let narrow = ExperimentConfig::parse(&text, &["run.device=cpu".into(), "algorithm.hidden_sizes=[8]".into()]);
        let mut other = narrow.unwrap().build_agent(&o, &a, tch::Device::Cpu).unwrap();
        let mut refs: Vec<&mut dyn Algorithm> = vec![members[0].as_mut(), other.as_mut()];
        assert!(evaluate_members(&config.algorithm, &mut refs, &config.env, 4, &seeds[..2]).unwrap().is_none());
    }
}
