//! gRPC over TLS, with certificates generated here by rcgen (a CA, certificates it signed, an expired one, a
//! second CA that signed nothing the server uses):
//!
//! * good certificates: calls go through, and the run token is still required;
//! * a client trusting another CA, and a server certificate that has expired: the connection is refused with
//!   an error about the certificate ([`Code::Unauthenticated`], not retried as if the learner were down);
//! * a plaintext client against a TLS server fails, and the server goes on serving TLS clients;
//! * mutual TLS: a client without a certificate, or with one another CA signed, is refused; one the client CA
//!   signed is served;
//! * a missing file, a file without PEM and a key that is not the certificate's: errors naming the file.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::Space;
use flotilla_transport::grpc::{GrpcClient, Limits, ServerHandle, serve, serve_with};
use flotilla_transport::tls::{ClientTls, ServerTls};
use flotilla_transport::{Code, LearnerClient, Registration, RpcError, RunInfo};
mod common;
use common::Echo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

const TOKEN: &str = "tls-test-token";
const TIMEOUT: Duration = Duration::from_secs(5);

/// Certificates and keys as PEM files in a directory of their own.
struct Pki {
    dir: PathBuf,
}

/// A CA's certificate (written as `NAME.pem`) and what signs with it.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Pki { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A self-signed CA, its certificate in `NAME.pem`.
    fn ca(&self, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("flotilla test {name}"));
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        Ca { issuer: Issuer::new(params, key) }
    }

    /// A certificate for `names` signed by `ca`, in `NAME.pem` and `NAME.key`; `expired` dates it 2000–2001.
    fn leaf(&self, name: &str, ca: &Ca, names: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        let (cert_path, key_path) = (self.path(&format!("{name}.pem")), self.path(&format!("{name}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn start(rt: &tokio::runtime::Runtime, tls: Option<&ServerTls>) -> ServerHandle {
    start_with(rt, tls, &Limits::default())
}

fn start_with(rt: &tokio::runtime::Runtime, tls: Option<&ServerTls>, limits: &Limits) -> ServerHandle {
    serve_with(rt.handle(), Arc::new(Echo), "127.0.0.1:0".parse().unwrap(), TOKEN, limits, tls).unwrap()
}

fn connect(server: &ServerHandle, token: &str, tls: Option<&ClientTls>) -> Result<GrpcClient, RpcError> {
    GrpcClient::connect_with(&server.local_addr.to_string(), token, &Limits::default(), TIMEOUT, tls)
}

/// Connect and make one call: where a refusal shows depends on the TLS version (TLS 1.3 clients finish their
/// handshake before the server has checked their certificate, and learn of a refusal on the first call).
fn call(server: &ServerHandle, token: &str, tls: Option<&ClientTls>) -> Result<RunInfo, RpcError> {
    connect(server, token, tls)?.run_info()
}

fn registration() -> Registration {
    Registration {
        run_id: "run-1".into(),
        observation_space: Space::Discrete { n: 2, start: 0 },
        action_space: Space::Discrete { n: 2, start: 0 },
        n_envs: 1,
        actor_index: Some(0),
        host: "test".into(),
        pid: 1,
    }
}

#[test]
fn good_certificates_carry_calls_and_the_token_is_still_required() {
    let pki = Pki::new("good");
    let ca = pki.ca("ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], false);
    let rt = runtime();
    let server_tls = ServerTls::from_files(&cert, &key, None).unwrap();
    assert!(!server_tls.requires_client_certificates());
    let server = start(&rt, Some(&server_tls));
    let client_tls = ClientTls::from_files(&pki.path("ca.pem"), None).unwrap();

    let mut client = connect(&server, TOKEN, Some(&client_tls)).unwrap();
    assert_eq!(client.run_info().unwrap().run_id, "run-1");
    assert_eq!(client.register(&registration()).unwrap().actor_id, 7);
    assert_eq!(client.params(7, Some(1)).unwrap(), None);

    let wrong = call(&server, "not-the-token", Some(&client_tls)).unwrap_err();
    assert_eq!(wrong.code, Code::Unauthenticated, "{wrong}");
    assert!(wrong.message.contains("token"), "{wrong}");

    // A learner reached by an address its certificate does not name, with the name given explicitly.
    let (named, named_key) = pki.leaf("named", &ca, &["learner.example"], false);
    let named_server = start(&rt, Some(&ServerTls::from_files(&named, &named_key, None).unwrap()));
    let mismatch = call(&named_server, TOKEN, Some(&client_tls)).unwrap_err();
    assert!(mismatch.message.contains("certificate"), "{mismatch}");
    let by_name = client_tls.clone().with_domain("learner.example");
    assert_eq!(call(&named_server, TOKEN, Some(&by_name)).unwrap().run_id, "run-1");
}

#[test]
fn a_client_trusting_another_ca_is_refused_naming_the_certificate() {
    let pki = Pki::new("wrong-ca");
    let ca = pki.ca("ca");
    pki.ca("other");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], false);
    let rt = runtime();
    let server = start(&rt, Some(&ServerTls::from_files(&cert, &key, None).unwrap()));
    let other = ClientTls::from_files(&pki.path("other.pem"), None).unwrap();
    let e = call(&server, TOKEN, Some(&other)).unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains("certificate"), "{e}");
    assert!(!e.is_transient(), "{e}");
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let pki = Pki::new("expired");
    let ca = pki.ca("ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], true);
    let rt = runtime();
    let server = start(&rt, Some(&ServerTls::from_files(&cert, &key, None).unwrap()));
    let client_tls = ClientTls::from_files(&pki.path("ca.pem"), None).unwrap();
    let e = call(&server, TOKEN, Some(&client_tls)).unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains("certificate") && e.message.contains("expired"), "{e}");
}

#[test]
fn a_plaintext_client_fails_and_the_server_keeps_serving_tls_clients() {
    let pki = Pki::new("plaintext");
    let ca = pki.ca("ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], false);
    let rt = runtime();
    let server = start(&rt, Some(&ServerTls::from_files(&cert, &key, None).unwrap()));
    let client_tls = ClientTls::from_files(&pki.path("ca.pem"), None).unwrap();
    let mut good = connect(&server, TOKEN, Some(&client_tls)).unwrap();
    for _ in 0..3 {
        let e = call(&server, TOKEN, None).unwrap_err();
        assert_ne!(e.code, Code::InvalidArgument, "{e}");
        assert_eq!(good.run_info().unwrap().run_id, "run-1");
        assert_eq!(call(&server, TOKEN, Some(&client_tls)).unwrap().run_id, "run-1");
    }
    // And the other way round: a TLS client against a plaintext server.
    let plain = serve(rt.handle(), Arc::new(Echo), "127.0.0.1:0".parse().unwrap(), TOKEN, &Limits::default()).unwrap();
    let e = call(&plain, TOKEN, Some(&client_tls)).unwrap_err();
    assert!(!e.is_transient(), "{e}");
}

#[test]
fn mutual_tls_serves_only_clients_with_a_certificate_the_client_ca_signed() {
    let pki = Pki::new("mutual");
    let ca = pki.ca("ca");
    let client_ca = pki.ca("client-ca");
    let stranger_ca = pki.ca("stranger-ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], false);
    let (actor_cert, actor_key) = pki.leaf("actor", &client_ca, &["actor-0"], false);
    let (stranger_cert, stranger_key) = pki.leaf("stranger", &stranger_ca, &["actor-9"], false);
    let rt = runtime();
    let server_tls = ServerTls::from_files(&cert, &key, Some(&pki.path("client-ca.pem"))).unwrap();
    assert!(server_tls.requires_client_certificates());
    let server = start(&rt, Some(&server_tls));
    let ca_path = pki.path("ca.pem");

    let anonymous = ClientTls::from_files(&ca_path, None).unwrap();
    let e = call(&server, TOKEN, Some(&anonymous)).unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");

    let stranger = ClientTls::from_files(&ca_path, Some((&stranger_cert, &stranger_key))).unwrap();
    let e = call(&server, TOKEN, Some(&stranger)).unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");

    let actor = ClientTls::from_files(&ca_path, Some((&actor_cert, &actor_key))).unwrap();
    let mut client = connect(&server, TOKEN, Some(&actor)).unwrap();
    assert_eq!(client.run_info().unwrap().run_id, "run-1");
    assert_eq!(client.register(&registration()).unwrap().actor_id, 7);
    // A certificate does not replace the token.
    let e = call(&server, "not-the-token", Some(&actor)).unwrap_err();
    assert!(e.message.contains("token"), "{e}");
}

fn message(e: RpcError) -> String {
    e.message
}

fn contains(text: &str, path: &Path) -> bool {
    text.contains(&path.display().to_string())
}

#[test]
fn missing_non_pem_and_mismatched_files_are_named() {
    let pki = Pki::new("files");
    let ca = pki.ca("ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost"], false);
    let (_, other_key) = pki.leaf("other", &ca, &["localhost"], false);
    let missing = pki.path("nowhere.pem");
    let garbage = pki.path("garbage.pem");
    std::fs::write(&garbage, "this is not a certificate\n").unwrap();

    let e = message(ServerTls::from_files(&missing, &key, None).unwrap_err());
    assert!(contains(&e, &missing) && e.contains("cannot read"), "{e}");
    let e = message(ServerTls::from_files(&cert, &missing, None).unwrap_err());
    assert!(contains(&e, &missing), "{e}");
    let e = message(ServerTls::from_files(&garbage, &key, None).unwrap_err());
    assert!(contains(&e, &garbage) && e.contains("PEM"), "{e}");
    // A certificate where the key should be: no private key in it.
    let e = message(ServerTls::from_files(&cert, &cert, None).unwrap_err());
    assert!(contains(&e, &cert) && e.contains("private key"), "{e}");
    let e = message(ServerTls::from_files(&cert, &key, Some(&garbage)).unwrap_err());
    assert!(contains(&e, &garbage) && e.contains("client CA"), "{e}");
    let e = message(ServerTls::from_files(&cert, &other_key, None).unwrap_err());
    assert!(contains(&e, &other_key) && contains(&e, &cert) && e.contains("match"), "{e}");

    let e = message(ClientTls::from_files(&garbage, None).unwrap_err());
    assert!(contains(&e, &garbage), "{e}");
    let e = message(ClientTls::from_files(&pki.path("ca.pem"), Some((&cert, &other_key))).unwrap_err());
    assert!(contains(&e, &other_key) && e.contains("match"), "{e}");
}

/// A TCP connection that never starts its TLS handshake is closed after `auth_timeout` (it never made a call
/// with the run token), and the server goes on serving TLS clients.
#[test]
fn a_tls_handshake_that_never_comes_is_closed_after_the_auth_timeout() {
    use std::io::Read;
    let pki = Pki::new("auth-timeout");
    let ca = pki.ca("ca");
    let (cert, key) = pki.leaf("learner", &ca, &["localhost", "127.0.0.1"], false);
    let limits = Limits { auth_timeout: Duration::from_millis(400), ..Limits::default() };
    let rt = runtime();
    let server = start_with(&rt, Some(&ServerTls::from_files(&cert, &key, None).unwrap()), &limits);
    let mut silent = std::net::TcpStream::connect(server.local_addr).unwrap();
    silent.set_read_timeout(Some(TIMEOUT)).unwrap();
    silent.read_to_end(&mut Vec::new()).expect("closed, not timed out");
    assert_eq!(server.closed_unauthenticated(), 1);
    let client_tls = ClientTls::from_files(&pki.path("ca.pem"), None).unwrap();
    assert_eq!(call(&server, TOKEN, Some(&client_tls)).unwrap().run_id, "run-1");
}
