//! Data-parallel exactness over real c10d (Gloo on 127.0.0.1, ranks as threads): L learners, each training on
//! its own batch of B with the gradient all-reduced, end with the same parameters as one learner training on
//! the L·B samples together (relative 1e-5: only the summation order differs).
use flotilla_algorithms::algorithm::Replicated;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_algorithms::a2c::A2cConfig;
use flotilla_algorithms::dqn::{Dqn, DqnConfig};
use flotilla_algorithms::ppo::PpoConfig;
use flotilla_algorithms::sac::{Sac, SacConfig};
use flotilla_algorithms::td3::{DdpgConfig, Td3, Td3Config};
use flotilla_algorithms::{ActMode, ActOutput, Algorithm, AlgorithmConfig, DataParallel, GradientSync, Progress};
use flotilla_collective::codec::Compression;
use flotilla_collective::{GroupOptions, ProcessGroup, Rendezvous};
use flotilla_core::{Chunk, ObsRef, Space};
use flotilla_learner::data_parallel::CollectiveSync;
use tch::{Device, Tensor};

const OBS: usize = 4;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spaces() -> (Space, Space) {
    (Space::box1d(vec![-1.0; OBS], vec![1.0; OBS]), Space::discrete(2))
}

/// `world` ranks as threads, each running `body(rank, sync)` with a [`CollectiveSync`] over a fresh Gloo group.
fn on_ranks<T: Send + 'static>(
    world: usize,
    body: impl Fn(usize, Box<CollectiveSync>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let port = free_port();
    let body = Arc::new(body);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            std::thread::spawn(move || {
                let options = GroupOptions { timeout: Duration::from_secs(30), ..GroupOptions::default() };
                let group = ProcessGroup::connect(&Rendezvous::local(rank, world, port), &options, b"test").unwrap();
                let sync = CollectiveSync::new(Arc::new(Mutex::new(group)), Compression::None, Default::default());
                body(rank, Box::new(sync))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Observation of global env `env` at step `t`: deterministic, different per env.
fn obs_of(env: usize, t: u64) -> Vec<f32> {
    (0..OBS).map(|i| (t as f32 * 0.31 + env as f32 * 1.7 + i as f32 * 0.9).sin()).collect()
}

/// One recorded step of `envs` envs (the transition's owned parts).
#[derive(Clone)]
struct Step {
    obs: Vec<f32>,
    act: ActOutput,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    next_obs: Vec<f32>,
}

impl Step {
    fn transition(&self) -> Chunk {
        Chunk::from_step(
            ObsRef::F32(&self.obs),
            &self.act.actions,
            &self.act.log_probs,
            &self.act.values,
            &self.rewards,
            &self.terminated,
            &self.truncated,
            ObsRef::F32(&self.next_obs),
        )
    }

    /// Rank steps side by side: envs of rank 0, then rank 1, ….
    fn concat(parts: &[&Step]) -> Step {
        let cat_f = |f: fn(&Step) -> &Vec<f32>| parts.iter().flat_map(|s| f(s).iter().copied()).collect::<Vec<f32>>();
        let cat_b = |f: fn(&Step) -> &Vec<bool>| parts.iter().flat_map(|s| f(s).iter().copied()).collect::<Vec<bool>>();
        Step {
            obs: cat_f(|s| &s.obs),
            act: ActOutput {
                actions: cat_f(|s| &s.act.actions),
                log_probs: cat_f(|s| &s.act.log_probs),
                values: cat_f(|s| &s.act.values),
                q_values: vec![],
            },
            rewards: cat_f(|s| &s.rewards),
            terminated: cat_b(|s| &s.terminated),
            truncated: cat_b(|s| &s.truncated),
            next_obs: cat_f(|s| &s.next_obs),
        }
    }
}

/// On-policy: each of `world` ranks acts on its `envs` envs and trains data-parallel; then one learner with
/// `world · envs` envs (the config `single`) trains on the same steps. Returns (each rank's parameters, the
/// single learner's).
fn on_policy_ranks_and_one(
    rank_config: AlgorithmConfig,
    single: AlgorithmConfig,
    world: usize,
    envs: usize,
    steps: u64,
) {
    on_policy_ranks_and_one_frozen(rank_config, single, world, envs, steps, &[], None);
}

/// A [`GradientSync`] that counts the gradient scalars it is handed (what goes on the wire) and passes them on.
struct Counting {
    inner: Box<CollectiveSync>,
    scalars: Arc<AtomicUsize>,
}

impl GradientSync for Counting {
    fn mean_gradient(&mut self, slot: usize, grad: &mut Tensor) -> flotilla_algorithms::Result<()> {
        self.scalars.fetch_add(grad.numel(), Ordering::SeqCst);
        self.inner.mean_gradient(slot, grad)
    }

    fn sum(&mut self, values: &mut [f64]) -> flotilla_algorithms::Result<()> {
        self.inner.sum(values)
    }

    fn replicas(&self) -> usize {
        self.inner.replicas()
    }
}

/// [`on_policy_ranks_and_one`] with the `freeze` layers frozen on every rank and on the single learner; asserts
/// that each rank put exactly the trainable scalars on the wire at each of its `gradient_steps` per update
/// and returns each rank's parameters at the start (after freezing) and at the end.
fn on_policy_ranks_and_one_frozen(
    rank_config: AlgorithmConfig,
    single: AlgorithmConfig,
    world: usize,
    envs: usize,
    steps: u64,
    freeze: &'static [&'static str],
    gradient_steps: Option<usize>,
) -> Vec<(Tensor, Tensor)> {
    let (obs_space, act_space) = spaces();
    let config = rank_config.clone();
    let freeze: Vec<String> = freeze.iter().map(|s| s.to_string()).collect();
    let rank_freeze = freeze.clone();
    let results = on_ranks(world, move |rank, sync| {
        let (obs_space, act_space) = spaces();
        let mut agent = config.build_learner(&obs_space, &act_space, envs, Device::Cpu, 3).unwrap();
        agent.transfer("test", &[], &[], &rank_freeze).unwrap();
        let initial = agent.policy_params().flat().copy();
        let scalars = Arc::new(AtomicUsize::new(0));
        let counting = Counting { inner: sync, scalars: scalars.clone() };
        agent.replicated().unwrap().set_data_parallel(DataParallel::new(Some(Box::new(counting)), 1).unwrap()).unwrap();
        let mut recorded = Vec::new();
        let mut updates = 0;
        for t in 0..steps {
            let env_ids = rank * envs..(rank + 1) * envs;
            let obs: Vec<f32> = env_ids.clone().flat_map(|e| obs_of(e, t)).collect();
            let next_obs: Vec<f32> = env_ids.clone().flat_map(|e| obs_of(e, t + 1)).collect();
            let mut act = ActOutput::default();
            agent.act(ObsRef::F32(&obs), ActMode::Explore, &mut act).unwrap();
            let step = Step {
                rewards: act.actions.iter().zip(&obs).map(|(a, o)| a * o + 0.1).collect(),
                terminated: env_ids.clone().map(|e| (t + e as u64).is_multiple_of(11)).collect(),
                truncated: env_ids.map(|e| (t + 2 * e as u64).is_multiple_of(17)).collect(),
                obs,
                act,
                next_obs,
            };
            agent.observe(&[step.transition()]).unwrap();
            let progress = Progress { env_steps: (t + 1) * envs as u64, total_env_steps: steps * envs as u64 };
            updates += agent.update(&progress).unwrap().is_some() as usize;
            recorded.push(step);
        }
        assert!(updates >= 2, "{updates} updates");
        let trainable = agent.policy_params().trainable_numel() as usize;
        if let Some(per_update) = gradient_steps {
            let sent = scalars.load(Ordering::SeqCst);
            assert_eq!(sent, updates * per_update * trainable, "rank {rank}: only trainable scalars on the wire");
        }
        (agent.policy_params().flat().copy(), recorded, initial)
    });
    let mut one = single.build_learner(&obs_space, &act_space, world * envs, Device::Cpu, 3).unwrap();
    one.transfer("test", &[], &[], &freeze).unwrap();
    for t in 0..steps as usize {
        let parts: Vec<&Step> = results.iter().map(|(_, r, _)| &r[t]).collect();
        one.observe(&[Step::concat(&parts).transition()]).unwrap();
        let progress = Progress {
            env_steps: (t as u64 + 1) * (world * envs) as u64,
            total_env_steps: steps * (world * envs) as u64,
        };
        one.update(&progress).unwrap();
    }
    let want = one.policy_params().flat();
    for (rank, (params, _, _)) in results.iter().enumerate() {
        assert_close(&format!("{} rank {rank}", rank_config.name()), params, want);
    }
    assert!(results[0].0.equal(&results[1].0), "ranks hold bit-identical parameters");
    results.into_iter().map(|(last, _, initial)| (initial, last)).collect()
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    let scale = want.abs().max().double_value(&[]);
    let diff = (got - want).abs().max().double_value(&[]);
    assert!(diff <= 1e-5 * scale, "{what}: parameters differ from one learner's by {diff} (scale {scale})");
}

#[test]
fn ppo_on_two_learners_steps_as_one_learner_on_both_batches() {
    let ppo =
        |batch| PpoConfig { n_steps: 16, batch_size: batch, n_epochs: 4, hidden_sizes: vec![32], ..Default::default() };
    // Rank batch B = 16 steps × 4 envs = 64 (one minibatch); one learner: 2B = 128.
    on_policy_ranks_and_one(AlgorithmConfig::Ppo(ppo(64)), AlgorithmConfig::Ppo(ppo(128)), 2, 4, 48);
}

#[test]
fn frozen_layers_stay_off_the_wire_and_ranks_still_step_as_one_learner() {
    // PPO with its first layer frozen: 1 minibatch × 4 epochs = 4 gradient steps per update, each sending the
    // trainable scalars only; the frozen layer ends where it started on every rank.
    let ppo =
        |batch| PpoConfig { n_steps: 16, batch_size: batch, n_epochs: 4, hidden_sizes: vec![32], ..Default::default() };
    let (single, ranks) = (AlgorithmConfig::Ppo(ppo(128)), AlgorithmConfig::Ppo(ppo(64)));
    let ranks_params = on_policy_ranks_and_one_frozen(ranks.clone(), single, 2, 4, 48, &["pi_vf.0"], Some(4));
    let (obs_space, act_space) = spaces();
    let mut agent = ranks.build_learner(&obs_space, &act_space, 4, Device::Cpu, 3).unwrap();
    let frozen = agent.transfer("test", &[], &[], &["pi_vf.0".into()]).unwrap().1;
    let params = agent.policy_params();
    assert!(frozen > 0 && params.trainable_numel() == params.numel() - frozen);
    assert_eq!(params.names().next(), Some("pi_vf.0.weight"), "the first layer starts the buffer");
    for (start, end) in &ranks_params {
        assert!(start.narrow(0, 0, frozen).equal(&end.narrow(0, 0, frozen)), "the frozen layer never moved");
        assert!(!start.equal(end), "the rest trained");
    }
}

#[test]
fn a2c_on_two_learners_steps_as_one_learner_on_both_batches() {
    let a2c = A2cConfig { n_steps: 8, hidden_sizes: vec![32], normalize_advantage: true, ..Default::default() };
    on_policy_ranks_and_one(AlgorithmConfig::A2c(a2c.clone()), AlgorithmConfig::A2c(a2c), 2, 4, 40);
}

#[test]
fn dqn_on_two_learners_steps_as_one_learner_on_both_batches() {
    // f32: the comparison is to f32 rounding.
    let config =
        DqnConfig { batch_size: 32, hidden_sizes: vec![32], learning_rate: 1e-3, bf16: false, ..Default::default() };
    let (b, world, steps) = (32usize, 2usize, 20u64);
    // Rank r's minibatch at step t; the one learner trains on rank 0's and rank 1's together.
    let batch = move |rank: usize, t: u64| {
        let obs: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t)).collect();
        let next: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t + 1)).collect();
        let actions: Vec<i64> = (0..b).map(|i| ((i + rank + t as usize) % 2) as i64).collect();
        let rewards: Vec<f32> = (0..b).map(|i| ((i * 7 + rank) % 5) as f32 * 0.3 - 0.5).collect();
        let bootstrap: Vec<f32> = (0..b).map(|i| if (i + t as usize).is_multiple_of(9) { 0.0 } else { 0.99 }).collect();
        (obs, actions, rewards, bootstrap, next)
    };
    let (obs_space, act_space) = spaces();
    let cfg = config.clone();
    let ranks = on_ranks(world, move |rank, sync| {
        let (obs_space, act_space) = spaces();
        let mut dqn = Dqn::new(&obs_space, &act_space, 1, cfg.clone(), Device::Cpu, 9).unwrap();
        dqn.set_data_parallel(DataParallel::new(Some(sync), 1).unwrap()).unwrap();
        for t in 0..steps {
            let (o, a, r, g, n) = batch(rank, t);
            dqn.train_on(ObsRef::F32(&o), &a, &r, &g, ObsRef::F32(&n)).unwrap();
        }
        dqn.policy_params().flat().copy()
    });
    let mut one =
        Dqn::new(&obs_space, &act_space, 1, DqnConfig { batch_size: 2 * b, ..config }, Device::Cpu, 9).unwrap();
    for t in 0..steps {
        let (mut o, mut a, mut r, mut g, mut n) = batch(0, t);
        let (o1, a1, r1, g1, n1) = batch(1, t);
        o.extend(o1);
        a.extend(a1);
        r.extend(r1);
        g.extend(g1);
        n.extend(n1);
        one.train_on(ObsRef::F32(&o), &a, &r, &g, ObsRef::F32(&n)).unwrap();
    }
    for (rank, params) in ranks.iter().enumerate() {
        assert_close(&format!("dqn rank {rank}"), params, one.policy_params().flat());
    }
    assert!(ranks[0].equal(&ranks[1]), "ranks hold bit-identical parameters");
}

