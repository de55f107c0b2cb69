//! The benchmark's baseline: a bare hyper SSE server that answers a run request with the
//! same events, the same framing and the same sizes as agui-serve's demo agent (its echo, one
//! `TEXT_MESSAGE_CONTENT` per word of "You said: <text>", and `/slow N [MS]`, N numbered
//! chunks one every MS milliseconds, paced with a sleep between chunks), but with no
//! runtime at all (no journal, no store, no pump, no agent task, no auth). What agui-serve
//! costs above it is the price of its guarantees.
//!
//! It takes agui-serve's command line (and ignores it but `--port` and `--host`), prints the
//! same "listening" line, and serves `POST /agui/<agent>` over plain HTTP/1.1 (hyper's own
//! HTTP/1.1 connection, the leanest hyper server; the load client speaks HTTP/1.1):
//!
//!   cargo build --release --example bare_sse
//!   scripts/bench.sh target/release/examples/bare_sse target/release/agui-serve 5
//!
//! (`scripts/bench.sh` with no arguments builds and runs it as one of its baselines.)

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agui_serve::protocol::{
    Event, Message, RunAgentInput, TextRole, decode_run_input, event_frame,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
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
            let _ = hyper::server::conn::http1::Builder::new()
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
    tokio::spawn(produce(tx, input, text));
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

/// The upper bounds the demo agent puts on `/slow N MS`.
const MAX_SLOW_CHUNKS: u64 = 100_000;
const MAX_SLOW_INTERVAL_MS: u64 = 60_000;

/// What the demo agent makes of the user's text: `/slow N [MS]` (N chunks, one every MS
/// milliseconds, 100 by default) or anything else, echoed.
enum Reply {
    Echo(String),
    Slow { chunks: u64, interval: Duration },
}

impl Reply {
    fn parse(text: &str) -> Reply {
        let trimmed = text.trim();
        let (head, rest) = match trimmed.split_once(char::is_whitespace) {
            Some((head, rest)) => (head, rest.trim()),
            None => (trimmed, ""),
        };
        if head == "/slow" {
            let mut words = rest.split_whitespace();
            let chunks = words.next().and_then(|w| w.parse::<u64>().ok());
            let interval = match words.next() {
                None => Some(100),
                Some(word) => word.parse::<u64>().ok(),
            };
            if let (Some(chunks), Some(ms)) = (chunks, interval) {
                return Reply::Slow {
                    chunks: chunks.min(MAX_SLOW_CHUNKS),
                    interval: Duration::from_millis(ms.min(MAX_SLOW_INTERVAL_MS)),
                };
            }
        }
        Reply::Echo(format!("You said: {trimmed}"))
    }
}

/// The demo agent's events for one run, framed, into `tx` (bounded: a slow reader holds
/// the producer back). Stops when the reader is gone.
async fn produce(tx: mpsc::Sender<Bytes>, input: RunAgentInput, text: String) {
    let mut seq = 0u64;
    let mut frame = |event: Event| {
        seq += 1;
        let id = format!("{:x}-{:08x}-{:08x}", 1u64, 0u32, seq);
        event_frame(&id, &event, Some(now_ms()))
    };
    let message_id = format!("msg-{}", uuid::Uuid::new_v4());
    let delta = |delta: String| Event::TextMessageContent {
        message_id: message_id.clone(),
        delta,
        subagent_run_id: None,
    };
    let opening = [
        Event::run_started(&input.thread_id, &input.run_id, None),
        Event::StateSnapshot {
            snapshot: json!({"agent": "demo", "todos": [], "usage": {}, "files": []}),
        },
        Event::TextMessageStart {
            message_id: message_id.clone(),
            role: Some(TextRole::Assistant),
            name: None,
            subagent_run_id: None,
        },
    ];
    for event in opening {
        if tx.send(frame(event)).await.is_err() {
            return;
        }
    }
    match Reply::parse(&text) {
        Reply::Echo(reply) => {
            for word in reply.split_inclusive(' ') {
                if tx.send(frame(delta(word.to_owned()))).await.is_err() {
                    return;
                }
            }
        }
        Reply::Slow { chunks, interval } => {
            for i in 1..=chunks {
                if i > 1 {
                    if interval.is_zero() {
                        tokio::task::yield_now().await;
                    } else {
                        // A reader that left ends the run now, not at the next chunk.
                        tokio::select! {
                            () = tokio::time::sleep(interval) => {}
                            () = tx.closed() => return,
                        }
                    }
                }
                let chunk = delta(format!("chunk {i}/{chunks}\n"));
                if tx.send(frame(chunk)).await.is_err() {
                    return;
                }
            }
        }
    }
    let closing = [
        Event::TextMessageEnd {
            message_id: message_id.clone(),
            subagent_run_id: None,
        },
        Event::RunFinished {
            thread_id: input.thread_id.clone(),
            run_id: input.run_id.clone(),
            result: None,
            outcome: None,
            usage: None,
        },
    ];
    for event in closing {
        if tx.send(frame(event)).await.is_err() {
            return;
        }
    }
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
