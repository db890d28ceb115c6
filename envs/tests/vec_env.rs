//! `VecEnv`: same-step auto-reset checked against single envs stepped alongside, episode statistics,
//! seeding, and rejection of bad batches and unbatchable envs.

use flotilla_core::{Action, DType, Env, Error, Info, Obs, ObsBuf, ObsRef, Result, Space, Step};
use flotilla_envs::{Kwargs, VecActions, VecEnv, make};

/// Deterministic action pattern for env `i` at step `t`.
fn discrete_action(i: usize, t: usize, n: i64) -> i64 {
    ((i * 31 + t * 17 + (t * t) % 7) as i64) % n
}

fn continuous_action(i: usize, t: usize) -> f32 {
    (((i * 13 + t * 7) % 9) as f32 - 4.0) * 0.6
}

/// Steps a `VecEnv` and `n` single envs (seeded `seed + i`) side by side for `steps` steps and checks
/// every output, including the kept final observations and the episode statistics.
fn check_against_single_envs(id: &str, kwargs: &Kwargs, n: usize, steps: usize) -> usize {
    let seed = 100;
    let mut venv = VecEnv::make(id, kwargs, n).unwrap();
    let mut singles: Vec<Box<dyn Env>> = (0..n).map(|_| make(id, kwargs).unwrap()).collect();
    let d = venv.obs_dim();
    let first = venv.reset(Some(seed)).unwrap().as_f32().unwrap().to_vec();
    for (i, env) in singles.iter_mut().enumerate() {
        let (obs, _) = env.reset(Some(seed + i as u64)).unwrap();
        assert_eq!(obs.as_f32().unwrap(), &first[i * d..(i + 1) * d]);
    }
    let (mut returns, mut lengths) = (vec![0.0f64; n], vec![0usize; n]);
    let mut finished = 0;
    for t in 0..steps {
        let discrete: Vec<i64> = (0..n)
            .map(|i| match venv.action_space() {
                Space::Discrete { n: size, .. } => discrete_action(i, t, *size as i64),
                Space::Box { .. } => 0,
            })
            .collect();
        let continuous: Vec<f32> = (0..n).map(|i| continuous_action(i, t)).collect();
        let actions = match venv.action_space() {
            Space::Discrete { .. } => VecActions::Discrete(&discrete),
            Space::Box { .. } => VecActions::Continuous(&continuous),
        };
        let out = venv.step(&actions).unwrap();
        let mut expected_episodes = vec![];
        for (i, env) in singles.iter_mut().enumerate() {
            let action = match actions {
                VecActions::Discrete(a) => Action::Discrete(a[i]),
                VecActions::Continuous(a) => Action::Continuous(&a[i..i + 1]),
            };
            let step = env.step(action).unwrap();
            let obs = step.obs.as_f32().unwrap();
            assert_eq!(out.rewards[i], step.reward as f32, "{id} t={t} env {i}");
            assert_eq!(out.terminated[i], step.terminated, "{id} t={t} env {i}");
            assert_eq!(out.truncated[i], step.truncated, "{id} t={t} env {i}");
            returns[i] += step.reward;
            lengths[i] += 1;
            if step.terminated || step.truncated {
                // The true last observation is kept; the batch row already holds the next episode's first.
                assert_eq!(out.final_obs(i), Some(ObsRef::F32(obs)), "{id} t={t} env {i}");
                let (next, _) = env.reset(None).unwrap();
                assert_eq!(
                    out.obs.slice(i * d..(i + 1) * d),
                    ObsRef::F32(next.as_f32().unwrap()),
                    "{id} t={t} env {i}"
                );
                expected_episodes.push((i, returns[i], lengths[i], step.truncated && !step.terminated));
                returns[i] = 0.0;
                lengths[i] = 0;
            } else {
                assert_eq!(out.final_obs(i), None);
                assert_eq!(out.obs.slice(i * d..(i + 1) * d), ObsRef::F32(obs), "{id} t={t} env {i}");
            }
        }
        let got: Vec<_> =
            out.episodes.iter().map(|e| (e.env_index, e.episode_return, e.length as usize, e.truncated)).collect();
        assert_eq!(got, expected_episodes, "{id} t={t}");
        let finals: Vec<_> = (0..n).map(|i| out.final_obs(i).map(|o| o.to_buf())).collect();
        // The accessors on VecEnv agree with the view the step returned.
        assert_eq!((0..n).map(|i| venv_final(&venv, i)).collect::<Vec<_>>(), finals);
        assert_eq!(venv.episodes().len(), got.len());
        finished += got.len();
    }
    finished
}