/// DDPG or TD3 (`build` makes one with the given batch size) on two ranks of batch `b`, each critic and
/// (delayed) actor gradient all-reduced, against one learner on both ranks' transitions: same critic and
/// actor parameters. Target-action noise is off: each rank would draw its own.
fn continuous_ranks_and_one(name: &'static str, build: fn(usize) -> Td3) {
    let (b, world, steps) = (16usize, 2usize, 24u64);
    let batch = move |rank: usize, t: u64| {
        let obs: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t)).collect();
        let next: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t + 1)).collect();
        let actions: Vec<f32> = (0..2 * b).map(|i| ((i * 5 + rank * 3 + t as usize) % 11) as f32 / 5.0 - 1.0).collect();
        let rewards: Vec<f32> = (0..b).map(|i| ((i * 7 + rank) % 5) as f32 * 0.3 - 0.5).collect();
        let bootstrap: Vec<f32> = (0..b).map(|i| if (i + t as usize).is_multiple_of(9) { 0.0 } else { 0.99 }).collect();
        (obs, actions, rewards, bootstrap, next)
    };
    // The actor learns every other step (TD3's delay, for DDPG too: both paths are reduced).
    let ranks = on_ranks(world, move |rank, sync| {
        let mut agent = build(b);
        agent.set_data_parallel(DataParallel::new(Some(sync), 1).unwrap()).unwrap();
        for t in 0..steps {
            let (o, a, r, g, n) = batch(rank, t);
            agent.train_on(&o, &a, &r, &g, &n, t % 2 == 1).unwrap();
        }
        (agent.policy_params().flat().copy(), agent.critic_params().flat().copy())
    });
    let mut one = build(2 * b);
    for t in 0..steps {
        let ((mut o, mut a, mut r, mut g, mut n), (o1, a1, r1, g1, n1)) = (batch(0, t), batch(1, t));
        o.extend(o1);
        a.extend(a1);
        r.extend(r1);
        g.extend(g1);
        n.extend(n1);
        one.train_on(&o, &a, &r, &g, &n, t % 2 == 1).unwrap();
    }
    for (rank, (actor, critic)) in ranks.iter().enumerate() {
        assert_close(&format!("{name} rank {rank} actor"), actor, one.policy_params().flat());
        assert_close(&format!("{name} rank {rank} critic"), critic, one.critic_params().flat());
    }
    assert!(ranks[0].0.equal(&ranks[1].0) && ranks[0].1.equal(&ranks[1].1), "ranks hold bit-identical parameters");
}

