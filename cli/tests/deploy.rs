//! The deployment files under `deploy/`: the Kubernetes manifests validate against the API schemas and agree with
//! each other (`deploy/validate.sh`), every option their containers pass to `flotilla learner` / `flotilla actor`
//! exists, the learner and actor command lines of `deploy/k8s` train CartPole when run as written (Kubernetes'
//! `$(VAR)` expansion and the Service's name swapped for loopback), and so does the Slurm script under stand-in
//! `srun` and `scontrol`.
mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{scratch, text, watchdog};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn flotilla_help(subcommand: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla")).args([subcommand, "--help"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this binary has the TLS options (`--tls-cert`, `--insecure`, ...) the manifests pass.
fn has_tls_options() -> bool {
    let help = flotilla_help("learner");
    help.contains("--tls-cert") && help.contains("--insecure")
}

/// `deploy/validate.sh`, with every container's command and args written to JSON.
fn validated_commands(dir: &Path) -> Vec<Value> {
    let json = dir.join("commands.json");
    let out = Command::new("bash")
        .arg(repo("deploy/validate.sh"))
        .env("FLOTILLA_DEPLOY_COMMANDS", &json)
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "deploy/validate.sh failed:\n{}", text(&out));
    let commands: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    commands.as_array().unwrap().clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

/// The `--options` in a container's command (a shell script's words included) and args.
fn options(container: &Value) -> Vec<String> {
    let mut words = strings(&container["command"]);
    words.extend(strings(&container["args"]));
    words
        .iter()
        .flat_map(|w| w.split(|c: char| c.is_whitespace() || c == '"' || c == '\''))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.split('=').next().unwrap().to_string())
        .collect()
}

