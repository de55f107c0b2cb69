//! A load client for a running agui-serve daemon (or a baseline server that mimics its demo
//! agent: examples/bare_sse.rs, bench/node/server.mjs), used by `scripts/bench.sh`.
//!
//! It drives the built-in `demo` agent over plain HTTP (HTTP/1.1, one connection per
//! stream, unless `--http2`) and prints one JSON line per measurement on stdout:
//!
//! | scenario | what it measures |
//! |---|---|
//! | `one-stream` | events/s of single runs, one after another, that stream many events with no delay (the demo's echo: one `TEXT_MESSAGE_CONTENT` per word of the user message; `/slow N 0` is not unpaced: each chunk still waits a timer tick, about 1 ms) |
//! | `concurrent` | total events/s of `--concurrency` runs started together |
//! | `ttfe` | time to the first event (`RUN_STARTED`) and to the end of the stream, over `--runs` sequential short runs, each on a fresh thread, idle daemon; and those runs per second (`--runs` over the time they took together) |
//! | `storm` | `--storm-streams` short runs started together, each on a fresh thread and (past the kept connections) a new connection: time to the first event and to the end of the stream, p50 and p99 in ms, and how many streams were incomplete |
//! | `paced` | `--paced-streams` runs started together, each `/slow N MS` (steady paced chunks): the gaps between the arrivals of consecutive `TEXT_MESSAGE_CONTENT` events of one stream, pooled over all streams, p50 and p99 in ms, and how many streams were incomplete |
//! | `idle` | memory per idle stream, for each N of `--idle-streams`: the server's RSS before, then N open streams of `/slow 2 60000` (the first chunk, then a minute of silence), the RSS once every stream got its first `TEXT_MESSAGE_CONTENT`; (after - before) / N in kB. Then every connection is dropped (and, before a next N, `--idle-settle` is waited) |
//! | `rss-after` | the server's RSS after `--rss-runs` finished runs of about `--rss-events` events each, `--rss-parallel` at a time, read after the last stream ended; its peak RSS (VmHWM); its RSS again after `--rss-wait` seconds (MiB) |
//! | `all` | all of them, in that order |
//! | `agent-turns` | not in `all`: an ACP agent (`--agent`) on a model scripted to answer "bench-turn" (`scripts/bench.sh` sets it up): after `--settle` seconds, `--turn-threads` new threads, one after the other, each a first turn then `--warm-turns` turns; time to the first event, to the first text delta and to the end of the stream, medians per kind of turn. The conversations go to `--turns-file` |
//! | `agent-parallel` | not in `all`: an ACP agent on the same scripted model: for each of `--parallel-threads` (1, 5, 20), that many new threads at once, each a first turn then `--warm-turns` turns; first text p50/p99 and whole turn of first and warm turns, the daemon's and the agent processes' CPU per turn apart (from `/proc`, `--pid` and its descendants), the agents' proportional set size (shared pages counted once) per thread, the daemon's growth per live thread and, after `--idle-wait`, the agent processes left |
//! | `agent-restart` | not in `all`: the conversations of `--turns-file` on a restarted daemon: after `--settle` seconds, each thread's next turn, the same times |
//!
//! A `tcp://HOST:PORT` URL names the raw TCP baseline (`examples/bare_sse.rs --mode
//! raw-tcp`, no HTTP): the same runs and the same counting of the stream's bytes, for
//! `one-stream` and `concurrent`.
//!
//! `--scenario` takes a comma-separated list. With `--pid` (the server's process id) it
//! also reads the server's CPU time (its process CPU-time clock, all its threads) around
//! `one-stream`, `concurrent` and `ttfe` and reports CPU seconds per million events (per
//! run for `ttfe`); `idle` and `rss-after` need `--pid` (they read `/proc/<pid>/status`).
//!
//! Run: `cargo run --release --example loadgen -- --url http://127.0.0.1:PORT/agui
//! --token TOKEN --scenario all --pid PID`. agui-serve needs `--max-concurrent-runs` above
//! the largest number of runs at once (its default is 64), and both processes need a file
//! descriptor limit (`ulimit -n`) above the largest `--idle-streams`. agui-serve keeps a run
//! alive for its disconnect grace (30 s by default) after its client left: to measure
//! several idle levels on one daemon, start it with `--disconnect-grace 1s` (or measure
//! each level on a fresh daemon, as `scripts/bench.sh` does).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    OneStream,
    Concurrent,
    Ttfe,
    Storm,
    Paced,
    Idle,
    RssAfter,
    /// Not in `all`: needs an ACP agent on a scripted model (see [`agent_turns`]).
    AgentTurns,
    /// Not in `all`: the second half of `agent-turns`, on a restarted daemon.
    AgentRestart,
    /// Not in `all`: threads taking turns at once on an ACP agent (see [`agent_parallel`]).
    AgentParallel,
    All,
}

