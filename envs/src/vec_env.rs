//! [`VecEnv`]: N environments stepped in lock-step, with batched buffers and same-step auto-reset.
//!
//! The counterpart of Gymnasium 1.x's `SyncVectorEnv` (`gymnasium/vector/sync_vector_env.py`), with one
//! deliberate difference in auto-reset:
//!
//! * **Here (same-step, as Gymnasium's `AutoresetMode.SAME_STEP` and Stable-Baselines3):** when env `i`
//!   terminates or truncates during `step`, it is reset inside that same call. The step reports the
//!   finishing transition's reward and flags, `obs()` row `i` is already the *first observation of the
//!   next episode*, and the true last observation of the finished episode is kept in
//!   [`final_obs(i)`](VecEnv::final_obs) until the next step.
//! * **Gymnasium 1.x's default (`NEXT_STEP`):** the finishing step returns the final observation, and the
//!   *next* `step` call ignores env `i`'s action, resets it and returns a dummy transition (reward 0,
//!   not done) with the first observation.
//!
//! Same-step is chosen because every `(obs, action, reward)` an actor records is then a real
//! transition: no dummy steps to mask out of trajectories, no wasted action, and the value of a
//! truncated episode is bootstrapped from `final_obs(i)`, which is exactly the state the time limit cut.
//! Rule for learners: on `terminated[i]` do not bootstrap; on `truncated[i] && !terminated[i]` bootstrap
//! from `final_obs(i)` (both flags are set when the last allowed step also terminates, as in Gymnasium).
//!
//! Auto-resets call `reset(None)`, continuing each env's own stream, so `reset(Some(seed))` (env `i`
//! gets `seed + i`) fixes every later episode too. The step path allocates nothing: buffers are owned
//! by the `VecEnv` and reused, and envs write into them through [`BufferedEnv`].
//! Observations are batched in the observation space's dtype ([`ObsBuf`]): f32 rows for classic control, u8
//! rows for image envs (those step through [`Env::step`] and are copied once into the batch).
//!
//! [`VectorEnv`] is the contract itself, so that a batch stepped elsewhere (ale-py's C++ `AtariVectorEnv`,
//! in flotilla-envs-python) is used by trainers and actors exactly as a [`VecEnv`] is; [`make_vector`]
//! builds either from an id.
//!
//! [`VecEnv::snapshot`] and [`VecEnv::restore`] save and put back the whole batch — each env's
//! [`EnvSnapshot`], the current observations and the running episodes' returns and lengths — so that a
//! resumed run steps on bit for bit, episode statistics included.

use flotilla_core::{Action, DType, Env, EnvSnapshot, Error, Obs, ObsBuf, ObsRef, Result, Space};
use serde::{Deserialize, Serialize};

use std::ops::Range;

use crate::buffered::{BoxedEnv, BufferedEnv, StepOutcome};
use crate::kwargs::Kwargs;
use crate::registry;
use crate::snapshot::invalid;

/// A batch of actions, one per env, flattened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VecActions<'a> {
    /// One index per env (`Discrete` action spaces).
    Discrete(&'a [i64]),
    /// `num_envs * action_dim` values, env-major (`Box` action spaces).
    Continuous(&'a [f32]),
}

/// One finished episode (the type chunks carry to learners too).
pub use flotilla_core::EpisodeStats;

/// The dynamic state of a [`VecEnv`], from [`VecEnv::snapshot`]: plain data, serialisable with serde.
///
/// The last step's outputs (rewards, flags, final observations, finished episodes) are not part of it: they
/// do not affect the future, and after [`VecEnv::restore`] they read as after a reset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VecEnvSnapshot {
    /// Id of the envs; a `VecEnv` of another id refuses the snapshot.
    pub id: String,
    /// One snapshot per env, in batch order.
    pub envs: Vec<EnvSnapshot>,
    /// The current observations, `num_envs * obs_dim`, env-major (the next step's inputs).
    pub obs: Vec<f32>,
    /// Per env: the undiscounted return so far of its running episode.
    pub returns: Vec<f64>,
    /// Per env: the steps so far of its running episode.
    pub lengths: Vec<u64>,
}

/// A borrowed view of what the last [`VectorEnv::step`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct VecStep<'a> {
    /// `num_envs * obs_dim` observations; for envs that just finished, the first of the next episode.
    pub obs: ObsRef<'a>,
    /// One reward per env, rounded to f32 for the learner (episode returns are summed in f64).
    pub rewards: &'a [f32],
    /// Per env: the episode reached a terminal state (do not bootstrap).
    pub terminated: &'a [bool],
    /// Per env: the episode was cut by the time limit (bootstrap from [`final_obs`](VecStep::final_obs)).
    pub truncated: &'a [bool],
    /// Episodes that ended in this step.
    pub episodes: &'a [EpisodeStats],
    final_obs: ObsRef<'a>,
    has_final: &'a [bool],
    obs_dim: usize,
}

