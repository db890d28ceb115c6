//! [`AtariVecEnv`]: ale-py's C++ vector env with Flotilla's same-step auto-reset contract and u8 frames.
//!
//! ```text
//! actions ─► after a lost life, in FIRE games: NOOP, FIRE, 2 in place of the agent's next three (CleanRL)
//! ale_py.vector_env.AtariVectorEnv(game, E, autoreset_mode="SameStep", episodic_life=False,
//!                                  reward_clipping=False, noop_max=30, frameskip=4, maxpool, 84×84 grey,
//!                                  stack_num=4, use_fire_reset, repeat_action_probability=0.25 (v5))
//!   step(actions) ─► frames [E, 4, 84, 84] u8, raw rewards, terminated, truncated, lives, final_obs
//!   here: game over (terminated or truncated)  ─► keep the final frames, count the game's score and length
//!         a life lost (terminal_on_life_loss)   ─► terminated for the learner, the game goes on: the final
//!                                                 observation is the current one (Gymnasium's
//!                                                 AtariPreprocessing(terminal_on_life_loss=True))
//!         clip_rewards                           ─► rewards() are sign(raw); raw_rewards() keep the score
//! ```
//! ale-py's own `episodic_life` is not used: with auto-reset it restarts the whole game on every life lost
//! (measured: Breakout always shows 5 lives after such a reset), which changes the game's state distribution.
use flotilla_core::{DType, EpisodeStats, Error, ObsRef, Result, Space};
use flotilla_envs::{EnvRole, KwargValue, Kwargs, VecActions, VecEnvSnapshot, VecStep, VectorEnv};
use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::interpreter::with_python;

/// How the Atari envs are made; the defaults are Gymnasium's `ALE/<Game>-v5` + `AtariPreprocessing` +
/// `FrameStackObservation(4)`, with CleanRL's training choices (life loss ends a training episode, rewards
/// clipped). Evaluation turns both off.
#[derive(Debug, Clone, PartialEq)]
pub struct AtariConfig {
    /// ROM name in snake case, e.g. `"pong"`, `"breakout"`.
    pub game: String,
    /// Sticky actions: probability of repeating the previous action (v5: 0.25).
    pub repeat_action_probability: f32,
    /// Emulator frames per agent step (max-pooled over the last two).
    pub frameskip: usize,
    /// Up to this many no-op actions after each reset.
    pub noop_max: usize,
    /// Frames stacked per observation.
    pub stack_num: usize,
    /// Side of the square grey-scale frame.
    pub img_size: usize,
    /// Press FIRE after a reset in games that need it.
    pub use_fire_reset: bool,
    /// In games whose action 1 is FIRE (and that have at least 3 actions), the three agent steps after a lost
    /// life (the game not over) play NOOP, FIRE and action 2 whatever the agent chose: CleanRL's
    /// `FireResetEnv` under `EpisodicLifeEnv`, which presses them after every lost life (Breakout does not
    /// relaunch the ball, nor BeamRider go on, without them). The agent's action on those steps has no effect.
    pub fire_after_life_loss: bool,
    /// All 18 actions rather than the game's minimal set.
    pub full_action_space: bool,
    /// Emulator frames after which a game is truncated (v5: 108,000, 30 minutes).
    pub max_num_frames_per_episode: usize,
    /// A lost life ends the (training) episode; the game goes on.
    pub terminal_on_life_loss: bool,
    /// `rewards()` are clipped to {−1, 0, 1}.
    pub clip_rewards: bool,
    /// ALE worker threads (0: one per env).
    pub num_threads: usize,
}

impl AtariConfig {
    /// Training settings for `game` (life loss terminal, rewards clipped), one emulator thread.
    pub fn training(game: &str) -> Self {
        AtariConfig {
            game: game.to_string(),
            repeat_action_probability: 0.25,
            frameskip: 4,
            noop_max: 30,
            stack_num: 4,
            img_size: 84,
            use_fire_reset: true,
            fire_after_life_loss: true,
            full_action_space: false,
            max_num_frames_per_episode: 108_000,
            terminal_on_life_loss: true,
            clip_rewards: true,
            num_threads: 1,
        }
    }