fn venv_final(venv: &VecEnv, i: usize) -> Option<ObsBuf> {
    venv.final_obs(i).map(|o| o.to_buf())
}

#[test]
fn auto_reset_keeps_the_true_final_obs_discrete() {
    // A short limit so both terminations and truncations happen.
    let kwargs = Kwargs::new().with("max_episode_steps", 25i64);
    let finished = check_against_single_envs("CartPole-v1", &kwargs, 5, 400);
    assert!(finished > 40, "only {finished} episodes finished");
    let finished = check_against_single_envs("Acrobot-v1", &Kwargs::new().with("max_episode_steps", 30i64), 3, 100);
    assert!(finished >= 9, "only {finished} episodes finished");
}

#[test]
fn auto_reset_keeps_the_true_final_obs_continuous() {
    let finished = check_against_single_envs("Pendulum-v1", &Kwargs::new().with("max_episode_steps", 20i64), 4, 100);
    assert_eq!(finished, 4 * 5);
    let finished =
        check_against_single_envs("MountainCarContinuous-v0", &Kwargs::new().with("max_episode_steps", 15i64), 2, 60);
    assert_eq!(finished, 2 * 4);
}

#[test]
fn truncations_and_terminations_are_reported_apart() {
    let mut venv = VecEnv::make("CartPole-v1", &Kwargs::new().with("max_episode_steps", 10i64), 8).unwrap();
    venv.reset(Some(0)).unwrap();
    let (mut terminated, mut truncated) = (0, 0);
    for t in 0..200 {
        // Always pushing one way topples the pole within 10 steps for some envs, not for others.
        let actions: Vec<i64> = (0..8).map(|i| if i % 2 == 0 { 1 } else { (t % 2) as i64 }).collect();
        let out = venv.step(&VecActions::Discrete(&actions)).unwrap();
        for e in out.episodes {
            assert!(e.length <= 10);
            // An episode that terminates on its last allowed step has both flags and counts as terminated.
            assert_eq!(e.truncated, out.truncated[e.env_index] && !out.terminated[e.env_index]);
            if e.truncated {
                truncated += 1;
                assert_eq!(e.length, 10);
                assert_eq!(e.episode_return, 10.0);
            } else {
                terminated += 1;
            }
        }
    }
    assert!(terminated > 0 && truncated > 0, "terminated {terminated}, truncated {truncated}");
}

fn run(venv: &mut VecEnv, seed: u64, steps: usize) -> Vec<(Vec<f32>, Vec<f32>, Vec<bool>)> {
    venv.reset(Some(seed)).unwrap();
    (0..steps)
        .map(|t| {
            let actions: Vec<i64> = (0..venv.num_envs()).map(|i| discrete_action(i, t, 3)).collect();
            let out = venv.step(&VecActions::Discrete(&actions)).unwrap();
            (out.obs.as_f32().unwrap().to_vec(), out.rewards.to_vec(), out.terminated.to_vec())
        })
        .collect()
}

#[test]
fn same_seed_same_trajectories() {
    let kwargs = Kwargs::new().with("max_episode_steps", 50i64);
    let mut a = VecEnv::make("MountainCar-v0", &kwargs, 4).unwrap();
    let mut b = VecEnv::make("MountainCar-v0", &kwargs, 4).unwrap();
    let first = run(&mut a, 9, 300);
    assert_eq!(first, run(&mut b, 9, 300));
    assert_ne!(first, run(&mut b, 10, 300));
    // Envs of one batch get different seeds, so different starts.
    let obs = a.reset(Some(9)).unwrap().as_f32().unwrap();
    assert_ne!(obs[0], obs[2]);
}