impl<'a> VecStep<'a> {
    /// The view a [`VectorEnv`] returns from `step`. `final_obs` is `num_envs × obs_dim` like `obs`; only the
    /// rows whose `has_final` is set are read (the true last observation of an episode that ended in this
    /// step). Every per-env slice must have `obs.len() / obs_dim` entries.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        obs: ObsRef<'a>,
        rewards: &'a [f32],
        terminated: &'a [bool],
        truncated: &'a [bool],
        episodes: &'a [EpisodeStats],
        final_obs: ObsRef<'a>,
        has_final: &'a [bool],
        obs_dim: usize,
    ) -> Self {
        debug_assert_eq!(obs.len(), rewards.len() * obs_dim);
        debug_assert_eq!(final_obs.len(), obs.len());
        VecStep { obs, rewards, terminated, truncated, episodes, final_obs, has_final, obs_dim }
    }

    /// The true last observation of env `i`'s episode if it ended in this step.
    pub fn final_obs(&self, i: usize) -> Option<ObsRef<'a>> {
        final_row(self.final_obs, self.has_final, self.obs_dim, i)
    }

    /// The observation that truly followed each env's action, into `out` (`num_envs × obs_dim`, replacing
    /// its contents): the final observation where an episode ended in this step (not the first of the next
    /// episode, which `obs` holds), else `obs`. This is the `next_obs` a learner bootstraps from.
    pub fn true_next_obs(&self, out: &mut ObsBuf) {
        if out.dtype() != self.obs.dtype() {
            *out = ObsBuf::with_capacity(self.obs.dtype(), self.obs.len());
        }
        out.clear();
        let same = out.extend(self.obs);
        for i in 0..self.terminated.len() {
            if let Some(last) = self.final_obs(i) {
                let same_row = out.write_at(i * self.obs_dim, last);
                debug_assert!(same && same_row, "one dtype per batch");
            }
        }
    }
    /// The view of envs `envs` alone (e.g. one member's share of a population's joint batch, see
    /// [`VecEnv::join`]): their observations, rewards, flags and final observations, and the episodes that
    /// ended in them. Those episodes keep their `env_index` in the whole batch. Episodes must be listed in env
    /// order, as [`VecEnv::step`] lists them.
    pub fn slice(&self, envs: Range<usize>) -> VecStep<'a> {
        debug_assert!(self.episodes.windows(2).all(|w| w[0].env_index <= w[1].env_index), "episodes in env order");
        let d = self.obs_dim;
        let first = self.episodes.partition_point(|e| e.env_index < envs.start);
        let last = self.episodes.partition_point(|e| e.env_index < envs.end);
        let rows = envs.start * d..envs.end * d;
        VecStep {
            obs: self.obs.slice(rows.clone()),
            rewards: &self.rewards[envs.clone()],
            terminated: &self.terminated[envs.clone()],
            truncated: &self.truncated[envs.clone()],
            episodes: &self.episodes[first..last],
            final_obs: self.final_obs.slice(rows),
            has_final: &self.has_final[envs],
            obs_dim: d,
        }
    }
}

fn final_row<'a>(final_obs: ObsRef<'a>, has_final: &[bool], dim: usize, i: usize) -> Option<ObsRef<'a>> {
    if *has_final.get(i)? && (i + 1) * dim <= final_obs.len() {
        Some(final_obs.slice(i * dim..(i + 1) * dim))
    } else {
        None
    }
}

/// Which side of a run an env batch serves. Most envs are the same for both; Atari's differ as CleanRL's and
/// SB3's do: training ends an episode on each lost life and clips rewards to {−1, 0, 1}, evaluation plays
/// whole games and scores them unclipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvRole {
    /// Collecting experience to learn from.
    Training,
    /// Measuring the policy.
    Evaluation,
}

/// N environments stepped in lock-step with same-step auto-reset (the contract in the module docs): what
/// trainers, actors and evaluation step. [`VecEnv`] implements it over single envs; a backend with a
/// batched engine of its own (ale-py's `AtariVectorEnv`) implements it directly.
pub trait VectorEnv: Send {
    /// Id of the envs.
    fn id(&self) -> &str;
    /// Number of envs.
    fn num_envs(&self) -> usize;
    /// Space of one env's observation (its dtype is the batch's).
    fn observation_space(&self) -> &Space;
    /// Space of one env's action.
    fn action_space(&self) -> &Space;
    /// Reset every env (env `i` with `seed + i`, or continuing its stream on `None`); returns the first
    /// observations, `num_envs × obs_dim`.
    fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>>;
    /// Step every env, auto-resetting those that finish. An invalid batch of actions is an error with no
    /// effect.
    fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>>;
    /// The current observations.
    fn obs(&self) -> ObsRef<'_>;
    /// The batch's whole state for exact resume; [`Error::Unsupported`] where the envs cannot be saved.
    fn snapshot(&self) -> Result<VecEnvSnapshot>;
    /// Put back a [`VectorEnv::snapshot`].
    fn restore(&mut self, snapshot: &VecEnvSnapshot) -> Result<()>;
    /// This batch as a [`VecEnv`] (what [`VecEnv::join`] takes), where it is one.
    fn as_vec_env_mut(&mut self) -> Option<&mut VecEnv> {
        None
    }
    /// The settings the envs run with, defaults filled in (e.g. Atari's sticky-action probability), for the
    /// resolved config a run writes. Empty where the id and the given arguments say everything.
    fn resolved_kwargs(&self) -> Kwargs {
        Kwargs::new()
    }
    /// Elements of one observation.
    fn obs_dim(&self) -> usize {
        self.observation_space().flat_dim()
    }
}

