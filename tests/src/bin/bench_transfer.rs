//! `flotilla-bench-transfer`: does starting from a trained run help on a changed task? Side by side in one run.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-transfer \
//!     [-- --suite cartpole|pendulum --seeds N --target k=v,k=v ... --eval-every STEPS]
//! ```
//! A source PPO policy is trained on the suite's env (its example config, seed 1000) and saved as a run's
//! `model.safetensors`. Then, on each target task (the same env with changed physics, as `[env.kwargs]`), for
//! seeds 1..=N: PPO from scratch, fine-tuned from the source (`[init] from`), fine-tuned with the first layer
//! frozen (`freeze = ["pi_vf.0"]`), and with the hidden layers only (`reinit = ["pi_vf.2"]`: policy and value
//! outputs afresh), each with the example config and budget. Reported per method: env steps to the first
//! evaluation at or above the suite's threshold (mean and 95 % t-interval, seeds that never got there counted at
//! the budget and counted), how many seeds end at or above it (held), and the source policy's zero-shot score on
//! the target.
//!
//! Suites: `cartpole` (`cartpole_ppo.toml`, threshold 475; targets a heavy cart, a long pole, and a control that
//! swaps the actions, `force_mag = -10`, where the source's knowledge is wrong and transfer should hurt) and
//! `pendulum` (`pendulum_ppo.toml`, the Gaussian policy, threshold −250 as in the reference table; targets other
//! gravities, `g`).
//!
//! `--shared-torso-only [--task-heads]` measures one multi-task run against separate runs instead: with the
//! cartpole suite PPO on three CartPole physics (`cartpole_multitask.toml`), with the pendulum suite TD3 on two
//! gravities (`pendulum_td3_multitask.toml`, 64-64 networks).
use flotilla_learner::eval::evaluate;
use flotilla_learner::train::train;
use flotilla_tests::{SeedResult, example_config, train_seeds};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// One env's transfer experiment.
struct Suite {
    /// Example config of the source and of every target run.
    config: &'static str,
    /// The return a run must reach (first evaluation at or above it).
    threshold: f64,
    /// Targets measured when none is given (`[env.kwargs]` as `k=v,k=v`).
    targets: &'static [&'static str],
}

const CARTPOLE: Suite = Suite {
    config: "cartpole_ppo.toml",
    threshold: 475.0,
    targets: &["masscart=10.0,force_mag=5.0", "length=1.5,masspole=0.3", "force_mag=-10.0"],
};

const PENDULUM: Suite = Suite { config: "pendulum_ppo.toml", threshold: -250.0, targets: &["g=5.0", "g=13.0"] };

/// 97.5 % quantile of Student's t with `df` degrees of freedom (df ≤ 30; above that, the normal 1.96).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 { f64::NAN } else { T.get(df - 1).copied().unwrap_or(1.96) }
}

/// Mean and half-width of the 95 % t-interval of `xs`.
fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, t975(xs.len().saturating_sub(1)) * (var / n).sqrt())
}

/// One table row: a method's steps to the threshold (seeds that never reached it counted at the budget, and
/// said), the share of later evaluations still at or above it, how many seeds end at or above it, the median
/// final return and the seconds per run.
fn row(target: &str, method: &str, results: &[SeedResult], budget: f64, threshold: f64) {
    let steps: Vec<f64> = results.iter().map(|r| r.first_reaching.map_or(budget, |s| s as f64)).collect();
    let never = results.iter().filter(|r| r.first_reaching.is_none()).count();
    let held = results.iter().filter(|r| r.final_return >= threshold).count();
    let (mean, ci) = mean_ci(&steps);
    let mut finals: Vec<f64> = results.iter().map(|r| r.final_return).collect();
    finals.sort_by(f64::total_cmp);
    let median = finals[finals.len() / 2];
    let secs: f64 = results.iter().map(|r| r.report.train_secs).sum::<f64>() / results.len() as f64;
    // Holding: of the evaluations after each seed's first at the threshold, the share still at or above it.
    let (mut later, mut above) = (0usize, 0usize);
    for r in results {
        let evals = &r.report.evals;
        if let Some(first) = evals.iter().position(|e| e.result.mean() >= threshold) {
            later += evals.len() - first - 1;
            above += evals[first + 1..].iter().filter(|e| e.result.mean() >= threshold).count();
        }
    }
    let share = if later == 0 { "—".to_string() } else { format!("{:.0} %", 100.0 * above as f64 / later as f64) };
    println!(
        "| {target} | {method} | {mean:.0} ± {ci:.0} | {never} | {share} | {held} / {} | {median:.1} | {secs:.1} |",
        results.len()
    );
}

