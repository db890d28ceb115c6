//! Hostile messages for a CartPole PPO run (chunks of 32 steps): what a fuzzing client sends to a learner.
//! `cli/tests/distributed.rs` (the fuzz test) and the chaos soak (`flotilla-soak`) use them.
use flotilla_core::{Chunk, EpisodeStats, ObsBuf};
use flotilla_transport::{Registration, codec, proto};

/// Steps per chunk of the runs these messages are made for (`cartpole_ppo.toml`'s `n_steps`).
pub const STEPS: usize = 32;
/// How many kinds of hostile message [`hostile`] makes (`kind` in `0..KINDS`).
pub const KINDS: usize = 15;

/// splitmix64: seeded random numbers for a fuzzer (no dependency for a test's dice).
pub struct Dice(pub u64);

impl Dice {
    /// The next 64 random bits.
    pub fn roll(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.roll() % n as u64) as usize
    }

    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.roll() as u8).collect()
    }
}

/// A CartPole-v1 actor's registration for run `run_id` with `n_envs` envs (the learner picks the slot).
pub fn cartpole_registration(run_id: &str, n_envs: usize) -> Registration {
    let env = flotilla_envs::make("CartPole-v1", &Default::default()).expect("CartPole-v1 is built in");
    Registration {
        run_id: run_id.into(),
        observation_space: env.observation_space().clone(),
        action_space: env.action_space().clone(),
        n_envs,
        actor_index: None,
        host: "test".into(),
        pid: std::process::id(),
    }
}

/// A valid CartPole chunk of [`STEPS`] steps with `n_envs` envs and no episode ends.
pub fn chunk(actor_id: u64, n_envs: usize) -> Chunk {
    let n = STEPS * n_envs;
    Chunk {
        actor_id,
        policy_version: 0,
        n_steps: STEPS,
        n_envs,
        obs: ObsBuf::F32(vec![0.01; n * 4]),
        bootstrap_obs: ObsBuf::F32(vec![0.01; n_envs * 4]),
        actions: vec![1.0; n],
        rewards: vec![1.0; n],
        terminated: vec![false; n],
        truncated: vec![false; n],
        log_probs: vec![-0.69; n],
        values: vec![0.0; n],
        initial_state: Vec::new(),
        final_index: vec![],
        final_obs: ObsBuf::F32(vec![]),
        episodes: vec![EpisodeStats { episode_return: 10.0, length: 10, env_index: 0, truncated: false, task: None }],
    }
}

/// One hostile chunk for actor `id` with `n_envs` envs: mutation `kind` (`0..KINDS`) of a valid chunk, every one
/// outside what the run accepts — semantically wrong values (actions outside `Discrete(2)`, NaN and ±inf,
/// observations outside the bounds, inconsistent lengths, wrong dtypes, episode ends without final
/// observations, episodes of envs that do not exist) or, on the wire (`Err`: send it with
/// `flotilla_transport::grpc::send_raw_chunk`), tensors of random bytes and lengths, unknown dtypes and protocol
/// versions.
pub fn hostile(kind: usize, id: u64, n_envs: usize, dice: &mut Dice) -> Result<Chunk, Box<proto::Chunk>> {
    let n = STEPS * n_envs;
    let mut c = chunk(id, n_envs);
    let bad_float = dice.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    match kind {
        0 => c.actions[dice.below(n)] = dice.pick(&[2.0, -1.0, 1e9, 0.5, f32::NAN, f32::INFINITY]),
        1 => c.rewards[dice.below(n)] = bad_float,
        2 => {
            let mut obs = vec![0.01f32; n * 4];
            // Cart position within ±4.8, pole angle within ±0.419 rad; NaN anywhere.
            let (element, values) = dice.pick(&[(0, [5.0, -5.0, f32::NAN]), (2, [0.5, -0.5, f32::NAN])]);
            obs[dice.below(n) * 4 + element] = dice.pick(&values);
            c.obs = ObsBuf::F32(obs);
        }
        3 => match dice.below(6) {
            0 => drop(c.rewards.pop()),
            1 => drop(c.actions.pop()),
            2 => drop(c.terminated.pop()),
            3 => drop(c.truncated.pop()),
            4 => drop(c.log_probs.pop()),
            _ => drop(c.values.pop()),
        },
        4 => {
            c.n_steps = dice.pick(&[0, 1, STEPS - 1, STEPS + 1, 1 << 20]);
        }
        5 => {
            c.terminated[dice.below(n)] = true;
            if dice.below(2) == 0 {
                c.final_index = vec![10_000 + dice.below(1000) as u32];
                c.final_obs = ObsBuf::F32(vec![0.01; 4]);
            }
        }
        6 => {
            let e = &mut c.episodes[0];
            match dice.below(3) {
                0 => e.episode_return = f64::NAN,
                1 => e.env_index = n_envs + dice.below(100),
                _ => e.task = Some(dice.below(7) as u32),
            }
        }
        7 => c.policy_version = 1_000_000 + dice.roll() % 1_000_000,
        8 => c.log_probs[dice.below(n)] = dice.pick(&[f32::NAN, f32::INFINITY]),
        9 => c.obs = ObsBuf::U8(dice.bytes(n * 4)),
        _ => {
            let mut p = codec::chunk_to_proto(&c, 1, flotilla_transport::MessageKey::NONE);
            let tensor = match dice.below(4) {
                0 => p.obs.as_mut(),
                1 => p.actions.as_mut(),
                2 => p.rewards.as_mut(),
                _ => p.bootstrap_obs.as_mut(),
            }
            .expect("a proto chunk carries every tensor");
            match kind {
                10 => {
                    // Random bytes of a length that cannot match the shape.
                    let len = tensor.data.len();
                    let new_len = (dice.below(2 * len + 1) / 4) * 4 + 1 + dice.below(3);
                    tensor.data = dice.bytes(new_len).into();
                }
                11 => tensor.dtype = dice.pick(&[0, 3, 99, -1]),
                12 => tensor.shape = vec![dice.roll() % 1000 + 1, dice.roll() % 7 + 5],
                13 => p.terminated = vec![2 + dice.below(250) as u8; n].into(),
                _ => p.protocol_version = 2 + dice.below(1000) as u32,
            }
            return Err(Box::new(p));
        }
    }
    Ok(c)
}