impl Scenario {
    /// Every scenario, in the order `all` runs them.
    const EVERY: [Scenario; 7] = [
        Scenario::OneStream,
        Scenario::Concurrent,
        Scenario::Ttfe,
        Scenario::Storm,
        Scenario::Paced,
        Scenario::Idle,
        Scenario::RssAfter,
    ];
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Load client for agui-serve: one JSON line per measurement")]
struct Args {
    /// Base URL of the daemon's route namespace, e.g. http://127.0.0.1:8080/agui; or
    /// tcp://HOST:PORT, the raw TCP baseline (`bare_sse --mode raw-tcp`: one-stream and
    /// concurrent only).
    #[arg(long)]
    url: String,
    /// Bearer token.
    #[arg(long)]
    token: String,
    /// Agent name (a demo-kind agent).
    #[arg(long, default_value = "demo")]
    agent: String,
    /// Scenarios to run, comma-separated, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    scenario: Vec<Scenario>,
    /// The daemon's process id, to report its CPU time.
    #[arg(long)]
    pid: Option<u32>,
    /// Clock ticks per second of /proc/<pid>/stat (`getconf CLK_TCK`), read where the
    /// process's CPU-time clock cannot be.
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// Copied into every output line (e.g. which binary).
    #[arg(long, default_value = "")]
    label: String,
    /// Copied into every output line.
    #[arg(long, default_value_t = 0)]
    round: u32,
    /// one-stream: text deltas per run (words of the echoed message). The default keeps a
    /// run (deltas + 7 frames) inside the daemon's 4096-frame journal window: an unpaced
    /// run longer than that can outrun a reader, which is then cut ("fell behind the
    /// journal window") and counted as incomplete.
    #[arg(long, default_value_t = 4_000)]
    stream_events: usize,
    /// one-stream: sequential runs measured together.
    #[arg(long, default_value_t = 25)]
    stream_repeat: usize,
    /// concurrent: runs at once.
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// concurrent: text deltas per run.
    #[arg(long, default_value_t = 1_000)]
    concurrent_events: usize,
    /// concurrent: waves of `concurrency` runs, measured together.
    #[arg(long, default_value_t = 3)]
    waves: usize,
    /// ttfe: measured sequential runs.
    #[arg(long, default_value_t = 500)]
    runs: usize,
    /// storm: short runs started at once.
    #[arg(long, default_value_t = 500)]
    storm_streams: usize,
    /// paced: runs at once.
    #[arg(long, default_value_t = 500)]
    paced_streams: usize,
    /// paced: chunks per run.
    #[arg(long, default_value_t = 40)]
    paced_chunks: u64,
    /// paced: milliseconds between two chunks of a run.
    #[arg(long, default_value_t = 25)]
    paced_interval_ms: u64,
    /// idle: numbers of open streams measured, one after the other (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2000,10000")]
    idle_streams: Vec<usize>,
    /// idle: streams being opened at once (each waits for its first text delta).
    #[arg(long, default_value_t = 200)]
    idle_opening: usize,
    /// idle: seconds allowed to open all the streams of one level.
    #[arg(long, default_value_t = 120.0)]
    idle_timeout: f64,
    /// idle: seconds waited after dropping the streams of one level before the next.
    #[arg(long, default_value_t = 3.0)]
    idle_settle: f64,
    /// rss-after: finished runs before the reading.
    #[arg(long, default_value_t = 1_000)]
    rss_runs: usize,
    /// rss-after: text deltas per run (the run has 7 more events).
    #[arg(long, default_value_t = 4_000)]
    rss_events: usize,
    /// rss-after: runs at a time.
    #[arg(long, default_value_t = 4)]
    rss_parallel: usize,
    /// rss-after: seconds between the first and the last reading.
    #[arg(long, default_value_t = 3.0)]
    rss_wait: f64,
    /// Unmeasured runs before each scenario.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// agent-turns: conversations (threads), each a first turn then `--warm-turns` turns.
    #[arg(long, default_value_t = 3)]
    turn_threads: usize,
    /// agent-turns: turns after a thread's first, on the live agent process and session.
    #[arg(long, default_value_t = 3)]
    warm_turns: usize,
    /// agent-turns: where the conversations are written; agent-restart: where they are read.
    #[arg(long)]
    turns_file: Option<std::path::PathBuf>,
    /// agent-turns, agent-restart: seconds a turn may take.
    #[arg(long, default_value_t = 120.0)]
    turn_timeout: f64,
    /// agent-turns, agent-restart: a word in the measures' names after `agent_`
    /// (`--turns-tag cold` reports `agent_cold_warm_turn_ms`, ...), to tell configurations
    /// apart.
    #[arg(long)]
    turns_tag: Option<String>,
    /// agent-turns, agent-restart: seconds to wait before the first turn (a daemon just
    /// started makes what it keeps warm meanwhile).
    #[arg(long, default_value_t = 0.0)]
    settle: f64,
    /// agent-parallel: how many threads take their turns at once, one measure per count.
    #[arg(long, value_delimiter = ',', default_value = "1,5,20")]
    parallel_threads: Vec<usize>,
    /// agent-parallel: seconds to wait after the last turn for the agent's idle sessions to
    /// be closed (its `session_ttl` and a margin), before counting its processes.
    #[arg(long, default_value_t = 0.0)]
    idle_wait: f64,
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long)]
    http2: bool,
}

/// What one run's stream looked like.
#[derive(Debug)]
struct RunStats {
    events: u64,
    first_type: String,
    last_type: String,
    /// From sending the request to the arrival of the first event.
    first_event: Duration,
    /// From sending the request to the arrival of the first `TEXT_MESSAGE_CONTENT`.
    first_content: Option<Duration>,
    /// From sending the request to the end of the stream.
    total: Duration,
    /// Arrival of each `TEXT_MESSAGE_CONTENT`, when asked for.
    content_at: Vec<Instant>,
}

impl RunStats {
    fn complete(&self) -> bool {
        self.first_type == "RUN_STARTED" && self.last_type == "RUN_FINISHED"
    }
}

/// Counts SSE events (`data:` lines) and keeps the start of the first and last one.
struct SseCounter {
    line: Vec<u8>,
    last_data: Vec<u8>,
    events: u64,
    first_type: Option<String>,
    first_at: Option<Instant>,
    /// Arrival of the first `TEXT_MESSAGE_CONTENT`.
    first_content_at: Option<Instant>,
    /// Arrival of every `TEXT_MESSAGE_CONTENT`, if kept.
    content_at: Option<Vec<Instant>>,
}

