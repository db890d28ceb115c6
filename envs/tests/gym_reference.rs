//! Replays transitions recorded from Python Gymnasium (`scripts/gym_reference.py`, files in
//! `tests/data/`) through the native envs inside their `TimeLimit`.
//!
//! For every recorded rollout: reset, set the physical state (and, for MountainCarContinuous, whether
//! NumPy held it as f32) and the elapsed step count, then step with the recorded actions and compare:
//! observation and reward within 1e-5, `terminated` exactly, `truncated` exactly under our one rule
//! change (Gymnasium reports both flags when the last allowed step also terminates; our `TimeLimit`
//! lets `terminated` win), and the physical state within 1e-8. Bit-exact matches are counted and
//! printed (`cargo test -- --nocapture`): on the machine that recorded the data they should be all.

use std::fs;
use std::path::{Path, PathBuf};

use flotilla_core::{Action, Env};
use flotilla_envs::{
    Acrobot, CartPole, CartPoleConfig, KwargValue, Kwargs, MountainCar, MountainCarConfig, MountainCarContinuous,
    MountainCarContinuousConfig, Pendulum, PendulumConfig, TimeLimit, registered,
};

const OBS_TOL: f64 = 1e-5;
const REWARD_TOL: f64 = 1e-5;
const STATE_TOL: f64 = 1e-8;

#[derive(Debug)]
enum RefAction {
    Discrete(i64),
    Continuous(Vec<f32>),
}

#[derive(Debug)]
struct RefStep {
    line: usize,
    action: RefAction,
    obs: Vec<f32>,
    reward: f64,
    terminated: bool,
    truncated: bool,
    state: Vec<f64>,
}

#[derive(Debug)]
struct Rollout {
    elapsed: usize,
    f32_state: bool,
    state: Vec<f64>,
    steps: Vec<RefStep>,
}

#[derive(Debug)]
struct RefFile {
    name: String,
    id: String,
    max_episode_steps: usize,
    kwargs: Kwargs,
    rollouts: Vec<Rollout>,
}

/// Tokens of one line, with the file and line number for messages.
struct Tokens<'a> {
    it: std::str::SplitWhitespace<'a>,
    at: String,
}

impl<'a> Tokens<'a> {
    fn next(&mut self) -> &'a str {
        self.it.next().unwrap_or_else(|| panic!("{}: line ends early", self.at))
    }
    fn parse<T: std::str::FromStr>(&mut self) -> T {
        let tok = self.next();
        tok.parse().unwrap_or_else(|_| panic!("{}: cannot parse {tok:?}", self.at))
    }
    fn list<T: std::str::FromStr>(&mut self) -> Vec<T> {
        let n: usize = self.parse();
        (0..n).map(|_| self.parse()).collect()
    }
    fn flag(&mut self) -> bool {
        match self.next() {
            "0" => false,
            "1" => true,
            other => panic!("{}: expected 0 or 1, got {other:?}", self.at),
        }
    }
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("data")
}

fn parse(path: &Path) -> RefFile {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut file = RefFile {
        name: name.clone(),
        id: String::new(),
        max_episode_steps: 0,
        kwargs: Kwargs::new(),
        rollouts: vec![],
    };
    let mut discrete = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut t = Tokens { it: line.split_whitespace(), at: format!("{name}:{}", i + 1) };
        match t.next() {
            "env" => {
                file.id = t.next().to_string();
                discrete = matches!(file.id.as_str(), "CartPole-v1" | "Acrobot-v1" | "MountainCar-v0");
            }
            "max_episode_steps" => file.max_episode_steps = t.parse(),
            "kwarg" => {
                let key = t.next().to_string();
                let value = match t.next() {
                    "f" => KwargValue::Float(t.parse()),
                    "i" => KwargValue::Int(t.parse()),
                    "b" => KwargValue::Bool(t.flag()),
                    other => panic!("{}: unknown kwarg type {other:?}", t.at),
                };
                file.kwargs.insert(key, value);
            }
            "rollout" => {
                let elapsed = t.parse();
                let f32_state = match t.next() {
                    "f64" => false,
                    "f32" => true,
                    other => panic!("{}: unknown dtype {other:?}", t.at),
                };
                file.rollouts.push(Rollout { elapsed, f32_state, state: t.list(), steps: vec![] });
            }
            "step" => {
                let action = if discrete {
                    let a: Vec<i64> = t.list();
                    assert_eq!(a.len(), 1, "{}: discrete action of {} values", t.at, a.len());
                    RefAction::Discrete(a[0])
                } else {
                    RefAction::Continuous(t.list())
                };
                let step = RefStep {
                    line: i + 1,
                    action,
                    obs: t.list(),
                    reward: t.parse(),
                    terminated: t.flag(),
                    truncated: t.flag(),
                    state: t.list(),
                };
                let rollout = file.rollouts.last_mut().unwrap_or_else(|| panic!("{}: step before rollout", t.at));
                rollout.steps.push(step);
            }
            other => panic!("{}: unknown record {other:?}", t.at),
        }
    }
    assert!(!file.id.is_empty(), "{name}: no env line");
    file
}

