//! `atari:<game>` envs, built as training builds them (`make_vector`) and stepped through the `VectorEnv`
//! contract, against ale-py driven from Python with Gymnasium's default next-step auto-reset, on the same seed
//! and actions: frame for frame, clipped rewards, flags, across life losses and game ends (the dummy reset step
//! of next-step auto-reset skipped), with the true final frames kept and whole-game scores; and the settings
//! from `[env] kwargs`.
use flotilla_core::{Error, ObsBuf, ObsRef};
use flotilla_envs::{EnvRole, Kwargs, VecActions, make_vector};
use flotilla_envs_python::{AtariConfig, AtariVecEnv};
use pyo3::prelude::*;
use pyo3::types::PyModule;

/// One step of the Python reference: frames, raw reward, terminated, truncated, lives.
type Record = (Vec<u8>, f32, bool, bool, i64);

const REFERENCE: &std::ffi::CStr = cr#"
import numpy as np
from ale_py.vector_env import AtariVectorEnv

def reference(game, seed, actions):
    env = AtariVectorEnv(game, 1, num_threads=1, autoreset_mode="NextStep", episodic_life=False,
                         reward_clipping=False, repeat_action_probability=0.25)
    obs, info = env.reset(seed=seed)
    out = [(obs[0].tobytes(), 0.0, False, False, int(info["lives"][0]))]
    for a in actions:
        o, r, te, tr, info = env.step(np.array([a], dtype=np.int64))
        out.append((o[0].tobytes(), float(r[0]), bool(te[0]), bool(tr[0]), int(info["lives"][0])))
    return out
"#;

fn reference(game: &str, seed: u64, actions: &[i64]) -> Vec<Record> {
    Python::attach(|py| {
        // The crate made the venv importable when the env under test was built.
        let module = PyModule::from_code(py, REFERENCE, c"reference.py", c"reference").unwrap();
        module.getattr("reference").unwrap().call1((game, seed, actions.to_vec())).unwrap().extract().unwrap()
    })
}

/// A fixed, varied action sequence (an LCG), the same for every run.
fn actions(n: usize, n_actions: i64) -> Vec<i64> {
    let mut x = 12345u64;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % n_actions as u64) as i64
        })
        .collect()
}

#[test]
fn breakout_matches_ale_py_frame_for_frame_across_life_losses_and_game_ends() {
    flotilla_envs_python::register();
    let mut env = make_vector("atari:Breakout", &Kwargs::new(), 1, EnvRole::Training).unwrap();
    let seed = 7;
    let first = env.reset(Some(seed)).unwrap().to_buf();
    let ObsBuf::U8(first) = first else { panic!("frames are u8") };
    assert_eq!(first.len(), 4 * 84 * 84);
    let ours = actions(900, 4);
    // Our run, recorded.
    let mut steps = Vec::new();
    let mut next = ObsBuf::U8(Vec::new());
    for &a in &ours {
        let step = env.step(&VecActions::Discrete(&[a])).unwrap();
        let ended = step.episodes.first().copied();
        let frames = |o: ObsRef<'_>| match o {
            ObsRef::U8(v) => v.to_vec(),
            ObsRef::F32(_) => panic!("frames are u8"),
        };
        step.true_next_obs(&mut next);
        let final_obs = step.final_obs(0).map(frames);
        // The bootstrap observation is the final one where an episode ended, else the current one.
        assert_eq!(frames(next.as_ref()), final_obs.clone().unwrap_or_else(|| frames(step.obs)));
        steps.push((frames(step.obs), final_obs, step.rewards[0], step.terminated[0], step.truncated[0], ended));
    }
    // The reference takes one extra (ignored) action after each game end: next-step auto-reset. After a lost
    // life (the game going on) the next three steps play NOOP, FIRE, 2 whatever we chose (CleanRL's wrappers).
    let mut ref_actions = Vec::new();
    let mut relaunch = 3;
    for (a, s) in ours.iter().zip(&steps) {
        ref_actions.push([0, 1, 2].get(relaunch).copied().unwrap_or(*a));
        relaunch += 1;
        let (terminated, game_ended) = (s.3, s.5.is_some());
        if game_ended {
            ref_actions.push(0);
            relaunch = 3;
        } else if terminated {
            relaunch = 0;
        }
    }
    assert!(ref_actions.iter().zip(&ours).filter(|(r, o)| r != o).count() > 0, "the relaunch replaced actions");
    let r = reference("breakout", seed, &ref_actions);
    assert_eq!(first, r[0].0, "reset frames");
    let (mut j, mut games, mut life_losses, mut score) = (1, 0, 0, 0.0f64);
    let mut prev_lives = r[0].4;
    for (t, (obs, final_obs, clipped, terminated, truncated, ended)) in steps.into_iter().enumerate() {
        let (ref_obs, raw, ref_te, ref_tr, ref_lives) = &r[j];
        assert_eq!(clipped, raw.signum() * f32::from(*raw != 0.0), "step {t}: clipped reward");
        score += f64::from(*raw);
        let game_over = *ref_te || *ref_tr;
        let life_lost = !game_over && *ref_lives < prev_lives;
        assert_eq!(terminated, *ref_te || life_lost, "step {t}: terminated (life lost {life_lost})");
        assert_eq!(truncated, *ref_tr, "step {t}: truncated");
        if game_over {
            // Next-step auto-reset shows the final frames now and the new game's first frames one call later.
            assert_eq!(final_obs.as_deref(), Some(&ref_obs[..]), "step {t}: final frames of the game");
            assert_eq!(obs, r[j + 1].0, "step {t}: first frames of the next game");
            let ended = ended.expect("a whole game ended");
            assert_eq!(ended.episode_return, score, "step {t}: game score");
            games += 1;
            score = 0.0;
            prev_lives = r[j + 1].4;
            j += 2;
        } else {
            assert_eq!(&obs, ref_obs, "step {t}: frames");
            assert!(ended.is_none());
            if life_lost {
                life_losses += 1;
                assert_eq!(final_obs.as_deref(), Some(&obs[..]), "step {t}: the game goes on after a lost life");
            } else {
                assert!(final_obs.is_none(), "step {t}: no episode ended");
            }
            prev_lives = *ref_lives;
            j += 1;
        }
    }
    assert!(games >= 1 && life_losses >= 4, "the run covered {games} games and {life_losses} life losses");
}

