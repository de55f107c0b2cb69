//! A live run: what the runtime, the pump and every stream share about a run that has not
//! ended (its cancel token, phase, commands, attached count, suspension), and the watcher
//! that cancels it once nobody has been attached for the grace.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::runtime::CancelReason;
use crate::runtime::suspension::{self};
use crate::runtime::translator::Translator;
use crate::sync::lock;
use opentelemetry::trace::SpanContext;

/// Whether a live run is producing a segment or waiting on the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime) enum Phase {
    Running,
    Suspended,
}

/// A live run's [`Phase`]: written by its pump, read anywhere without a lock, and waited
/// on for the run to wake (a flag and one wake-up: a `watch` would keep eight).
#[derive(Debug, Default)]
pub(in crate::runtime) struct PhaseCell {
    pub(in crate::runtime) suspended: AtomicBool,
    pub(in crate::runtime) woke: tokio::sync::Notify,
}

impl PhaseCell {
    pub(in crate::runtime) fn get(&self) -> Phase {
        if self.suspended.load(Ordering::SeqCst) {
            Phase::Suspended
        } else {
            Phase::Running
        }
    }

    pub(in crate::runtime) fn set(&self, phase: Phase) {
        self.suspended
            .store(phase == Phase::Suspended, Ordering::SeqCst);
        if phase == Phase::Running {
            self.woke.notify_waiters();
        }
    }