#[test]
fn generic_boxed_envs_behave_like_the_fast_path() {
    let kwargs = Kwargs::new().with("max_episode_steps", 40i64);
    let mut fast = VecEnv::make("Acrobot-v1", &kwargs, 3).unwrap();
    let mut slow = VecEnv::new((0..3).map(|_| make("Acrobot-v1", &kwargs).unwrap()).collect()).unwrap();
    assert_eq!(run(&mut fast, 4, 120), run(&mut slow, 4, 120));
}

#[test]
fn invalid_batches_are_rejected_without_effect() {
    let mut venv = VecEnv::make("CartPole-v1", &Kwargs::new(), 3).unwrap();
    let mut twin = VecEnv::make("CartPole-v1", &Kwargs::new(), 3).unwrap();
    assert!(matches!(venv.step(&VecActions::Discrete(&[0, 0, 0])), Err(Error::ResetNeeded { .. })));
    venv.reset(Some(1)).unwrap();
    twin.reset(Some(1)).unwrap();
    let before = venv.obs().to_buf();
    for bad in [
        VecActions::Discrete(&[0, 1]),
        VecActions::Discrete(&[0, 1, 2]),
        VecActions::Discrete(&[-1, 0, 0]),
        VecActions::Continuous(&[0.0, 0.0, 0.0]),
    ] {
        assert!(matches!(venv.step(&bad), Err(Error::InvalidAction { .. })), "{bad:?}");
        assert_eq!(venv.obs(), before.as_ref());
    }
    let a = venv.step(&VecActions::Discrete(&[1, 0, 1])).unwrap().obs.to_buf();
    let b = twin.step(&VecActions::Discrete(&[1, 0, 1])).unwrap().obs.to_buf();
    assert_eq!(a, b, "rejected batches moved an env");

    let mut cont = VecEnv::make("Pendulum-v1", &Kwargs::new(), 2).unwrap();
    cont.reset(Some(0)).unwrap();
    for bad in [
        VecActions::Continuous(&[0.0]),
        VecActions::Continuous(&[0.0, f32::NAN]),
        VecActions::Continuous(&[f32::INFINITY, 0.0]),
        VecActions::Discrete(&[0, 0]),
    ] {
        assert!(matches!(cont.step(&bad), Err(Error::InvalidAction { .. })), "{bad:?}");
    }
    // Finite out-of-range values are clipped by the env, as in Gymnasium.
    assert!(cont.step(&VecActions::Continuous(&[5.0, -5.0])).is_ok());
}

/// An env with u8 image observations: frame `t` of an episode is 4 bytes of `10 · episode + t`; episodes end
/// (terminated) after 3 steps.
struct Frames {
    obs: Space,
    act: Space,
    episode: u8,
    t: u8,
}

impl Frames {
    fn new() -> Self {
        Frames {
            obs: Space::Box { low: vec![0.0; 4], high: vec![255.0; 4], shape: vec![2, 2], dtype: DType::U8 },
            act: Space::discrete(2),
            episode: 0,
            t: 0,
        }
    }
    fn frame(&self) -> Obs {
        Obs::U8(vec![10 * self.episode + self.t; 4])
    }
}

