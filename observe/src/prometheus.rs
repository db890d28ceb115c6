//! The learner's Prometheus endpoint: `GET /metrics` in the OpenMetrics text format, served on its own thread.
//!
//! [`LearnerMetrics`] holds what is counted live — chunks and transitions taken in, refused messages, actors
//! connected, the ingest queue's depth, update durations — and, from each metrics row the learner logs, every
//! row value as `flotilla_run_metric{name="…"}` (the metrics.csv column names: `charts/policy_lag`,
//! `eval/mean_return`, `losses/…`) plus the latest evaluation as `flotilla_eval_mean_return{task="…"}`.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::{Error, Result};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A learner's metrics, shared between the code that counts and the endpoint that serves them.
#[derive(Debug)]
pub struct LearnerMetrics {
    registry: Registry,
    /// Chunks accepted from actors.
    pub chunks: Counter,
    /// Env steps (transitions, all envs) in accepted chunks.
    pub transitions: Counter,
    /// Gradients accepted from A3C actors.
    pub gradients: Counter,
    /// Messages refused (malformed, from unknown actors, values outside the spaces).
    pub refused: Counter,
    /// Messages that arrived again with an idempotency key already taken (a resend after a lost answer):
    /// answered as delivered, not taken twice.
    pub duplicates: Counter,
    /// Actors registered now.
    pub actors: Gauge,
    /// Deliveries waiting in the ingest queue.
    pub queue_depth: Gauge,
    /// The newest published parameter version.
    pub policy_version: Gauge,
    /// Env steps the learner has counted.
    pub env_steps: Gauge,
    /// Seconds per update (forward, backward, optimiser step, and any all-reduce in it).
    pub update_seconds: Histogram,
    row: Family<Labels, FloatGauge>,
    eval: Family<Labels, FloatGauge>,
    actor_refused: Family<Labels, Counter>,
}

impl LearnerMetrics {
    /// Fresh metrics, every one registered (they are all exposed, zero until counted).
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("flotilla");
        let m = LearnerMetrics {
            chunks: Counter::default(),
            transitions: Counter::default(),
            gradients: Counter::default(),
            refused: Counter::default(),
            duplicates: Counter::default(),
            actors: Gauge::default(),
            queue_depth: Gauge::default(),
            policy_version: Gauge::default(),
            env_steps: Gauge::default(),
            // 1 ms to ~16 s.
            update_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            row: Family::default(),
            eval: Family::default(),
            actor_refused: Family::default(),
            registry: Registry::default(),
        };
        registry.register("ingest_chunks", "Chunks accepted from actors", m.chunks.clone());
        registry.register("ingest_transitions", "Env steps in accepted chunks (all envs)", m.transitions.clone());
        registry.register("ingest_gradients", "Gradients accepted from A3C actors", m.gradients.clone());
        registry.register(
            "refused_messages",
            "Messages refused as malformed or from unknown actors",
            m.refused.clone(),
        );
        registry.register(
            "duplicate_messages",
            "Messages resent with a key already taken: answered as delivered, not taken twice",
            m.duplicates.clone(),
        );
        registry.register("actors_connected", "Actors registered now", m.actors.clone());
        registry.register("ingest_queue_depth", "Deliveries waiting in the ingest queue", m.queue_depth.clone());
        registry.register("policy_version", "Newest published parameter version", m.policy_version.clone());
        registry.register("env_steps", "Env steps counted by the learner", m.env_steps.clone());
        registry.register("update_seconds", "Seconds per learner update", m.update_seconds.clone());
        registry.register("run_metric", "The latest value of each metrics.csv column", m.row.clone());
        registry.register("eval_mean_return", "Mean return of the latest evaluation, per task", m.eval.clone());
        registry.register(
            "actor_refused_messages",
            "Messages refused from the actor registered in each slot",
            m.actor_refused.clone(),
        );
        Arc::new(LearnerMetrics { registry, ..m })
    }

    /// Take in a logged metrics row (`metrics.csv`'s columns; empty cells skipped).
    pub fn observe_row<S: AsRef<str>>(&self, row: &[(S, Option<f64>)]) {
        for (name, value) in row {
            let (name, Some(v)) = (name.as_ref(), value) else { continue };
            self.row.get_or_create(&vec![("name".to_string(), name.to_string())]).set(*v);
            let task = match name {
                "eval/mean_return" => Some(""),
                _ => name.strip_prefix("eval/").and_then(|t| t.strip_suffix("/mean_return")),
            };
            if let Some(task) = task {
                self.eval.get_or_create(&vec![("task".to_string(), task.to_string())]).set(*v);
            }
            if name == "env_steps" {
                self.env_steps.set(*v as i64);
            }
        }
    }

    /// The refused-messages counter of the actor in `slot`.
    pub fn actor_refused(&self, slot: u32) -> Counter {
        self.actor_refused.get_or_create(&vec![("slot".to_string(), slot.to_string())]).clone()
    }

    /// The exposition: OpenMetrics text, ending `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// A running endpoint; stops (and frees its port) when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// The address it listens on (with the port the OS chose when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serve `metrics` at `http://{addr}/metrics` on a thread of its own (HTTP/1.1 through hyper); other paths get
