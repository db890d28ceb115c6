//! `flotilla-bench-distill`: how small a student keeps a trained teacher's score, and how many labelled states
//! and seconds it takes. Side by side in one run, every teacher trained here first.
//!
//! ```text
//! cargo run --release -p flotilla-tests --bin flotilla-bench-distill [-- --seeds N]
//! ```
//! Each teacher is trained with an example config (seed 1000) and saved as a run directory; then for seeds
//! 1..=N a student (`examples/configs/cartpole_distill.toml` with the teacher's env and the student's width)
//! learns it on the states it visits itself (DAgger), 20 K env steps, evaluated every 2 K. Scores are
//! normalised as `(student − random) / (teacher − random)`, where "random" is a uniform random policy's score
//! (all evaluations 50 episodes), so 1 is the teacher's score and 0 is chance.
//! Reported per teacher: both networks' acting parameters (the teacher's critic is not counted: it never
//! acts), labelled states (= env steps) to the first evaluation at ≥ 95 % normalised (mean ± 95 % CI over the
//! seeds that reached it), how many seeds' final policies score ≥ 95 % and how many seeds' last three
//! evaluations (final, 20 K and 18 K) are all ≥ 95 % (held), the final normalised score (median and worst) and training seconds
//! per student.
use flotilla_algorithms::policy::{ActMode, ActOutput, Policy};
use flotilla_core::{ObsRef, Space};
use flotilla_learner::config::ExperimentConfig;
use flotilla_learner::eval::evaluate;
use flotilla_learner::run_dir::RunDir;
use flotilla_learner::train::train;
use flotilla_tests::{example_config, train_seeds};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Episodes per evaluation (teacher, random policy, and each of the student's): Pendulum's returns depend on
/// the start state (hanging down or not), so 10-episode means swing by ±15 % of the teacher–random gap.
const EPISODES: usize = 50;

/// One teacher and its student.
struct Case {
    /// Row label.
    label: &'static str,
    /// The teacher's example config and overrides.
    config: &'static str,
    overrides: &'static [&'static str],
    /// The student's hidden widths, activation (the teacher's: a ReLU teacher's greedy action switches along
    /// piecewise-linear boundaries a ReLU student can follow) and loss.
    student_hidden: &'static [i64],
    activation: &'static str,
    loss: &'static str,
    /// `[algorithm] anneal_lr` of the student (a DQN teacher's greedy labels are noisy where its Q-values are
    /// close; a decaying step size stops the student chasing them late in the run).
    anneal_lr: bool,
}

const CASES: [Case; 5] = [
    Case {
        label: "CartPole-v1, PPO (logits)",
        config: "cartpole_ppo.toml",
        overrides: &[],
        student_hidden: &[16],
        activation: "tanh",
        loss: "kl",
        anneal_lr: false,
    },
    Case {
        label: "CartPole-v1, DQN (Q-values, τ = 0.01)",
        config: "cartpole_dqn.toml",
        overrides: &[],
        student_hidden: &[16],
        activation: "relu",
        loss: "kl",
        anneal_lr: true,
    },
    Case {
        label: "Acrobot-v1, PPO (logits)",
        config: "cartpole_ppo.toml",
        overrides: &["env.id=\"Acrobot-v1\"", "run.total_env_steps=200000", "algorithm.gamma=0.99"],
        student_hidden: &[16],
        activation: "tanh",
        loss: "kl",
        anneal_lr: false,
    },
    Case {
        label: "Pendulum-v1, PPO (Gaussian)",
        config: "pendulum_ppo.toml",
        overrides: &[],
        student_hidden: &[32],
        activation: "tanh",
        loss: "kl",
        anneal_lr: false,
    },
    Case {
        label: "Pendulum-v1, TD3 (deterministic actions)",
        config: "pendulum_td3.toml",
        overrides: &[],
        student_hidden: &[32],
        activation: "relu",
        loss: "mse",
        anneal_lr: false,
    },
];

/// Uniformly random actions from the action space (the normalisation's floor).
struct RandomPolicy {
    space: Space,
    obs_dim: usize,
    rng: Pcg64,
}

