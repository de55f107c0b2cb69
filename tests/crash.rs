//! Crash consistency, "commit, then announce": whatever a client has been shown survives
//! `kill -9` of the daemon.
//!
//! Each cycle starts a run on a fresh thread, reads its event stream, and SIGKILLs the daemon
//! the moment the stream shows one of three points (rotating):
//!
//! - (a) `RUN_STARTED`: the user message and the run must be stored; the run, cut, reads
//!   `interrupted` after the restart;
//! - (b) the terminal event of a normal reply: the user message and every assistant reply
//!   seen must be stored, and the run reads `finished`;
//! - (c) the `RUN_FINISHED` that suspends a run on an `agui_permission_request`: the user
//!   message and every tool call seen must be stored.
//!
//! The daemon is then restarted on the same data directory (the restart is the next cycle's
//! daemon) and the thread is read back through the thread API. A second phase repeats the
//! cycles while background tasks keep POSTing multi-MiB messages, so the store is busy when
//! the kill lands.
//!
//! `AGUI_CRASH_CYCLES` (default 200) and `AGUI_CRASH_LOADED_CYCLES` (default 100) set the
//! number of cycles per phase, `AGUI_CRASH_LOADERS` (default 3, 2..=4) the background
//! writers; `AGUI_CRASH_KEEP=1` keeps the data directory and daemon log.
//! `AGUI_CRASH_SETTLE_MS` waits that long between seeing the kill point and the kill: with
//! a generous value (1500) every cycle must pass, which checks the checker itself.

mod support;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use support::{TOKEN, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_agui-serve");

/// Size of a background writer's user message (the request body limit is 8 MiB; the
/// envelope around it is small).
const LOAD_MESSAGE_BYTES: usize = 3 * 1024 * 1024;
/// Bound on reading one cycle's stream up to its kill point.
const STREAM_BOUND: Duration = Duration::from_secs(30);

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client")
}

/// Where the daemons of this test keep their state.
struct Dirs {
    root: PathBuf,
    data: PathBuf,
    home: PathBuf,
    log: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let root = temp_dir("crash");
        let data = root.join("data");
        let home = root.join("home");
        std::fs::create_dir_all(&data).expect("data dir");
        std::fs::create_dir_all(&home).expect("home dir");
        let log = root.join("daemon.log");
        Dirs {
            root,
            data,
            home,
            log,
        }
    }
}

/// One daemon process.
struct Daemon {
    child: Child,
    base: String,
}