/// N environments with identical spaces, stepped in lock-step with same-step auto-reset (see the module
/// docs for how that differs from Gymnasium's default and why).
///
/// ```
/// use flotilla_envs::{Kwargs, VecActions, VecEnv};
/// let mut envs = VecEnv::make("CartPole-v1", &Kwargs::new(), 4)?;
/// envs.reset(Some(42))?;
/// let actions = [0i64, 1, 0, 1];
/// for _ in 0..100 {
///     let step = envs.step(&VecActions::Discrete(&actions))?;
///     for i in 0..4 {
///         if step.truncated[i] {
///             let _bootstrap_from = step.final_obs(i).expect("kept for finished envs");
///         }
///     }
///     for episode in step.episodes {
///         assert!(episode.length >= 1);
///     }
/// }
/// # Ok::<(), flotilla_core::Error>(())
/// ```
pub struct VecEnv {
    envs: Vec<Box<dyn BufferedEnv>>,
    id: String,
    observation_space: Space,
    action_space: Space,
    obs_dim: usize,
    action_dim: usize,
    obs: ObsBuf,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    final_obs: ObsBuf,
    has_final: Vec<bool>,
    returns: Vec<f64>,
    lengths: Vec<usize>,
    episodes: Vec<EpisodeStats>,
    ready: bool,
    /// Threads that step the envs ([`VecEnv::set_step_threads`]).
    step_threads: usize,
}

impl VecEnv {
    /// `n` copies of a registered env from [`make_buffered`](registry::make_buffered): the fast path.
    pub fn make(id: &str, kwargs: &Kwargs, n: usize) -> Result<Self> {
        let envs = (0..n).map(|_| registry::make_buffered(id, kwargs)).collect::<Result<Vec<_>>>()?;
        VecEnv::from_buffered(envs)
    }

    /// Any boxed envs (e.g. Python-bridged ones), each observation copied out of its `Vec`.
    pub fn new(envs: Vec<Box<dyn Env>>) -> Result<Self> {
        VecEnv::from_buffered(envs.into_iter().map(|e| Box::new(BoxedEnv::new(e)) as Box<dyn BufferedEnv>).collect())
    }