impl Policy for RandomPolicy {
    fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    fn act_dim(&self) -> usize {
        match &self.space {
            Space::Discrete { .. } => 1,
            Space::Box { low, .. } => low.len(),
        }
    }

    fn act(&mut self, obs: ObsRef<'_>, _mode: ActMode, out: &mut ActOutput) -> flotilla_algorithms::Result<()> {
        let rows = obs.as_f32().map_or(0, |x| x.len() / self.obs_dim);
        *out = ActOutput::default();
        for _ in 0..rows {
            match &self.space {
                Space::Discrete { n, .. } => out.actions.push(self.rng.random_range(0..*n) as f32),
                Space::Box { low, high, .. } => {
                    out.actions.extend(low.iter().zip(high).map(|(l, h)| self.rng.random_range(*l..=*h)))
                }
            }
        }
        Ok(())
    }
}

/// Parameters of an MLP `inputs → hidden… → outputs` (weights and biases).
fn mlp_params(inputs: i64, hidden: &[i64], outputs: i64) -> i64 {
    let mut widths = vec![inputs];
    widths.extend_from_slice(hidden);
    widths.push(outputs);
    widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
}

/// The acting network's parameters: the policy MLP (plus a state-independent log-std for Gaussian policies);
/// a critic or target network does not act and is not counted.
fn acting_params(config: &ExperimentConfig, hidden: &[i64]) -> BenchResult<i64> {
    let (obs, act) = config.env.spaces()?;
    let inputs = obs.flat_dim() as i64;
    Ok(match act {
        flotilla_core::Space::Discrete { n, .. } => mlp_params(inputs, hidden, n as i64),
        flotilla_core::Space::Box { shape, .. } => {
            let d = shape.iter().product::<usize>() as i64;
            let log_std = if config.algorithm_name() == "ppo" || config.algorithm_name() == "distill" { d } else { 0 };
            mlp_params(inputs, hidden, d) + log_std
        }
    })
}

/// Hidden widths from the resolved config (`[algorithm] hidden_sizes`).
fn hidden_sizes(config: &ExperimentConfig) -> BenchResult<Vec<i64>> {
    let table: toml::Table = config.to_toml().parse()?;
    let sizes = table["algorithm"].get("hidden_sizes").and_then(|v| v.as_array()).ok_or("no hidden_sizes")?;
    Ok(sizes.iter().filter_map(|v| v.as_integer()).collect())
}

/// 97.5 % quantile of Student's t with `df` degrees of freedom (df ≤ 30; above that, the normal 1.96).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 { f64::NAN } else { T.get(df - 1).copied().unwrap_or(1.96) }
}