/// Bytes of a `data:` line kept: enough to hold `"type":"..."`, which serde writes first.
const KEEP: usize = 96;

const CONTENT: &str = "TEXT_MESSAGE_CONTENT";

impl SseCounter {
    fn new(keep_content_times: bool) -> SseCounter {
        SseCounter {
            line: Vec::with_capacity(KEEP),
            last_data: Vec::with_capacity(KEEP),
            events: 0,
            first_type: None,
            first_at: None,
            first_content_at: None,
            content_at: keep_content_times.then(Vec::new),
        }
    }

    fn feed(&mut self, chunk: &[u8], now: Instant) {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            self.keep(&rest[..end]);
            self.end_line(now);
            rest = &rest[end + 1..];
        }
        self.keep(rest);
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = KEEP.saturating_sub(self.line.len());
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn end_line(&mut self, now: Instant) {
        if self.line.starts_with(b"data:") {
            self.events += 1;
            if self.first_type.is_none() {
                self.first_type = Some(event_type(&self.line));
                self.first_at = Some(now);
            }
            if (self.first_content_at.is_none() || self.content_at.is_some())
                && is_type(&self.line, CONTENT)
            {
                self.first_content_at.get_or_insert(now);
                if let Some(times) = &mut self.content_at {
                    times.push(now);
                }
            }
            std::mem::swap(&mut self.line, &mut self.last_data);
        }
        self.line.clear();
    }
}

/// The `"type":"..."` value of a kept `data:` line.
fn type_of(line: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"type\":\"";
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &line[at..];
    let end = rest.iter().position(|&b| b == b'"')?;
    Some(&rest[..end])
}

fn is_type(line: &[u8], ty: &str) -> bool {
    type_of(line) == Some(ty.as_bytes())
}

fn event_type(line: &[u8]) -> String {
    type_of(line).map_or_else(
        || "?".to_owned(),
        |ty| String::from_utf8_lossy(ty).into_owned(),
    )
}

struct Client {
    http: reqwest::Client,
    endpoint: String,
    token: String,
    /// Set for a raw TCP baseline (a `tcp://` URL): runs go over it instead of HTTP.
    raw: Option<RawTcp>,
}

/// The JSON input of a run on a fresh thread whose user message is `text`.
fn run_input(text: &str) -> Value {
    let id = uuid::Uuid::new_v4();
    json!({
        "threadId": format!("bench-{id}"),
        "runId": format!("run-{id}"),
        "messages": [{"id": format!("m-{id}"), "role": "user", "content": text}],
    })
}

impl Client {
    /// Starts one run on a fresh thread whose user message is `text`: the response, once
    /// its status says it streams.
    async fn start(&self, text: &str) -> Result<reqwest::Response, String> {
        self.start_with(&run_input(text)).await
    }

    /// Starts one run with the JSON input `body`.
    async fn start_with(&self, body: &Value) -> Result<reqwest::Response, String> {
        if self.raw.is_some() {
            return Err(
                "a raw TCP baseline serves only whole runs (one-stream, concurrent)".into(),
            );
        }
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let response = self
            .http
            .post(&self.endpoint)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("request failed: {e:?}"))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("status {status}: {text}"));
        }
        Ok(response)
    }

    /// One run with the JSON input `body`, read to the end.
    async fn run_with(&self, body: &Value) -> Result<RunStats, String> {
        let started = Instant::now();
        let response = self.start_with(body).await?;
        read_stream(response, started, false).await
    }

    /// One run whose user message is `text`, read to the end.
    async fn run(&self, text: &str) -> Result<RunStats, String> {
        self.run_timed(text, false).await
    }

    /// One run, read to the end, keeping the arrival of each text delta if asked.
    async fn run_timed(&self, text: &str, content_times: bool) -> Result<RunStats, String> {
        if let Some(raw) = &self.raw {
            return raw.run(&run_input(text), content_times).await;
        }
        let started = Instant::now();
        let response = self.start(text).await?;
        read_stream(response, started, content_times).await
    }
}

/// A run's stream, read to the end; `started` is when its request was sent.
async fn read_stream(
    response: reqwest::Response,
    started: Instant,
    content_times: bool,
) -> Result<RunStats, String> {
    let mut counter = SseCounter::new(content_times);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("stream failed: {e:?}"))?;
        counter.feed(&chunk, Instant::now());
    }
    Ok(counter.stats(started))
}

impl SseCounter {
    /// What the stream looked like, read from `started` to now.
    fn stats(self, started: Instant) -> RunStats {
        let total = started.elapsed();
        RunStats {
            events: self.events,
            first_type: self.first_type.unwrap_or_default(),
            last_type: event_type(&self.last_data),
            first_event: self.first_at.map_or(total, |at| at.duration_since(started)),
            first_content: self.first_content_at.map(|at| at.duration_since(started)),
            total,
            content_at: self.content_at.unwrap_or_default(),
        }
    }
}

/// The raw TCP baseline's client (`examples/bare_sse.rs --mode raw-tcp`): a run is its
/// JSON input on one line, answered with the length of its frames (8 bytes, big-endian)
/// and the frames, read with the same counter as an HTTP stream. Connections are kept and
/// reused, as the HTTP client keeps its connections.
struct RawTcp {
    addr: String,
    idle: std::sync::Mutex<Vec<tokio::net::TcpStream>>,
}

/// Bytes read at most per read from a raw TCP baseline.
const RAW_READ: usize = 64 * 1024;

