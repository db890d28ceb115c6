//! `flotilla-bench-learners`: data-parallel learners on libtorch's c10d (Gloo over 127.0.0.1), side by side in
//! one run.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-learners [-- --only allreduce|compression|cnn
//!     --rounds R]
//! ```
//! Every rank is a process of its own (this binary started again with `--child`), one torch thread each, as
//! `flotilla train --learners L` runs them.
//!
//! **allreduce.** All-reduce (sum) of 1.7 M floats (1,693,362: a Nature-CNN's parameters) and 10 M floats at 2
//! and 4 ranks. Each timed iteration starts after a barrier; the time is the median over R iterations of the
//! slowest rank's. Bus bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw · 2(n−1)/n (what
//! each rank's links carry in a ring all-reduce). Against it, measured in the same run: a raw TCP stream over
//! loopback (256 MiB written in 4 MiB writes to a reader that discards them, between two processes), and a
//! ring all-reduce written straight on TCP sockets between the same number of processes ([`RawRing`]: the same
//! traffic as Gloo's ring, both directions at once, with nothing but the sums added) — what this wire allows an
//! all-reduce.
//!
//! **compression.** The 1.7 M-float gradient at 2 ranks through `GradientCodec` (none, fp16, bf16, top-k 10 %
//! and 1 %): payload bytes each rank puts on the wire per step, median time per step, and the relative error
//! of one step's result against the exact f32 mean (top-k's error is large by design: error feedback carries
//! what it held back into later steps).
//!
//! **cnn.** Learner samples/s of the Nature-CNN PPO update (`flotilla_tests::cnn_bench`: pong_ppo.toml's shape,
//! f32 NCHW, one torch thread per learner) with 1 learner and with 2 learners all-reducing every gradient step;
//! samples/s of 2 learners = 2 × one learner's batch / the update time. GFLOP/s against the f32 matmul peak
//! measured in the same run on 1 and 2 threads.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_algorithms::DataParallel;
use flotilla_algorithms::nn::nets::CnnOptions;
use flotilla_collective::codec::{Compression, GradientCodec};
use flotilla_collective::{GroupOptions, ProcessGroup, Rendezvous};
use flotilla_learner::data_parallel::CollectiveSync;
use flotilla_tests::cnn_bench::{PongPpoUpdate, matmul_peak, nature_cnn_gflops};
use tch::{Device, Kind, Tensor};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A Nature-CNN's parameter count (PPO's actor-critic on 4×84×84 frames, 6 actions).
const CNN_PARAMS: i64 = 1_693_362;

/// A free port on 127.0.0.1 for a rendezvous store or a TCP stream.
fn free_port() -> BenchResult<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Run `task` (with `args`) on `world` rank processes; each prints one `RESULT v1 v2 …` line. Returns each
/// rank's values. Ranks that fail or hang past `limit` are killed and reported.
fn on_ranks(task: &str, args: &[String], world: usize, rounds: usize, limit: Duration) -> BenchResult<Vec<Vec<f64>>> {
    let exe = std::env::current_exe()?;
    let port = free_port()?.to_string();
    let mut children: Vec<Child> = Vec::with_capacity(world);
    for rank in 0..world {
        let spawned = Command::new(&exe)
            .args(["--child", task, &rank.to_string(), &world.to_string(), &port, &rounds.to_string()])
            .args(args)
            .stdout(Stdio::piped())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(e) => {
                children.iter_mut().for_each(|c| drop(c.kill()));
                return Err(format!("starting rank {rank}: {e}").into());
            }
        }
    }
    let deadline = Instant::now() + limit;
    while children.iter_mut().any(|c| c.try_wait().ok().flatten().is_none()) {
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            children.iter_mut().for_each(|c| drop(c.wait()));
            return Err(format!("{task} {args:?} on {world} ranks: still running after {limit:?}; killed").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut results = Vec::with_capacity(world);
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child.wait()?;
        let mut stdout = String::new();
        child.stdout.take().ok_or("rank stdout")?.read_to_string(&mut stdout)?;
        let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT "));
        match (status.success(), line) {
            (true, Some(line)) => {
                results.push(line.split_whitespace().map(str::parse).collect::<Result<Vec<f64>, _>>()?);
            }
            _ => return Err(format!("{task} {args:?}: rank {rank} of {world} failed ({status})").into()),
        }
    }
    Ok(results)
}

