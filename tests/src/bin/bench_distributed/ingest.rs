//! Learner ingest, gRPC vs local (`--only ingest`): client threads send CartPole chunks into a [`Hub`] as fast
//! as acks come back, over loopback gRPC and then through in-process [`LocalClient`]s, while a consumer thread
//! drains the ingest queue and only counts; the table gives chunks/s, transitions/s and MiB/s per carrier.
//!
//! [`Hub`]: flotilla_learner::hub::Hub
//! [`LocalClient`]: flotilla_transport::local::LocalClient
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use flotilla_core::{Chunk, EpisodeStats, ObsBuf};
use flotilla_learner::hub::{Delivery, next_delivery};
use flotilla_transport::grpc::Limits;
use flotilla_transport::local::LocalClient;
use flotilla_transport::{LearnerClient, MessageKey, codec};
use prost::Message;
use tokio::sync::mpsc::Receiver;

use crate::hub::{
    BenchTls, Connect, ENVS, OBS_DIM, STEPS, TOKEN, cartpole_hub, grpc_connector, io_runtime, register, serve_grpc,
};
use crate::{Args, BenchResult};

/// A valid CartPole chunk: 8 envs × 128 steps, discrete actions as f32, behaviour log-probs and values, and an
/// episode end (mostly terminated, every fourth truncated) about every 40 steps per env.
fn cartpole_chunk() -> Chunk {
    let n = STEPS * ENVS;
    let wave = |i: usize, scale: f32| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * scale;
    let ends: Vec<usize> = (0..n).filter(|&i| (i / ENVS + 13 * (i % ENVS)) % 40 == 39).collect();
    let (mut terminated, mut truncated) = (vec![false; n], vec![false; n]);
    for (k, &i) in ends.iter().enumerate() {
        if k % 4 == 3 { truncated[i] = true } else { terminated[i] = true }
    }
    Chunk {
        actor_id: 0,
        policy_version: 0,
        n_steps: STEPS,
        n_envs: ENVS,
        obs: ObsBuf::F32((0..n * OBS_DIM).map(|i| wave(i, 0.2)).collect()),
        bootstrap_obs: ObsBuf::F32((0..ENVS * OBS_DIM).map(|i| wave(i + 3, 0.2)).collect()),
        actions: (0..n).map(|i| (i % 2) as f32).collect(),
        rewards: vec![1.0; n],
        terminated,
        truncated,
        log_probs: (0..n).map(|i| -0.69 + wave(i, 0.01)).collect(),
        values: (0..n).map(|i| 10.0 + wave(i, 5.0)).collect(),
        initial_state: Vec::new(),
        final_index: ends.iter().map(|&i| i as u32).collect(),
        final_obs: ObsBuf::F32((0..ends.len() * OBS_DIM).map(|i| wave(i + 7, 0.25)).collect()),
        episodes: ends
            .iter()
            .map(|_| EpisodeStats { episode_return: 40.0, length: 40, env_index: 0, truncated: false, task: None })
            .collect(),
    }
}

/// Chunks and transitions per second that reached the consumer.
struct Rate {
    chunks: f64,
    transitions: f64,
}

