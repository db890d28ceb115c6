//! The hub that the gRPC benchmarks (ingest and broadcast) drive: an on-policy CartPole [`Hub`] built in this
//! process, served over loopback gRPC on an IO runtime shaped like the distributed learner's, and the client
//! side (registration, gRPC connections).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::{ChunkSpec, DType, Space};
use flotilla_envs::Kwargs;
use flotilla_learner::config::Family;
use flotilla_learner::hub::{Delivery, Hub, HubSpec};
use flotilla_transport::grpc::{GrpcClient, Limits, ServerHandle, serve_with};
use flotilla_transport::tls::{ClientTls, ServerTls};
use flotilla_transport::{LearnerClient, Registration, RunInfo};
use tokio::sync::mpsc::Receiver;

use crate::BenchResult;

pub(crate) const TOKEN: &str = "bench-token";
const RUN_ID: &str = "bench-distributed";
/// CartPole chunk shape for the ingest table.
pub(crate) const ENVS: usize = 8;
pub(crate) const STEPS: usize = 128;
pub(crate) const OBS_DIM: usize = 4;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's IO runtime, shaped like the distributed learner's (two workers).
pub(crate) fn io_runtime() -> BenchResult<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-io").enable_all().build()?)
}

fn cartpole_spaces() -> BenchResult<(Space, Space)> {
    let env = flotilla_envs::make("CartPole-v1", &Kwargs::default())?;
    Ok((env.observation_space().clone(), env.action_space().clone()))
}

/// An on-policy CartPole hub for `n_actors` actors with `params` as version 0.
pub(crate) fn cartpole_hub(n_actors: usize, params: Vec<f32>) -> BenchResult<(Arc<Hub>, Receiver<Delivery>)> {
    let (observation_space, action_space) = cartpole_spaces()?;
    let spec = HubSpec {
        run: RunInfo { run_id: RUN_ID.into(), config_toml: String::new() },
        chunk: ChunkSpec {
            observation_space,
            action_space,
            obs_dim: OBS_DIM,
            obs_dtype: DType::F32,
            act_dim: 1,
            n_envs: ENVS,
            n_steps: STEPS,
            needs_behaviour: true,
            n_tasks: 0,
            state_dim: 0,
            state_bounded: 0,
        },
        family: Family::OnPolicy,
        n_actors,
        seed: 0,
        n_params: params.len(),
        queue: 64,
        synchronous: false,
        max_refused_in_a_row: 20,
        total_env_steps: u64::MAX,
    };
    Ok(Hub::new(spec, params))
}

/// Register `client` in slot `index`; returns its actor id.
pub(crate) fn register(client: &mut dyn LearnerClient, index: usize) -> BenchResult<u64> {
    let (observation_space, action_space) = cartpole_spaces()?;
    let registration = Registration {
        run_id: RUN_ID.into(),
        observation_space,
        action_space,
        n_envs: ENVS,
        actor_index: Some(index as u32),
        host: "localhost".into(),
        pid: std::process::id(),
    };
    Ok(client.register(&registration)?.actor_id)
}

/// Opens one client connection (called on the client's own thread).
pub(crate) type Connect<'a> = &'a (dyn Fn() -> BenchResult<Box<dyn LearnerClient>> + Sync);

/// gRPC connections to `addr`, over TLS when `tls` is given.
pub(crate) fn grpc_connector(
    addr: SocketAddr,
    limits: Limits,
    tls: Option<&BenchTls>,
) -> impl Fn() -> BenchResult<Box<dyn LearnerClient>> + Sync {
    let addr = addr.to_string();
    let tls = tls.map(|t| t.client.clone());
    move || {
        let client = GrpcClient::connect_with(&addr, TOKEN, &limits, CONNECT_TIMEOUT, tls.as_ref())?;
        Ok(Box::new(client) as Box<dyn LearnerClient>)
    }
}

/// `hub` served on a loopback port, over TLS when `tls` is given.
pub(crate) fn serve_grpc(
    runtime: &tokio::runtime::Runtime,
    hub: &Arc<Hub>,
    limits: &Limits,
    tls: Option<&BenchTls>,
) -> BenchResult<ServerHandle> {
    let addr: SocketAddr = "127.0.0.1:0".parse()?;
    Ok(serve_with(runtime.handle(), hub.clone(), addr, TOKEN, limits, tls.map(|t| &t.server))?)
}

/// TLS for the loopback server of the TLS rows: a CA made here and a certificate for 127.0.0.1 it signed.
pub(crate) struct BenchTls {
    server: ServerTls,
    client: ClientTls,
}

impl BenchTls {
    pub(crate) fn new() -> BenchResult<BenchTls> {
        let dir = std::env::temp_dir().join(format!("flotilla-bench-tls-{}", std::process::id()));
        let files = TlsFiles::write(&dir)?;
        let server = ServerTls::from_files(&files.cert, &files.key, None)?;
        let client = ClientTls::from_files(&files.ca, None)?;
        std::fs::remove_dir_all(&dir)?;
        Ok(BenchTls { server, client })
    }
}

/// A CA made here (`ca.pem`) and a certificate for 127.0.0.1 it signed (`learner.pem`, `learner.key`), as files.
pub(crate) struct TlsFiles {
    pub(crate) ca: std::path::PathBuf,
    pub(crate) cert: std::path::PathBuf,
    pub(crate) key: std::path::PathBuf,
}

impl TlsFiles {
    /// Write them into `dir` (created).
    pub(crate) fn write(dir: &std::path::Path) -> BenchResult<TlsFiles> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        std::fs::create_dir_all(dir)?;
        let files = TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("learner.pem"), key: dir.join("learner.key") };
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "flotilla bench CA");
        std::fs::write(&files.ca, ca.self_signed(&ca_key)?.pem())?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
        std::fs::write(&files.cert, cert.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }
}