fn main() -> BenchResult<()> {
    let mut args = std::env::args().skip(1);
    let mut n_seeds = 10u64;
    let mut targets: Vec<String> = Vec::new();
    let mut only_shared = false;
    let mut heads = false;
    let mut suite = &CARTPOLE;
    let mut eval_every: Option<u64> = None;
    let usage = "usage: [--suite cartpole|pendulum] [--seeds N] [--target k=v,...] [--eval-every STEPS] \
                 [--shared-torso-only [--task-heads]] (with --suite pendulum: TD3 on two gravities)";
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => n_seeds = args.next().ok_or("--seeds N")?.parse()?,
            "--target" => targets.push(args.next().ok_or("--target key=value,...")?),
            "--eval-every" => eval_every = Some(args.next().ok_or("--eval-every STEPS")?.parse()?),
            "--suite" => {
                suite = match args.next().as_deref() {
                    Some("cartpole") => &CARTPOLE,
                    Some("pendulum") => &PENDULUM,
                    other => return Err(format!("--suite {other:?}: expected cartpole or pendulum").into()),
                }
            }
            "--shared-torso-only" => only_shared = true,
            "--task-heads" => heads = true,
            other => return Err(format!("unknown argument {other:?}; {usage}").into()),
        }
    }
    if targets.is_empty() {
        targets = suite.targets.iter().map(|t| t.to_string()).collect();
    }
    tch::set_num_threads(1);
    let seeds: Vec<u64> = (1..=n_seeds).collect();
    if only_shared {
        let shared = if std::ptr::eq(suite, &PENDULUM) { &PENDULUM_TD3_SHARED } else { &CARTPOLE_SHARED };
        shared_torso(shared, &seeds, heads);
        return Ok(());
    }
    let eval_set = eval_every.map(|n| format!("eval.interval_steps={n}"));
    let common: Vec<&str> = eval_set.iter().map(String::as_str).collect();
    // The source run, as `flotilla train` would leave it.
    let dir = std::env::temp_dir().join(format!("flotilla-bench-transfer-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut source_sets = vec!["run.seed=1000"];
    source_sets.extend(&common);
    let (mut agent, report) = train(&example_config(suite.config, &source_sets), &mut |_| Ok(()))?;
    println!("# flotilla-bench-transfer\n");
    println!(
        "Source: `{}` (seed 1000), final evaluation {:.1}, {:.1} s. Threshold {}.\n",
        suite.config,
        report.final_eval().mean(),
        report.train_secs,
        suite.threshold
    );
    agent.save_weights(&dir.join("model.safetensors"))?;
    let from = format!("init.from={:?}", dir.display().to_string());
    println!(
        "| target `[env.kwargs]` | method | env steps to threshold (mean ± 95 % CI) | never reached | later evals at \
         or above | held at the end | median final return | training s per run |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for target in &targets {
        let kwargs: Vec<String> = target.split(',').map(|kv| format!("env.kwargs.{kv}")).collect();
        let mut kw: Vec<&str> = kwargs.iter().map(String::as_str).collect();
        kw.extend(&common);
        let config = example_config(suite.config, &kw);
        let zero_shot = evaluate(agent.as_mut(), &config.env, 20, 12345)?.mean();
        let budget = config.run.total_env_steps as f64;
        println!("| {target} | zero-shot (source policy, 20 episodes) | score {zero_shot:.1} | | | | | |");
        if seeds.is_empty() {
            continue;
        }
        let threshold = suite.threshold;
        let run = |sets: &[&str]| train_seeds(suite.config, sets, &seeds, threshold);
        row(target, "from scratch", &run(&kw), budget, threshold);
        let mut tuned = kw.clone();
        tuned.push(&from);
        row(target, "fine-tune", &run(&tuned), budget, threshold);
        let mut frozen = tuned.clone();
        frozen.push("init.freeze=[\"pi_vf.0\"]");
        row(target, "fine-tune, first layer frozen", &run(&frozen), budget, threshold);
        tuned.push("init.reinit=[\"pi_vf.2\"]");
        row(target, "hidden layers only (output afresh)", &run(&tuned), budget, threshold);
    }
    std::fs::remove_dir_all(&dir)?;
    if !seeds.is_empty() && std::ptr::eq(suite, &CARTPOLE) {
        shared_torso(&CARTPOLE_SHARED, &seeds, false);
    }
    Ok(())
}

/// A shared-torso experiment: one multi-task run against a separate run per task, over the same seeds.
struct SharedSuite {
    /// What trains (for the table's title).
    title: &'static str,
    /// Example config of the multi-task run (`[[tasks]]`, the tasks below in order).
    multi: &'static str,
    /// Example config of each separate run.
    single: &'static str,
    /// Overrides of both (a smaller network, say), as `key=value`.
    common: &'static [&'static str],
    /// Overrides of the multi-task run only, and of each separate run only.
    multi_sets: &'static [&'static str],
    single_sets: &'static [&'static str],
    /// Task names and the `[env.kwargs]` overrides that make a separate run that task.
    tasks: &'static [(&'static str, &'static [&'static str])],
    /// Env steps of one separate run (= each task's share of the multi-task run).
    budget: f64,
    threshold: f64,
}