#[test]
fn manifests_validate_and_pass_only_real_options() {
    let dir = scratch("deploy", "options");
    let commands = validated_commands(&dir);
    let learner_help = flotilla_help("learner");
    let actor_help = flotilla_help("actor");
    // TLS is being added as `--tls-cert --tls-key --tls-ca --client-ca` and `--insecure`; until the binary has
    // them, the manifests' uses are reported, not failed.
    let tls = ["--tls-cert", "--tls-key", "--tls-ca", "--client-ca", "--insecure"];
    let has_tls = has_tls_options();
    let mut checked = 0;
    for c in &commands {
        let (role, help) = match c["container"].as_str().unwrap() {
            "learner" => ("learner", &learner_help),
            "actor" => ("actor", &actor_help),
            other => panic!("unexpected container {other}"),
        };
        for option in options(c) {
            if !has_tls && tls.contains(&option.as_str()) {
                eprintln!("NOTE: {} passes {option}, which `flotilla {role}` does not have yet", c["file"]);
                continue;
            }
            assert!(
                help.contains(&format!("{option} ")) || help.contains(&format!("{option}\n")),
                "{}: `flotilla {role}` has no {option}:\n{help}",
                c["file"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 16, "only {checked} options found in {commands:?}");
}

#[test]
fn deploy_config_loads() {
    let path = repo("deploy/k8s/base/config.toml");
    flotilla_learner::config::ExperimentConfig::load(&path, &[]).unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kubernetes' expansion of `$(NAME)` in command and args (`$$` is a literal `$`).
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = s.replace("$$", "\u{0}");
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out.replace('\u{0}', "$")
}

/// Wait for `child` and collect its output, killing it if it runs past `limit`.
fn wait_within(child: Child, limit: Duration) -> Output {
    let done = watchdog(child.id(), limit);
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    out
}

#[test]
fn kubernetes_commands_train_as_written() {
    let dir = scratch("deploy", "k8s");
    let commands = validated_commands(&dir);
    let pick = |container: &str| {
        commands
            .iter()
            .find(|c| c["file"] == "k8s.yaml" && c["container"] == container)
            .unwrap_or_else(|| panic!("no {container} in deploy/k8s"))
            .clone()
    };
    let (learner, actor) = (pick("learner"), pick("actor"));
    let has_tls = has_tls_options();
    let port = free_port();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_flotilla"));
    let path = format!("{}:{}", bin.parent().unwrap().display(), std::env::var("PATH").unwrap());
    let run_dir = dir.join("runs/run");
    let env = vec![("RUN_NAME".to_string(), "run".to_string()), ("RUN_DIR".to_string(), run_dir.display().to_string())];
    // What differs from a pod: the config's path, loopback instead of every interface and the Service's name, and
    // a short budget.
    let local = |s: &str| {
        expand(s, &env)
            .replace("/etc/flotilla/config.toml", repo("deploy/k8s/base/config.toml").to_str().unwrap())
            .replace("0.0.0.0:50051", &format!("127.0.0.1:{port}"))
            .replace("0.0.0.0:9100", "127.0.0.1:0")
            .replace("flotilla-learner-0.flotilla-learner:50051", &format!("127.0.0.1:{port}"))
    };
    let start = |c: &Value, extra: &[&str]| {
        let mut words: Vec<String> = strings(&c["command"])
            .iter()
            .chain(&strings(&c["args"]))
            .map(|w| local(w))
            .filter(|w| has_tls || w != "--insecure")
            .collect();
        words.extend(extra.iter().map(|s| s.to_string()));
        Command::new(&words[0])
            .args(&words[1..])
            .env("PATH", &path)
            .env("FLOTILLA_TOKEN", "deploy-test-token")
            .envs(env.iter().cloned())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let learner_child = start(&learner, &["--set", "run.total_env_steps=20000"]);
    let actors: Vec<Child> = (0..4).map(|_| start(&actor, &[])).collect();
    let out = wait_within(learner_child, Duration::from_secs(300));
    assert!(out.status.success(), "learner:\n{}", text(&out));
    assert!(run_dir.join("model.safetensors").is_file(), "{}", text(&out));
    for a in actors {
        let out = wait_within(a, Duration::from_secs(120));
        assert!(out.status.success(), "actor:\n{}", text(&out));
    }
    // Restarted on the run directory it wrote, the learner pod says so and idles instead of overwriting it.
    let mut again = start(&learner, &[]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(again.try_wait().unwrap().is_none(), "a restarted learner should idle");
    unsafe { libc::kill(again.id() as i32, libc::SIGTERM) };
    let out = wait_within(again, Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("already holds a run (it ended with a model)"), "{}", text(&out));
}

#[test]
fn slurm_script_trains_under_stand_in_srun() {
    let dir = scratch("deploy", "slurm");
    let fake = dir.join("bin");
    std::fs::create_dir_all(&fake).unwrap();
    // scontrol: the job's one node; srun: --ntasks copies of the command with Slurm's task variables.
    let scripts = [
        ("scontrol", "#!/usr/bin/env bash\necho localhost\n"),
        (
            "srun",
            r#"#!/usr/bin/env bash
n=1
while [[ $# -gt 0 && $1 == -* ]]; do case $1 in --ntasks=*) n=${1#--ntasks=};; esac; shift; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_LOCALID=$i "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"#,
        ),
    ];
    for (name, body) in scripts {
        let p = fake.join(name);
        std::fs::write(&p, body).unwrap();
        Command::new("chmod").arg("+x").arg(&p).status().unwrap();
    }
    let run_dir = dir.join("run");
    let child = Command::new("bash")
        .arg(repo("deploy/slurm/flotilla.sbatch"))
        .arg(repo("examples/configs/cartpole_ppo.toml"))
        .args(["--set", "run.total_env_steps=20000"])
        .current_dir(repo(""))
        .env("PATH", format!("{}:{}", fake.display(), std::env::var("PATH").unwrap()))
        .env("SLURM_JOB_NODELIST", "localhost")
        .env("SLURM_JOB_ID", "1")
        .env("FLOTILLA", env!("CARGO_BIN_EXE_flotilla"))
        .env("PORT", free_port().to_string())
        .env("MASTER_PORT", free_port().to_string())
        .env("LEARNERS", "1")
        .env("ACTORS_PER_LEARNER", "2")
        .env("RUN_DIR", &run_dir)
        // The script's default is --insecure (plaintext beyond loopback), an option binaries before TLS lack.
        .env("LEARNER_TLS_ARGS", if has_tls_options() { "--insecure" } else { "" })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(300));
    assert!(out.status.success(), "{}", text(&out));
    assert!(run_dir.join("model.safetensors").is_file(), "{}", text(&out));
    assert!(text(&out).contains("and 2 actors"), "{}", text(&out));
}