/// Observation and action spaces of the continuous tests (a 2-D action with unequal bounds).
fn continuous_spaces() -> (Space, Space) {
    (Space::box1d(vec![-1.0; OBS], vec![1.0; OBS]), Space::box1d(vec![-2.0, -1.0], vec![2.0, 1.0]))
}

#[test]
fn td3_on_two_learners_steps_as_one_learner_on_both_batches() {
    continuous_ranks_and_one("td3", |batch_size| {
        // f32 (here and below): bf16's rounding of a row may differ with the matmul's row count (oneDNN's blocking).
        let config = Td3Config {
            batch_size,
            target_policy_noise: 0.0,
            hidden_sizes: vec![32],
            bf16: false,
            ..Default::default()
        };
        let (obs, act) = continuous_spaces();
        Td3::td3(&obs, &act, 1, config, Device::Cpu, 5).unwrap()
    });
}

#[test]
fn ddpg_on_two_learners_steps_as_one_learner_on_both_batches() {
    continuous_ranks_and_one("ddpg", |batch_size| {
        let config = DdpgConfig { batch_size, hidden_sizes: vec![32], bf16: false, ..Default::default() };
        let (obs, act) = continuous_spaces();
        Td3::ddpg(&obs, &act, 1, config, Device::Cpu, 5).unwrap()
    });
}

