//! The one registry: the handles the layers update, registered in the order a scrape lists
//! them, and the gauges sampled from the runtime at each scrape.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{
    EgressMetrics, HttpMetrics, RunMetrics, ScheduleMetrics, StoreMetrics, StreamMetrics,
    WebhookMetrics,
};

/// The labels of `agent_processes`: an agent and a state (busy, idle).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    agent: Arc<str>,
    state: &'static str,
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
    /// Webhook deliveries by endpoint (empty with no `[[webhooks]]`).
    pub webhooks: WebhookMetrics,
    pub schedules: ScheduleMetrics,
    /// Agents' egress proxies and model relays.
    pub egress: EgressMetrics,
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
            webhooks,
            schedules,
            egress,
        } = source.handles();
        let http = HttpMetrics::default();
        let sampled = Sampled::default();
        // In the order a scrape lists them.
        register_runs(&mut registry, &runs, &sampled);
        register_streams(&mut registry, &runs, &streams);
        register_memory(&mut registry, &sampled);
        register_store(&mut registry, &sampled, &store);
        register_schedules(&mut registry, &schedules);
        register_agents(&mut registry, &sampled);
        register_egress(&mut registry, &egress);
        register_webhooks(&mut registry, &webhooks);
        register_http(&mut registry, &http);
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

/// Runs: admitted, ended, their durations, the live and suspended ones, the cap, refusals.
fn register_runs(r: &mut Registry, runs: &RunMetrics, sampled: &Sampled) {
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
        "budgets_reached",
        "Runs that reached a budget, by budget (run, thread, principal, hard) and measure",
        runs.budget_reached.clone(),
    );
}

/// Event streams: open ones, reattach answers, cuts.
fn register_streams(r: &mut Registry, runs: &RunMetrics, streams: &StreamMetrics) {
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
}

/// The memory budget and what counts against it.
fn register_memory(r: &mut Registry, sampled: &Sampled) {
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
}

/// The store: its queue, its batches' commits and failures, its write-ahead log.
fn register_store(r: &mut Registry, sampled: &Sampled, store: &StoreMetrics) {
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
}

/// Schedule occurrences by what became of them on this node.
fn register_schedules(r: &mut Registry, schedules: &ScheduleMetrics) {
    r.register(
        "schedule_occurrences",
        "Schedule occurrences handled by this node, by outcome (started, skipped: the thread \
         was busy, failed, missed: no node reached it in time, lost: another node claimed it)",
        schedules.occurrences.clone(),
    );
}

/// Agent processes by state.
fn register_agents(r: &mut Registry, sampled: &Sampled) {
    r.register(
        "agent_processes",
        "Agent processes (ACP), by agent and state (busy: serving a turn, idle)",
        sampled.processes.clone(),
    );
}

/// Agents' ways out.
fn register_egress(r: &mut Registry, egress: &EgressMetrics) {
    r.register(
        "egress_decisions",
        "Connections an agent asked its egress proxy for, by agent and decision (allowed, denied)",
        egress.decisions.clone(),
    );
    r.register(
        "egress_bytes",
        "Bytes carried both ways by connections the egress proxy allowed, by agent",
        egress.bytes.clone(),
    );
    r.register(
        "relay_tokens",
        "Tokens billed by a model through an agent's relays (read from the model's answers), by agent",
        egress.relay_tokens.clone(),
    );
}

/// Webhook deliveries by endpoint.
fn register_webhooks(r: &mut Registry, webhooks: &WebhookMetrics) {
    r.register(
        "webhook_deliveries",
        "Webhook events delivered (a 2xx answer), by endpoint",
        webhooks.delivered.clone(),
    );
    r.register(
        "webhook_failed_attempts",
        "Webhook attempts that failed (no answer, or not 2xx) and will be retried, by endpoint",
        webhooks.failed.clone(),
    );
    r.register(
        "webhook_pending",
        "Webhook events not yet delivered, by endpoint",
        webhooks.pending.clone(),
    );
}

/// HTTP requests and response heads.
fn register_http(r: &mut Registry, http: &HttpMetrics) {
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
}