impl Env for Frames {
    fn id(&self) -> &str {
        "Frames-v0"
    }
    fn observation_space(&self) -> &Space {
        &self.obs
    }
    fn action_space(&self) -> &Space {
        &self.act
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<(Obs, Info)> {
        self.episode = if seed.is_some() { 0 } else { self.episode + 1 };
        self.t = 0;
        Ok((self.frame(), Info::new()))
    }
    fn step(&mut self, _action: Action<'_>) -> Result<Step> {
        self.t += 1;
        Ok(Step { obs: self.frame(), reward: 1.0, terminated: self.t == 3, truncated: false, info: Info::new() })
    }
}

#[test]
fn u8_frames_are_batched_with_their_final_observations() {
    let mut venv = VecEnv::new(vec![Box::new(Frames::new()), Box::new(Frames::new())]).unwrap();
    assert_eq!(venv.reset(Some(0)).unwrap(), ObsRef::U8(&[0; 8]));
    let mut next = ObsBuf::empty(DType::F32);
    for t in 1..=3u8 {
        let step = venv.step(&VecActions::Discrete(&[0, 1])).unwrap();
        step.true_next_obs(&mut next);
        if t < 3 {
            assert_eq!(step.obs, ObsRef::U8(&[t; 8]));
            assert_eq!(step.final_obs(0), None);
        } else {
            // Same-step reset: the batch holds the next episode's first frame, the final one is kept.
            assert_eq!(step.obs, ObsRef::U8(&[10; 8]));
            assert_eq!(step.final_obs(1), Some(ObsRef::U8(&[3; 4])));
            assert_eq!(step.episodes.len(), 2);
        }
        assert_eq!(next, ObsBuf::U8(vec![t; 8]), "the observation that truly followed, as u8");
    }
    assert!(matches!(venv.snapshot(), Err(Error::Unsupported { .. })));
}

#[test]
fn unbatchable_envs_are_rejected() {
    let mixed = vec![make("CartPole-v1", &Kwargs::new()).unwrap(), make("Acrobot-v1", &Kwargs::new()).unwrap()];
    assert!(matches!(VecEnv::new(mixed), Err(Error::BadArgument { .. })));
    let mixed: Vec<Box<dyn Env>> = vec![Box::new(Frames::new()), make("CartPole-v1", &Kwargs::new()).unwrap()];
    assert!(matches!(VecEnv::new(mixed), Err(Error::BadArgument { .. })));
    assert!(matches!(VecEnv::make("CartPole-v1", &Kwargs::new(), 0), Err(Error::BadArgument { .. })));
    assert!(matches!(VecEnv::make("Nope-v0", &Kwargs::new(), 2), Err(Error::UnknownEnv { .. })));
}

/// What one step showed of each env: observations, rewards, flags, final observations and the episodes
/// that ended (return, length, env index within its part).
type Seen = (Vec<f32>, Vec<f32>, Vec<bool>, Vec<bool>, Vec<Option<Vec<f32>>>, Vec<(f64, u64, usize)>);

fn seen(step: &flotilla_envs::VecStep<'_>, offset: usize) -> Seen {
    let n = step.rewards.len();
    (
        step.obs.as_f32().unwrap().to_vec(),
        step.rewards.to_vec(),
        step.terminated.to_vec(),
        step.truncated.to_vec(),
        (0..n).map(|i| step.final_obs(i).map(|o| o.as_f32().unwrap().to_vec())).collect(),
        step.episodes.iter().map(|e| (e.episode_return, e.length, e.env_index - offset)).collect(),
    )
}

#[test]
fn a_joint_batch_steps_each_part_as_the_part_alone() {
    let sizes = [2usize, 3, 1];
    let parts = |id: &str| -> Vec<VecEnv> {
        sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let mut v = VecEnv::make(id, &Kwargs::new(), n).unwrap();
                v.reset(Some(100 * k as u64 + 7)).unwrap();
                v
            })
            .collect()
    };
    let mut alone = parts("CartPole-v1");
    let mut joined = parts("CartPole-v1");
    // Part 1 runs a few steps on its own first: running episodes carry into the joint batch.
    for t in 0..5 {
        let a: Vec<i64> = (0..3).map(|i| discrete_action(i, t, 2)).collect();
        alone[1].step(&VecActions::Discrete(&a)).unwrap();
        joined[1].step(&VecActions::Discrete(&a)).unwrap();
    }
    let mut refs: Vec<&mut VecEnv> = joined.iter_mut().collect();
    let mut joint = VecEnv::join(&mut refs).unwrap();
    assert_eq!(joint.num_envs(), 6);
    assert!(
        matches!(refs[0].step(&VecActions::Discrete(&[0, 0])), Err(Error::ResetNeeded { .. })),
        "a joined part refuses to step"
    );
    let mut episodes = 0;
    for t in 0..300 {
        let all: Vec<i64> = (0..6).map(|i| discrete_action(i, t, 2)).collect();
        let step = joint.step(&VecActions::Discrete(&all)).unwrap();
        let mut start = 0;
        for (part, &n) in alone.iter_mut().zip(&sizes) {
            let own = part.step(&VecActions::Discrete(&all[start..start + n])).unwrap();
            assert_eq!(seen(&step.slice(start..start + n), start), seen(&own, 0), "step {t}, envs {start}..");
            episodes += own.episodes.len();
            start += n;
        }
    }
    assert!(episodes > 10, "episodes ended inside the joint batch: {episodes}");
    let mut refs: Vec<&mut VecEnv> = joined.iter_mut().collect();
    assert!(joint.unjoin(&mut refs, &[2, 3]).is_err(), "sizes that do not add up");
    joint.unjoin(&mut refs, &sizes).unwrap();
    assert_eq!(joint.num_envs(), 0);
    for t in 0..50 {
        for (k, (a, b)) in alone.iter_mut().zip(joined.iter_mut()).enumerate() {
            let act: Vec<i64> = (0..sizes[k]).map(|i| discrete_action(i, t + 7, 2)).collect();
            let x = seen(&a.step(&VecActions::Discrete(&act)).unwrap(), 0);
            assert_eq!(x, seen(&b.step(&VecActions::Discrete(&act)).unwrap(), 0), "after unjoin, part {k}");
        }
    }
    // Episode statistics carried through join and unjoin: the snapshots agree.
    for (a, b) in alone.iter().zip(&joined) {
        assert_eq!(a.snapshot().unwrap(), b.snapshot().unwrap());
    }
}

