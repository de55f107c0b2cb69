//! Runs, threads, the replay journal, admission and shutdown. Domain types only: nothing
//! here knows HTTP.
//!
//! A run is detached from the request that started it. [`Runtime::start_run`] decides, in
//! the thread's decide section (`thread.rs`: `ThreadState::decide`), whether a request
//! attaches to the thread's live run, answers or supersedes a suspended one, is refused, or
//! starts a new run; a new run gets an admission slot and its own task, the *pump*
//! (`pump.rs`), which drives the agent, is the only writer of the thread's journal, and
//! announces nothing before it is stored. Responses only read the journal through an [`Attachment`].
//! [`Runtime::reattach`] serves the stream route: exact replay after a client's last event
//! id, or an explicit resynchronisation, or a short hydration run when nothing is live.
//!
//! Threads persist in the [`Store`]; a thread not in memory is loaded from it on first use.
//!
//! Shutdown sequence: [`Runtime::drain`] refuses new runs -> [`Runtime::wait_runs`] waits for
//! running runs up to a deadline -> [`Runtime::cancel_all`] cancels the rest (each ends with
//! a terminal event) -> [`Runtime::stop_streams`] ends any stream still open.

mod answer;
pub mod attach;
pub mod fleet;
mod history;
pub mod journal;
mod lease;
pub mod memory;
mod observe;
mod pump;
mod reattach;
pub mod sanitize;
mod sessions;
pub mod state;
pub mod suspension;
mod thread;
pub mod translator;
pub mod ui;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use attach::{Attachment, Resume};
pub use fleet::{FleetFrom, FleetFull, FleetItem, FleetLimits, FleetStream};
pub use journal::{EventId, Gap, Journal, JournalLimits};
pub use sessions::{NewThread, SessionRequestError};

use crate::access::{Capability, Principal};
use crate::agent::Agent;
use crate::agent::Hitl;
use crate::clock::now_ms;
use crate::clock::rfc3339;
use crate::cluster::Owner;
use crate::metrics::{RunMetrics, StreamMetrics};
use crate::protocol::input::Message;
use crate::protocol::{Profile, RunAgentInput};
use crate::store::Store;
use crate::sync::lock;
use crate::traces::Tracer;
pub use lease::LoadError;
use opentelemetry::trace::SpanContext;
use thread::{Decision, Retry, Thread, new_thread};
use translator::Translator;

/// The default of `--max-runs-per-principal`.
pub const DEFAULT_MAX_RUNS_PER_PRINCIPAL: usize = 8;

/// The default of `--memory-budget`.
pub const DEFAULT_MEMORY_BUDGET: usize = 256 * 1024 * 1024;

/// Tunables of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub max_concurrent_runs: usize,
    pub disconnect_grace: Duration,
    pub keep_alive: Duration,
    pub suspend_timeout: Duration,
    pub journal: JournalLimits,
    /// A stream that cannot take a frame for this long is cut (it can reattach).
    pub stall_timeout: Duration,
    /// Bounds of the in-band history snapshot sent on a pre-existing thread.
    pub history_max_messages: usize,
    pub history_max_bytes: usize,
    /// Threads kept in memory (journal, transcript, state); idle ones beyond this are
    /// dropped, least recently used first, and reloaded from the store when needed.
    pub max_threads_in_memory: usize,
    /// Bytes of finished runs' frames and threads' transcripts and state documents kept in
    /// memory (see `memory`), less `memory_reserved`; over that, finished runs' frames go
    /// first, then idle threads. An idle thread whose transcript and document alone exceed
    /// a sixteenth of it leaves memory once its run's disconnect grace is over.
    pub memory_budget: usize,
    /// Bytes of `memory_budget` set aside for the process itself (code, runtime, caches,
    /// the allocator's slack): what is retained is held to the rest (see
    /// [`memory::retained_limit`]). 0 (the default) sets nothing aside; the daemon sets
    /// [`memory::process_reserve`], so that `--memory-budget` bounds the whole process.
    pub memory_reserved: usize,
    /// How each agent's permission requests reach the client (default: the tool).
    pub hitl: HashMap<String, Hitl>,
    /// Literal secrets scrubbed from every error message (the daemon's token).
    pub secrets: Vec<String>,
    /// Concurrent runs one principal may hold (the operator is not capped).
    pub max_runs_per_principal: usize,
    /// Fleet document changes kept for replay.
    pub fleet_history: usize,
    /// Fleet streams open at most, in all and per principal.
    pub fleet_limits: fleet::FleetLimits,
    /// The components agents may show (generative UI).
    pub ui: Arc<ui::UiCatalog>,
    /// Spans per run, turn and tool call, when traces are exported.
    pub tracer: Option<Tracer>,
    /// This node's membership of a cluster (PostgreSQL store), if any.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl RuntimeOptions {
    /// Defaults matching the documented flags.
    pub fn new(max_concurrent_runs: usize) -> RuntimeOptions {
        RuntimeOptions {
            max_concurrent_runs,
            disconnect_grace: Duration::from_secs(30),
            keep_alive: Duration::from_secs(15),
            suspend_timeout: Duration::from_secs(15 * 60),
            journal: JournalLimits::default(),
            stall_timeout: Duration::from_secs(30),
            history_max_messages: 500,
            history_max_bytes: 2 * 1024 * 1024,
            max_threads_in_memory: 1024,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            memory_reserved: 0,
            hitl: HashMap::new(),
            secrets: Vec::new(),
            max_runs_per_principal: DEFAULT_MAX_RUNS_PER_PRINCIPAL,
            fleet_history: fleet::DEFAULT_FLEET_HISTORY,
            fleet_limits: fleet::FleetLimits::default(),
            ui: Arc::new(ui::UiCatalog::defaults()),
            tracer: None,
            cluster: None,
        }
    }
}

