//! The gRPC carrier: [`serve`] puts a [`LearnerService`] on a TCP address; [`GrpcClient`] calls it.
//!
//! Tuned for many small-to-medium messages on loopback or a LAN: `TCP_NODELAY` on both ends (without it a
//! 64 KiB ping-pong takes 40 ms), 4 MiB HTTP/2 stream and connection windows, and a configurable message
//! size limit in both directions (parameters of a large network are one message). [`serve_with`] and
//! [`GrpcClient::connect_with`] add TLS ([`crate::tls`]); [`serve`] and [`GrpcClient::connect`] are plaintext.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::PROTOCOL_VERSION;
use crate::codec;
use crate::error::{Code, RpcError};
use crate::guard;
use crate::proto;
use crate::proto::learner_client::LearnerClient as ProtoClient;
use crate::proto::learner_server::{Learner as ProtoLearner, LearnerServer};
use crate::service::{Ack, LearnerClient, LearnerService, MessageKey, Registered, Registration, RunInfo, check_token};
use crate::tls::{ClientTls, ServerTls, error_chain};

/// HTTP/2 flow-control windows: 4 MiB gave ~340 MiB/s per stream for 64 KiB messages on loopback (measured on
/// the 2-core development VM; the default 64 KiB windows throttle large chunks and parameter broadcasts).
const WINDOW: u32 = 4 << 20;
/// How often an actor pings the learner's HTTP/2 connection, and how long it waits for the answer.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Limits of a gRPC server or client.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Server: a connection whose calls are refused this many times in a row — by the transport (bytes that
    /// do not decode, unknown dtypes, another protocol version, a wrong token) or by the service — is closed
    /// (an accepted chunk or gradient ends the run); 0: never.
    pub max_refused_in_a_row: u32,
    /// Server: a connection that has made no call with the run token this long after it was accepted is
    /// closed.
    pub auth_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_message_bytes: 64 << 20, max_refused_in_a_row: 20, auth_timeout: Duration::from_secs(10) }
    }
}

/// A running server; dropping it (or [`ServerHandle::shutdown`]) stops it.
pub struct ServerHandle {
    /// The address it listens on (the real port when bound to port 0).
    pub local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    closed: Arc<guard::Closed>,
}

impl ServerHandle {
    /// Connections closed so far for [`Limits::max_refused_in_a_row`] refusals in a row.
    pub fn closed_for_refusals(&self) -> u64 {
        self.closed.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Connections closed so far for making no call with the run token within [`Limits::auth_timeout`].
    pub fn closed_unauthenticated(&self) -> u64 {
        self.closed.unauthenticated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stop accepting calls.
    pub fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serve `service` on `addr` (port 0 picks a free one) from `runtime`, in plaintext. Every call must carry
/// `token`.
pub fn serve<S: LearnerService>(
    runtime: &tokio::runtime::Handle,
    service: Arc<S>,
    addr: SocketAddr,
    token: &str,
    limits: &Limits,
) -> Result<ServerHandle, RpcError> {
    serve_with(runtime, service, addr, token, limits, None)
}

/// [`serve`], over TLS when `tls` is given: every connection must complete a TLS handshake with the learner's
/// certificate (and, under mutual TLS, present a client certificate the client CA signed) before any call; a
/// client that fails the handshake is dropped and the server goes on serving the others.
pub fn serve_with<S: LearnerService>(
    runtime: &tokio::runtime::Handle,
    service: Arc<S>,
    addr: SocketAddr,
    token: &str,
    limits: &Limits,
    tls: Option<&ServerTls>,
) -> Result<ServerHandle, RpcError> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| RpcError::new(Code::Unavailable, format!("cannot listen on {addr}: {e}")))?;
    let local_addr = listener.local_addr().map_err(|e| RpcError::new(Code::Internal, e.to_string()))?;
    listener.set_nonblocking(true).map_err(|e| RpcError::new(Code::Internal, e.to_string()))?;
    let _enter = runtime.enter();
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| RpcError::new(Code::Internal, e.to_string()))?;
    let closed = Arc::new(guard::Closed::default());
    let incoming = guard::incoming(listener, limits.auth_timeout, closed.clone());
    let standing = guard::StandingLayer { limit: limits.max_refused_in_a_row, closed: closed.clone() };
    let adapter = Adapter { inner: service, token: Arc::from(token), encoded: std::sync::Mutex::new(None) };
    let svc = LearnerServer::new(adapter)
        .max_decoding_message_size(limits.max_message_bytes)
        .max_encoding_message_size(limits.max_message_bytes);
    let (stop, stopped) = oneshot::channel::<()>();
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls.config())
            .map_err(|e| RpcError::invalid(format!("TLS configuration: {}", error_chain(&e))))?;
    }
    let server = builder
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .layer(standing)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    runtime.spawn(async move {
        if let Err(e) = server.await {
            warn!("gRPC server stopped: {e}");
        }
    });
    Ok(ServerHandle { local_addr, stop: Some(stop), closed })
}