    /// Envs that write into the batch directly. They must share observation and action spaces. Envs with u8
    /// observations step through [`Env::step`] and are copied into the batch.
    pub fn from_buffered(envs: Vec<Box<dyn BufferedEnv>>) -> Result<Self> {
        let Some(first) = envs.first() else {
            return Err(Error::BadArgument {
                env: "VecEnv".into(),
                key: "envs".into(),
                detail: "needs at least one environment".into(),
            });
        };
        let id = first.id().to_string();
        let observation_space = first.observation_space().clone();
        let action_space = first.action_space().clone();
        let dtype = match &observation_space {
            Space::Box { dtype, .. } => *dtype,
            Space::Discrete { .. } => DType::F32,
        };
        for (i, env) in envs.iter().enumerate().skip(1) {
            if env.observation_space() != &observation_space || env.action_space() != &action_space {
                return Err(Error::BadArgument {
                    env: id,
                    key: "envs".into(),
                    detail: format!("env {i} ({}) has different spaces than env 0", env.id()),
                });
            }
        }
        let n = envs.len();
        let obs_dim = observation_space.flat_dim();
        let action_dim = action_space.flat_dim();
        Ok(VecEnv {
            envs,
            id,
            observation_space,
            action_space,
            obs_dim,
            action_dim,
            obs: ObsBuf::zeros(dtype, n * obs_dim),
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            final_obs: ObsBuf::zeros(dtype, n * obs_dim),
            has_final: vec![false; n],
            returns: vec![0.0; n],
            lengths: vec![0; n],
            episodes: Vec::with_capacity(n),
            ready: false,
            step_threads: 1,
        })
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// Id of the envs (of env 0, for mixed batches).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Space of one env's observation.
    pub fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    /// Space of one env's action.
    pub fn action_space(&self) -> &Space {
        &self.action_space
    }

    /// Elements of one observation (row length of [`obs`](VecEnv::obs)).
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Elements of one action (1 for discrete).
    pub fn action_dim(&self) -> usize {
        self.action_dim
    }

    /// The envs, e.g. to read one's physical state.
    pub fn envs(&self) -> &[Box<dyn BufferedEnv>] {
        &self.envs
    }

    /// Resets every env (env `i` with `seed + i`, or continuing its stream on `None`) and returns the
    /// `num_envs * obs_dim` first observations.
    pub fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>> {
        self.ready = false;
        let d = self.obs_dim;
        for (i, env) in self.envs.iter_mut().enumerate() {
            reset_row(
                env.as_mut(),
                seed.map(|s| s.wrapping_add(i as u64)),
                &mut all_rows(&mut self.obs),
                i * d..(i + 1) * d,
            )?;
        }
        self.rewards.fill(0.0);
        self.terminated.fill(false);
        self.truncated.fill(false);
        self.has_final.fill(false);
        self.returns.fill(0.0);
        self.lengths.fill(0);
        self.episodes.clear();
        self.ready = true;
        Ok(self.obs.as_ref())
    }

    /// Steps every env with its action, auto-resetting the ones that finish (see the module docs).
    ///
    /// All actions are checked before any env moves, so an invalid batch is an error with no effect.
    /// If an env itself fails mid-batch the batch is inconsistent: later calls return
    /// [`Error::ResetNeeded`] until [`reset`](VecEnv::reset).
    pub fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>> {
        if !self.ready {
            return Err(Error::ResetNeeded { env: self.id.clone() });
        }
        self.check_actions(actions)?;
        self.ready = false;
        self.episodes.clear();
        let (n, d, action_dim) = (self.envs.len(), self.obs_dim, self.action_dim);
        let threads = self.step_threads.clamp(1, n.max(1));
        let mut whole = Part {
            first: 0,
            envs: &mut self.envs,
            obs: all_rows(&mut self.obs),
            final_obs: all_rows(&mut self.final_obs),
            rewards: &mut self.rewards,
            terminated: &mut self.terminated,
            truncated: &mut self.truncated,
            has_final: &mut self.has_final,
            returns: &mut self.returns,
            lengths: &mut self.lengths,
            episodes: std::mem::take(&mut self.episodes),
        };
        let stepped = if threads == 1 {
            // On the caller's thread (every run but a large population's joint batch): no shares to allocate,
            // and the episodes' buffer is reused.
            let stepped = whole.step(actions, d, action_dim);
            self.episodes = whole.episodes;
            stepped
        } else {
            let mut parts = whole.split(n.div_ceil(threads), d);
            let stepped: Vec<Result<()>> = std::thread::scope(|scope| {
                let (head, rest) = parts.split_first_mut().expect("more than one share");
                let others: Vec<_> =
                    rest.iter_mut().map(|part| scope.spawn(move || part.step(actions, d, action_dim))).collect();
                let mut out = vec![head.step(actions, d, action_dim)];
                out.extend(others.into_iter().map(|h| h.join().expect("a stepping thread does not panic")));
                out
            });
            self.episodes = parts.into_iter().flat_map(|p| p.episodes).collect();
            stepped.into_iter().collect::<Result<()>>()
        };
        stepped?;
        self.ready = true;
        Ok(self.view())
    }

    /// Step the envs on up to `threads` threads (contiguous shares of the batch; 1, the default, steps them
    /// on the caller's). Every env's step is the same either way; a large batch of cheap envs (a population's
    /// joint batch of thousands of CartPoles) steps `threads`× faster on as many free cores.
    pub fn set_step_threads(&mut self, threads: usize) {
        self.step_threads = threads.max(1);
    }

    fn check_actions(&self, actions: &VecActions<'_>) -> Result<()> {
        check_vec_actions(&self.id, &self.action_space, self.action_dim, self.envs.len(), actions)
    }

    fn view(&self) -> VecStep<'_> {
        VecStep {
            obs: self.obs.as_ref(),
            rewards: &self.rewards,
            terminated: &self.terminated,
            truncated: &self.truncated,
            episodes: &self.episodes,
            final_obs: self.final_obs.as_ref(),
            has_final: &self.has_final,
            obs_dim: self.obs_dim,
        }
    }

    /// Everything that decides the batch's future: each env's snapshot, the current observations and the
    /// running episodes' returns and lengths. [`Error::ResetNeeded`] before the first reset or after an env
    /// failed mid-batch (the batch is then not consistent); [`Error::Unsupported`] if an env cannot take one
    /// (or its observations are frames).
    pub fn snapshot(&self) -> Result<VecEnvSnapshot> {
        if !self.ready {
            return Err(Error::ResetNeeded { env: self.id.clone() });
        }
        let ObsBuf::F32(obs) = &self.obs else {
            return Err(Error::Unsupported { env: self.id.clone(), what: "snapshots of u8 observations".into() });
        };
        Ok(VecEnvSnapshot {
            id: self.id.clone(),
            envs: self.envs.iter().map(|env| env.snapshot()).collect::<Result<_>>()?,
            obs: obs.clone(),
            returns: self.returns.clone(),
            lengths: self.lengths.iter().map(|&n| n as u64).collect(),
        })
    }