/// Why a run request was refused before any stream started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("unknown agent")]
    UnknownAgent,
    #[error("the server is draining")]
    Draining,
    #[error("too many concurrent runs")]
    OverCapacity,
    #[error("a run is in progress on this thread")]
    RunInProgress,
    /// The thread belongs to another agent (named, unless the principal may not use it).
    #[error("thread belongs to another agent")]
    AgentMismatch(Option<String>),
    #[error("run id is already live on another thread")]
    RunIdInUse,
    #[error("store unavailable")]
    Store,
    #[error("the principal holds its most concurrent runs")]
    PrincipalBusy,
    #[error("the token lacks the `{}` capability", .0.name())]
    Forbidden(Capability),
    /// Another node owns the thread (cluster): the request belongs there.
    #[error("another node owns the thread")]
    Elsewhere(Owner),
}

impl StartError {
    /// Every [`StartError::reason`].
    pub const REASONS: [&'static str; 10] = [
        "unknown_agent",
        "draining",
        "over_capacity",
        "run_in_progress",
        "agent_mismatch",
        "run_id_in_use",
        "store_unavailable",
        "principal_busy",
        "forbidden",
        "elsewhere",
    ];

    /// A stable snake_case word for the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::UnknownAgent => "unknown_agent",
            StartError::Draining => "draining",
            StartError::OverCapacity => "over_capacity",
            StartError::RunInProgress => "run_in_progress",
            StartError::AgentMismatch(_) => "agent_mismatch",
            StartError::RunIdInUse => "run_id_in_use",
            StartError::Store => "store_unavailable",
            StartError::PrincipalBusy => "principal_busy",
            StartError::Forbidden(_) => "forbidden",
            StartError::Elsewhere(_) => "elsewhere",
        }
    }
}

/// Why a reattach was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReattachError {
    #[error("no such thread")]
    UnknownThread,
    #[error("store unavailable")]
    Store,
    /// Another node owns the thread (cluster).
    #[error("another node owns the thread")]
    Elsewhere(Owner),
}

/// Why a run was cancelled; decides its terminal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// `POST {path}/runs/{id}/cancel` or a thread delete.
    Requested,
    /// Nobody was attached for the disconnect grace.
    Abandoned,
    /// The server is shutting down.
    Shutdown,
    /// Another node took the thread's lease (cluster).
    LeaseLost,
}

/// A live run's admission: a slot of the daemon's cap, and of its principal's.
pub(crate) struct Slot {
    _global: tokio::sync::OwnedSemaphorePermit,
    _principal: Option<PrincipalSlot>,
}

/// One of a capped principal's run slots; given back on drop.
struct PrincipalSlot {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    owner: String,
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        if let Some(count) = counts.get_mut(&self.owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.owner);
            }
        }
    }
}

/// Run gauge for `/healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    pub active: usize,
    pub capacity: usize,
}

/// The runtime. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    agents: BTreeMap<String, Arc<dyn Agent>>,
    /// Threads in memory, by key ([`crate::access::scoped_key`]).
    threads: Mutex<HashMap<String, Arc<Thread>>>,
    /// Live runs by key: every AG-UI run id of their segments, in the owner's namespace.
    runs: Mutex<HashMap<String, Arc<LiveRun>>>,
    slots: Arc<Semaphore>,
    /// Live runs per capped principal (absent: none).
    per_principal: Arc<Mutex<HashMap<String, usize>>>,
    options: RuntimeOptions,
    store: Store,
    epoch: u64,
    draining: AtomicBool,
    /// Held (shared) by a run start from its look at `draining` until its pump is spawned,
    /// and (exclusive) by `drain` to set it: once `drain` returns, every run either was
    /// refused or is among `run_tasks`, which shutdown then waits for.
    start_gate: std::sync::RwLock<()>,
    /// Pumps and their watchers.
    run_tasks: TaskTracker,
    /// Fires to end every open stream (last step of shutdown).
    stop_streams: CancellationToken,
    started_at: Instant,
    /// Bytes held against the memory budget.
    meter: Arc<memory::Meter>,
    /// Origin of the stall check's clock (tokio's, so paused-time tests can drive it).
    clock_origin: tokio::time::Instant,
    run_metrics: RunMetrics,
    streams: Arc<StreamMetrics>,
    /// The fleet document and its history (`GET {path}/fleet/stream`).
    fleet: Arc<fleet::Fleet>,
    /// Wakes the task that rebuilds the fleet document.
    fleet_dirty: Arc<tokio::sync::Notify>,
}

/// Whether a live run is producing a segment or waiting on the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    Suspended,
}

/// A live run's [`Phase`]: written by its pump, read anywhere without a lock, and waited
/// on for the run to wake (a flag and one wake-up: a `watch` would keep eight).
#[derive(Debug, Default)]
pub(crate) struct PhaseCell {
    suspended: AtomicBool,
    woke: tokio::sync::Notify,
}

impl PhaseCell {
    pub(crate) fn get(&self) -> Phase {
        if self.suspended.load(Ordering::SeqCst) {
            Phase::Suspended
        } else {
            Phase::Running
        }
    }

    pub(crate) fn set(&self, phase: Phase) {
        self.suspended
            .store(phase == Phase::Suspended, Ordering::SeqCst);
        if phase == Phase::Running {
            self.woke.notify_waiters();
        }
    }

    /// Returns once the run is running. The wake-up is armed before the flag is read, so
    /// a wake between the two is not missed.
    pub(crate) async fn running(&self) {
        loop {
            let woke = self.woke.notified();
            tokio::pin!(woke);
            woke.as_mut().enable();
            if self.get() == Phase::Running {
                return;
            }
            woke.await;
        }
    }
}

