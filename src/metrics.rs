//! Prometheus metrics: the one registry, and the small typed handles the runtime, the store
//! and the HTTP layer update.
//!
//! Each layer owns its handles from the start ([`RunMetrics`] and [`StreamMetrics`] in the
//! runtime, [`StoreMetrics`] in the store, [`HttpMetrics`] in the app), so a runtime built
//! without a registry (tests, embedders) counts the same way and nothing is global.
//! [`Metrics::new`] registers clones of them (a handle is an `Arc` around atomics) in one
//! [`Registry`]; [`Metrics::render`] brings the gauges that are read rather than counted up
//! to date (live and suspended runs, memory, the store's queue, agent processes) and encodes
//! the registry in the Prometheus text format (0.0.4).
//!
//! The hot path stays cheap: per-agent and per-reason handles are resolved once (when the
//! runtime is built, or once per run), so counting a run, a stream or a cut is an atomic
//! add. Histograms take a short lock per observation; they observe once per run, per
//! request or per store batch, never per event. Labels are bounded: agent names from the
//! configuration, fixed outcome, reason and kind sets, route names and status codes. Never
//! a thread or run id.
//!
//! Not here: the bearer check for `{path}/metrics` (`http::api`, like every route) and
//! the loopback metrics listener (`http::api::metrics_endpoint`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Buckets for run durations (seconds): a quick reply to a long agent turn.
const RUN_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];
/// Buckets for latencies (seconds): time to first event, response heads, store commits.
const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// How a run ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `RUN_FINISHED` with a success outcome.
    Finished,
    /// `RUN_ERROR` from the agent or the daemon (store failure, panic).
    Error,
    /// Cancelled by a request, a delete or the disconnect grace.
    Cancelled,
    /// Cancelled by the daemon's shutdown.
    Shutdown,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Finished,
        Outcome::Error,
        Outcome::Cancelled,
        Outcome::Shutdown,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Finished => "finished",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
            Outcome::Shutdown => "shutdown",
        }
    }
}

/// How the stream route answered a reattach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReattachKind {
    /// Replay strictly after the client's last id, then live.
    Exact,
    /// The id could not be honoured: snapshots, then live (`agui-resume: resync`).
    Resync,
    /// Nothing live to follow: a short snapshot run.
    Hydration,
}

/// Why a stream ended before its run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutReason {
    /// The client took nothing for the stall timeout.
    Stall,
    /// The frames after the stream's position were no longer retained.
    Gap,
    /// The daemon stopped every stream at the end of shutdown.
    Shutdown,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabel {
    agent: Arc<str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    agent: Arc<str>,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    agent: Arc<str>,
    state: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn run_histogram() -> Histogram {
    Histogram::new(RUN_BUCKETS)
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The runtime's run counters, per agent, resolved once when the runtime is built.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    started: Family<AgentLabel, Counter>,
    finished: Family<OutcomeLabels, Counter>,
    duration: HistogramFamily<AgentLabel>,
    first_event: HistogramFamily<AgentLabel>,
    refused: Family<ReasonLabel, Counter>,
    reattached: Family<KindLabel, Counter>,
    reattach: [Counter; 3],
    agents: Arc<HashMap<String, Arc<AgentRunMetrics>>>,
    /// For an agent the runtime does not know (never used by a run it admits).
    unknown: Arc<AgentRunMetrics>,
}

/// One agent's run handles: what a run's pump holds.
#[derive(Debug)]
pub struct AgentRunMetrics {
    started: Counter,
    finished: [Counter; 4],
    duration: Histogram,
    first_event: Histogram,
}

impl AgentRunMetrics {
    /// A run was admitted and its pump started.
    pub fn started(&self) {
        self.started.inc();
    }

    /// The run's agent produced its first output, `after` its admission.
    pub fn first_event(&self, after: Duration) {
        self.first_event.observe(after.as_secs_f64());
    }

    /// The run ended with `outcome` after `lasted`.
    pub fn finished(&self, outcome: Outcome, lasted: Duration) {
        self.finished[outcome as usize].inc();
        self.duration.observe(lasted.as_secs_f64());
    }
}

impl RunMetrics {
    /// Handles for each of `agents` (by name), and a refusal counter for each of `reasons`.
    pub fn new<'a>(
        agents: impl IntoIterator<Item = &'a str>,
        reasons: &[&'static str],
    ) -> RunMetrics {
        let started = Family::<AgentLabel, Counter>::default();
        let finished = Family::<OutcomeLabels, Counter>::default();
        let duration = HistogramFamily::new_with_constructor(run_histogram as fn() -> Histogram);
        let first_event =
            HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram);
        let reattached = Family::<KindLabel, Counter>::default();
        let reattach = ["exact", "resync", "hydration"]
            .map(|kind| reattached.get_or_create_owned(&KindLabel { kind }));
        let handles = |name: &str| {
            let agent: Arc<str> = Arc::from(name);
            let label = AgentLabel {
                agent: agent.clone(),
            };
            Arc::new(AgentRunMetrics {
                started: started.get_or_create_owned(&label),
                finished: Outcome::ALL.map(|outcome| {
                    finished.get_or_create_owned(&OutcomeLabels {
                        agent: agent.clone(),
                        outcome: outcome.as_str(),
                    })
                }),
                duration: duration.get_or_create_owned(&label),
                first_event: first_event.get_or_create_owned(&label),
            })
        };
        let agents: HashMap<String, Arc<AgentRunMetrics>> = agents
            .into_iter()
            .map(|name| (name.to_owned(), handles(name)))
            .collect();
        // Every reason is shown from the start (at 0), so a rate over it is defined.
        let refused = Family::<ReasonLabel, Counter>::default();
        for &reason in reasons {
            refused.get_or_create_owned(&ReasonLabel { reason });
        }
        let unknown = Arc::new(AgentRunMetrics {
            started: Counter::default(),
            finished: Default::default(),
            duration: run_histogram(),
            first_event: latency_histogram(),
        });
        RunMetrics {
            started,
            finished,
            duration,
            first_event,
            refused,
            reattached,
            reattach,
            agents: Arc::new(agents),
            unknown,
        }
    }

    /// The handles of `agent`'s runs.
    pub fn agent(&self, agent: &str) -> Arc<AgentRunMetrics> {
        self.agents.get(agent).unwrap_or(&self.unknown).clone()
    }

    /// A run request was refused before any stream started (`reason`: a stable,
    /// snake_case word from a fixed set).
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The stream route answered with `kind`.
    pub fn reattached(&self, kind: ReattachKind) {
        self.reattach[kind as usize].inc();
    }
}