    /// Puts back a batch saved by [`snapshot`](VecEnv::snapshot) from a `VecEnv` made with the same id,
    /// arguments and number of envs (this one may be fresh, neither seeded nor reset): the following steps,
    /// episode statistics and auto-resets are bit-identical to the original's. The last step's outputs read
    /// as after a reset.
    ///
    /// A snapshot of another id, number of envs or layout is [`Error::InvalidSnapshot`] and changes
    /// nothing: if an env refuses its part, the envs restored before it are put back as they were.
    pub fn restore(&mut self, snapshot: &VecEnvSnapshot) -> Result<()> {
        let (n, d) = (self.envs.len(), self.obs_dim);
        let id = self.id.as_str();
        if snapshot.id != id {
            return Err(invalid(id, format!("it was taken from a VecEnv of {:?}, not {id:?}", snapshot.id)));
        }
        if snapshot.envs.len() != n {
            return Err(invalid(id, format!("it has {} envs, this VecEnv {n}", snapshot.envs.len())));
        }
        let sizes = [
            ("observations", snapshot.obs.len(), n * d),
            ("returns", snapshot.returns.len(), n),
            ("lengths", snapshot.lengths.len(), n),
        ];
        if let Some((what, got, want)) = sizes.into_iter().find(|(_, got, want)| got != want) {
            return Err(invalid(id, format!("{got} {what}, expected {want} for {n} envs")));
        }
        if self.obs.dtype() != DType::F32 {
            return Err(invalid(id, "it holds f32 observations, this VecEnv's are u8 frames"));
        }
        let lengths = snapshot
            .lengths
            .iter()
            .map(|&l| usize::try_from(l).map_err(|_| invalid(id, format!("episode length {l} does not fit in usize"))))
            .collect::<Result<Vec<_>>>()?;
        let before = self.envs.iter().map(|env| env.snapshot()).collect::<Result<Vec<_>>>()?;
        for (i, (env, part)) in self.envs.iter_mut().zip(&snapshot.envs).enumerate() {
            if let Err(err) = env.restore(part) {
                for (env, earlier) in self.envs.iter_mut().zip(&before).take(i) {
                    // Putting back an env's own fresh snapshot does not fail; if it did, the batch is inconsistent.
                    if env.restore(earlier).is_err() {
                        self.ready = false;
                    }
                }
                return Err(match err {
                    Error::InvalidSnapshot { env, detail } => {
                        Error::InvalidSnapshot { env, detail: format!("env {i} of the batch: {detail}") }
                    }
                    other => other,
                });
            }
        }
        let restored = self.obs.write_at(0, ObsRef::F32(&snapshot.obs));
        debug_assert!(restored, "dtype checked above");
        self.returns.copy_from_slice(&snapshot.returns);
        self.lengths = lengths;
        self.rewards.fill(0.0);
        self.terminated.fill(false);
        self.truncated.fill(false);
        self.has_final.fill(false);
        self.episodes.clear();
        self.ready = true;
        Ok(())
    }