impl RawTcp {
    async fn run(&self, input: &Value, content_times: bool) -> Result<RunStats, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut line = serde_json::to_vec(input).map_err(|e| e.to_string())?;
        line.push(b'\n');
        let started = Instant::now();
        let kept = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        let mut conn = match kept {
            Some(conn) => conn,
            None => {
                let conn = tokio::net::TcpStream::connect(&self.addr)
                    .await
                    .map_err(|e| format!("connect {}: {e}", self.addr))?;
                conn.set_nodelay(true).map_err(|e| e.to_string())?;
                conn
            }
        };
        let failed = |e: std::io::Error| format!("raw tcp: {e}");
        conn.write_all(&line).await.map_err(failed)?;
        let mut left = conn.read_u64().await.map_err(failed)?;
        let mut counter = SseCounter::new(content_times);
        let mut buf = vec![0u8; RAW_READ];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = conn.read(&mut buf[..want]).await.map_err(failed)?;
            if n == 0 {
                return Err("raw tcp: the server closed mid-run".to_owned());
            }
            counter.feed(&buf[..n], Instant::now());
            left -= n as u64;
        }
        let stats = counter.stats(started);
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(conn);
        Ok(stats)
    }
}

/// The echoed message: "You said: " then `words` one-word deltas.
fn words(n: usize) -> String {
    let mut text = String::with_capacity(n * 5);
    for i in 0..n {
        if i > 0 {
            text.push(' ');
        }
        text.push_str("word");
    }
    text
}

/// Daemon CPU seconds so far (user + system, all threads, living or not): its CPU-time
/// clock (`clock_getcpuclockid`), to the nanosecond; where that clock cannot be read,
/// `/proc/<pid>/stat`'s clock ticks (10 ms, too coarse for a quick run's short measures).
fn cpu_seconds(pid: u32, clk_tck: u64) -> Option<f64> {
    let process = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
    if let Ok(time) = nix::time::clock_getcpuclockid(process).and_then(nix::time::clock_gettime) {
        return Some(time.tv_sec() as f64 + time.tv_nsec() as f64 * 1e-9);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces):
    // state is field 3, utime field 14, stime field 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clk_tck as f64)
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in kB.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        value.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

fn rss_kb(args: &Args) -> Result<u64, String> {
    let pid = args.pid.ok_or("needs --pid")?;
    status_kb(pid, "VmRSS").ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))
}

struct Report<'a> {
    args: &'a Args,
}

impl Report<'_> {
    fn line(&self, scenario: &str, measure: &str, value: f64, unit: &str, extra: Value) {
        let mut line = json!({
            "label": self.args.label,
            "round": self.args.round,
            "scenario": scenario,
            "measure": measure,
            "value": value,
            "unit": unit,
        });
        if let (Some(line), Value::Object(extra)) = (line.as_object_mut(), extra) {
            line.extend(extra);
        }
        println!("{line}");
    }
}

/// Percentile `p` (0..=100) of sorted `values`, nearest rank.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn warm(client: &Client, n: usize) -> Result<(), String> {
    for _ in 0..n {
        client.run("warm up").await?;
    }
    Ok(())
}

/// The raw TCP baseline encodes a request text's frames once, at its first run: one
/// unmeasured run of `text` there, so that no measured run pays for it.
async fn prime(client: &Client, text: &str) -> Result<(), String> {
    if client.raw.is_some() {
        client.run(text).await?;
    }
    Ok(())
}

async fn one_stream(args: &Args, client: &Client, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let text = words(args.stream_events);
    prime(client, &text).await?;
    let cpu_before = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    let (mut events, mut busy, mut incomplete, mut min_ttfe) = (0u64, Duration::ZERO, 0, None);
    for _ in 0..args.stream_repeat {
        let stats = client.run(&text).await?;
        events += stats.events;
        busy += stats.total;
        incomplete += usize::from(!stats.complete());
        min_ttfe = Some(min_ttfe.map_or(stats.first_event, |m: Duration| m.min(stats.first_event)));
    }
    let cpu_after = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    let extra = json!({
        "events": events,
        "runs": args.stream_repeat,
        "incomplete": incomplete,
        "seconds": busy.as_secs_f64(),
    });
    report.line(
        "one-stream",
        "one_stream_events_per_s",
        events as f64 / busy.as_secs_f64(),
        "events/s",
        extra.clone(),
    );
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        report.line(
            "one-stream",
            "one_stream_cpu_s_per_M_events",
            (after - before) / events as f64 * 1e6,
            "cpu s/1M events",
            extra,
        );
    }
    Ok(())
}

async fn concurrent(args: &Args, client: &Arc<Client>, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let text = Arc::new(words(args.concurrent_events));
    prime(client, &text).await?;
    let cpu_before = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    let (mut events, mut busy, mut incomplete, mut failed) = (0u64, Duration::ZERO, 0, 0);
    let mut first_error = None;
    for _ in 0..args.waves {
        let barrier = Arc::new(tokio::sync::Barrier::new(args.concurrency + 1));
        let mut tasks = Vec::with_capacity(args.concurrency);
        for _ in 0..args.concurrency {
            let (client, text, barrier) = (client.clone(), text.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                client.run(&text).await
            }));
        }
        barrier.wait().await;
        let started = Instant::now();
        for task in tasks {
            match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
                Ok(stats) => {
                    events += stats.events;
                    incomplete += usize::from(!stats.complete());
                }
                Err(error) => {
                    failed += 1;
                    first_error.get_or_insert(error);
                }
            }
        }
        busy += started.elapsed();
    }
    let cpu_after = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    let extra = json!({
        "events": events,
        "runs": args.concurrency * args.waves,
        "incomplete": incomplete,
        "failed": failed,
        "first_error": first_error,
        "seconds": busy.as_secs_f64(),
    });
    report.line(
        "concurrent",
        "concurrent_events_per_s",
        events as f64 / busy.as_secs_f64(),
        "events/s",
        extra.clone(),
    );
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        report.line(
            "concurrent",
            "concurrent_cpu_s_per_M_events",
            (after - before) / events as f64 * 1e6,
            "cpu s/1M events",
            extra,
        );
    }
    Ok(())
}

