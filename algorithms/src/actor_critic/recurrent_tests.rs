//! Recurrent actor-critics: what actors compute step by step is what the learner's sequences compute.
use flotilla_core::{Chunk, ObsRef, Space};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use tch::{Device, Tensor};

use crate::algorithm::Algorithm;
use crate::nn::recurrent::Recurrence;
use crate::policy::{ActMode, ActOutput, Memory, Policy};
use crate::ppo::{Ppo, PpoConfig};

const E: usize = 4;
const T: usize = 6;
const D: usize = 3;

fn agent(cell: Recurrence) -> Ppo {
    let config = PpoConfig {
        recurrent: cell,
        recurrent_hidden: 8,
        hidden_sizes: vec![8],
        n_steps: T,
        batch_size: 2 * T,
        ..PpoConfig::default()
    };
    let obs = Space::box1d(vec![-1.0; D], vec![1.0; D]);
    Ppo::new(&obs, &Space::discrete(2), E, config, Device::Cpu, 5).unwrap()
}

fn random_obs(rng: &mut Pcg64) -> Vec<f32> {
    (0..E * D).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The value the policy gives `obs` (one row) from `state` (one row).
fn value_from(agent: &Ppo, obs: &[f32], state: &[f32]) -> f32 {
    let x = Tensor::from_slice(obs).view([1, D as i64]);
    let s = Tensor::from_slice(state).view([1, state.len() as i64]);
    let (_, v, _) = tch::no_grad(|| agent.pi.net.forward_with_state(&x, &s));
    v.double_value(&[0]) as f32
}

/// A rollout collected step by step with a [`Memory`] (episodes ending at random, by termination or a time
/// limit): the learner's sequence forward from the rollout's initial states, with resets at the episode
/// starts, gives the log-probabilities and values the actors computed, and every next-state value is `V` of
/// the observation that followed from the state the actor reached there — truncated episodes' final
/// observations and the bootstrap observations included.
#[test]
fn the_learners_sequences_equal_the_actors_steps() {
    for cell in [Recurrence::Lstm, Recurrence::Gru] {
        let mut agent = agent(cell);
        let mut memory = Memory::new(&agent, E);
        assert_eq!(memory.dim(), if cell == Recurrence::Lstm { 16 } else { 8 });
        let mut rng = Pcg64::seed_from_u64(9);
        let (mut out, mut obs) = (ActOutput::default(), random_obs(&mut rng));
        let mut want_next = vec![f32::NAN; T * E];
        // A few steps first, so that the rollout starts from non-zero states.
        for _ in 0..3 {
            memory.act(&mut agent, ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            obs = random_obs(&mut rng);
        }
        assert!(memory.state().iter().any(|&x| x != 0.0));
        for t in 0..T {
            memory.act(&mut agent, ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
            let next = random_obs(&mut rng);
            let terminated: Vec<bool> = (0..E).map(|_| rng.random_bool(0.2)).collect();
            let truncated: Vec<bool> = (0..E).map(|e| !terminated[e] && rng.random_bool(0.2)).collect();
            let rewards = vec![1.0; E];
            let mut chunk = Chunk::from_step(
                ObsRef::F32(&obs),
                &out.actions,
                &out.log_probs,
                &out.values,
                &rewards,
                &terminated,
                &truncated,
                ObsRef::F32(&next),
            );
            chunk.initial_state = memory.initial_state().to_vec();
            agent.observe(&[chunk]).unwrap();
            let s = memory.dim();
            for e in 0..E {
                if truncated[e] {
                    // The truncated episode's final observation, from the state its last step left.
                    want_next[t * E + e] =
                        value_from(&agent, &next[e * D..(e + 1) * D], &memory.state()[e * s..(e + 1) * s]);
                } else if terminated[e] {
                    want_next[t * E + e] = 0.0;
                }
            }
            memory.end_episodes(&terminated, &truncated);
            obs = next;
        }
        // The bootstrap values: what the actors compute at their next step.
        let mut after = memory.clone();
        let mut probe = ActOutput::default();
        after.act(&mut agent, ObsRef::F32(&obs), ActMode::Deterministic, &mut probe).unwrap();
        let rollout = agent.finish_rollout().unwrap().expect("a full rollout");
        for e in 0..E {
            let i = (T - 1) * E + e;
            if want_next[i].is_nan() {
                want_next[i] = probe.values[e];
            }
        }
        for (i, want) in want_next.iter_mut().enumerate().take((T - 1) * E) {
            if want.is_nan() {
                *want = rollout.values[i + E];
            }
        }
        let x = agent.pi.net.rollout_obs(&rollout).unwrap();
        let (log_probs, values, next_values) = agent.pi.net.sequence_eval(&rollout, &x).unwrap();
        let close = |a: &[f32], b: &[f32], what: &str| {
            assert_eq!(a.len(), b.len(), "{cell:?} {what}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() < 1e-5, "{cell:?} {what}[{i}]: learner {x}, actor {y}");
            }
        };
        close(&log_probs, &rollout.log_probs, "log-probs");
        close(&values, &rollout.values, "values");
        close(&next_values, &want_next, "next values");
        close(&rollout.next_values[..T * E], &want_next, "the rollout's next values (GAE)");
        agent.recycle(rollout);
    }
}

/// Chunks without the state, with a state of the wrong size or with a non-finite one are refused by name, and
/// the agent takes a good chunk after them.
#[test]
fn chunks_with_a_bad_initial_state_are_refused_and_the_agent_keeps_going() {
    let mut agent = agent(Recurrence::Lstm);
    let mut memory = Memory::new(&agent, E);
    let mut rng = Pcg64::seed_from_u64(1);
    let obs = random_obs(&mut rng);
    let mut out = ActOutput::default();
    memory.act(&mut agent, ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap();
    let no = vec![false; E];
    let good = Chunk {
        initial_state: memory.initial_state().to_vec(),
        ..Chunk::from_step(
            ObsRef::F32(&obs),
            &out.actions,
            &out.log_probs,
            &out.values,
            &[0.0; E],
            &no,
            &no,
            ObsRef::F32(&obs),
        )
    };
    let mut short = good.clone();
    short.initial_state.pop();
    let mut none = good.clone();
    none.initial_state.clear();
    let mut nan = good.clone();
    nan.initial_state[3] = f32::NAN;
    // h (the first 8 of each env's 16 floats) lies in [−1, 1]; the cell state after it need not.
    let mut big_h = good.clone();
    big_h.initial_state[16 + 2] = 1.5;
    let mut big_c = good.clone();
    big_c.initial_state[16 + 10] = 3.0;
    agent.observe(&[big_c]).unwrap();
    for (bad, what) in [
        (short, "initial recurrent state"),
        (none, "initial recurrent state"),
        (nan, "is NaN"),
        (big_h, "[18] is 1.5, outside [-1, 1] (env 1's hidden state h)"),
    ] {
        let e = agent.observe(&[bad]).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
    agent.observe(&[good]).unwrap();
    // The plain, stateless `act` is refused: a recurrent policy needs its state.
    let e = agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut out).unwrap_err().to_string();
    assert!(e.contains("act_with_state"), "{e}");
}

/// A Nature-CNN torso before the LSTM (frames, CleanRL's `ppo_atari_lstm`): the learner's sequence forward from
/// the rollout's initial states gives the log-probabilities and values the actors computed step by step on the
/// same frames, with the state zeroed where an episode ended; the exported layout lists the torso first.
#[test]
fn a_cnn_torso_before_the_lstm_keeps_the_actors_and_the_learner_equal() {
    const SIDE: usize = 36;
    let frames = Space::Box {
        low: vec![0.0; SIDE * SIDE],
        high: vec![255.0; SIDE * SIDE],
        shape: vec![1, SIDE, SIDE],
        dtype: flotilla_core::DType::U8,
    };
    let config = PpoConfig {
        recurrent: Recurrence::Lstm,
        recurrent_hidden: 16,
        hidden_sizes: vec![],
        n_steps: T,
        batch_size: 2 * T,
        ..PpoConfig::default()
    };
    let mut agent = Ppo::new(&frames, &Space::discrete(3), E, config.clone(), Device::Cpu, 2).unwrap();
    assert!(agent.pi.net.obs_layout().image.is_some(), "frames go to the CNN");
    let mut memory = Memory::new(&agent, E);
    assert_eq!(memory.dim(), 32);
    let mut rng = Pcg64::seed_from_u64(4);
    let mut draw = || -> Vec<u8> { (0..E * SIDE * SIDE).map(|_| rng.random_range(0..=255u8)).collect() };
    let mut out = ActOutput::default();
    let mut obs = draw();
    for _ in 0..2 {
        memory.act(&mut agent, ObsRef::U8(&obs), ActMode::Explore, &mut out).unwrap();
        obs = draw();
    }
    for t in 0..T {
        memory.act(&mut agent, ObsRef::U8(&obs), ActMode::Explore, &mut out).unwrap();
        let next = draw();
        let terminated: Vec<bool> = (0..E).map(|e| (t + e) % 4 == 2).collect();
        let mut chunk = Chunk::from_step(
            ObsRef::U8(&obs),
            &out.actions,
            &out.log_probs,
            &out.values,
            &[1.0; E],
            &terminated,
            &[false; E],
            ObsRef::U8(&next),
        );
        chunk.initial_state = memory.initial_state().to_vec();
        agent.observe(&[chunk]).unwrap();
        memory.end_episodes(&terminated, &[false; E]);
        obs = next;
    }
    let rollout = agent.finish_rollout().unwrap().expect("a full rollout");
    assert!(rollout.episode_starts().contains(&1.0) && rollout.initial_state.iter().any(|&x| x != 0.0));
    let x = agent.pi.net.rollout_obs(&rollout).unwrap();
    let (log_probs, values, _) = agent.pi.net.sequence_eval(&rollout, &x).unwrap();
    for (what, got, want) in [("log-probs", &log_probs, &rollout.log_probs), ("values", &values, &rollout.values)] {
        for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
            assert!((a - b).abs() < 1e-4, "{what}[{i}]: learner {a}, actor {b}");
        }
    }
    agent.update_from(&rollout, 1.0).unwrap();
    // The exported layout: the torso's tensors, then the core's, then the heads'.
    let arch = config.net().architecture("ppo", &frames, &Space::discrete(3)).unwrap();
    let names: Vec<String> = arch.tensor_shapes().into_iter().map(|(n, _)| n).collect();
    assert_eq!(&names[..2], ["cnn.conv1.weight", "cnn.conv1.bias"]);
    assert!(names.iter().position(|n| n == "cnn.fc.bias") < names.iter().position(|n| n == "core.weight_ih_l0"));
    assert!(!names.iter().any(|n| n.starts_with("cnn.out")), "no CNN output layer: {names:?}");
    let core = arch.recurrent.unwrap();
    assert_eq!((core.inputs, core.torso), (512, Some([1, SIDE, SIDE])));
}