    /// Returns once the run is running. The wake-up is armed before the flag is read, so
    /// a wake between the two is not missed.
    pub(in crate::runtime) async fn running(&self) {
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
pub(in crate::runtime) enum Control {
    /// The waits were answered (or failed closed): open the next segment.
    Resume(Box<NextSegment>),
    /// The agent took these messages into the running turn (steering): show and record
    /// them where they landed.
    Steered(Vec<crate::protocol::input::Message>),
}

/// The commands to a run's pump, in order: a queue and a wake-up. (A channel would do,
/// but allocates its first block of slots up front, which every run that sits idle would
/// keep; commands are rare.)
#[derive(Debug, Default)]
pub(in crate::runtime) struct Controls {
    pub(in crate::runtime) queue: Mutex<VecDeque<Control>>,
    pub(in crate::runtime) ready: tokio::sync::Notify,
}

impl Controls {
    pub(in crate::runtime) fn send(&self, command: Control) {
        lock(&self.queue).push_back(command);
        self.ready.notify_one();
    }

    pub(in crate::runtime) fn try_recv(&self) -> Option<Control> {
        lock(&self.queue).pop_front()
    }

    /// The next command. A command sent after the queue was seen empty leaves a permit
    /// with the wake-up, so it is never missed.
    pub(in crate::runtime) async fn recv(&self) -> Control {
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
pub(in crate::runtime) struct NextSegment {
    /// Its AG-UI run id.
    pub(in crate::runtime) run_id: String,
    pub(in crate::runtime) parent_run_id: Option<String>,
    /// Client tool calls of the suspension that got no answer: each gets a tool result
    /// saying it was cancelled (`why`), so the transcript stays a valid AG-UI history.
    pub(in crate::runtime) abandoned: Vec<String>,
    pub(in crate::runtime) why: String,
    /// The span of the request that opens it, when traces are on.
    pub(in crate::runtime) link: Option<SpanContext>,
}

/// A run that has not ended.
pub(in crate::runtime) struct LiveRun {
    pub(in crate::runtime) id: String,
    pub(in crate::runtime) cancel: CancellationToken,
    pub(in crate::runtime) reason: Mutex<Option<CancelReason>>,
    /// Number of attached streams.
    pub(in crate::runtime) attached: AtomicUsize,
    /// How many times the attached count fell to zero: a disconnect watcher acts only if
    /// no later fall (with a watcher of its own) happened while it waited.
    pub(in crate::runtime) detaches: AtomicU64,
    /// What the disconnect watcher needs, spawned only when the last stream detaches.
    pub(in crate::runtime) disconnect: DisconnectWatch,
    /// Journal sequence of the current segment's `RUN_STARTED`.
    pub(in crate::runtime) segment_start: AtomicU64,
    /// Fires when the pump has finished (terminal event written, slot released).
    pub(in crate::runtime) finished: CancellationToken,
    /// The segment's lifecycle state; written by the pump only, read for resync.
    pub(in crate::runtime) translator: Mutex<Translator>,
    /// Commands to the pump.
    pub(in crate::runtime) control: Controls,
    /// The open waits while suspended; taken by whoever resolves them.
    pub(in crate::runtime) suspension: Mutex<Option<Box<suspension::Suspension>>>,
    pub(in crate::runtime) phase: PhaseCell,
    /// Every AG-UI run id of this run's segments (each works for cancel).
    pub(in crate::runtime) aliases: Mutex<Vec<String>>,
    /// When it was admitted (ms since the epoch).
    pub(in crate::runtime) started_at_ms: u64,
    /// The agent it runs on.
    pub(in crate::runtime) agent: String,
    /// Started with no stream to follow it (`POST {path}/threads/{id}/runs`): never
    /// cancelled for want of an attached stream.
    pub(in crate::runtime) background: std::sync::atomic::AtomicBool,
    /// Why the run was ended on its budget (with [`CancelReason::Budget`]).
    pub(in crate::runtime) budget_note: Mutex<Option<String>>,
}

/// The disconnect grace, where to track the watcher's task, and the run's span for its
/// log line.
pub(in crate::runtime) struct DisconnectWatch {
    pub(in crate::runtime) grace: Duration,
    pub(in crate::runtime) tasks: TaskTracker,
    pub(in crate::runtime) span: tracing::Span,
}

impl LiveRun {
    /// A run just admitted as `run_id` on thread `thread_id` of `agent`, its first segment
    /// starting at journal sequence `segment_start`.
    pub(in crate::runtime) fn new(
        run_id: &str,
        thread_id: &str,
        agent: &str,
        segment_start: u64,
        disconnect: DisconnectWatch,
    ) -> LiveRun {
        LiveRun {
            id: run_id.to_owned(),
            cancel: CancellationToken::new(),
            reason: Mutex::new(None),
            attached: AtomicUsize::new(0),
            detaches: AtomicU64::new(0),
            disconnect,
            segment_start: AtomicU64::new(segment_start),
            finished: CancellationToken::new(),
            translator: Mutex::new(Translator::new(thread_id, run_id)),
            control: Controls::default(),
            suspension: Mutex::new(None),
            phase: PhaseCell::default(),
            aliases: Mutex::new(vec![run_id.to_owned()]),
            started_at_ms: crate::clock::now_ms(),
            agent: agent.to_owned(),
            background: std::sync::atomic::AtomicBool::new(false),
            budget_note: Mutex::new(None),
        }
    }
    /// Counts one more attached stream.
    pub(in crate::runtime) fn attach(&self) {
        self.attached.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts one stream fewer; when it was the last, a watcher cancels the run unless a
    /// stream attaches within the disconnect grace.
    pub(in crate::runtime) fn detach(self: &Arc<LiveRun>) {
        if self.attached.fetch_sub(1, Ordering::SeqCst) != 1
            || self.finished.is_cancelled()
            || self.background.load(Ordering::SeqCst)
        {
            return;
        }
        let generation = self.detaches.fetch_add(1, Ordering::SeqCst) + 1;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let watch =
            watch_disconnect(self.clone(), generation).instrument(self.disconnect.span.clone());
        self.disconnect.tasks.spawn_on(watch, &handle);
    }

    /// Nobody is attached and nobody detached since the fall numbered `generation`.
    pub(in crate::runtime) fn still_detached(&self, generation: u64) -> bool {
        self.attached.load(Ordering::SeqCst) == 0
            && self.detaches.load(Ordering::SeqCst) == generation
    }

    pub(in crate::runtime) fn cancel_with(&self, reason: CancelReason) {
        {
            let mut current = lock(&self.reason);
            if current.is_none() {
                *current = Some(reason);
            }
        }
        self.cancel.cancel();
    }

    pub(in crate::runtime) fn reason(&self) -> Option<CancelReason> {
        *lock(&self.reason)
    }
}

/// Cancels the run once nobody has been attached for the disconnect grace, counted from
/// the detach numbered `generation` (spawned by [`LiveRun::detach`]; it gives up to a later
/// detach's watcher, or when a stream attaches). A suspended run is waiting on the client
/// by design (its stream ended with the segment): it is not cancelled for that, its
/// suspension timeout applies instead, and the grace counts again once it wakes.
pub(in crate::runtime) async fn watch_disconnect(run: Arc<LiveRun>, generation: u64) {
    let grace = run.disconnect.grace;
    loop {
        tokio::select! {
            () = run.cancel.cancelled() => return,
            () = run.finished.cancelled() => return,
            () = tokio::time::sleep(grace) => {}
        }
        if !run.still_detached(generation) {
            return;
        }
        if run.phase.get() == Phase::Suspended {
            tokio::select! {
                () = run.cancel.cancelled() => return,
                () = run.finished.cancelled() => return,
                () = run.phase.running() => {}
            }
            if !run.still_detached(generation) {
                return;
            }
            continue;
        }
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "no stream attached for the disconnect grace; cancelling"
        );
        run.cancel_with(CancelReason::Abandoned);
        return;
    }
}

pub(in crate::runtime) fn pending_len(run: &LiveRun) -> usize {
    lock(&run.suspension).as_ref().map_or(0, |s| s.waits.len())
}