async fn ttfe(args: &Args, client: &Client, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let cpu_before = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    let mut first = Vec::with_capacity(args.runs);
    let mut total = Vec::with_capacity(args.runs);
    let mut incomplete = 0;
    let started = Instant::now();
    for _ in 0..args.runs {
        let stats = client.run("hello").await?;
        incomplete += usize::from(!stats.complete());
        first.push(stats.first_event.as_secs_f64() * 1e3);
        total.push(stats.total.as_secs_f64() * 1e3);
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = args.pid.and_then(|pid| cpu_seconds(pid, args.clk_tck));
    first.sort_by(f64::total_cmp);
    total.sort_by(f64::total_cmp);
    let extra = json!({"runs": args.runs, "incomplete": incomplete});
    for (measure, sorted, p) in [
        ("ttfe_p50_ms", &first, 50.0),
        ("ttfe_p99_ms", &first, 99.0),
        ("run_p50_ms", &total, 50.0),
        ("run_p99_ms", &total, 99.0),
    ] {
        report.line("ttfe", measure, percentile(sorted, p), "ms", extra.clone());
    }
    report.line(
        "ttfe",
        "short_runs_per_s",
        args.runs as f64 / seconds,
        "runs/s",
        extra.clone(),
    );
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        report.line(
            "ttfe",
            "ttfe_cpu_ms_per_run",
            (after - before) / args.runs as f64 * 1e3,
            "cpu ms/run",
            extra,
        );
    }
    Ok(())
}

async fn storm(args: &Args, client: &Arc<Client>, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let n = args.storm_streams;
    let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, barrier) = (client.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.run("hello").await
        }));
    }
    barrier.wait().await;
    let (mut first, mut total) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut incomplete, mut failed, mut first_error) = (0, 0, None);
    for task in tasks {
        match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(stats) => {
                incomplete += usize::from(!stats.complete());
                first.push(stats.first_event.as_secs_f64() * 1e3);
                total.push(stats.total.as_secs_f64() * 1e3);
            }
            Err(error) => {
                failed += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    first.sort_by(f64::total_cmp);
    total.sort_by(f64::total_cmp);
    let extra = json!({
        "streams": n,
        "incomplete": incomplete,
        "failed": failed,
        "first_error": first_error,
    });
    for (measure, sorted, p) in [
        ("storm_ttfe_p50_ms", &first, 50.0),
        ("storm_ttfe_p99_ms", &first, 99.0),
        ("storm_run_p99_ms", &total, 99.0),
    ] {
        report.line("storm", measure, percentile(sorted, p), "ms", extra.clone());
    }
    report.line(
        "storm",
        "storm_incomplete_streams",
        (incomplete + failed) as f64,
        "streams",
        extra,
    );
    Ok(())
}

async fn paced(args: &Args, client: &Arc<Client>, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let text = Arc::new(format!(
        "/slow {} {}",
        args.paced_chunks, args.paced_interval_ms
    ));
    let n = args.paced_streams;
    let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, text, barrier) = (client.clone(), text.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.run_timed(&text, true).await
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let (mut gaps, mut incomplete, mut failed, mut first_error) = (Vec::new(), 0, 0, None);
    for task in tasks {
        match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(stats) => {
                let whole = stats.content_at.len() as u64 == args.paced_chunks;
                incomplete += usize::from(!stats.complete() || !whole);
                gaps.extend(
                    stats
                        .content_at
                        .windows(2)
                        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e3),
                );
            }
            Err(error) => {
                failed += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    gaps.sort_by(f64::total_cmp);
    let extra = json!({
        "streams": n,
        "chunks": args.paced_chunks,
        "interval_ms": args.paced_interval_ms,
        "gaps": gaps.len(),
        "gap_max_ms": gaps.last().copied().unwrap_or(f64::NAN),
        "incomplete": incomplete,
        "failed": failed,
        "first_error": first_error,
        "seconds": seconds,
    });
    for (measure, p) in [("paced_gap_p50_ms", 50.0), ("paced_gap_p99_ms", 99.0)] {
        report.line("paced", measure, percentile(&gaps, p), "ms", extra.clone());
    }
    report.line(
        "paced",
        "paced_incomplete_streams",
        (incomplete + failed) as f64,
        "streams",
        extra,
    );
    Ok(())
}

/// What became of one idle stream.
enum Idle {
    /// Its first text delta came; it stays open until told to stop.
    Open,
    Failed(String),
}

async fn idle(args: &Args, client: &Arc<Client>, report: &Report<'_>) -> Result<(), String> {
    for (level, &n) in args.idle_streams.iter().enumerate() {
        if level > 0 {
            tokio::time::sleep(Duration::from_secs_f64(args.idle_settle)).await;
        }
        idle_level(args, client, report, n).await?;
    }
    Ok(())
}

/// `n` streams held open at once, each past its first text delta: the server's RSS growth.
async fn idle_level(
    args: &Args,
    client: &Arc<Client>,
    report: &Report<'_>,
    n: usize,
) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let before = rss_kb(args)?;
    let text = Arc::new("/slow 2 60000".to_owned());
    let opening = Arc::new(tokio::sync::Semaphore::new(args.idle_opening.max(1)));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
    // Streams that ended while they should have been held open.
    let ended = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, text, opening) = (client.clone(), text.clone(), opening.clone());
        let (ready_tx, ended) = (ready_tx.clone(), ended.clone());
        tasks.push(tokio::spawn(async move {
            let permit = opening.acquire_owned().await;
            let mut stream = match client.start(&text).await {
                Ok(response) => response.bytes_stream(),
                Err(error) => {
                    let _ = ready_tx.send(Idle::Failed(error));
                    return;
                }
            };
            let mut counter = SseCounter::new(false);
            while counter.first_content_at.is_none() {
                match stream.next().await {
                    Some(Ok(chunk)) => counter.feed(&chunk, Instant::now()),
                    Some(Err(error)) => {
                        let _ = ready_tx.send(Idle::Failed(format!("stream failed: {error:?}")));
                        return;
                    }
                    None => {
                        let _ = ready_tx.send(Idle::Failed(
                            "the stream ended before its first text delta".to_owned(),
                        ));
                        return;
                    }
                }
            }
            drop(permit);
            let _ = ready_tx.send(Idle::Open);
            // Held open (and read) until aborted, which drops the connection.
            while let Some(Ok(_)) = stream.next().await {}
            ended.fetch_add(1, Ordering::Relaxed);
        }));
    }
    drop(ready_tx);
    let (mut open, mut failed, mut first_error) = (0usize, 0usize, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.idle_timeout);
    while open + failed < n {
        match tokio::time::timeout_at(deadline, ready_rx.recv()).await {
            Ok(Some(Idle::Open)) => open += 1,
            Ok(Some(Idle::Failed(error))) => {
                failed += 1;
                first_error.get_or_insert(error);
            }
            Ok(None) => break,
            Err(_) => {
                first_error.get_or_insert(format!(
                    "{} streams still opening after {} s",
                    n - open - failed,
                    args.idle_timeout
                ));
                break;
            }
        }
    }
    let open_seconds = started.elapsed().as_secs_f64();
    let after = rss_kb(args)?;
    let ended_early = ended.load(Ordering::Relaxed);
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
    let extra = json!({
        "streams": n,
        "open": open,
        "failed": n - open,
        "ended_early": ended_early,
        "first_error": first_error,
        "rss_before_kb": before,
        "rss_after_kb": after,
        "open_seconds": open_seconds,
    });
    report.line(
        "idle",
        &format!("idle_kb_per_stream_{n}"),
        (after as f64 - before as f64) / open.max(1) as f64,
        "kB/stream",
        extra,
    );
    Ok(())
}

