//! Runs, threads, the replay journal, admission and shutdown. Domain types only: nothing
//! here knows HTTP.
//!
//! A run is detached from the request that started it. [`Runtime::start_run`] decides,
//! under a per-thread lock, whether a request attaches to the thread's live run, is refused
//! (new input while running), or starts a new run; a new run gets an admission slot and its
//! own task, the *pump* (`pump.rs`), which drives the agent and is the only writer of the
//! thread's journal. Responses only read the journal through an [`Attachment`].
//!
//! Shutdown sequence: [`Runtime::drain`] refuses new runs -> [`Runtime::wait_runs`] waits for
//! running runs up to a deadline -> [`Runtime::cancel_all`] cancels the rest (each ends with
//! a terminal event) -> [`Runtime::stop_streams`] ends any stream still open.

pub mod attach;
pub mod journal;
mod pump;
pub mod sanitize;
pub mod translator;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use attach::{Attachment, Resume};
pub use journal::{EventId, Gap, Journal, JournalLimits};

use crate::agent::Agent;
use crate::protocol::input::Message;
use crate::protocol::{Profile, RunAgentInput};

/// Tunables of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub max_concurrent_runs: usize,
    pub disconnect_grace: Duration,
    pub keep_alive: Duration,
    pub suspend_timeout: Duration,
    pub journal: JournalLimits,
    /// Literal secrets scrubbed from every error message (the daemon's token).
    pub secrets: Vec<String>,
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
    #[error("thread belongs to agent {0}")]
    AgentMismatch(String),
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
    threads: Mutex<HashMap<String, Arc<Thread>>>,
    runs: Mutex<HashMap<String, Arc<LiveRun>>>,
    slots: Arc<Semaphore>,
    options: RuntimeOptions,
    epoch: u64,
    draining: AtomicBool,
    /// Pumps and their watchers.
    run_tasks: TaskTracker,
    /// Fires to end every open stream (last step of shutdown).
    stop_streams: CancellationToken,
    started_at: Instant,
}

/// One conversation: its journal, its live run, and what it has seen.
pub(crate) struct Thread {
    pub(crate) id: String,
    pub(crate) agent: String,
    pub(crate) journal: Journal,
    /// Serializes the decide-attach/refuse/start section.
    decide: tokio::sync::Mutex<()>,
    state: Mutex<ThreadState>,
}

#[derive(Default)]
struct ThreadState {
    live: Option<Arc<LiveRun>>,
    /// Ids of every message the agent has been given or produced.
    seen: HashSet<String>,
    /// The transcript, in order.
    transcript: Vec<Message>,
}

/// A run that has not ended.
pub(crate) struct LiveRun {
    pub(crate) id: String,
    cancel: CancellationToken,
    reason: Mutex<Option<CancelReason>>,
    /// Number of attached streams.
    pub(crate) attached: watch::Sender<usize>,
    /// Journal sequence of the current segment's `RUN_STARTED`.
    segment_start: AtomicU64,
    /// Fires when the pump has finished (terminal event written, slot released).
    finished: CancellationToken,
}

impl Runtime {
    /// A runtime serving `agents` (by name).
    pub fn new(agents: BTreeMap<String, Arc<dyn Agent>>, options: RuntimeOptions) -> Runtime {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        Runtime {
            inner: Arc::new(Inner {
                agents,
                threads: Mutex::new(HashMap::new()),
                runs: Mutex::new(HashMap::new()),
                slots: Arc::new(Semaphore::new(options.max_concurrent_runs)),
                epoch,
                draining: AtomicBool::new(false),
                run_tasks: TaskTracker::new(),
                stop_streams: CancellationToken::new(),
                started_at: Instant::now(),
                options,
            }),
        }
    }

    /// Names of the served agents.
    pub fn agent_names(&self) -> impl Iterator<Item = &str> {
        self.inner.agents.keys().map(String::as_str)
    }

    pub fn has_agent(&self, name: &str) -> bool {
        self.inner.agents.contains_key(name)
    }

    /// This process's boot epoch (carried in every event id).
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
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

    /// Starts a run for `input` on `agent`, or attaches to the thread's live run when the
    /// request carries no new input. Refusals happen before anything is created.
    pub async fn start_run(
        &self,
        agent: &str,
        input: RunAgentInput,
    ) -> Result<Attachment, StartError> {
        let inner = &self.inner;
        let Some(backend) = inner.agents.get(agent).cloned() else {
            return Err(StartError::UnknownAgent);
        };
        let profile = Profile::from_protocol_version(input.protocol_version.as_deref());
        let existing = self.thread(&input.thread_id);
        if let Some(thread) = &existing
            && thread.agent != agent
        {
            return Err(StartError::AgentMismatch(thread.agent.clone()));
        }
        // A brand-new thread needs a slot before it may exist at all.
        let mut permit = None;
        if existing.is_none() {
            permit = Some(self.admit()?);
        }
        let thread = match existing {
            Some(thread) => thread,
            None => self.thread_or_insert(&input.thread_id, agent),
        };
        if thread.agent != agent {
            return Err(StartError::AgentMismatch(thread.agent.clone()));
        }

        let _decide = thread.decide.lock().await;
        let (live, has_new_input) = {
            let state = lock(&thread.state);
            let has_new_input = !input.resume.is_empty()
                || input.messages.iter().any(|m| {
                    matches!(m, Message::User(_) | Message::Tool(_)) && !state.seen.contains(m.id())
                });
            (state.live.clone(), has_new_input)
        };
        if let Some(run) = live {
            if has_new_input {
                return Err(StartError::RunInProgress);
            }
            // Attach from the start of the live run's current segment: the journal replays
            // it and follows live.
            let cursor = run.segment_start.load(Ordering::SeqCst).saturating_sub(1);
            return Ok(Attachment::new(
                thread.clone(),
                cursor,
                profile,
                inner.options.keep_alive,
                inner.stop_streams.clone(),
                Some(run),
            ));
        }
        if self.is_draining() {
            return Err(StartError::Draining);
        }
        let permit = match permit {
            Some(permit) => permit,
            None => self.admit()?,
        };
        Ok(pump::start(self, &thread, backend, input, profile, permit))
    }

    /// Cancels a live run by id. `false` when there is no such live run.
    pub fn cancel_run(&self, run_id: &str, reason: CancelReason) -> bool {
        let run = lock(&self.inner.runs).get(run_id).cloned();
        match run {
            Some(run) => {
                run.cancel_with(reason);
                true
            }
            None => false,
        }
    }

    /// Refuses new runs from now on (`503 DRAINING`).
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
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

    fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, StartError> {
        if self.is_draining() {
            return Err(StartError::Draining);
        }
        self.inner
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| StartError::OverCapacity)
    }

    fn thread(&self, id: &str) -> Option<Arc<Thread>> {
        lock(&self.inner.threads).get(id).cloned()
    }

    fn thread_or_insert(&self, id: &str, agent: &str) -> Arc<Thread> {
        lock(&self.inner.threads)
            .entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(Thread {
                    id: id.to_owned(),
                    agent: agent.to_owned(),
                    journal: Journal::new(self.inner.epoch, self.inner.options.journal),
                    decide: tokio::sync::Mutex::new(()),
                    state: Mutex::new(ThreadState::default()),
                })
            })
            .clone()
    }
}

impl LiveRun {
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

/// Locks a std mutex, recovering from poisoning (state behind these locks is updated in
/// single steps that leave it consistent). Never held across an `.await`.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
