//! The benchmark's baselines: bare servers that answer a run request with the same events,
//! the same framing and the same sizes as agui-serve's demo agent (its echo, one
//! `TEXT_MESSAGE_CONTENT` per word of "You said: <text>", and `/slow N [MS]`, N numbered
//! chunks one every MS milliseconds, paced with a sleep between chunks), but with no
//! runtime at all (no journal, no store, no pump, no agent task, no auth). What agui-serve
//! costs above them is the price of its guarantees.
//!
//! It takes agui-serve's command line (and ignores it but `--port`, `--host`, `--data-dir`
//! and its own `--mode`), prints the same "listening" line, and serves one of four ways:
//!
//! | `--mode` | what |
//! |---|---|
//! | `per-frame` (default) | hyper's own HTTP/1.1 connection (the leanest hyper server; the load client speaks HTTP/1.1), `POST /agui/<agent>`, one body chunk per frame |
//! | `coalesced` | the same, but each body chunk is a frame with every frame already pending after it, up to 16 kB, as agui-serve's attachment coalesces them (`runtime/attach.rs`): one chunk and one write for the lot. The producer may run a journal window (4 096 frames) ahead of the reader, as agui-serve's pump may |
//! | `durable` | `per-frame`, committing what agui-serve commits for a run before it announces it: before `RUN_STARTED` the thread, its input and the run, before `RUN_FINISHED` the answer and the run's end, each committed (SQLite in `--data-dir`, WAL, `synchronous = NORMAL`, group commit on one writer, checkpoints on a thread of their own: the daemon's own store, so the rows and the commits are the same by construction). The baseline of short runs |
//! | `raw-tcp` | no HTTP: the physical ceiling of loopback. A plain tokio TCP connection takes one request per line (the run's JSON input) and answers with the run's frame bytes, preceded by their length (8 bytes, big-endian), in writes of up to 16 kB. The frames of a request text are encoded once and written again for every later request with that text (the same bytes and sizes, the same ids and times): what it measures is the socket and the reader, not the encoder. A run is written once it is whole. The load client speaks it to a `tcp://` URL |
//!
//!   cargo build --release --example bare_sse
//!   scripts/bench.sh target/release/examples/bare_sse target/release/agui-serve 5
//!
//! (`scripts/bench.sh` with no arguments builds and runs it in each mode as a baseline.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agui_serve::protocol::{
    Event, Message, RunAgentInput, TextRole, decode_run_input, event_frame,
};
use agui_serve::store::Store;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// How the frames of a run reach the reader (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    PerFrame,
    Coalesced,
    Durable,
    RawTcp,
}

impl Mode {
    fn parse(name: &str) -> Option<Mode> {
        match name {
            "per-frame" => Some(Mode::PerFrame),
            "coalesced" => Some(Mode::Coalesced),
            "durable" => Some(Mode::Durable),
            "raw-tcp" => Some(Mode::RawTcp),
            _ => None,
        }
    }
}

/// At most this many bytes of frames go out as one chunk or one write: agui-serve's
/// attachment's bound (`BATCH_BYTES` in `runtime/attach.rs`).
const BATCH_BYTES: usize = 16 * 1024;

/// Frames a coalescing producer may run ahead of its reader: agui-serve's journal window
/// (`JournalLimits::max_frames`), within which its pump never waits for a reader.
const WINDOW_FRAMES: usize = 4096;

/// Frames a per-frame producer may run ahead of its reader.
const PER_FRAME_AHEAD: usize = 16;

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
    let mode = flag(&args, "--mode").unwrap_or_else(|| "per-frame".to_owned());
    let Some(mode) = Mode::parse(&mode) else {
        eprintln!("bare_sse: --mode is per-frame, coalesced, durable or raw-tcp, not {mode}");
        std::process::exit(2);
    };
    let store = match (mode, flag(&args, "--data-dir")) {
        (Mode::Durable, Some(dir)) => match Store::open(std::path::Path::new(&dir)) {
            Ok(store) => Some(store),
            Err(error) => {
                eprintln!("bare_sse: the store in {dir} did not open: {error}");
                std::process::exit(1);
            }
        },
        (Mode::Durable, None) => {
            eprintln!("bare_sse: --mode durable needs --data-dir");
            std::process::exit(2);
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(format!("{host}:{port}")).await?;
    let addr: SocketAddr = listener.local_addr()?;
    if mode == Mode::RawTcp {
        println!("agui-serve listening on tcp://{addr}");
        let encoded = Arc::new(Mutex::new(HashMap::new()));
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve_raw(stream, encoded.clone()));
        }
    }
    println!("agui-serve listening on http://{addr}/agui");
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let store = store.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| handle(request, mode, store.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    request: Request<Incoming>,
    mode: Mode,
    store: Option<Store>,
) -> Result<Response<Body>, Infallible> {
    let Ok(body) = request.into_body().collect().await else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let Ok(input) = decode_run_input(&body.to_bytes()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let text = user_text(&input);
    let body = if mode == Mode::Coalesced {
        let (tx, rx) = mpsc::channel::<Bytes>(WINDOW_FRAMES);
        tokio::spawn(produce(tx, input, text, None));
        let stream = futures_util::stream::unfold(Coalescer::new(rx), |mut frames| async move {
            let bytes = frames.next_chunk().await?;
            Some((Ok::<_, Infallible>(Frame::data(bytes)), frames))
        });
        StreamBody::new(stream).boxed_unsync()
    } else {
        let (tx, rx) = mpsc::channel::<Bytes>(PER_FRAME_AHEAD);
        tokio::spawn(produce(tx, input, text, store));
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let bytes = rx.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(bytes)), rx))
        });
        StreamBody::new(stream).boxed_unsync()
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    Ok(response)
}