async fn rss_after(args: &Args, client: &Arc<Client>, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let pid = args.pid.ok_or("needs --pid")?;
    let start = rss_kb(args)?;
    let text = Arc::new(words(args.rss_events));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::with_capacity(args.rss_parallel);
    for _ in 0..args.rss_parallel.max(1) {
        let (client, text, next, runs) =
            (client.clone(), text.clone(), next.clone(), args.rss_runs);
        workers.push(tokio::spawn(async move {
            let (mut events, mut incomplete, mut failed, mut first_error) = (0u64, 0, 0, None);
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                match client.run(&text).await {
                    Ok(stats) => {
                        events += stats.events;
                        incomplete += usize::from(!stats.complete());
                    }
                    Err(error) => {
                        failed += 1;
                        first_error.get_or_insert(error);
                    }
                }
            }
            (events, incomplete, failed, first_error)
        }));
    }
    let (mut events, mut incomplete, mut failed, mut first_error) = (0u64, 0, 0, None);
    for worker in workers {
        let (e, i, f, error) = worker.await.map_err(|e| e.to_string())?;
        events += e;
        incomplete += i;
        failed += f;
        if let Some(error) = error {
            first_error.get_or_insert(error);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = rss_kb(args)?;
    let peak = status_kb(pid, "VmHWM").ok_or("no VmHWM")?;
    tokio::time::sleep(Duration::from_secs_f64(args.rss_wait)).await;
    let later = rss_kb(args)?;
    let extra = json!({
        "runs": args.rss_runs,
        "parallel": args.rss_parallel,
        "events": events,
        "incomplete": incomplete,
        "failed": failed,
        "first_error": first_error,
        "seconds": seconds,
        "wait_s": args.rss_wait,
        "rss_start_kb": start,
    });
    let mib = |kb: u64| kb as f64 / 1024.0;
    for (measure, kb) in [
        ("rss_start_mib", start),
        ("rss_after_runs_mib", after),
        ("rss_peak_mib", peak),
        ("rss_after_wait_mib", later),
    ] {
        report.line("rss-after", measure, mib(kb), "MiB", extra.clone());
    }
    Ok(())
}

/// The word the scripted model answers (`scripts/bench.sh` scripts it): every user message
/// of `agent-turns` holds it, and the answer is [`TURN_REPLY`].
const TURN_MARKER: &str = "bench-turn";
const TURN_REPLY: &str = "Done.";

/// A conversation as a client keeps it: every message so far, resent with each run.
#[derive(serde::Serialize, serde::Deserialize)]
struct Conversation {
    thread: String,
    messages: Vec<Value>,
    runs: usize,
}

impl Conversation {
    /// One turn: a new user message, the run read to the end, the answer kept.
    async fn turn(&mut self, args: &Args, client: &Client) -> Result<RunStats, String> {
        self.runs += 1;
        let n = self.runs;
        self.messages.push(
            json!({"id": format!("{}-u{n}", self.thread), "role": "user",
            "content": format!("{TURN_MARKER} {n}: hello")}),
        );
        let body = json!({"threadId": self.thread, "runId": format!("{}-r{n}", self.thread),
            "protocolVersion": "1.0", "messages": self.messages});
        let limit = Duration::from_secs_f64(args.turn_timeout);
        let stats = tokio::time::timeout(limit, client.run_with(&body))
            .await
            .map_err(|_| format!("{}: turn {n} took over {limit:?}", self.thread))??;
        if !stats.complete() || stats.first_content.is_none() {
            return Err(format!(
                "{}: turn {n} ended with {} after {} events and {} text",
                self.thread,
                stats.last_type,
                stats.events,
                if stats.first_content.is_some() {
                    "some"
                } else {
                    "no"
                }
            ));
        }
        self.messages
            .push(json!({"id": format!("{}-a{n}", self.thread),
            "role": "assistant", "content": TURN_REPLY}));
        Ok(stats)
    }
}

/// The timings of some turns: time to the first event (`RUN_STARTED`), to the first text
/// delta (the agent's answer), and to the end of the stream, medians in ms.
fn report_turns(report: &Report<'_>, scenario: &str, kind: &str, turns: &[RunStats]) {
    let kind = match &report.args.turns_tag {
        Some(tag) => format!("{tag}_{kind}"),
        None => kind.to_owned(),
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(&v, 50.0)
    };
    let extra = json!({"turns": turns.len()});
    for (what, values) in [
        (
            "first_event",
            turns.iter().map(|t| ms(t.first_event)).collect(),
        ),
        (
            "first_text",
            turns
                .iter()
                .map(|t| t.first_content.map_or(f64::NAN, ms))
                .collect(),
        ),
        ("turn", turns.iter().map(|t| ms(t.total)).collect()),
    ] {
        report.line(
            scenario,
            &format!("agent_{kind}_{what}_ms"),
            median(values),
            "ms",
            extra.clone(),
        );
    }
}

/// An ACP agent's turns (`--agent`, on a model scripted to answer [`TURN_MARKER`]): for
/// each of `--turn-threads` new threads, its first turn (a new agent process and session
/// where each thread has its own workspace), then `--warm-turns` turns on the live process
/// and session; one thread after the other. Medians of each kind (`agent_new_thread_*`,
/// `agent_warm_*`). The conversations are written to `--turns-file` for `agent-restart`.
async fn agent_turns(args: &Args, client: &Client, report: &Report<'_>) -> Result<(), String> {
    let path = args.turns_file.as_ref().ok_or("needs --turns-file")?;
    tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
    let (mut first, mut warm, mut conversations) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.turn_threads {
        let mut conversation = Conversation {
            thread: format!("bench-turns-{}", uuid::Uuid::new_v4()),
            messages: Vec::new(),
            runs: 0,
        };
        first.push(conversation.turn(args, client).await?);
        for _ in 0..args.warm_turns {
            warm.push(conversation.turn(args, client).await?);
        }
        conversations.push(conversation);
    }
    let text = serde_json::to_string(&conversations).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    report_turns(report, "agent-turns", "new_thread", &first);
    report_turns(report, "agent-turns", "warm", &warm);
    Ok(())
}

/// The conversations of `agent-turns` (`--turns-file`) on a restarted daemon: each
/// thread's next turn, the first after the restart (a new agent process, the session
/// loaded). Medians (`agent_restart_*`).
async fn agent_restart(args: &Args, client: &Client, report: &Report<'_>) -> Result<(), String> {
    let path = args.turns_file.as_ref().ok_or("needs --turns-file")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut conversations: Vec<Conversation> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
    let mut after = Vec::with_capacity(conversations.len());
    for conversation in &mut conversations {
        after.push(conversation.turn(args, client).await?);
    }
    report_turns(report, "agent-restart", "restart", &after);
    Ok(())
}

/// The processes below `pid` (children, theirs, ...): an agent's launchers, forwarders and
/// the agents themselves.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.insert(child, ppid);
        }
    }
    let below = |mut p: u32| {
        while let Some(&up) = parent_of.get(&p) {
            if up == pid {
                return true;
            }
            if up <= 1 {
                return false;
            }
            p = up;
        }
        false
    };
    parent_of.keys().copied().filter(|&c| below(c)).collect()
}

