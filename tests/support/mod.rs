//! Test helpers: an in-process server on a real loopback socket, and an SSE reader.
#![allow(dead_code, unreachable_pub)]

pub mod probe;
pub mod scripted_model;

use std::path::PathBuf;
use std::time::Duration;

use agui_serve::Server;
use agui_serve::config::Config;
use agui_serve::http::Limits;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "test-token-0123456789";

/// The event types of a hydration run (and of a suspended run handed to a reloaded page).
pub const SNAPSHOT_RUN: [&str; 4] = [
    "RUN_STARTED",
    "MESSAGES_SNAPSHOT",
    "STATE_SNAPSHOT",
    "RUN_FINISHED",
];

/// A server bound to 127.0.0.1:0, stopped (gracefully) when dropped or by `shutdown`.
pub struct TestServer {
    pub base: String,
    pub addr: std::net::SocketAddr,
    /// The metrics listener's address, when `metrics_listen` was configured.
    pub metrics_addr: Option<std::net::SocketAddr>,
    pub shutdown: CancellationToken,
    pub task: Option<JoinHandle<()>>,
    pub data_dir: PathBuf,
}

/// The daemon's executable, which confines and starts agent processes (an in-process
/// server's own executable is the test binary).
pub fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agui-serve"))
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agui-test-{tag}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::with(|_| {}).await
    }

    pub async fn with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        TestServer::with_limits(adjust, Limits::default()).await
    }

    pub async fn with_limits(adjust: impl FnOnce(&mut Config), limits: Limits) -> TestServer {
        let data_dir = temp_dir("srv");
        let mut config = Config::for_tests(TOKEN, data_dir.clone());
        config.launcher = Some(launcher());
        adjust(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = Server::from_listener(listener, config)
            .await
            .expect("server")
            .with_limits(limits);
        let base = server.url();
        let metrics_addr = server.metrics_addr();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(server.run(async move { stop.cancelled().await }));
        TestServer {
            base,
            addr,
            metrics_addr,
            shutdown,
            task: Some(task),
            data_dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `GET path` (under the route namespace) with the test token.
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        client().get(self.url(path)).bearer_auth(TOKEN)
    }

    /// `POST path` (under the route namespace) with the test token.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        client().post(self.url(path)).bearer_auth(TOKEN)
    }

    /// `DELETE path` (under the route namespace) with the test token.
    pub fn delete(&self, path: &str) -> reqwest::RequestBuilder {
        client().delete(self.url(path)).bearer_auth(TOKEN)
    }

    /// `PATCH path` (under the route namespace) with the test token.
    pub fn patch(&self, path: &str) -> reqwest::RequestBuilder {
        client().patch(self.url(path)).bearer_auth(TOKEN)
    }

    /// Signals shutdown and waits for the server to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client")
}

pub fn run_body(thread: &str, run: &str, text: &str) -> Value {
    json!({
        "threadId": thread,
        "runId": run,
        "protocolVersion": "1.0",
        "messages": [{"id": format!("{run}-u"), "role": "user", "content": text}],
    })
}

pub fn legacy_body(thread: &str, run: &str, text: &str) -> Value {
    json!({
        "threadId": thread,
        "runId": run,
        "messages": [{"id": format!("{run}-u"), "role": "user", "content": text}],
    })
}

pub async fn post_run(server: &TestServer, agent: &str, body: &Value) -> reqwest::Response {
    server
        .post(&format!("/{agent}"))
        .header("accept", "text/event-stream")
        .json(body)
        .sent()
        .await
}

/// Sends a request the test expects to get an answer to (any status).
pub trait Sent {
    fn sent(self) -> impl std::future::Future<Output = reqwest::Response>;
}

impl Sent for reqwest::RequestBuilder {
    async fn sent(self) -> reqwest::Response {
        self.send().await.expect("request")
    }
}

/// One parsed SSE frame.
#[derive(Debug, Clone)]
pub struct SseFrame {
    pub id: Option<String>,
    pub data: Value,
}

impl SseFrame {
    pub fn kind(&self) -> &str {
        self.data["type"].as_str().unwrap_or("")
    }
}

/// Reads SSE frames from a streaming response, checking the framing as it goes.
pub struct SseReader {
    response: reqwest::Response,
    buf: Vec<u8>,
    pub keep_alives: usize,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> SseReader {
        SseReader {
            response,
            buf: Vec::new(),
            keep_alives: 0,
        }
    }