/// This process as rank `rank` of `world`: join the group and run `task`, printing `RESULT …`.
fn child(mut args: impl Iterator<Item = String>) -> BenchResult<()> {
    let mut next = || args.next().ok_or("--child TASK RANK WORLD PORT ROUNDS [ARG]");
    let task = next()?;
    let (rank, world): (usize, usize) = (next()?.parse()?, next()?.parse()?);
    let (port, rounds): (u16, usize) = (next()?.parse()?, next()?.parse()?);
    let arg = next().ok();
    tch::set_num_threads(1);
    let options = GroupOptions { timeout: Duration::from_secs(120), ..GroupOptions::default() };
    let connect = || ProcessGroup::connect(&Rendezvous::local(rank, world, port), &options, b"bench");
    let values = match task.as_str() {
        "allreduce" => {
            let mut group = connect()?;
            let numel: i64 = arg.ok_or("allreduce SIZE")?.parse()?;
            let mut t = Tensor::ones([numel], (Kind::Float, Device::Cpu));
            vec![median_secs(rounds, &mut group, |g| Ok(g.all_reduce_sum(&mut t)?))?]
        }
        "ring" => {
            let mut group = connect()?;
            let numel: usize = arg.ok_or("ring SIZE")?.parse()?;
            let mut ring = RawRing::connect(&mut group, rank, world)?;
            // The baseline must be an all-reduce: check one sum before timing.
            let mut data = vec![rank as f32 + 1.0; numel];
            ring.all_reduce(&mut data)?;
            let want = (world * (world + 1) / 2) as f32;
            if let Some(i) = data.iter().position(|x| *x != want) {
                return Err(format!("raw ring: entry {i} is {} after the all-reduce, not {want}", data[i]).into());
            }
            vec![median_secs(rounds, &mut group, |_| ring.all_reduce(&mut data))?]
        }
        "compression" => {
            let mut group = connect()?;
            let compression = Compression::parse(&arg.ok_or("compression KIND")?)?;
            let grad = Tensor::randn([CNN_PARAMS], (Kind::Float, Device::Cpu)) * (rank as f64 + 1.0);
            let mut exact = grad.copy();
            group.all_reduce_mean(&mut exact)?;
            // One step's error, from a fresh residual; then the timed steps.
            let mut codec = GradientCodec::new(compression);
            let mut once = grad.copy();
            codec.all_reduce_mean(&mut group, &mut once)?;
            let error = (&once - &exact).norm().double_value(&[]) / exact.norm().double_value(&[]);
            let bytes = codec.payload_bytes(CNN_PARAMS) as f64;
            let secs = median_secs(rounds, &mut group, |g| {
                let mut step = grad.copy();
                Ok(codec.all_reduce_mean(g, &mut step)?)
            })?;
            vec![secs, bytes, error]
        }
        "cnn" => {
            let parallel = if world > 1 {
                let sync = CollectiveSync::new(Arc::new(Mutex::new(connect()?)), Compression::None, Default::default());
                Some(DataParallel::new(Some(Box::new(sync)), 1)?)
            } else {
                None
            };
            let mut update = PongPpoUpdate::new(CnnOptions::F32, parallel, tch::Device::Cpu)?;
            vec![update.samples_per_sec(rounds)?]
        }
        other => return Err(format!("unknown task {other:?}").into()),
    };
    let text: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    println!("RESULT {}", text.join(" "));
    Ok(())
}

