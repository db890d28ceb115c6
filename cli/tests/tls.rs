//! TLS between `flotilla` processes, with certificates generated here by rcgen:
//!
//! * `flotilla train --actors 2` over TLS (`--tls-cert`, `--tls-key`, `--tls-ca`) and over mutual TLS
//!   (`--client-ca`, launched actors presenting `[transport] actor_cert`): the run trains to its end;
//! * `flotilla learner` under mutual TLS with `flotilla actor` processes: one without a certificate is refused
//!   and exits at once with an error about TLS; one with a certificate the client CA signed registers and the
//!   run trains to its end;
//! * a missing certificate, a file that is not PEM and a key that is not the certificate's: errors naming the
//!   file, and no run directory;
//! * a non-loopback `--listen` without TLS is refused with an error naming the address and both ways out;
//!   `--insecure` allows it (launched actors reach it through loopback).
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{config, flotilla_within, scratch, text, watchdog};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

const LIMIT: Duration = Duration::from_secs(240);

/// A short CartPole PPO run: a few updates and the final evaluation.
const SHORT: [&str; 4] = ["--set", "run.total_env_steps=8192", "--set", "eval.interval_steps=0"];

/// `dir/NAME.pem` (+ `NAME.key`): a CA and certificates it signed.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Self {
        Pki { dir: dir.to_path_buf() }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_string()
    }

    fn ca(&self, name: &str) -> Issuer<'static, KeyPair> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("flotilla test {name}"));
        std::fs::write(self.path(&format!("{name}.pem")), params.self_signed(&key).unwrap().pem()).unwrap();
        Issuer::new(params, key)
    }

    fn leaf(&self, name: &str, ca: &Issuer<'static, KeyPair>, names: &[&str]) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, ca).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// A scratch directory holding `ca.pem`, `learner.pem` (localhost, 127.0.0.1), `client-ca.pem`, `actor.pem`
/// signed by the client CA and `other.key` (a key of no certificate here).
fn pki(name: &str) -> (PathBuf, Pki) {
    let dir = scratch("tls", name);
    let pki = Pki::new(&dir);
    let ca = pki.ca("ca");
    pki.leaf("learner", &ca, &["localhost", "127.0.0.1"]);
    pki.leaf("other", &ca, &["localhost"]);
    let client_ca = pki.ca("client-ca");
    pki.leaf("actor", &client_ca, &["actor"]);
    (dir, pki)
}

fn train(run: &Path, extra: &[String]) -> std::process::Output {
    let mut args: Vec<String> =
        ["train", &config("cartpole_ppo.toml"), "--actors", "2", "--out"].iter().map(|s| s.to_string()).collect();
    args.push(run.to_str().unwrap().into());
    args.extend(SHORT.iter().map(|s| s.to_string()));
    args.extend(extra.iter().cloned());
    flotilla_within(&args.iter().map(String::as_str).collect::<Vec<_>>(), LIMIT)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn train_with_actor_processes_over_tls_and_mutual_tls() {
    let (dir, pki) = pki("train");
    let tls = strings(&[
        "--tls-cert",
        &pki.path("learner.pem"),
        "--tls-key",
        &pki.path("learner.key"),
        "--tls-ca",
        &pki.path("ca.pem"),
    ]);
    let run = dir.join("tls");
    let out = train(&run, &tls);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("trained CartPole-v1 with ppo and 2 actors"), "{}", text(&out));
    let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(resolved.contains("tls_cert") && resolved.contains("learner.pem"), "{resolved}");

    let mut mutual = tls.clone();
    mutual.extend(strings(&[
        "--client-ca",
        &pki.path("client-ca.pem"),
        "--set",
        &format!("transport.actor_cert={:?}", pki.path("actor.pem")),
        "--set",
        &format!("transport.actor_key={:?}", pki.path("actor.key")),
    ]));
    let out = train(&dir.join("mutual"), &mutual);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("trained CartPole-v1 with ppo and 2 actors"), "{}", text(&out));

    // Mutual TLS without a certificate for the launched actors: refused before anything starts.
    let out = train(
        &dir.join("no-actor-cert"),
        &[tls.clone(), strings(&["--client-ca", &pki.path("client-ca.pem")])].concat(),
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("actor_cert"), "{}", text(&out));
    assert!(!dir.join("no-actor-cert").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_mutual_tls_an_actor_without_a_certificate_is_refused_and_one_with_a_certificate_trains() {
    let (dir, pki) = pki("external");
    let run = dir.join("run");
    let mut learner = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["learner", &config("cartpole_ppo.toml"), "--actors", "1", "--token", "s3cret"])
        .args(["--out", run.to_str().unwrap()])
        .args(SHORT)
        .args(["--tls-cert", &pki.path("learner.pem"), "--tls-key", &pki.path("learner.key")])
        .args(["--client-ca", &pki.path("client-ca.pem")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _watchdog = watchdog(learner.id(), LIMIT);
    let (tx, log) = std::sync::mpsc::channel();
    let stderr = learner.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let (addr, hint) = loop {
        let line = log.recv_timeout(deadline - Instant::now()).expect("the learner logs its address");
        if let Some(rest) = line.split("learner listening on ").nth(1) {
            let addr = rest.split(':').take(2).collect::<Vec<_>>().join(":");
            let hint = log.recv_timeout(Duration::from_secs(10)).unwrap();
            let hint = format!("{hint}\n{}", log.recv_timeout(Duration::from_secs(10)).unwrap());
            break (addr, hint);
        }
    };
    assert!(hint.contains("--tls-ca") && hint.contains("--tls-cert"), "{hint}");
    let actor = |extra: &[&str]| {
        let mut args = vec!["actor", "--learner", &addr, "--token", "s3cret", "--reconnect-secs", "30"];
        args.extend(extra);
        flotilla_within(&args, LIMIT)
    };
    let ca = pki.path("ca.pem");
    let started = Instant::now();
    let refused = actor(&["--tls-ca", &ca]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(started.elapsed() < Duration::from_secs(20), "a refused certificate is not retried like a lost learner");
    assert!(text(&refused).contains("TLS") || text(&refused).contains("certificate"), "{}", text(&refused));

    let good = actor(&["--tls-ca", &ca, "--tls-cert", &pki.path("actor.pem"), "--tls-key", &pki.path("actor.key")]);
    assert!(good.status.success(), "{}", text(&good));
    let status = learner.wait().unwrap();
    let rest = log.try_iter().collect::<Vec<_>>().join("\n");
    assert!(status.success(), "{rest}");
    assert!(run.join("model.safetensors").is_file(), "{rest}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_certificate_files_are_named_before_a_run_directory_is_written() {
    let (dir, pki) = pki("files");
    std::fs::write(dir.join("garbage.pem"), "not a certificate\n").unwrap();
    let cases = [
        ("missing", pki.path("nowhere.pem"), pki.path("learner.key"), "nowhere.pem"),
        ("not-pem", pki.path("garbage.pem"), pki.path("learner.key"), "garbage.pem"),
        ("mismatch", pki.path("learner.pem"), pki.path("other.key"), "other.key"),
    ];
    for (name, cert, key, named) in cases {
        let run = dir.join(name);
        let args = strings(&["--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &pki.path("ca.pem")]);
        let out = train(&run, &args);
        assert!(!out.status.success(), "{name}: {}", text(&out));
        assert!(text(&out).contains(named), "{name}: {}", text(&out));
        assert!(!run.exists(), "{name}: nothing is written");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_non_loopback_address_needs_tls_or_insecure() {
    let dir = scratch("tls", "insecure");
    let run = dir.join("refused");
    let out = flotilla_within(
        &[
            "learner",
            &config("cartpole_ppo.toml"),
            "--actors",
            "1",
            "--listen",
            "0.0.0.0:0",
            "--out",
            run.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(!out.status.success());
    let message = text(&out);
    for needle in ["0.0.0.0:0", "--tls-cert", "--insecure", "insecure = true"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert!(!run.exists());

    let run = dir.join("insecure");
    let out = train(&run, &strings(&["--set", "learner.listen=\"0.0.0.0:0\"", "--insecure"]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("trained CartPole-v1 with ppo and 2 actors"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
