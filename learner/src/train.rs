//! Single-process training: step a `VecEnv` in this thread, let the algorithm observe and update, evaluate,
//! log, checkpoint.
//!
//! ```text
//! reset envs (seed) ─► loop until total_env_steps:
//!     act (batched, exploring) ─► step envs (same-step auto-reset) ─► observe the step as a one-step chunk
//!     (the form actors send) ─► update if the algorithm is ready (PPO: full rollout; DQN: every train_freq steps)
//!     every log interval: metrics row + progress line; every eval interval: deterministic evaluation;
//!     every checkpoint interval: the whole state (agent, envs, counters) to RUN_DIR/checkpoint.safetensors
//! ```
//! Wall-clock is split: `train_secs` counts collection and updates only, not evaluation, so speed numbers
//! compare with other libraries' training time. A run resumed from a checkpoint continues bit for bit as if
//! it had never stopped (CPU, one torch thread).
use std::path::Path;
use std::time::Instant;

use crate::actions::EnvActions;
use crate::config::ExperimentConfig;
use crate::env_replay::EnvReplay;
use crate::eval::{EvalResult, evaluate, evaluate_members};
pub use crate::progress::{EvalPoint, LogRow, TrainReport};
use crate::progress::{RunCounters, log_progress};
use crate::{Error, Result};
use flotilla_algorithms::nn::MemberStack;
use flotilla_algorithms::{ActMode, ActOutput, Algorithm, AlgorithmConfig, Checkpoint, Memory, Metrics, Progress};
use flotilla_core::{ObsBuf, ObsRef};
use flotilla_envs::{ChunkRecorder, EnvRole, VecActions, VecEnv, VecEnvSnapshot, VecStep, VectorEnv};
use tracing::{info, warn};

/// A training run in progress: config, envs, agent, counters. [`Trainer::run`] advances it; a checkpoint
/// holds all of it.
pub struct Trainer {
    config: ExperimentConfig,
    envs: Box<dyn VectorEnv>,
    agent: Box<dyn Algorithm>,
    obs: ObsBuf,
    /// Each env's recurrent state (empty for feed-forward policies).
    memory: Memory,
    counters: RunCounters,
    last_metrics: Metrics,
    /// The actions the envs were stepped with, where they cannot save their state (exact resume by replay).
    replay: Option<EnvReplay>,
    /// Leave metrics rows out of the log (a population's members: the population logs for them).
    quiet: bool,
}