/// A process's proportional set size (`Pss` of `/proc/<pid>/smaps_rollup`), in kB.
fn pss_kb(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup.lines().find_map(|line| {
        let value = line.strip_prefix("Pss:")?;
        value.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// CPU seconds of `pids` so far (those gone are not counted).
fn cpu_of(pids: &[u32], clk_tck: u64) -> f64 {
    pids.iter().filter_map(|&p| cpu_seconds(p, clk_tck)).sum()
}

/// First text p50/p99 and whole turn p50 of `first` and `warm` turns, `agent_<kind>_...`.
fn report_parallel(
    report: &Report<'_>,
    kind: &str,
    first: &[RunStats],
    warm: &[RunStats],
    extra: &Value,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (which, set) in [("first", first), ("warm", warm)] {
        let mut text: Vec<f64> = set
            .iter()
            .map(|t| t.first_content.map_or(f64::NAN, ms))
            .collect();
        text.sort_by(f64::total_cmp);
        let mut whole: Vec<f64> = set.iter().map(|t| ms(t.total)).collect();
        whole.sort_by(f64::total_cmp);
        for (what, value) in [
            ("first_text_p50", percentile(&text, 50.0)),
            ("first_text_p99", percentile(&text, 99.0)),
            ("turn_p50", percentile(&whole, 50.0)),
        ] {
            report.line(
                "agent-parallel",
                &format!("agent_{kind}_{which}_{what}_ms"),
                value,
                "ms",
                extra.clone(),
            );
        }
    }
}

/// `--parallel-threads` counts in turn: that many new threads at once, each a first turn
/// then `--warm-turns` turns. Per count: first text p50/p99 and whole turn p50 of the first
/// and the warm turns, the daemon's and the agent processes' CPU per turn apart, the agent
/// processes' resident size per thread, the daemon's growth per live thread, and (after
/// `--idle-wait`) how many agent processes are left; the agents' size is their
/// proportional set size (`agent_parallel<N>_...`).
// Over 80 lines: one measurement per count, its readings before and after in order.
async fn agent_parallel(
    args: &Args,
    client: &Arc<Client>,
    report: &Report<'_>,
) -> Result<(), String> {
    let pid = args.pid.ok_or("needs --pid")?;
    tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
    let scenario = "agent-parallel";
    for &threads in &args.parallel_threads {
        let kind = format!("parallel{threads}");
        let before_rss = rss_kb(args)?;
        let before_cpu = cpu_seconds(pid, args.clk_tck).unwrap_or(f64::NAN);
        let before_agents = cpu_of(&descendants(pid), args.clk_tck);
        let mut conversations = tokio::task::JoinSet::new();
        for _ in 0..threads {
            let client = client.clone();
            let turn_args = args.clone();
            conversations.spawn(async move {
                let mut conversation = Conversation {
                    thread: format!("bench-parallel-{}", uuid::Uuid::new_v4()),
                    messages: Vec::new(),
                    runs: 0,
                };
                let first = conversation.turn(&turn_args, &client).await?;
                let mut warm = Vec::new();
                for _ in 0..turn_args.warm_turns {
                    warm.push(conversation.turn(&turn_args, &client).await?);
                }
                Ok::<_, String>((first, warm))
            });
        }
        let (mut first, mut warm) = (Vec::new(), Vec::new());
        while let Some(done) = conversations.join_next().await {
            let (f, w) = done.map_err(|e| e.to_string())??;
            first.push(f);
            warm.extend(w);
        }
        let agents = descendants(pid);
        let agent_cpu = cpu_of(&agents, args.clk_tck) - before_agents;
        let daemon_cpu = cpu_seconds(pid, args.clk_tck).unwrap_or(f64::NAN) - before_cpu;
        // Proportional: the pages the agents' processes share (node's binary and libraries,
        // Claude Code's code) counted once between them, not once per process.
        let agent_pss: u64 = agents.iter().filter_map(|&p| pss_kb(p)).sum();
        let daemon_rss = rss_kb(args)?;
        let turns = (first.len() + warm.len()) as f64;
        let extra = json!({"threads": threads, "turns": turns});
        report_parallel(report, &kind, &first, &warm, &extra);
        for (what, value, unit) in [
            ("daemon_cpu_per_turn_ms", daemon_cpu * 1e3 / turns, "ms"),
            ("agents_cpu_per_turn_ms", agent_cpu * 1e3 / turns, "ms"),
            (
                "agents_pss_per_thread_mib",
                agent_pss as f64 / 1024.0 / threads as f64,
                "MiB",
            ),
            (
                "daemon_rss_per_thread_kib",
                daemon_rss.saturating_sub(before_rss) as f64 / threads as f64,
                "KiB",
            ),
        ] {
            report.line(
                scenario,
                &format!("agent_{kind}_{what}"),
                value,
                unit,
                extra.clone(),
            );
        }
        if args.idle_wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(args.idle_wait)).await;
            let left = descendants(pid).len() as f64;
            report.line(
                scenario,
                &format!("agent_{kind}_processes_after_idle"),
                left,
                "processes",
                extra.clone(),
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // On a worker, not on the thread that blocks on `main`: a stream's reader and its
    // connection's task then hand each chunk over on one worker, instead of waking another
    // thread per chunk (which made the client, not the server, the bound of a one-stream run).
    tokio::spawn(measure(args))
        .await
        .unwrap_or(std::process::ExitCode::FAILURE)
}

async fn measure(args: Args) -> std::process::ExitCode {
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(1))
        .tcp_nodelay(true);
    if args.http2 {
        builder = builder.http2_prior_knowledge();
    } else {
        builder = builder.http1_only();
    }
    let http = builder.build().expect("the HTTP client builds");
    let raw = args.url.strip_prefix("tcp://").map(|addr| RawTcp {
        addr: addr.trim_end_matches('/').to_owned(),
        idle: std::sync::Mutex::new(Vec::new()),
    });
    let client = Arc::new(Client {
        http,
        endpoint: format!("{}/{}", args.url.trim_end_matches('/'), args.agent),
        token: args.token.clone(),
        raw,
    });
    let report = Report { args: &args };
    let scenarios: Vec<Scenario> = args
        .scenario
        .iter()
        .flat_map(|&scenario| match scenario {
            Scenario::All => Scenario::EVERY.to_vec(),
            one => vec![one],
        })
        .collect();
    for scenario in scenarios {
        let done = match scenario {
            Scenario::OneStream => one_stream(&args, &client, &report).await,
            Scenario::Concurrent => concurrent(&args, &client, &report).await,
            Scenario::Ttfe => ttfe(&args, &client, &report).await,
            Scenario::Storm => storm(&args, &client, &report).await,
            Scenario::Paced => paced(&args, &client, &report).await,
            Scenario::Idle => idle(&args, &client, &report).await,
            Scenario::AgentTurns => agent_turns(&args, &client, &report).await,
            Scenario::AgentRestart => agent_restart(&args, &client, &report).await,
            Scenario::AgentParallel => agent_parallel(&args, &client, &report).await,
            Scenario::RssAfter | Scenario::All => rss_after(&args, &client, &report).await,
        };
        if let Err(error) = done {
            eprintln!("loadgen: {scenario:?}: {error}");
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