#[test]
fn only_reset_parts_of_one_kind_are_joined() {
    let mut a = VecEnv::make("CartPole-v1", &Kwargs::new(), 2).unwrap();
    let mut b = VecEnv::make("CartPole-v1", &Kwargs::new(), 2).unwrap();
    a.reset(Some(1)).unwrap();
    let Err(err) = VecEnv::join(&mut [&mut a, &mut b]) else { panic!("joined an unreset part") };
    assert!(matches!(err, Error::ResetNeeded { .. }), "{err}");
    assert_eq!(a.num_envs(), 2, "nothing moved");
    let mut c = VecEnv::make("Pendulum-v1", &Kwargs::new(), 1).unwrap();
    c.reset(Some(2)).unwrap();
    let Err(err) = VecEnv::join(&mut [&mut a, &mut c]) else { panic!("joined different envs") };
    assert!(err.to_string().contains("part 1"), "{err}");
    assert_eq!((a.num_envs(), c.num_envs()), (2, 1), "nothing moved");
}

#[test]
fn stepping_on_threads_is_stepping_on_one() {
    // 11 envs on 1, 2, 3 and 16 threads (shares of 11, 6, 4 and 1 envs): every output the same, episodes in
    // env order, discrete and continuous actions.
    for (id, discrete) in [("CartPole-v1", true), ("Pendulum-v1", false)] {
        let kwargs = Kwargs::new().with("max_episode_steps", 30i64);
        let batches: Vec<VecEnv> = [1usize, 2, 3, 16]
            .iter()
            .map(|&threads| {
                let mut v = VecEnv::make(id, &kwargs, 11).unwrap();
                v.set_step_threads(threads);
                v.reset(Some(5)).unwrap();
                v
            })
            .collect();
        let mut batches = batches;
        let mut episodes = 0;
        for t in 0..120 {
            let a: Vec<i64> = (0..11).map(|i| discrete_action(i, t, 2)).collect();
            let c: Vec<f32> = (0..11).map(|i| continuous_action(i, t)).collect();
            let actions = if discrete { VecActions::Discrete(&a) } else { VecActions::Continuous(&c) };
            let (first, rest) = batches.split_first_mut().unwrap();
            let one = seen(&first.step(&actions).unwrap(), 0);
            episodes += one.5.len();
            for (k, b) in rest.iter_mut().enumerate() {
                assert_eq!(seen(&b.step(&actions).unwrap(), 0), one, "{id}, step {t}, threads variant {k}");
            }
        }
        assert!(episodes > 20, "{id}: episodes ended on the threads too: {episodes}");
        // A bad batch is refused before any thread steps: the batches stay in step.
        assert!(batches[2].step(&VecActions::Discrete(&[0; 3])).is_err());
        let snapshots: Vec<_> = batches.iter().map(|b| b.snapshot().unwrap().obs).collect();
        assert!(snapshots.iter().all(|s| *s == snapshots[0]), "{id}: same state after a refused batch");
    }
}