/// `examples/configs/cartpole_multitask.toml` (PPO, three CartPole physics) against three quick-start runs.
const CARTPOLE_SHARED: SharedSuite = SharedSuite {
    title: "PPO",
    multi: "cartpole_multitask.toml",
    single: "cartpole_ppo.toml",
    common: &[],
    multi_sets: &[],
    single_sets: &[],
    tasks: &[
        ("normal", &[]),
        ("long", &["env.kwargs.length=1.5", "env.kwargs.masspole=0.3"]),
        ("reversed", &["env.kwargs.force_mag=-10.0"]),
    ],
    budget: 100_000.0,
    threshold: 475.0,
};

/// `examples/configs/pendulum_td3_multitask.toml` (TD3, Pendulum at g = 10 and 13) against two
/// `pendulum_td3.toml` runs, all with 64-64 networks (as its CLI test; RL Zoo's 400-300 take ~10× longer on
/// CPU) and 2 K random steps per task, 12 K env steps per task.
const PENDULUM_TD3_SHARED: SharedSuite = SharedSuite {
    title: "TD3",
    multi: "pendulum_td3_multitask.toml",
    single: "pendulum_td3.toml",
    common: &["run.torch_threads=1", "algorithm.hidden_sizes=[64,64]", "eval.interval_steps=2000"],
    multi_sets: &["run.total_env_steps=24000", "algorithm.learning_starts=4000"],
    single_sets: &["run.total_env_steps=12000", "algorithm.learning_starts=2000"],
    tasks: &[("g10", &[]), ("g13", &["env.kwargs.g=13.0"])],
    budget: 12_000.0,
    threshold: -250.0,
};