struct Adapter<S> {
    inner: Arc<S>,
    token: Arc<str>,
    /// The newest parameters, encoded once and shared by every reply (a broadcast to N actors encodes once).
    encoded: std::sync::Mutex<Option<(u64, proto::Tensor)>>,
}

impl<S> Adapter<S> {
    /// Token first (a failure is logged with the peer; a success authenticates the connection), then the
    /// protocol version.
    fn admit<T>(&self, req: &Request<T>, rpc: &str, protocol_version: u32) -> Result<(), Status> {
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v));
        let guard = req.extensions().get::<guard::Guard>();
        if let Err(e) = check_token(&self.token, given) {
            warn!("refused {rpc} from {}: {}", guard.map_or("an unknown peer", |g| g.peer()), e.message);
            return Err(e.into());
        }
        // The token is the connection's authentication (its auth timeout ends here).
        if let Some(g) = guard {
            g.authenticated();
        }
        if protocol_version != PROTOCOL_VERSION {
            return Err(RpcError::invalid(format!(
                "{rpc}: protocol version {protocol_version}, this learner speaks version {PROTOCOL_VERSION}"
            ))
            .into());
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl<S: LearnerService> ProtoLearner for Adapter<S> {
    async fn get_run_info(&self, req: Request<proto::RunInfoRequest>) -> Result<Response<proto::RunInfo>, Status> {
        self.admit(&req, "GetRunInfo", req.get_ref().protocol_version)?;
        Ok(Response::new(codec::run_info_to_proto(&self.inner.run_info(), PROTOCOL_VERSION)))
    }

    async fn register(&self, req: Request<proto::Registration>) -> Result<Response<proto::Registered>, Status> {
        self.admit(&req, "Register", req.get_ref().protocol_version)?;
        let r = codec::registration_from_proto(req.get_ref())?;
        Ok(Response::new(codec::registered_to_proto(&self.inner.register(r)?)))
    }

    async fn send_chunk(&self, req: Request<proto::Chunk>) -> Result<Response<proto::Ack>, Status> {
        self.admit(&req, "SendChunk", req.get_ref().protocol_version)?;
        let (chunk, key) = codec::chunk_from_proto(req.get_ref()).inspect_err(|e| {
            warn!("refused a chunk from actor {}: {}", req.get_ref().actor_id, e.message);
        })?;
        Ok(Response::new(codec::ack_to_proto(self.inner.ingest(chunk, key).await?)))
    }

    async fn send_gradient(&self, req: Request<proto::Gradient>) -> Result<Response<proto::Ack>, Status> {
        self.admit(&req, "SendGradient", req.get_ref().protocol_version)?;
        let (g, key) = codec::gradient_from_proto(req.get_ref())?;
        Ok(Response::new(codec::ack_to_proto(self.inner.gradient(g, key).await?)))
    }

    async fn get_params(&self, req: Request<proto::ParamsRequest>) -> Result<Response<proto::ParamsReply>, Status> {
        self.admit(&req, "GetParams", req.get_ref().protocol_version)?;
        let r = req.get_ref();
        let Some(p) = self.inner.params(r.actor_id, r.have_version)? else {
            return Ok(Response::new(codec::params_to_proto(None)));
        };
        let mut cache = self.encoded.lock().expect("params cache");
        let tensor = match cache.as_ref() {
            Some((version, t)) if *version == p.version => t.clone(),
            _ => {
                let t = codec::f32_tensor(&p.value, vec![p.value.len() as u64]);
                *cache = Some((p.version, t.clone()));
                t
            }
        };
        drop(cache);
        Ok(Response::new(proto::ParamsReply { modified: true, version: p.version, values: Some(tensor) }))
    }
}

/// A blocking gRPC client for one actor thread (it owns a single-threaded tokio runtime for its IO).
pub struct GrpcClient {
    runtime: tokio::runtime::Runtime,
    inner: ProtoClient<Channel>,
    auth: MetadataValue<tonic::metadata::Ascii>,
    /// Over TLS, no call has been answered yet on this connection (see [`GrpcClient::answered`]).
    unproven_tls: bool,
}

impl GrpcClient {
    /// Connect to `addr` (`HOST:PORT` or `http://HOST:PORT`) in plaintext, waiting at most `timeout`.
    pub fn connect(addr: &str, token: &str, limits: &Limits, timeout: Duration) -> Result<Self, RpcError> {
        Self::connect_with(addr, token, limits, timeout, None)
    }

    /// [`GrpcClient::connect`], over TLS when `tls` is given (the learner's certificate is checked against
    /// its CA and the host in `addr`, or [`ClientTls::with_domain`]). A certificate the client cannot verify is
    /// [`Code::Unauthenticated`], not worth retrying; a learner that cannot be reached is [`Code::Unavailable`].
    pub fn connect_with(
        addr: &str,
        token: &str,
        limits: &Limits,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, RpcError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RpcError::new(Code::Internal, format!("tokio runtime: {e}")))?;
        // tonic speaks TLS to `https://` addresses only.
        let host = addr.split_once("://").map_or(addr, |(_, rest)| rest);
        let uri = format!("{}://{host}", if tls.is_some() { "https" } else { "http" });
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| RpcError::invalid(format!("learner address {addr:?}: {e}")))?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            // HTTP/2 pings find a connection whose other end is gone (a learner host that rebooted, a NAT that
            // forgot the flow) in 30 s instead of TCP's ~15 minutes; calls then fail and the actor reconnects.
            // A learner that is merely busy (a long update, a synchronous ack) still answers pings.
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(WINDOW);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.config())
                .map_err(|e| RpcError::invalid(format!("TLS configuration: {}", error_chain(&e))))?;
        }
        let channel = runtime.block_on(endpoint.connect()).map_err(|e| {
            let why = error_chain(&e);
            let code = if tls_refusal(&why) { Code::Unauthenticated } else { Code::Unavailable };
            RpcError::new(code, format!("cannot connect to the learner at {addr}: {why}"))
        })?;
        let inner = ProtoClient::new(channel)
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes);
        let auth =
            format!("Bearer {token}").parse().map_err(|_| RpcError::invalid("the token must be printable ASCII"))?;
        Ok(GrpcClient { runtime, inner, auth, unproven_tls: tls.is_some() })
    }

    /// A call's outcome. Under TLS 1.3 a learner that refuses this client's certificate (mutual TLS) does so
    /// after the client's side of the handshake is done, by closing the connection: the first call on it then
    /// fails, sometimes with the TLS alert and sometimes with nothing but "connection closed" or a reset,
    /// depending on timing. Either is taken as the refusal it almost always is
    /// ([`Code::Unauthenticated`], not retried); later, a closed connection means the learner went away.
    fn answered<T>(&mut self, reply: Result<Response<T>, Status>) -> Result<Response<T>, RpcError> {
        match reply {
            Ok(reply) => {
                self.unproven_tls = false;
                Ok(reply)
            }
            // A status the learner sent has no source; one made here, because the connection failed, has.
            Err(status) if self.unproven_tls && std::error::Error::source(&status).is_some() => {
                let why = status_chain(&status);
                let e = call_error(status);
                if e.code == Code::Unauthenticated {
                    return Err(e);
                }
                Err(RpcError::new(
                    Code::Unauthenticated,
                    format!(
                        "the learner closed the TLS connection before answering the first call ({why}): it refused \
                         this client's certificate (mutual TLS needs one its client CA signed: --tls-cert, \
                         --tls-key), or it stopped"
                    ),
                ))
            }
            Err(status) => Err(call_error(status)),
        }
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        req.metadata_mut().insert("authorization", self.auth.clone());
        req
    }
}