    /// Evaluation settings: whole games, unclipped scores.
    pub fn evaluation(game: &str) -> Self {
        AtariConfig { terminal_on_life_loss: false, clip_rewards: false, ..Self::training(game) }
    }
}

/// What CleanRL's wrappers play after a lost life, as indices into the game's action set: `EpisodicLifeEnv`'s
/// NOOP, then `FireResetEnv`'s FIRE and action 2.
const RELAUNCH: [i64; 3] = [0, 1, 2];

/// `num_envs` Atari games stepped in one batch by ale-py, with same-step auto-reset.
pub struct AtariVecEnv {
    id: String,
    env: Py<PyAny>,
    numpy: Py<PyModule>,
    config: AtariConfig,
    n: usize,
    obs_dim: usize,
    observation_space: Space,
    action_space: Space,
    obs: Vec<u8>,
    final_obs: Vec<u8>,
    has_final: Vec<bool>,
    raw_rewards: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    lives: Vec<i64>,
    /// The lives ale-py reports after a step, before they replace `lives`.
    new_lives: Vec<i64>,
    n_actions: usize,
    /// The game's action 1 is FIRE (and it has ≥ 3 actions): [`AtariConfig::fire_after_life_loss`] applies.
    has_fire: bool,
    /// Per env: how many of [`RELAUNCH`]'s actions it has played since its last lost life (`RELAUNCH.len()`:
    /// none pending).
    relaunch: Vec<usize>,
    /// The actions sent to ale-py: the agent's, with [`RELAUNCH`] in place after a lost life.
    sent: Vec<i64>,
    scores: Vec<f64>,
    lengths: Vec<u64>,
    episodes: Vec<EpisodeStats>,
    ready: bool,
}

impl std::fmt::Debug for AtariVecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtariVecEnv").field("id", &self.id).field("num_envs", &self.n).finish_non_exhaustive()
    }
}

/// Copy a NumPy array (any shape) into `out`, as `T`, through one contiguous buffer.
fn copy_into<'py, T: numpy::Element + Copy>(
    np: &Bound<'py, PyModule>,
    array: &Bound<'py, PyAny>,
    dtype: &str,
    out: &mut [T],
) -> PyResult<()> {
    // Fast path: ale-py hands back contiguous arrays of the wanted dtype; read their buffer as it is.
    if let Ok(direct) = array.extract::<PyReadonlyArrayDyn<'py, T>>()
        && let Ok(src) = direct.as_slice()
        && src.len() == out.len()
    {
        out.copy_from_slice(src);
        return Ok(());
    }
    let flat = np.call_method1("ascontiguousarray", (array, dtype))?.call_method0("ravel")?;
    let flat = flat.extract::<PyReadonlyArray1<T>>()?;
    let src = flat.as_slice()?;
    if src.len() != out.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "expected {} values from ale-py, got {}",
            out.len(),
            src.len()
        )));
    }
    out.copy_from_slice(src);
    Ok(())
}

