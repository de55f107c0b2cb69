//! Model-based concurrency test: seeded random interleavings of operations on two or three
//! AG-UI threads of one server, issued concurrently (several in flight at once, some streams
//! read to the end, some dropped midway), then checked against a model of what the client
//! saw.
//!
//! Operations: new input (a short reply, `/slow 3 20`, `/slow 10 20`, `/approve X`), attach
//! (the same transcript, no new input), an answer to the pending permission (the client's
//! copy of the assistant tool-call message and a tool message `{"optionId":...}`), a stale or
//! bogus answer, `resume[]` for an interrupt (the third thread's agent is `hitl = interrupt`),
//! cancel, delete, reattach (with and without `Last-Event-ID`), inspect
//! (`GET /threads/{id}`) and restart (stop the server, start a new one on the same data dir).
//!
//! Invariants:
//! 1. At most one live run per thread at every instant. Every segment seen on any stream is
//!    an observation of its run being live over [RUN_STARTED, last frame] (in a malformed
//!    segment, only the frames naming a run count, each for that run at that moment), both
//!    by the server's own event timestamps and by journal sequence. Observations are grouped into
//!    runs (same run id; a resumed segment joins the run whose tool call its
//!    `TOOL_CALL_RESULT` answers). Two runs whose hulls overlap on one thread are two live
//!    runs. Cross-check: `GET /threads/{id}` never says `idle` (or 404) while a run was
//!    certainly live over the whole request.
//! 2. Every 200 stream read to the end is made of whole segments: `RUN_STARTED` first, exactly
//!    one terminal event as the last (a POST stream: exactly one segment), no `RUN_STARTED`
//!    inside; a cut connection only when a restart overlapped the request.
//! 3. Every acknowledged segment (terminal `RUN_FINISHED`, not cancelled) is in the store:
//!    the run's new input and the messages, tool calls and results it showed. Checked right
//!    after a POST stream ends (unless a delete of the thread was in flight or sent
//!    meanwhile) and for every stream at the end of the sequence (unless a delete answered
//!    after the request).
//! 4. After all runs ended (everything cancelled, threads idle), every transcript is a valid
//!    history: every client tool call answered by a later tool message, no duplicate ids.
//! 5. No 5xx, no panics; statuses only from each operation's allowed set (503 and connection
//!    errors only for requests in flight during a restart).
//!
//! `AGUI_MODEL_SEED` (sequence i uses seed + i; printed on failure), `AGUI_MODEL_SEQUENCES`
//! (default 80), `AGUI_MODEL_KEEP_GOING=1` (report every failing sequence, not the first).

mod support;

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agui_serve::config::{AgentConfig, Hitl};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::*;
use tokio::task::JoinSet;

const MAX_IN_FLIGHT: usize = 6;
/// A stream that sends nothing (not even a keep-alive) for this long hangs.
const FRAME_TIMEOUT: Duration = Duration::from_secs(8);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------
// The model: what the client knows about each thread.

/// A wait on the client the model has seen: a permission request (answered with a tool
/// message) or an interrupt (answered with `resume[]`).
#[derive(Debug, Clone)]
struct Pending {
    call_id: String,
    action_id: Option<String>,
    interrupt: bool,
}

struct ThreadModel {
    id: String,
    agent: &'static str,
    /// The client's transcript: messages the server has confirmably taken.
    transcript: Vec<Value>,
    pending: Option<Pending>,
    /// Waits answered (or seen superseded), for stale answers.
    old: Vec<Pending>,
    answered: HashSet<String>,
    /// Every run id seen in a `RUN_STARTED` on this thread (cancel targets).
    run_ids: Vec<String>,
    /// Deletes sent on this thread so far, and those answered (or failed).
    deletes_sent: u64,
    deletes_done: u64,
    /// Streams that start with `RUN_STARTED` (and whether they were read to the end), for
    /// `Last-Event-ID` prefixes.
    cursors: Vec<(Vec<SseFrame>, bool)>,
}

struct StreamRec {
    thread: usize,
    op: usize,
    what: &'static str,
    request_run: Option<String>,
    /// Ids of the new input messages of the request (user message or tool answer).
    new_ids: Vec<String>,
    /// The request was sent at (for a combined reattach: when the prefix's request was).
    since_ms: u64,
    frames: Vec<SseFrame>,
}

struct DeleteRec {
    thread: usize,
    recv_ms: u64,
    /// 204, 404, or `None` (connection failed during a restart: unknown).
    status: Option<u16>,
}

struct InspectRec {
    thread: usize,
    op: usize,
    sent_ms: u64,
    recv_ms: u64,
    /// `None` for 404.
    status: Option<String>,
}

#[derive(Default)]
struct Log {
    streams: Vec<StreamRec>,
    deletes: Vec<DeleteRec>,
    inspects: Vec<InspectRec>,
    trace: Vec<String>,
    violations: Vec<String>,
    statuses: HashMap<String, usize>,
}

struct Shared {
    restarts: AtomicU64,
    threads: Mutex<Vec<ThreadModel>>,
    log: Mutex<Log>,
}

impl Shared {
    fn violation(&self, what: String) {
        let mut log = lock(&self.log);
        log.trace.push(format!("VIOLATION: {what}"));
        log.violations.push(what);
    }

    fn trace(&self, line: String) {
        lock(&self.log).trace.push(line);
    }

    fn count(&self, key: String) {
        *lock(&self.log).statuses.entry(key).or_default() += 1;
    }

    /// A transport failure (or 503) is allowed only when a restart began after the request
    /// was issued (generation `g`).
    fn restarted_since(&self, g: u64) -> bool {
        self.restarts.load(Ordering::SeqCst) != g
    }
}

// ---------------------------------------------------------------------------------------
// Operations.

#[derive(Debug, Clone, Copy)]
enum ReadMode {
    Full,
    /// Drop the stream after this many frames (0: right after the headers).
    DropAfter(usize),
}

enum PostKind {
    NewInput,
    Attach,
    Answer { call_id: String },
    Resume { call_id: String },
}

enum Op {
    Post {
        thread: usize,
        kind: PostKind,
        body: Value,
        new_ids: Vec<String>,
        /// Messages the client adds to its transcript once the server took them.
        adds: Vec<Value>,
        read: ReadMode,
    },
    Cancel {
        thread: usize,
        run_id: String,
    },
    Delete {
        thread: usize,
    },
    Reattach {
        thread: usize,
        cursor: Option<(String, Vec<SseFrame>, bool)>,
        query: bool,
        read: ReadMode,
    },
    Inspect {
        thread: usize,
    },
}