/// The text of the newest user message.
fn user_text(input: &RunAgentInput) -> String {
    input
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::User(user) => Some(user.content.text()),
            _ => None,
        })
        .unwrap_or_default()
}

/// A run's frames as body chunks the way agui-serve's attachment makes them
/// (`Attachment::with_ready`): the next frame, and the frames already pending after it up
/// to [`BATCH_BYTES`] in all, as one buffer. (Nothing follows a run's terminal frame here,
/// so the attachment's stop at a terminal frame never applies.)
struct Coalescer {
    rx: mpsc::Receiver<Bytes>,
    /// A pending frame that did not fit in the last chunk: the next chunk's first.
    held: Option<Bytes>,
    /// The frames of the chunk being made (kept to reuse its allocation).
    batch: Vec<Bytes>,
}

impl Coalescer {
    fn new(rx: mpsc::Receiver<Bytes>) -> Coalescer {
        Coalescer {
            rx,
            held: None,
            batch: Vec::new(),
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        let first = match self.held.take() {
            Some(frame) => frame,
            None => self.rx.recv().await?,
        };
        let mut len = first.len();
        while let Ok(next) = self.rx.try_recv() {
            if len + next.len() > BATCH_BYTES {
                self.held = Some(next);
                break;
            }
            len += next.len();
            self.batch.push(next);
        }
        if self.batch.is_empty() {
            return Some(first);
        }
        let mut chunk = BytesMut::with_capacity(len);
        chunk.extend_from_slice(&first);
        for frame in self.batch.drain(..) {
            chunk.extend_from_slice(&frame);
        }
        Some(chunk.freeze())
    }
}

/// Every run's answer of a raw TCP baseline by its request text: the length (8 bytes,
/// big-endian), then the frames.
type Encoded = Arc<Mutex<HashMap<String, Bytes>>>;

/// One raw TCP connection: each line is a run's JSON input, answered with the run's frames
/// (see [`Encoded`]) in writes of up to [`BATCH_BYTES`]. Ends when the reader closes.
async fn serve_raw(stream: TcpStream, encoded: Encoded) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        if read.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let Ok(input) = decode_run_input(&line) else {
            return Err(std::io::Error::other("not a run input"));
        };
        let text = user_text(&input);
        let known = encoded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&text)
            .cloned();
        let answer = match known {
            Some(answer) => answer,
            None => {
                let answer = encode_run(input, text.clone()).await;
                encoded
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .insert(text, answer.clone());
                answer
            }
        };
        for chunk in answer.chunks(BATCH_BYTES) {
            write.write_all(chunk).await?;
        }
    }
}

/// A run's whole answer on the raw TCP baseline: its length, then its frames.
async fn encode_run(input: RunAgentInput, text: String) -> Bytes {
    let (tx, mut rx) = mpsc::channel::<Bytes>(WINDOW_FRAMES);
    tokio::spawn(produce(tx, input, text, None));
    let mut frames = BytesMut::new();
    while let Some(frame) = rx.recv().await {
        frames.extend_from_slice(&frame);
    }
    let mut answer = BytesMut::with_capacity(8 + frames.len());
    answer.extend_from_slice(&(frames.len() as u64).to_be_bytes());
    answer.extend_from_slice(&frames);
    answer.freeze()
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
/// the producer back). Stops when the reader is gone. With a `store`, the run's start and
/// its end are committed before they are announced, as agui-serve commits them.
async fn produce(
    tx: mpsc::Sender<Bytes>,
    input: RunAgentInput,
    text: String,
    store: Option<Store>,
) {
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
    if let Some(store) = &store {
        store.record_run_start(
            &input.thread_id,
            "demo",
            Some(text.lines().next().unwrap_or_default().to_owned()),
            &input.run_id,
            input.messages.clone(),
            now_ms() as i64,
        );
        if store.commit().await.is_err() {
            return;
        }
    }
    let mut answer = String::new();
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
            answer = reply.clone();
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
                let piece = format!("chunk {i}/{chunks}\n");
                if store.is_some() {
                    answer.push_str(&piece);
                }
                let chunk = delta(piece);
                if tx.send(frame(chunk)).await.is_err() {
                    return;
                }
            }
        }
    }
    if let Some(store) = &store {
        let now = now_ms() as i64;
        let message = serde_json::from_value(json!({
            "id": message_id, "role": "assistant", "content": answer,
        }));
        if let Ok(message) = message {
            store.record_messages(&input.thread_id, vec![message], now);
        }
        store.record_run_end(&input.thread_id, &input.run_id, "finished", "idle", now);
        if store.commit().await.is_err() {
            return;
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
