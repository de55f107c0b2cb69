//! The pump's drive loop: one task per run that drives the agent and is the only writer of the thread's
//! journal for as long as the run lives.
//!
//! Agent output flows agent -> sink -> pump -> translator -> journal. The HTTP request that
//! started the run only reads the journal, so a disconnect never stops the agent.
//!
//! A run is a sequence of segments. When the agent waits on the client (a frontend tool, a
//! permission), the pump ends the segment (`RUN_FINISHED` with `pendingToolCallIds`, or an
//! interrupt outcome) and parks the run: alive, holding its slot, buffering anything the
//! agent still sends. A later request answers (the runtime hands the answers over and sends
//! [`Control::Resume`]) and the pump opens the next segment under that request's run id; a
//! timeout, a cancel or a shutdown fail the waits closed and the pump opens a continuation
//! segment for what follows. A [`SegmentWriter`] guarantees, even on panic, that the last
//! segment gets its terminal event, the thread's live run is cleared and the admission slot
//! is released exactly once.

use std::collections::{BTreeSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value, json};

use super::segment::{SegmentWriter, ending_kind};
use crate::agent::Hitl;
use crate::agent::{Agent, AgentEvent, EventSink, SinkItem, Turn};
use crate::protocol::events::Interrupt;
use crate::protocol::input::Message;
use crate::runtime::CancelReason;
use crate::runtime::live::{Control, NextSegment, Phase, pending_len};
use crate::runtime::suspension::{Channel, Suspension, Wait};
use crate::runtime::translator::{Ending, Translator};
use crate::sync::lock;
use tokio::time::Instant;

/// How long an agent may take to stop after its run was cancelled before the pump gives up
/// on it and ends the segment anyway.
const CANCEL_BOUND: Duration = Duration::from_millis(1500);
/// Agent events buffered between the agent and the pump. An agent that streams fast fills
/// it while the pump works, so it is also how many items a batch takes: 256 short deltas
/// make about 20 kB of frames, more than the attachment's 16 kB chunk, so a batch is one
/// full write (64 made twice the `writev`s of the coalescing baseline; docs/benchmark.md).
const SINK_CAPACITY: usize = 256;
/// Agent items the pump turns into frames before it wakes the readers.
const DRAIN_BATCH: usize = SINK_CAPACITY;

/// The pump's own state, beside the segment writer.
pub(in crate::runtime) struct Pump {
    pub(in crate::runtime) writer: SegmentWriter,
    pub(in crate::runtime) hitl: Hitl,
    pub(in crate::runtime) suspend_timeout: Duration,
    /// When the current suspension fails closed.
    pub(in crate::runtime) deadline: Option<Instant>,
    /// Agent output that arrived while suspended, for the next segment.
    pub(in crate::runtime) buffered: VecDeque<SinkItem>,
    /// Tool calls opened in earlier segments (a later result may answer them).
    pub(in crate::runtime) known_tools: BTreeSet<String>,
    /// The agent's messages the last park cut, and how many segments the run has had.
    cut_messages: Vec<String>,
    segments: u32,
    /// A suspension whose terminal event waits for the store (see [`Pump::settle`]).
    /// Boxed, as the next one: rare, and a run that never suspends keeps only a pointer.
    pub(in crate::runtime) pending_park: Option<Box<Ending>>,
    /// A segment whose `RUN_STARTED` waits for the store.
    pub(in crate::runtime) pending_segment: Option<Box<NextSegment>>,
    /// The run's budgets, when any applies (`budget.rs`).
    pub(in crate::runtime) budget: Option<Box<super::RunBudget>>,
    /// Spending changed since the budget was last shown.
    pub(in crate::runtime) budget_changed: bool,
}

/// What a run starts with, used once its start is stored: boxed, so the run's task keeps
/// a pointer to it, not room for it.
pub(in crate::runtime) struct Launch {
    pub(in crate::runtime) turn: Turn,
    pub(in crate::runtime) parent_run_id: Option<String>,
    pub(in crate::runtime) opening: super::segment::Opening,
}

