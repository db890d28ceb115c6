//! The collectives between real c10d ranks on 127.0.0.1: ranks as threads of this test for the arithmetic, as
//! child processes (this test binary run again, `FLOTILLA_TEST_RANK` set) where one must be killed.
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_collective::codec::{Compression, GradientCodec};
use flotilla_collective::{Error, GroupOptions, ProcessGroup, Rendezvous};
use tch::{Device, Kind, Tensor};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn options(timeout_s: u64) -> GroupOptions {
    GroupOptions {
        timeout: Duration::from_secs(timeout_s),
        rendezvous_timeout: Duration::from_secs(timeout_s),
        ..GroupOptions::default()
    }
}

/// Run `body(rank, group)` on `world` ranks, one thread each, and return what each returned, by rank.
fn on_ranks<T: Send + 'static>(
    world: usize,
    fingerprint: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
    body: impl Fn(usize, Result<ProcessGroup, Error>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let port = free_port();
    let shared = std::sync::Arc::new((fingerprint, body));
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let group =
                    ProcessGroup::connect(&Rendezvous::local(rank, world, port), &options(20), &(shared.0)(rank));
                (shared.1)(rank, group)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn all_reduce_broadcast_all_gather_and_barrier_agree_across_three_ranks() {
    let results = on_ranks(
        3,
        |_| b"same config".to_vec(),
        |rank, group| {
            let mut group = group.unwrap();
            assert_eq!((group.rank(), group.world_size()), (rank, 3));
            // Sum and mean of rank-dependent values: 1.7 M floats, the size of a Nature CNN's gradient.
            let n = 1_700_000;
            let base = Tensor::arange(n, (Kind::Float, Device::Cpu)).g_mul_scalar(1e-3);
            let mut sum = &base + rank as f64;
            group.all_reduce_sum(&mut sum).unwrap();
            let mut mean = &base * (rank as f64 + 1.0);
            group.all_reduce_mean(&mut mean).unwrap();
            // Rank 2's values reach everyone.
            let mut b = Tensor::full([5], rank as f64 * 10.0, (Kind::Float, Device::Cpu));
            group.broadcast(&mut b, 2).unwrap();
            let gathered = group.all_gather(&Tensor::from_slice(&[rank as i64, 100 + rank as i64])).unwrap();
            group.barrier().unwrap();
            (
                (&sum - (&base * 3.0 + 3.0)).abs().max().double_value(&[]),
                (&mean - &base * 2.0).abs().max().double_value(&[]),
                Vec::<f32>::try_from(&b).unwrap(),
                Vec::<i64>::try_from(gathered.flatten(0, -1)).unwrap(),
            )
        },
    );
    for (rank, (sum_err, mean_err, b, gathered)) in results.into_iter().enumerate() {
        assert!(sum_err < 1e-2, "rank {rank}: sum off by {sum_err}");
        assert!(mean_err < 1e-2, "rank {rank}: mean off by {mean_err}");
        assert_eq!(b, vec![20.0; 5], "rank {rank}: broadcast from rank 2");
        assert_eq!(gathered, vec![0, 100, 1, 101, 2, 102], "rank {rank}: all-gather in rank order");
    }
}

#[test]
fn ranks_started_with_different_configs_are_refused_before_any_collective() {
    let errors = on_ranks(
        2,
        |rank| if rank == 0 { b"config A".to_vec() } else { b"config B".to_vec() },
        |_, group| group.map(|_| ()).unwrap_err().to_string(),
    );
    for e in errors {
        assert!(e.contains("different config"), "{e}");
    }
}

#[test]
fn a_rank_that_never_comes_times_out_the_rendezvous_naming_it() {
    let port = free_port();
    let opts = GroupOptions { rendezvous_timeout: Duration::from_secs(2), ..options(2) };
    let t0 = Instant::now();
    let err = ProcessGroup::connect(&Rendezvous::local(0, 2, port), &opts, b"x").unwrap_err().to_string();
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}", t0.elapsed());
    assert!(err.contains("rank 1 of 2 did not join"), "{err}");
    // A rank whose store host never comes fails the same way, naming the address.
    let err = ProcessGroup::connect(&Rendezvous::local(1, 2, free_port()), &opts, b"x").unwrap_err().to_string();
    assert!(err.contains("could not reach the rendezvous store at 127.0.0.1"), "{err}");
}

#[test]
fn diverged_parameters_are_named_by_rank() {
    let results = on_ranks(
        3,
        |_| b"c".to_vec(),
        |rank, group| {
            let mut group = group.unwrap();
            let same = Tensor::arange(1000, (Kind::Float, Device::Cpu));
            group.check_identical("parameters", &same).unwrap();
            // Rank 2 differs in one element by one ulp-ish amount.
            let differs = same.copy();
            if rank == 2 {
                let _ = differs.get(500).fill_(500.0001);
            }
            group.check_identical("parameters", &differs).unwrap_err().to_string()
        },
    );
    for e in results {
        assert!(e.contains("parameters diverged") && e.contains("[2]"), "{e}");
    }
}