/// Open event streams and the streams cut before their run ended.
#[derive(Debug, Clone)]
pub struct StreamMetrics {
    attached: Gauge,
    cut: Family<ReasonLabel, Counter>,
    /// By [`CutReason`].
    cuts: [Counter; 3],
}

impl Default for StreamMetrics {
    fn default() -> Self {
        let cut = Family::<ReasonLabel, Counter>::default();
        let cuts = ["stall", "gap", "shutdown"]
            .map(|reason| cut.get_or_create_owned(&ReasonLabel { reason }));
        StreamMetrics {
            attached: Gauge::default(),
            cut,
            cuts,
        }
    }
}

impl StreamMetrics {
    /// Counts one open stream until the guard is dropped.
    pub fn open(self: &Arc<Self>) -> StreamGuard {
        self.attached.inc();
        StreamGuard {
            metrics: self.clone(),
        }
    }
}

/// One open stream, counted while it lives; also where it reports a cut.
#[derive(Debug)]
pub struct StreamGuard {
    metrics: Arc<StreamMetrics>,
}

impl StreamGuard {
    /// The stream is ending early, for `reason`.
    pub fn cut(&self, reason: CutReason) {
        self.metrics.cuts[reason as usize].inc();
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.metrics.attached.dec();
    }
}

/// The store's commit latency and failures, and the size of SQLite's WAL.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    commit: Histogram,
    failures: Counter,
    wal: Gauge,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            commit: latency_histogram(),
            failures: Counter::default(),
            wal: Gauge::default(),
        }
    }
}

impl StoreMetrics {
    /// One batch ran and ended its transaction (`committed` or not) in `took`.
    pub fn batch(&self, took: Duration, committed: bool) {
        self.commit.observe(took.as_secs_f64());
        if !committed {
            self.failures.inc();
        }
    }

    /// The embedded store's WAL is `bytes` long.
    pub fn wal(&self, bytes: u64) {
        self.wal.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The WAL's length as last seen.
    pub fn wal_bytes(&self) -> u64 {
        u64::try_from(self.wal.get()).unwrap_or(0)
    }
}

/// Requests by route and status, and the time to the response head.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    head: HistogramFamily<RouteLabel>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            requests: Family::default(),
            head: HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram),
        }
    }
}

impl HttpMetrics {
    /// A request on `route` (a fixed route name) was answered `code` after `took`.
    pub fn request(&self, route: &'static str, code: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels { route, code })
            .inc();
        self.head
            .get_or_create(&RouteLabel { route })
            .observe(took.as_secs_f64());
    }
}

/// What the registry reads from its owner (the runtime) rather than counts: handed to
/// [`Metrics::new`], so this module knows no layer above it.
pub trait GaugeSource: Send + Sync + 'static {
    /// The counters and histograms the owner updates, to be registered.
    fn handles(&self) -> Handles;
    /// The gauges as they stand now.
    fn sample(&self) -> Sample;
}

/// The handles a [`GaugeSource`] updates.
#[derive(Debug, Clone)]
pub struct Handles {
    pub runs: RunMetrics,
    pub streams: Arc<StreamMetrics>,
    pub store: StoreMetrics,
}

/// The gauges at one scrape.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Runs alive (running or suspended).
    pub live: usize,
    /// The admission cap.
    pub capacity: usize,
    /// Live runs parked on the client.
    pub suspended: usize,
    /// Bytes counted against the memory budget.
    pub memory_in_use: usize,
    pub memory_budget: usize,
    pub retained_limit: usize,
    /// Store jobs queued and not yet committed.
    pub store_queue: usize,
    /// Per agent that runs processes: (name, busy, idle).
    pub processes: Vec<(String, usize, usize)>,
}