    /// Current observations, `num_envs * obs_dim`, env-major.
    pub fn obs(&self) -> ObsRef<'_> {
        self.obs.as_ref()
    }

    /// Rewards of the last step.
    pub fn rewards(&self) -> &[f32] {
        &self.rewards
    }

    /// `terminated` flags of the last step.
    pub fn terminated(&self) -> &[bool] {
        &self.terminated
    }

    /// `truncated` flags of the last step.
    pub fn truncated(&self) -> &[bool] {
        &self.truncated
    }

    /// The true last observation of env `i`'s episode, if it ended in the last step.
    pub fn final_obs(&self, i: usize) -> Option<ObsRef<'_>> {
        final_row(self.final_obs.as_ref(), &self.has_final, self.obs_dim, i)
    }

    /// Episodes that ended in the last step.
    pub fn episodes(&self) -> &[EpisodeStats] {
        &self.episodes
    }

    /// The envs of `parts`, in order, as one batch (a population's members' batches stepped as one N×E
    /// vector). Each env keeps its state and random stream, and the running episodes' returns and lengths
    /// carry over, so stepping the joint batch steps every part's envs exactly as stepping that part would;
    /// [`VecStep::slice`] is a part's share of a step. The parts are left without envs (they refuse to step)
    /// until [`VecEnv::unjoin`] gives them back. Every part must be reset and have the first part's id and
    /// spaces; otherwise nothing moves.
    pub fn join(parts: &mut [&mut VecEnv]) -> Result<VecEnv> {
        let Some(first) = parts.first() else {
            return Err(Error::BadArgument {
                env: "VecEnv".into(),
                key: "parts".into(),
                detail: "nothing to join".into(),
            });
        };
        let mut joint = first.emptied();
        for (k, part) in parts.iter().enumerate() {
            if !part.ready {
                return Err(Error::ResetNeeded { env: format!("{} (part {k} of a joint batch)", part.id) });
            }
            if (&part.id, &part.observation_space, &part.action_space)
                != (&joint.id, &joint.observation_space, &joint.action_space)
            {
                return Err(Error::BadArgument {
                    env: joint.id.clone(),
                    key: "parts".into(),
                    detail: format!("part {k} ({}) has another id or other spaces than part 0", part.id),
                });
            }
        }
        for part in parts.iter_mut() {
            let part = std::mem::replace(&mut **part, joint.emptied());
            let same = joint.obs.extend(part.obs.as_ref());
            debug_assert!(same, "one dtype per id and space");
            joint.envs.extend(part.envs);
            joint.returns.extend(part.returns);
            joint.lengths.extend(part.lengths);
        }
        let n = joint.envs.len();
        joint.rewards = vec![0.0; n];
        joint.terminated = vec![false; n];
        joint.truncated = vec![false; n];
        joint.has_final = vec![false; n];
        joint.final_obs = ObsBuf::zeros(joint.obs.dtype(), n * joint.obs_dim);
        joint.episodes = Vec::with_capacity(n);
        joint.ready = true;
        Ok(joint)
    }

    /// Give the envs of a batch from [`VecEnv::join`] back to its parts: part `k` gets `sizes[k]` envs, in
    /// order, with their observations and running episodes. An error (sizes that do not add up to the
    /// batch, or a part that has envs) leaves everything where it was.
    pub fn unjoin(&mut self, parts: &mut [&mut VecEnv], sizes: &[usize]) -> Result<()> {
        if sizes.len() != parts.len() || sizes.iter().sum::<usize>() != self.envs.len() {
            return Err(Error::BadArgument {
                env: self.id.clone(),
                key: "sizes".into(),
                detail: format!("{sizes:?} for {} parts of {} envs", parts.len(), self.envs.len()),
            });
        }
        if let Some(k) = parts.iter().position(|p| !p.envs.is_empty()) {
            return Err(Error::BadArgument {
                env: self.id.clone(),
                key: "parts".into(),
                detail: format!("part {k} still has envs"),
            });
        }
        let d = self.obs_dim;
        let mut envs = std::mem::take(&mut self.envs).into_iter();
        let mut start = 0;
        for (part, &n) in parts.iter_mut().zip(sizes) {
            let mut back = self.emptied();
            back.envs.extend(envs.by_ref().take(n));
            let same = back.obs.extend(self.obs.slice(start * d..(start + n) * d));
            debug_assert!(same, "one dtype per batch");
            back.returns.extend_from_slice(&self.returns[start..start + n]);
            back.lengths.extend_from_slice(&self.lengths[start..start + n]);
            back.rewards = vec![0.0; n];
            back.terminated = vec![false; n];
            back.truncated = vec![false; n];
            back.has_final = vec![false; n];
            back.final_obs = ObsBuf::zeros(back.obs.dtype(), n * d);
            back.ready = self.ready;
            **part = back;
            start += n;
        }
        *self = self.emptied();
        Ok(())
    }

    /// A batch of this one's id and spaces with no envs: it refuses to step until envs are put in.
    fn emptied(&self) -> VecEnv {
        VecEnv {
            envs: Vec::new(),
            id: self.id.clone(),
            observation_space: self.observation_space.clone(),
            action_space: self.action_space.clone(),
            obs_dim: self.obs_dim,
            action_dim: self.action_dim,
            obs: ObsBuf::zeros(self.obs.dtype(), 0),
            rewards: Vec::new(),
            terminated: Vec::new(),
            truncated: Vec::new(),
            final_obs: ObsBuf::zeros(self.obs.dtype(), 0),
            has_final: Vec::new(),
            returns: Vec::new(),
            lengths: Vec::new(),
            episodes: Vec::new(),
            ready: false,
            step_threads: 1,
        }
    }
}

impl VectorEnv for VecEnv {
    fn id(&self) -> &str {
        VecEnv::id(self)
    }
    fn num_envs(&self) -> usize {
        VecEnv::num_envs(self)
    }
    fn observation_space(&self) -> &Space {
        VecEnv::observation_space(self)
    }
    fn action_space(&self) -> &Space {
        VecEnv::action_space(self)
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>> {
        VecEnv::reset(self, seed)
    }
    fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>> {
        VecEnv::step(self, actions)
    }
    fn obs(&self) -> ObsRef<'_> {
        VecEnv::obs(self)
    }
    fn snapshot(&self) -> Result<VecEnvSnapshot> {
        VecEnv::snapshot(self)
    }
    fn restore(&mut self, snapshot: &VecEnvSnapshot) -> Result<()> {
        VecEnv::restore(self, snapshot)
    }
    fn as_vec_env_mut(&mut self) -> Option<&mut VecEnv> {
        Some(self)
    }
}