/// The child-process side of [`a_killed_rank_makes_the_others_fail_naming_it`]: all-reduce in a loop until
/// killed or failed; print the error and exit 3.
#[test]
fn rank_process() {
    let Ok(rank) = std::env::var("FLOTILLA_TEST_RANK") else { return };
    let rank: usize = rank.parse().unwrap();
    let world: usize = std::env::var("FLOTILLA_TEST_WORLD").unwrap().parse().unwrap();
    let port: u16 = std::env::var("FLOTILLA_TEST_PORT").unwrap().parse().unwrap();
    let mut group = ProcessGroup::connect(&Rendezvous::local(rank, world, port), &options(5), b"c").unwrap();
    println!("joined");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut t = Tensor::ones([100_000], (Kind::Float, Device::Cpu));
        if let Err(e) = group.all_reduce_sum(&mut t) {
            eprintln!("ERROR: {e}");
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::process::exit(0);
}

#[test]
fn a_killed_rank_makes_the_others_fail_naming_it() {
    if std::env::var("FLOTILLA_TEST_RANK").is_ok() {
        return;
    }
    let (world, port) = (3, free_port());
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(&exe)
                .args(["--exact", "rank_process", "--nocapture", "--test-threads", "1"])
                .env("FLOTILLA_TEST_RANK", rank.to_string())
                .env("FLOTILLA_TEST_WORLD", world.to_string())
                .env("FLOTILLA_TEST_PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let mut killed = children.remove(1);
    killed.kill().unwrap(); // SIGKILL
    let _ = killed.wait();
    let t0 = Instant::now();
    for (rank, child) in [0, 2].into_iter().zip(children) {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("rank {rank}: {stderr}");
        assert_eq!(out.status.code(), Some(3), "rank {rank} should fail, not finish: {stderr}");
        assert!(stderr.contains("lost rank 1"), "rank {rank} should name rank 1: {stderr}");
    }
    // Collective timeout 5 s, plus the heartbeat diagnosis.
    assert!(t0.elapsed() < Duration::from_secs(20), "the survivors took {:?} to fail", t0.elapsed());
}

#[test]
fn compressed_all_reduces_average_within_their_precision_and_top_k_loses_nothing() {
    let results = on_ranks(
        2,
        |_| b"c".to_vec(),
        |rank, group| {
            let mut group = group.unwrap();
            let n = 10_000;
            let grad_of = |step: i64| {
                // Rank- and step-dependent values over several orders of magnitude.
                let i = Tensor::arange(n, (Kind::Float, Device::Cpu));
                ((&i * 0.37 + step as f64 + rank as f64 * 5.0).sin()) * (&i * 1e-3).exp()
            };
            let exact_mean = |step: i64| {
                let i = Tensor::arange(n, (Kind::Float, Device::Cpu));
                (((&i * 0.37 + step as f64).sin() + (&i * 0.37 + step as f64 + 5.0).sin()) * 0.5) * (&i * 1e-3).exp()
            };
            let mut errors = vec![];
            for compression in [Compression::Fp16, Compression::Bf16] {
                let mut codec = GradientCodec::new(compression);
                let mut g = grad_of(0);
                codec.all_reduce_mean(&mut group, &mut g).unwrap();
                let rel = ((&g - exact_mean(0)).abs().max() / exact_mean(0).abs().max()).double_value(&[]);
                errors.push((compression.to_string(), rel, codec.bytes_sent()));
            }
            // Top-k 1 % with error feedback: what every rank sent over 50 steps, plus what each still holds back,
            // is exactly the sum of all gradients.
            let mut codec = GradientCodec::new(Compression::TopK { fraction: 0.01 });
            let mut delivered = Tensor::zeros([n], (Kind::Float, Device::Cpu));
            let mut truth = Tensor::zeros([n], (Kind::Float, Device::Cpu));
            for step in 0..50 {
                let mut g = grad_of(step);
                codec.all_reduce_mean(&mut group, &mut g).unwrap();
                delivered += &g * 2.0;
                truth += exact_mean(step) * 2.0;
            }
            let mut held_back = codec.residual().unwrap().copy();
            group.all_reduce_sum(&mut held_back).unwrap();
            let lost = ((&delivered + &held_back - &truth).abs().max() / truth.abs().max()).double_value(&[]);
            errors.push(("topk:0.01".into(), lost, codec.bytes_sent()));
            errors
        },
    );
    for errors in results {
        let [(_, fp16, fp16_bytes), (_, bf16, bf16_bytes), (_, topk, topk_bytes)] = errors.as_slice() else {
            panic!("{errors:?}")
        };
        assert!(*fp16 < 1e-3, "fp16 relative error {fp16}");
        assert!(*bf16 < 1e-2 && *bf16 > *fp16, "bf16 relative error {bf16} (fp16 {fp16})");
        assert!(*topk < 1e-4, "top-k with error feedback lost {topk} of the gradient");
        assert_eq!((*fp16_bytes, *bf16_bytes), (20_000, 20_000));
        assert_eq!(*topk_bytes, 50 * 100 * 8);
    }
}