/// Shared torso: one multi-task run (one network conditioned on the task's one-hot) against a separate run per
/// task, over the same seeds. With `heads`, the multi-task network has a head per task (`task_heads`) instead
/// of one head for all. Per task: env steps of that task's own envs to its first evaluation at or above the
/// threshold (its share of the multi-task run's steps), and whether it ends there; then every task there at
/// once: total env steps and seconds.
fn shared_torso(suite: &SharedSuite, seeds: &[u64], heads: bool) {
    let t = suite.tasks.len();
    let (budget, threshold) = (suite.budget, suite.threshold);
    let mut multi_sets: Vec<&str> = [suite.common, suite.multi_sets].concat();
    if heads {
        multi_sets.push("algorithm.task_heads=true");
    }
    let multi = train_seeds(suite.multi, &multi_sets, seeds, f64::INFINITY);
    let separate: Vec<Vec<SeedResult>> = suite
        .tasks
        .iter()
        .map(|(_, kw)| {
            let sets: Vec<&str> = [suite.common, suite.single_sets, kw].concat();
            train_seeds(suite.single, &sets, seeds, threshold)
        })
        .collect();
    println!(
        "\n## Shared torso: one multi-task {} run{} vs {t} separate runs ({} seeds)\n",
        suite.title,
        if heads { " with a head per task" } else { "" },
        seeds.len()
    );
    println!(
        "| task | separate: own env steps to ≥ {threshold} | never | held | multi-task: own env steps to ≥ {threshold} | \
         never | held |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (k, (name, _)) in suite.tasks.iter().enumerate() {
        let sep = &separate[k];
        let sep_steps: Vec<f64> = sep.iter().map(|r| r.first_reaching.map_or(budget, |s| s as f64)).collect();
        let first = |r: &SeedResult| {
            r.report
                .evals
                .iter()
                .find(|e| e.result.task_means()[k].1 >= threshold)
                .map(|e| (e.env_steps / t as u64) as f64)
        };
        let multi_steps: Vec<f64> = multi.iter().map(|r| first(r).unwrap_or(budget)).collect();
        let (sm, sc) = mean_ci(&sep_steps);
        let (mm, mc) = mean_ci(&multi_steps);
        let sep_never = sep.iter().filter(|r| r.first_reaching.is_none()).count();
        let multi_never = multi.iter().filter(|r| first(r).is_none()).count();
        let sep_held = sep.iter().filter(|r| r.final_return >= threshold).count();
        let multi_held = multi.iter().filter(|r| r.report.final_eval().task_means()[k].1 >= threshold).count();
        println!(
            "| {name} | {sm:.0} ± {sc:.0} | {sep_never} | {sep_held} / {n} | {mm:.0} ± {mc:.0} | {multi_never} | {multi_held} / {n} |",
            n = seeds.len()
        );
    }
    // Every task at the threshold at once: the multi-task run's total steps and seconds; separately, the sum
    // over the runs of their steps and seconds to their first evaluation there.
    let all = |r: &SeedResult| -> Option<flotilla_learner::progress::EvalPoint> {
        r.report.evals.iter().find(|e| e.result.task_means().iter().all(|(_, m)| *m >= threshold)).cloned()
    };
    let whole = budget * t as f64;
    let multi_all: Vec<f64> = multi.iter().map(|r| all(r).map_or(whole, |e| e.env_steps as f64)).collect();
    let multi_secs: Vec<f64> = multi.iter().map(|r| all(r).map_or(r.report.train_secs, |e| e.train_secs)).collect();
    let sep_all: Vec<f64> = (0..seeds.len())
        .map(|i| separate.iter().map(|runs| runs[i].first_reaching.map_or(budget, |s| s as f64)).sum())
        .collect();
    let sep_secs: Vec<f64> = (0..seeds.len())
        .map(|i| {
            separate
                .iter()
                .map(|runs| {
                    let r = &runs[i];
                    r.report
                        .evals
                        .iter()
                        .find(|e| e.result.mean() >= threshold)
                        .map_or(r.report.train_secs, |e| e.train_secs)
                })
                .sum()
        })
        .collect();
    let (a, ac) = mean_ci(&multi_all);
    let (b, bc) = mean_ci(&sep_all);
    let (c, cc) = mean_ci(&multi_secs);
    let (d, dc) = mean_ci(&sep_secs);
    println!(
        "\nEvery task ≥ {threshold} at once: multi-task {a:.0} ± {ac:.0} env steps, {c:.1} ± {cc:.1} s; {t} separate \
         runs {b:.0} ± {bc:.0} env steps, {d:.1} ± {dc:.1} s (sums; seeds that never got there counted at the \
         budget, seconds under {}-way contention).",
        seeds.len()
    );
}