impl AtariVecEnv {
    /// `num_envs` games as `config` says. An unknown game lists the ROMs ale-py has.
    pub fn new(config: AtariConfig, num_envs: usize) -> Result<Self> {
        let id = format!("atari:{}", config.game);
        if num_envs == 0 {
            return Err(Error::BadArgument { env: id, key: "num_envs".into(), detail: "need at least one".into() });
        }
        let c = &config;
        let made = with_python(&id, "creating ale_py.vector_env.AtariVectorEnv", |py| {
            let roms: Vec<String> = py.import("ale_py.roms")?.call_method0("get_all_rom_ids")?.extract()?;
            if !roms.contains(&c.game) {
                return Ok(Err(roms));
            }
            let kwargs = PyDict::new(py);
            for (k, v) in [
                ("num_threads", c.num_threads.into_pyobject(py)?.into_any()),
                ("frameskip", c.frameskip.into_pyobject(py)?.into_any()),
                ("noop_max", c.noop_max.into_pyobject(py)?.into_any()),
                ("stack_num", c.stack_num.into_pyobject(py)?.into_any()),
                ("img_height", c.img_size.into_pyobject(py)?.into_any()),
                ("img_width", c.img_size.into_pyobject(py)?.into_any()),
                ("max_num_frames_per_episode", c.max_num_frames_per_episode.into_pyobject(py)?.into_any()),
                ("repeat_action_probability", c.repeat_action_probability.into_pyobject(py)?.into_any()),
            ] {
                kwargs.set_item(k, v)?;
            }
            for (k, v) in [
                ("use_fire_reset", c.use_fire_reset),
                ("full_action_space", c.full_action_space),
                ("episodic_life", false),
                ("reward_clipping", false),
                ("grayscale", true),
                ("maxpool", true),
            ] {
                kwargs.set_item(k, v)?;
            }
            kwargs.set_item("autoreset_mode", "SameStep")?;
            let env = py
                .import("ale_py.vector_env")?
                .getattr("AtariVectorEnv")?
                .call((c.game.as_str(), num_envs), Some(&kwargs))?;
            let n_actions: usize = env.getattr("single_action_space")?.getattr("n")?.extract()?;
            let action_set = env.getattr("ale")?.call_method0("get_action_set")?;
            let fire = py.import("ale_py")?.getattr("Action")?.getattr("FIRE")?;
            let has_fire = n_actions >= 3 && action_set.get_item(1)?.eq(fire)?;
            Ok(Ok((env.unbind(), py.import("numpy")?.unbind(), n_actions, has_fire)))
        })?;
        let (env, numpy, n_actions, has_fire) =
            made.map_err(|roms| Error::UnknownEnv { id: id.clone(), known: roms.join(", ") })?;
        let shape = vec![config.stack_num, config.img_size, config.img_size];
        let obs_dim: usize = shape.iter().product();
        let observation_space =
            Space::Box { low: vec![0.0; obs_dim], high: vec![255.0; obs_dim], shape, dtype: DType::U8 };
        let n = num_envs;
        Ok(AtariVecEnv {
            id,
            env,
            numpy,
            config,
            n,
            obs_dim,
            observation_space,
            action_space: Space::discrete(n_actions),
            obs: vec![0; n * obs_dim],
            final_obs: vec![0; n * obs_dim],
            has_final: vec![false; n],
            raw_rewards: vec![0.0; n],
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            lives: vec![0; n],
            new_lives: vec![0; n],
            n_actions,
            has_fire,
            relaunch: vec![RELAUNCH.len(); n],
            sent: vec![0; n],
            scores: vec![0.0; n],
            lengths: vec![0; n],
            episodes: Vec::with_capacity(n),
            ready: false,
        })
    }

    /// `"atari:<game>"`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The settings the envs were made with.
    pub fn config(&self) -> &AtariConfig {
        &self.config
    }

    /// Number of envs.
    pub fn num_envs(&self) -> usize {
        self.n
    }

    /// One observation: `stack_num × img_size × img_size` u8 frames.
    pub fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    /// The game's (minimal) action set.
    pub fn action_space(&self) -> &Space {
        &self.action_space
    }

    /// Actions in that set (`Discrete(n)`).
    pub fn n_actions(&self) -> usize {
        self.n_actions
    }

    /// Bytes of one observation.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// Reset every game (env `i` seeded `seed + i`, or continuing its stream) and return the first frames.
    pub fn reset(&mut self, seed: Option<u64>) -> Result<&[u8]> {
        let (obs, lives) = (&mut self.obs, &mut self.lives);
        with_python(&self.id, "reset", |py| {
            let kwargs = PyDict::new(py);
            kwargs.set_item("seed", seed)?;
            let out = self.env.bind(py).call_method("reset", (), Some(&kwargs))?;
            let out = out.cast::<PyTuple>()?;
            let np = self.numpy.bind(py);
            copy_into(np, &out.get_item(0)?, "uint8", obs)?;
            copy_into(np, &out.get_item(1)?.get_item("lives")?, "int64", lives)
        })?;
        for v in [&mut self.has_final, &mut self.terminated, &mut self.truncated] {
            v.fill(false);
        }
        self.rewards.fill(0.0);
        self.raw_rewards.fill(0.0);
        self.scores.fill(0.0);
        self.lengths.fill(0);
        self.relaunch.fill(RELAUNCH.len());
        self.episodes.clear();
        self.ready = true;
        Ok(&self.obs)
    }