impl LearnerClient for GrpcClient {
    fn run_info(&mut self) -> Result<RunInfo, RpcError> {
        let req = self.request(proto::RunInfoRequest { protocol_version: PROTOCOL_VERSION });
        let reply = self.runtime.block_on(self.inner.get_run_info(req));
        let reply = self.answered(reply)?;
        Ok(codec::run_info_from_proto(reply.get_ref()))
    }

    fn register(&mut self, registration: &Registration) -> Result<Registered, RpcError> {
        let req = self.request(codec::registration_to_proto(registration, PROTOCOL_VERSION)?);
        let reply = self.runtime.block_on(self.inner.register(req));
        let reply = self.answered(reply)?;
        Ok(codec::registered_from_proto(reply.get_ref()))
    }

    fn send_chunk(&mut self, chunk: &flotilla_core::Chunk, key: MessageKey) -> Result<Ack, RpcError> {
        let req = self.request(codec::chunk_to_proto(chunk, PROTOCOL_VERSION, key));
        let reply = self.runtime.block_on(self.inner.send_chunk(req));
        let reply = self.answered(reply)?;
        Ok(codec::ack_from_proto(reply.get_ref()))
    }

    fn send_gradient(&mut self, gradient: &flotilla_core::Gradient, key: MessageKey) -> Result<Ack, RpcError> {
        let req = self.request(codec::gradient_to_proto(gradient, PROTOCOL_VERSION, key));
        let reply = self.runtime.block_on(self.inner.send_gradient(req));
        let reply = self.answered(reply)?;
        Ok(codec::ack_from_proto(reply.get_ref()))
    }