/// Drives a run to its end. The pump and the turn come boxed, and the awaits made once
/// are boxed: an async fn keeps room for its arguments twice, and for the largest future
/// it awaits, for as long as it lives (an idle run too).
// Over 80 lines: one `select!` over the run's sources (commands, cancel, the suspension's
// deadline, the agent's items, the turn's end, the cancel bound), which is the run's life.
pub(in crate::runtime) async fn drive(
    mut pump: Box<Pump>,
    agent: Arc<dyn Agent>,
    launch: Box<Launch>,
) {
    tracing::info!("run started");
    let started = std::time::Instant::now();
    // Accepted means stored: the thread row and the new input are committed before the
    // client sees RUN_STARTED.
    let stored = Box::pin(pump.writer.commit()).await;
    let Launch {
        turn,
        parent_run_id,
        opening,
    } = {
        // Moved out of its own binding, so the box is freed here (a move out of `*launch`
        // would leave the allocation held until `launch` goes out of scope: the run's end).
        let launch = launch;
        *launch
    };
    pump.writer.start(parent_run_id, opening, None);
    if !stored {
        drop((agent, turn));
        let ending = pump.writer.failed_ending();
        Box::pin(pump.writer.finish(ending)).await;
        return;
    }
    let run = pump.writer.run.clone();
    let (sink, mut items) = EventSink::channel(SINK_CAPACITY);
    let mut turn_future = AssertUnwindSafe(agent.run(turn, sink)).catch_unwind();
    // Once the run is cancelled: when it ends without the agent. Made at the cancel, so a
    // run that is not cancelled keeps no timer for it (nor does an idle run's task keep
    // room for one: one timer below serves the suspension and the budget).
    let mut overdue: Option<Pin<Box<tokio::time::Sleep>>> = None;

    let ending = loop {
        pump.check_budget();
        pump.settle().await;
        let suspended = pump.deadline.is_some();
        let paused = pump.budget_paused();
        let wall_due = pump.budget_wall_due().filter(|_| !paused);
        // The suspension's deadline or the budget's wall time, whichever comes first.
        let wake_at = pump.deadline.into_iter().chain(wall_due).min();
        tokio::select! {
            biased;
            command = run.control.recv() => {
                pump.on_control(command);
                pump.settle().await;
            }
            () = run.cancel.cancelled(), if suspended || overdue.is_none() => {
                overdue.get_or_insert_with(|| Box::pin(tokio::time::sleep(CANCEL_BOUND)));
                if suspended {
                    pump.wake_closed("the run was cancelled");
                    pump.settle().await;
                }
            }
            // The budget's wall time needs nothing here: the loop's next budget check acts.
            () = tokio::time::sleep_until(wake_at.unwrap_or_else(Instant::now)), if wake_at.is_some() => {
                if pump.deadline.is_some_and(|deadline| deadline <= Instant::now()) {
                    tracing::info!("suspension timed out; failing closed");
                    pump.wake_closed("nobody answered within the suspension timeout");
                    pump.settle().await;
                }
            }
            outcome = pump.budget_answer(), if paused => {
                pump.on_budget_answer(outcome);
            }
            Some(item) = items.recv(), if !paused => {
                // Backpressure: a reader that keeps reading is never left a whole window
                // behind (a cancelled run no longer waits; its stalled readers are cut).
                tokio::select! {
                    () = pump.writer.thread.journal.room() => {}
                    () = run.cancel.cancelled() => {}
                }
                // What the agent has already produced goes out as one batch: one wake-up
                // of the readers, one write. The batch stops where a step needs the store
                // (a suspension, a new segment) or the window is full.
                pump.take_batch(*item, &mut items);
                pump.settle().await;
            }
            // Paused on its budget, the run takes nothing more of the agent, its turn's end
            // included: whatever the agent produced meanwhile waits for the answer.
            outcome = &mut turn_future, if !paused => {
                if pump.deadline.is_some() {
                    pump.wake_closed("the agent stopped waiting");
                }
                pump.settle().await;
                while let Ok(item) = items.try_recv() {
                    pump.on_item(*item);
                    pump.settle().await;
                }
                break match outcome {
                    Ok(result) => pump.writer.ending_for(result),
                    Err(_panic) => panicked(),
                };
            }
            () = async {
                match overdue.as_mut() {
                    Some(sleep) => sleep.await,
                    None => std::future::pending().await,
                }
            }, if overdue.is_some() => {
                tracing::warn!(bound_ms = CANCEL_BOUND.as_millis() as u64, "agent did not stop after cancel; ending the run without it");
                if pump.deadline.is_some() {
                    pump.wake_closed("the run was cancelled");
                }
                pump.settle().await;
                break pump.writer.cancelled_ending();
            }
        }
    };
    Box::pin(pump.settle_leftover_waits()).await;
    let kind = ending_kind(&ending);
    Box::pin(pump.writer.finish(ending)).await;
    tracing::info!(
        outcome = kind,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "run ended"
    );
}

/// The pump's end of the agent's sink.
type SinkReceiver = tokio::sync::mpsc::Receiver<Box<SinkItem>>;

impl Pump {
    /// Takes `first` and what the agent has already produced after it as one batch: one
    /// wake-up of the readers, one write. The batch stops where a step needs the store (a
    /// suspension, a new segment) or the window is full.
    fn take_batch(&mut self, first: SinkItem, items: &mut SinkReceiver) {
        self.writer.quiet = true;
        self.on_item(first);
        for _ in 1..DRAIN_BATCH {
            if self.deadline.is_some()
                || self.pending_park.is_some()
                || self.pending_segment.is_some()
                || !self.writer.thread.journal.has_room()
            {
                break;
            }
            let Ok(item) = items.try_recv() else {
                break;
            };
            self.on_item(*item);
        }
        self.writer.quiet = false;
        self.writer.thread.journal.publish();
    }

