//! The benchmark's baseline: a bare hyper SSE server that answers a run request with the
//! same events, the same framing and the same sizes as agui-serve's demo echo, but with no
//! runtime at all (no journal, no store, no pump, no agent task, no auth). What agui-serve
//! costs above it is the price of its guarantees.
//!
//! It takes agui-serve's command line (and ignores it but `--port` and `--host`), prints the
//! same "listening" line, and serves `POST /agui/<agent>` over plain HTTP/1.1 and HTTP/2:
//!
//!   cargo build --release --example bare_sse
//!   scripts/bench.sh target/release/examples/bare_sse target/release/agui-serve 5

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use agui_serve::protocol::{Event, Message, TextRole, decode_run_input, event_frame};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::sync::mpsc;

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let host = flag(&args, "--host").unwrap_or_else(|| "127.0.0.1".to_owned());
    let port = flag(&args, "--port").unwrap_or_else(|| "0".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("{host}:{port}")).await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!("agui-serve listening on http://{addr}/agui");
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(handle);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let Ok(body) = request.into_body().collect().await else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let Ok(input) = decode_run_input(&body.to_bytes()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let text = input
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::User(user) => Some(user.content.text()),
            _ => None,
        })
        .unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut seq = 0u64;
        let mut send = |event: Event| {
            seq += 1;
            let id = format!("{:x}-{:08x}-{:08x}", 1u64, 0u32, seq);
            event_frame(&id, &event, Some(now_ms()))
        };
        let message_id = format!("msg-{}", uuid::Uuid::new_v4());
        let reply = format!("You said: {text}");
        let mut events = vec![
            Event::run_started(&input.thread_id, &input.run_id, None),
            Event::StateSnapshot {
                snapshot: json!({"agent": "demo", "todos": [], "usage": {}, "files": []}),
            },
            Event::TextMessageStart {
                message_id: message_id.clone(),
                role: Some(TextRole::Assistant),
                name: None,
            },
        ];
        events.extend(
            reply
                .split_inclusive(' ')
                .map(|delta| Event::TextMessageContent {
                    message_id: message_id.clone(),
                    delta: delta.to_owned(),
                }),
        );
        events.push(Event::TextMessageEnd { message_id });
        events.push(Event::RunFinished {
            thread_id: input.thread_id.clone(),
            run_id: input.run_id.clone(),
            result: None,
            outcome: None,
            usage: None,
        });
        for event in events {
            if tx.send(send(event)).await.is_err() {
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let bytes = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    Ok(response)
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *response.status_mut() = code;
    response
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