    /// Step every game with `actions` (one index per env into the action set). Afterwards [`obs`] holds
    /// the next observations (the first of a new game where one ended), [`final_obs`] the true last ones.
    ///
    /// [`obs`]: AtariVecEnv::obs
    /// [`final_obs`]: AtariVecEnv::final_obs
    pub fn step(&mut self, actions: &[i64]) -> Result<()> {
        let bad = |detail: String| Err(Error::InvalidAction { env: self.id.clone(), detail });
        if !self.ready {
            return Err(Error::ResetNeeded { env: self.id.clone() });
        }
        if actions.len() != self.n {
            return bad(format!("{} actions for {} envs", actions.len(), self.n));
        }
        let n_actions = self.n_actions as i64;
        if let Some(a) = actions.iter().find(|a| !(0..n_actions).contains(*a)) {
            return bad(format!("action {a} outside Discrete({n_actions})"));
        }
        for ((sent, &a), played) in self.sent.iter_mut().zip(actions).zip(&mut self.relaunch) {
            *sent = RELAUNCH.get(*played).copied().unwrap_or(a);
            *played = (*played + 1).min(RELAUNCH.len());
        }
        // ale-py's game-over flags land in `terminated` / `truncated`, refined per env below.
        let (obs, final_obs, raw) = (&mut self.obs, &mut self.final_obs, &mut self.raw_rewards);
        let (term, trunc, lives) = (&mut self.terminated, &mut self.truncated, &mut self.new_lives);
        let mut has_game_final = false;
        with_python(&self.id, "step", |py| {
            let np = self.numpy.bind(py);
            let out = self.env.bind(py).call_method1("step", (PyArray1::from_slice(py, &self.sent),))?;
            let out = out.cast::<PyTuple>()?;
            copy_into(np, &out.get_item(0)?, "uint8", obs)?;
            copy_into(np, &out.get_item(1)?, "float32", raw)?;
            copy_into(np, &out.get_item(2)?, "bool", term)?;
            copy_into(np, &out.get_item(3)?, "bool", trunc)?;
            let info = out.get_item(4)?;
            copy_into(np, &info.get_item("lives")?, "int64", lives)?;
            if info.contains("final_obs")? {
                let f = info.get_item("final_obs")?;
                copy_into(np, &f, "uint8", final_obs)?;
                has_game_final = true;
            }
            Ok(())
        })?;
        self.episodes.clear();
        let d = self.obs_dim;
        for i in 0..self.n {
            let r = self.raw_rewards[i];
            self.rewards[i] = if self.config.clip_rewards { r.signum() * f32::from(r != 0.0) } else { r };
            self.scores[i] += f64::from(r);
            self.lengths[i] += 1;
            let (game_terminated, truncated) = (self.terminated[i], self.truncated[i]);
            let game_over = game_terminated || truncated;
            let lost_a_life = self.new_lives[i] < self.lives[i] && !game_over;
            if game_over {
                self.relaunch[i] = RELAUNCH.len();
            } else if lost_a_life && self.has_fire && self.config.fire_after_life_loss {
                self.relaunch[i] = 0;
            }
            let life_lost = self.config.terminal_on_life_loss && lost_a_life;
            self.terminated[i] = game_terminated || life_lost;
            self.has_final[i] = game_over || life_lost;
            if game_over {
                if !has_game_final {
                    return Err(Error::Backend {
                        env: self.id.clone(),
                        detail: format!("env {i} ended a game without reporting its final observation"),
                    });
                }
                self.episodes.push(EpisodeStats {
                    episode_return: self.scores[i],
                    length: self.lengths[i],
                    env_index: i,
                    truncated: truncated && !game_terminated,
                    task: None,
                });
                self.scores[i] = 0.0;
                self.lengths[i] = 0;
            } else if life_lost {
                // The game goes on: the observation after the lost life ends the training episode.
                let (o, f) = (&self.obs[i * d..(i + 1) * d], &mut self.final_obs[i * d..(i + 1) * d]);
                f.copy_from_slice(o);
            }
        }
        std::mem::swap(&mut self.lives, &mut self.new_lives);
        Ok(())
    }

