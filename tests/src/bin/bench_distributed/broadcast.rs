//! Parameter broadcast (`--only broadcast`): a Nature-CNN's worth of parameters is published on a gRPC hub and
//! 256, 16 and 1 registered clients (16 and 1 with `--quick`) each fetch the new version at once, in plaintext
//! and over TLS; the table gives the time from `publish` until every client holds it (median and max over the
//! rounds) and the aggregate MB/s.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Instant;

use flotilla_algorithms::nn::nets::NatureCnn;
use flotilla_transport::LearnerClient;
use flotilla_transport::grpc::Limits;

use crate::hub::{BenchTls, cartpole_hub, grpc_connector, io_runtime, register, serve_grpc};
use crate::{Args, BenchResult, BoxError};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Parameters of a Nature-CNN torso for 4 stacked 84×84 frames with an 18-action linear head.
fn nature_cnn_params() -> usize {
    let (_, named) = NatureCnn::init("cnn", &[4, 84, 84], &[(18, 1.0)], 0).expect("84×84 frames fit the CNN");
    named.iter().map(|(_, t)| t.numel()).sum()
}

/// Seconds from `publish` until all `clients` hold the new version, for `rounds` rounds after a warm-up; over TLS
/// when `tls` is given.
fn broadcast_rounds(n_params: usize, clients: usize, rounds: usize, tls: Option<&BenchTls>) -> BenchResult<Vec<f64>> {
    let limits = Limits { max_message_bytes: 256 << 20, ..Limits::default() };
    let values: Vec<f32> = (0..n_params).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let (hub, _rx) = cartpole_hub(clients, values.clone())?;
    let runtime = io_runtime()?;
    let server = serve_grpc(&runtime, &hub, &limits, tls)?;
    let connect = grpc_connector(server.local_addr, limits, tls);
    let (start, done) = (Barrier::new(clients + 1), Barrier::new(clients + 1));
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |e: BoxError| {
        failure.lock().expect("failure slot").get_or_insert(e.to_string());
    };
    let mut times = Vec::new();
    thread::scope(|s| {
        for i in 0..clients {
            let (start, done, stop, connect, fail) = (&start, &done, &stop, &connect, &fail);
            s.spawn(move || {
                // Every client takes part in every barrier, even after a failure, so nobody waits forever.
                let setup = || -> BenchResult<(Box<dyn LearnerClient>, u64, u64)> {
                    let mut client = connect()?;
                    let id = register(client.as_mut(), i)?;
                    let have = client.params(id, None)?.ok_or("no initial parameters")?.version;
                    Ok((client, id, have))
                };
                let mut state = setup().map_err(fail).ok();
                start.wait(); // Everyone connected.
                done.wait();
                loop {
                    start.wait();
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Some((client, id, have)) = state.as_mut() {
                        match client.params(*id, Some(*have)) {
                            Ok(Some(p)) if p.value.len() == n_params => *have = p.version,
                            Ok(Some(p)) => fail(format!("{} parameters, expected {n_params}", p.value.len()).into()),
                            Ok(None) => fail("no new version after publish".into()),
                            Err(e) => fail(e.into()),
                        }
                    }
                    done.wait();
                }
            });
        }
        start.wait();
        done.wait();
        for round in 0..=rounds {
            let fresh = values.clone();
            let t0 = Instant::now();
            hub.publish(fresh);
            start.wait();
            done.wait();
            if round > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        stop.store(true, Ordering::SeqCst);
        start.wait();
    });
    drop(server);
    match failure.into_inner().expect("failure slot") {
        Some(e) => Err(format!("broadcast to {clients} clients: {e}").into()),
        None => Ok(times),
    }
}

pub(crate) fn broadcast_table(args: &Args) -> BenchResult<()> {
    let n_params = nature_cnn_params();
    let mb = n_params as f64 * 4.0 / 1e6;
    let rounds = if args.quick { 3 } else { 10 };
    println!(
        "## Parameter broadcast over loopback gRPC: Nature-CNN (4×84×84, 18 actions), {n_params} parameters = \
         {mb:.2} MB of f32; {rounds} rounds after a warm-up\n"
    );
    println!("| clients | TLS | median ms (publish → all have it) | max ms | aggregate MB/s (median) |");
    println!("|---:|---|---:|---:|---:|");
    let tls = BenchTls::new()?;
    let counts: &[usize] = if args.quick { &[16, 1] } else { &[256, 16, 1] };
    for &clients in counts {
        for over in [None, Some(&tls)] {
            let mut times = broadcast_rounds(n_params, clients, rounds, over)?;
            let max = times.iter().copied().fold(0.0, f64::max);
            let med = median(&mut times);
            let (ms, max_ms, rate) = (med * 1e3, max * 1e3, clients as f64 * mb / med);
            let tls = if over.is_some() { "yes" } else { "no" };
            println!("| {clients} | {tls} | {ms:.1} | {max_ms:.1} | {rate:.0} |");
        }
    }
    println!();
    Ok(())
}
