//! What garbage costs its sender: a connection whose calls are refused `max_refused_in_a_row` times in a row is
//! closed, wire-level refusals included (bytes that do not decode as the message, another protocol version, a
//! wrong token, a method that does not exist), while an accepted message ends the run of refusals; a connection
//! that makes no call with the run token within `auth_timeout` is closed (over TLS: `tls.rs`); and the server
//! goes on serving everyone else.
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use flotilla_core::Gradient;
use flotilla_transport::grpc::{GrpcClient, Limits, ServerHandle, serve};
use flotilla_transport::{LearnerClient, MessageKey, PROTOCOL_VERSION, codec, proto};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

mod common;
use common::Echo;

const TOKEN: &str = "refusal-test-token";

/// Bytes as they are, both ways: a client that can send anything in a gRPC frame.
#[derive(Clone, Copy)]
struct Raw;

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// One raw call of `method` on `channel` (one HTTP/2 connection, reopened by tonic when the server closed
/// it) with `token`: the status code it was answered with (`Ok` for an answer).
async fn call(channel: &Channel, method: &str, body: Vec<u8>, token: &str) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if grpc.ready().await.is_err() {
        return Code::Unavailable;
    }
    let mut req = Request::new(body);
    req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    let path = PathAndQuery::try_from(format!("/flotilla.v1.Learner/{method}")).unwrap();
    match grpc.unary::<_, Vec<u8>, _>(req, path, Raw).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// A gradient the server accepts.
fn good_gradient() -> Vec<u8> {
    let g = Gradient { actor_id: 7, policy_version: 1, values: vec![0.5; 4], env_steps: 8, episodes: Vec::new() };
    codec::gradient_to_proto(&g, PROTOCOL_VERSION, MessageKey::NONE).encode_to_vec()
}

fn server(runtime: &tokio::runtime::Runtime, limits: &Limits) -> ServerHandle {
    serve(runtime.handle(), Arc::new(Echo), "127.0.0.1:0".parse().unwrap(), TOKEN, limits).unwrap()
}

/// Wait (up to 5 s) until `count()` is `want`; returns the count then.
fn settles(count: impl Fn() -> u64, want: u64) -> u64 {
    let start = Instant::now();
    while count() != want && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    count()
}

#[test]
fn refusals_in_a_row_close_the_connection_and_an_accepted_message_ends_the_run() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let limits = Limits { max_refused_in_a_row: 5, auth_timeout: Duration::from_secs(60), ..Limits::default() };
    let server = server(&runtime, &limits);
    let addr = format!("http://{}", server.local_addr);
    let channel = runtime.block_on(Endpoint::from_shared(addr.clone()).unwrap().connect()).unwrap();
    let mut other = GrpcClient::connect(&addr, TOKEN, &Limits::default(), Duration::from_secs(5)).unwrap();
    let wrong_version = {
        let g = Gradient { actor_id: 7, policy_version: 1, values: vec![0.5; 4], env_steps: 8, episodes: Vec::new() };
        codec::gradient_to_proto(&g, PROTOCOL_VERSION + 1, MessageKey::NONE).encode_to_vec()
    };
    // Every kind of wire-level garbage, each refused with its own code.
    let garbage: [(&str, Vec<u8>, &str, Code); 4] = [
        ("SendChunk", vec![0xff; 16], TOKEN, Code::Internal), // does not decode as a Chunk
        ("SendGradient", wrong_version, TOKEN, Code::InvalidArgument),
        (
            "GetRunInfo",
            proto::RunInfoRequest { protocol_version: PROTOCOL_VERSION }.encode_to_vec(),
            "wrong",
            Code::Unauthenticated,
        ),
        ("Shutdown", Vec::new(), TOKEN, Code::Unimplemented),
    ];
    let refuse = |k: usize| {
        let (method, body, token, code) = &garbage[k % garbage.len()];
        let got = runtime.block_on(call(&channel, method, body.clone(), token));
        assert_eq!(got, *code, "{method} with garbage");
    };
    for k in 0..4 {
        refuse(k);
    }
    // Run info and parameters answered OK do not end a run of refusals; an accepted gradient does.
    let info = proto::RunInfoRequest { protocol_version: PROTOCOL_VERSION }.encode_to_vec();
    assert_eq!(runtime.block_on(call(&channel, "GetRunInfo", info, TOKEN)), Code::Ok);
    assert_eq!(runtime.block_on(call(&channel, "SendGradient", good_gradient(), TOKEN)), Code::Ok);
    for k in 0..4 {
        refuse(k);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.closed_for_refusals(), 0, "4 refusals, an accepted gradient, 4 more: still open");
    refuse(0);
    assert_eq!(settles(|| server.closed_for_refusals(), 1), 1, "the fifth refusal in a row closes the connection");
    // The server goes on serving: another connection, and this client's new one.
    assert_eq!(other.run_info().unwrap().run_id, "run-1");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(runtime.block_on(call(&channel, "SendGradient", good_gradient(), TOKEN)), Code::Ok);
    // Garbage alone, on the new connection: five calls, closed again.
    for k in 0..5 {
        refuse(k);
    }
    assert_eq!(settles(|| server.closed_for_refusals(), 2), 2);
    assert_eq!(server.closed_unauthenticated(), 0);
}