    /// The current observations, `num_envs × obs_dim`.
    pub fn obs(&self) -> &[u8] {
        &self.obs
    }

    /// The true last observation of env `i`'s training episode if it ended in the last step.
    pub fn final_obs(&self, i: usize) -> Option<&[u8]> {
        let d = self.obs_dim;
        self.has_final.get(i).copied().unwrap_or(false).then(|| &self.final_obs[i * d..(i + 1) * d])
    }

    /// Rewards of the last step for learning (clipped when the config says so).
    pub fn rewards(&self) -> &[f32] {
        &self.rewards
    }

    /// The game's own rewards of the last step.
    pub fn raw_rewards(&self) -> &[f32] {
        &self.raw_rewards
    }

    /// Per env: the training episode reached a terminal state (game over, or a life lost when configured).
    pub fn terminated(&self) -> &[bool] {
        &self.terminated
    }

    /// Per env: the game was cut by the frame limit.
    pub fn truncated(&self) -> &[bool] {
        &self.truncated
    }

    /// Lives left per env.
    pub fn lives(&self) -> &[i64] {
        &self.lives
    }

    /// Whole games that ended in the last step: the raw game score and length in agent steps.
    pub fn episodes(&self) -> &[EpisodeStats] {
        &self.episodes
    }
}

impl AtariConfig {
    /// The settings `kwargs` give for `game` in `role` (defaults: [`AtariConfig::training`]). Evaluation always
    /// plays whole games with unclipped scores, whatever the training settings say. Unknown keys, wrong types
    /// and out-of-range values are errors naming the key.
    pub fn from_kwargs(game: &str, kwargs: &Kwargs, role: EnvRole) -> Result<Self> {
        let id = format!("atari:{game}");
        let bad = |key: &str, detail: String| Error::BadArgument { env: id.clone(), key: key.into(), detail };
        let mut c = AtariConfig::training(game);
        for (key, value) in kwargs.iter() {
            let count = |min: i64| match value {
                KwargValue::Int(n) if *n >= min => Ok(*n as usize),
                other => Err(bad(key, format!("expected an integer ≥ {min}, got {other}"))),
            };
            let flag = || match value {
                KwargValue::Bool(b) => Ok(*b),
                other => Err(bad(key, format!("expected true or false, got {other}"))),
            };
            match key {
                "repeat_action_probability" => {
                    let p = match value {
                        KwargValue::Float(p) => *p,
                        KwargValue::Int(p) => *p as f64,
                        other => return Err(bad(key, format!("expected a probability, got {other}"))),
                    };
                    if !(0.0..=1.0).contains(&p) {
                        return Err(bad(key, format!("{p} is not a probability in [0, 1]")));
                    }
                    c.repeat_action_probability = p as f32;
                }
                "frameskip" => c.frameskip = count(1)?,
                "noop_max" => c.noop_max = count(0)?,
                "stack_num" => c.stack_num = count(1)?,
                "img_size" => c.img_size = count(36)?,
                "max_num_frames_per_episode" => c.max_num_frames_per_episode = count(1)?,
                "num_threads" => c.num_threads = count(0)?,
                "use_fire_reset" => c.use_fire_reset = flag()?,
                "fire_after_life_loss" => c.fire_after_life_loss = flag()?,
                "full_action_space" => c.full_action_space = flag()?,
                "terminal_on_life_loss" => c.terminal_on_life_loss = flag()?,
                "clip_rewards" => c.clip_rewards = flag()?,
                other => {
                    return Err(bad(
                        other,
                        format!("unknown argument; Atari envs take {}", AtariConfig::KWARGS.join(", ")),
                    ));
                }
            }
        }
        if role == EnvRole::Evaluation {
            c.terminal_on_life_loss = false;
            c.clip_rewards = false;
        }
        Ok(c)
    }