/// Median seconds of `op` over `rounds` iterations after 2 warm-ups, each started after a barrier.
fn median_secs(
    rounds: usize,
    group: &mut ProcessGroup,
    mut op: impl FnMut(&mut ProcessGroup) -> BenchResult<()>,
) -> BenchResult<f64> {
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds + 2 {
        group.barrier()?;
        let start = Instant::now();
        op(group)?;
        if round >= 2 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The bandwidth baseline an all-reduce could reach on this wire: a ring all-reduce (reduce-scatter, then
/// all-gather; each rank sends 2(n−1)/n of the data) written straight on blocking TCP sockets between the
/// ranks, sending to the right neighbour on a thread while receiving from the left. A measuring stick only:
/// training uses c10d.
struct RawRing {
    rank: usize,
    world: usize,
    right: TcpStream,
    left: TcpStream,
}

impl RawRing {
    /// Connect each rank to its right neighbour (ports exchanged through the group's store).
    fn connect(group: &mut ProcessGroup, rank: usize, world: usize) -> BenchResult<RawRing> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        group.store().set(&format!("ring/{rank}"), &port.to_le_bytes())?;
        let right_port = group.store().get(&format!("ring/{}", (rank + 1) % world), Duration::from_secs(60))?;
        let right_port = u16::from_le_bytes(right_port.as_slice().try_into()?);
        let right = TcpStream::connect(("127.0.0.1", right_port))?;
        let (left, _) = listener.accept()?;
        right.set_nodelay(true)?;
        Ok(RawRing { rank, world, right, left })
    }

    /// Sum `data` over the ring, in place.
    fn all_reduce(&mut self, data: &mut [f32]) -> BenchResult<()> {
        let (n, r) = (self.world, self.rank);
        let (total, seg) = (data.len(), data.len().div_ceil(n));
        let bounds = move |i: usize| (i * seg).min(total)..((i + 1) * seg).min(total);
        let mut incoming = vec![0f32; seg];
        for phase in 0..2 {
            for step in 0..n - 1 {
                // Reduce-scatter sends segment r − step and adds in segment r − step − 1; all-gather sends
                // segment r + 1 − step (reduced) and copies in segment r − step.
                let (send, recv) = match phase {
                    0 => ((r + n - step) % n, (r + 2 * n - step - 1) % n),
                    _ => ((r + 1 + n - step) % n, (r + n - step) % n),
                };
                let out = as_bytes(&data[bounds(send)]).to_vec();
                let len = bounds(recv).len();
                let mut writer = self.right.try_clone()?;
                let sender = std::thread::spawn(move || writer.write_all(&out));
                self.left.read_exact(as_bytes_mut(&mut incoming[..len]))?;
                sender.join().map_err(|_| "ring sender panicked")??;
                let target = &mut data[bounds(recv)];
                if phase == 0 {
                    target.iter_mut().zip(&incoming[..len]).for_each(|(t, x)| *t += x);
                } else {
                    target.copy_from_slice(&incoming[..len]);
                }
            }
        }
        Ok(())
    }
}

fn as_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; the byte view covers the same memory.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}

fn as_bytes_mut(x: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) }
}

/// GB/s of one 256 MiB stream over loopback TCP between two processes (this one reading, a child writing).
fn tcp_stream_gbps() -> BenchResult<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let mut writer = Command::new(std::env::current_exe()?)
        .args(["--tcp-writer", &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let (mut stream, _) = listener.accept()?;
    let mut buf = vec![0u8; 4 << 20];
    let (mut total, start) = (0usize, Instant::now());
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n;
    }
    let secs = start.elapsed().as_secs_f64();
    writer.wait()?;
    Ok(total as f64 / secs / 1e9)
}

/// The writing side of [`tcp_stream_gbps`]: 256 MiB in 4 MiB writes.
fn tcp_writer(port: u16) -> BenchResult<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    let chunk = vec![7u8; 4 << 20];
    for _ in 0..64 {
        stream.write_all(&chunk)?;
    }
    Ok(())
}