#[test]
fn a_connection_that_never_authenticates_is_closed_after_the_timeout() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let limits = Limits { auth_timeout: Duration::from_millis(400), ..Limits::default() };
    let server = server(&runtime, &limits);
    let addr = format!("http://{}", server.local_addr);
    // A client that authenticated at once stays connected past the timeout.
    let mut actor = GrpcClient::connect(&addr, TOKEN, &Limits::default(), Duration::from_secs(5)).unwrap();
    assert_eq!(actor.run_info().unwrap().run_id, "run-1");
    // A silent TCP connection is closed by the server: the read ends.
    let mut silent = std::net::TcpStream::connect(server.local_addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    // The server's HTTP/2 settings come first, then the end of the stream.
    silent.read_to_end(&mut Vec::new()).expect("closed, not timed out");
    assert!(start.elapsed() >= Duration::from_millis(300), "closed after the timeout: {:?}", start.elapsed());
    // An HTTP/2 client that only presents a wrong token is closed too.
    let channel = runtime.block_on(Endpoint::from_shared(addr).unwrap().connect()).unwrap();
    let info = proto::RunInfoRequest { protocol_version: PROTOCOL_VERSION }.encode_to_vec();
    assert_eq!(runtime.block_on(call(&channel, "GetRunInfo", info, "wrong")), Code::Unauthenticated);
    assert_eq!(settles(|| server.closed_unauthenticated(), 2), 2);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(actor.run_info().unwrap().run_id, "run-1", "the authenticated client is served on");
    assert_eq!(server.closed_unauthenticated(), 2, "the authenticated connection was not closed");
}

/// A message's idempotency key reaches the learner over gRPC as the client sent it (the learner takes each key
/// once: `learner/tests/local_transport.rs`), and a message sent without one arrives without one.
#[test]
fn the_idempotency_key_travels_with_the_message() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = server(&runtime, &Limits::default());
    let addr = format!("http://{}", server.local_addr);
    let mut client = GrpcClient::connect(&addr, TOKEN, &Limits::default(), Duration::from_secs(5)).unwrap();
    let g = Gradient { actor_id: 7, policy_version: 1, values: vec![0.5; 4], env_steps: 8, episodes: Vec::new() };
    let key = MessageKey { sender: MessageKey::new_sender(), seq: 41 };
    let ack = client.send_gradient(&g, key).unwrap();
    assert_eq!((ack.policy_version, ack.env_steps), (key.sender, 41));
    let ack = client.send_gradient(&g, MessageKey::NONE).unwrap();
    assert_eq!((ack.policy_version, ack.env_steps), (0, 0));
    assert_ne!(MessageKey::new_sender(), key.sender, "each sender id is drawn afresh");
}