    /// The keys [`AtariConfig::from_kwargs`] reads.
    pub const KWARGS: &'static [&'static str] = &[
        "repeat_action_probability",
        "frameskip",
        "noop_max",
        "stack_num",
        "img_size",
        "max_num_frames_per_episode",
        "num_threads",
        "use_fire_reset",
        "fire_after_life_loss",
        "full_action_space",
        "terminal_on_life_loss",
        "clip_rewards",
    ];

    /// Every setting as kwargs (what a run's resolved config records).
    pub fn to_kwargs(&self) -> Kwargs {
        let int = |n: usize| KwargValue::Int(n as i64);
        Kwargs::new()
            .with("repeat_action_probability", KwargValue::Float(f64::from(self.repeat_action_probability)))
            .with("frameskip", int(self.frameskip))
            .with("noop_max", int(self.noop_max))
            .with("stack_num", int(self.stack_num))
            .with("img_size", int(self.img_size))
            .with("max_num_frames_per_episode", int(self.max_num_frames_per_episode))
            .with("num_threads", int(self.num_threads))
            .with("use_fire_reset", self.use_fire_reset)
            .with("fire_after_life_loss", self.fire_after_life_loss)
            .with("full_action_space", self.full_action_space)
            .with("terminal_on_life_loss", self.terminal_on_life_loss)
            .with("clip_rewards", self.clip_rewards)
    }
}

/// ale-py's ROM name for a game as configs may write it: `"pong"`, `"Pong"`, `"SpaceInvaders"` →
/// `"space_invaders"`.
pub fn rom_name(game: &str) -> String {
    let mut out = String::with_capacity(game.len() + 4);
    for (i, ch) in game.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 && !out.ends_with('_') {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// `"atari:<game>"` ids for [`flotilla_envs::make_vector`]: registered by [`crate::register`].
pub(crate) fn make_vector(game: &str, kwargs: &Kwargs, n: usize, role: EnvRole) -> Result<Box<dyn VectorEnv>> {
    let config = AtariConfig::from_kwargs(&rom_name(game), kwargs, role)?;
    Ok(Box::new(AtariVecEnv::new(config, n)?))
}

impl VectorEnv for AtariVecEnv {
    fn id(&self) -> &str {
        &self.id
    }
    fn num_envs(&self) -> usize {
        self.n
    }
    fn observation_space(&self) -> &Space {
        &self.observation_space
    }
    fn action_space(&self) -> &Space {
        &self.action_space
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<ObsRef<'_>> {
        AtariVecEnv::reset(self, seed).map(ObsRef::U8)
    }
    fn step(&mut self, actions: &VecActions<'_>) -> Result<VecStep<'_>> {
        let VecActions::Discrete(actions) = *actions else {
            return Err(Error::InvalidAction { env: self.id.clone(), detail: "Atari actions are discrete".into() });
        };
        AtariVecEnv::step(self, actions)?;
        Ok(VecStep::new(
            ObsRef::U8(&self.obs),
            &self.rewards,
            &self.terminated,
            &self.truncated,
            &self.episodes,
            ObsRef::U8(&self.final_obs),
            &self.has_final,
            self.obs_dim,
        ))
    }
    fn obs(&self) -> ObsRef<'_> {
        ObsRef::U8(&self.obs)
    }
    fn snapshot(&self) -> Result<VecEnvSnapshot> {
        Err(Error::Unsupported {
            env: self.id.clone(),
            what: "snapshots (ale-py's vector env cannot save its games)".into(),
        })
    }
    fn restore(&mut self, _snapshot: &VecEnvSnapshot) -> Result<()> {
        Err(Error::Unsupported { env: self.id.clone(), what: "restoring snapshots".into() })
    }
    fn resolved_kwargs(&self) -> Kwargs {
        self.config.to_kwargs()
    }
}