fn allreduce_table(rounds: usize) -> BenchResult<()> {
    let tcp: Vec<f64> = (0..3).map(|_| tcp_stream_gbps()).collect::<BenchResult<_>>()?;
    let tcp = tcp.iter().copied().fold(0.0, f64::max);
    println!("\n## All-reduce (sum, f32, Gloo over 127.0.0.1) against a raw TCP stream\n");
    println!("Raw TCP stream over loopback (best of 3 × 256 MiB): **{tcp:.2} GB/s**\n");
    println!(
        "| floats | ranks | c10d time ms | algbw GB/s | busbw GB/s | busbw / TCP stream | raw TCP ring ms | ring busbw \
         GB/s | c10d / raw ring |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let busbw = |numel: i64, world: usize, secs: f64| {
        4.0 * numel as f64 / secs / 1e9 * 2.0 * (world as f64 - 1.0) / world as f64
    };
    for numel in [CNN_PARAMS, 10_000_000] {
        for world in [2usize, 4] {
            let size = [numel.to_string()];
            let slowest = |task| -> BenchResult<f64> {
                let results = on_ranks(task, &size, world, rounds, Duration::from_secs(300))?;
                Ok(results.iter().map(|r| r[0]).fold(0.0, f64::max))
            };
            let (c10d, ring) = (slowest("allreduce")?, slowest("ring")?);
            let (bus, ring_bus) = (busbw(numel, world, c10d), busbw(numel, world, ring));
            println!(
                "| {numel} | {world} | {:.2} | {:.2} | {bus:.2} | {:.0} % | {:.2} | {ring_bus:.2} | {:.0} % |",
                c10d * 1e3,
                4.0 * numel as f64 / c10d / 1e9,
                100.0 * bus / tcp,
                ring * 1e3,
                100.0 * bus / ring_bus
            );
        }
    }
    Ok(())
}

fn compression_table(rounds: usize) -> BenchResult<()> {
    println!("\n## Gradient compression: 1,693,362 floats at 2 ranks\n");
    println!(
        "| compression | payload bytes per rank per step | vs f32 | time ms (median, slowest rank) | relative error of one step |"
    );
    println!("|---|---:|---:|---:|---:|");
    let f32_bytes = 4.0 * CNN_PARAMS as f64;
    for kind in ["none", "fp16", "bf16", "topk:0.1", "topk:0.01"] {
        let results = on_ranks("compression", &[kind.to_string()], 2, rounds, Duration::from_secs(300))?;
        let secs = results.iter().map(|r| r[0]).fold(0.0, f64::max);
        let (bytes, error) = (results[0][1], results[0][2]);
        println!("| {kind} | {:.0} | {:.3} | {:.2} | {error:.2e} |", bytes, bytes / f32_bytes, secs * 1e3);
    }
    Ok(())
}

fn cnn_table(rounds: usize) -> BenchResult<()> {
    tch::set_num_threads(1);
    let peak1 = matmul_peak(Kind::Float);
    tch::set_num_threads(2);
    let peak2 = matmul_peak(Kind::Float);
    println!("\n## Nature-CNN PPO update: 1 vs 2 data-parallel learners (one torch thread each)\n");
    println!("f32 matmul peak (1024², same run): {peak1:.1} GFLOP/s on 1 thread, {peak2:.1} on 2\n");
    println!("| learners | samples/s (all learners) | speed-up | GFLOP/s | share of the peak on as many threads |");
    println!("|---:|---:|---:|---:|---:|");
    let mut one = 0.0;
    for world in [1usize, 2] {
        let results = on_ranks("cnn", &[], world, rounds, Duration::from_secs(600))?;
        // Synchronous learners update in step: the slowest sets the pace.
        let per_rank = results.iter().map(|r| r[0]).fold(f64::INFINITY, f64::min);
        let total = per_rank * world as f64;
        if world == 1 {
            one = total;
        }
        let peak = if world == 1 { peak1 } else { peak2 };
        let gflops = nature_cnn_gflops(total);
        println!("| {world} | {total:.0} | {:.2}× | {gflops:.1} | {:.0} % |", total / one, 100.0 * gflops / peak);
    }
    Ok(())
}

fn main() -> BenchResult<()> {
    let mut args = std::env::args().skip(1);
    let (mut only, mut rounds) = (None, 5usize);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--child" => return child(args),
            "--tcp-writer" => return tcp_writer(args.next().ok_or("--tcp-writer PORT")?.parse()?),
            "--only" => only = Some(args.next().ok_or("--only allreduce|compression|cnn")?),
            "--rounds" => rounds = args.next().ok_or("--rounds R")?.parse()?,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: [--only allreduce|compression|cnn] [--rounds R]"
                )
                .into());
            }
        }
    }
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    println!("# flotilla-bench-learners ({} CPUs)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    if wanted("allreduce") {
        allreduce_table(rounds)?;
    }
    if wanted("compression") {
        compression_table(rounds)?;
    }
    if wanted("cnn") {
        cnn_table(rounds)?;
    }
    Ok(())
}