/// 404. Binding fails with an error naming the address.
pub fn serve(addr: SocketAddr, metrics: Arc<LearnerMetrics>) -> Result<MetricsServer> {
    let bind_error =
        |source: std::io::Error| Error::Io { action: "listening for metrics on", path: addr.to_string(), source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().map_err(bind_error)?;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let metrics = metrics.clone();
                            let service = hyper::service::service_fn(move |req| respond(req, metrics.clone()));
                            let io = hyper_util::rt::TokioIo::new(stream);
                            tokio::spawn(async move {
                                // A client that hangs up mid-request is its own problem.
                                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                            });
                        }
                    }
                }
            })
        })
        .map_err(bind_error)?;
    Ok(MetricsServer { addr: local, stop: Some(stop_tx), thread: Some(thread) })
}

async fn respond(
    req: Request<hyper::body::Incoming>,
    metrics: Arc<LearnerMetrics>,
) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let response = if req.uri().path() == "/metrics" {
        Response::builder()
            .header("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
            .body(Full::new(Bytes::from(metrics.encode())))
    } else {
        Response::builder().status(StatusCode::NOT_FOUND).body(Full::new(Bytes::from("not found: try /metrics\n")))
    };
    Ok(response.expect("a response from constant parts"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_counters_rows_and_evaluations_over_http() {
        let m = LearnerMetrics::new();
        m.chunks.inc_by(3);
        m.transitions.inc_by(3 * 128);
        m.actors.set(2);
        m.update_seconds.observe(0.02);
        m.observe_row(&[
            ("env_steps", Some(5000.0)),
            ("losses/value_loss", Some(0.5)),
            ("eval/mean_return", None),
            ("eval/long/mean_return", Some(480.0)),
        ]);
        let server = serve("127.0.0.1:0".parse().unwrap(), m.clone()).unwrap();
        let body = get(server.local_addr(), "/metrics");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        for line in [
            "flotilla_ingest_chunks_total 3",
            "flotilla_ingest_transitions_total 384",
            "flotilla_actors_connected 2",
            "flotilla_env_steps 5000",
            "flotilla_update_seconds_count 1",
            "flotilla_run_metric{name=\"losses/value_loss\"} 0.5",
            "flotilla_eval_mean_return{task=\"long\"} 480.0",
        ] {
            assert!(body.lines().any(|l| l == line), "no {line:?} in\n{body}");
        }
        assert!(!body.contains("name=\"eval/mean_return\""), "empty cells are not values:\n{body}");
        assert!(body.trim_end().ends_with("# EOF"));
        assert!(get(server.local_addr(), "/other").starts_with("HTTP/1.1 404"));
        let addr = server.local_addr();
        drop(server);
        assert!(std::net::TcpStream::connect(addr).is_err(), "the port is freed when the server is dropped");
    }
}