impl Daemon {
    /// Starts the binary on `dirs` and returns once it is listening and ready. Blocking.
    fn start(dirs: &Dirs) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&dirs.log)
            .expect("daemon log");
        let mut child = Command::new(BIN)
            .args(["--no-tls", "--port", "0", "--token", TOKEN, "--data-dir"])
            .arg(&dirs.data)
            .env_remove("AGUI_TOKEN")
            .env_remove("AGUI_CONFIG")
            .env_remove("STATE_DIRECTORY")
            .env_remove("NOTIFY_SOCKET")
            .env("HOME", &dirs.home)
            .env("XDG_STATE_HOME", dirs.home.join("state"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn agui-serve");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut base = None;
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).expect("read daemon stdout") == 0 {
                break;
            }
            if let Some(url) = line.trim().strip_prefix("agui-serve listening on ") {
                base = Some(url.to_owned());
                break;
            }
        }
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let Some(base) = base else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agui-serve exited before listening; log: {}",
                dirs.log.display()
            );
        };
        let daemon = Daemon { child, base };
        daemon.wait_ready();
        daemon
    }

    /// The listening line is printed after the store is open (and the previous process's
    /// runs recovered); `/readyz` confirms requests are being served.
    fn wait_ready(&self) {
        let url = self.url("/readyz");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ready_once(&url) {
                return;
            }
            assert!(Instant::now() < deadline, "daemon at {url} never got ready");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// SIGKILL, then reap; asserts it was our signal that ended it.
    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        let status = self.child.wait().expect("reap the daemon");
        assert_eq!(
            status.signal(),
            Some(9),
            "the daemon ended before our SIGKILL: {status:?}"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One blocking `GET /readyz` over a raw socket (no runtime needed).
fn ready_once(url: &str) -> bool {
    use std::io::{Read, Write};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let Some((authority, path)) = rest.split_once('/') else {
        return false;
    };
    let Ok(mut socket) = std::net::TcpStream::connect(authority) else {
        return false;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    if socket.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200")
}

/// Reads event frames off a streaming response, only as far as asked.
struct Frames {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Frames {
    /// The next event's JSON; `Ok(None)` at the end of the body.
    async fn next(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(block).map_err(|e| format!("frame not UTF-8: {e}"))?;
                let data = text
                    .lines()
                    .find_map(|line| line.strip_prefix("data: "))
                    .map(str::to_owned);
                match data {
                    // A comment (keep-alive) or a frame without data.
                    None => continue,
                    Some(data) => {
                        return serde_json::from_str(&data)
                            .map(Some)
                            .map_err(|e| format!("frame JSON: {e}: {data}"));
                    }
                }
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => return Ok(None),
                Err(e) => return Err(format!("stream error: {e}")),
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Started,
    Terminal,
    Suspended,
}

impl Point {
    const ALL: [Point; 3] = [Point::Started, Point::Terminal, Point::Suspended];

    fn label(self) -> &'static str {
        match self {
            Point::Started => "(a) RUN_STARTED",
            Point::Terminal => "(b) terminal of a reply",
            Point::Suspended => "(c) suspension RUN_FINISHED",
        }
    }

    fn index(self) -> usize {
        match self {
            Point::Started => 0,
            Point::Terminal => 1,
            Point::Suspended => 2,
        }
    }

    /// The user text that brings the demo agent to this point.
    fn text(self, cycle: usize) -> String {
        match self {
            // The first chunk at once, then ten seconds of nothing: the run is surely live
            // when the kill lands.
            Point::Started => "/slow 3 10000".to_owned(),
            Point::Terminal => format!("hello-{cycle}"),
            Point::Suspended => format!("/approve deploy-{cycle}"),
        }
    }

    fn is_kill_frame(self, kind: &str) -> bool {
        match self {
            Point::Started => kind == "RUN_STARTED",
            Point::Terminal | Point::Suspended => matches!(kind, "RUN_FINISHED" | "RUN_ERROR"),
        }
    }
}

/// What the client was shown before the kill.
#[derive(Debug, Default)]
struct Shown {
    /// Assistant text messages whose `TEXT_MESSAGE_END` was seen: (id, content).
    texts: Vec<(String, String)>,
    /// Tool calls whose `TOOL_CALL_END` was seen: (id, name, arguments).
    tools: Vec<(String, String, String)>,
    /// The frame the kill was triggered by.
    kill_frame: Option<Value>,
    kinds: Vec<String>,
}

impl Shown {
    fn absorb(&mut self, frame: &Value, open: &mut Vec<(String, String, String, bool)>) {
        let kind = frame["type"].as_str().unwrap_or("").to_owned();
        let s = |k: &str| frame[k].as_str().unwrap_or("").to_owned();
        match kind.as_str() {
            "TEXT_MESSAGE_START" => {
                open.push((s("messageId"), String::new(), String::new(), false))
            }
            "TEXT_MESSAGE_CONTENT" => {
                if let Some(m) = open.iter_mut().find(|m| !m.3 && m.0 == s("messageId")) {
                    m.1.push_str(&s("delta"));
                }
            }
            "TEXT_MESSAGE_END" => {
                if let Some(i) = open.iter().position(|m| !m.3 && m.0 == s("messageId")) {
                    let (id, content, _, _) = open.remove(i);
                    self.texts.push((id, content));
                }
            }
            "TOOL_CALL_START" => {
                open.push((s("toolCallId"), String::new(), s("toolCallName"), true))
            }
            "TOOL_CALL_ARGS" => {
                if let Some(m) = open.iter_mut().find(|m| m.3 && m.0 == s("toolCallId")) {
                    m.1.push_str(&s("delta"));
                }
            }
            "TOOL_CALL_END" => {
                if let Some(i) = open.iter().position(|m| m.3 && m.0 == s("toolCallId")) {
                    let (id, arguments, name, _) = open.remove(i);
                    self.tools.push((id, name, arguments));
                }
            }
            _ => {}
        }
        self.kinds.push(kind);
    }
}

struct Cycle {
    point: Point,
    /// Problems found after the restart: empty when nothing shown was lost.
    lost: Vec<String>,
    run: Duration,
    restart: Duration,
    verify: Duration,
}

/// One cycle: run to `point`, SIGKILL, restart (replacing `daemon`), read back.
async fn cycle(
    daemon: &mut Daemon,
    dirs: &Dirs,
    http: &reqwest::Client,
    n: usize,
    point: Point,
    base_tx: Option<&watch::Sender<Option<String>>>,
) -> Cycle {
    let started = Instant::now();
    let settle = Duration::from_millis(env_count("AGUI_CRASH_SETTLE_MS", 0) as u64);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let thread = format!("crash-{n}-{tag}");
    let run = format!("run-{n}-{tag}");
    let user_id = format!("{run}-u");
    let text = point.text(n);
    let body = json!({
        "threadId": thread,
        "runId": run,
        "protocolVersion": "1.0",
        "messages": [{"id": user_id, "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    });
    let response = http
        .post(daemon.url("/demo"))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("POST the run");
    assert_eq!(
        response.status(),
        200,
        "cycle {n}: run refused: {:?}",
        response.text().await
    );
    let mut frames = Frames {
        response,
        buf: Vec::new(),
    };
    let mut shown = Shown::default();
    let mut open = Vec::new();
    let deadline = tokio::time::Instant::now() + STREAM_BOUND;
    loop {
        let frame = tokio::time::timeout_at(deadline, frames.next())
            .await
            .unwrap_or_else(|_| panic!("cycle {n}: no kill point within {STREAM_BOUND:?}"))
            .unwrap_or_else(|e| panic!("cycle {n}: {e}; seen {:?}", shown.kinds))
            .unwrap_or_else(|| panic!("cycle {n}: stream ended early; seen {:?}", shown.kinds));
        let kind = frame["type"].as_str().unwrap_or("").to_owned();
        if point.is_kill_frame(&kind) {
            // Nothing else is read first: the kill races the daemon's own writes.
            if settle > Duration::ZERO {
                tokio::time::sleep(settle).await;
            }
            tokio::task::block_in_place(|| daemon.kill9());
            shown.absorb(&frame, &mut open);
            shown.kill_frame = Some(frame);
            break;
        }
        shown.absorb(&frame, &mut open);
    }
    drop(frames);
    if let Some(tx) = base_tx {
        tx.send_replace(None);
    }
    let run_time = started.elapsed();

    // Sanity of the scenario itself (not losses): the kill point is what was meant.
    let kill_frame = shown.kill_frame.clone().unwrap_or_default();
    match point {
        Point::Started => {}
        Point::Terminal => assert!(
            !shown.texts.is_empty() && shown.tools.is_empty(),
            "cycle {n}: (b) expected a plain reply, saw {:?}",
            shown.kinds
        ),
        Point::Suspended => {
            let pending = &kill_frame["outcome"]["pendingToolCallIds"];
            assert!(
                kill_frame["type"] == "RUN_FINISHED"
                    && pending.as_array().is_some_and(|p| !p.is_empty())
                    && shown.tools.iter().any(|t| t.1 == "agui_permission_request"),
                "cycle {n}: (c) expected a suspension on agui_permission_request, saw {:?} ending {kill_frame}",
                shown.kinds
            );
        }
    }

    let restarted = Instant::now();
    *daemon = tokio::task::block_in_place(|| Daemon::start(dirs));
    if let Some(tx) = base_tx {
        tx.send_replace(Some(daemon.base.clone()));
    }
    let restart = restarted.elapsed();

    let verifying = Instant::now();
    let lost = verify(daemon, http, &thread, &run, &user_id, &text, point, &shown).await;
    Cycle {
        point,
        lost,
        run: run_time,
        restart,
        verify: verifying.elapsed(),
    }
}

/// GETs `path` on the daemon: (status, JSON body or Null).
async fn get(daemon: &Daemon, http: &reqwest::Client, path: &str) -> (u16, Value) {
    let response = http
        .get(daemon.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[allow(clippy::too_many_arguments)]
async fn verify(
    daemon: &Daemon,
    http: &reqwest::Client,
    thread: &str,
    run: &str,
    user_id: &str,
    text: &str,
    point: Point,
    shown: &Shown,
) -> Vec<String> {
    let mut lost = Vec::new();
    let (status, info) = get(daemon, http, &format!("/threads/{thread}")).await;
    if status != 200 {
        lost.push(format!("thread missing (GET /threads/{thread}: {status})"));
        return lost;
    }
    let last = &info["lastRun"];
    let outcome = last["outcome"].as_str().unwrap_or("<none>");
    if last["runId"] != run {
        lost.push(format!("lastRun is {last}, not run {run}"));
    } else {
        let expected = match point {
            Point::Started => Some("interrupted"),
            Point::Terminal => Some(
                if shown
                    .kill_frame
                    .as_ref()
                    .is_some_and(|f| f["type"] == "RUN_ERROR")
                {
                    "error"
                } else {
                    "finished"
                },
            ),
            // A suspended run cut by the kill: how it reads afterwards is the daemon's call.
            Point::Suspended => None,
        };
        if let Some(expected) = expected
            && outcome != expected
        {
            lost.push(format!("run outcome {outcome:?}, expected {expected:?}"));
        }
    }
    let (status, body) = get(daemon, http, &format!("/threads/{thread}/messages")).await;
    if status != 200 {
        lost.push(format!("messages unreadable ({status})"));
        return lost;
    }
    let empty = Vec::new();
    let messages = body["messages"].as_array().unwrap_or(&empty);
    let has_user = messages
        .iter()
        .any(|m| m["id"] == user_id && m["role"] == "user" && m["content"] == text);
    if !has_user {
        lost.push("user message missing".to_owned());
    }
    if point == Point::Terminal {
        for (id, content) in &shown.texts {
            let found = messages
                .iter()
                .any(|m| m["id"] == id.as_str() && m["role"] == "assistant");
            let exact = messages.iter().any(|m| {
                m["id"] == id.as_str()
                    && m["role"] == "assistant"
                    && m["content"] == content.as_str()
            });
            if !found {
                lost.push(format!("assistant reply {id} missing"));
            } else if !exact {
                lost.push(format!("assistant reply {id} stored with other content"));
            }
        }
    }
    if point == Point::Suspended {
        for (id, name, arguments) in &shown.tools {
            let stored = messages
                .iter()
                .filter(|m| m["role"] == "assistant")
                .filter_map(|m| m["toolCalls"].as_array())
                .flatten()
                .find(|c| c["id"] == id.as_str());
            match stored {
                None => lost.push(format!("tool call {name} {id} missing")),
                Some(call)
                    if call["function"]["name"] != name.as_str()
                        || call["function"]["arguments"] != arguments.as_str() =>
                {
                    lost.push(format!("tool call {id} stored as {call}"))
                }
                Some(_) => {}
            }
        }
    }
    if !lost.is_empty() {
        lost.push(format!(
            "[lastRun {last}; stored {} messages; shown {:?}]",
            messages.len(),
            shown.kinds
        ));
    }
    lost
}

/// A background writer: POSTs a multi-MiB user message on a fresh thread, reads the reply to
/// its end, deletes the thread (so the database stays bounded), again, until `stop`.
async fn load(
    id: usize,
    mut base: watch::Receiver<Option<String>>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) {
    let http = http();
    let payload: String = (0..LOAD_MESSAGE_BYTES)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut n = 0u64;
    // Threads of exchanges a kill cut short, deleted once a daemon answers again.
    let mut leftovers: Vec<String> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let current = base.borrow_and_update().clone();
        let Some(base_url) = current else {
            let _ = tokio::time::timeout(Duration::from_millis(50), base.changed()).await;
            continue;
        };
        let mut kept = Vec::new();
        for thread in leftovers.drain(..) {
            let deleted = http
                .delete(format!("{base_url}/threads/{thread}"))
                .bearer_auth(TOKEN)
                .send()
                .await;
            match deleted {
                Ok(r) if r.status() == 204 || r.status() == 404 => {}
                _ => kept.push(thread),
            }
        }
        leftovers = kept;
        n += 1;
        let thread = format!("load-{id}-{n}-{}", uuid::Uuid::new_v4().simple());
        let body = format!(
            r#"{{"threadId":"{thread}","runId":"{thread}-r","protocolVersion":"1.0","messages":[{{"id":"{thread}-u","role":"user","content":"{payload}"}}],"tools":[],"context":[],"state":{{}},"forwardedProps":{{}}}}"#
        );
        let sent = http
            .post(format!("{base_url}/demo"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body)
            .send()
            .await;
        let Ok(mut response) = sent else {
            leftovers.push(thread);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if response.status() != 200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        // The run has started: its multi-MiB message is on its way into the database.
        accepted.fetch_add(1, Ordering::Relaxed);
        let complete = loop {
            match response.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        if complete {
            done.fetch_add(1, Ordering::Relaxed);
        }
        leftovers.push(thread);
    }
}

#[derive(Default)]
struct Tally {
    cycles: [usize; 3],
    lost: [usize; 3],
    failures: Vec<String>,
    run: Duration,
    restart: Duration,
    verify: Duration,
    total: Duration,
    count: usize,
}

impl Tally {
    fn add(&mut self, phase: &str, n: usize, c: &Cycle, total: Duration) {
        let i = c.point.index();
        self.cycles[i] += 1;
        if !c.lost.is_empty() {
            self.lost[i] += 1;
            self.failures.push(format!(
                "{phase} cycle {n} {}: {}",
                c.point.label(),
                c.lost.join("; ")
            ));
        }
        self.run += c.run;
        self.restart += c.restart;
        self.verify += c.verify;
        self.total += total;
        self.count += 1;
    }

    fn summary(&self, phase: &str) -> String {
        let mut out = format!("{phase}: {} cycles", self.count);
        for point in Point::ALL {
            let i = point.index();
            let _ = write!(
                out,
                "; {} lost {}/{}",
                point.label(),
                self.lost[i],
                self.cycles[i]
            );
        }
        let per = |d: Duration| {
            if self.count == 0 {
                0.0
            } else {
                d.as_secs_f64() * 1000.0 / self.count as f64
            }
        };
        let _ = write!(
            out,
            "; {:.1}s total, per cycle {:.0} ms (run {:.0}, restart {:.0}, verify {:.0})",
            self.total.as_secs_f64(),
            per(self.total),
            per(self.run),
            per(self.restart),
            per(self.verify)
        );
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_a_client_was_shown_survives_kill_9() {
    let idle_cycles = env_count("AGUI_CRASH_CYCLES", 200);
    let loaded_cycles = env_count("AGUI_CRASH_LOADED_CYCLES", 100);
    let loaders = env_count("AGUI_CRASH_LOADERS", 3).clamp(2, 4);
    let dirs = Dirs::new();
    let http = http();
    let mut daemon = tokio::task::block_in_place(|| Daemon::start(&dirs));

    let mut idle = Tally::default();
    for n in 0..idle_cycles {
        let begun = Instant::now();
        let point = Point::ALL[n % 3];
        let c = cycle(&mut daemon, &dirs, &http, n, point, None).await;
        idle.add("idle", n, &c, begun.elapsed());
    }
    eprintln!("{}", idle.summary("idle"));

    let mut loaded = Tally::default();
    let mut load_done = 0;
    let mut load_started = 0;
    let mut unloaded = 0;
    if loaded_cycles > 0 {
        let (base_tx, base_rx) = watch::channel(Some(daemon.base.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..loaders)
            .map(|id| {
                tokio::spawn(load(
                    id,
                    base_rx.clone(),
                    stop.clone(),
                    accepted.clone(),
                    done.clone(),
                ))
            })
            .collect();
        // The load is on before the first loaded cycle: one big exchange has gone through.
        let warm = Instant::now();
        while done.load(Ordering::Relaxed) == 0 {
            assert!(
                warm.elapsed() < Duration::from_secs(60),
                "background writers never completed a request"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for n in 0..loaded_cycles {
            let begun = Instant::now();
            // A big exchange has started on this daemon since we last looked: its write is
            // under way when the cycle's run starts.
            let seen = accepted.load(Ordering::Relaxed);
            while accepted.load(Ordering::Relaxed) == seen {
                if begun.elapsed() > Duration::from_secs(10) {
                    unloaded += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let point = Point::ALL[n % 3];
            let c = cycle(&mut daemon, &dirs, &http, n, point, Some(&base_tx)).await;
            loaded.add("loaded", n, &c, begun.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        load_done = done.load(Ordering::Relaxed);
        load_started = accepted.load(Ordering::Relaxed);
        eprintln!(
            "{} ({loaders} writers started {load_started} and completed {load_done} {} MiB \
             exchanges; {unloaded} cycles found no fresh one within 10 s)",
            loaded.summary("loaded"),
            LOAD_MESSAGE_BYTES / (1024 * 1024)
        );
    }
    drop(daemon);

    let keep = std::env::var_os("AGUI_CRASH_KEEP").is_some();
    if !keep {
        let _ = std::fs::remove_dir_all(&dirs.root);
    }
    let failures: Vec<&String> = idle.failures.iter().chain(&loaded.failures).collect();
    let lost_total = failures.len();
    if lost_total > 0 {
        let mut report = format!(
            "{lost_total} cycles lost what the client was shown\n{}\n{} ({load_started} \
             background exchanges started, {load_done} completed)\n",
            idle.summary("idle"),
            loaded.summary("loaded")
        );
        for f in failures.iter().take(30) {
            let _ = writeln!(report, "  {f}");
        }
        if lost_total > 30 {
            let _ = writeln!(report, "  ... and {} more", lost_total - 30);
        }
        if keep {
            let _ = writeln!(report, "data and log kept in {}", dirs.root.display());
        }
        panic!("{report}");
    }
}
