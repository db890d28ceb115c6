//! Populations (`[population]`, `--population N`, `flotilla sweep`): a member is bit for bit the run its seed
//! and hyperparameters give alone; a stopped population (PBT included) resumes to the same bytes; PBT writes
//! its lineage; sweeps split across jobs; bad population configs are refused before anything is written.
mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{config, flotilla, scratch, text};

fn ok(out: Output) -> String {
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    text
}

fn run(args: &[String]) -> Output {
    flotilla(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `flotilla train CONFIG --set ... --out OUT extra...`
fn train(cfg: &str, sets: &[&str], out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["train".into(), cfg.into()];
    for s in sets.iter().chain(&["run.device=cpu", "run.torch_threads=1"]) {
        args.extend(["--set".into(), s.to_string()]);
    }
    args.extend(["--out".into(), out.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args)
}

fn model(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("model.safetensors")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The f32 values of a safetensors file (every tensor, in file order).
fn weights(dir: &Path) -> Vec<f32> {
    let bytes = model(dir);
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Largest |a − b| over the largest |b|.
fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    diff / b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max)
}

fn member(dir: &Path, k: usize) -> PathBuf {
    dir.join("members").join(format!("{k:03}"))
}

/// An example config with `extra` TOML appended, written to `dir/name.toml`.
fn config_with(dir: &Path, name: &str, example: &str, extra: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{name}.toml"));
    let base = std::fs::read_to_string(config(example)).unwrap();
    std::fs::write(&path, format!("{base}\n{extra}\n")).unwrap();
    path.display().to_string()
}

/// Every member must be the run alone bit for bit: with `step_threads = None` (`batched = false`) each member
/// trains as its own run; `Some(n)` (`batched = true` on one thread) steps the members' envs as one joint
/// batch, on `n` threads that also let the members observe their shares (and updates each member alone where
/// its fused CPU step is taken).
fn check_members_equal_alone(label: &str, example: &str, sets: &[&str], step_threads: Option<usize>) {
    let dir = scratch("population", label);
    let pop = dir.join("pop");
    let (threads, batched) = if step_threads.is_some() { ("1", "true") } else { ("2", "false") };
    let (threads, batched) = (format!("population.threads={threads}"), format!("population.batched={batched}"));
    let stepping = format!("population.step_threads={}", step_threads.unwrap_or(0));
    let extra = ["--population", "3", "--set", &threads, "--set", &batched, "--set", &stepping];
    let printed = ok(train(&config(example), sets, &pop, &extra));
    assert!(printed.contains("population of 3"), "{label}: {printed}");
    let joint = printed.contains("3 members' envs step as one batch of");
    assert_eq!(joint, step_threads.is_some(), "{label}: joint env batch? {printed}");
    if let Some(n) = step_threads.filter(|&n| n > 1) {
        assert!(printed.contains(&format!("envs on {n} threads")), "{label}: stepped on {n} threads? {printed}");
    }
    for k in [0usize, 2] {
        let alone = dir.join(format!("alone-{k}"));
        let seed = format!("run.seed={}", 1 + k);
        let mut with_seed = sets.to_vec();
        with_seed.push(&seed);
        ok(train(&config(example), &with_seed, &alone, &[]));
        assert!(model(&member(&pop, k)) == model(&alone), "{label}: member {k} differs from seed {} alone", 1 + k);
        let a = std::fs::read_to_string(member(&pop, k).join("metrics.csv")).unwrap();
        let b = std::fs::read_to_string(alone.join("metrics.csv")).unwrap();
        let drop_time = |s: &str| -> Vec<String> {
            // train_secs and sps are wall-clock; every other column must match.
            let mut rows = s.lines();
            let header: Vec<&str> = rows.next().unwrap().split(',').collect();
            let keep: Vec<usize> =
                (0..header.len()).filter(|&i| !matches!(header[i], "train_secs" | "charts/sps")).collect();
            rows.map(|r| {
                let cells: Vec<&str> = r.split(',').collect();
                keep.iter().map(|&i| cells[i]).collect::<Vec<_>>().join(",")
            })
            .collect()
        };
        assert_eq!(drop_time(&a), drop_time(&b), "{label}: member {k}'s metrics differ from the run alone");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bit-identical, not within a tolerance: each member is its own Trainer (one torch thread), whichever worker
/// thread runs it.
#[test]
fn ppo_members_are_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=4096", "eval.interval_steps=2048"];
    check_members_equal_alone("ppo", "cartpole_ppo.toml", &sets, None);
}

/// One thread, `batched = true`: the members' envs step as one joint N×E batch (given back to the members
/// for every checkpoint, then joined again; stepped and observed on 3 and 2 threads) and each member takes its
/// fused CPU update alone, so each must still be its seed trained alone, bit for bit: discrete (PPO) and
/// continuous (TD3) actions.
#[test]
fn members_stepping_one_joint_env_batch_are_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=4096", "eval.interval_steps=2048", "checkpoint.interval_steps=1024"];
    // On 3 threads (one member each) and 2, the members' envs stepped and observed in parallel.
    check_members_equal_alone("joint-ppo", "cartpole_ppo.toml", &sets, Some(3));
    check_members_equal_alone("joint-td3", "pendulum_td3.toml", &OFF_POLICY_SETS, Some(2));
}

/// SAC members update one after the other, each as alone (no stacked SAC update): stepping one joint env
/// batch, sampling from their own generators, each must be its seed trained alone, bit for bit, with its
/// learnt entropy coefficient.
#[test]
fn sac_members_are_their_seeds_trained_alone() {
    check_members_equal_alone("joint-sac", "pendulum_sac.toml", &OFF_POLICY_SETS, Some(1));
}

/// A short Pendulum run for the off-policy members' tests: learning starts, checkpoints and evaluations fall
/// inside it.
const OFF_POLICY_SETS: [&str; 4] = [
    "run.total_env_steps=1200",
    "algorithm.learning_starts=400",
    "eval.interval_steps=600",
    "checkpoint.interval_steps=500",
];

/// Batched on libtorch (`fused_cpu = false`; the fused CPU step updates members in turn, each bit for bit as
/// alone): 4 members of `example` on one thread (`sets`, and `population` settings) share every update (one
/// batched program); members 0 and 3 must end within 1e-5 relative of their runs alone and reach the same
/// final evaluations.
fn check_batched_members_match_alone(label: &str, example: &str, sets: &[&str], population: &[&str]) {
    let dir = scratch("population", label);
    let pop = dir.join("pop");
    let mut extra = vec!["--population", "4", "--set", "population.threads=1"];
    for p in population {
        extra.extend(["--set", p]);
    }
    let printed = ok(train(&config(example), sets, &pop, &extra));
    let acting = printed.contains("acting in one batched pass");
    assert_eq!(acting, population.contains(&"population.batched_acting=true"), "{label}: {printed}");
    for k in [0usize, 3] {
        let alone = dir.join(format!("alone-{k}"));
        let seed = format!("run.seed={}", 1 + k);
        let mut with_seed = sets.to_vec();
        with_seed.push(&seed);
        ok(train(&config(example), &with_seed, &alone, &[]));
        let d = relative_difference(&weights(&member(&pop, k)), &weights(&alone));
        eprintln!("{label}: member {k}'s weights within {d:e} of seed {} alone", 1 + k);
        assert!(d <= 1e-5, "{label}: member {k}'s weights differ from seed {} alone by {d:e} (relative)", 1 + k);
        let evals = |run: &Path| common::metric(run, "eval/mean_return");
        assert_eq!(evals(&member(&pop, k)), evals(&alone), "{label}: member {k}'s evaluations");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// PPO: 8 updates × 20 epochs, each member within 1e-5 relative of its run alone (reductions add in another
/// order: ~1e-8 per update, checked to 1e-6 after 4 updates in algorithms' ppo_population tests).
#[test]
fn batched_ppo_members_match_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=2048", "eval.interval_steps=1024", "algorithm.fused_cpu=false"];
    check_batched_members_match_alone("batched", "cartpole_ppo.toml", &sets, &[]);
}

/// The same with the members acting in one batched pass too (`batched_acting`, on by itself on an
/// accelerator; forced here on the CPU) and their bootstrap values from one pass: every action each member
/// takes is still the one it takes alone, so its run is still its run alone to float rounding.
#[test]
fn ppo_members_acting_in_one_batched_pass_match_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=2048", "eval.interval_steps=1024", "algorithm.fused_cpu=false"];
    check_batched_members_match_alone(
        "batched-acting",
        "cartpole_ppo.toml",
        &sets,
        &["population.batched_acting=true"],
    );
}

/// `FLOTILLA_PROFILE_UPDATE=1` times the batched updates' and acting passes' phases (a device wait at each) and
/// logs their sums at the group's end; the run is the same run, bit for bit. Any value but 0 or 1 is refused by
/// name before anything is written.
#[test]
fn timing_the_batched_updates_phases_logs_them_and_changes_nothing() {
    let dir = scratch("population", "phases");
    let with = |value: &str, out: &Path| {
        let sets = ["run.total_env_steps=512", "eval.interval_steps=256", "algorithm.fused_cpu=false"];
        let sets = sets.iter().chain(&["population.batched_acting=true"]);
        let mut args = vec!["train".to_string(), config("cartpole_ppo.toml")];
        for s in sets.chain(&["run.device=cpu", "run.torch_threads=1", "population.threads=1"]) {
            args.extend(["--set".into(), s.to_string()]);
        }
        args.extend(["--population", "3", "--out", &out.display().to_string()].map(String::from));
        std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(&args)
            .env("FLOTILLA_PROFILE_UPDATE", value)
            .output()
            .unwrap()
    };
    let (timed, plain) = (dir.join("timed"), dir.join("plain"));
    let printed = ok(with("1", &timed));
    // One line per segment of the group's run (a segment may hold acting passes and no update).
    let lines: Vec<&str> = printed.lines().filter(|l| l.contains("batched update and acting phases")).collect();
    assert!(!lines.is_empty(), "{printed}");
    let line = lines.join("\n");
    let update = ["finishing rollouts", "preparing the batch", "forward and loss", "backward", "optimiser step"];
    let acting = ["acting: observations to the device", "acting: forward pass", "acting: sampling on the host"];
    for phase in update.iter().chain(&acting) {
        assert!(line.contains(&format!(" s {phase}")), "{phase} timed: {line}");
    }
    let printed = ok(with("0", &plain));
    assert!(!printed.contains("batched update and acting phases"), "untimed: {printed}");
    for k in 0..3 {
        assert_eq!(model(&member(&timed, k)), model(&member(&plain, k)), "member {k}: timed run's weights");
    }
    let refused = dir.join("refused");
    let out = with("yes", &refused);
    let said = text(&out);
    assert!(!out.status.success() && said.contains("FLOTILLA_PROFILE_UPDATE=\"yes\""), "{said}");
    assert!(!refused.exists(), "nothing written for a refused run");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A2C batched the same way (`a2c_population`): 4 members share each of their 50 one-step RMSprop updates
/// (checked to 1e-6 after 6 updates in algorithms' a2c_population tests; with one torch thread, as here, it
/// came out bit-identical); and again acting and evaluating in one batched pass.
#[test]
fn batched_a2c_members_match_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=2000", "eval.interval_steps=1000", "algorithm.fused_cpu=false"];
    check_batched_members_match_alone("batched-a2c", "cartpole_a2c.toml", &sets, &[]);
    check_batched_members_match_alone(
        "batched-acting-a2c",
        "cartpole_a2c.toml",
        &sets,
        &["population.batched_acting=true"],
    );
}

#[test]
fn dqn_members_are_their_seeds_trained_alone() {
    let sets = ["run.total_env_steps=3000", "algorithm.learning_starts=500", "eval.interval_steps=1500"];
    check_members_equal_alone("dqn", "cartpole_dqn.toml", &sets, None);
}

/// A grid member trains with its grid point's values: the same bytes as a single run with those values.
#[test]
fn a_grid_member_is_its_hyperparameters_trained_alone() {
    let dir = scratch("population", "grid");
    let cfg = config_with(
        &dir,
        "grid",
        "cartpole_ppo.toml",
        "[population]\nsize = 4\nbatched = false\n[population.sweep]\nmode = \"grid\"\n[population.sweep.values]\n\
         \"algorithm.learning_rate\" = [5e-4, 2e-3]\n\"algorithm.ent_coef\" = [0.0, 0.01]\n",
    );
    let pop = dir.join("pop");
    ok(train(&cfg, &["run.total_env_steps=2048"], &pop, &[]));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pop.join("population.json")).unwrap()).unwrap();
    let hp = |k: usize| record["members"][k]["hyperparameters"].clone();
    // Member k takes grid point k: the first key cycles fastest.
    assert_eq!(hp(0)["algorithm.ent_coef"], 0.0);
    assert_eq!(hp(1)["algorithm.ent_coef"], 0.01);
    assert_eq!(hp(2)["algorithm.learning_rate"], 2e-3);
    assert_eq!(hp(3)["algorithm.ent_coef"], 0.01);
    let alone = dir.join("alone");
    ok(train(
        &config("cartpole_ppo.toml"),
        &["run.total_env_steps=2048", "run.seed=4", "algorithm.learning_rate=2e-3", "algorithm.ent_coef=0.01"],
        &alone,
        &[],
    ));
    assert!(model(&member(&pop, 3)) == model(&alone), "grid member 3 differs from its settings trained alone");
    let member_config = std::fs::read_to_string(member(&pop, 3).join("config.toml")).unwrap();
    assert!(!member_config.contains("[population"), "a member's config is a plain run's: {member_config}");
    std::fs::remove_dir_all(&dir).unwrap();
}

const PBT: &str = "[population]\nsize = 4\nthreads = 2\n[population.sweep]\nmode = \"random\"\n\
                   [population.sweep.values]\n\"algorithm.learning_rate\" = { log_uniform = [1e-4, 3e-3] }\n\
                   \"algorithm.clip_range\" = [0.1, 0.2, 0.3]\n\
                   [population.pbt]\ninterval_steps = 2048\nquantile = 0.25\nperturb = [0.8, 1.25]\n";

/// A PBT population stopped mid-segment and resumed in a new process ends with the same weights, configs and
/// lineage as one trained in one go; the lineage has one exploit per interval (quantile 0.25 of 4), inside the
/// sweep's ranges, and each exploited member's config holds its new values.
#[test]
fn pbt_population_resumes_bit_identically_and_records_its_lineage() {
    let dir = scratch("population", "pbt");
    let cfg = config_with(&dir, "pbt", "cartpole_ppo.toml", PBT);
    let sets = ["run.total_env_steps=8192", "eval.interval_steps=4096", "metrics.log_interval_steps=512"];
    let (one, two) = (dir.join("one"), dir.join("two"));
    ok(train(&cfg, &sets, &one, &[]));
    let stopped = ok(train(&cfg, &sets, &two, &["--stop-at", "3000"]));
    assert!(stopped.contains("stopped: 0 of 4 members finished"), "{stopped}");
    ok(flotilla(&["train", "--resume", two.to_str().unwrap()]));
    for k in 0..4 {
        assert!(model(&member(&one, k)) == model(&member(&two, k)), "member {k}: resumed weights differ");
        let c = |d: &Path| std::fs::read_to_string(member(d, k).join("config.toml")).unwrap();
        assert_eq!(c(&one), c(&two), "member {k}: config");
    }
    let lineage = std::fs::read_to_string(one.join("lineage.jsonl")).unwrap();
    assert_eq!(lineage, std::fs::read_to_string(two.join("lineage.jsonl")).unwrap());
    let events: Vec<serde_json::Value> = lineage.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<u64> = events.iter().map(|e| e["env_steps"].as_u64().unwrap()).collect();
    assert_eq!(steps, [2048, 4096, 6144], "one exploit per interval, none at the end: {lineage}");
    for e in &events {
        assert_ne!(e["member"], e["source"], "{e}");
        let lr = e["hyperparameters"]["algorithm.learning_rate"].as_f64().unwrap();
        let clip = e["hyperparameters"]["algorithm.clip_range"].as_f64().unwrap();
        assert!((1e-4..=3e-3).contains(&lr) && (0.1..=0.3).contains(&clip), "outside the sweep's ranges: {e}");
    }
    // Stopped right at the first PBT step: the exploited member's whole state (weights, Adam moments, RNG
    // streams, envs, counters) is its source's, so their checkpoints and weights are the same bytes.
    let three = dir.join("three");
    ok(train(&cfg, &sets, &three, &["--stop-at", "2048"]));
    let (k, j) = (events[0]["member"].as_u64().unwrap() as usize, events[0]["source"].as_u64().unwrap() as usize);
    let file = |m: usize, f: &str| std::fs::read(member(&three, m).join(f)).unwrap();
    assert!(file(k, "checkpoint.safetensors") == file(j, "checkpoint.safetensors"), "member {k} ◄ {j}: state");
    assert!(file(k, "model.safetensors") == file(j, "model.safetensors"), "member {k} ◄ {j}: weights");
    let last = events.last().unwrap();
    let k = last["member"].as_u64().unwrap() as usize;
    let member_config: toml::Table =
        std::fs::read_to_string(member(&one, k).join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(
        member_config["algorithm"]["learning_rate"].as_float().unwrap(),
        last["hyperparameters"]["algorithm.learning_rate"].as_f64().unwrap(),
        "the exploited member's config holds its new learning rate"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `flotilla sweep --jobs 2`: job 0 by --job-index, job 1 by a Kubernetes Indexed Job's JOB_COMPLETION_INDEX;
/// each trains its members (k mod 2) into its own directory, and the members are those of one whole population.
#[test]
fn sweep_jobs_split_the_members_and_report_merges_them() {
    let dir = scratch("population", "sweep");
    let cfg = config_with(&dir, "sweep", "cartpole_ppo.toml", "[population]\nsize = 4\nbatched = false\n");
    let out = dir.join("sweep");
    let sweep = |extra: &[&str], env: Option<(&str, &str)>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
        c.args(["sweep", &cfg, "--set", "run.total_env_steps=2048", "--out", out.to_str().unwrap(), "--jobs", "2"]);
        c.args(extra).env_remove("SLURM_ARRAY_TASK_ID").env_remove("JOB_COMPLETION_INDEX");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    ok(sweep(&["--job-index", "0"], None));
    ok(sweep(&[], Some(("JOB_COMPLETION_INDEX", "1"))));
    let none = sweep(&[], None);
    assert!(!none.status.success() && text(&none).contains("--job-index"), "{}", text(&none));
    let jobs = [out.join("job-000-of-002"), out.join("job-001-of-002")];
    for (j, job) in jobs.iter().enumerate() {
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(job.join("population.json")).unwrap()).unwrap();
        let indices: Vec<u64> =
            record["members"].as_array().unwrap().iter().map(|m| m["index"].as_u64().unwrap()).collect();
        assert_eq!(indices, [j as u64, j as u64 + 2], "job {j}");
    }
    // Member 3 (job 1) is seed 4 alone.
    let alone = dir.join("alone");
    ok(train(&config("cartpole_ppo.toml"), &["run.total_env_steps=2048", "run.seed=4"], &alone, &[]));
    assert!(model(&member(&jobs[1], 3)) == model(&alone));
    // The same job again (a retried pod) continues its directory instead of failing or starting over.
    let again = ok(sweep(&["--job-index", "1"], None));
    assert!(again.contains("population of 2"), "{again}");
    let report = ok(flotilla(&["report", "--json", jobs[0].to_str().unwrap(), jobs[1].to_str().unwrap()]));
    let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
    assert_eq!(report["size"], 4, "{report}");
    let mut seeds: Vec<u64> =
        report["members"].as_array().unwrap().iter().map(|m| m["seed"].as_u64().unwrap()).collect();
    seeds.sort_unstable();
    assert_eq!(seeds, [1, 2, 3, 4]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Settings that cannot differ inside one population, and other bad population configs, are refused with the
/// reason, before a run directory is written.
#[test]
fn bad_population_configs_are_refused_before_anything_is_written() {
    let dir = scratch("population", "bad");
    let sweep = |values: &str| {
        format!("[population]\nsize = 4\n[population.sweep]\nmode = \"grid\"\n[population.sweep.values]\n{values}\n")
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("batch", sweep("\"algorithm.batch_size\" = [128, 256]"), "cannot vary inside one population"),
        ("hidden", sweep("\"algorithm.hidden_sizes\" = [64, 128]"), "cannot vary inside one population"),
        ("envs", sweep("\"env.num_envs\" = [4, 8]"), "cannot vary inside one population"),
        ("unknown", sweep("\"algorithm.learning_rat\" = [1e-3, 2e-3]"), "not a per-member hyperparameter"),
        ("grid3", sweep("\"algorithm.learning_rate\" = [1e-4, 1e-3, 1e-2]"), "give a multiple of 3"),
        ("dist", sweep("\"algorithm.learning_rate\" = { log_uniform = [1e-3, 1e-4] }"), "low < high"),
        ("pbt", "[population]\nsize = 4\n[population.pbt]\ninterval_steps = 1000\n".into(), "give [population.sweep]"),
        ("empty", "[population]\nsize = 0\n".into(), "at least one member"),
        ("range", sweep("\"algorithm.gamma\" = [0.9, 1.5]"), "gamma"),
        (
            "paired",
            "[population]\nsize = 4\n[population.sweep]\nmode = \"random\"\npaired_seeds = true\n\
             [population.sweep.values]\n\"algorithm.gamma\" = { uniform = [0.9, 0.99] }\n"
                .into(),
            "needs mode = \"grid\"",
        ),
    ];
    for (name, extra, expected) in cases {
        let cfg = config_with(&dir, name, "cartpole_ppo.toml", &extra);
        let out = dir.join(format!("out-{name}"));
        let o = train(&cfg, &[], &out, &[]);
        let t = text(&o);
        assert!(!o.status.success() && t.contains(expected), "{name}: expected {expected:?} in {t}");
        assert!(!out.exists(), "{name}: {} was written", out.display());
    }
    let out = dir.join("out-actors");
    let o = train(&config("cartpole_ppo.toml"), &[], &out, &["--population", "2", "--actors", "2"]);
    assert!(!o.status.success() && text(&o).contains("distributed populations"), "{}", text(&o));
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batched population whose members' checkpoints stand at different steps (as after a crash between two
/// members' saves) resumes: the member behind catches up on its own, then the group trains in lockstep again,
/// and every member ends within float rounding of an uninterrupted population.
#[test]
fn batched_population_resumes_members_checkpointed_at_different_steps() {
    let dir = scratch("population", "uneven");
    let sets = ["run.total_env_steps=2048", "eval.interval_steps=1024", "algorithm.fused_cpu=false"];
    let extra = ["--population", "2", "--set", "population.threads=1"];
    let (whole, late, early) = (dir.join("whole"), dir.join("late"), dir.join("early"));
    ok(train(&config("cartpole_ppo.toml"), &sets, &whole, &extra));
    ok(train(&config("cartpole_ppo.toml"), &sets, &late, &[&extra[..], &["--stop-at", "1024"]].concat()));
    ok(train(&config("cartpole_ppo.toml"), &sets, &early, &[&extra[..], &["--stop-at", "512"]].concat()));
    // Member 1 of `late` goes back to 512 env steps.
    for f in ["checkpoint.safetensors", "metrics.csv"] {
        std::fs::copy(member(&early, 1).join(f), member(&late, 1).join(f)).unwrap();
    }
    ok(flotilla(&["train", "--resume", late.to_str().unwrap()]));
    for k in 0..2 {
        let d = relative_difference(&weights(&member(&late, k)), &weights(&member(&whole, k)));
        assert!(d <= 1e-5, "member {k}: {d:e}");
        let steps = common::metric(&member(&late, k), "env_steps");
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "member {k}: env steps repeat in metrics.csv: {steps:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