fn body(t: &ThreadModel, run_id: &str, extra: &[Value]) -> Value {
    let mut messages = t.transcript.clone();
    messages.extend(extra.iter().cloned());
    json!({"threadId": t.id, "runId": run_id, "protocolVersion": "1.0", "messages": messages})
}

fn read_mode(rng: &mut StdRng) -> ReadMode {
    if rng.random_bool(0.75) {
        ReadMode::Full
    } else {
        ReadMode::DropAfter(rng.random_range(0..6))
    }
}

/// Picks the next operation (not a restart) from the model.
fn choose(rng: &mut StdRng, threads: &[ThreadModel], n: usize) -> Op {
    let thread = rng.random_range(0..threads.len());
    let t = &threads[thread];
    let run_id = format!("{}-r{n}", t.id);
    let interrupt_agent = t.agent == "demoi";
    let weights: [(u32, u8); 8] = [
        (26, 0),                                   // new input
        (12, 1),                                   // attach
        (if interrupt_agent { 3 } else { 16 }, 2), // answer
        (if interrupt_agent { 14 } else { 0 }, 3), // resume
        (8, 4),                                    // cancel
        (4, 5),                                    // delete
        (14, 6),                                   // reattach
        (8, 7),                                    // inspect
    ];
    let total: u32 = weights.iter().map(|w| w.0).sum();
    let mut pick = rng.random_range(0..total);
    let mut kind = 0;
    for (w, k) in weights {
        if pick < w {
            kind = k;
            break;
        }
        pick -= w;
    }
    match kind {
        0 => {
            let roll = rng.random_range(0..100);
            let text = if roll < 35 {
                format!("hello {n}")
            } else if roll < 65 {
                "/slow 3 20".to_owned()
            } else if roll < 75 {
                "/slow 10 20".to_owned()
            } else {
                format!("/approve deploy-{n}")
            };
            let id = format!("{run_id}-u");
            let user = json!({"id": id, "role": "user", "content": text});
            Op::Post {
                thread,
                kind: PostKind::NewInput,
                body: body(t, &run_id, std::slice::from_ref(&user)),
                new_ids: vec![id],
                adds: vec![user],
                read: read_mode(rng),
            }
        }
        1 => Op::Post {
            thread,
            kind: PostKind::Attach,
            body: body(t, &run_id, &[]),
            new_ids: Vec::new(),
            adds: Vec::new(),
            read: read_mode(rng),
        },
        2 => {
            // The pending permission (genuine), an old one (stale) or an unknown call.
            let genuine = t
                .pending
                .as_ref()
                .filter(|p| !p.interrupt && rng.random_bool(0.85));
            let target = match genuine {
                Some(p) => Some(p.clone()),
                None if !t.old.is_empty() && rng.random_bool(0.7) => {
                    Some(t.old[rng.random_range(0..t.old.len())].clone())
                }
                None => None,
            };
            let option = if rng.random_bool(0.8) {
                "allow"
            } else {
                "deny"
            };
            let tool_id = format!("{run_id}-ans");
            let (call_id, mut extra) = match target.filter(|p| !p.interrupt) {
                Some(p) => {
                    let mut calls = Vec::new();
                    if let Some(action) = &p.action_id {
                        calls.push(json!({"id": action, "type": "function",
                            "function": {"name": "demo_action", "arguments": "{}"}}));
                    }
                    calls.push(json!({"id": p.call_id, "type": "function",
                        "function": {"name": "agui_permission_request", "arguments": "{}"}}));
                    let copy = json!({"id": format!("{}-copy", p.call_id), "role": "assistant",
                        "toolCalls": calls});
                    (p.call_id.clone(), vec![copy])
                }
                None => (format!("perm-bogus-{n}"), Vec::new()),
            };
            extra.push(json!({"id": tool_id, "role": "tool", "toolCallId": call_id,
                "content": json!({"optionId": option}).to_string()}));
            Op::Post {
                thread,
                kind: PostKind::Answer { call_id },
                body: body(t, &run_id, &extra),
                new_ids: vec![tool_id],
                adds: extra,
                read: read_mode(rng),
            }
        }
        3 => {
            let genuine = t
                .pending
                .as_ref()
                .filter(|p| p.interrupt && rng.random_bool(0.85));
            let call_id = match genuine {
                Some(p) => p.call_id.clone(),
                None => {
                    let old: Vec<&Pending> = t.old.iter().filter(|p| p.interrupt).collect();
                    if !old.is_empty() && rng.random_bool(0.7) {
                        old[rng.random_range(0..old.len())].call_id.clone()
                    } else {
                        format!("int-bogus-{n}")
                    }
                }
            };
            let resume = match rng.random_range(0..10) {
                0 => json!({"interruptId": call_id, "status": "cancelled"}),
                1 => {
                    json!({"interruptId": call_id, "status": "resolved", "payload": {"optionId": "deny"}})
                }
                _ => {
                    json!({"interruptId": call_id, "status": "resolved", "payload": {"optionId": "allow"}})
                }
            };
            let mut b = body(t, &run_id, &[]);
            b["resume"] = json!([resume]);
            Op::Post {
                thread,
                kind: PostKind::Resume { call_id },
                body: b,
                new_ids: Vec::new(),
                adds: Vec::new(),
                read: read_mode(rng),
            }
        }
        4 => {
            let run_id = match t.run_ids.len() {
                0 => format!("no-such-run-{n}"),
                len if rng.random_bool(0.7) => t.run_ids[len - 1].clone(),
                len if rng.random_bool(0.8) => t.run_ids[rng.random_range(0..len)].clone(),
                _ => format!("no-such-run-{n}"),
            };
            Op::Cancel { thread, run_id }
        }
        5 => Op::Delete { thread },
        6 => {
            // A position to resume after: a frame whose successor on its stream has
            // another id (preamble frames share the id of the position they describe, so
            // a cursor inside a preamble would skip the rest of it), or the last frame of
            // a stream read to its end.
            let positions: Vec<(usize, usize)> = t
                .cursors
                .iter()
                .enumerate()
                .flat_map(|(s, (frames, complete))| {
                    (0..frames.len())
                        .filter(|&i| match frames.get(i + 1) {
                            Some(next) => next.id != frames[i].id,
                            None => *complete,
                        })
                        .map(move |i| (s, i))
                })
                .collect();
            let cursor = if positions.is_empty() || rng.random_bool(0.4) {
                None
            } else if rng.random_bool(0.1) {
                Some(("1-2-3".to_owned(), Vec::new(), true))
            } else {
                let (s, i) = if rng.random_bool(0.5) {
                    positions[positions.len() - 1]
                } else {
                    positions[rng.random_range(0..positions.len())]
                };
                let frames = &t.cursors[s].0;
                frames[i]
                    .id
                    .clone()
                    .map(|id| (id, frames[..=i].to_vec(), false))
            };
            Op::Reattach {
                thread,
                cursor,
                query: rng.random_bool(0.3),
                read: read_mode(rng),
            }
        }
        _ => Op::Inspect { thread },
    }
}

