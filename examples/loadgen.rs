//! A load client for a running agui-serve daemon, used by `scripts/bench.sh`.
//!
//! It drives the built-in `demo` agent over plain HTTP and prints one JSON line per
//! measurement on stdout:
//!
//! | scenario | what it measures |
//! |---|---|
//! | `one-stream` | events/s of single runs, one after another, that stream many events with no delay (the demo's echo: one `TEXT_MESSAGE_CONTENT` per word of the user message; `/slow N 0` is not unpaced: each chunk still waits a timer tick, about 1 ms) |
//! | `concurrent` | total events/s of `--concurrency` runs started together |
//! | `ttfe` | time to the first event (`RUN_STARTED`) and to the end of the stream, over `--runs` sequential short runs, each on a fresh thread, idle daemon |
//! | `all` | the three, in that order |
//!
//! With `--pid` (the daemon's process id) it also reads the daemon's CPU time (utime +
//! stime from `/proc/<pid>/stat`) around each scenario and reports CPU seconds per
//! million events (per run for `ttfe`).
//!
//! Run: `cargo run --release --example loadgen -- --url http://127.0.0.1:PORT/agui
//! --token TOKEN --scenario all`. The daemon needs `--max-concurrent-runs` at least
//! `--concurrency` (its default is 64).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    OneStream,
    Concurrent,
    Ttfe,
    All,
}

#[derive(Debug, Parser)]
#[command(about = "Load client for agui-serve: one JSON line per measurement")]
struct Args {
    /// Base URL of the daemon's route namespace, e.g. http://127.0.0.1:8080/agui.
    #[arg(long)]
    url: String,
    /// Bearer token.
    #[arg(long)]
    token: String,
    /// Agent name (a demo-kind agent).
    #[arg(long, default_value = "demo")]
    agent: String,
    #[arg(long, value_enum, default_value = "all")]
    scenario: Scenario,
    /// The daemon's process id, to report its CPU time.
    #[arg(long)]
    pid: Option<u32>,
    /// Clock ticks per second of /proc/<pid>/stat (`getconf CLK_TCK`).
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
    /// Unmeasured runs before each scenario.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
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
    /// From sending the request to the end of the stream.
    total: Duration,
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
}

/// Bytes of a `data:` line kept: enough to hold `"type":"..."`, which serde writes first.
const KEEP: usize = 96;

impl SseCounter {
    fn new() -> SseCounter {
        SseCounter {
            line: Vec::with_capacity(KEEP),
            last_data: Vec::with_capacity(KEEP),
            events: 0,
            first_type: None,
            first_at: None,
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
            std::mem::swap(&mut self.line, &mut self.last_data);
        }
        self.line.clear();
    }
}

fn event_type(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    text.split_once("\"type\":\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or_else(|| "?".to_owned(), |(ty, _)| ty.to_owned())
}

struct Client {
    http: reqwest::Client,
    endpoint: String,
    token: String,
}

impl Client {
    /// One run on a fresh thread whose user message is `text`, read to the end.
    async fn run(&self, text: &str) -> Result<RunStats, String> {
        let id = uuid::Uuid::new_v4();
        let body = json!({
            "threadId": format!("bench-{id}"),
            "runId": format!("run-{id}"),
            "messages": [{"id": format!("m-{id}"), "role": "user", "content": text}],
        });
        let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let response = self
            .http
            .post(&self.endpoint)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("status {status}: {text}"));
        }
        let mut counter = SseCounter::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("stream failed: {e}"))?;
            counter.feed(&chunk, Instant::now());
        }
        let total = started.elapsed();
        Ok(RunStats {
            events: counter.events,
            first_type: counter.first_type.unwrap_or_default(),
            last_type: event_type(&counter.last_data),
            first_event: counter
                .first_at
                .map_or(total, |at| at.duration_since(started)),
            total,
        })
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

/// Daemon CPU seconds so far (user + system, all threads, living or not).
fn cpu_seconds(pid: u32, clk_tck: u64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces):
    // state is field 3, utime field 14, stime field 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clk_tck as f64)
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

async fn one_stream(args: &Args, client: &Client, report: &Report<'_>) -> Result<(), String> {
    warm(client, args.warmup).await?;
    let text = words(args.stream_events);
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
    for _ in 0..args.runs {
        let stats = client.run("hello").await?;
        incomplete += usize::from(!stats.complete());
        first.push(stats.first_event.as_secs_f64() * 1e3);
        total.push(stats.total.as_secs_f64() * 1e3);
    }
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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(1))
        .tcp_nodelay(true);
    if args.http2 {
        builder = builder.http2_prior_knowledge();
    } else {
        builder = builder.http1_only();
    }
    let http = builder.build().expect("the HTTP client builds");
    let client = Arc::new(Client {
        http,
        endpoint: format!("{}/{}", args.url.trim_end_matches('/'), args.agent),
        token: args.token.clone(),
    });
    let report = Report { args: &args };
    let scenarios: &[Scenario] = match args.scenario {
        Scenario::All => &[Scenario::OneStream, Scenario::Concurrent, Scenario::Ttfe],
        Scenario::OneStream => &[Scenario::OneStream],
        Scenario::Concurrent => &[Scenario::Concurrent],
        Scenario::Ttfe => &[Scenario::Ttfe],
    };
    for scenario in scenarios {
        let done = match scenario {
            Scenario::OneStream => one_stream(&args, &client, &report).await,
            Scenario::Concurrent => concurrent(&args, &client, &report).await,
            Scenario::Ttfe | Scenario::All => ttfe(&args, &client, &report).await,
        };
        if let Err(error) = done {
            eprintln!("loadgen: {scenario:?}: {error}");
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