    /// After the turn: the waits left fail closed, and the answers that took them as the
    /// loop ended open their segments.
    async fn settle_leftover_waits(&mut self) {
        // Waits nobody took fail closed now, so no answer can take them from here on. An
        // answer that took them as the loop ended told the pump while it held them: its
        // segment opens, and the run's ending is written there, on the answer's stream. That
        // segment replays what the agent sent meanwhile, which may park the run again (a
        // client tool call the agent did not wait for): so again, until no wait is left and
        // nothing is queued.
        loop {
            let left = lock(&self.writer.run.suspension).take();
            let parked = left.is_some();
            if let Some(suspension) = left {
                self.writer.expired(&suspension);
                suspension.fail_closed("the run ended");
            }
            let mut told = false;
            while let Some(command) = self.writer.run.control.try_recv() {
                told = true;
                self.on_control(command);
                self.settle().await;
            }
            if !parked && !told {
                break;
            }
        }
    }

    /// The pump of a run whose first segment `writer` writes.
    pub(in crate::runtime) fn new(
        writer: SegmentWriter,
        hitl: Hitl,
        suspend_timeout: Duration,
    ) -> Pump {
        Pump {
            writer,
            hitl,
            suspend_timeout,
            deadline: None,
            buffered: VecDeque::new(),
            known_tools: BTreeSet::new(),
            cut_messages: Vec::new(),
            segments: 1,
            pending_park: None,
            pending_segment: None,
            budget: None,
            budget_changed: false,
        }
    }
    /// A new AG-UI interrupt that expires with the suspension timeout.
    pub(in crate::runtime) fn interrupt(
        &self,
        reason: &str,
        message: &str,
        tool_call_id: Option<String>,
        response_schema: Value,
        metadata: Option<Value>,
    ) -> Interrupt {
        let expires = std::time::SystemTime::now() + self.suspend_timeout;
        Interrupt {
            id: format!("int-{}", uuid::Uuid::new_v4()),
            reason: reason.to_owned(),
            message: Some(message.to_owned()),
            tool_call_id,
            response_schema: Some(response_schema),
            expires_at: Some(humantime::format_rfc3339_millis(expires).to_string()),
            metadata,
        }
    }

    /// Ends the segment and parks the run on `waits`.
    pub(in crate::runtime) fn suspend(
        &mut self,
        channel: Channel,
        waits: Vec<Wait>,
        interrupts: Vec<Interrupt>,
    ) {
        let run = &self.writer.run;
        let segment_run_id = lock(&run.translator).run_id().to_owned();
        let suspension = Suspension {
            channel,
            waits,
            segment_run_id,
            terminal: None,
        };
        let pending = suspension.ids();
        // Parked before the terminal frame is written: a client that answers at once finds
        // the run waiting for it.
        *lock(&run.suspension) = Some(Box::new(suspension));
        run.phase.set(Phase::Suspended);
        self.writer.rt.fleet_changed();
        self.deadline = Some(Instant::now() + self.suspend_timeout);
        self.remember_tools();
        let ending = match channel {
            Channel::ToolMessages => Ending::Suspended { pending },
            Channel::Interrupts => Ending::Interrupt { interrupts },
        };
        self.writer.close_for_park(&ending);
        self.pending_park = Some(Box::new(ending));
        // Phase first, then the flag: `Runtime::drain` sets the flag, then looks at phases,
        // so a run parking during a drain is seen by one of the two.
        if self.writer.rt.is_draining() {
            tracing::info!("parked during shutdown; failing closed at once");
            self.writer.run.cancel_with(CancelReason::Shutdown);
        }
    }

    /// Writes what waits for the store: commits first, then the suspension's terminal
    /// event or the next segment's `RUN_STARTED` (whose replayed output may park again).
    /// Called after every step of the loop; nothing else reaches the journal meanwhile.
    pub(in crate::runtime) async fn settle(&mut self) {
        if self.pending_park.is_none() && self.pending_segment.is_none() {
            return;
        }
        // Boxed, as every await a run makes once or rarely: the run's task holds room for
        // the largest future it awaits for as long as the run lives (idle ones too).
        Box::pin(self.settle_pending()).await;
    }

    pub(in crate::runtime) async fn settle_pending(&mut self) {
        loop {
            if let Some(ending) = self.pending_park.take() {
                if !self.writer.commit().await {
                    tracing::error!("suspension announced although the store failed");
                }
                self.writer.park(*ending);
                tracing::info!(
                    waits = pending_len(&self.writer.run),
                    "run suspended, waiting on the client"
                );
            } else if let Some(next) = self.pending_segment.take() {
                if !self.writer.commit().await {
                    tracing::error!("segment started although the store failed");
                }
                self.open_segment(*next);
            } else {
                return;
            }
        }
    }