fn main() -> BenchResult<()> {
    let mut args = std::env::args().skip(1);
    let mut n_seeds = 10u64;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => n_seeds = args.next().ok_or("--seeds N")?.parse()?,
            other => return Err(format!("unknown argument {other:?}; usage: [--seeds N]").into()),
        }
    }
    tch::set_num_threads(1);
    let seeds: Vec<u64> = (1..=n_seeds).collect();
    let root = std::env::temp_dir().join(format!("flotilla-bench-distill-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    println!("# flotilla-bench-distill\n");
    println!(
        "| teacher | teacher score | random policy | acting params: teacher → student | labelled states to ≥ 95 % (mean ± 95 % CI) | never | final ≥ 95 % | last 3 evaluations ≥ 95 % | final normalised (median, worst) | s per student |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, case) in CASES.iter().enumerate() {
        // The teacher, as `flotilla train` leaves it: a run directory with config.toml and model.safetensors.
        let mut overrides = vec!["run.seed=1000"];
        overrides.extend_from_slice(case.overrides);
        let teacher_config = example_config(case.config, &overrides);
        let (mut teacher, _) = train(&teacher_config, &mut |_| Ok(()))?;
        let teacher_score = evaluate(teacher.as_mut(), &teacher_config.env, EPISODES, 4242)?.mean();
        let dir = root.join(format!("teacher-{i}"));
        let run = RunDir::create(&dir, &teacher_config)?;
        teacher.save_weights(&run.model_path())?;

        let env_id = format!("env.id={:?}", teacher_config.env.id);
        let teachers = format!("algorithm.teachers=[{:?}]", dir.display().to_string());
        let hidden = format!("algorithm.hidden_sizes={:?}", case.student_hidden);
        let loss = format!("algorithm.loss={:?}", case.loss);
        let activation = format!("algorithm.activation={:?}", case.activation);
        let episodes = format!("eval.episodes={EPISODES}");
        let anneal = format!("algorithm.anneal_lr={}", case.anneal_lr);
        let student_sets = [env_id.as_str(), &teachers, &hidden, &loss, &activation, &episodes, &anneal];
        let student_config = example_config("cartpole_distill.toml", &student_sets);
        let (obs, act) = student_config.env.spaces()?;
        let mut random = RandomPolicy { space: act, obs_dim: obs.flat_dim(), rng: Pcg64::seed_from_u64(7) };
        let random_score = evaluate(&mut random, &student_config.env, EPISODES, 4242)?.mean();
        let teacher_params = acting_params(&teacher_config, &hidden_sizes(&teacher_config)?)?;
        let student_params = acting_params(&student_config, case.student_hidden)?;
        let normalised = |score: f64| (score - random_score) / (teacher_score - random_score);
        let threshold = random_score + 0.95 * (teacher_score - random_score);
        let results = train_seeds("cartpole_distill.toml", &student_sets, &seeds, threshold);

        let budget = student_config.run.total_env_steps as f64;
        let reached: Vec<f64> = results.iter().filter_map(|r| r.first_reaching.map(|s| s as f64)).collect();
        let never = results.len() - reached.len();
        let (mean, ci) = if reached.is_empty() {
            (budget, f64::NAN)
        } else {
            let n = reached.len() as f64;
            let mean = reached.iter().sum::<f64>() / n;
            let var = reached.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
            (mean, t975(reached.len().saturating_sub(1)) * (var / n).sqrt())
        };
        let mut finals: Vec<f64> = results.iter().map(|r| normalised(r.final_return)).collect();
        finals.sort_by(f64::total_cmp);
        // Held: the last three evaluations (the final policy's and the two before it) all at ≥ 95 %.
        let final_ok = finals.iter().filter(|f| **f >= 0.95).count();
        let held = results
            .iter()
            .filter(|r| r.report.evals.iter().rev().take(3).all(|e| normalised(e.result.mean()) >= 0.95))
            .count();
        let median = finals.get(finals.len() / 2).copied().unwrap_or(f64::NAN);
        let worst = finals.first().copied().unwrap_or(f64::NAN);
        let secs = results.iter().map(|r| r.report.train_secs).sum::<f64>() / results.len().max(1) as f64;
        println!(
            "| {} → student {:?} {}, {}{} | {teacher_score:.1} | {random_score:.1} | {teacher_params} → {student_params} ({:.1} %) | {mean:.0} ± {ci:.0} | {never} | {final_ok} / {n} | {held} / {n} | {median:.3}, {worst:.3} | {secs:.1} |",
            case.label,
            case.student_hidden,
            case.activation,
            case.loss,
            if case.anneal_lr { ", lr annealed" } else { "" },
            100.0 * student_params as f64 / teacher_params as f64,
            n = results.len()
        );
    }
    multi_teacher(&root, &seeds)?;
    std::fs::remove_dir_all(&root)?;
    Ok(())
}

/// The tasks of `examples/configs/cartpole_multiteacher.toml`: name and the teacher's `[env]` overrides.
const TASKS: [(&str, &[&str]); 3] = [
    ("normal", &[]),
    ("long", &["env.kwargs.length=1.5", "env.kwargs.masspole=0.3"]),
    ("reversed", &["env.kwargs.force_mag=-10.0"]),
];

/// Multi-teacher distillation: three PPO teachers (one per CartPole physics, one with the actions reversed)
/// into one student with a head per task (`cartpole_multiteacher.toml`, 60 K env steps, 20 K per task). Per task:
/// the teacher's and a random policy's score, and over the seeds the student's final normalised score (median,
/// worst) and how many seeds end ≥ 90 %; then env steps until every task is ≥ 90 % at once.
fn multi_teacher(root: &std::path::Path, seeds: &[u64]) -> BenchResult<()> {
    let mut teachers = Vec::new();
    let mut floor_and_top = Vec::new();
    for (name, sets) in TASKS {
        let mut overrides = vec!["run.seed=1000"];
        overrides.extend_from_slice(sets);
        let config = example_config("cartpole_ppo.toml", &overrides);
        let (mut teacher, _) = train(&config, &mut |_| Ok(()))?;
        let top = evaluate(teacher.as_mut(), &config.env, EPISODES, 4242)?.mean();
        let (obs, act) = config.env.spaces()?;
        let mut random = RandomPolicy { space: act, obs_dim: obs.flat_dim(), rng: Pcg64::seed_from_u64(7) };
        let floor = evaluate(&mut random, &config.env, EPISODES, 4242)?.mean();
        let dir = root.join(format!("task-{name}"));
        let run = RunDir::create(&dir, &config)?;
        teacher.save_weights(&run.model_path())?;
        teachers.push(format!("{:?}", dir.display().to_string()));
        floor_and_top.push((floor, top));
    }
    let teachers = format!("algorithm.teachers=[{}]", teachers.join(", "));
    let episodes = format!("eval.episodes={EPISODES}");
    let sets = [teachers.as_str(), &episodes];
    let results = train_seeds("cartpole_multiteacher.toml", &sets, seeds, f64::INFINITY);
    let student = example_config("cartpole_multiteacher.toml", &sets);
    let (obs, act) = student.env.spaces()?;
    let n = match act {
        Space::Discrete { n, .. } => n as i64,
        Space::Box { .. } => return Err("CartPole has discrete actions".into()),
    };
    let student_params = mlp_params(obs.flat_dim() as i64, &[32], n * TASKS.len() as i64);
    let teacher_params = TASKS.len() as i64 * mlp_params(4, &[64, 64], n);
    println!("\n## Multi-teacher: three CartPole physics into one student\n");
    println!(
        "Student: `cartpole_multiteacher.toml`, [32] tanh, a head per task, {student_params} parameters against \
         the teachers' {teacher_params} acting parameters together; {} seeds; {EPISODES} episodes per task per \
         evaluation.\n",
        seeds.len()
    );
    println!("| task | teacher | random | final normalised (median, worst) | seeds ≥ 90 % at the end |");
    println!("|---|---:|---:|---:|---:|");
    let normalised = |k: usize, score: f64| {
        let (floor, top) = floor_and_top[k];
        (score - floor) / (top - floor)
    };
    for (k, (name, _)) in TASKS.iter().enumerate() {
        let mut finals: Vec<f64> =
            results.iter().map(|r| normalised(k, r.report.final_eval().task_means()[k].1)).collect();
        finals.sort_by(f64::total_cmp);
        let ok = finals.iter().filter(|f| **f >= 0.9).count();
        let (floor, top) = floor_and_top[k];
        println!(
            "| {name} | {top:.1} | {floor:.1} | {:.3}, {:.3} | {ok} / {} |",
            finals[finals.len() / 2],
            finals[0],
            finals.len()
        );
    }
    let all_ok = |e: &flotilla_learner::progress::EvalPoint| {
        e.result.task_means().iter().enumerate().all(|(k, (_, m))| normalised(k, *m) >= 0.9)
    };
    let reached: Vec<String> = results
        .iter()
        .map(|r| r.report.evals.iter().find(|e| all_ok(e)).map_or("never".into(), |e| e.env_steps.to_string()))
        .collect();
    let secs = results.iter().map(|r| r.report.train_secs).sum::<f64>() / results.len().max(1) as f64;
    println!(
        "\nEnv steps (all tasks together) to every task ≥ 90 % at once, per seed: {}; {secs:.1} s per student.",
        reached.join(", ")
    );
    Ok(())
}