/// Reference files for one id (the default-kwargs file and its variants).
fn files_for(id: &str) -> Vec<RefFile> {
    let mut paths: Vec<PathBuf> = fs::read_dir(data_dir())
        .expect("tests/data exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    paths.sort();
    let files: Vec<RefFile> = paths.iter().map(|p| parse(p)).filter(|f| f.id == id).collect();
    assert!(!files.is_empty(), "no reference files for {id} in {}", data_dir().display());
    for f in &files {
        if f.kwargs.is_empty() {
            let spec = registered().iter().find(|s| s.id == id).expect("registered");
            assert_eq!(spec.max_episode_steps, Some(f.max_episode_steps), "{}: registry time limit", f.name);
        }
    }
    files
}

#[derive(Default)]
struct Summary {
    transitions: usize,
    exact_obs: usize,
    exact_reward: usize,
    exact_state: usize,
    max_obs_err: f64,
    max_state_err: f64,
}

/// Replays `file` on `env`; `set_f32` sets a state NumPy held as float32 (MountainCarContinuous only).
fn replay<E: Env>(file: &RefFile, mut env: TimeLimit<E>, set_f32: Option<fn(&mut E, &[f64])>) -> Summary {
    let mut s = Summary::default();
    for (r, rollout) in file.rollouts.iter().enumerate() {
        env.reset(Some(r as u64)).expect("reset");
        match (rollout.f32_state, set_f32) {
            (false, _) => env.set_state(&rollout.state).expect("set_state"),
            (true, Some(set)) => set(env.inner_mut(), &rollout.state),
            (true, None) => panic!("{}: f32 state for an env without an f32 setter", file.name),
        }
        env.set_elapsed_steps(rollout.elapsed);
        for step in &rollout.steps {
            let at = format!("{}:{}", file.name, step.line);
            let action = match &step.action {
                RefAction::Discrete(a) => Action::Discrete(*a),
                RefAction::Continuous(a) => Action::Continuous(a),
            };
            let got = env.step(action).unwrap_or_else(|e| panic!("{at}: step failed: {e}"));
            let obs = got.obs.as_f32().expect("f32 observation");
            assert_eq!(obs.len(), step.obs.len(), "{at}: observation length");
            let obs_err = obs.iter().zip(&step.obs).map(|(a, b)| (*a as f64 - *b as f64).abs()).fold(0.0, f64::max);
            assert!(obs_err <= OBS_TOL, "{at}: obs {obs:?}, Gymnasium {:?}", step.obs);
            assert!(
                (got.reward - step.reward).abs() <= REWARD_TOL,
                "{at}: reward {}, Gymnasium {}",
                got.reward,
                step.reward
            );
            assert_eq!(got.terminated, step.terminated, "{at}: terminated");
            assert_eq!(got.truncated, step.truncated, "{at}: truncated");
            let state = env.state().expect("state");
            assert_eq!(state.len(), step.state.len(), "{at}: state length");
            let state_err = state.iter().zip(&step.state).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(state_err <= STATE_TOL, "{at}: state {state:?}, Gymnasium {:?}", step.state);
            s.transitions += 1;
            s.exact_obs += usize::from(obs.iter().zip(&step.obs).all(|(a, b)| a.to_bits() == b.to_bits()));
            s.exact_reward += usize::from(got.reward.to_bits() == step.reward.to_bits());
            s.exact_state += usize::from(state.iter().zip(&step.state).all(|(a, b)| a.to_bits() == b.to_bits()));
            s.max_obs_err = s.max_obs_err.max(obs_err);
            s.max_state_err = s.max_state_err.max(state_err);
        }
    }
    println!(
        "{}: {} transitions; bit-exact obs {}, rewards {}, states {}; max |obs err| {:e}, max |state err| {:e}",
        file.name, s.transitions, s.exact_obs, s.exact_reward, s.exact_state, s.max_obs_err, s.max_state_err
    );
    assert!(s.transitions >= 100, "{}: only {} transitions", file.name, s.transitions);
    s
}

#[test]
fn cartpole_matches_gymnasium() {
    for file in files_for("CartPole-v1") {
        let config = CartPoleConfig::from_kwargs(&file.kwargs).expect("kwargs");
        let env = CartPole::new(config).expect("config");
        replay(&file, TimeLimit::new(env, file.max_episode_steps), None);
    }
}

#[test]
fn acrobot_matches_gymnasium() {
    for file in files_for("Acrobot-v1") {
        assert!(file.kwargs.is_empty(), "Acrobot takes no kwargs");
        replay(&file, TimeLimit::new(Acrobot::new(), file.max_episode_steps), None);
    }
}

#[test]
fn mountain_car_matches_gymnasium() {
    for file in files_for("MountainCar-v0") {
        let env = MountainCar::new(MountainCarConfig::from_kwargs(&file.kwargs).expect("kwargs")).expect("config");
        replay(&file, TimeLimit::new(env, file.max_episode_steps), None);
    }
}

#[test]
fn mountain_car_continuous_matches_gymnasium() {
    fn set_f32(env: &mut MountainCarContinuous, state: &[f64]) {
        env.set_physical_state_f32([state[0] as f32, state[1] as f32]).expect("set f32 state");
    }
    for file in files_for("MountainCarContinuous-v0") {
        let config = MountainCarContinuousConfig::from_kwargs(&file.kwargs).expect("kwargs");
        let env = MountainCarContinuous::new(config).expect("config");
        replay(&file, TimeLimit::new(env, file.max_episode_steps), Some(set_f32));
    }
}

#[test]
fn pendulum_matches_gymnasium() {
    for file in files_for("Pendulum-v1") {
        let env = Pendulum::new(PendulumConfig::from_kwargs(&file.kwargs).expect("kwargs")).expect("config");
        replay(&file, TimeLimit::new(env, file.max_episode_steps), None);
    }
}