/// SAC on two ranks of batch `b` (critic, actor and entropy-coefficient gradients all-reduced: three slots)
/// against one learner on both ranks' transitions and Gaussian draws: same actor, critics and α.
#[test]
fn sac_on_two_learners_steps_as_one_learner_on_both_batches() {
    let (b, world, steps) = (16usize, 2usize, 12u64);
    let build = |batch_size| {
        let config = SacConfig { batch_size, hidden_sizes: vec![32], bf16: false, ..Default::default() };
        let (obs, act) = continuous_spaces();
        Sac::new(&obs, &act, 1, config, Device::Cpu, 5).unwrap()
    };
    let batch = move |rank: usize, t: u64| {
        let obs: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t)).collect();
        let next: Vec<f32> = (0..b).flat_map(|i| obs_of(rank * b + i, t + 1)).collect();
        let draw = |salt: usize| -> Vec<f32> {
            (0..2 * b).map(|i| (((i * 13 + rank * 7 + salt + t as usize) % 17) as f32 - 8.0) / 4.0).collect()
        };
        let actions: Vec<f32> = (0..2 * b).map(|i| ((i * 5 + rank * 3 + t as usize) % 11) as f32 / 5.0 - 1.0).collect();
        let rewards: Vec<f32> = (0..b).map(|i| ((i * 7 + rank) % 5) as f32 * 0.3 - 0.5).collect();
        let bootstrap: Vec<f32> = (0..b).map(|i| if (i + t as usize).is_multiple_of(9) { 0.0 } else { 0.99 }).collect();
        (obs, actions, rewards, bootstrap, next, draw(1), draw(5))
    };
    let ranks = on_ranks(world, move |rank, sync| {
        let mut agent = build(b);
        agent.set_data_parallel(DataParallel::new(Some(sync), 1).unwrap()).unwrap();
        for t in 0..steps {
            let (o, a, r, g, n, e, e2) = batch(rank, t);
            agent.train_on(&o, &a, &r, &g, &n, &e, &e2).unwrap();
        }
        (agent.policy_params().flat().copy(), agent.critic_params().flat().copy(), agent.ent_coef())
    });
    let mut one = build(2 * b);
    for t in 0..steps {
        let (mut x, y) = (batch(0, t), batch(1, t));
        x.0.extend(y.0);
        x.1.extend(y.1);
        x.2.extend(y.2);
        x.3.extend(y.3);
        x.4.extend(y.4);
        x.5.extend(y.5);
        x.6.extend(y.6);
        one.train_on(&x.0, &x.1, &x.2, &x.3, &x.4, &x.5, &x.6).unwrap();
    }
    for (rank, (actor, critic, alpha)) in ranks.iter().enumerate() {
        assert_close(&format!("sac rank {rank} actor"), actor, one.policy_params().flat());
        assert_close(&format!("sac rank {rank} critic"), critic, one.critic_params().flat());
        assert!(
            (alpha - one.ent_coef()).abs() <= 2e-6 * one.ent_coef(),
            "sac rank {rank} α {alpha} vs {}",
            one.ent_coef()
        );
    }
    assert!(ranks[0].0.equal(&ranks[1].0) && ranks[0].1.equal(&ranks[1].1), "ranks hold bit-identical parameters");
}