    fn params(&mut self, actor_id: u64, have: Option<u64>) -> Result<Option<flotilla_core::Params>, RpcError> {
        let req =
            self.request(proto::ParamsRequest { protocol_version: PROTOCOL_VERSION, actor_id, have_version: have });
        let reply = self.runtime.block_on(self.inner.get_params(req));
        let reply = self.answered(reply)?;
        codec::params_from_proto(reply.get_ref())
    }
}

/// Whether a connection error is a TLS failure that retrying will not cure (an untrusted, expired or
/// misnamed certificate, a refused client certificate, a peer that does not speak TLS), as rustls words them.
fn tls_refusal(why: &str) -> bool {
    ["certificate", "CertificateRequired", "InvalidContentType", "corrupt message", "HandshakeFailure", "alert"]
        .iter()
        .any(|needle| why.contains(needle))
}

/// A failed call as an [`RpcError`], with the reasons beneath tonic's status message (a TLS alert from a
/// learner that refused this client's certificate ends the call as [`Code::Unauthenticated`]).
fn call_error(status: Status) -> RpcError {
    let chained = status_chain(&status);
    let mut e = RpcError::from(status);
    if chained.len() > e.message.len() && tls_refusal(&chained) {
        e = RpcError::new(Code::Unauthenticated, format!("TLS: {chained}"));
    }
    e
}

/// A status's message and the reasons beneath it (tonic's `Display` of a status prints its source's `Debug`).
fn status_chain(status: &Status) -> String {
    let message = status.message();
    match std::error::Error::source(status).map(error_chain) {
        Some(chain) if chain.starts_with(message) => chain,
        Some(chain) => format!("{message}: {chain}"),
        None => message.to_string(),
    }
}

/// A raw chunk request with any protocol version and token, for tests of the server's checks.
pub fn send_raw_chunk(client: &mut GrpcClient, chunk: proto::Chunk, token: Option<&str>) -> Result<Ack, RpcError> {
    let mut req = Request::new(chunk);
    if let Some(t) = token {
        let v = format!("Bearer {t}").parse().map_err(|_| RpcError::invalid("token not ASCII"))?;
        req.metadata_mut().insert("authorization", v);
    }
    let reply = client.runtime.block_on(client.inner.send_chunk(req)).map_err(call_error)?;
    Ok(codec::ack_from_proto(reply.get_ref()))
}

/// How long a caller should wait before reconnect attempt `attempt` (0-based): 100 ms doubling to `max`.
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempt.min(16))).min(max)
}