/// What the runtime tells a run's pump.
#[derive(Debug)]
pub(crate) enum Control {
    /// The waits were answered (or failed closed): open the next segment.
    Resume(Box<NextSegment>),
}

/// The commands to a run's pump, in order: a queue and a wake-up. (A channel would do,
/// but allocates its first block of slots up front, which every run that sits idle would
/// keep; commands are rare.)
#[derive(Debug, Default)]
pub(crate) struct Controls {
    queue: Mutex<VecDeque<Control>>,
    ready: tokio::sync::Notify,
}

impl Controls {
    pub(crate) fn send(&self, command: Control) {
        lock(&self.queue).push_back(command);
        self.ready.notify_one();
    }

    pub(crate) fn try_recv(&self) -> Option<Control> {
        lock(&self.queue).pop_front()
    }

    /// The next command. A command sent after the queue was seen empty leaves a permit
    /// with the wake-up, so it is never missed.
    pub(crate) async fn recv(&self) -> Control {
        loop {
            if let Some(command) = self.try_recv() {
                return command;
            }
            self.ready.notified().await;
        }
    }
}

/// The segment a suspended run opens next.
#[derive(Debug)]
pub(crate) struct NextSegment {
    /// Its AG-UI run id.
    pub(crate) run_id: String,
    pub(crate) parent_run_id: Option<String>,
    /// Client tool calls of the suspension that got no answer: each gets a tool result
    /// saying it was cancelled (`why`), so the transcript stays a valid AG-UI history.
    pub(crate) abandoned: Vec<String>,
    pub(crate) why: String,
    /// The span of the request that opens it, when traces are on.
    pub(crate) link: Option<SpanContext>,
}

/// A run that has not ended.
pub(crate) struct LiveRun {
    pub(crate) id: String,
    cancel: CancellationToken,
    reason: Mutex<Option<CancelReason>>,
    /// Number of attached streams.
    attached: AtomicUsize,
    /// How many times the attached count fell to zero: a disconnect watcher acts only if
    /// no later fall (with a watcher of its own) happened while it waited.
    detaches: AtomicU64,
    /// What the disconnect watcher needs, spawned only when the last stream detaches.
    disconnect: DisconnectWatch,
    /// Journal sequence of the current segment's `RUN_STARTED`.
    segment_start: AtomicU64,
    /// Fires when the pump has finished (terminal event written, slot released).
    finished: CancellationToken,
    /// The segment's lifecycle state; written by the pump only, read for resync.
    translator: Mutex<Translator>,
    /// Commands to the pump.
    control: Controls,
    /// The open waits while suspended; taken by whoever resolves them.
    suspension: Mutex<Option<Box<suspension::Suspension>>>,
    phase: PhaseCell,
    /// Every AG-UI run id of this run's segments (each works for cancel).
    aliases: Mutex<Vec<String>>,
    /// When it was admitted (ms since the epoch).
    started_at_ms: u64,
    /// The agent it runs on.
    pub(crate) agent: String,
}

impl Runtime {
    /// A runtime serving `agents` (by name), persisting to `store`.
    pub fn new(
        agents: BTreeMap<String, Arc<dyn Agent>>,
        options: RuntimeOptions,
        store: Store,
    ) -> Runtime {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        let run_metrics = RunMetrics::new(agents.keys().map(String::as_str), &StartError::REASONS);
        let meter: Arc<memory::Meter> = Arc::default();
        let runtime = Runtime {
            inner: Arc::new(Inner {
                agents,
                threads: Mutex::new(HashMap::new()),
                runs: Mutex::new(HashMap::new()),
                slots: Arc::new(Semaphore::new(options.max_concurrent_runs)),
                per_principal: Arc::default(),
                store,
                epoch,
                draining: AtomicBool::new(false),
                start_gate: std::sync::RwLock::new(()),
                run_tasks: TaskTracker::new(),
                stop_streams: CancellationToken::new(),
                started_at: Instant::now(),
                meter: meter.clone(),
                clock_origin: tokio::time::Instant::now(),
                run_metrics,
                streams: Arc::default(),
                fleet: Arc::new(fleet::Fleet::new(
                    epoch,
                    options.fleet_history,
                    Value::Null,
                    now_ms(),
                    options.fleet_limits,
                    meter,
                )),
                fleet_dirty: Arc::default(),
                options,
            }),
        };
        runtime
            .inner
            .fleet
            .update(runtime.fleet_document(), now_ms());
        runtime.spawn_stall_check();
        runtime.spawn_fleet();
        runtime.spawn_lease_renewal();
        runtime
    }

    /// Something the fleet document shows changed (a run started, parked, resumed, ended).
    pub(crate) fn fleet_changed(&self) {
        self.inner.fleet_dirty.notify_one();
    }