/// `clients` threads send `chunk` through `connect`ed clients as fast as they can while a consumer thread drains
/// `rx`; the rate is what the consumer received during `window`, after `warmup`.
fn measure_ingest(
    runtime: &tokio::runtime::Runtime,
    mut rx: Receiver<Delivery>,
    connect: Connect,
    clients: usize,
    chunk: &Chunk,
    (warmup, window): (Duration, Duration),
) -> BenchResult<Rate> {
    let (chunks, transitions) = (AtomicU64::new(0), AtomicU64::new(0));
    let (stop_clients, stop_consumer) = (AtomicBool::new(false), AtomicBool::new(false));
    let handle = runtime.handle();
    thread::scope(|s| {
        let consumer = s.spawn(|| {
            while !stop_consumer.load(Ordering::Relaxed) {
                if let Some(Delivery::Chunk(c)) = next_delivery(handle, &mut rx, Duration::from_millis(20)) {
                    transitions.fetch_add(c.transitions() as u64, Ordering::Relaxed);
                    chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let senders: Vec<_> = (0..clients)
            .map(|i| {
                let stop = &stop_clients;
                s.spawn(move || -> BenchResult<()> {
                    let mut client = connect()?;
                    let mut chunk = chunk.clone();
                    chunk.actor_id = register(client.as_mut(), i)?;
                    // Keyed as an actor's messages are, so the learner's check for resends is in the measurement.
                    let mut key = MessageKey { sender: MessageKey::new_sender(), seq: 0 };
                    while !stop.load(Ordering::Relaxed) {
                        key.seq += 1;
                        client.send_chunk(&chunk, key)?;
                    }
                    Ok(())
                })
            })
            .collect();
        thread::sleep(warmup);
        let (c0, t0, start) = (chunks.load(Ordering::Relaxed), transitions.load(Ordering::Relaxed), Instant::now());
        thread::sleep(window);
        let (c1, t1, secs) =
            (chunks.load(Ordering::Relaxed), transitions.load(Ordering::Relaxed), start.elapsed().as_secs_f64());
        // The consumer keeps draining until every sender is out of a possibly full queue.
        stop_clients.store(true, Ordering::Relaxed);
        let results: Vec<BenchResult<()>> =
            senders.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("client thread panicked".into()))).collect();
        stop_consumer.store(true, Ordering::Relaxed);
        consumer.join().map_err(|_| "consumer thread panicked")?;
        results.into_iter().collect::<BenchResult<Vec<()>>>()?;
        Ok(Rate { chunks: (c1 - c0) as f64 / secs, transitions: (t1 - t0) as f64 / secs })
    })
}

pub(crate) fn ingest_table(args: &Args) -> BenchResult<()> {
    let timing = if args.quick {
        (Duration::from_millis(200), Duration::from_millis(500))
    } else {
        (Duration::from_millis(500), Duration::from_secs(2))
    };
    let chunk = cartpole_chunk();
    let bytes =
        codec::chunk_to_proto(&chunk, flotilla_transport::PROTOCOL_VERSION, flotilla_transport::MessageKey::NONE)
            .encoded_len();
    let runtime = io_runtime()?;
    println!(
        "## Learner ingest: gRPC (loopback) vs in-process ({ENVS} envs × {STEPS} steps CartPole chunks, {:.1} KiB \
         encoded, {} episode ends; {:.1} s per point)\n",
        bytes as f64 / 1024.0,
        chunk.final_index.len(),
        timing.1.as_secs_f64()
    );
    println!("| carrier | clients | chunks/s | transitions/s | MiB/s | vs local | TLS / plaintext |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let tls = BenchTls::new()?;
    let mut best_grpc: f64 = 0.0;
    for clients in [1, 2, 4] {
        let over = |tls: Option<&BenchTls>| -> BenchResult<Rate> {
            let (hub, rx) = cartpole_hub(clients, vec![0.0; 16])?;
            let server = serve_grpc(&runtime, &hub, &Limits::default(), tls)?;
            let connect = grpc_connector(server.local_addr, Limits::default(), tls);
            measure_ingest(&runtime, rx, &connect, clients, &chunk, timing)
        };
        let grpc = over(None)?;
        let grpc_tls = over(Some(&tls))?;

        let (hub, rx) = cartpole_hub(clients, vec![0.0; 16])?;
        let local_hub = hub.clone();
        let connect =
            move || Ok(Box::new(LocalClient::new(local_hub.clone(), TOKEN, TOKEN)?) as Box<dyn LearnerClient>);
        let local = measure_ingest(&runtime, rx, &connect, clients, &chunk, timing)?;

        best_grpc = best_grpc.max(grpc.transitions);
        let mib = |r: &Rate| r.chunks * bytes as f64 / (1 << 20) as f64;
        let row = |carrier: &str, r: &Rate, tls_ratio: &str| {
            let (chunks, m, mb) = (r.chunks, r.transitions / 1e6, mib(r));
            let vs_local = r.transitions / local.transitions;
            println!("| {carrier} | {clients} | {chunks:.0} | {m:.2} M | {mb:.0} | {vs_local:.2} | {tls_ratio} |");
        };
        row("gRPC", &grpc, "—");
        row("gRPC + TLS", &grpc_tls, &format!("{:.2}", grpc_tls.transitions / grpc.transitions));
        row("local", &local, "—");
    }
    let verdict = if best_grpc >= 1e6 { "met" } else { "NOT met" };
    println!("\nTarget ≥ 1 M transitions/s over loopback gRPC: {verdict} (best {:.2} M/s).\n", best_grpc / 1e6);
    Ok(())
}