// ---------------------------------------------------------------------------------------
// Reading streams.

enum Ending {
    /// The body ended.
    Eof,
    /// The client dropped the stream.
    Dropped,
    /// Connection-level failure (or a partial frame at the end of the body).
    Transport(String),
    /// A malformed frame.
    Framing(String),
    /// Nothing arrived for [`FRAME_TIMEOUT`].
    Hung,
}

struct Reader {
    response: reqwest::Response,
    buf: Vec<u8>,
}

enum Next {
    Frame(SseFrame),
    End,
    Transport(String),
    Framing(String),
}

impl Reader {
    async fn next(&mut self) -> Next {
        loop {
            if let Some(end) = support::find(&self.buf, b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                match parse_block(block) {
                    Ok(Block::KeepAlive) => continue,
                    Ok(Block::Frame(frame)) => return Next::Frame(frame),
                    Err(problem) => return Next::Framing(problem),
                }
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) if self.buf.is_empty() => return Next::End,
                Ok(None) => return Next::Transport("partial frame at end of body".to_owned()),
                Err(e) => return Next::Transport(format!("body: {e}")),
            }
        }
    }
}

async fn read_stream(response: reqwest::Response, mode: ReadMode) -> (Vec<SseFrame>, Ending) {
    let mut reader = Reader {
        response,
        buf: Vec::new(),
    };
    let mut frames = Vec::new();
    loop {
        if let ReadMode::DropAfter(n) = mode
            && frames.len() >= n
        {
            return (frames, Ending::Dropped);
        }
        match tokio::time::timeout(FRAME_TIMEOUT, reader.next()).await {
            Err(_) => return (frames, Ending::Hung),
            Ok(Next::Frame(frame)) => frames.push(frame),
            Ok(Next::End) => return (frames, Ending::Eof),
            Ok(Next::Transport(e)) => return (frames, Ending::Transport(e)),
            Ok(Next::Framing(e)) => return (frames, Ending::Framing(e)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// What a stream teaches the model.

fn is_terminal(f: &SseFrame) -> bool {
    matches!(f.kind(), "RUN_FINISHED" | "RUN_ERROR")
}

/// The stream cut into segments: each ends after a terminal event (the last may be open).
fn pieces(frames: &[SseFrame]) -> Vec<&[SseFrame]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, f) in frames.iter().enumerate() {
        if is_terminal(f) {
            out.push(&frames[start..=i]);
            start = i + 1;
        }
    }
    if start < frames.len() {
        out.push(&frames[start..]);
    }
    out
}

fn run_id_of(piece: &[SseFrame]) -> Option<&str> {
    piece
        .first()
        .filter(|f| f.kind() == "RUN_STARTED")
        .and_then(|f| f.data["runId"].as_str())
}

/// A refusal in-band (`SUSPENSION_LOST`, with the thread's messages first;
/// `INVALID_RESUME`): not a run.
fn is_rejection(piece: &[SseFrame]) -> bool {
    let kinds = kinds(piece);
    kinds == ["RUN_STARTED", "RUN_ERROR"]
        || kinds == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_ERROR"]
            && piece[2].data["code"] == "SUSPENSION_LOST"
}

fn is_hydration(piece: &[SseFrame]) -> bool {
    run_id_of(piece).is_some_and(|r| r.starts_with("hydrate-"))
}

/// The arguments of permission call `id`, from its `TOOL_CALL_ARGS` or a messages snapshot.
fn permission_args(frames: &[SseFrame], id: &str) -> Option<Value> {
    let started = frames.iter().any(|f| {
        f.kind() == "TOOL_CALL_START"
            && f.data["toolCallId"] == id
            && f.data["toolCallName"] == "agui_permission_request"
    });
    if started {
        let args: String = frames
            .iter()
            .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == id)
            .filter_map(|f| f.data["delta"].as_str())
            .collect();
        return serde_json::from_str(&args).ok();
    }
    for f in frames.iter().filter(|f| f.kind() == "MESSAGES_SNAPSHOT") {
        for m in f.data["messages"].as_array().into_iter().flatten() {
            for call in m["toolCalls"].as_array().into_iter().flatten() {
                if call["id"] == id && call["function"]["name"] == "agui_permission_request" {
                    return call["function"]["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str(a).ok());
                }
            }
        }
    }
    None
}

fn learn(t: &mut ThreadModel, frames: &[SseFrame]) {
    for f in frames.iter().filter(|f| f.kind() == "RUN_STARTED") {
        if let Some(r) = f.data["runId"].as_str()
            && !r.starts_with("hydrate-")
            && !t.run_ids.iter().any(|x| x == r)
        {
            t.run_ids.push(r.to_owned());
        }
    }
    let Some(last) = frames.last().filter(|f| f.kind() == "RUN_FINISHED") else {
        return;
    };
    let outcome = &last.data["outcome"];
    let mut found = None;
    if outcome["type"] == "interrupt" {
        if let Some(i) = outcome["interrupts"].as_array().and_then(|a| a.first()) {
            found = i["id"].as_str().map(|id| Pending {
                call_id: id.to_owned(),
                action_id: i["toolCallId"].as_str().map(str::to_owned),
                interrupt: true,
            });
        }
    } else if let Some(ids) = outcome["pendingToolCallIds"].as_array() {
        for id in ids.iter().filter_map(Value::as_str) {
            if let Some(args) = permission_args(frames, id) {
                found = Some(Pending {
                    call_id: id.to_owned(),
                    action_id: args["toolCallId"].as_str().map(str::to_owned),
                    interrupt: false,
                });
            }
        }
    }
    let Some(p) = found.filter(|p| !t.answered.contains(&p.call_id)) else {
        return;
    };
    if let Some(old) = t.pending.replace(p.clone())
        && old.call_id != p.call_id
        && !t.old.iter().any(|o| o.call_id == old.call_id)
    {
        t.old.push(old);
    }
}

fn remember_cursor(t: &mut ThreadModel, frames: &[SseFrame], complete: bool) {
    if frames.first().is_some_and(|f| f.kind() == "RUN_STARTED") {
        t.cursors.push((frames.to_vec(), complete));
        if t.cursors.len() > 8 {
            t.cursors.remove(0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Running one operation.

fn allowed(sh: &Shared, g: u64, op: usize, what: &str, status: u16, ok: &[u16]) -> bool {
    sh.count(format!("{what} {status}"));
    if ok.contains(&status) {
        return true;
    }
    if status == 503 && sh.restarted_since(g) {
        return false;
    }
    sh.violation(format!("op #{op} {what}: status {status} not in {ok:?}"));
    false
}

fn transport_error(sh: &Shared, g: u64, op: usize, what: &str, error: String) {
    sh.count(format!("{what} connection-error"));
    if !sh.restarted_since(g) {
        sh.violation(format!(
            "op #{op} {what}: connection failed with no restart: {error}"
        ));
    }
}

/// Checks a stream's frames: whole segments, each `RUN_STARTED` first and exactly one
/// terminal last; a POST stream holds at most one segment. `complete`: read to the end.
fn check_frames(frames: &[SseFrame], complete: bool, single: bool) -> Result<(), String> {
    if frames.is_empty() {
        return if complete {
            Err("empty stream".to_owned())
        } else {
            Ok(())
        };
    }
    let parts = pieces(frames);
    if single && parts.len() > 1 {
        return Err(format!(
            "frames after the terminal event: {:?}",
            kinds(frames)
        ));
    }
    for (i, piece) in parts.iter().enumerate() {
        if piece[0].kind() != "RUN_STARTED" {
            return Err(format!(
                "segment {i} does not start with RUN_STARTED: {:?}",
                kinds(piece)
            ));
        }
        if piece[1..].iter().any(|f| f.kind() == "RUN_STARTED") {
            let runs: Vec<&Value> = piece
                .iter()
                .filter(|f| f.kind() == "RUN_STARTED")
                .map(|f| &f.data["runId"])
                .collect();
            return Err(format!(
                "RUN_STARTED inside segment {i} (runs {runs:?}): {:?}",
                kinds(piece)
            ));
        }

        let closed = piece.last().is_some_and(is_terminal);
        if !closed {
            if complete {
                return Err(format!(
                    "stream ended without a terminal event: {:?}",
                    kinds(frames)
                ));
            }
            continue;
        }
        let owned = piece.to_vec();
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| {
            assert_valid_segment(&owned);
        })) {
            return Err(format!(
                "segment {i} invalid ({}): {:?}",
                panic_text(panic.as_ref()),
                kinds(piece)
            ));
        }
    }
    Ok(())
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "panic".to_owned()
    }
}

/// Classifies how a stream ended; records a violation when it may not end that way.
fn stream_end(sh: &Shared, g: u64, op: usize, what: &str, ending: &Ending) -> bool {
    match ending {
        Ending::Eof => true,
        Ending::Dropped => false,
        Ending::Transport(e) => {
            transport_error(sh, g, op, what, e.clone());
            false
        }
        Ending::Framing(e) => {
            sh.violation(format!("op #{op} {what}: malformed frame: {e}"));
            false
        }
        Ending::Hung => {
            sh.violation(format!(
                "op #{op} {what}: stream sent nothing for {FRAME_TIMEOUT:?}"
            ));
            false
        }
    }
}

async fn run_op(sh: Arc<Shared>, base: String, g: u64, n: usize, op: Op) {
    let http = client();
    match op {
        Op::Post {
            thread,
            kind,
            body,
            new_ids,
            adds,
            read,
        } => {
            // A delete in flight now or sent later may remove what this run stores.
            let (tid, agent, deletes_before) = {
                let threads = lock(&sh.threads);
                let t = &threads[thread];
                let quiet = t.deletes_sent == t.deletes_done;
                (t.id.clone(), t.agent, quiet.then_some(t.deletes_sent))
            };
            let what = match kind {
                PostKind::NewInput => "new-input",
                PostKind::Attach => "attach",
                PostKind::Answer { .. } => "answer",
                PostKind::Resume { .. } => "resume",
            };
            let request_run = body["runId"].as_str().map(str::to_owned);
            let since_ms = now_ms();
            let sent = http
                .post(format!("{base}/{agent}"))
                .bearer_auth(TOKEN)
                .header("accept", "text/event-stream")
                .json(&body)
                .send()
                .await;
            let response = match sent {
                Ok(r) => r,
                Err(e) => {
                    sh.trace(format!("#{n} t{thread} {what} -> error {e}"));
                    return transport_error(&sh, g, n, what, e.to_string());
                }
            };
            let status = response.status().as_u16();
            if status != 200 {
                let text = response.text().await.unwrap_or_default();
                sh.trace(format!("#{n} t{thread} {what} -> {status} {text}"));
                if allowed(&sh, g, n, what, status, &[200, 409])
                    && !text.contains("RUN_IN_PROGRESS")
                {
                    sh.violation(format!("op #{n} {what}: 409 with body {text}"));
                }
                return;
            }
            allowed(&sh, g, n, what, status, &[200, 409]);
            if matches!(kind, PostKind::NewInput) {
                // 200 for a new user message: the server took it.
                lock(&sh.threads)[thread]
                    .transcript
                    .extend(adds.iter().cloned());
            }
            let (frames, ending) = read_stream(response, read).await;
            let complete = stream_end(&sh, g, n, what, &ending);
            sh.trace(format!(
                "#{n} t{thread} {what} {} -> 200 {:?} {}",
                request_run.as_deref().unwrap_or(""),
                kinds(&frames),
                match ending {
                    Ending::Eof => "eof",
                    Ending::Dropped => "dropped",
                    _ => "cut",
                }
            ));
            if let Err(e) = check_frames(&frames, complete, true) {
                sh.violation(format!("op #{n} {what} on {tid}: {e}"));
            }
            {
                let mut threads = lock(&sh.threads);
                let t = &mut threads[thread];
                let own = frames.len() >= 2
                    && run_id_of(&frames) == request_run.as_deref()
                    && !is_rejection(&frames[..2]);
                match &kind {
                    PostKind::Answer { call_id } if own => {
                        t.transcript.extend(adds.iter().cloned());
                        t.answered.insert(call_id.clone());
                        if t.pending.as_ref().is_some_and(|p| &p.call_id == call_id) {
                            let p = t.pending.take();
                            t.old.extend(p);
                        }
                    }
                    PostKind::Resume { call_id } if own => {
                        t.answered.insert(call_id.clone());
                        if t.pending.as_ref().is_some_and(|p| &p.call_id == call_id) {
                            let p = t.pending.take();
                            t.old.extend(p);
                        }
                    }
                    _ => {}
                }
                learn(t, &frames);
                remember_cursor(t, &frames, complete);
            }
            let rec = StreamRec {
                thread,
                op: n,
                what,
                request_run,
                new_ids,
                since_ms,
                frames,
            };
            // 3, right away: what the stream acknowledged is stored, unless a delete of the
            // thread was in flight at the request or sent since.
            if complete && let Some(last) = acknowledged(&rec.frames) {
                let stored = get(&base, &format!("/threads/{tid}/messages?limit=10000")).await;
                let deleted = Some(lock(&sh.threads)[thread].deletes_sent) != deletes_before;
                match stored {
                    _ if deleted => {}
                    Some((200, value)) => {
                        sh.count("acknowledged segment checked at once".to_owned());
                        let messages = value["messages"].as_array().cloned().unwrap_or_default();
                        let missing = missing_from(&rec, &rec.frames, &messages);
                        if !missing.is_empty() {
                            sh.violation(format!(
                                "op #{n} {what} on {tid}: segment acknowledged ({}) but the \
                                 store lacks {missing:?}",
                                last.data
                            ));
                        }
                    }
                    Some((404, _)) => sh.violation(format!(
                        "op #{n} {what} on {tid}: segment acknowledged ({}) but the thread is \
                         gone",
                        last.data
                    )),
                    _ => {}
                }
            }
            lock(&sh.log).streams.push(rec);
        }
        Op::Cancel { thread, run_id } => {
            let r = http
                .post(format!("{base}/runs/{run_id}/cancel"))
                .bearer_auth(TOKEN)
                .send()
                .await;
            match r {
                Ok(r) => {
                    let status = r.status().as_u16();
                    sh.trace(format!("#{n} t{thread} cancel {run_id} -> {status}"));
                    allowed(&sh, g, n, "cancel", status, &[202, 404]);
                }
                Err(e) => transport_error(&sh, g, n, "cancel", e.to_string()),
            }
        }
        Op::Delete { thread } => {
            let tid = {
                let mut threads = lock(&sh.threads);
                threads[thread].deletes_sent += 1;
                threads[thread].id.clone()
            };
            let r = http
                .delete(format!("{base}/threads/{tid}"))
                .bearer_auth(TOKEN)
                .send()
                .await;
            let recv_ms = now_ms();
            lock(&sh.threads)[thread].deletes_done += 1;
            let status = match r {
                Ok(r) => {
                    let status = r.status().as_u16();
                    sh.trace(format!("#{n} t{thread} delete -> {status}"));
                    allowed(&sh, g, n, "delete", status, &[204, 404]);
                    Some(status)
                }
                Err(e) => {
                    transport_error(&sh, g, n, "delete", e.to_string());
                    None
                }
            };
            if status == Some(204) {
                let mut threads = lock(&sh.threads);
                let t = &mut threads[thread];
                t.transcript.clear();
                if let Some(p) = t.pending.take() {
                    t.old.push(p);
                }
            }
            lock(&sh.log).deletes.push(DeleteRec {
                thread,
                recv_ms,
                status,
            });
        }
        Op::Reattach {
            thread,
            cursor,
            query,
            read,
        } => {
            let tid = lock(&sh.threads)[thread].id.clone();
            let mut url = format!("{base}/threads/{tid}/stream");
            let mut request = http.get(&url).bearer_auth(TOKEN);
            if let Some((id, _, _)) = &cursor {
                if query {
                    url = format!("{url}?lastEventId={id}");
                    request = http.get(&url).bearer_auth(TOKEN);
                } else {
                    request = request.header("last-event-id", id);
                }
            }
            let since_ms = now_ms();
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => return transport_error(&sh, g, n, "reattach", e.to_string()),
            };
            let status = response.status().as_u16();
            if !allowed(&sh, g, n, "reattach", status, &[200, 404]) || status != 200 {
                sh.trace(format!("#{n} t{thread} reattach -> {status}"));
                return;
            }
            let resume = response
                .headers()
                .get("agui-resume")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            match (&cursor, resume.as_str()) {
                (None, "exact") | (Some(_), "exact" | "resync") => {}
                _ => sh.violation(format!(
                    "op #{n} reattach: agui-resume {resume:?} for cursor {:?}",
                    cursor.as_ref().map(|c| &c.0)
                )),
            }
            if cursor.as_ref().is_some_and(|c| c.2) && resume != "resync" {
                sh.violation(format!("op #{n} reattach: a bogus id was honoured"));
            }
            let (frames, ending) = read_stream(response, read).await;
            let complete = stream_end(&sh, g, n, "reattach", &ending);
            sh.trace(format!(
                "#{n} t{thread} reattach {} {resume} -> {:?}",
                cursor.as_ref().map_or("-", |c| c.0.as_str()),
                kinds(&frames)
            ));
            // An exact resume continues the stream the id came from.
            let (combined, since_ms) = match cursor {
                Some((_, prefix, false)) if resume == "exact" && !prefix.is_empty() => {
                    let mut all = prefix;
                    all.extend(frames.iter().cloned());
                    (all, 0)
                }
                _ => (frames.clone(), since_ms),
            };
            if let Err(e) = check_frames(&combined, complete, false) {
                sh.violation(format!("op #{n} reattach {resume} on {tid}: {e}"));
            }
            {
                let mut threads = lock(&sh.threads);
                let t = &mut threads[thread];
                learn(t, &frames);
                remember_cursor(t, &frames, complete);
            }
            lock(&sh.log).streams.push(StreamRec {
                thread,
                op: n,
                what: "reattach",
                request_run: None,
                new_ids: Vec::new(),
                since_ms,
                frames: combined,
            });
        }
        Op::Inspect { thread } => {
            let tid = lock(&sh.threads)[thread].id.clone();
            let sent_ms = now_ms();
            let r = http
                .get(format!("{base}/threads/{tid}"))
                .bearer_auth(TOKEN)
                .send()
                .await;
            let r = match r {
                Ok(r) => r,
                Err(e) => return transport_error(&sh, g, n, "inspect", e.to_string()),
            };
            let status = r.status().as_u16();
            if !allowed(&sh, g, n, "inspect", status, &[200, 404]) {
                return;
            }
            let value: Value = r.json().await.unwrap_or(Value::Null);
            let recv_ms = now_ms();
            let shown = (status == 200).then(|| value["status"].as_str().unwrap_or("").to_owned());
            sh.trace(format!("#{n} t{thread} inspect -> {status} {shown:?}"));
            if let Some(s) = &shown
                && !matches!(s.as_str(), "idle" | "running" | "suspended")
            {
                sh.violation(format!("op #{n} inspect: status {s:?}"));
            }
            lock(&sh.log).inspects.push(InspectRec {
                thread,
                op: n,
                sent_ms,
                recv_ms,
                status: shown,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checks at the end of a sequence.

/// One observation of a run being live: a segment (or part of one) on a stream.
struct Obs {
    stream: usize,
    run_id: String,
    ts: (u64, u64),
    /// (epoch, journal tag) and the sequence range, when the ids parse.
    journal: Option<((u64, u32), (u64, u64))>,
    starts: Vec<String>,
    results: Vec<String>,
}

fn parse_id(id: Option<&String>) -> Option<((u64, u32), u64)> {
    let mut parts = id?.split('-');
    let epoch = u64::from_str_radix(parts.next()?, 16).ok()?;
    let tag = u32::from_str_radix(parts.next()?, 16).ok()?;
    let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
    Some(((epoch, tag), seq))
}

fn observations(streams: &[StreamRec], thread: usize) -> Vec<Obs> {
    let mut out = Vec::new();
    for (si, rec) in streams
        .iter()
        .enumerate()
        .filter(|(_, r)| r.thread == thread)
    {
        for piece in pieces(&rec.frames) {
            let Some(run_id) = run_id_of(piece) else {
                continue;
            };
            if is_hydration(piece) || is_rejection(piece) {
                continue;
            }
            // An answer's stream read no further than its RUN_STARTED may be an in-band
            // refusal (whose RUN_ERROR was not read): it says nothing of which run was live.
            if piece.len() == 1 && matches!(rec.what, "answer" | "resume") {
                continue;
            }
            let point = |from: &SseFrame, to: &SseFrame, run_id: &str| -> Option<Obs> {
                let ts = (
                    from.data["timestamp"].as_u64()?,
                    to.data["timestamp"].as_u64()?,
                );
                let journal = match (parse_id(from.id.as_ref()), parse_id(to.id.as_ref())) {
                    (Some((j0, s0)), Some((j1, s1))) if j0 == j1 => Some((j0, (s0, s1))),
                    _ => None,
                };
                Some(Obs {
                    stream: si,
                    run_id: run_id.to_owned(),
                    ts,
                    journal,
                    starts: Vec::new(),
                    results: Vec::new(),
                })
            };
            if piece[1..].iter().any(|f| f.kind() == "RUN_STARTED") {
                // A malformed segment (reported by `check_frames`): only the frames that
                // name their run say which run was live when.
                for f in piece
                    .iter()
                    .filter(|f| matches!(f.kind(), "RUN_STARTED" | "RUN_FINISHED"))
                {
                    if let Some(run_id) = f.data["runId"].as_str() {
                        out.extend(point(f, f, run_id));
                    }
                }
                continue;
            }
            let (Some(first), Some(last)) = (piece.first(), piece.last()) else {
                continue;
            };
            let Some(mut obs) = point(first, last, run_id) else {
                continue;
            };
            let ids = |kind: &str| -> Vec<String> {
                piece
                    .iter()
                    .filter(|f| f.kind() == kind)
                    .filter_map(|f| f.data["toolCallId"].as_str().map(str::to_owned))
                    .collect()
            };
            obs.starts = ids("TOOL_CALL_START");
            obs.results = ids("TOOL_CALL_RESULT");
            out.push(obs);
        }
    }
    out
}

fn find(parent: &mut [usize], i: usize) -> usize {
    let mut i = i;
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// A run as the client can reconstruct it: its observations' hulls.
struct RunHull {
    run_ids: Vec<String>,
    streams: Vec<usize>,
    ts: (u64, u64),
    journals: HashMap<(u64, u32), (u64, u64)>,
}

fn runs(obs: &[Obs]) -> Vec<RunHull> {
    let mut parent: Vec<usize> = (0..obs.len()).collect();
    let mut by_run: HashMap<&str, usize> = HashMap::new();
    let mut by_call: HashMap<&str, usize> = HashMap::new();
    for (i, o) in obs.iter().enumerate() {
        if let Some(&j) = by_run.get(o.run_id.as_str()) {
            let (a, b) = (find(&mut parent, i), find(&mut parent, j));
            parent[a] = b;
        } else {
            by_run.insert(&o.run_id, i);
        }
        for call in &o.starts {
            by_call.entry(call).or_insert(i);
        }
    }
    for (i, o) in obs.iter().enumerate() {
        for call in &o.results {
            if let Some(&j) = by_call.get(call.as_str()) {
                let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                parent[a] = b;
            }
        }
    }
    let mut groups: HashMap<usize, RunHull> = HashMap::new();
    for (i, o) in obs.iter().enumerate() {
        let root = find(&mut parent, i);
        let hull = groups.entry(root).or_insert_with(|| RunHull {
            run_ids: Vec::new(),
            streams: Vec::new(),
            ts: o.ts,
            journals: HashMap::new(),
        });
        if !hull.run_ids.contains(&o.run_id) {
            hull.run_ids.push(o.run_id.clone());
        }
        hull.streams.push(o.stream);
        hull.ts = (hull.ts.0.min(o.ts.0), hull.ts.1.max(o.ts.1));
        if let Some((j, (s0, s1))) = o.journal {
            let e = hull.journals.entry(j).or_insert((s0, s1));
            *e = (e.0.min(s0), e.1.max(s1));
        }
    }
    groups.into_values().collect()
}

/// How much each check looked at (so a vacuous pass shows).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    runs: usize,
    run_pairs: usize,
    idle_inspects: usize,
    acknowledged: usize,
    transcripts: usize,
    client_calls: usize,
}

/// The terminal event of a segment that acknowledges stored content: a `RUN_FINISHED`
/// that is not a cancellation, of a real segment (not a hydration or a suspended run's
/// snapshot).
fn acknowledged(piece: &[SseFrame]) -> Option<&SseFrame> {
    let last = piece.last().filter(|f| f.kind() == "RUN_FINISHED")?;
    let real = last.data["outcome"]["type"] != "cancelled"
        && !is_hydration(piece)
        && kinds(piece) != SNAPSHOT_RUN;
    real.then_some(last)
}

/// What an acknowledged segment showed that `messages` (the stored transcript) lacks: the
/// request's new input (when the segment is the request's own), every completed assistant
/// message (with its text, when the whole message is in the segment), tool call and tool
/// result.
fn missing_from(rec: &StreamRec, piece: &[SseFrame], messages: &[Value]) -> Vec<String> {
    let has = |pred: &dyn Fn(&Value) -> bool| messages.iter().any(pred);
    let mut missing = Vec::new();
    if rec.request_run.as_deref() == run_id_of(piece) {
        for id in &rec.new_ids {
            if !has(&|m| m["id"] == id.as_str()) {
                missing.push(format!("input {id}"));
            }
        }
    }
    for f in piece {
        let field = |k: &str| f.data[k].as_str().unwrap_or("").to_owned();
        match f.kind() {
            "TEXT_MESSAGE_END" => {
                let id = field("messageId");
                let of_id = |g: &&SseFrame| g.data["messageId"] == id.as_str();
                let text: String = piece
                    .iter()
                    .filter(|g| g.kind() == "TEXT_MESSAGE_CONTENT")
                    .filter(of_id)
                    .filter_map(|g| g.data["delta"].as_str())
                    .collect();
                let whole = rec.what != "reattach"
                    && piece
                        .iter()
                        .filter(|g| g.kind() == "TEXT_MESSAGE_START")
                        .any(|g| of_id(&g));
                if !has(&|m| {
                    m["id"] == id.as_str()
                        && m["role"] == "assistant"
                        && (!whole || m["content"] == text.as_str())
                }) {
                    missing.push(format!("assistant message {id} {text:?}"));
                }
            }
            "TOOL_CALL_END" => {
                let id = field("toolCallId");
                if !has(&|m| {
                    m["toolCalls"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["id"] == id.as_str()))
                }) {
                    missing.push(format!("tool call {id}"));
                }
            }
            "TOOL_CALL_RESULT" => {
                let id = field("messageId");
                if !has(&|m| m["id"] == id.as_str() && m["role"] == "tool") {
                    missing.push(format!("tool result {id}"));
                }
            }
            _ => {}
        }
    }
    missing
}

fn check_sequence(
    log: &Log,
    threads: &[ThreadModel],
    finals: &[Option<Value>],
    cov: &mut Coverage,
) -> Vec<String> {
    let mut v = Vec::new();
    for (ti, t) in threads.iter().enumerate() {
        // 1. At most one live run per thread.
        let obs = observations(&log.streams, ti);
        let hulls = runs(&obs);
        cov.runs += hulls.len();
        cov.run_pairs += hulls.len() * hulls.len().saturating_sub(1) / 2;
        let ops_of = |h: &RunHull| -> Vec<usize> {
            let mut ops: Vec<usize> = h.streams.iter().map(|&s| log.streams[s].op).collect();
            ops.sort_unstable();
            ops.dedup();
            ops
        };
        for (i, a) in hulls.iter().enumerate() {
            for b in &hulls[i + 1..] {
                let by_time = a.ts.0 < b.ts.1 && b.ts.0 < a.ts.1;
                let by_seq = a
                    .journals
                    .iter()
                    .any(|(j, x)| b.journals.get(j).is_some_and(|y| x.0 < y.1 && y.0 < x.1));
                if by_time || by_seq {
                    v.push(format!(
                        "two live runs on {}: {:?} live {:?} (ops {:?}) and {:?} live {:?} \
                         (ops {:?}); by time {by_time}, by journal sequence {by_seq}",
                        t.id,
                        a.run_ids,
                        a.ts,
                        ops_of(a),
                        b.run_ids,
                        b.ts,
                        ops_of(b)
                    ));
                }
            }
        }
        for inspect in log.inspects.iter().filter(|i| i.thread == ti) {
            let shown = inspect.status.as_deref().unwrap_or("404");
            if shown != "idle" && shown != "404" {
                continue;
            }
            cov.idle_inspects += 1;
            for h in &hulls {
                if h.ts.0 < inspect.sent_ms && inspect.recv_ms < h.ts.1 {
                    v.push(format!(
                        "op #{} GET /threads/{} said {shown} while run {:?} was live over \
                         {:?} (request {}..{})",
                        inspect.op, t.id, h.run_ids, h.ts, inspect.sent_ms, inspect.recv_ms
                    ));
                }
            }
        }

        // 3. Acknowledged segments are in the store.
        for rec in log.streams.iter().filter(|r| r.thread == ti) {
            let excused = log
                .deletes
                .iter()
                .any(|d| d.thread == ti && d.status != Some(404) && d.recv_ms >= rec.since_ms);
            if excused {
                continue;
            }
            for piece in pieces(&rec.frames) {
                let Some(last) = acknowledged(piece) else {
                    continue;
                };
                let Some(messages) = finals[ti].as_ref().and_then(|m| m.as_array()) else {
                    v.push(format!(
                        "op #{} {}: acknowledged segment {:?} but thread {} is gone",
                        rec.op,
                        rec.what,
                        run_id_of(piece),
                        t.id
                    ));
                    continue;
                };
                cov.acknowledged += 1;
                let missing = missing_from(rec, piece, messages);
                if !missing.is_empty() {
                    v.push(format!(
                        "op #{} {} on {}: segment {:?} acknowledged ({}) but at the end the \
                         store lacks {missing:?}",
                        rec.op,
                        rec.what,
                        t.id,
                        run_id_of(piece),
                        last.data
                    ));
                }
            }
        }

        // 4. Valid histories once everything ended.
        if let Some(messages) = &finals[ti] {
            cov.transcripts += 1;
            cov.client_calls += messages
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|m| m["toolCalls"].as_array().into_iter().flatten())
                .filter(|c| c["function"]["name"] == "agui_permission_request")
                .count();
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| {
                assert_every_client_call_answered(messages);
            })) {
                let text = panic_text(panic.as_ref());
                let head: String = text.chars().take(300).collect();
                v.push(format!("transcript of {}: {head}", t.id));
            }
            let mut ids = HashSet::new();
            for m in messages.as_array().into_iter().flatten() {
                let id = m["id"].as_str().unwrap_or("").to_owned();
                if !ids.insert(id.clone()) {
                    v.push(format!("transcript of {}: message {id} twice", t.id));
                }
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// A sequence.

async fn start_server(dir: &Path) -> TestServer {
    let dir = dir.to_owned();
    let server = TestServer::with(move |c| {
        c.data_dir = dir;
        c.shutdown_grace = Duration::from_millis(600);
        c.disconnect_grace = Duration::from_millis(150);
        c.suspend_timeout = Duration::from_millis(1500);
        c.agents = vec![
            AgentConfig::demo(),
            AgentConfig {
                name: "demoi".to_owned(),
                hitl: Hitl::Interrupt,
                multitask: Default::default(),
                history: Default::default(),
                ..AgentConfig::demo()
            },
        ];
    })
    .await;
    // The helper's own data dir is unused (the config points at `dir`).
    let _ = std::fs::remove_dir_all(&server.data_dir);
    server
}

async fn get(base: &str, path: &str) -> Option<(u16, Value)> {
    let r = client()
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Cancels every live run it can find; `true` when some thread is still not idle.
async fn cancel_busy(sh: &Shared, base: &str) -> bool {
    let threads: Vec<(String, Vec<String>)> = lock(&sh.threads)
        .iter()
        .map(|t| (t.id.clone(), t.run_ids.clone()))
        .collect();
    let mut busy = false;
    for (id, run_ids) in threads {
        let Some((status, value)) = get(base, &format!("/threads/{id}")).await else {
            busy = true;
            continue;
        };
        if status == 404 || value["status"] == "idle" {
            continue;
        }
        busy = true;
        let mut targets = run_ids;
        if let Some(r) = value["lastRun"]["runId"].as_str() {
            targets.push(r.to_owned());
        }
        for r in targets {
            let _ = client()
                .post(format!("{base}/runs/{r}/cancel"))
                .bearer_auth(TOKEN)
                .send()
                .await;
        }
    }
    busy
}

struct Report {
    violations: Vec<String>,
    trace: Vec<String>,
    ops: usize,
    restarts: u64,
    statuses: HashMap<String, usize>,
    coverage: Coverage,
}

async fn sequence(seed: u64) -> Report {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_threads = if rng.random_bool(0.5) { 3 } else { 2 };
    let n_ops = rng.random_range(30..=60);
    let may_restart = rng.random_bool(0.5);
    let dir = temp_dir("model");
    let mut server = Some(start_server(&dir).await);
    let mut base = server.as_ref().map(|s| s.base.clone()).unwrap_or_default();
    let threads = (0..n_threads)
        .map(|k| ThreadModel {
            id: format!("m{seed:x}-{k}"),
            agent: if k == 2 { "demoi" } else { "demo" },
            transcript: Vec::new(),
            pending: None,
            old: Vec::new(),
            answered: HashSet::new(),
            run_ids: Vec::new(),
            deletes_sent: 0,
            deletes_done: 0,
            cursors: Vec::new(),
        })
        .collect();
    let sh = Arc::new(Shared {
        restarts: AtomicU64::new(0),
        threads: Mutex::new(threads),
        log: Mutex::new(Log::default()),
    });
    let mut tasks = JoinSet::new();
    let mut restarts = 0;
    for n in 0..n_ops {
        // Bursts (no pause) make first requests on a new or deleted thread race.
        if !rng.random_bool(0.3) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..15))).await;
        }
        while tasks.len() >= MAX_IN_FLIGHT {
            if let Some(Err(e)) = tasks.join_next().await {
                sh.violation(format!("op task failed: {e}"));
            }
        }
        if may_restart && restarts < 2 && n > 3 && rng.random_bool(0.04) {
            restarts += 1;
            sh.trace(format!("#{n} restart ({} ops in flight)", tasks.len()));
            sh.restarts.fetch_add(1, Ordering::SeqCst);
            if let Some(old) = server.take()
                && tokio::time::timeout(Duration::from_secs(15), old.stop())
                    .await
                    .is_err()
            {
                sh.violation("the server did not stop within 15 s".to_owned());
            }
            let next = start_server(&dir).await;
            base = next.base.clone();
            server = Some(next);
            continue;
        }
        let op = choose(&mut rng, &lock(&sh.threads), n);
        let g = sh.restarts.load(Ordering::SeqCst);
        tasks.spawn(run_op(sh.clone(), base.clone(), g, n, op));
    }

    // Cancel everything and wait for every operation and run to end.
    let done = AtomicU64::new(0);
    let drain = async {
        while let Some(r) = tasks.join_next().await {
            if let Err(e) = r {
                sh.violation(format!("op task failed: {e}"));
            }
        }
        done.store(1, Ordering::SeqCst);
    };
    let settle = async {
        let known: Vec<String> = lock(&sh.threads)
            .iter()
            .flat_map(|t| t.run_ids.clone())
            .collect();
        for r in known {
            let _ = client()
                .post(format!("{base}/runs/{r}/cancel"))
                .bearer_auth(TOKEN)
                .send()
                .await;
        }
        loop {
            let busy = cancel_busy(&sh, &base).await;
            if !busy && done.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    };
    let settled = tokio::time::timeout(Duration::from_secs(40), async {
        tokio::join!(drain, settle);
    })
    .await;
    if settled.is_err() {
        sh.violation("operations or runs did not end within 40 s of cancelling".to_owned());
    }

    let ids: Vec<String> = lock(&sh.threads).iter().map(|t| t.id.clone()).collect();
    let mut finals = Vec::new();
    for id in &ids {
        match get(&base, &format!("/threads/{id}/messages?limit=10000")).await {
            Some((200, value)) => finals.push(Some(value["messages"].clone())),
            Some((404, _)) => finals.push(None),
            other => {
                sh.violation(format!("final GET messages of {id}: {other:?}"));
                finals.push(None);
            }
        }
    }
    let mut coverage = Coverage::default();
    let found = {
        let log = lock(&sh.log);
        let threads = lock(&sh.threads);
        check_sequence(&log, &threads, &finals, &mut coverage)
    };
    for f in found {
        sh.violation(f);
    }
    if let Some(server) = server.take() {
        server.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let log = std::mem::take(&mut *lock(&sh.log));
    Report {
        violations: log.violations,
        trace: log.trace,
        ops: n_ops,
        restarts: restarts as u64,
        statuses: log.statuses,
        coverage,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_interleavings_keep_the_invariants() {
    let seed = env_u64("AGUI_MODEL_SEED").unwrap_or_else(|| rand::random::<u32>() as u64);
    let sequences = env_u64("AGUI_MODEL_SEQUENCES").unwrap_or(80) as usize;
    let keep_going = std::env::var("AGUI_MODEL_KEEP_GOING").is_ok_and(|v| v == "1");
    println!("model test: AGUI_MODEL_SEED={seed} AGUI_MODEL_SEQUENCES={sequences}");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut ops = 0;
    let mut restarts = 0;
    let mut statuses: HashMap<String, usize> = HashMap::new();
    let mut cov = Coverage::default();
    let mut ran = 0;
    for i in 0..sequences {
        ran += 1;
        let s = seed.wrapping_add(i as u64);
        let report = sequence(s).await;
        ops += report.ops;
        let c = report.coverage;
        cov.runs += c.runs;
        cov.run_pairs += c.run_pairs;
        cov.idle_inspects += c.idle_inspects;
        cov.acknowledged += c.acknowledged;
        cov.transcripts += c.transcripts;
        cov.client_calls += c.client_calls;
        restarts += report.restarts;
        for (k, n) in report.statuses {
            *statuses.entry(k).or_default() += n;
        }
        if !report.violations.is_empty() {
            let text = format!(
                "sequence {i} (seed {s}; rerun its op choices with AGUI_MODEL_SEED={s} \
                 AGUI_MODEL_SEQUENCES=1):\n  {}\nop trace:\n  {}",
                report.violations.join("\n  "),
                report.trace.join("\n  ")
            );
            eprintln!("{text}");
            failures.push(text);
            if !keep_going {
                break;
            }
        }
    }
    let mut counts: Vec<_> = statuses.into_iter().collect();
    counts.sort();
    println!(
        "model test: {ops} operations in {ran} sequences, {restarts} restarts, {:?}\n  \
         statuses {counts:?}\n  checked {cov:?}",
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "AGUI_MODEL_SEED={seed}: {} failing sequence(s); first:\n{}",
        failures.len(),
        failures[0]
    );
}
