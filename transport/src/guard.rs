//! What a connection costs its sender: the server keeps each accepted TCP connection's standing
//! ([`Standing`]) and closes the connection when its calls are refused
//! [`crate::grpc::Limits::max_refused_in_a_row`] times in a row — refused by the transport (bytes that do not
//! decode as the message, unknown dtypes, another protocol version, a wrong token, an unknown method) or by the
//! service (the learner's hub) alike — or when it has made no call with the run token within
//! [`crate::grpc::Limits::auth_timeout`] of being accepted (under TLS, the handshake counts against that time
//! too). The server goes on serving every other connection; a real actor whose connection was closed reconnects
//! on its next call.
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;
use tower::{Layer, Service};
use tracing::warn;

/// How long a connection that reached its refusal limit stays open: long enough for the answer to the last
/// refused call to leave, so its sender reads why.
const CLOSE_AFTER_ANSWER: Duration = Duration::from_millis(100);

/// gRPC status codes that mean the caller sent something wrong: InvalidArgument, PermissionDenied,
/// ResourceExhausted (a message too large once decompressed), OutOfRange (a message over the size limit),
/// Unimplemented (no such method), Internal (tonic's answer to bytes that do not decode) and Unauthenticated.
const REFUSALS: [i32; 7] = [3, 7, 8, 11, 12, 13, 16];

/// Connections the server closed, by cause (read by [`crate::grpc::ServerHandle`]).
#[derive(Debug, Default)]
pub(crate) struct Closed {
    /// For refusals in a row.
    pub(crate) refused: AtomicU64,
    /// For making no authenticated call in time.
    pub(crate) unauthenticated: AtomicU64,
}

/// One accepted connection's standing.
#[derive(Debug)]
pub(crate) struct Standing {
    peer: String,
    /// A call on it passed the server's token check ([`Guard::authenticated`]).
    authenticated: AtomicBool,
    refused_in_a_row: AtomicU32,
    closed: AtomicBool,
    /// The connection's reader, woken to find the connection closed.
    reader: Mutex<Option<Waker>>,
}

impl Standing {
    /// Close the connection: its reads end (the HTTP/2 server then drops it) and its writes fail.
    fn close(&self, why: &str) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            warn!("closed the connection from {}: {why}", self.peer);
            if let Some(w) = self.reader.lock().expect("reader waker").take() {
                w.wake();
            }
        }
    }

    /// A call on this connection was answered: refused (`code`, one of [`REFUSALS`]) or accepted (`None` for
    /// an accepted chunk or gradient: that ends a run of refusals, as the hub's accepted messages do).
    fn answered(self: &Arc<Self>, refused: Option<i32>, limit: u32, closed: &Arc<Closed>) {
        let Some(code) = refused else {
            self.refused_in_a_row.store(0, Ordering::Relaxed);
            return;
        };
        let n = self.refused_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if limit > 0 && n == limit {
            closed.refused.fetch_add(1, Ordering::Relaxed);
            let (me, why) = (self.clone(), format!("{n} calls in a row refused, the last with gRPC status {code}"));
            tokio::spawn(async move {
                tokio::time::sleep(CLOSE_AFTER_ANSWER).await;
                me.close(&why);
            });
        }
    }
}

/// What the server knows of a guarded connection in each of its requests (tonic's connect info).
#[derive(Debug, Clone)]
pub(crate) struct Guard(Arc<Standing>);

impl Guard {
    /// The peer's address, for logs.
    pub(crate) fn peer(&self) -> &str {
        &self.0.peer
    }

    /// A call on this connection presented the run token (the server's admission check passed): the
    /// connection is no longer closed for [`crate::grpc::Limits::auth_timeout`].
    pub(crate) fn authenticated(&self) {
        self.0.authenticated.store(true, Ordering::SeqCst);
    }
}

/// An accepted TCP connection its [`Standing`] can close.
#[derive(Debug)]
pub(crate) struct GuardedStream {
    io: TcpStream,
    standing: Arc<Standing>,
}

impl Connected for GuardedStream {
    type ConnectInfo = Guard;

    fn connect_info(&self) -> Guard {
        Guard(self.standing.clone())
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let s = &this.standing;
        {
            let mut reader = s.reader.lock().expect("reader waker");
            if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *reader = Some(cx.waker().clone());
            }
        }
        // Checked after the waker is stored, so a close between the two still wakes this reader.
        if s.closed.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(())); // end of stream
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.standing.closed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The listener's connections, each guarded (`TCP_NODELAY` on) and given `timeout`
/// ([`crate::grpc::Limits::auth_timeout`]) to make a call with the run token.
pub(crate) fn incoming(
    listener: TcpListener,
    timeout: Duration,
    closed: Arc<Closed>,
) -> impl Stream<Item = io::Result<GuardedStream>> + Send + 'static {
    TcpListenerStream::new(listener).map(move |accepted| {
        let io = accepted?;
        io.set_nodelay(true)?;
        let peer = io.peer_addr().map_or_else(|_| "an unknown peer".to_string(), |a: SocketAddr| a.to_string());
        let standing = Arc::new(Standing {
            peer,
            authenticated: AtomicBool::new(false),
            refused_in_a_row: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            reader: Mutex::new(None),
        });
        let (weak, closed) = (Arc::downgrade(&standing), closed.clone());
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(s) = weak.upgrade()
                && !s.authenticated.load(Ordering::SeqCst)
                && !s.closed.load(Ordering::SeqCst)
            {
                closed.unauthenticated.fetch_add(1, Ordering::Relaxed);
                s.close(&format!("no call with the run token within {timeout:?} of connecting"));
            }
        });
        Ok(GuardedStream { io, standing })
    })
}

/// The layer that keeps each connection's standing from its calls' answers.
#[derive(Debug, Clone)]
pub(crate) struct StandingLayer {
    pub(crate) limit: u32,
    pub(crate) closed: Arc<Closed>,
}

impl<S> Layer<S> for StandingLayer {
    type Service = Standings<S>;

    fn layer(&self, inner: S) -> Standings<S> {
        Standings { inner, layer: self.clone() }
    }
}

/// [`StandingLayer`]'s service.
#[derive(Debug, Clone)]
pub(crate) struct Standings<S> {
    inner: S,
    layer: StandingLayer,
}

impl<S, B, R> Service<http::Request<B>> for Standings<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let standing = req.extensions().get::<Guard>().map(|g| g.0.clone());
        // Accepted data ends a run of refusals; other calls answered OK (run info, parameters) do not.
        let path = req.uri().path();
        let data = path.ends_with("/SendChunk") || path.ends_with("/SendGradient");
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limit, closed) = (self.layer.limit, self.layer.closed.clone());
        Box::pin(async move {
            let response = inner.call(req).await?;
            if let Some(s) = standing {
                // An error answer carries its status in the headers (trailers-only); a call answered OK, in
                // the trailers.
                let status = response.headers().get("grpc-status").and_then(|v| v.to_str().ok()?.parse().ok());
                match status {
                    Some(code) if REFUSALS.contains(&code) => s.answered(Some(code), limit, &closed),
                    None | Some(0) if data => s.answered(None, limit, &closed),
                    _ => {}
                }
            }
            Ok(response)
        })
    }
}