    pub(in crate::runtime) fn on_control(&mut self, command: Control) {
        match command {
            Control::Resume(next) => self.next_segment(next),
            Control::Steered(messages) => self.writer.steered(messages),
        }
    }

    /// Fails the open waits closed (if the runtime has not taken them) and opens a
    /// continuation segment for what the agent does next.
    pub(in crate::runtime) fn wake_closed(&mut self, why: &str) {
        let taken = lock(&self.writer.run.suspension).take();
        let Some(suspension) = taken else {
            // A request took the waits at the same moment; its Resume is on the way.
            return;
        };
        self.writer.expired(&suspension);
        self.next_segment(Box::new(NextSegment {
            run_id: suspension.segment_run_id.clone(),
            parent_run_id: None,
            abandoned: suspension.unanswered_calls(&[]),
            why: why.to_owned(),
            link: None,
        }));
        suspension.fail_closed(why);
    }

    /// Ends the suspension; the next segment opens once what answered it is stored
    /// ([`Pump::settle`]).
    pub(in crate::runtime) fn next_segment(&mut self, next: Box<NextSegment>) {
        self.deadline = None;
        self.pending_segment = Some(next);
    }

    /// Opens the next segment of the run: answers the abandoned client tool calls with a
    /// cancelled result, then replays what the agent sent meanwhile.
    pub(in crate::runtime) fn open_segment(&mut self, next: NextSegment) {
        let mut translator = Translator::new(&self.writer.thread.id, &next.run_id);
        for id in &self.known_tools {
            translator.know_tool_call(id);
        }
        self.segments += 1;
        for id in std::mem::take(&mut self.cut_messages) {
            translator.carry(&id, self.segments);
        }
        *lock(&self.writer.run.translator) = translator;
        self.writer
            .run
            .segment_start
            .store(self.writer.thread.journal.next_seq(), Ordering::SeqCst);
        self.writer.run.phase.set(Phase::Running);
        self.writer.rt.fleet_changed();
        if let Some(trace) = &mut self.writer.trace {
            trace.client_answered(&next.abandoned);
        }
        self.writer
            .start(next.parent_run_id, Default::default(), next.link);
        for tool_call_id in next.abandoned {
            self.writer.translate(AgentEvent::ToolCallResult {
                message_id: format!("{tool_call_id}-cancelled"),
                content: format!("cancelled: {}", next.why),
                tool_call_id,
            });
        }
        while self.deadline.is_none() {
            let Some(item) = self.buffered.pop_front() else {
                break;
            };
            self.on_item(item);
        }
    }

    /// Before a park: the tool calls a later segment's results may answer, and the
    /// messages the park cuts.
    pub(in crate::runtime) fn remember_tools(&mut self) {
        let translator = lock(&self.writer.run.translator);
        self.known_tools
            .extend(translator.known_tool_calls().cloned());
        self.cut_messages = translator.open_messages();
    }
}

/// The ending of a turn whose agent panicked.
fn panicked() -> Ending {
    tracing::error!("agent panicked");
    Ending::Error {
        code: "AGENT_ERROR".to_owned(),
        message: "the agent failed unexpectedly".to_owned(),
    }
}

impl SegmentWriter {
    /// Messages the agent took into the running turn: shown as user text messages and a
    /// `CUSTOM` `agui.steer` where the stream is now, and recorded in the transcript
    /// there. (A run that ended meanwhile records them after its output.)
    pub(in crate::runtime) fn steered(&mut self, messages: Vec<Message>) {
        use crate::protocol::{Event, TextRole};
        let mut out = Vec::new();
        for message in &messages {
            let Message::User(user) = message else {
                continue;
            };
            let id = user.id.clone();
            out.push(Event::TextMessageStart {
                message_id: id.clone(),
                role: Some(TextRole::User),
                name: None,
                subagent_run_id: None,
            });
            let text = user.content.text();
            if !text.is_empty() {
                out.push(Event::TextMessageContent {
                    message_id: id.clone(),
                    delta: text,
                    subagent_run_id: None,
                });
            }
            out.push(Event::TextMessageEnd {
                message_id: id,
                subagent_run_id: None,
            });
        }
        let ids: Vec<&str> = messages.iter().map(Message::id).collect();
        out.push(Event::Custom {
            name: super::steer_note::STEER_EVENT.to_owned(),
            value: json!({"messageIds": ids, "delivery": "steered"}),
        });
        let mut translator = lock(&self.run.translator);
        if !translator.is_ended() {
            self.emit(&mut translator, &out);
        }
        drop(translator);
        self.record_steered(messages);
    }
}