/// Steps of NOOP (the agent never fires) until the game ends, or `None` within `limit` steps.
fn noop_game_length(game: &str, fire_after_life_loss: bool, limit: usize) -> Option<usize> {
    let config = AtariConfig { fire_after_life_loss, ..AtariConfig::training(game) };
    let mut env = AtariVecEnv::new(config, 1).unwrap();
    env.reset(Some(3)).unwrap();
    let mut life_losses = 0;
    for t in 1..=limit {
        env.step(&[0]).unwrap();
        if !env.episodes().is_empty() {
            assert!(life_losses >= 2, "{game}: the game ended after {life_losses} lost lives");
            return Some(t);
        }
        life_losses += usize::from(env.terminated()[0]);
    }
    None
}

#[test]
fn after_a_lost_life_the_game_is_relaunched_as_cleanrl_does() {
    // Without the relaunch a NOOP agent's Breakout waits forever for FIRE after its first lost life, and
    // BeamRider for FIRE and UP; with it, each game is played to its end.
    for game in ["breakout", "beam_rider"] {
        let relaunched = noop_game_length(game, true, 4000);
        assert!(relaunched.is_some(), "{game}: a NOOP game with the relaunch ends");
        assert_eq!(noop_game_length(game, false, 4000), None, "{game}: a NOOP game without it stalls");
    }
    let kwargs = Kwargs::new().with("fire_after_life_loss", false);
    let env = make_vector("atari:breakout", &kwargs, 1, EnvRole::Training).unwrap();
    assert_eq!(env.resolved_kwargs().get("fire_after_life_loss"), Some(&flotilla_envs::KwargValue::Bool(false)));
}

#[test]
fn bad_input_is_named() {
    let e = AtariVecEnv::new(AtariConfig::training("pongg"), 1).unwrap_err();
    assert!(matches!(&e, Error::UnknownEnv { known, .. } if known.contains("pong")), "{e}");
    let mut env = AtariVecEnv::new(AtariConfig::evaluation("pong"), 2).unwrap();
    assert!(matches!(env.step(&[0, 0]), Err(Error::ResetNeeded { .. })));
    env.reset(Some(1)).unwrap();
    let e = env.step(&[0, 6]).unwrap_err().to_string();
    assert!(e.contains("action 6 outside Discrete(6)"), "{e}");
    assert!(env.step(&[0]).unwrap_err().to_string().contains("1 actions for 2 envs"));
    env.step(&[1, 2]).unwrap();
}

#[test]
fn settings_come_from_kwargs_and_evaluation_plays_whole_games() {
    flotilla_envs_python::register();
    let kwargs = Kwargs::new().with("repeat_action_probability", 0.0).with("noop_max", 0i64);
    let train = make_vector("atari:pong", &kwargs, 2, EnvRole::Training).unwrap();
    let resolved = train.resolved_kwargs();
    assert_eq!(resolved.get("repeat_action_probability"), Some(&flotilla_envs::KwargValue::Float(0.0)));
    assert_eq!(resolved.get("frameskip"), Some(&flotilla_envs::KwargValue::Int(4)), "defaults are written out");
    assert_eq!(resolved.get("terminal_on_life_loss"), Some(&flotilla_envs::KwargValue::Bool(true)));
    assert_eq!(train.observation_space().shape(), &[4, 84, 84]);
    let eval = make_vector("atari:pong", &kwargs, 1, EnvRole::Evaluation).unwrap();
    assert_eq!(eval.resolved_kwargs().get("terminal_on_life_loss"), Some(&flotilla_envs::KwargValue::Bool(false)));
    assert_eq!(eval.resolved_kwargs().get("clip_rewards"), Some(&flotilla_envs::KwargValue::Bool(false)));
    for (kwargs, what) in [
        (Kwargs::new().with("repeat_action_probability", 1.5), "not a probability"),
        (Kwargs::new().with("frameskip", 0i64), "expected an integer ≥ 1"),
        (Kwargs::new().with("sticky", true), "unknown argument; Atari envs take repeat_action_probability"),
        (Kwargs::new().with("clip_rewards", 1i64), "expected true or false"),
    ] {
        let e = make_vector("atari:pong", &kwargs, 1, EnvRole::Training).err().expect("refused").to_string();
        assert!(e.contains(what), "{e}");
    }
    let e = make_vector("atari:Pongg", &Kwargs::new(), 1, EnvRole::Training).err().expect("unknown").to_string();
    assert!(e.contains("pongg") && e.contains("breakout"), "an unknown game lists the known ones: {e}");
}