impl Trainer {
    /// Build envs and agent from `config` (starting from `[init] from`'s weights, if set) and reset the envs
    /// with the run's seed.
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        Self::build(config, true)
    }

    /// [`Trainer::new`]; `fresh`: a new run (a resumed one takes its weights from its checkpoint instead of
    /// `[init] from`).
    fn build(config: &ExperimentConfig, fresh: bool) -> Result<Self> {
        if config.learner.learners > 1 {
            return Err(Error::Config(format!(
                "[learner] learners = {}: data-parallel learners each serve actor processes; train with \
                 `--learners {} --actors N` (or launch `flotilla learner` ranks with torchrun)",
                config.learner.learners, config.learner.learners
            )));
        }
        crate::tune_allocator();
        tch::set_num_threads(config.run.torch_threads.max(1) as i32);
        let device = config.run.device.resolve()?;
        crate::config::warn_about_the_machine(config, device);
        let mut envs = config.env.make_vector(config.env.num_envs, EnvRole::Training)?;
        let mut agent = config.build_agent(envs.observation_space(), envs.action_space(), device)?;
        crate::data_parallel::accumulate_alone(config, agent.as_mut())?;
        crate::init::init_agent(config, agent.as_mut(), fresh)?;
        let obs = envs.reset(Some(config.run.seed))?.to_buf();
        let memory = Memory::new(agent.as_ref(), envs.num_envs());
        let counters = RunCounters::new(config);
        let replay = match envs.snapshot() {
            Err(flotilla_core::Error::Unsupported { .. }) if config.checkpoint.replay_envs => {
                Some(EnvReplay::new(config.run.seed, envs.as_ref()))
            }
            _ => None,
        };
        Ok(Trainer {
            config: config.clone(),
            envs,
            agent,
            obs,
            memory,
            counters,
            last_metrics: Metrics::default(),
            replay,
            quiet: false,
        })
    }

    /// Rebuild a trainer from `config` and a checkpoint written by [`Trainer::save_checkpoint`]. Bit-identical
    /// to a run that never stopped: native envs are restored from their snapshots, envs that cannot save
    /// their state (Atari, Python envs) are replayed through the run's recorded actions from its seed (see
    /// `[checkpoint] replay_envs`; without a recording the agent continues exactly and the envs start new
    /// episodes).
    pub fn resume(config: &ExperimentConfig, path: &Path) -> Result<Self> {
        let mut t = Self::build(config, false)?;
        let mut c = Checkpoint::load(path)?;
        t.agent.restore(&mut c)?;
        t.counters = c.meta("trainer.counters")?;
        if t.memory.dim() > 0 {
            t.memory.set_state(c.take_f32("trainer.memory")?)?;
        }
        let replay = EnvReplay::read_from(&mut c)?;
        match (c.meta::<Option<VecEnvSnapshot>>("trainer.envs")?, replay) {
            (Some(envs), _) => {
                t.envs.restore(&envs)?;
                t.obs = c.take_obs("trainer.obs")?;
            }
            (None, Some(replay)) if config.checkpoint.replay_envs => {
                let saved = c.take_obs("trainer.obs")?;
                let started = Instant::now();
                replay.replay(t.envs.as_mut(), &saved)?;
                info!(
                    "{}: replayed {} env steps to restore the envs exactly ({:.1} s)",
                    config.env.id,
                    t.counters.env_steps,
                    started.elapsed().as_secs_f64()
                );
                t.obs = saved;
                t.replay = Some(replay);
            }
            (None, _) => {
                // Envs that cannot be snapshotted (Python ones) start new episodes, from a seed of their own:
                // the agent continues exactly, the envs do not.
                let seed = config.run.seed.wrapping_add(t.counters.env_steps);
                warn!("{}: the envs had no saved state; resuming with new episodes (seed {seed})", config.env.id);
                t.obs = t.envs.reset(Some(seed))?.to_buf();
                t.memory = Memory::new(t.agent.as_ref(), t.envs.num_envs());
                // A recording from here on would not start at the run's seed: there is nothing to replay.
                t.replay = None;
            }
        }
        Ok(t)
    }

    /// Write the whole state to `path`, atomically.
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        let mut c = self.agent.checkpoint()?;
        c.put_meta("trainer.counters", &self.counters)?;
        // Envs that cannot be snapshotted (a Python env) are saved as absent: a resume starts new episodes.
        let envs = match self.envs.snapshot() {
            Ok(envs) => Some(envs),
            Err(flotilla_core::Error::Unsupported { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        c.put_meta("trainer.envs", &envs)?;
        if let Some(replay) = &self.replay {
            replay.write_to(&mut c)?;
        }
        c.put_obs("trainer.obs", self.obs.as_ref());
        if self.memory.dim() > 0 {
            c.put_f32("trainer.memory", self.memory.state());
        }
        c.save(path)?;
        Ok(())
    }

    /// Keep metrics rows out of the log (they still reach `on_log`).
    pub fn set_quiet(&mut self, quiet: bool) {
        self.quiet = quiet;
    }

    /// The agent.
    pub fn agent(&self) -> &dyn Algorithm {
        self.agent.as_ref()
    }

    /// Give up the trainer for its agent.
    pub fn into_agent(self) -> Box<dyn Algorithm> {
        self.agent
    }

    /// Env steps taken so far.
    pub fn env_steps(&self) -> u64 {
        self.counters.env_steps
    }

    /// What the run has done so far.
    pub fn report(&self) -> TrainReport {
        self.counters.report()
    }

    /// Train until `stop_at` env steps or the budget, whichever comes first, calling `on_log` with each metrics
    /// row and `on_checkpoint` at each checkpoint interval. Reaching the budget ends with an evaluation of the
    /// final policy.
    pub fn run(
        &mut self,
        stop_at: u64,
        on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
        on_checkpoint: &mut dyn FnMut(&Trainer) -> Result<()>,
    ) -> Result<()> {
        let mut scratch = StepScratch::for_trainer(self);
        while self.counters.env_steps < self.config.run.total_env_steps.min(stop_at) {
            let started = Instant::now();
            self.collect(&mut scratch)?;
            let update_started = Instant::now();
            if let Some(m) = self.agent.update(&self.progress())? {
                self.counted_update(m, update_started.elapsed().as_secs_f64());
            }
            self.counters.train_secs += started.elapsed().as_secs_f64();
            self.after_step(on_log, on_checkpoint)?;
        }
        Ok(())
    }

    /// Where training stands, for the agent's schedules.
    fn progress(&self) -> Progress {
        Progress { env_steps: self.counters.env_steps, total_env_steps: self.config.run.total_env_steps }
    }

    /// Count an update's metrics and seconds.
    fn counted_update(&mut self, m: Metrics, secs: f64) {
        self.counters.count_update(&m);
        self.counters.update_secs += secs;
        self.last_metrics = m;
    }

    /// One vectorised env step: act, step the envs, count finished episodes, let the agent observe.
    fn collect(&mut self, scratch: &mut StepScratch) -> Result<()> {
        let StepScratch { out, env_actions, recorder, action_space } = scratch;
        self.memory.act(self.agent.as_mut(), self.obs.as_ref(), ActMode::Explore, out)?;
        let actions = env_actions.convert(action_space, &out.actions);
        let step = self.envs.step(&actions)?;
        if let Some(replay) = &mut self.replay {
            replay.record(&actions)?;
        }
        let Trainer { agent, obs, memory, counters, .. } = self;
        observe_step(agent.as_mut(), obs, memory, counters, out, recorder, &step)
    }

    /// Evaluation, logging and checkpoints due after a step.
    fn after_step(
        &mut self,
        on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
        on_checkpoint: &mut dyn FnMut(&Trainer) -> Result<()>,
    ) -> Result<()> {
        self.after_step_with(None, on_log, on_checkpoint)
    }

    /// [`Trainer::after_step`] with the evaluation due now already run (`evaluated`: a population's members
    /// evaluated as one, [`crate::eval::evaluate_members`]).
    fn after_step_with(
        &mut self,
        evaluated: Option<EvalResult>,
        on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
        on_checkpoint: &mut dyn FnMut(&Trainer) -> Result<()>,
    ) -> Result<()> {
        let (config, c) = (&self.config, &mut self.counters);
        let eval = if c.eval_due(config) {
            let result = match evaluated {
                Some(result) => result,
                None => evaluate(self.agent.as_mut(), &config.env, config.eval.episodes, c.eval_seed(config))?,
            };
            c.evals.push(EvalPoint { env_steps: c.env_steps, train_secs: c.train_secs, result: result.clone() });
            Some(result)
        } else {
            None
        };
        if c.log_due(config, eval.is_some()) {
            let row = c.log_row(self.last_metrics.clone(), eval, &config.tasks);
            if !self.quiet {
                log_progress(&row);
            }
            on_log(&row)?;
        }
        if c.checkpoint_due(config) {
            on_checkpoint(self)?;
        }
        Ok(())
    }
}

/// The second half of an env step, after the envs stepped with the actions in `out`: count finished
/// episodes, let the agent observe the step as a one-step chunk, move on to the step's observations.
fn observe_step(
    agent: &mut dyn Algorithm,
    obs: &mut ObsBuf,
    memory: &mut Memory,
    counters: &mut RunCounters,
    out: &ActOutput,
    recorder: &mut ChunkRecorder,
    step: &VecStep<'_>,
) -> Result<()> {
    for ep in step.episodes {
        counters.count_episode(ep.episode_return, ep.length);
        if let Some(task) = ep.task {
            counters.count_task_return(task as usize, ep.episode_return, 1);
        }
    }
    if recorder.record(obs.as_ref(), &out.actions, &out.log_probs, &out.values, step)? {
        // A one-step chunk: its initial state is the one the policy acted from.
        recorder.set_initial_state(memory.initial_state());
        agent.observe(std::slice::from_ref(recorder.chunk()))?;
    }
    memory.end_episodes(step.terminated, step.truncated);
    let same = obs.write_at(0, step.obs);
    debug_assert!(same, "one dtype per batch");
    counters.env_steps += step.rewards.len() as u64;
    Ok(())
}

/// Members `group` (with their `scratch`) observe their shares of the joint batch's `step`: member `k`'s envs
/// are `offsets[k]..offsets[k] + sizes[k]`.
fn observe_share(
    group: &mut [Trainer],
    scratch: &mut [StepScratch],
    offsets: &[usize],
    sizes: &[usize],
    step: &VecStep<'_>,
) -> Result<()> {
    for ((t, s), (&start, &n)) in group.iter_mut().zip(scratch.iter_mut()).zip(offsets.iter().zip(sizes)) {
        let share = step.slice(start..start + n);
        observe_step(t.agent.as_mut(), &mut t.obs, &mut t.memory, &mut t.counters, &s.out, &mut s.recorder, &share)?;
    }
    Ok(())
}

/// A population's training envs as one N×E batch ([`VecEnv::join`] of the members' batches): every lockstep
/// step, each member acts on its own observations, the joint batch steps once with all the actions, and each
/// member observes its share ([`flotilla_envs::VecStep::slice`]). Each env keeps its own state and stream,
/// so a member's experience is exactly what its own batch would give. The members get their envs back
/// ([`JointEnvs::give_back`]) for checkpoints and when the group stops.
struct JointEnvs {
    envs: VecEnv,
    sizes: Vec<usize>,
    /// Where each member's envs start in the batch.
    offsets: Vec<usize>,
    /// Threads that step the batch and let the members observe their shares.
    threads: usize,
    discrete: Vec<i64>,
    continuous: Vec<f32>,
    /// Whether to ask the members' kind for one batched acting pass (else each member acts alone).
    batched_acting: bool,
    /// The members' parameters as the batched acting pass stacks them, kept between their updates.
    stack: MemberStack,
}

impl JointEnvs {
    /// Join the members' batches; `None` where a member's envs are not a native [`VecEnv`] (ale-py's vector,
    /// Python envs, multi-task batches) or are replayed for resume: those members step their own batches.
    fn join(group: &mut [Trainer], batched_acting: bool, threads: usize) -> Result<Option<JointEnvs>> {
        if group.len() < 2 || group.iter().any(|t| t.replay.is_some()) {
            return Ok(None);
        }
        let members = group.len();
        let mut parts: Vec<&mut VecEnv> = group.iter_mut().filter_map(|t| t.envs.as_vec_env_mut()).collect();
        if parts.len() < members {
            return Ok(None);
        }
        let sizes: Vec<usize> = parts.iter().map(|p| p.num_envs()).collect();
        let offsets = sizes.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
        let mut envs = VecEnv::join(&mut parts)?;
        envs.set_step_threads(threads);
        let (discrete, continuous) = (Vec::new(), Vec::new());
        Ok(Some(JointEnvs {
            envs,
            sizes,
            offsets,
            threads,
            discrete,
            continuous,
            batched_acting,
            stack: MemberStack::default(),
        }))
    }

    /// One lockstep env step of every member (of `kind`): act, one step of the joint batch, observe; the
    /// seconds of each phase are added to `times`.
    fn step(
        &mut self,
        group: &mut [Trainer],
        scratch: &mut [StepScratch],
        kind: &AlgorithmConfig,
        times: &mut GroupTimes,
    ) -> Result<()> {
        let started = Instant::now();
        let (discrete, continuous) = (&mut self.discrete, &mut self.continuous);
        discrete.clear();
        continuous.clear();
        // Asked once: members the kind cannot act as one act alone from then on (evaluations too).
        self.batched_acting = self.batched_acting && act_batched(group, scratch, kind, &mut self.stack)?;
        if !self.batched_acting {
            for (t, s) in group.iter_mut().zip(scratch.iter_mut()) {
                t.memory.act(t.agent.as_mut(), t.obs.as_ref(), ActMode::Explore, &mut s.out)?;
            }
        }
        for s in scratch.iter_mut() {
            match s.env_actions.convert(&s.action_space, &s.out.actions) {
                VecActions::Discrete(a) => discrete.extend_from_slice(a),
                VecActions::Continuous(a) => continuous.extend_from_slice(a),
            }
        }
        let actions = match self.envs.action_space() {
            flotilla_core::Space::Discrete { .. } => VecActions::Discrete(discrete),
            flotilla_core::Space::Box { .. } => VecActions::Continuous(continuous),
        };
        let acted = Instant::now();
        let step = self.envs.step(&actions)?;
        let stepped = Instant::now();
        let per = group.len().div_ceil(self.threads.clamp(1, group.len().max(1))).max(1);
        let mut shares = group
            .chunks_mut(per)
            .zip(scratch.chunks_mut(per))
            .zip(self.offsets.chunks(per).zip(self.sizes.chunks(per)))
            .map(|((group, scratch), (offsets, sizes))| move || observe_share(group, scratch, offsets, sizes, &step));
        let first = shares.next();
        std::thread::scope(|scope| {
            let others: Vec<_> = shares.map(|share| scope.spawn(share)).collect();
            let mut result = first.map_or(Ok(()), |mut share| share());
            for other in others {
                let joined = other.join().expect("an observing thread does not panic");
                result = result.and(joined);
            }
            result
        })?;
        times.acting += (acted - started).as_secs_f64();
        times.envs += (stepped - acted).as_secs_f64();
        times.observing += stepped.elapsed().as_secs_f64();
        Ok(())
    }

    /// Give every member its envs back.
    fn give_back(mut self, group: &mut [Trainer]) -> Result<()> {
        let mut parts: Vec<&mut VecEnv> = group.iter_mut().filter_map(|t| t.envs.as_vec_env_mut()).collect();
        Ok(self.envs.unjoin(&mut parts, &self.sizes)?)
    }
}

/// The evaluations due now, run as one where every member's is due (lockstep members share the schedule) and
/// their kind acts them as one ([`crate::eval::evaluate_members`]); empty where not (each evaluates alone).
fn evaluate_group(group: &mut [Trainer]) -> Result<Vec<Option<EvalResult>>> {
    let due = |t: &Trainer| t.counters.eval_pending(&t.config);
    if group.len() < 2 || !group.iter().all(due) {
        return Ok(Vec::new());
    }
    let config = group[0].config.clone();
    let seeds: Vec<u64> = group.iter().map(|t| t.counters.eval_seed(&t.config)).collect();
    let mut agents: Vec<&mut dyn Algorithm> = group.iter_mut().map(|t| t.agent.as_mut()).collect();
    let results = evaluate_members(&config.algorithm, &mut agents, &config.env, config.eval.episodes, &seeds)?;
    Ok(results.map(|r| r.into_iter().map(Some).collect()).unwrap_or_default())
}

/// Every member's action on its observations from one batched pass of their kind
/// ([`flotilla_algorithms::AlgorithmKind::act_members`]); `false` where it has none or the members cannot
/// batch (recurrent members carry state and always act alone).
fn act_batched(
    group: &mut [Trainer],
    scratch: &mut [StepScratch],
    kind: &AlgorithmConfig,
    stack: &mut MemberStack,
) -> Result<bool> {
    if group.iter().any(|t| t.memory.dim() > 0) {
        return Ok(false);
    }
    let (mut agents, obs): (Vec<&mut dyn Algorithm>, Vec<ObsRef<'_>>) =
        group.iter_mut().map(|t| (t.agent.as_mut(), t.obs.as_ref())).unzip();
    let mut outs: Vec<&mut ActOutput> = scratch.iter_mut().map(|s| &mut s.out).collect();
    Ok(kind.act_members(&mut agents, &obs, ActMode::Explore, &mut outs, stack)?)
}

/// Buffers one trainer's env steps reuse.
struct StepScratch {
    out: ActOutput,
    env_actions: EnvActions,
    /// The step as the one-step chunk the agent observes.
    recorder: ChunkRecorder,
    action_space: flotilla_core::Space,
}

impl StepScratch {
    fn for_trainer(t: &Trainer) -> Self {
        StepScratch {
            out: ActOutput::default(),
            env_actions: EnvActions::default(),
            recorder: ChunkRecorder::new(1),
            action_space: t.envs.action_space().clone(),
        }
    }
}

/// Train a population's members (`group`, same config up to seeds and per-member hyperparameters, at the same
/// env step) in lockstep until `stop_at` or the budget: each step every member acts, the members' envs step
/// as one N×E batch (`JointEnvs`; each member's own batch where they cannot join) and each member observes
/// its share as [`Trainer::run`] does; when the members are PPO or A2C agents whose rollouts complete together,
/// or DQN, DDPG or TD3 agents whose training phases fall due together, one batched update trains them all
/// ([`flotilla_algorithms::AlgorithmKind::update_members`]: [`flotilla_algorithms::ppo::update_members`],
/// [`flotilla_algorithms::a2c::update_members`], [`flotilla_algorithms::dqn::update_members`],
/// [`flotilla_algorithms::td3::update_members`]: each algorithm's
/// one update over the member axis), else each updates alone.
/// Then each
/// evaluates, logs (`on_log(position in group, row)`) and checkpoints on its own schedule. Collection and update
/// seconds are shared out equally.
///
/// With the envs joined, the members act in one batched pass where their kind has one
/// ([`flotilla_algorithms::AlgorithmKind::act_members`]) and `batched_acting` says so (`None`: where the members
/// live on an accelerator).
pub fn run_group(
    group: &mut [Trainer],
    stop_at: u64,
    batched_acting: Option<bool>,
    step_threads: usize,
    on_log: &mut dyn FnMut(usize, &LogRow) -> Result<()>,
    on_checkpoint: &mut dyn FnMut(usize, &Trainer) -> Result<()>,
) -> Result<()> {
    let Some(first) = group.first() else { return Ok(()) };
    let stop = first.config.run.total_env_steps.min(stop_at);
    let steps: Vec<u64> = group.iter().map(|t| t.counters.env_steps).collect();
    if steps.iter().any(|&s| s != steps[0]) {
        return Err(Error::Config(format!("a population's members must stand at the same env step: {steps:?}")));
    }
    let mut scratch: Vec<StepScratch> = group.iter().map(StepScratch::for_trainer).collect();
    let batched_acting = match batched_acting {
        Some(on) => on,
        None => first.config.run.device.resolve()? != tch::Device::Cpu,
    };
    let mut joint = JointEnvs::join(group, batched_acting, step_threads)?;
    if let Some(j) = &joint {
        let acting = if batched_acting { ", acting in one batched pass where they can" } else { "" };
        let threads = if j.threads > 1 { format!(" on {} threads", j.threads) } else { String::new() };
        info!("{} members' envs step as one batch of {} envs{threads}{acting}", group.len(), j.envs.num_envs());
    }
    let mut times = GroupTimes::default();
    let result = run_lockstep(group, &mut joint, &mut scratch, stop, on_log, on_checkpoint, &mut times);
    info!(
        "{} members, {}: {times}",
        group.len(),
        if joint.is_some() { "one joint env batch" } else { "own env batches" }
    );
    // Where `FLOTILLA_PROFILE_UPDATE=1` timed the batched updates' and acting passes' phases
    // (flotilla_algorithms::nn::phases).
    let phases = flotilla_algorithms::nn::phases::take();
    if !phases.is_empty() {
        let shown: Vec<String> = phases.iter().map(|(name, secs)| format!("{secs:.3} s {name}")).collect();
        info!(
            "{} members, batched update and acting phases (the device waited at each): {}",
            group.len(),
            shown.join(", ")
        );
    }
    // The members get their envs back whatever happened (a failed run still checkpoints and reports).
    let back = joint.map_or(Ok(()), |j| j.give_back(group));
    result.and(back)
}

/// [`run_group`]'s loop, with the envs joined (`joint`) or each member's own.
fn run_lockstep(
    group: &mut [Trainer],
    joint: &mut Option<JointEnvs>,
    scratch: &mut [StepScratch],
    stop: u64,
    on_log: &mut dyn FnMut(usize, &LogRow) -> Result<()>,
    on_checkpoint: &mut dyn FnMut(usize, &Trainer) -> Result<()>,
    times: &mut GroupTimes,
) -> Result<()> {
    let share = 1.0 / group.len() as f64;
    // The members' kind (one for all), for their batched update.
    let kind = group[0].config.algorithm.clone();
    while group[0].counters.env_steps < stop {
        let started = Instant::now();
        match joint {
            Some(j) => j.step(group, scratch, &kind, times)?,
            None => {
                for (t, s) in group.iter_mut().zip(scratch.iter_mut()) {
                    t.collect(s)?;
                }
                times.own_envs += started.elapsed().as_secs_f64();
            }
        }
        let update_started = Instant::now();
        let metrics = update_group(group, &kind)?;
        let update_elapsed = update_started.elapsed().as_secs_f64();
        times.updating += update_elapsed;
        let update_secs = update_elapsed * share;
        let secs = started.elapsed().as_secs_f64() * share;
        // A checkpoint saves each member's envs: they go back to the members first, and are joined again
        // after.
        let rejoin = joint.is_some() && group.iter().any(|t| t.counters.checkpoint_pending());
        let batched_acting = joint.as_ref().is_some_and(|j| j.batched_acting);
        let threads = joint.as_ref().map_or(1, |j| j.threads);
        if rejoin && let Some(j) = joint.take() {
            j.give_back(group)?;
        }
        for (t, m) in group.iter_mut().zip(metrics) {
            if let Some(m) = m {
                t.counted_update(m, update_secs);
            }
            t.counters.train_secs += secs;
        }
        let mut evaluated = match batched_acting {
            true => evaluate_group(group)?,
            false => Vec::new(),
        };
        evaluated.resize(group.len(), None);
        // Members checkpointing at this step save together (one fsync wait for all, not two per member).
        crate::run_dir::saved_together(|| {
            for (k, (t, e)) in group.iter_mut().zip(evaluated).enumerate() {
                t.after_step_with(e, &mut |row| on_log(k, row), &mut |t| on_checkpoint(k, t))?;
            }
            Ok(())
        })?;
        if rejoin {
            *joint = JointEnvs::join(group, batched_acting, threads)?;
        }
        times.bookkeeping += (update_started.elapsed().as_secs_f64() - update_elapsed).max(0.0);
    }
    Ok(())
}

/// Where a lockstep group's seconds went ([`run_group`] logs them at its end): the profile that says whether a
/// population is bound by acting, its envs, the members' per-step observing, its updates or per-member
/// bookkeeping (metrics rows, evaluations, checkpoints).
#[derive(Default)]
struct GroupTimes {
    /// The members' acting passes (one batched pass, or each member's own).
    acting: f64,
    /// The joint env batch's steps.
    envs: f64,
    /// Each member observing its share of the step (its rollout or replay, its counters).
    observing: f64,
    /// Members with their own env batches: acting, stepping and observing together.
    own_envs: f64,
    /// Updates, batched or each member's own.
    updating: f64,
    /// Metrics rows, evaluations, checkpoints and re-joining the envs.
    bookkeeping: f64,
}

impl std::fmt::Display for GroupTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = [
            ("acting", self.acting),
            ("stepping envs", self.envs),
            ("observing", self.observing),
            ("acting, stepping and observing alone", self.own_envs),
            ("updating", self.updating),
            ("metrics, evaluations and checkpoints", self.bookkeeping),
        ];
        let shown: Vec<String> =
            parts.iter().filter(|(_, secs)| *secs > 0.0).map(|(name, secs)| format!("{secs:.3} s {name}")).collect();
        write!(f, "{}", shown.join(", "))
    }
}

/// The update due after a lockstep env step: one batched update of the members where their kind has one
/// ([`flotilla_algorithms::AlgorithmKind::update_members`]), else each member's own.
fn update_group(group: &mut [Trainer], kind: &AlgorithmConfig) -> Result<Vec<Option<Metrics>>> {
    let progress = group[0].progress();
    let mut members: Vec<&mut dyn Algorithm> = group.iter_mut().map(|t| t.agent.as_mut()).collect();
    if let Some(metrics) = kind.update_members(&mut members, &progress)? {
        return Ok(metrics);
    }
    members.into_iter().map(|a| Ok(a.update(&progress)?)).collect()
}

/// Train as `config` says, calling `on_log` with each metrics row. Returns the trained agent and a report
/// whose last evaluation is of the final policy.
pub fn train(
    config: &ExperimentConfig,
    on_log: &mut dyn FnMut(&LogRow) -> Result<()>,
) -> Result<(Box<dyn Algorithm>, TrainReport)> {
    let mut trainer = Trainer::new(config)?;
    trainer.run(u64::MAX, on_log, &mut |_| Ok(()))?;
    let report = trainer.report();
    Ok((trainer.into_agent(), report))
}
