//! `flotilla-bench-population`: populations against their peers, as markdown tables.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-population [-- --suite speed|dqn|qrdqn|recurrent|a2c|sac|td3|ddpg|continuous|pbt|all] [--quick]
//! ```
//! Every measurement runs in a child process pinned with `taskset` (`taskset -c 0`: one core, `-c 0,1`: two):
//! Flotilla as this binary re-executed (`--child train CONFIG OUT`: the config trained in-process, one JSON line
//! of each member's counters), the peers as `tests/peers/sb3_zoo.py` (Stable-Baselines3, RL Zoo's
//! hyperparameters) and `tests/peers/jax_ppo.py` (PureJaxRL-style PPO, seeds vmapped) in their venvs under
//! `$FLOTILLA_CACHE` (default `~/.cache/flotilla`); a missing venv skips its rows with a line saying how to
//! install it. Run directories go under `$FLOTILLA_BENCH_DIR` (default `/tmp/flotilla-bench-population`).
//!
//! Suites:
//! 1. `speed`: PPO on CartPole-v1 (`cartpole_ppo.toml`, 100 K env steps per member, `torch_threads = 1`) on
//!    one core: the machine's fp32 matmul peak (libtorch, one thread), one Flotilla run on the fused CPU step
//!    and one on libtorch (`fused_cpu = false`), populations of 16 and 64 (fused: members in turn) and of 16
//!    on libtorch (batched update), SB3 one seed, JAX one and 16 seeds; then on two cores a population of 16 on
//!    two threads against SB3's 16 seeds in two processes. Update GFLOP/s are analytic FLOPs (below) over the
//!    learner's measured update seconds.
//! 2. `dqn`: DQN on CartPole-v1 (`cartpole_dqn.toml`, 50 K) on one core, Flotilla (fused CPU step and
//!    libtorch, each in f32 and — where the CPU has native bf16 — in bf16) against SB3, and the update's
//!    GFLOP/s against the matmul peak in its precision.
//! 3. `a2c`: A2C on CartPole-v1 (`cartpole_a2c.toml`, RL Zoo's hyperparameters: 8 envs, one gradient step per
//!    5 × 8 transitions, 500 K env steps per member) on one core: one Flotilla run on the fused CPU step (the
//!    default) and one on libtorch (`fused_cpu = false`), a population of 10 on one worker thread (fused, members
//!    in turn), SB3 one seed; the speed suite's table and analytic update GFLOP/s.
//! 4. `pbt`: PPO on CartPole-v1 with a random learning-rate × clip-range sweep over 8 members on two cores
//!    (`population.threads = 2`), with and without PBT, three repetitions: env steps until the best member's
//!    evaluation first reaches 475, members at 475 at the end, whether the best stays there.
//!
//! `--quick` shrinks every budget (4 K env steps, populations of 4 and 8, two PBT repetitions; A2C: 100 K env
//! steps, a population of 4) for a smoke run.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use flotilla_learner::config::ExperimentConfig;
use serde_json::{Value, json};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The solved threshold of CartPole-v1.
const SOLVED: f64 = 475.0;