/// One thread's share of a [`VecEnv::step`]: envs `first..first + envs.len()` and their rows of every buffer.
struct Part<'a> {
    first: usize,
    envs: &'a mut [Box<dyn BufferedEnv>],
    obs: RowsMut<'a>,
    final_obs: RowsMut<'a>,
    rewards: &'a mut [f32],
    terminated: &'a mut [bool],
    truncated: &'a mut [bool],
    has_final: &'a mut [bool],
    returns: &'a mut [f64],
    lengths: &'a mut [usize],
    /// Episodes that ended in this share, in env order.
    episodes: Vec<EpisodeStats>,
}

impl<'a> Part<'a> {
    /// This share cut into shares of `per` envs (`d` observation elements each), in order.
    fn split(self, per: usize, d: usize) -> Vec<Part<'a>> {
        let Part { envs, obs, final_obs, rewards, terminated, truncated, has_final, returns, lengths, .. } = self;
        let mut obs = obs.chunks(per * d).into_iter();
        let mut final_obs = final_obs.chunks(per * d).into_iter();
        let (mut rewards, mut terminated, mut truncated) =
            (rewards.chunks_mut(per), terminated.chunks_mut(per), truncated.chunks_mut(per));
        let (mut has_final, mut returns, mut lengths) =
            (has_final.chunks_mut(per), returns.chunks_mut(per), lengths.chunks_mut(per));
        let share = "every buffer has a share per env share";
        envs.chunks_mut(per)
            .enumerate()
            .map(|(p, envs)| Part {
                first: self.first + p * per,
                envs,
                obs: obs.next().expect(share),
                final_obs: final_obs.next().expect(share),
                rewards: rewards.next().expect(share),
                terminated: terminated.next().expect(share),
                truncated: truncated.next().expect(share),
                has_final: has_final.next().expect(share),
                returns: returns.next().expect(share),
                lengths: lengths.next().expect(share),
                episodes: Vec::new(),
            })
            .collect()
    }

    /// Step every env of the share with its action (`actions` is the whole batch's), auto-resetting the ones
    /// that finish.
    fn step(&mut self, actions: &VecActions<'_>, d: usize, action_dim: usize) -> Result<()> {
        let k = action_dim.max(1);
        for (j, env) in self.envs.iter_mut().enumerate() {
            let i = self.first + j;
            let action = match *actions {
                VecActions::Discrete(a) => Action::Discrete(a[i]),
                VecActions::Continuous(a) => Action::Continuous(&a[i * k..(i + 1) * k]),
            };
            let row = j * d..(j + 1) * d;
            let out = step_row(env.as_mut(), action, &mut self.obs, row.clone())?;
            self.rewards[j] = out.reward as f32;
            self.terminated[j] = out.terminated;
            self.truncated[j] = out.truncated;
            self.returns[j] += out.reward;
            self.lengths[j] += 1;
            let done = out.terminated || out.truncated;
            self.has_final[j] = done;
            if done {
                copy_row(&self.obs, &mut self.final_obs, row.clone());
                self.episodes.push(EpisodeStats {
                    env_index: i,
                    episode_return: self.returns[j],
                    length: self.lengths[j] as u64,
                    truncated: out.truncated && !out.terminated,
                    task: None,
                });
                self.returns[j] = 0.0;
                self.lengths[j] = 0;
                reset_row(env.as_mut(), None, &mut self.obs, row)?;
            }
        }
        Ok(())
    }
}

/// A batch buffer's rows, borrowed mutably (a [`Part`]'s share, or the whole).
enum RowsMut<'a> {
    F32(&'a mut [f32]),
    U8(&'a mut [u8]),
}

/// The whole of `batch`.
fn all_rows(batch: &mut ObsBuf) -> RowsMut<'_> {
    match batch {
        ObsBuf::F32(v) => RowsMut::F32(v),
        ObsBuf::U8(v) => RowsMut::U8(v),
    }
}

impl<'a> RowsMut<'a> {
    /// These rows cut into shares of `len` elements (`len` at least 1: observations of one element).
    fn chunks(self, len: usize) -> Vec<RowsMut<'a>> {
        let len = len.max(1);
        match self {
            RowsMut::F32(v) => v.chunks_mut(len).map(RowsMut::F32).collect(),
            RowsMut::U8(v) => v.chunks_mut(len).map(RowsMut::U8).collect(),
        }
    }
}

/// Reset `env` into `row` of the batch: the buffered path for floats, a copy of the returned frame for u8.
fn reset_row(env: &mut dyn BufferedEnv, seed: Option<u64>, batch: &mut RowsMut<'_>, row: Range<usize>) -> Result<()> {
    match batch {
        RowsMut::F32(v) => env.reset_into(seed, &mut v[row]),
        RowsMut::U8(v) => {
            let (obs, _) = env.reset(seed)?;
            copy_frame(env.id(), obs, &mut v[row])
        }
    }
}

