//! Runs, threads, the replay journal, admission and shutdown. Domain types only: nothing
//! here knows HTTP.
//!
//! A run is detached from the request that started it. [`Runtime::start_run`] decides, in
//! the thread's decide section (`thread.rs`: `ThreadState::decide`), whether a request
//! attaches to the thread's live run, answers or supersedes a suspended one, is refused, or
//! starts a new run; a new run gets an admission slot and its own task, the *pump*
//! (`run/drive.rs`), which drives the agent, is the only writer of the thread's journal, and
//! announces nothing before it is stored. Responses only read the journal through an [`Attachment`].
//! [`Runtime::reattach`] serves the stream route: exact replay after a client's last event
//! id, or an explicit resynchronisation, or a short hydration run when nothing is live.
//!
//! Threads persist in the [`Store`]; a thread not in memory is loaded from it on first use.
//!
//! Shutdown sequence: [`Runtime::drain`] refuses new runs -> [`Runtime::wait_runs`] waits for
//! running runs up to a deadline -> [`Runtime::cancel_all`] cancels the rest (each ends with
//! a terminal event) -> [`Runtime::stop_streams`] ends any stream still open.

mod admission;
mod answer;
pub mod attach;
mod cache;
mod errors;
pub mod fleet;
mod history;
pub mod journal;
mod lease;
mod live;
pub mod memory;
mod notices;
mod observe;
pub mod queue;
mod reattach;
mod rewind;
mod run;
mod runs;
pub mod sanitize;
mod schedule;
mod sessions;
pub mod state;
pub mod suspension;
mod thread;
pub mod translator;
pub mod ui;
mod warm;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use attach::{Attachment, Resume};
pub use errors::{CancelReason, ReattachError, StartError};
pub use fleet::{FleetFrom, FleetFull, FleetItem, FleetLimits, FleetStream};
pub use journal::{EventId, Gap, Journal, JournalLimits};
pub(in crate::runtime) use live::{Control, LiveRun, NextSegment, Phase};
pub use rewind::{RewindError, RewindScope, Rewound, answer_json as rewind_json};
pub use schedule::{
    CronError, CronSchedule, LATE_TOLERANCE, MAX_SCHEDULES_PER_OWNER, NewSchedule, ScheduleClock,
    ScheduleError,
};
pub use sessions::{ForkAt, NewThread, SessionRequestError};

use crate::access::{Principal, ThreadKey};
use crate::agent::Agent;
use crate::agent::Hitl;
use crate::clock::now_ms;
use crate::metrics::{RunMetrics, StreamMetrics};
use crate::protocol::RunAgentInput;
use crate::protocol::input::Message;
use crate::store::Store;
use crate::sync::lock;
use crate::traces::Tracer;
pub use lease::LoadError;
use opentelemetry::trace::SpanContext;
use thread::Thread;

/// How long a delete waits, in the thread's decide section, for its agent to forget the
/// thread (an ACP backend bounds each of its requests to 5 s itself): a hung agent never
/// freezes a thread.
pub const FORGET_BOUND: Duration = Duration::from_secs(15);

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
    /// What new input does to each agent's busy threads (default: reject).
    pub multitask: HashMap<String, crate::agent::Multitask>,
    /// The agents whose runs follow the client's history unless a request says otherwise.
    pub client_history: std::collections::HashSet<String>,
    /// What runs, threads and principals may spend (`[budgets]`).
    pub budgets: crate::budget::Budgets,
    /// Agents whose runs have a budget of their own, over `budgets.run`.
    pub agent_budgets: HashMap<String, crate::budget::Limits>,
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
    /// The agents' egress proxies and model relays (the same handles their host counts on).
    pub egress_metrics: crate::metrics::EgressMetrics,
    /// This node's membership of a cluster (PostgreSQL store), if any.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The principals' uploads, resolved into the parts that name them (`None`: a part's
    /// URL always goes as a link).
    pub uploads: Option<Arc<crate::uploads::Uploads>>,
    /// The webhook outbox (`None`: no `[[webhooks]]`, nothing is reported).
    pub webhooks: Option<Arc<crate::webhooks::Outbox>>,
    /// The wall clock schedules are read against (tests drive it with paused time).
    pub schedule_clock: ScheduleClock,
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
            multitask: HashMap::new(),
            client_history: Default::default(),
            budgets: crate::budget::Budgets::default(),
            agent_budgets: HashMap::new(),
            secrets: Vec::new(),
            max_runs_per_principal: DEFAULT_MAX_RUNS_PER_PRINCIPAL,
            fleet_history: fleet::DEFAULT_FLEET_HISTORY,
            fleet_limits: fleet::FleetLimits::default(),
            ui: Arc::new(ui::UiCatalog::defaults()),
            tracer: None,
            egress_metrics: crate::metrics::EgressMetrics::default(),
            cluster: None,
            uploads: None,
            webhooks: None,
            schedule_clock: ScheduleClock::System,
        }
    }
}

