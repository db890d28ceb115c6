//! u8 frames end to end: Atari observations stepped through `make_vector` (as actors step them) are packed into
//! a chunk, sent over loopback gRPC to a learner hub, validated there, read step by step (true next observations
//! from the chunk's final-observation index) and pushed
//! through DQN's n-step accumulator into the frame replay; every stack sampled back equals, byte for byte, the
//! observation and true next observation the env produced. No f32 copy of a frame is made on the way.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_algorithms::data::frame_replay::FrameReplay;
use flotilla_algorithms::data::n_step::NStep;
use flotilla_algorithms::data::replay::ReplaySample;
use flotilla_core::{Chunk, ChunkSpec, DType, ObsBuf, ObsRef};
use flotilla_envs::{EnvRole, Kwargs, VecActions, make_vector};
use flotilla_learner::config::Family;
use flotilla_learner::hub::{Delivery, Hub, HubSpec};
use flotilla_transport::grpc::{GrpcClient, Limits, serve};
use flotilla_transport::{LearnerClient, MessageKey, Registration, RunInfo};
use rand::SeedableRng;

const TOKEN: &str = "frames-test";

#[test]
fn u8_frames_survive_vec_env_chunk_grpc_and_replay_unchanged() {
    flotilla_envs_python::register();
    // Short games (a frame limit) so that the chunk holds game ends and auto-resets, and life-loss terminals.
    let kwargs = Kwargs::new().with("max_num_frames_per_episode", 400i64);
    let (n_envs, n_steps) = (2usize, 160usize);
    let mut envs = make_vector("atari:breakout", &kwargs, n_envs, EnvRole::Training).unwrap();
    let (obs_space, act_space) = (envs.observation_space().clone(), envs.action_space().clone());
    let d = envs.obs_dim();
    // Step as an actor does, recording the chunk and, beside it, each transition's (obs, true next obs).
    let mut obs = envs.reset(Some(5)).unwrap().to_buf();
    let mut chunk = Chunk {
        actor_id: 0,
        policy_version: 0,
        n_steps,
        n_envs,
        obs: ObsBuf::empty(DType::U8),
        bootstrap_obs: ObsBuf::empty(DType::U8),
        actions: vec![],
        rewards: vec![],
        terminated: vec![],
        truncated: vec![],
        log_probs: vec![],
        values: vec![],
        initial_state: Vec::new(),
        final_index: vec![],
        final_obs: ObsBuf::empty(DType::U8),
        episodes: vec![],
    };
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut next = ObsBuf::empty(DType::U8);
    for t in 0..n_steps {
        let actions: Vec<i64> = (0..n_envs).map(|e| ((t * 7 + e * 3) % 4) as i64).collect();
        assert!(chunk.obs.extend(obs.as_ref()));
        let step = envs.step(&VecActions::Discrete(&actions)).unwrap();
        step.true_next_obs(&mut next);
        for e in 0..n_envs {
            if let Some(last) = step.final_obs(e) {
                chunk.final_index.push((t * n_envs + e) as u32);
                assert!(chunk.final_obs.extend(last));
            }
            let row = e * d..(e + 1) * d;
            let (ObsBuf::U8(o), ObsBuf::U8(n)) = (&obs, &next) else { panic!("frames are u8") };
            expected.push((o[row.clone()].to_vec(), n[row].to_vec()));
        }
        chunk.actions.extend(actions.iter().map(|&a| a as f32));
        chunk.rewards.extend_from_slice(step.rewards);
        chunk.terminated.extend_from_slice(step.terminated);
        chunk.truncated.extend_from_slice(step.truncated);
        chunk.episodes.extend_from_slice(step.episodes);
        obs = step.obs.to_buf();
    }
    chunk.bootstrap_obs = obs;
    assert!(chunk.terminated.iter().any(|&x| x), "the chunk covers episode ends");
    assert!(!chunk.episodes.is_empty(), "and whole games ending (frame limit)");

    // Over gRPC to an off-policy hub, which validates the chunk against the registered spaces.
    let spec = HubSpec {
        run: RunInfo { run_id: "frames".into(), config_toml: String::new() },
        chunk: ChunkSpec {
            observation_space: obs_space.clone(),
            action_space: act_space.clone(),
            obs_dim: d,
            obs_dtype: DType::U8,
            act_dim: 1,
            n_envs,
            n_steps,
            needs_behaviour: false,
            n_tasks: 0,
            state_dim: 0,
            state_bounded: 0,
        },
        family: Family::OffPolicy,
        n_actors: 1,
        seed: 0,
        n_params: 1,
        queue: 4,
        synchronous: false,
        max_refused_in_a_row: 20,
        total_env_steps: u64::MAX,
    };
    let (hub, mut rx): (Arc<Hub>, _) = Hub::new(spec, vec![0.0]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let limits = Limits { max_message_bytes: 64 << 20, ..Limits::default() };
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = serve(runtime.handle(), hub.clone(), addr, TOKEN, &limits).unwrap();
    let mut client =
        GrpcClient::connect(&server.local_addr.to_string(), TOKEN, &limits, Duration::from_secs(10)).unwrap();
    let registration = Registration {
        run_id: "frames".into(),
        observation_space: obs_space,
        action_space: act_space,
        n_envs,
        actor_index: Some(0),
        host: "localhost".into(),
        pid: std::process::id(),
    };
    chunk.actor_id = client.register(&registration).unwrap().actor_id;
    client.send_chunk(&chunk, MessageKey::NONE).unwrap();
    let received = match runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), rx.recv()).await }) {
        Ok(Some(Delivery::Chunk(c))) => c,
        other => panic!("no chunk delivered: {}", other.is_ok()),
    };
    assert_eq!(received.obs.dtype(), DType::U8, "frames arrive as bytes");
    assert_eq!(received.obs, chunk.obs);

    // Into the replay as the DQN learner puts it there: transitions, n-step (n = 1), frame replay.
    let mut n_step = NStep::<u8>::new(1, n_envs, d, 1, 0.99).unwrap();
    let mut replay = FrameReplay::new(4 * n_steps * n_envs, 4, 84 * 84, 1).unwrap();
    let (mut scratch, mut cursor) = (ObsBuf::empty(DType::U8), 0);
    for t in 0..received.n_steps {
        let rows = t * n_envs..(t + 1) * n_envs;
        let next = received.next_obs_rows(t, d, &mut scratch, &mut cursor);
        let (ObsRef::U8(o), ObsRef::U8(n)) = (received.obs.slice(rows.start * d..rows.end * d), next) else {
            panic!("frames are u8")
        };
        let (a, r) = (&received.actions[rows.clone()], &received.rewards[rows.clone()]);
        let (te, tr) = (&received.terminated[rows.clone()], &received.truncated[rows]);
        n_step.push(o, a, r, te, tr, n, |e| replay.push(e)).unwrap();
    }
    assert_eq!(replay.len(), expected.len());
    // Far fewer frames than 8 per transition: each distinct frame once.
    assert!((replay.frames_written() as usize) < 2 * expected.len(), "{} frames", replay.frames_written());
    let mut sample = ReplaySample::default();
    replay.sample(4 * expected.len(), &mut rand_pcg::Pcg64::seed_from_u64(0), &mut sample).unwrap();
    // Transitions enter the replay env by env at each step, i.e. in `expected`'s order.
    for row in 0..sample.rewards.len() {
        let (o, n) = &expected[sample.indices[row]];
        assert_eq!(&sample.obs[row * d..(row + 1) * d], &o[..], "row {row}: observation");
        assert_eq!(&sample.next_obs[row * d..(row + 1) * d], &n[..], "row {row}: true next observation");
    }
    server.shutdown();
}