/// Step `env` into `row` of the batch, as [`reset_row`].
fn step_row(
    env: &mut dyn BufferedEnv,
    action: Action<'_>,
    batch: &mut RowsMut<'_>,
    row: Range<usize>,
) -> Result<StepOutcome> {
    match batch {
        RowsMut::F32(v) => env.step_into(action, &mut v[row]),
        RowsMut::U8(v) => {
            let step = env.step(action)?;
            copy_frame(env.id(), step.obs, &mut v[row])?;
            Ok(StepOutcome { reward: step.reward, terminated: step.terminated, truncated: step.truncated })
        }
    }
}

fn copy_frame(id: &str, obs: Obs, out: &mut [u8]) -> Result<()> {
    match obs {
        Obs::U8(v) if v.len() == out.len() => {
            out.copy_from_slice(&v);
            Ok(())
        }
        other => Err(Error::Backend {
            env: id.to_string(),
            detail: format!(
                "returned {} {} values for a u8 observation space of {} elements",
                other.len(),
                if other.as_f32().is_some() { "f32" } else { "u8" },
                out.len()
            ),
        }),
    }
}

fn copy_row(from: &RowsMut<'_>, to: &mut RowsMut<'_>, row: Range<usize>) {
    match (from, to) {
        (RowsMut::F32(a), RowsMut::F32(b)) => b[row.clone()].copy_from_slice(&a[row]),
        (RowsMut::U8(a), RowsMut::U8(b)) => b[row.clone()].copy_from_slice(&a[row]),
        _ => unreachable!("a VecEnv's buffers share one dtype"),
    }
}

/// Builds the whole batch for ids of one backend that steps envs in a batched engine of its own
/// ([`register_vector_backend`]): `(id without prefix, kwargs, num_envs, role)`.
pub type VectorMaker = fn(id: &str, kwargs: &Kwargs, n: usize, role: EnvRole) -> Result<Box<dyn VectorEnv>>;

static VECTOR_BACKENDS: std::sync::RwLock<Vec<(&'static str, VectorMaker)>> = std::sync::RwLock::new(Vec::new());

/// Let [`make_vector`] build ids `"<prefix>:<id>"` with `maker` (flotilla-envs-python registers `"atari"`).
pub fn register_vector_backend(prefix: &'static str, maker: VectorMaker) {
    let mut backends = VECTOR_BACKENDS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    backends.retain(|(p, _)| *p != prefix);
    backends.push((prefix, maker));
}

/// `n` envs of `id` as a batch for `role`: a registered vector backend's own batch for its prefix, else a
/// [`VecEnv`] of [`registry::make_buffered`] envs (native ids, `"gymnasium:"` ids), the same for both roles.
pub fn make_vector(id: &str, kwargs: &Kwargs, n: usize, role: EnvRole) -> Result<Box<dyn VectorEnv>> {
    if let Some((prefix, rest)) = id.split_once(':') {
        let maker = {
            let backends = VECTOR_BACKENDS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            backends.iter().find(|(p, _)| *p == prefix).map(|(_, m)| *m)
        };
        if let Some(maker) = maker {
            return maker(rest, kwargs, n, role);
        }
    }
    Ok(Box::new(VecEnv::make(id, kwargs, n)?))
}

/// Check a batch of actions for `n` envs of `action_space` (`action_dim` values per env for a `Box`) before
/// any env steps: the count, discrete actions in range, continuous values finite. Errors name the env `id`.
pub(crate) fn check_vec_actions(
    id: &str,
    action_space: &Space,
    action_dim: usize,
    n: usize,
    actions: &VecActions<'_>,
) -> Result<()> {
    let invalid = |detail: String| Error::InvalidAction { env: id.to_string(), detail };
    match (*actions, action_space) {
        (VecActions::Discrete(a), Space::Discrete { n: size, start }) => {
            if a.len() != n {
                return Err(invalid(format!("{} discrete actions for {n} envs", a.len())));
            }
            let end = start.saturating_add(*size as i64);
            if let Some(i) = a.iter().position(|x| !(*start..end).contains(x)) {
                return Err(invalid(format!("action {} for env {i} is outside {start}..{end}", a[i])));
            }
        }
        (VecActions::Continuous(a), Space::Box { .. }) => {
            let want = n * action_dim;
            if a.len() != want {
                return Err(invalid(format!(
                    "{} continuous values for {n} envs of action dimension {}, expected {want}",
                    a.len(),
                    action_dim
                )));
            }
            if let Some(j) = a.iter().position(|x| !x.is_finite()) {
                let env = j / action_dim.max(1);
                return Err(invalid(format!("action value {} for env {env} is not finite", a[j])));
            }
        }
        (VecActions::Discrete(_), space) => {
            return Err(invalid(format!("discrete actions given for the action space {space:?}")));
        }
        (VecActions::Continuous(_), space) => {
            return Err(invalid(format!("continuous actions given for the action space {space:?}")));
        }
    }
    Ok(())
}