    /// Rebuilds the fleet document when told that something changed (a burst is taken
    /// together), and at least once a second (agents' states change on their own), while
    /// anyone watches it (and for [`fleet::WATCHED_FOR`] after the last subscriber left, so
    /// a reconnect replays): a daemon nobody watches pays nothing for it. One task; it ends
    /// with the runtime.
    fn spawn_fleet(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        let dirty = self.inner.fleet_dirty.clone();
        handle.spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_secs(1), dirty.notified()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let runtime = Runtime { inner };
                if runtime.inner.fleet.is_watched() {
                    let doc = runtime.fleet_document();
                    runtime.inner.fleet.update(doc, now_ms());
                }
            }
        });
    }

    /// The fleet as it is: live runs (metadata only), agents, totals.
    pub fn fleet_document(&self) -> Value {
        let threads: Vec<Arc<Thread>> = lock(&self.inner.threads).values().cloned().collect();
        let mut runs = serde_json::Map::new();
        for thread in threads {
            let Some(run) = lock(&thread.state).live.clone() else {
                continue;
            };
            let suspended = run.phase.get() == Phase::Suspended;
            let mut entry = json!({
                "threadId": thread.id,
                "agent": thread.agent,
                "runId": run.id,
                "phase": if suspended { "suspended" } else { "running" },
                "startedAt": rfc3339(run.started_at_ms as i64),
            });
            if !thread.owner().is_empty() {
                entry["owner"] = json!(thread.owner());
            }
            if suspended && let Some(suspension) = lock(&run.suspension).as_ref() {
                let waits: Vec<Value> = suspension
                    .waits
                    .iter()
                    .map(|wait| {
                        let kind = match wait {
                            suspension::Wait::Tool { .. } => "tool",
                            suspension::Wait::Permission { .. } => "approval",
                            suspension::Wait::Input { .. } => "input",
                        };
                        json!({"kind": kind, "id": wait.answer_id()})
                    })
                    .collect();
                entry["waitingFor"] = Value::Array(waits);
            }
            runs.insert(thread.key.clone(), entry);
        }
        let processes: HashMap<&str, crate::agent::Processes> =
            self.agent_processes().into_iter().collect();
        let agents: serde_json::Map<String, Value> = self
            .inner
            .agents
            .iter()
            .map(|(name, agent)| {
                let mut entry = json!({"state": agent.status().state});
                if let Some(p) = processes.get(name.as_str()) {
                    entry["processes"] = json!({"busy": p.busy, "idle": p.idle});
                }
                (name.clone(), entry)
            })
            .collect();
        let totals = fleet::totals(&runs);
        json!({"runs": runs, "agents": agents, "totals": totals})
    }

    /// A fleet stream for `principal` (its view of the fleet), from `from`.
    pub fn fleet_stream(
        &self,
        principal: &Principal,
        from: FleetFrom,
    ) -> Result<FleetStream, FleetFull> {
        // Nobody may have watched for a while: the document is brought up to date first.
        self.inner.fleet.update(self.fleet_document(), now_ms());
        self.inner.fleet.subscribe(
            principal,
            from,
            self.inner.options.keep_alive,
            self.inner.stop_streams.clone(),
        )
    }

    /// The span of the request being handled, when traces are on (a link for the turn it
    /// opens).
    fn request_span(&self) -> Option<SpanContext> {
        self.inner
            .options
            .tracer
            .as_ref()
            .and_then(|_| crate::traces::current_span_context())
    }

    /// Checks every thread's registered readers a few times per stall timeout and cuts the
    /// ones that took nothing for it (see [`Journal::cut_stalled`]). One task for all
    /// streams; it ends with the runtime.
    fn spawn_stall_check(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let stall = self.inner.options.stall_timeout;
        let every = (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let inner = Arc::downgrade(&self.inner);
        handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let threads: Vec<Arc<Thread>> = lock(&inner.threads)
                    .values()
                    .filter(|t| Arc::strong_count(t) > 1)
                    .cloned()
                    .collect();
                let now = tokio::time::Instant::now()
                    .duration_since(inner.clock_origin)
                    .as_millis() as u64;
                for thread in threads {
                    thread.journal.cut_stalled(now, stall);
                }
            }
        });
    }

    pub fn has_agent(&self, name: &str) -> bool {
        self.inner.agents.contains_key(name)
    }

    /// The store this runtime persists to.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn uptime(&self) -> Duration {
        self.inner.started_at.elapsed()
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    pub fn gauge(&self) -> Gauge {
        let capacity = self.inner.options.max_concurrent_runs;
        Gauge {
            active: capacity - self.inner.slots.available_permits().min(capacity),
            capacity,
        }
    }

    /// The status of a thread as this process sees it (`running` while a run is live).
    pub fn live_status(&self, key: &str) -> Option<&'static str> {
        let thread = self.memory_thread(key)?;
        let state = lock(&thread.state);
        state.live.as_ref().map(|run| match run.phase.get() {
            Phase::Running => "running",
            Phase::Suspended => "suspended",
        })
    }

    /// Checks the parts of `input` only `agent` reads (see [`crate::agent::Agent::check_input`]).
    pub fn check_input(
        &self,
        agent: &str,
        input: &RunAgentInput,
    ) -> Result<(), crate::protocol::InputError> {
        match self.inner.agents.get(agent) {
            Some(agent) => agent.check_input(input),
            None => Ok(()),
        }
    }

    /// Starts a run for `input` on `agent` as the operator (see [`Runtime::start_run_as`]).
    pub async fn start_run(
        &self,
        agent: &str,
        input: RunAgentInput,
    ) -> Result<Attachment, StartError> {
        self.start_run_as(&Principal::operator(), agent, input)
            .await
    }

    /// Starts a run for `input` on `agent` in `principal`'s namespace, or attaches to the
    /// thread's live run when the request carries no new input. Refusals (capacity, the
    /// principal's cap, a capability the principal lacks) happen before anything is
    /// created.
    pub async fn start_run_as(
        &self,
        principal: &Principal,
        agent: &str,
        input: RunAgentInput,
    ) -> Result<Attachment, StartError> {
        loop {
            if let Ok(outcome) = self.decide_run(principal, agent, &input).await {
                if let Err(error) = &outcome {
                    self.inner.run_metrics.refused(error.reason());
                }
                return outcome;
            }
        }
    }

    /// One attempt of [`Runtime::start_run`]; `Err(Retry)` when the thread object it used
    /// left memory meanwhile (deleted or discarded) and the request must start over.
    async fn decide_run(
        &self,
        principal: &Principal,
        agent: &str,
        input: &RunAgentInput,
    ) -> Result<Result<Attachment, StartError>, Retry> {
        macro_rules! refuse {
            ($e:expr) => {
                return Ok(Err($e))
            };
        }
        let inner = &self.inner;
        let Some(backend) = inner
            .agents
            .get(agent)
            .filter(|_| principal.may_use(agent))
            .cloned()
        else {
            refuse!(StartError::UnknownAgent);
        };
        let profile = Profile::from_protocol_version(input.protocol_version.as_deref());
        let key = principal.key(&input.thread_id);
        let run_key = principal.key(&input.run_id);
        let existing = match self.load_thread(&key).await {
            Ok(existing) => existing,
            Err(LoadError::Store) => refuse!(StartError::Store),
            Err(LoadError::Elsewhere(owner)) => refuse!(StartError::Elsewhere(owner)),
        };
        if let Some(thread) = &existing
            && thread.agent != agent
        {
            // Not naming an agent the principal may not use.
            refuse!(StartError::AgentMismatch(
                principal
                    .may_use(&thread.agent)
                    .then(|| thread.agent.clone())
            ));
        }
        // A brand-new thread needs a slot and an unused run id before it may exist at all.
        let mut permit = None;
        if existing.is_none() {
            if !principal.can(Capability::Run) {
                refuse!(StartError::Forbidden(Capability::Run));
            }
            if lock(&inner.runs).contains_key(&run_key) {
                refuse!(StartError::RunIdInUse);
            }
            match self.admit(principal) {
                Ok(p) => permit = Some(p),
                Err(e) => refuse!(e),
            }
        }
        // `created`: this request put the thread in memory (a racing request for the same
        // new id may have put its own there first; then this one uses that).
        let (thread, created) = match existing {
            Some(thread) => (thread, false),
            None => self.insert_thread(self.new_thread(&key, agent, None, None)),
        };
        if thread.agent != agent {
            refuse!(StartError::AgentMismatch(
                principal
                    .may_use(&thread.agent)
                    .then(|| thread.agent.clone())
            ));
        }

        let decide = thread.decide.lock().await;
        if thread.retired.load(Ordering::SeqCst) {
            return Err(Retry);
        }
        // A refusal leaves nothing behind: a thread this request created is discarded, as
        // long as nothing else has used it meanwhile.
        let refused = |error: StartError| {
            self.discard_if_pristine(&thread, created);
            Ok(Err(error))
        };
        let decision = {
            let mut state = lock(&thread.state);
            let decision = state.decide(input);
            if let Some(needed) = principal.caps().missing(state.needs(&decision, input)) {
                drop(state);
                return refused(StartError::Forbidden(needed));
            }
            state.profile = profile;
            decision
        };
        match decision {
            Decision::Attach(run) => Ok(Ok(self.segment_attachment(&thread, run, profile))),
            Decision::Refuse(error) => refused(error),
            Decision::Suspended(run) => match self.answer(&thread, &run, input, profile) {
                Err(error) => refused(error),
                Ok(
                    answer::Answered::Resumed(attachment) | answer::Answered::Rejected(attachment),
                ) => Ok(Ok(attachment)),
                Ok(answer::Answered::Replay) => {
                    Ok(Ok(self.segment_attachment(&thread, run, profile)))
                }
                Ok(answer::Answered::Superseded) => {
                    // The old turn runs to its end with its waits failed closed; the new
                    // input then starts a run of its own, decided afresh once the old pump
                    // has ended. The wait happens outside the decide section.
                    drop(decide);
                    if tokio::time::timeout(answer::SUPERSEDE_WAIT, run.finished.cancelled())
                        .await
                        .is_err()
                    {
                        run.cancel_with(CancelReason::Requested);
                        // Bounded: a cancelled pump ends within its cancel bound.
                        run.finished.cancelled().await;
                    }
                    Err(Retry)
                }
            },
            Decision::RejectResume { code, message } => {
                self.discard_if_pristine(&thread, created);
                Ok(Ok(self.rejection(&thread, input, profile, code, message)))
            }
            Decision::LostAnswers(calls) => {
                Ok(Ok(self.lost_answers(&thread, input, profile, calls).await))
            }
            Decision::Start => {
                let _gate = inner.start_gate.read().unwrap_or_else(|e| e.into_inner());
                if self.is_draining() {
                    return refused(StartError::Draining);
                }
                if lock(&inner.runs).contains_key(&run_key) {
                    return refused(StartError::RunIdInUse);
                }
                let permit = match permit {
                    Some(permit) => permit,
                    None => match self.admit(principal) {
                        Ok(permit) => permit,
                        Err(error) => return refused(error),
                    },
                };
                Ok(Ok(pump::start(
                    self,
                    &thread,
                    backend,
                    input.clone(),
                    profile,
                    permit,
                )))
            }
        }
    }

    /// Cancels a live run by id, as the operator (see [`Runtime::cancel_run_as`]).
    pub fn cancel_run(&self, run_id: &str, reason: CancelReason) -> bool {
        self.cancel_run_as(&Principal::operator(), run_id, reason)
    }

    /// Cancels the live run `run_id` of `principal`'s namespace; a principal that sees
    /// every namespace (the operator) cancels every live run of that id. `false` when
    /// there is no such live run.
    pub fn cancel_run_as(&self, principal: &Principal, run_id: &str, reason: CancelReason) -> bool {
        let runs: Vec<Arc<LiveRun>> = {
            let runs = lock(&self.inner.runs);
            if principal.sees_everyone() {
                runs.iter()
                    .filter(|(key, _)| crate::access::split_key(key).1 == run_id)
                    .map(|(_, run)| run.clone())
                    .collect()
            } else {
                runs.get(&principal.key(run_id))
                    .filter(|run| principal.may_use(&run.agent))
                    .cloned()
                    .into_iter()
                    .collect()
            }
        };
        for run in &runs {
            run.cancel_with(reason);
        }
        !runs.is_empty()
    }

    /// Cancels the live run of `agent`'s thread `thread_id` in `principal`'s namespace
    /// (only the one that has `run_id` among its run ids, when given); its id, or `None`
    /// when no such run is live.
    pub fn cancel_thread_run(
        &self,
        principal: &Principal,
        thread_id: &str,
        agent: &str,
        run_id: Option<&str>,
    ) -> Option<String> {
        let thread = lock(&self.inner.threads)
            .get(&principal.key(thread_id))
            .cloned()?;
        if thread.agent != agent || !principal.may_use(agent) {
            return None;
        }
        let run = lock(&thread.state).live.clone()?;
        if let Some(wanted) = run_id
            && run.id != wanted
            && !lock(&run.aliases).iter().any(|alias| alias == wanted)
        {
            return None;
        }
        run.cancel_with(CancelReason::Requested);
        Some(run.id.clone())
    }

    /// Deletes thread `thread_id` as the operator (see [`Runtime::delete_thread_as`]).
    pub async fn delete_thread(&self, thread_id: &str) -> Result<bool, LoadError> {
        self.delete_thread_as(&Principal::operator(), thread_id)
            .await
    }

    /// Cancels the live run of thread `thread_id` of `principal`'s namespace (waiting for
    /// it to end), then deletes the thread from memory and the store. `false` when there
    /// was no such thread (or not one of an agent the principal may use).
    pub async fn delete_thread_as(
        &self,
        principal: &Principal,
        thread_id: &str,
    ) -> Result<bool, LoadError> {
        let key = principal.key(thread_id);
        loop {
            let Some(thread) = self.load_thread(&key).await? else {
                return Ok(false);
            };
            if !principal.may_use(&thread.agent) {
                return Ok(false);
            }
            let decide = thread.decide.lock().await;
            if thread.retired.load(Ordering::SeqCst) {
                // Deleted, discarded or evicted while this request waited: look again.
                continue;
            }
            let live = lock(&thread.state).live.clone();
            if let Some(run) = live {
                // Cancel, wait outside the decide section (bounded: a cancelled pump ends
                // within its cancel bound), then decide again: a run started meanwhile is
                // cancelled in turn.
                run.cancel_with(CancelReason::Requested);
                drop(decide);
                run.finished.cancelled().await;
                continue;
            }
            // Stored rows go first, then the thread leaves memory retired: a request
            // waiting on it starts over and finds no thread at all, so it starts a
            // brand-new one.
            // The agent forgets its session while the thread is still the one in memory,
            // so a session a brand-new thread of the same id binds later is never the one
            // forgotten.
            let stored = self.inner.store.delete_thread(&key).await;
            if let Some(agent) = self.inner.agents.get(&thread.agent) {
                agent.forget_thread(&key).await;
            }
            self.discard_thread(&thread);
            drop(decide);
            stored?;
            self.release_lease(&key).await;
            return Ok(true);
        }
    }

    /// Discards a thread `created` by a request that ends up refused, unless it has been
    /// used meanwhile (a run, a message): a refusal leaves nothing behind, and never takes
    /// away another request's thread.
    fn discard_if_pristine(&self, thread: &Arc<Thread>, created: bool) {
        if created && lock(&thread.state).is_pristine() {
            self.discard_thread(thread);
        }
    }

    /// Removes `thread` from memory (if it is still the one there) and retires it.
    fn discard_thread(&self, thread: &Arc<Thread>) {
        let mut threads = lock(&self.inner.threads);
        if threads
            .get(&thread.key)
            .is_some_and(|t| Arc::ptr_eq(t, thread))
        {
            threads.remove(&thread.key);
        }
        thread.retired.store(true, Ordering::SeqCst);
    }

    /// Refuses new runs from now on (`503 DRAINING`), and ends at once every run parked on
    /// the client (fail closed, `RUN_ERROR{code:"SHUTDOWN"}`): nothing will answer it before
    /// the daemon is gone, so it would only hold the shutdown for the whole grace. A run
    /// that parks later during the drain ends the same way (`Pump::suspend` checks).
    pub fn drain(&self) {
        {
            let _gate = self
                .inner
                .start_gate
                .write()
                .unwrap_or_else(|e| e.into_inner());
            self.inner.draining.store(true, Ordering::SeqCst);
        }
        let runs: Vec<_> = lock(&self.inner.runs).values().cloned().collect();
        for run in runs {
            if run.phase.get() == Phase::Suspended {
                run.cancel_with(CancelReason::Shutdown);
            }
        }
    }

    /// Waits until no run is live or `deadline` passes; `true` when all ended.
    pub async fn wait_runs(&self, deadline: Instant) -> bool {
        self.inner.run_tasks.close();
        let wait = self.inner.run_tasks.wait();
        tokio::time::timeout_at(deadline.into(), wait).await.is_ok()
    }

    /// Cancels every live run with `reason`.
    pub fn cancel_all(&self, reason: CancelReason) {
        let runs: Vec<_> = lock(&self.inner.runs).values().cloned().collect();
        for run in runs {
            run.cancel_with(reason);
        }
    }

    /// Ends every open stream after it has sent what is already journaled.
    pub fn stop_streams(&self) {
        self.inner.stop_streams.cancel();
    }

    /// Whether every agent can be started (`/readyz`).
    pub fn agents_ready(&self) -> bool {
        self.inner.agents.values().all(|agent| agent.ready())
    }

    /// The workspace of the thread `key` of agent `agent`: its directory and the agent's
    /// workspace settings (`None`: no such agent, or one without workspaces).
    pub fn workspace(
        &self,
        agent: &str,
        key: &str,
    ) -> Option<(std::path::PathBuf, crate::workspace::Workspaces)> {
        self.inner.agents.get(agent)?.workspace(key)
    }

    /// Each agent's last known state (`GET {path}/agents`), by name.
    pub fn agent_statuses(&self) -> Vec<(String, crate::agent::AgentStatus)> {
        self.inner
            .agents
            .iter()
            .map(|(name, agent)| (name.clone(), agent.status()))
            .collect()
    }

    /// Stops every agent backend (end of shutdown).
    pub async fn shutdown_agents(&self) {
        futures_util::future::join_all(self.inner.agents.values().map(|a| a.shutdown())).await;
    }

    /// Waits for pending store writes (end of shutdown).
    pub async fn flush_store(&self) {
        if let Err(error) = self.inner.store.flush().await {
            tracing::warn!(%error, "store flush failed");
        }
    }

    /// A run slot for `principal`: its own cap first (capped principals), then the
    /// daemon's.
    fn admit(&self, principal: &Principal) -> Result<Slot, StartError> {
        if self.is_draining() {
            return Err(StartError::Draining);
        }
        let owner = if principal.is_capped() {
            let mut counts = lock(&self.inner.per_principal);
            let count = counts.entry(principal.owner().to_owned()).or_insert(0);
            if *count >= self.inner.options.max_runs_per_principal {
                return Err(StartError::PrincipalBusy);
            }
            *count += 1;
            Some(PrincipalSlot {
                counts: self.inner.per_principal.clone(),
                owner: principal.owner().to_owned(),
            })
        } else {
            None
        };
        let global = self
            .inner
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| StartError::OverCapacity)?;
        Ok(Slot {
            _global: global,
            _principal: owner,
        })
    }

    fn memory_thread(&self, id: &str) -> Option<Arc<Thread>> {
        let thread = lock(&self.inner.threads).get(id).cloned()?;
        thread.last_used.store(now_ms(), Ordering::Relaxed);
        Some(thread)
    }

    /// The thread from memory, else from the store, else `None`. In a cluster, a thread
    /// that is not in memory is claimed first (see `lease.rs`); the lease of one that does
    /// not exist is kept for the request that creates it.
    async fn load_thread(&self, id: &str) -> Result<Option<Arc<Thread>>, LoadError> {
        if let Some(thread) = self.memory_thread(id) {
            if !self.lease_lost(id) {
                return Ok(Some(thread));
            }
            // Lost to another node since it was loaded: not this node's copy any more.
            self.let_go(id);
        }
        self.claim(id).await?;
        let Some(stored) = self.inner.store.load_thread(id).await? else {
            return Ok(None);
        };
        let thread = self.new_thread(
            id,
            &stored.row.agent,
            Some(stored.transcript),
            stored.row.session_id.clone(),
        );
        let (thread, inserted) = self.insert_thread(thread);
        if inserted {
            thread.account();
            self.enforce_budget();
        }
        Ok(Some(thread))
    }

    fn new_thread(
        &self,
        id: &str,
        agent: &str,
        stored: Option<Vec<Message>>,
        session_id: Option<String>,
    ) -> Thread {
        new_thread(
            id,
            agent,
            self.inner.epoch,
            self.inner.options.journal,
            stored,
            session_id,
            self.inner.meter.clone(),
        )
    }

    /// Bytes held against the memory budget.
    pub fn memory_in_use(&self) -> usize {
        self.inner.meter.get()
    }

    /// What retained data may hold: the budget less what is set aside for the process.
    pub fn retained_limit(&self) -> usize {
        let options = &self.inner.options;
        memory::retained_limit(options.memory_budget, options.memory_reserved)
    }

    /// Lets go of what the memory budget does not cover: while over it, threads in order of
    /// least recent use each give up the retained frames of their finished runs, and an
    /// idle one (nobody but the map holds it) leaves memory as well (it reloads from the
    /// store). The thread whose run just ended is the most recently used: its frames, the
    /// ones a client cut near the end reattaches to, go last.
    /// Cheap when under the budget.
    fn enforce_budget(&self) {
        let budget = self.retained_limit();
        let meter = &self.inner.meter;
        if meter.get() <= budget {
            return;
        }
        // Down to the low-water mark, so the scan below is paid once per sixteenth of the
        // budget rather than once per run that ends over it.
        let target = low_water(budget);
        tracing::debug!(held = meter.get(), budget, target, "over the memory budget");
        // Lock order: the map, then a thread's state (nothing takes the map under a state
        // lock). Holding the map, nobody takes a new reference to a thread meanwhile.
        let mut threads = lock(&self.inner.threads);
        let mut by_use: Vec<(u64, &String, &Arc<Thread>)> = threads
            .iter()
            .map(|(id, t)| (t.last_used.load(Ordering::Relaxed), id, t))
            .collect();
        by_use.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        // (A retired thread's bytes leave the meter when it is dropped, in `retire`.)
        let mut held = meter.get();
        let mut gone = Vec::new();
        for (_, id, thread) in by_use {
            if held <= target {
                break;
            }
            {
                // Under the state lock, so a run cannot start on the thread meanwhile.
                let state = lock(&thread.state);
                if state.live.is_none() {
                    held = held.saturating_sub(thread.journal.release());
                }
            }
            if Arc::strong_count(thread) == 1 {
                held = held.saturating_sub(thread.cached_bytes());
                gone.push(id.clone());
            }
        }
        retire(&mut threads, gone);
    }

    /// A thread's run ended: its share of the budget is brought up to date and the budget
    /// enforced.
    pub(super) fn run_ended(&self, thread: &Thread) {
        // Its frames are the freshest: they are what a client cut near the end reattaches to.
        thread.last_used.store(now_ms(), Ordering::Relaxed);
        thread.account();
        self.enforce_budget();
    }

    /// The disconnect grace after a run ended is over: its frames leave memory unless a new
    /// run is live, and so does the thread itself when it is idle and larger than a
    /// sixteenth of the budget.
    pub(super) fn grace_over(&self, thread: &Arc<Thread>) {
        {
            let state = lock(&thread.state);
            if state.live.is_some() {
                return;
            }
            thread.journal.release();
        }
        if thread.cached_bytes() > self.retained_limit() / 16 {
            let mut threads = lock(&self.inner.threads);
            // Held by the map and by the caller only: nobody else uses it.
            if threads
                .get(&thread.key)
                .is_some_and(|t| Arc::ptr_eq(t, thread) && Arc::strong_count(t) == 2)
                && let Some(evicted) = threads.remove(&thread.key)
            {
                evicted.retired.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Inserts `thread` unless one with its id is already there; returns the one in place
    /// and whether it is `thread`. Evicts idle threads beyond the in-memory bound.
    fn insert_thread(&self, thread: Thread) -> (Arc<Thread>, bool) {
        let mut threads = lock(&self.inner.threads);
        let mut inserted = false;
        let kept = threads
            .entry(thread.key.clone())
            .or_insert_with(|| {
                inserted = true;
                Arc::new(thread)
            })
            .clone();
        let bound = self.inner.options.max_threads_in_memory;
        if threads.len() > bound {
            // Down to the low-water mark, least recently used first: the scan is paid once
            // per sixteenth of the bound in new threads, not once per new thread.
            let excess = threads.len() - low_water(bound);
            let mut idle = idle_by_use(&threads);
            if idle.len() > excess {
                idle.select_nth_unstable(excess);
                idle.truncate(excess);
            }
            let gone = idle.into_iter().map(|(_, id)| id.to_owned()).collect();
            retire(&mut threads, gone);
        }
        (kept, inserted)
    }

    fn attachment(
        &self,
        thread: &Arc<Thread>,
        cursor: u64,
        profile: Profile,
        run: Option<Arc<LiveRun>>,
        mode: attach::Mode,
    ) -> Attachment {
        Attachment::new(
            thread.clone(),
            cursor,
            profile,
            mode,
            self.inner.options.keep_alive,
            self.inner.stop_streams.clone(),
            run,
        )
        .counted(self.inner.streams.open())
    }

    /// Attaches from the start of the live run's current segment: the journal replays it,
    /// then follows live.
    fn segment_attachment(
        &self,
        thread: &Arc<Thread>,
        run: Arc<LiveRun>,
        profile: Profile,
    ) -> Attachment {
        let cursor = run.segment_start.load(Ordering::SeqCst).saturating_sub(1);
        let attachment = self.attachment(
            thread,
            cursor,
            profile,
            Some(run.clone()),
            attach::Mode::Segment,
        );
        if attachment.is_registered() {
            return attachment;
        }
        // The segment's start is no longer retained (a long segment nobody was reading):
        // the stream starts with a resync of the segment instead, never a cut.
        self.resync(thread, run, profile, Resume::Resync, attach::Mode::Segment)
    }
}

fn transcript_json(transcript: &[Message]) -> Value {
    serde_json::to_value(transcript).unwrap_or_else(|_| json!([]))
}

/// The disconnect grace, where to track the watcher's task, and the run's span for its
/// log line.
struct DisconnectWatch {
    grace: Duration,
    tasks: TaskTracker,
    span: tracing::Span,
}

impl LiveRun {
    /// Counts one more attached stream.
    fn attach(&self) {
        self.attached.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts one stream fewer; when it was the last, a watcher cancels the run unless a
    /// stream attaches within the disconnect grace.
    fn detach(self: &Arc<LiveRun>) {
        if self.attached.fetch_sub(1, Ordering::SeqCst) != 1 || self.finished.is_cancelled() {
            return;
        }
        let generation = self.detaches.fetch_add(1, Ordering::SeqCst) + 1;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watch = pump::watch_disconnect(self.clone(), generation)
            .instrument(self.disconnect.span.clone());
        self.disconnect.tasks.spawn_on(watch, &handle);
    }

    /// Nobody is attached and nobody detached since the fall numbered `generation`.
    fn still_detached(&self, generation: u64) -> bool {
        self.attached.load(Ordering::SeqCst) == 0
            && self.detaches.load(Ordering::SeqCst) == generation
    }

    fn cancel_with(&self, reason: CancelReason) {
        {
            let mut current = lock(&self.reason);
            if current.is_none() {
                *current = Some(reason);
            }
        }
        self.cancel.cancel();
    }

    fn reason(&self) -> Option<CancelReason> {
        *lock(&self.reason)
    }
}

/// Where eviction stops once a bound is crossed: a sixteenth below it (the bound itself
/// when it is that small).
fn low_water(bound: usize) -> usize {
    bound - bound / 16
}

/// The threads nobody but the map holds (no request, no stream, no run), with when each was
/// last used. Holding the map lock, nobody can take a new reference meanwhile, so a thread
/// removed from the map never exists twice in memory.
fn idle_by_use(threads: &HashMap<String, Arc<Thread>>) -> Vec<(u64, &str)> {
    threads
        .iter()
        .filter(|(_, t)| Arc::strong_count(t) == 1)
        .map(|(id, t)| (t.last_used.load(Ordering::Relaxed), id.as_str()))
        .collect()
}

/// Takes these threads out of memory (they reload from the store when next needed).
fn retire(threads: &mut HashMap<String, Arc<Thread>>, ids: Vec<String>) {
    for id in ids {
        if let Some(evicted) = threads.remove(&id) {
            evicted.retired.store(true, Ordering::SeqCst);
        }
    }
}