fn main() -> BenchResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    let mut suite = "all".to_string();
    let mut quick = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--suite" => {
                suite =
                    it.next().ok_or("--suite speed|dqn|qrdqn|recurrent|a2c|sac|td3|ddpg|continuous|pbt|all")?.clone()
            }
            "--quick" => quick = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: [--suite speed|dqn|qrdqn|recurrent|a2c|sac|td3|ddpg|continuous|pbt|all] [--quick]"
                )
                .into());
            }
        }
    }
    if !["speed", "dqn", "qrdqn", "recurrent", "a2c", "sac", "td3", "ddpg", "continuous", "pbt", "all"]
        .contains(&suite.as_str())
    {
        return Err(format!(
            "--suite {suite:?}: expected speed, dqn, qrdqn, recurrent, a2c, sac, td3, ddpg, continuous, pbt or all"
        )
        .into());
    }
    let root = std::env::var_os("FLOTILLA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/flotilla-bench-population"));
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let bench = Bench { dir: root.join(format!("run-{stamp}-{}", std::process::id())), quick };
    std::fs::create_dir_all(&bench.dir)?;
    println!(
        "# flotilla-bench-population{}\n",
        if quick { " (--quick: smoke budgets, not benchmark numbers)" } else { "" }
    );
    println!("Run directories: `{}`. Every row is a child process pinned with `taskset`.\n", bench.dir.display());
    let peak = bench.peak()?;
    println!(
        "Machine peak (fp32, one thread, core 0, best of 5): matmul {:.1} GFLOP/s (the faster of libtorch's 2048² \
         matmul and matrixmultiply's 1024² sgemm); libtorch bmm 16 × [256×64 @ 64×64] {:.1} GFLOP/s{}.\n",
        peak.matmul,
        peak.bmm,
        peak.bf16.map_or(String::new(), |p| format!("; bf16 (libtorch 2048² matmul) {p:.1} GFLOP/s"))
    );
    if suite == "speed" || suite == "all" {
        bench.speed(&peak)?;
    }
    if suite == "dqn" || suite == "all" {
        bench.dqn(&peak, "dqn")?;
    }
    if suite == "qrdqn" || suite == "all" {
        bench.dqn(&peak, "qrdqn")?;
    }
    if suite == "recurrent" || suite == "all" {
        bench.recurrent()?;
    }
    if suite == "a2c" || suite == "all" {
        bench.a2c(&peak)?;
    }
    for algo in ["sac", "td3", "ddpg"] {
        if suite == algo || suite == "continuous" || suite == "all" {
            bench.continuous(algo)?;
        }
    }
    if suite == "pbt" || suite == "all" {
        bench.pbt()?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Child processes: what runs under taskset.

/// `--child peak` (matmul GFLOP/s, one thread) or `--child train CONFIG OUT` (train the config in-process).
fn child(args: &[String]) -> BenchResult<()> {
    match args.first().map(String::as_str) {
        Some("peak") => {
            tch::set_num_threads(args.get(1).map_or(Ok(1), |t| t.parse())?);
            let (matmul, bmm) = peak_gflops();
            let bf16 = flotilla_algorithms::nn::nets::cpu_has_native_bf16().then(bf16_peak_gflops);
            let sgemm = sgemm_peak_gflops();
            println!("{}", json!({ "matmul": matmul, "bmm": bmm, "bf16": bf16, "sgemm": sgemm }));
            Ok(())
        }
        Some("train") if args.len() == 3 => {
            flotilla_learner::tune_allocator();
            let config = ExperimentConfig::load(Path::new(&args[1]), &[])?;
            let started = Instant::now();
            let reports: Vec<(u64, flotilla_learner::progress::TrainReport)> = if config.population.is_some() {
                let share = flotilla_learner::population::JobShare::ALL;
                flotilla_learner::population::train(&config, Path::new(&args[2]), share, u64::MAX)?
                    .into_iter()
                    .map(|m| (m.seed, m.report))
                    .collect()
            } else {
                let (_, report) = flotilla_learner::train::train(&config, &mut |_| Ok(()))?;
                vec![(config.run.seed, report)]
            };
            let wall = started.elapsed().as_secs_f64();
            let members: Vec<Value> = reports
                .iter()
                .map(|(seed, r)| {
                    json!({
                        "seed": seed, "train_secs": r.train_secs, "update_secs": r.update_secs,
                        "gradient_steps": r.gradient_steps, "updates": r.updates, "env_steps": r.env_steps,
                        "final_return": r.final_eval().mean(),
                    })
                })
                .collect();
            println!("{}", json!({ "wall_secs": wall, "members": members }));
            Ok(())
        }
        _ => Err("--child peak [THREADS] | --child train CONFIG OUT".into()),
    }
}

/// The shortest of six timings of `f` in seconds (the first warms up; "best of 5" below).
fn best_secs(mut f: impl FnMut()) -> f64 {
    (0..6)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// GFLOP/s of a libtorch `n × n` matmul in `kind`, best of 5.
fn torch_matmul_gflops(n: i64, kind: tch::Kind) -> f64 {
    let opts = (kind, tch::Device::Cpu);
    let (a, b) = (tch::Tensor::randn([n, n], opts), tch::Tensor::randn([n, n], opts));
    2.0 * (n * n * n) as f64 / best_secs(|| drop(std::hint::black_box(a.matmul(&b)))) / 1e9
}

/// Best-of-5 GFLOP/s of a 2048² fp32 matmul and of a 16 × (256×64 @ 64×64) bmm (200 calls per repetition).
fn peak_gflops() -> (f64, f64) {
    use tch::{Device, Kind, Tensor};
    let opts = (Kind::Float, Device::Cpu);
    let matmul = torch_matmul_gflops(2048, Kind::Float);
    let (x, w) = (Tensor::randn([16, 256, 64], opts), Tensor::randn([16, 64, 64], opts));
    let calls = 200;
    let best = best_secs(|| {
        for _ in 0..calls {
            let _ = std::hint::black_box(x.bmm(&w));
        }
    });
    let bmm = calls as f64 * 2.0 * (16 * 256 * 64 * 64) as f64 / best / 1e9;
    (matmul, bmm)
}

/// Best-of-5 GFLOP/s of `matrixmultiply`'s sgemm (the fused host step's f32 matmul) on 1024² operands, one
/// thread.
fn sgemm_peak_gflops() -> f64 {
    let n = 1024usize;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    let mut c = vec![0f32; n * n];
    let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let (ni, one) = (n as isize, 1isize);
    let best = best_secs(|| {
        // SAFETY: a, b and c are n × n row-major (strides n, 1), c does not alias a or b.
        unsafe { matrixmultiply::sgemm(n, n, n, 1.0, ap, ni, one, bp, ni, one, 0.0, cp, ni, one) };
        std::hint::black_box(cp);
    });
    2.0 * (n * n * n) as f64 / best / 1e9
}

/// Best-of-5 GFLOP/s of a 2048² bf16 matmul (libtorch: oneDNN's AVX512-BF16 or AMX kernels, f32 sums).
fn bf16_peak_gflops() -> f64 {
    torch_matmul_gflops(2048, tch::Kind::BFloat16)
}

// ---------------------------------------------------------------------------------------------------------------
// The orchestrating process.

struct Bench {
    /// This invocation's run directories.
    dir: PathBuf,
    quick: bool,
}

struct Peak {
    matmul: f64,
    bmm: f64,
    /// The same matmul in bf16, where the CPU computes bf16 natively.
    bf16: Option<f64>,
}

/// One member of a Flotilla child's run, as it reported.
struct MemberRun {
    train_secs: f64,
    update_secs: f64,
    gradient_steps: u64,
    final_return: f64,
}

/// A Flotilla child's run.
struct FlotillaRun {
    /// Seconds of the child process, start to exit (libtorch loading, building, evaluations, files included).
    process_secs: f64,
    members: Vec<MemberRun>,
    /// Its run directory (populations only).
    out: PathBuf,
}

impl FlotillaRun {
    /// Training seconds of the whole run: Σ members' `train_secs` (collection and updates; evaluation excluded;
    /// a lockstep group's seconds are shared out equally) over the worker threads.
    fn train_secs(&self, threads: usize) -> f64 {
        self.members.iter().map(|m| m.train_secs).sum::<f64>() / threads as f64
    }

    /// Seconds inside updates, likewise.
    fn update_secs(&self, threads: usize) -> f64 {
        self.members.iter().map(|m| m.update_secs).sum::<f64>() / threads as f64
    }

    fn gradient_steps(&self) -> u64 {
        self.members.iter().map(|m| m.gradient_steps).sum()
    }

    fn solved(&self) -> usize {
        self.members.iter().filter(|m| m.final_return >= SOLVED).count()
    }
}

/// A peer's seeds: training seconds (summed over seeds, or one vmapped call) and final evaluations.
struct PeerRun {
    train_secs: f64,
    compile_secs: Option<f64>,
    process_secs: f64,
    returns: Vec<f64>,
}

impl PeerRun {
    fn solved(&self) -> usize {
        self.returns.iter().filter(|r| **r >= SOLVED).count()
    }

    /// Train seconds per seed (a vmapped call's shared out equally).
    fn per_seed(&self) -> f64 {
        self.train_secs / self.returns.len() as f64
    }
}

/// The table of the `speed` and `a2c` suites: one row per run on one core, its seconds per seed against SB3's.
struct SpeedTable {
    /// Analytic FLOPs of one member's gradient step.
    flops: f64,
    /// The machine's one-thread matmul GFLOP/s.
    peak: f64,
    /// SB3's train seconds per seed: what the speed column divides; None without its venv.
    sb3_per_seed: Option<f64>,
}

impl SpeedTable {
    fn header(&self) {
        println!(
            "| run | seeds | train s | s per seed | speed vs SB3 per seed | process wall s | \
             solved (final eval ≥ 475) | update GFLOP/s | % of matmul peak |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    }

    /// SB3's seconds per seed over `per_seed`.
    fn vs(&self, per_seed: f64) -> String {
        self.sb3_per_seed.map_or("—".to_string(), |s| format!("{:.2}×", s / per_seed))
    }

    /// A Flotilla run on one worker thread.
    fn flotilla(&self, label: &str, run: &FlotillaRun) {
        let n = run.members.len();
        let train = run.train_secs(1);
        let gflops = run.gradient_steps() as f64 * self.flops / run.update_secs(1).max(1e-9) / 1e9;
        println!(
            "| {label} | {n} | {train:.2} | {:.3} | {} | {:.2} | {} / {n} | {gflops:.2} | {:.1} % |",
            train / n as f64,
            self.vs(train / n as f64),
            run.process_secs,
            run.solved(),
            100.0 * gflops / self.peak
        );
    }

    /// A peer's run, or how to install it.
    fn peer(&self, label: &str, run: &Option<PeerRun>) {
        match run {
            None => println!("| {label} | not installed: bash scripts/setup_peers.sh --sb3 --jax | | | | | | | |"),
            Some(r) => {
                let n = r.returns.len();
                let train = match r.compile_secs {
                    Some(c) => format!("{:.2} (+{c:.1} compile)", r.train_secs),
                    None => format!("{:.2}", r.train_secs),
                };
                println!(
                    "| {label} | {n} | {train} | {:.3} | {} | {:.2} | {} / {n} | — | — |",
                    r.per_seed(),
                    self.vs(r.per_seed()),
                    r.process_secs,
                    r.solved()
                );
            }
        }
    }
}

/// One seed's fused CPU step against its libtorch step, for the line under a speed table.
fn fused_vs_libtorch(fused: &FlotillaRun, torch: &FlotillaRun) -> String {
    format!(
        "1 seed {:.2}× faster to train, its updates {:.2}× ({:.2} vs {:.2} update s)",
        torch.train_secs(1) / fused.train_secs(1),
        torch.update_secs(1) / fused.update_secs(1).max(1e-9),
        fused.update_secs(1),
        torch.update_secs(1)
    )
}

/// The notes under a speed table: what its columns measure; `formula` and `flops` are one gradient step's.
fn speed_notes(formula: &str, flops: f64) -> String {
    format!(
        "Notes: Flotilla's train s is Σ over members of `train_secs` ÷ worker threads (collection and updates, \
         evaluation excluded; a lockstep group's seconds are shared out equally among its members, so the sum is the \
         group's wall time); process wall s is the whole child process (libtorch loading, building, the final \
         evaluation, writing run directories). SB3's train s covers building the env and model and `learn()`. \
         Solved: the final 10-episode deterministic evaluation. Update GFLOP/s: analytic FLOPs per gradient step per \
         member, {:.2} MFLOP = 3 × 2 × batch × Σ (forward 2 × batch × Σ, backward twice that; {formula}), × \
         `charts/gradient_steps` summed over members, over the learner's measured update seconds (Σ members' \
         `update_secs`, which also hold the returns and advantages, not counted); % of matmul peak: of the \
         one-thread 2048² matmul above.",
        flops / 1e6
    )
}

fn cache_dir() -> PathBuf {
    std::env::var_os("FLOTILLA_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/flotilla")
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Run `program args` under `taskset -c cpus`, stdout captured; a failure shows the tail of its stderr.
fn pinned(cpus: &str, program: &Path, args: &[String], envs: &[(&str, &str)]) -> BenchResult<(String, f64)> {
    let mut cmd = Command::new("taskset");
    cmd.arg("-c").arg(cpus).arg(program).args(args).current_dir(repo());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let out = cmd.output().map_err(|e| format!("taskset {}: {e}", program.display()))?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(format!("{} {args:?} failed ({}):\n{}", program.display(), out.status, tail.join("\n")).into());
    }
    Ok((String::from_utf8(out.stdout)?, secs))
}

/// The JSON lines of a child's stdout.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok()).collect()
}

fn num(v: &Value, key: &str) -> BenchResult<f64> {
    v.get(key).and_then(Value::as_f64).ok_or_else(|| format!("no number {key:?} in {v}").into())
}

/// `examples/configs/NAME`'s text with `extra` (population tables) appended.
fn example_text(name: &str, extra: &str) -> BenchResult<String> {
    let text = std::fs::read_to_string(repo().join("examples/configs").join(name))?;
    Ok(format!("{text}\n{extra}"))
}

/// Overrides of a timed run: `steps` env steps per member, one libtorch thread, and only the final evaluation
/// (the tables time training, not evaluations).
fn timing_overrides(steps: u64) -> Vec<String> {
    vec![
        format!("run.total_env_steps={steps}"),
        "run.torch_threads=1".to_string(),
        "eval.interval_steps=1000000000".to_string(),
    ]
}

/// `[population]` of `size` members on `threads` threads.
fn population(size: usize, threads: usize, batched: bool) -> String {
    format!("[population]\nsize = {size}\nthreads = {threads}\nbatched = {batched}\n")
}

impl Bench {
    fn peak(&self) -> BenchResult<Peak> {
        let exe = std::env::current_exe()?;
        let (out, _) = pinned("0", &exe, &["--child".into(), "peak".into()], &[])?;
        let v = json_lines(&out).pop().ok_or("peak: no JSON line")?;
        // The f32 peak: libtorch's matmul or matrixmultiply's sgemm (the fused step's), whichever is faster here.
        let matmul = num(&v, "matmul")?.max(num(&v, "sgemm")?);
        Ok(Peak { matmul, bmm: num(&v, "bmm")?, bf16: v["bf16"].as_f64() })
    }

    /// Train `text` with `overrides` in a child pinned to `cpus`; `name` names its config and run directory.
    fn flotilla(&self, name: &str, cpus: &str, text: &str, overrides: &[String]) -> BenchResult<FlotillaRun> {
        eprintln!("[bench-population] flotilla {name} (taskset -c {cpus})");
        let config = ExperimentConfig::parse(text, overrides)?;
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config.to_toml())?;
        let out = self.dir.join(name);
        let exe = std::env::current_exe()?;
        let args = ["--child".into(), "train".into(), path.display().to_string(), out.display().to_string()];
        let (stdout, process_secs) = pinned(cpus, &exe, &args, &[])?;
        let v = json_lines(&stdout).pop().ok_or_else(|| format!("{name}: no JSON line"))?;
        let members = v["members"]
            .as_array()
            .ok_or("no members")?
            .iter()
            .map(|m| {
                Ok(MemberRun {
                    train_secs: num(m, "train_secs")?,
                    update_secs: num(m, "update_secs")?,
                    gradient_steps: num(m, "gradient_steps")? as u64,
                    final_return: num(m, "final_return")?,
                })
            })
            .collect::<BenchResult<Vec<_>>>()?;
        Ok(FlotillaRun { process_secs, members, out })
    }

    /// SB3 (`sb3_zoo.py`) on `seeds` in `procs` processes pinned to `cpus`, `threads` torch threads each; None
    /// without its venv.
    fn sb3(
        &self,
        algo: &str,
        seeds: &[u64],
        procs: usize,
        steps: u64,
        cpus: &str,
        threads: usize,
    ) -> BenchResult<Option<PeerRun>> {
        let python = cache_dir().join("peers-venv/bin/python");
        if !python.is_file() {
            return Ok(None);
        }
        eprintln!("[bench-population] sb3 {algo}: seeds {seeds:?}, --procs {procs} (taskset -c {cpus})");
        let mut args = vec!["tests/peers/sb3_zoo.py".to_string(), "--algo".into(), algo.into(), "--seeds".into()];
        args.extend(seeds.iter().map(u64::to_string));
        args.extend(["--procs".into(), procs.to_string(), "--steps".into(), steps.to_string()]);
        args.extend(["--threads".into(), threads.to_string()]);
        let (stdout, process_secs) = pinned(cpus, &python, &args, &[])?;
        let lines = json_lines(&stdout);
        if lines.len() != seeds.len() {
            return Err(format!("sb3_zoo.py: {} result lines for {} seeds", lines.len(), seeds.len()).into());
        }
        let train_secs = lines.iter().map(|l| num(l, "train_secs")).sum::<BenchResult<f64>>()? / procs as f64;
        let returns = lines.iter().map(|l| num(l, "final_return")).collect::<BenchResult<Vec<_>>>()?;
        Ok(Some(PeerRun { train_secs, compile_secs: None, process_secs, returns }))
    }

    /// JAX PPO (`jax_ppo.py`), `seeds` vmapped, one core; None without its venv.
    fn jax(&self, seeds: usize, steps: u64) -> BenchResult<Option<PeerRun>> {
        let python = cache_dir().join("peers-jax-venv/bin/python");
        if !python.is_file() {
            return Ok(None);
        }
        eprintln!("[bench-population] jax ppo: --seeds {seeds} (taskset -c 0)");
        let args = [
            "tests/peers/jax_ppo.py".to_string(),
            "--seeds".into(),
            seeds.to_string(),
            "--steps".into(),
            steps.to_string(),
        ];
        let flags = [("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")];
        let (stdout, process_secs) = pinned("0", &python, &args, &flags)?;
        let v = json_lines(&stdout).pop().ok_or("jax_ppo.py: no JSON line")?;
        let returns: Vec<f64> =
            v["eval_return"].as_array().ok_or("jax_ppo.py: no eval_return")?.iter().filter_map(Value::as_f64).collect();
        Ok(Some(PeerRun {
            train_secs: num(&v, "train_secs")?,
            compile_secs: Some(num(&v, "compile_secs")?),
            process_secs,
            returns,
        }))
    }

    // -----------------------------------------------------------------------------------------------------------

    fn speed(&self, peak: &Peak) -> BenchResult<()> {
        let steps: u64 = if self.quick { 4096 } else { 100_000 };
        let (small, large) = if self.quick { (4, 8) } else { (16, 64) };
        let overrides = |seed: u64| [timing_overrides(steps), vec![format!("run.seed={seed}")]].concat();
        let plain = example_text("cartpole_ppo.toml", "")?;
        let (flops, formula) = actor_critic_flops_per_step(&ExperimentConfig::parse(&plain, &[])?.to_toml())?;
        println!("## PPO CartPole-v1, {steps} env steps per seed, one core (taskset -c 0), torch_threads 1\n");
        // `fused`: the fused CPU step (the default); else every update on libtorch, members batched.
        let with_path = |seed: u64, fused: bool| {
            let mut o = overrides(seed);
            o.push(format!("algorithm.fused_cpu={fused}"));
            o
        };
        let one = self.flotilla("ppo-1", "0", &plain, &with_path(1, true))?;
        let one_torch = self.flotilla("ppo-1-libtorch", "0", &plain, &with_path(1, false))?;
        let pop = |n: usize, fused: bool| -> BenchResult<FlotillaRun> {
            let text = example_text("cartpole_ppo.toml", &population(n, 1, true))?;
            let tag = if fused { "fused" } else { "libtorch-batched" };
            self.flotilla(&format!("ppo-pop{n}-{tag}"), "0", &text, &with_path(1, fused))
        };
        let pop_small = pop(small, true)?;
        let pop_large = pop(large, true)?;
        let pop_torch = pop(small, false)?;
        let sb3 = self.sb3("ppo", &[1], 1, steps, "0", 1)?;
        let jax_one = self.jax(1, steps)?;
        let jax_many = self.jax(small, steps)?;

        let table = SpeedTable { flops, peak: peak.matmul, sb3_per_seed: sb3.as_ref().map(|s| s.per_seed()) };
        table.header();
        table.flotilla("Flotilla, 1 seed (fused CPU step)", &one);
        table.flotilla("Flotilla, 1 seed (libtorch step, fused_cpu = false)", &one_torch);
        table.flotilla(&format!("Flotilla population of {small} (fused CPU step)"), &pop_small);
        table.flotilla(&format!("Flotilla population of {large} (fused CPU step)"), &pop_large);
        table.flotilla(&format!("Flotilla population of {small} (libtorch, batched update)"), &pop_torch);
        table.peer("SB3 (RL Zoo), 1 seed", &sb3);
        table.peer("JAX PPO, 1 seed", &jax_one);
        table.peer(&format!("JAX PPO, {small} seeds vmapped"), &jax_many);
        println!(
            "\nFused CPU step vs libtorch: {}; population of {small}, fused members in turn vs the libtorch batched \
             update: {:.2}× ({:.2} vs {:.2} update s).",
            fused_vs_libtorch(&one, &one_torch),
            pop_torch.train_secs(1) / pop_small.train_secs(1),
            pop_small.update_secs(1),
            pop_torch.update_secs(1)
        );
        println!(
            "\n{} JAX's train s is one call of the compiled program (its compile time shown apart); its \
             solved counts its `eval_return`.\n",
            speed_notes(&formula, flops)
        );

        // Two cores: a population on two threads against SB3's seeds in two processes.
        println!(
            "## Two cores (taskset -c 0,1): population of {small} on 2 threads vs SB3 {small} seeds in 2 processes\n"
        );
        let text = example_text("cartpole_ppo.toml", &population(small, 2, true))?;
        let pop_two = self.flotilla(&format!("ppo-pop{small}-2threads"), "0,1", &text, &overrides(1))?;
        let seeds: Vec<u64> = (1..=small as u64).collect();
        let sb3_two = self.sb3("ppo", &seeds, 2, steps, "0,1", 1)?;
        println!("| run | seeds | train s | s per seed | process wall s | solved | update GFLOP/s |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let train = pop_two.train_secs(2);
        let gflops = pop_two.gradient_steps() as f64 * flops / pop_two.update_secs(2).max(1e-9) / 1e9;
        println!(
            "| Flotilla population (threads = 2, fused CPU step) | {small} | {train:.2} | {:.3} | {:.2} | {} / {small} | {gflops:.2} |",
            train / small as f64,
            pop_two.process_secs,
            pop_two.solved()
        );
        match &sb3_two {
            None => println!("| SB3, --procs 2 | not installed: bash scripts/setup_peers.sh --sb3 --jax | | | | | |"),
            Some(s) => {
                println!(
                    "| SB3 (RL Zoo), --procs 2 | {small} | {:.2} | {:.3} | {:.2} | {} / {small} | — |",
                    s.train_secs,
                    s.train_secs / small as f64,
                    s.process_secs,
                    s.solved()
                );
                println!(
                    "\nFlotilla is {:.2}× SB3's speed on two cores (train s; by process wall {:.2}×).",
                    s.train_secs / train,
                    s.process_secs / pop_two.process_secs
                );
            }
        }
        println!(
            "\nTrain s here: Σ members' train seconds ÷ 2 (Flotilla: Σ `train_secs` ÷ threads; SB3: Σ per-seed \
             `train_secs` ÷ processes), i.e. the wall time of two busy workers.\n"
        );
        Ok(())
    }

    /// DQN (`algo` "dqn": cartpole_dqn.toml against SB3's DQN) or QR-DQN ("qrdqn": cartpole_qrdqn.toml against
    /// SB3-contrib's QRDQN) on CartPole-v1, one core: the fused CPU step, the libtorch step, bf16 (DQN) and the peer.
    fn dqn(&self, peak: &Peak, algo: &str) -> BenchResult<()> {
        let steps: u64 = if self.quick { 4000 } else { 50_000 };
        let text = example_text(&format!("cartpole_{algo}.toml"), "")?;
        let overrides = timing_overrides(steps);
        let (flops, formula) = dqn_flops_per_step(&ExperimentConfig::parse(&text, &[])?.to_toml())?;
        let title = if algo == "qrdqn" { "QR-DQN" } else { "DQN" };
        println!("## {title} CartPole-v1 (`cartpole_{algo}.toml`), {steps} env steps, one core (taskset -c 0)\n");
        let with = |o: &[&str]| [&overrides[..], &o.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]].concat();
        let run = self.flotilla(&format!("{algo}-1"), "0", &text, &with(&["algorithm.bf16=false"]))?;
        let torch = self.flotilla(
            &format!("{algo}-1-libtorch"),
            "0",
            &text,
            &with(&["algorithm.bf16=false", "algorithm.fused_cpu=false"]),
        )?;
        // bf16 hidden layers, on the fused step and on libtorch, where the CPU has native bf16.
        let bf16 = peak
            .bf16
            .map(|_| -> BenchResult<_> {
                let fused = self.flotilla(&format!("{algo}-1-bf16"), "0", &text, &with(&["algorithm.bf16=true"]))?;
                let o = with(&["algorithm.bf16=true", "algorithm.fused_cpu=false"]);
                Ok((fused, self.flotilla(&format!("{algo}-1-libtorch-bf16"), "0", &text, &o)?))
            })
            .transpose()?;
        let sb3 = self.sb3(algo, &[1], 1, steps, "0", 1)?;
        println!("| run | train s | final return | gradient steps | update s | update GFLOP/s | % of matmul peak |");
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let mut rows = vec![
            ("Flotilla (fused CPU step, f32)", &run, peak.matmul),
            ("Flotilla (libtorch step, f32)", &torch, peak.matmul),
        ];
        if let (Some((fused, torch)), Some(p)) = (&bf16, peak.bf16) {
            rows.push(("Flotilla (fused CPU step, bf16)", fused, p));
            rows.push(("Flotilla (libtorch step, bf16)", torch, p));
        }
        for (label, r, peak) in rows {
            let m = &r.members[0];
            let gflops = m.gradient_steps as f64 * flops / m.update_secs.max(1e-9) / 1e9;
            println!(
                "| {label} | {:.2} | {:.1} | {} | {:.2} | {gflops:.2} | {:.1} % |",
                m.train_secs,
                m.final_return,
                m.gradient_steps,
                m.update_secs,
                100.0 * gflops / peak
            );
        }
        // The default: bf16 where the CPU has it natively, else f32 (both on the fused step).
        let (default, precision) = match &bf16 {
            Some((fused, _)) => (&fused.members[0], "bf16"),
            None => (&run.members[0], "f32"),
        };
        match &sb3 {
            None => println!("| SB3 | not installed: bash scripts/setup_peers.sh --sb3 --jax | | | | | |"),
            Some(s) => {
                let peer = if algo == "qrdqn" { "SB3-contrib QRDQN (RL Zoo)" } else { "SB3 (RL Zoo)" };
                println!("| {peer} | {:.2} | {:.1} | | | — | — |", s.train_secs, s.returns[0]);
                println!(
                    "\nFlotilla (the default here: fused step, {precision}) takes {:.2}× the peer's train seconds \
                     ({:.2}× its speed); in f32 {:.2}×.",
                    default.train_secs / s.train_secs,
                    s.train_secs / default.train_secs,
                    run.members[0].train_secs / s.train_secs
                );
            }
        }
        if let Some((fused, _)) = &bf16 {
            println!(
                "\nThe fused step in bf16 takes {:.2}× its f32 time (train seconds).",
                fused.members[0].train_secs / run.members[0].train_secs
            );
        }
        println!(
            "\nNotes: FLOPs per gradient step {formula} = {:.2} MFLOP; matmul peak {:.1} GFLOP/s (f32, one thread){}; \
             % of matmul peak is of the peak in the row's precision. Train s: Flotilla's collection and updates \
             (evaluation excluded), SB3's env and model construction and `learn()`.{}\n",
            flops / 1e6,
            peak.matmul,
            peak.bf16.map_or(String::new(), |p| format!(", {p:.1} GFLOP/s (bf16, one thread)")),
            if peak.bf16.is_none() { " This CPU has no native bf16: bf16 rows skipped." } else { "" }
        );
        Ok(())
    }

    /// Recurrent PPO (LSTM) on CartPole-v1 with the velocities hidden (`cartpole_masked_ppo_lstm.toml`) against
    /// SB3-contrib's RecurrentPPO with RL Zoo's CartPoleNoVel-v1 settings, one core, the same seeds one after
    /// the other (seed 1: SB3-contrib takes about half an hour for it on one core).
    fn recurrent(&self) -> BenchResult<()> {
        let steps: u64 = if self.quick { 4096 } else { 100_000 };
        let seeds: Vec<u64> = vec![1];
        let text = example_text("cartpole_masked_ppo_lstm.toml", "")?;
        let overrides = timing_overrides(steps);
        println!(
            "## Recurrent PPO, CartPole-v1 with the velocities hidden (`cartpole_masked_ppo_lstm.toml`), {steps} env \
             steps, one core (taskset -c 0)\n"
        );
        println!("| run | seed | train s | final return | vs SB3-contrib |");
        println!("|---|---:|---:|---:|---:|");
        for &seed in &seeds {
            let o = [&overrides[..], &[format!("run.seed={seed}")]].concat();
            let run = self.flotilla(&format!("ppo-lstm-{seed}"), "0", &text, &o)?;
            let libtorch = [&o[..], &["algorithm.fused_cpu=false".to_string()]].concat();
            let torch_run = self.flotilla(&format!("ppo-lstm-torch-{seed}"), "0", &text, &libtorch)?;
            let sb3 = self.sb3("ppo_lstm", &[seed], 1, steps, "0", 1)?;
            for (label, run) in [("fused CPU step", &run), ("libtorch step", &torch_run)] {
                let m = &run.members[0];
                let vs = sb3.as_ref().map_or("—".to_string(), |s| format!("{:.3}×", m.train_secs / s.train_secs));
                println!("| Flotilla (LSTM, {label}) | {seed} | {:.1} | {:.1} | {vs} |", m.train_secs, m.final_return);
            }
            match &sb3 {
                None => println!("| SB3-contrib | {seed} | not installed: bash scripts/setup_peers.sh --sb3 | | |"),
                Some(s) => println!(
                    "| SB3-contrib RecurrentPPO (RL Zoo) | {seed} | {:.1} | {:.1} | 1.000× |",
                    s.train_secs, s.returns[0]
                ),
            }
        }
        println!(
            "\nTrain s: Flotilla's collection and updates (evaluation excluded), SB3-contrib's env and model \
             construction and `learn()`. Both normalise observations (VecNormalize / `[normalize] obs`). Flotilla: \
             one LSTM of the example's width shared by policy and value; SB3-contrib (RL Zoo): an LSTM of 64 \
             for each (`enable_critic_lstm`).\n"
        );
        Ok(())
    }

    /// SAC on Pendulum-v1 (RL Zoo's 20 K steps) on two cores and two threads, as RL Zoo users run it: the fused
    /// CPU step, the libtorch step and SB3 (`sb3_zoo.py --threads 2`), one seed each, interleaved over `rounds`.
    /// `algo` (sac, td3 or ddpg) on Pendulum-v1 with RL Zoo's settings, two cores and two threads: Flotilla with
    /// the hidden layers' matmuls in bf16 (where the CPU has native bf16) and in f32, against SB3, interleaved.
    fn continuous(&self, algo: &str) -> BenchResult<()> {
        // --quick: a few hundred gradient steps after the warm-up (SAC's is 100 steps, DDPG's and TD3's 10 K).
        let steps: u64 = match (self.quick, algo) {
            (false, _) => 20_000,
            (true, "sac") => 2_000,
            (true, _) => 12_000,
        };
        let exe = std::env::current_exe()?;
        let (out, _) = pinned("0,1", &exe, &["--child".into(), "peak".into(), "2".into()], &[])?;
        let peak = num(json_lines(&out).last().ok_or("peak: no JSON line")?, "matmul")?;
        let text = example_text(&format!("pendulum_{algo}.toml"), "")?;
        let (flops, formula) = off_policy_flops_per_step(algo, &ExperimentConfig::parse(&text, &[])?.to_toml())?;
        let overrides = [
            format!("run.total_env_steps={steps}"),
            "run.torch_threads=2".to_string(),
            "eval.interval_steps=1000000000".to_string(),
        ];
        let with = |setting: &str| [&overrides[..], &[setting.to_string()]].concat();
        let bf16 = flotilla_algorithms::nn::nets::cpu_has_native_bf16();
        println!(
            "## {} Pendulum-v1, {steps} env steps, two cores and two threads (taskset -c 0,1)\n",
            algo.to_uppercase()
        );
        println!(
            "| run | round | train s | final return | gradient steps | update s | update GFLOP/s | % of f32 peak | vs SB3 |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        // FLOTILLA_BENCH_ROUNDS: more interleaved rounds where the machine is noisy (default 2).
        let rounds =
            if self.quick { 1 } else { std::env::var("FLOTILLA_BENCH_ROUNDS").map_or(Ok(2), |r| r.parse())? };
        for round in 1..=rounds {
            let mut rows = Vec::new();
            if bf16 {
                let r = self.flotilla(&format!("{algo}-bf16-{round}"), "0,1", &text, &with("algorithm.bf16=true"))?;
                rows.push(("Flotilla, bf16 hidden layers (the default here)", r));
            }
            let r = self.flotilla(&format!("{algo}-f32-{round}"), "0,1", &text, &with("algorithm.bf16=false"))?;
            rows.push(("Flotilla, f32", r));
            let sb3 = self.sb3(algo, &[round as u64], 1, steps, "0,1", 2)?;
            let vs = |secs: f64| sb3.as_ref().map_or("—".to_string(), |s| format!("{:.2}×", secs / s.train_secs));
            for (label, r) in &rows {
                let m = &r.members[0];
                let gflops = m.gradient_steps as f64 * flops / m.update_secs.max(1e-9) / 1e9;
                println!(
                    "| {label} | {round} | {:.1} | {:.1} | {} | {:.1} | {gflops:.1} | {:.1} % | {} |",
                    m.train_secs,
                    m.final_return,
                    m.gradient_steps,
                    m.update_secs,
                    100.0 * gflops / peak,
                    vs(m.train_secs)
                );
            }
            match &sb3 {
                None => println!("| SB3 | {round} | not installed: bash scripts/setup_peers.sh --sb3 | | | | | | |"),
                Some(s) => {
                    println!("| SB3 (RL Zoo) | {round} | {:.1} | {:.1} | | | | | 1.00× |", s.train_secs, s.returns[0])
                }
            }
        }
        if !bf16 {
            println!("\nThis CPU has no native bf16 (AVX512-BF16 or AMX): bf16 rows skipped, f32 is the default here.");
        }
        println!(
            "\nNotes: FLOPs per gradient step {formula} = {:.1} MFLOP; f32 matmul peak {peak:.1} GFLOP/s (libtorch, two \
             threads on cores 0 and 1, best of 5). Train s: Flotilla's collection and updates (evaluation excluded), \
             SB3's env and model construction and `learn()`; \"vs SB3\" is train s over SB3's in the same round.\n",
            flops / 1e6
        );
        Ok(())
    }

    fn a2c(&self, peak: &Peak) -> BenchResult<()> {
        let (steps, size): (u64, usize) = if self.quick { (100_000, 4) } else { (500_000, 10) };
        let overrides = timing_overrides(steps);
        let with_fused = |fused: bool| [&overrides[..], &[format!("algorithm.fused_cpu={fused}")]].concat();
        let plain = example_text("cartpole_a2c.toml", "")?;
        let (flops, formula) = actor_critic_flops_per_step(&ExperimentConfig::parse(&plain, &[])?.to_toml())?;
        println!(
            "## A2C CartPole-v1 (`cartpole_a2c.toml`, RL Zoo's hyperparameters), {steps} env steps per seed, one core \
             (taskset -c 0), torch_threads 1\n"
        );
        let one = self.flotilla("a2c-1", "0", &plain, &with_fused(true))?;
        let one_torch = self.flotilla("a2c-1-libtorch", "0", &plain, &with_fused(false))?;
        // One worker thread on the one core: members take the fused step in turn (A2C has no batched update).
        let text = example_text("cartpole_a2c.toml", &population(size, 1, true))?;
        let pop = self.flotilla(&format!("a2c-pop{size}-fused"), "0", &text, &with_fused(true))?;
        let sb3 = self.sb3("a2c", &[1], 1, steps, "0", 1)?;

        let table = SpeedTable { flops, peak: peak.matmul, sb3_per_seed: sb3.as_ref().map(|s| s.per_seed()) };
        table.header();
        table.flotilla("Flotilla, 1 seed (fused CPU step)", &one);
        table.flotilla("Flotilla, 1 seed (libtorch step, fused_cpu = false)", &one_torch);
        table.flotilla(&format!("Flotilla population of {size} (fused CPU step, members in turn)"), &pop);
        table.peer("SB3 (RL Zoo), 1 seed", &sb3);
        println!("\nFused CPU step vs libtorch: {}.", fused_vs_libtorch(&one, &one_torch));
        println!("\n{}\n", speed_notes(&formula, flops));
        Ok(())
    }

    fn pbt(&self) -> BenchResult<()> {
        let (steps, interval, eval, size, seeds): (u64, u64, u64, usize, &[u64]) =
            if self.quick { (8192, 2048, 2048, 4, &[1, 101]) } else { (100_000, 10_000, 5_000, 8, &[1, 101, 201]) };
        let sweep = "[population.sweep]\nmode = \"random\"\n[population.sweep.values]\n\
                     \"algorithm.learning_rate\" = { log_uniform = [1e-5, 1e-2] }\n\
                     \"algorithm.clip_range\" = { uniform = [0.05, 0.4] }\n";
        let pbt = format!("[population.pbt]\ninterval_steps = {interval}\nquantile = 0.25\n");
        println!(
            "## PBT: PPO CartPole-v1, {size} members (random learning rate ∈ [1e-5, 1e-2] log-uniform, clip range ∈ \
             [0.05, 0.4]), {steps} env steps each, two cores (threads = 2)\n"
        );
        println!(
            "| run.seed | method | env steps until best member's eval ≥ 475 | members ≥ 475 at the end | best stays ≥ 475 \
             after | PBT exploits | process wall s |"
        );
        println!("|---:|---|---:|---:|---|---:|---:|");
        let mut summary: Vec<(&str, Vec<PbtOutcome>)> = vec![("no PBT", Vec::new()), ("PBT", Vec::new())];
        for &seed in seeds {
            for (method, outcomes) in summary.iter_mut() {
                let with_pbt = *method == "PBT";
                let extra = format!("{}{sweep}{}", population(size, 2, true), if with_pbt { pbt.as_str() } else { "" });
                let text = example_text("cartpole_ppo.toml", &extra)?;
                let overrides = vec![
                    format!("run.total_env_steps={steps}"),
                    "run.torch_threads=1".to_string(),
                    format!("run.seed={seed}"),
                    format!("eval.interval_steps={eval}"),
                ];
                let name = format!("pbt-{}-seed{seed}", if with_pbt { "on" } else { "off" });
                let run = self.flotilla(&name, "0,1", &text, &overrides)?;
                let o = pbt_outcome(&run.out, size)?;
                let first = o.first.map_or(format!("never (> {steps})"), |s| s.to_string());
                let held = match (o.first, o.held) {
                    (None, _) => "—",
                    (_, true) => "yes",
                    (_, false) => "no",
                };
                println!(
                    "| {seed} | {method} | {first} | {} / {size} | {held} | {} | {:.1} |",
                    o.solved_end, o.exploits, run.process_secs
                );
                outcomes.push(o);
            }
        }
        for (method, outcomes) in &summary {
            let n = outcomes.len() as f64;
            let mean_first = outcomes.iter().map(|o| o.first.unwrap_or(steps) as f64).sum::<f64>() / n;
            let never = outcomes.iter().filter(|o| o.first.is_none()).count();
            let solved = outcomes.iter().map(|o| o.solved_end as f64).sum::<f64>() / n;
            let held = outcomes.iter().filter(|o| o.first.is_some() && o.held).count();
            println!(
                "| mean | {method} | {mean_first:.0} ({never} never) | {solved:.1} / {size} | {held} / {} held | | |",
                outcomes.len()
            );
        }
        println!(
            "\nNotes: from the members' `metrics.csv` (`eval/mean_return`, 10 deterministic episodes every {eval} env \
             steps; the best member is the maximum over members at each evaluation). A run that never got there is \
             counted at the budget in the mean. PBT: every {interval} env steps the bottom quarter (by recent training \
             return) copies a top-quarter member's weights, optimiser state and hyperparameters, perturbed ×0.8 or \
             ×1.2; exploits counted from `lineage.jsonl`.\n"
        );
        Ok(())
    }
}

/// What a PBT-suite run achieved.
struct PbtOutcome {
    /// Env steps of the first evaluation where the best member is at or above 475.
    first: Option<u64>,
    /// Whether the best member stayed at or above 475 at every evaluation after that.
    held: bool,
    /// Members whose last evaluation is at or above 475.
    solved_end: usize,
    /// Lines of `lineage.jsonl`.
    exploits: usize,
}

fn pbt_outcome(out: &Path, size: usize) -> BenchResult<PbtOutcome> {
    // Best evaluation over members at each env step.
    let mut best: std::collections::BTreeMap<u64, f64> = std::collections::BTreeMap::new();
    let mut solved_end = 0;
    for k in 0..size {
        let evals = eval_rows(&out.join(format!("members/{k:03}/metrics.csv")))?;
        if evals.last().is_some_and(|(_, r)| *r >= SOLVED) {
            solved_end += 1;
        }
        for (steps, r) in evals {
            let b = best.entry(steps).or_insert(f64::NEG_INFINITY);
            *b = b.max(r);
        }
    }
    let first = best.iter().find(|(_, r)| **r >= SOLVED).map(|(s, _)| *s);
    let held = first.is_some_and(|f| best.range(f..).all(|(_, r)| *r >= SOLVED));
    let exploits = match std::fs::read_to_string(out.join(flotilla_learner::population::LINEAGE_FILE)) {
        Ok(text) => text.lines().filter(|l| !l.trim().is_empty()).count(),
        Err(_) => 0,
    };
    Ok(PbtOutcome { first, held, solved_end, exploits })
}

/// `(env_steps, eval/mean_return)` of a metrics CSV's rows that have an evaluation.
fn eval_rows(path: &Path) -> BenchResult<Vec<(u64, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or_else(|| format!("{}: empty", path.display()))?.split(',').collect();
    let col =
        |name: &str| header.iter().position(|c| *c == name).ok_or_else(|| format!("{}: no {name}", path.display()));
    let (steps, eval) = (col("env_steps")?, col("eval/mean_return")?);
    Ok(lines
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            let r = cells.get(eval)?.parse::<f64>().ok()?;
            let s = cells.get(steps)?.parse::<f64>().ok()? as u64;
            Some((s, r))
        })
        .collect())
}

/// The `[algorithm]` table and the env's observation and action sizes of a resolved config.
fn algorithm_shape(resolved: &str) -> BenchResult<(toml::Table, usize, usize)> {
    let table: toml::Table = resolved.parse()?;
    let algorithm = table.get("algorithm").and_then(|a| a.as_table()).ok_or("no [algorithm]")?.clone();
    let id = table.get("env").and_then(|e| e.get("id")).and_then(|i| i.as_str()).ok_or("no env.id")?;
    let env = flotilla_envs::make(id, &flotilla_envs::Kwargs::new())?;
    let obs = env.observation_space().flat_dim();
    let actions = match env.action_space() {
        flotilla_core::Space::Discrete { n, .. } => *n,
        flotilla_core::Space::Box { low, .. } => low.len(),
    };
    Ok((algorithm, obs, actions))
}

fn int(table: &toml::Table, key: &str) -> BenchResult<usize> {
    table.get(key).and_then(|v| v.as_integer()).map(|v| v as usize).ok_or_else(|| format!("no algorithm.{key}").into())
}

/// Σ in × out over an MLP's layers: `input → hidden… → output`.
fn mlp_macs(input: usize, hidden: &[usize], output: usize) -> f64 {
    let sizes: Vec<usize> = std::iter::once(input).chain(hidden.iter().copied()).chain([output]).collect();
    sizes.windows(2).map(|w| (w[0] * w[1]) as f64).sum()
}

fn hidden_sizes(table: &toml::Table) -> BenchResult<Vec<usize>> {
    let list = table.get("hidden_sizes").and_then(|v| v.as_array()).ok_or("no algorithm.hidden_sizes")?;
    Ok(list.iter().filter_map(|v| v.as_integer()).map(|v| v as usize).collect())
}

/// FLOPs of one PPO or A2C gradient step of one member: forward (2 × batch × Σ in×out) and backward (twice
/// that) over the policy MLP (obs → hidden → actions) and the value MLP (obs → hidden → 1). PPO's batch is its
/// minibatch; A2C takes one step on its whole rollout, `n_steps × num_envs`. Returns the formula too.
fn actor_critic_flops_per_step(resolved: &str) -> BenchResult<(f64, String)> {
    let (a, obs, actions) = algorithm_shape(resolved)?;
    let hidden = hidden_sizes(&a)?;
    let (batch, what) = match a.get("kind").and_then(|k| k.as_str()) {
        Some("ppo") => {
            let batch = int(&a, "batch_size")?;
            (batch, format!("minibatch {batch}"))
        }
        Some("a2c") => {
            let table: toml::Table = resolved.parse()?;
            let envs = table.get("env").and_then(|e| e.get("num_envs")).and_then(|n| n.as_integer());
            let envs = envs.ok_or("no env.num_envs")? as usize;
            let n = int(&a, "n_steps")?;
            (n * envs, format!("rollout {} = n_steps {n} × {envs} envs", n * envs))
        }
        other => return Err(format!("actor-critic FLOPs of algorithm.kind {other:?}").into()),
    };
    let (policy, value) = (mlp_macs(obs, &hidden, actions), mlp_macs(obs, &hidden, 1));
    let formula = format!(
        "batch: {what}; Σ in×out = {policy} (policy MLP {obs}→{hidden:?}→{actions}) + {value} (value MLP \
         {obs}→{hidden:?}→1)"
    );
    Ok((3.0 * 2.0 * batch as f64 * (policy + value), formula))
}

/// FLOPs of one DQN gradient step: the online net's forward and backward (3 × 2 × batch × Σ in×out) plus one
/// forward of the target net on the next observations (2 × batch × Σ), plus one more of the online net with
/// double Q. Returns the formula too.
/// FLOPs of one SAC gradient step: with `A` the actor's and `C` one critic's forward MAC count per row and `n`
/// critics, 2 × batch × (4A + 6nC): the actor forward on s (kept for its backward, 2A) and on s', the target
/// critics on s', the online critics forward and backward, the updated critics forward and back to the actions
/// (no weight gradients). Returns the formula too.
/// FLOPs of one gradient step of SAC, TD3 or DDPG (`algo`) from the resolved config, and the formula.
fn off_policy_flops_per_step(algo: &str, resolved: &str) -> BenchResult<(f64, String)> {
    let (a, obs, actions) = algorithm_shape(resolved)?;
    let hidden = hidden_sizes(&a)?;
    let batch = int(&a, "batch_size")? as f64;
    let critic = mlp_macs(obs + actions, &hidden, 1);
    if algo == "sac" {
        let critics = int(&a, "n_critics")? as f64;
        let actor = mlp_macs(obs, &hidden, actions) + (hidden.last().copied().unwrap_or(obs) * actions) as f64;
        let formula = format!(
            "2 × {batch} × (4A + 6 × {critics} × C) (A = {actor}: {obs}→{hidden:?}→{actions} and the log-std head; \
             C = {critic}: {}→{hidden:?}→1)",
            obs + actions
        );
        return Ok((2.0 * batch * (4.0 * actor + 6.0 * critics * critic), formula));
    }
    // DDPG's config has neither key: one critic, an actor step every gradient step.
    let critics = int(&a, "n_critics").unwrap_or(1) as f64;
    let delay = int(&a, "policy_delay").unwrap_or(1) as f64;
    let actor = mlp_macs(obs, &hidden, actions);
    let formula = format!(
        "2 × {batch} × (A + 4 × {critics} × C + (3A + 2C) / {delay}) (target actor and critics forward, the critics \
         forward and backward, every {delay}: the actor forward and backward through critic 1; A = {actor}: \
         {obs}→{hidden:?}→{actions}, C = {critic}: {}→{hidden:?}→1)",
        obs + actions
    );
    Ok((2.0 * batch * (actor + 4.0 * critics * critic + (3.0 * actor + 2.0 * critic) / delay), formula))
}

fn dqn_flops_per_step(resolved: &str) -> BenchResult<(f64, String)> {
    let (a, obs, actions) = algorithm_shape(resolved)?;
    let hidden = hidden_sizes(&a)?;
    let batch = int(&a, "batch_size")? as f64;
    let double = a.get("double_q").and_then(|v| v.as_bool()).unwrap_or(false);
    // QR-DQN: each action's output is a group of n_quantiles.
    let quantiles = a.get("n_quantiles").and_then(|v| v.as_integer()).unwrap_or(0).max(1) as usize;
    let actions = actions * quantiles;
    let macs = mlp_macs(obs, &hidden, actions);
    let forwards = if double { 2.0 } else { 1.0 };
    let formula = format!(
        "3 × 2 × {batch} × Σ + {forwards} × 2 × {batch} × Σ (Σ = Σ in×out of {obs}→{hidden:?}→{actions} = {macs}; \
         target forward{})",
        if double { " and the online net's double-Q forward" } else { "" }
    );
    Ok((3.0 * 2.0 * batch * macs + forwards * 2.0 * batch * macs, formula))
}