    /// The next event frame, or `None` at the end of the body.
    pub async fn next(&mut self) -> Option<SseFrame> {
        loop {
            if let Some(end) = find(&self.buf, b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                match parse_block(block).unwrap_or_else(|problem| panic!("{problem}")) {
                    Block::KeepAlive => self.keep_alives += 1,
                    Block::Frame(frame) => return Some(frame),
                }
                continue;
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => {
                    assert!(self.buf.is_empty(), "trailing partial frame");
                    return None;
                }
                Err(e) => panic!("stream error: {e}"),
            }
        }
    }

    /// Every remaining frame.
    pub async fn collect(mut self) -> Vec<SseFrame> {
        let mut out = Vec::new();
        while let Some(frame) = self.next().await {
            out.push(frame);
        }
        out
    }
}

/// One `\n\n`-terminated block of an SSE body.
pub enum Block {
    KeepAlive,
    Frame(SseFrame),
}

/// Parses one block (with its terminating blank line) as the daemon frames it: `id:` and
/// one `data:` line of JSON, LF only, or a comment; anything else is the problem named.
pub fn parse_block(block: Vec<u8>) -> Result<Block, String> {
    let text = String::from_utf8(block).map_err(|_| "frame is not UTF-8".to_owned())?;
    if text.contains('\r') {
        return Err(format!("CR in SSE framing: {text:?}"));
    }
    if text.starts_with(':') {
        return Ok(Block::KeepAlive);
    }
    let mut id = None;
    let mut data = None;
    for line in text.trim_end_matches('\n').split('\n') {
        if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            if data.is_some() {
                return Err("two data lines in one frame".to_owned());
            }
            data = Some(serde_json::from_str(v).map_err(|e| format!("frame JSON: {e}: {v}"))?);
        } else {
            return Err(format!("unexpected SSE line {line:?}"));
        }
    }
    match data {
        Some(data) => Ok(Block::Frame(SseFrame { id, data })),
        None => Err(format!("frame without data: {text:?}")),
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The frame types of a run, in order.
pub fn kinds(frames: &[SseFrame]) -> Vec<String> {
    frames.iter().map(|f| f.kind().to_owned()).collect()
}

/// Asserts the AG-UI lifecycle rules on one segment's frames.
pub fn assert_valid_segment(frames: &[SseFrame]) {
    assert!(!frames.is_empty(), "empty stream");
    assert_eq!(frames[0].kind(), "RUN_STARTED", "first frame");
    assert_eq!(frames[0].data["protocolVersion"], "1.0");
    let terminal: Vec<_> = frames
        .iter()
        .filter(|f| matches!(f.kind(), "RUN_FINISHED" | "RUN_ERROR"))
        .collect();
    assert_eq!(
        terminal.len(),
        1,
        "exactly one terminal: {:?}",
        kinds(frames)
    );
    assert!(
        matches!(
            frames.last().map(SseFrame::kind),
            Some("RUN_FINISHED" | "RUN_ERROR")
        ),
        "terminal last"
    );
    let mut open = std::collections::HashSet::new();
    for f in frames {
        let id = |k: &str| f.data[k].as_str().unwrap_or("").to_owned();
        match f.kind() {
            "TEXT_MESSAGE_START" => assert!(open.insert(("text", id("messageId")))),
            "TEXT_MESSAGE_CONTENT" => {
                assert!(open.contains(&("text", id("messageId"))));
                assert_ne!(f.data["delta"], "", "empty delta");
            }
            "TEXT_MESSAGE_END" => assert!(open.remove(&("text", id("messageId")))),
            "REASONING_START" => assert!(open.insert(("reasoning", id("messageId")))),
            "REASONING_END" => assert!(open.remove(&("reasoning", id("messageId")))),
            "REASONING_MESSAGE_START" => assert!(open.insert(("rmsg", id("messageId")))),
            "REASONING_MESSAGE_END" => assert!(open.remove(&("rmsg", id("messageId")))),
            "TOOL_CALL_START" => assert!(open.insert(("tool", id("toolCallId")))),
            "TOOL_CALL_END" => assert!(open.remove(&("tool", id("toolCallId")))),
            "RUN_FINISHED" | "RUN_ERROR" => assert!(open.is_empty(), "open at end: {open:?}"),
            _ => {}
        }
    }
    let ids: Vec<_> = frames.iter().filter_map(|f| f.id.clone()).collect();
    assert_eq!(ids.len(), frames.len(), "every frame has an id");
    apply_state(frames, None);
}

/// Applies every STATE_SNAPSHOT and STATE_DELTA of `frames` to `start` the way a client
/// does, failing if a delta does not apply cleanly; returns the resulting document.
pub fn apply_state(frames: &[SseFrame], start: Option<Value>) -> Option<Value> {
    let mut state = start;
    for f in frames {
        match f.kind() {
            "STATE_SNAPSHOT" => state = Some(f.data["snapshot"].clone()),
            "STATE_DELTA" => {
                let doc = state
                    .as_mut()
                    .expect("STATE_DELTA before any STATE_SNAPSHOT");
                let patch: json_patch::Patch =
                    serde_json::from_value(f.data["delta"].clone()).expect("RFC 6902 delta");
                json_patch::patch(doc, &patch).unwrap_or_else(|e| {
                    panic!("STATE_DELTA {} does not apply: {e}", f.data["delta"])
                });
            }
            _ => {}
        }
    }
    state
}

/// Waits until `check` holds, polling (bounded).
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// `GET {path}` with the token: status and JSON body.
pub async fn get_json(server: &TestServer, path: &str) -> (u16, Value) {
    let r = client()
        .get(server.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// The text of every `TEXT_MESSAGE_CONTENT`, concatenated.
pub fn text_of(frames: &[SseFrame]) -> String {
    frames
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect()
}

/// A decoded run input with one user message (for runtime-level tests).
/// The key of the operator's thread `id` (a runtime driven without HTTP runs as the
/// operator).
pub fn operator_key(id: &str) -> agui_serve::access::ThreadKey {
    agui_serve::access::Principal::operator().key(id)
}

pub fn run_input(thread: &str, run: &str, text: &str) -> agui_serve::protocol::RunAgentInput {
    agui_serve::protocol::decode_run_input(run_body(thread, run, text).to_string().as_bytes())
        .expect("valid input")
}

/// Asserts that every call the client was asked to answer in a transcript (AG-UI
/// `Message[]`): permission requests and the frontend tool `chart`, is answered by a later
/// `tool` message.
pub fn assert_every_client_call_answered(messages: &Value) {
    let messages = messages.as_array().expect("messages");
    for (i, message) in messages.iter().enumerate() {
        for call in message["toolCalls"].as_array().into_iter().flatten() {
            let name = &call["function"]["name"];
            if name != "agui_permission_request" && name != "chart" {
                continue;
            }
            let id = &call["id"];
            assert!(
                messages[i + 1..]
                    .iter()
                    .any(|m| m["role"] == "tool" && m["toolCallId"] == *id),
                "tool call {id} has no result: {messages:#?}"
            );
        }
    }
}

/// The position of the message with `id` in a transcript.
pub fn position_of(messages: &Value, id: &str) -> usize {
    messages
        .as_array()
        .expect("messages")
        .iter()
        .position(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no message {id}: {messages:#?}"))
}

/// The id of the `agui_permission_request` call on a stream.
pub fn permission_call_id(frames: &[SseFrame]) -> String {
    frames
        .iter()
        .find(|f| {
            f.kind() == "TOOL_CALL_START" && f.data["toolCallName"] == "agui_permission_request"
        })
        .and_then(|f| f.data["toolCallId"].as_str())
        .expect("a permission request")
        .to_owned()
}

/// POSTs a run over a raw HTTP/1.1 connection whose receive buffer is tiny, so the socket
/// cannot absorb the stream: the daemon sees exactly how fast the test reads.
pub async fn raw_post_run(server: &TestServer, body: &Value) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut stream = socket.connect(server.addr).await.expect("connect");
    let payload = body.to_string();
    let request = format!(
        "POST /agui/demo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{payload}",
        payload.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    stream
}

/// Reads a raw chunked response to its end, pausing `pause` after every read; each read
/// must come within `patience`.
pub async fn read_raw_to_end(
    stream: &mut tokio::net::TcpStream,
    patience: Duration,
    pause: Duration,
) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::time::timeout(patience, stream.read(&mut buf))
            .await
            .expect("the stream ends in time")
            .expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.ends_with(b"\r\n0\r\n\r\n") {
            break;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    got
}

/// The scripted ACP agent example, built by `cargo test`.
pub fn scripted_agent() -> PathBuf {
    // target/debug/deps/<test>-<hash> -> target/debug/examples/scripted_acp_agent
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let agent = dir.join("examples").join("scripted_acp_agent");
    assert!(
        agent.exists(),
        "{} missing: `cargo test` builds it (or `cargo build --example scripted_acp_agent`)",
        agent.display()
    );
    agent
}
