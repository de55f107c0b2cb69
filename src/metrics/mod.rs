//! Prometheus metrics: the one registry, and the small typed handles the runtime, the store
//! and the HTTP layer update.
//!
//! Each layer owns its handles from the start ([`RunMetrics`] and [`StreamMetrics`] in the
//! runtime, [`StoreMetrics`] in the store, [`HttpMetrics`] in the app), so a runtime built
//! without a registry (tests, embedders) counts the same way and nothing is global.
//! [`Metrics::new`] registers clones of them (a handle is an `Arc` around atomics) in one
//! [`Registry`](prometheus_client::registry::Registry); [`Metrics::render`] brings the
//! gauges that are read rather than counted up to date (live and suspended runs, memory, the
//! store's queue, agent processes) and encodes the registry in the Prometheus text format
//! (0.0.4).
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
//!
//! This file: the typed handles and their labels. `registry.rs`: [`Metrics`], the one
//! registry, and what it samples at each scrape.

mod registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

pub use registry::{GaugeSource, Handles, Metrics, Sample};

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
struct BudgetLabels {
    budget: &'static str,
    measure: &'static str,
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
    budget_reached: Family<BudgetLabels, Counter>,
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
            budget_reached: Family::default(),
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

    /// A run reached its `budget` (run, thread, principal, hard) on `measure`.
    pub fn budget_reached(&self, budget: &'static str, measure: &'static str) {
        self.budget_reached
            .get_or_create(&BudgetLabels { budget, measure })
            .inc();
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

/// What became of the schedule occurrences this node handled, by outcome.
#[derive(Debug, Clone)]
pub struct ScheduleMetrics {
    occurrences: Family<OccurrenceLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OccurrenceLabel {
    outcome: &'static str,
}

/// What became of one schedule occurrence on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// Claimed here; its run started.
    Started,
    /// Claimed here; not run: the thread was busy.
    Skipped,
    /// Claimed here; its run could not start.
    Failed,
    /// Recorded here as missed (no node reached it in time).
    Missed,
    /// Claimed by another node first (cluster).
    Lost,
}

impl ScheduleOutcome {
    const ALL: [ScheduleOutcome; 5] = [
        ScheduleOutcome::Started,
        ScheduleOutcome::Skipped,
        ScheduleOutcome::Failed,
        ScheduleOutcome::Missed,
        ScheduleOutcome::Lost,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ScheduleOutcome::Started => "started",
            ScheduleOutcome::Skipped => "skipped",
            ScheduleOutcome::Failed => "failed",
            ScheduleOutcome::Missed => "missed",
            ScheduleOutcome::Lost => "lost",
        }
    }
}

impl Default for ScheduleMetrics {
    fn default() -> Self {
        let occurrences = Family::<OccurrenceLabel, Counter>::default();
        // Every outcome is listed from the start, at 0.
        for outcome in ScheduleOutcome::ALL {
            drop(occurrences.get_or_create(&OccurrenceLabel {
                outcome: outcome.as_str(),
            }));
        }
        ScheduleMetrics { occurrences }
    }
}

impl ScheduleMetrics {
    /// `n` occurrences ended as `outcome` here.
    pub fn counted(&self, outcome: ScheduleOutcome, n: u64) {
        self.occurrences
            .get_or_create(&OccurrenceLabel {
                outcome: outcome.as_str(),
            })
            .inc_by(n);
    }

    /// How many occurrences ended as `outcome` here.
    pub fn count(&self, outcome: ScheduleOutcome) -> u64 {
        self.occurrences
            .get_or_create(&OccurrenceLabel {
                outcome: outcome.as_str(),
            })
            .get()
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: Arc<str>,
}

/// Webhook deliveries by endpoint: delivered events, failed attempts, and the events not
/// yet delivered (as the endpoint's delivery task last counted them). The endpoints are
/// the configured ones, resolved when the outbox is built.
#[derive(Debug, Clone, Default)]
pub struct WebhookMetrics {
    delivered: Family<EndpointLabel, Counter>,
    failed: Family<EndpointLabel, Counter>,
    pending: Family<EndpointLabel, Gauge>,
}

/// One endpoint's webhook handles: what its delivery task holds.
#[derive(Debug, Clone, Default)]
pub struct EndpointMetrics {
    delivered: Counter,
    failed: Counter,
    pending: Gauge,
}

impl WebhookMetrics {
    /// Handles for each of `endpoints` (by name), shown from the start at 0.
    pub fn new<'a>(endpoints: impl IntoIterator<Item = &'a str>) -> WebhookMetrics {
        let metrics = WebhookMetrics::default();
        for name in endpoints {
            metrics.endpoint(name);
        }
        metrics
    }

    /// The handles of endpoint `name`.
    pub fn endpoint(&self, name: &str) -> EndpointMetrics {
        let label = EndpointLabel {
            endpoint: Arc::from(name),
        };
        EndpointMetrics {
            delivered: self.delivered.get_or_create_owned(&label),
            failed: self.failed.get_or_create_owned(&label),
            pending: self.pending.get_or_create_owned(&label),
        }
    }
}

impl EndpointMetrics {
    /// An event was delivered (a 2xx answer).
    pub fn delivered(&self) {
        self.delivered.inc();
    }

    /// An attempt failed (no answer, or not 2xx); the event is retried.
    pub fn failed(&self) {
        self.failed.inc();
    }

    /// `n` events are not yet delivered.
    pub fn pending(&self, n: i64) {
        self.pending.set(n);
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    agent: Arc<str>,
    decision: &'static str,
}

/// An agent's ways out: the egress proxy's decisions and the bytes of the connections it
/// allowed, and the tokens its model relays read in the model's answers.
#[derive(Debug, Clone, Default)]
pub struct EgressMetrics {
    decisions: Family<EgressLabels, Counter>,
    bytes: Family<AgentLabel, Counter>,
    relay_tokens: Family<AgentLabel, Counter>,
}

impl EgressMetrics {
    /// Agent `agent`'s handles, resolved once (when its process starts), so a count on
    /// the way out is an atomic add.
    pub fn agent(&self, agent: &str) -> AgentEgressMetrics {
        let label = |decision| EgressLabels {
            agent: Arc::from(agent),
            decision,
        };
        let agent = AgentLabel {
            agent: Arc::from(agent),
        };
        AgentEgressMetrics {
            allowed: self.decisions.get_or_create_owned(&label("allowed")),
            denied: self.decisions.get_or_create_owned(&label("denied")),
            bytes: self.bytes.get_or_create_owned(&agent),
            relay_tokens: self.relay_tokens.get_or_create_owned(&agent),
        }
    }
}

/// One agent's egress handles (see [`EgressMetrics::agent`]).
#[derive(Debug, Clone, Default)]
pub struct AgentEgressMetrics {
    allowed: Counter,
    denied: Counter,
    bytes: Counter,
    relay_tokens: Counter,
}

impl AgentEgressMetrics {
    /// One decision of the agent's proxy (`bytes`: what an allowed connection carried).
    pub fn decided(&self, allowed: bool, bytes: u64) {
        if allowed {
            self.allowed.inc();
        } else {
            self.denied.inc();
        }
        self.bytes.inc_by(bytes);
    }

    /// Tokens a model billed through one of the agent's relays.
    pub fn billed(&self, tokens: u64) {
        self.relay_tokens.inc_by(tokens);
    }
}