/// Run gauge for `/healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    pub active: usize,
    pub capacity: usize,
}

/// The runtime: a facade over its rooms (threads in memory, live runs, admission) and the
/// services they share. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

/// A runtime's handle that does not keep it alive (its background tasks hold one).
#[derive(Clone)]
pub(in crate::runtime) struct WeakRuntime(std::sync::Weak<Inner>);

impl WeakRuntime {
    pub(in crate::runtime) fn upgrade(&self) -> Option<Runtime> {
        self.0.upgrade().map(|inner| Runtime { inner })
    }
}

struct Inner {
    agents: BTreeMap<String, Arc<dyn Agent>>,
    threads: Arc<cache::Threads>,
    runs: runs::LiveRuns,
    admission: admission::Admission,
    options: RuntimeOptions,
    store: Store,
    /// Fires to end every open stream (last step of shutdown).
    stop_streams: CancellationToken,
    started_at: Instant,
    run_metrics: RunMetrics,
    streams: Arc<StreamMetrics>,
    /// The fleet document, its history and the wake-up of the task that rebuilds it.
    fleet: fleet::FleetRoom,
    /// The scheduler's wake-up and stop (`schedule/`).
    scheduling: schedule::Scheduling,
    /// Each principal's day of budget spending on this node, shared by its runs.
    days: run::budget::Days,
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
        let threads = Arc::new(cache::Threads::new(&options, epoch, meter.clone()));
        threads.spawn_stall_check(options.stall_timeout);
        let runtime = Runtime {
            inner: Arc::new(Inner {
                agents,
                threads,
                runs: runs::LiveRuns::default(),
                admission: admission::Admission::new(
                    options.max_concurrent_runs,
                    options.max_runs_per_principal,
                ),
                store,
                stop_streams: CancellationToken::new(),
                started_at: Instant::now(),
                run_metrics,
                streams: Arc::default(),
                fleet: fleet::FleetRoom::new(fleet::Fleet::new(
                    epoch,
                    options.fleet_history,
                    Value::Null,
                    now_ms(),
                    options.fleet_limits,
                    meter,
                )),
                scheduling: schedule::Scheduling::default(),
                days: run::budget::Days::default(),
                options,
            }),
        };
        runtime.inner.fleet.update(runtime.fleet_document());
        runtime.spawn_fleet();
        runtime.spawn_lease_renewal();
        runtime.spawn_warm_up();
        runtime
    }

    pub(in crate::runtime) fn downgrade(&self) -> WeakRuntime {
        WeakRuntime(Arc::downgrade(&self.inner))
    }

    pub(in crate::runtime) fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// The backend of agent `name`.
    pub(in crate::runtime) fn agent(&self, name: &str) -> Option<&Arc<dyn Agent>> {
        self.inner.agents.get(name)
    }

    pub(in crate::runtime) fn agents(&self) -> &BTreeMap<String, Arc<dyn Agent>> {
        &self.inner.agents
    }

    /// The threads in memory.
    pub(in crate::runtime) fn threads(&self) -> &cache::Threads {
        &self.inner.threads
    }

    pub(in crate::runtime) fn runs(&self) -> &runs::LiveRuns {
        &self.inner.runs
    }

    pub(in crate::runtime) fn admission(&self) -> &admission::Admission {
        &self.inner.admission
    }

    pub(in crate::runtime) fn fleet(&self) -> &fleet::FleetRoom {
        &self.inner.fleet
    }

    pub(in crate::runtime) fn scheduling(&self) -> &schedule::Scheduling {
        &self.inner.scheduling
    }

    pub(in crate::runtime) fn days(&self) -> &run::budget::Days {
        &self.inner.days
    }

    /// What fires to end every open stream.
    pub(in crate::runtime) fn stop_token(&self) -> &CancellationToken {
        &self.inner.stop_streams
    }

    /// The run counters and histograms.
    pub fn run_metrics(&self) -> &RunMetrics {
        &self.inner.run_metrics
    }

    /// The stream counters (shared with the HTTP layer).
    pub fn stream_metrics(&self) -> Arc<StreamMetrics> {
        self.inner.streams.clone()
    }

    /// The span of the request being handled, when traces are on (a link for the turn it
    /// opens).
    fn request_span(&self) -> Option<SpanContext> {
        self.options()
            .tracer
            .as_ref()
            .and_then(|_| crate::traces::current_span_context())
    }

    pub fn has_agent(&self, name: &str) -> bool {
        self.agents().contains_key(name)
    }

    /// The store this runtime persists to.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn uptime(&self) -> Duration {
        self.inner.started_at.elapsed()
    }

    pub fn is_draining(&self) -> bool {
        self.inner.admission.is_draining()
    }

    pub fn gauge(&self) -> Gauge {
        self.inner.admission.gauge()
    }

    /// The status of a thread as this process sees it (`running` while a run is live).
    pub fn live_status(&self, key: &ThreadKey) -> Option<&'static str> {
        let thread = self.inner.threads.get(key)?;
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
        match self.agent(agent) {
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
        mut input: RunAgentInput,
    ) -> Result<Attachment, StartError> {
        self.keep_plain(&mut input.messages);
        loop {
            if let Ok(outcome) = self.decide_run(principal, agent, &input).await {
                if let Err(error) = &outcome {
                    self.run_metrics().refused(error.reason());
                }
                return outcome;
            }
        }
    }

    /// Starts a run for `input` on `agent` in `principal`'s namespace with no stream to
    /// follow it: it goes on until it ends, whoever attaches or not (a wait on the client
    /// still times out). Its run id; refused as [`Runtime::start_run_as`] refuses, and
    /// with [`StartError::RunInProgress`] when the request starts nothing (no new input on
    /// a live run).
    pub async fn start_background_run_as(
        &self,
        principal: &Principal,
        agent: &str,
        input: RunAgentInput,
    ) -> Result<String, StartError> {
        let run_id = input.run_id.clone();
        let attachment = self.start_run_as(principal, agent, input).await?;
        if attachment.is_queued() {
            // In the thread's queue: it runs, as a background run, when its turn comes.
            return Ok(run_id);
        }
        let Some(run) = attachment.live_run() else {
            // Answered in-band (an answer nothing waits for): nothing was started.
            return Err(StartError::Input(crate::protocol::InputError {
                field: None,
                message: "the request starts no run: it only answers what nothing on the \
                          thread waits for"
                    .to_owned(),
            }));
        };
        if !lock(&run.aliases).contains(&run_id) {
            return Err(StartError::RunInProgress(run.id.clone()));
        }
        run.background.store(true, Ordering::SeqCst);
        Ok(run_id)
    }

    /// Cancels a live run by id, as the operator (see [`Runtime::cancel_run_as`]).
    pub fn cancel_run(&self, run_id: &str, reason: CancelReason) -> bool {
        self.cancel_run_as(&Principal::operator(), run_id, reason)
    }

    /// Cancels the live run `run_id` of `principal`'s namespace; a principal that sees
    /// every namespace (the operator) cancels every live run of that id. `false` when
    /// there is no such live run.
    pub fn cancel_run_as(&self, principal: &Principal, run_id: &str, reason: CancelReason) -> bool {
        let runs: Vec<Arc<LiveRun>> = if principal.sees_everyone() {
            self.inner.runs.with_id(run_id)
        } else {
            self.inner
                .runs
                .get(&principal.run_key(run_id))
                .filter(|run| principal.may_use(&run.agent))
                .into_iter()
                .collect()
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
        let thread = self.inner.threads.peek(&principal.key(thread_id))?;
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
            // Its queued input will not run: the streams waiting for it are told.
            self.drop_queue(&thread, "the thread was deleted");
            // Stored rows go first, then the thread leaves memory retired: a request
            // waiting on it starts over and finds no thread at all, so it starts a
            // brand-new one.
            // The agent forgets its session while the thread is still the one in memory,
            // so a session a brand-new thread of the same id binds later is never the one
            // forgotten.
            let deleted = notices::deleted(self, &thread);
            let reported = deleted.is_some();
            let stored = self
                .store()
                .delete_thread_notifying(key.as_str(), deleted)
                .await;
            self.outgoing_queued(reported && stored.as_ref().is_ok_and(|gone| *gone));
            self.fleet_activity(thread.owner());
            if let Some(agent) = self.agent(&thread.agent)
                && tokio::time::timeout(FORGET_BOUND, agent.forget_thread(key.as_str()))
                    .await
                    .is_err()
            {
                tracing::warn!(
                    bound_s = FORGET_BOUND.as_secs(),
                    "the agent did not forget the deleted thread in time; deleted without it"
                );
            }
            // Its uploads go while the decide section is held, so a new thread of the
            // same id cannot bind one meanwhile.
            if stored.is_ok()
                && let Some(uploads) = &self.options().uploads
            {
                uploads.remove_thread(principal.owner(), key.as_str()).await;
            }
            self.inner.threads.discard(&thread);
            drop(decide);
            stored?;
            self.release_lease(&key).await;
            return Ok(true);
        }
    }

    /// The principals' uploads, when this runtime keeps them.
    pub fn uploads(&self) -> Option<&Arc<crate::uploads::Uploads>> {
        self.options().uploads.as_ref()
    }

    /// `messages` (JSON) as a client is shown them on thread `key`: each upload they name
    /// by a fresh link of the thread owner's that needs no token.
    pub(crate) fn shown(&self, key: &ThreadKey, mut messages: Value) -> Value {
        if let Some(uploads) = self.uploads() {
            uploads.show(key.split().0, &mut messages);
        }
        messages
    }

    /// `messages` as the daemon keeps them: each upload URL without a query (a link's
    /// signature, a token pasted into it).
    pub fn keep_plain(&self, messages: &mut [Message]) {
        if let Some(uploads) = self.uploads() {
            uploads.keep_plain(messages);
        }
    }

    /// Refuses new runs from now on (`503 DRAINING`), and ends at once every run parked on
    /// the client (fail closed, `RUN_ERROR{code:"SHUTDOWN"}`): nothing will answer it before
    /// the daemon is gone, so it would only hold the shutdown for the whole grace. A run
    /// that parks later during the drain ends the same way (`Pump::suspend` checks).
    pub fn drain(&self) {
        self.inner.admission.drain();
        self.scheduling().stop();
        for run in self.inner.runs.all() {
            if run.phase.get() == Phase::Suspended {
                run.cancel_with(CancelReason::Shutdown);
            }
        }
    }

    /// Waits until no run is live or `deadline` passes; `true` when all ended.
    pub async fn wait_runs(&self, deadline: Instant) -> bool {
        self.inner.admission.wait(deadline).await
    }

    /// Cancels every live run with `reason`.
    pub fn cancel_all(&self, reason: CancelReason) {
        for run in self.inner.runs.all() {
            run.cancel_with(reason);
        }
    }

    /// Ends every open stream after it has sent what is already journaled.
    pub fn stop_streams(&self) {
        self.inner.stop_streams.cancel();
    }

    /// Whether every agent can be started (`/readyz`).
    pub fn agents_ready(&self) -> bool {
        self.agents().values().all(|agent| agent.ready())
    }

    /// The workspace of the thread `key` of agent `agent`: its directory and the agent's
    /// workspace settings (`None`: no such agent, or one without workspaces).
    pub fn workspace(
        &self,
        agent: &str,
        key: &ThreadKey,
    ) -> Option<(std::path::PathBuf, crate::workspace::Workspaces)> {
        self.agent(agent)?.workspace(key.as_str())
    }

    /// Each agent's last known state (`GET {path}/agents`), by name.
    pub fn agent_statuses(&self) -> Vec<(String, crate::agent::AgentStatus)> {
        self.agents()
            .iter()
            .map(|(name, agent)| (name.clone(), agent.status()))
            .collect()
    }

    /// What agent `name` can take and do, and how it asks a person (`None`: no such agent).
    /// What agent `name` may reach beyond its sandbox (`/info`; names only).
    pub fn agent_reach(&self, name: &str) -> Option<Value> {
        self.agent(name)?.reach()
    }

    pub fn agent_features(
        &self,
        name: &str,
    ) -> Option<(crate::agent::Features, crate::agent::Hitl)> {
        let agent = self.agent(name)?;
        let hitl = self
            .options()
            .hitl
            .get(name)
            .copied()
            .unwrap_or(crate::agent::Hitl::Tool);
        Some((agent.features(), hitl))
    }

    /// Stops every agent backend (end of shutdown).
    pub async fn shutdown_agents(&self) {
        futures_util::future::join_all(self.agents().values().map(|a| a.shutdown())).await;
    }

    /// Waits for pending store writes (end of shutdown).
    pub async fn flush_store(&self) {
        if let Err(error) = self.store().flush().await {
            tracing::warn!(%error, "store flush failed");
        }
    }
}

fn transcript_json(transcript: &[Message]) -> Value {
    serde_json::to_value(transcript).unwrap_or_else(|_| json!([]))
}