/// Gauges read from the source at each scrape.
#[derive(Debug, Default)]
struct Sampled {
    live: Gauge,
    suspended: Gauge,
    capacity: Gauge,
    memory: Gauge,
    budget: Gauge,
    retained_limit: Gauge,
    store_queue: Gauge,
    processes: Family<ProcessLabels, Gauge>,
}

/// The registry of one daemon, and what it samples at each scrape.
pub struct Metrics {
    registry: Registry,
    source: Arc<dyn GaugeSource>,
    sampled: Sampled,
    http: HttpMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers the handles of `source` (the runtime and its store) and of the HTTP layer.
    pub fn new(source: Arc<dyn GaugeSource>) -> Metrics {
        let mut registry = Registry::with_prefix("agui");
        let Handles {
            runs,
            streams,
            store,
        } = source.handles();
        let http = HttpMetrics::default();
        let sampled = Sampled::default();
        let r = &mut registry;
        r.register(
            "runs_started",
            "Runs admitted, by agent",
            runs.started.clone(),
        );
        r.register(
            "runs_finished",
            "Runs ended, by agent and outcome (finished, error, cancelled, shutdown)",
            runs.finished.clone(),
        );
        r.register(
            "run_duration_seconds",
            "Time from a run's admission to its terminal event, by agent",
            runs.duration.clone(),
        );
        r.register(
            "run_first_event_seconds",
            "Time from a run's admission to its agent's first output, by agent",
            runs.first_event.clone(),
        );
        r.register(
            "runs_live",
            "Runs alive (running or suspended), each holding an admission slot",
            sampled.live.clone(),
        );
        r.register(
            "runs_suspended",
            "Live runs waiting on the client (a frontend tool, a permission, an interrupt)",
            sampled.suspended.clone(),
        );
        r.register(
            "runs_capacity",
            "The admission cap (--max-concurrent-runs)",
            sampled.capacity.clone(),
        );
        r.register(
            "admission_refusals",
            "Run requests refused before any stream started, by reason",
            runs.refused.clone(),
        );
        r.register(
            "streams_attached",
            "Open event streams (run, reattach and hydration responses)",
            streams.attached.clone(),
        );
        r.register(
            "reattaches",
            "Answers of the stream route, by kind (exact, resync, hydration)",
            runs.reattached.clone(),
        );
        r.register(
            "streams_cut",
            "Streams ended before their run did, by reason (stall, gap, shutdown)",
            streams.cut.clone(),
        );
        r.register(
            "memory_in_use_bytes",
            "Bytes of journals, transcripts and state documents counted against the memory budget",
            sampled.memory.clone(),
        );
        r.register(
            "memory_budget_bytes",
            "The memory budget (--memory-budget), a bound on the whole process",
            sampled.budget.clone(),
        );
        r.register(
            "memory_retained_limit_bytes",
            "What retained journals, transcripts and state documents may hold: the budget less the process's own reserve",
            sampled.retained_limit.clone(),
        );
        r.register(
            "store_queue_depth",
            "Store jobs queued and not yet committed",
            sampled.store_queue.clone(),
        );
        r.register(
            "store_commit_duration_seconds",
            "Time to run and commit one store batch (a transaction)",
            store.commit.clone(),
        );
        r.register(
            "store_commit_failures",
            "Store batches whose transaction failed to commit",
            store.failures.clone(),
        );
        r.register(
            "store_wal_bytes",
            "Length of the embedded store's write-ahead log (0 with PostgreSQL)",
            store.wal.clone(),
        );
        r.register(
            "agent_processes",
            "Agent processes (ACP), by agent and state (busy: serving a turn, idle)",
            sampled.processes.clone(),
        );
        r.register(
            "http_requests",
            "HTTP requests answered, by route and status code",
            http.requests.clone(),
        );
        r.register(
            "http_response_head_seconds",
            "Time from a request's arrival to its response head, by route",
            http.head.clone(),
        );
        Metrics {
            registry,
            source,
            sampled,
            http,
        }
    }

    /// The HTTP layer's handles.
    pub fn http(&self) -> &HttpMetrics {
        &self.http
    }

    /// The whole registry in the Prometheus text format, gauges sampled now.
    pub fn render(&self) -> String {
        let s = &self.sampled;
        let now = self.source.sample();
        s.live.set(now.live as i64);
        s.capacity.set(now.capacity as i64);
        s.suspended.set(now.suspended as i64);
        s.memory.set(now.memory_in_use as i64);
        s.budget.set(now.memory_budget as i64);
        s.retained_limit.set(now.retained_limit as i64);
        s.store_queue.set(now.store_queue as i64);
        for (agent, busy, idle) in now.processes {
            let agent: Arc<str> = Arc::from(agent);
            for (state, n) in [("busy", busy), ("idle", idle)] {
                s.processes
                    .get_or_create(&ProcessLabels {
                        agent: agent.clone(),
                        state,
                    })
                    .set(n as i64);
            }
        }
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail; an encoder error would be a bug in a metric.
        if let Err(error) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            tracing::error!(%error, "metrics encoding failed");
        }
        out
    }
}
