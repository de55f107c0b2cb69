//! The pump: one task per run that drives the agent and is the only writer of the thread's
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

use std::collections::{HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::attach::{Attachment, Mode};
use super::sanitize::sanitize;
use super::suspension::{self, Channel, Suspension, Wait};
use super::translator::{Ending, Produced, Translator};
use super::{
    CancelReason, Control, Controls, DisconnectWatch, LiveRun, NextSegment, Phase, PhaseCell,
    Runtime, Thread, state,
};
use crate::agent::Hitl;
use crate::agent::{Agent, AgentError, AgentEvent, EventSink, SinkItem, Turn, TurnEnd};
use crate::clock::now_ms;
use crate::metrics::{AgentRunMetrics, Outcome};
use crate::protocol::events::Interrupt;
use crate::protocol::input::{
    AssistantMessage, Content, FunctionCall, FunctionKind, TextMessage, ToolCall, ToolMessage,
};
use crate::protocol::{Event, Message, Profile, RunAgentInput};
use crate::sync::lock;
use crate::traces::{RunTrace, TurnOutcome};
use opentelemetry::trace::SpanContext;

/// How long an agent may take to stop after its run was cancelled before the pump gives up
/// on it and ends the segment anyway.
const CANCEL_BOUND: Duration = Duration::from_millis(1500);
/// Agent events buffered between the agent and the pump.
const SINK_CAPACITY: usize = 64;
/// Agent items the pump turns into frames before it wakes the readers.
const DRAIN_BATCH: usize = 64;

/// Starts a run on `thread`; the caller is in the thread's decide section and holds `permit`.
pub(super) fn start(
    rt: &Runtime,
    thread: &Arc<Thread>,
    agent: Arc<dyn Agent>,
    input: RunAgentInput,
    profile: Profile,
    permit: super::Slot,
) -> Attachment {
    let inner = &rt.inner;
    let segment_start = thread.journal.next_seq();
    let hitl = inner
        .options
        .hitl
        .get(&thread.agent)
        .copied()
        .unwrap_or(Hitl::Tool);
    let span = tracing::info_span!("run", thread.id = %thread.id, run.id = %input.run_id);
    let run = Arc::new(LiveRun {
        id: input.run_id.clone(),
        cancel: CancellationToken::new(),
        reason: Mutex::new(None),
        attached: AtomicUsize::new(0),
        detaches: AtomicU64::new(0),
        disconnect: DisconnectWatch {
            grace: inner.options.disconnect_grace,
            tasks: inner.run_tasks.clone(),
            span: span.clone(),
        },
        segment_start: AtomicU64::new(segment_start),
        finished: CancellationToken::new(),
        translator: Mutex::new(Translator::new(&thread.id, &input.run_id)),
        control: Controls::default(),
        suspension: Mutex::new(None),
        phase: PhaseCell::default(),
        aliases: Mutex::new(vec![input.run_id.clone()]),
        started_at_ms: now_ms(),
        agent: thread.agent.clone(),
    });
    let (new_messages, history, session_id, document, tool_call_ids) = {
        let mut state = lock(&thread.state);
        let new = state.take_new(&input.messages);
        state.live = Some(run.clone());
        if let Some(client) = &input.state {
            state::set_client(state.document.make_mut(&thread.agent), client);
        }
        let history = std::mem::take(&mut state.history_pending).then(|| {
            capped_history(
                &state.transcript,
                inner.options.history_max_messages,
                inner.options.history_max_bytes,
            )
        });
        (
            new,
            history,
            state.session_id.clone(),
            state.document.value(&thread.agent),
            tool_call_ids(&state.transcript),
        )
    };
    let title = new_messages.iter().find_map(|m| match m {
        Message::User(user) => Some(title_of(&user.content.text())),
        _ => None,
    });
    inner.store.record_run_start(
        &thread.key,
        &thread.agent,
        title,
        &run.id,
        new_messages.clone(),
        now_ms() as i64,
    );
    lock(&inner.runs).insert(thread.run_key(&run.id), run.clone());
    rt.fleet_changed();

    // Attached before the pump starts, so the disconnect watcher sees this stream.
    let attachment = rt.attachment(
        thread,
        segment_start.saturating_sub(1),
        profile,
        Some(run.clone()),
        Mode::Segment,
    );

    let turn = Box::new(Turn {
        thread_id: thread.key.clone(),
        run_id: run.id.clone(),
        messages: input.messages,
        new_messages,
        tools: input.tools,
        context: input.context,
        client_state: input.state,
        forwarded_props: input.forwarded_props,
        session_id,
        document,
        tool_call_ids,
        cancel: run.cancel.child_token(),
    });
    // Started in the request's context: the request's span is the run's parent.
    let trace = inner
        .options
        .tracer
        .as_ref()
        .map(|tracer| tracer.run(&thread.agent, &thread.id, &run.id));
    inner.run_metrics.agent(&thread.agent).started();
    let pump = Box::new(Pump {
        writer: SegmentWriter {
            rt: rt.clone(),
            thread: thread.clone(),
            run: run.clone(),
            permit: Some(permit),
            quiet: false,
            metrics: inner.run_metrics.agent(&thread.agent),
            admitted: std::time::Instant::now(),
            produced: false,
            trace,
            link: None,
        },
        hitl,
        suspend_timeout: inner.options.suspend_timeout,
        deadline: None,
        buffered: VecDeque::new(),
        known_tools: HashSet::new(),
        pending_park: None,
        pending_segment: None,
    });
    inner
        .run_tasks
        .spawn(drive(pump, agent, turn, input.parent_run_id, history).instrument(span));
    attachment
}

/// The newest messages of `transcript` that fit both bounds, in order.
fn capped_history(transcript: &[Message], max_messages: usize, max_bytes: usize) -> Value {
    let mut kept = Vec::new();
    let mut bytes = 0;
    for message in transcript.iter().rev().take(max_messages) {
        let value = serde_json::to_value(message).unwrap_or(Value::Null);
        let size = value.to_string().len();
        if bytes + size > max_bytes && !kept.is_empty() {
            break;
        }
        bytes += size;
        kept.push(value);
    }
    kept.reverse();
    Value::Array(kept)
}

/// The ids of every tool call and tool result in `transcript`.
fn tool_call_ids(transcript: &[Message]) -> HashSet<String> {
    let mut ids = HashSet::new();
    for message in transcript {
        match message {
            Message::Assistant(a) => ids.extend(a.tool_calls.iter().map(|c| c.id.clone())),
            Message::Tool(t) => {
                ids.insert(t.tool_call_id.clone());
            }
            _ => {}
        }
    }
    ids
}

/// A thread title from its first user message: one line, at most 80 characters.
fn title_of(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

/// The pump's own state, beside the segment writer.
struct Pump {
    writer: SegmentWriter,
    hitl: Hitl,
    suspend_timeout: Duration,
    /// When the current suspension fails closed.
    deadline: Option<Instant>,
    /// Agent output that arrived while suspended, for the next segment.
    buffered: VecDeque<SinkItem>,
    /// Tool calls opened in earlier segments (a later result may answer them).
    known_tools: HashSet<String>,
    /// A suspension whose terminal event waits for the store (see [`Pump::settle`]).
    pending_park: Option<Ending>,
    /// A segment whose `RUN_STARTED` waits for the store.
    pending_segment: Option<NextSegment>,
}

/// Drives a run to its end. The pump and the turn come boxed, and the awaits made once
/// are boxed: an async fn keeps room for its arguments twice, and for the largest future
/// it awaits, for as long as it lives (an idle run too).
async fn drive(
    mut pump: Box<Pump>,
    agent: Arc<dyn Agent>,
    turn: Box<Turn>,
    parent_run_id: Option<String>,
    history: Option<Value>,
) {
    tracing::info!("run started");
    let started = std::time::Instant::now();
    // Accepted means stored: the thread row and the new input are committed before the
    // client sees RUN_STARTED.
    let stored = Box::pin(pump.writer.commit()).await;
    pump.writer.start(parent_run_id, history);
    if !stored {
        drop(agent);
        let ending = pump.writer.failed_ending();
        Box::pin(pump.writer.finish(ending)).await;
        return;
    }
    let run = pump.writer.run.clone();
    let (sink, mut items) = EventSink::channel(SINK_CAPACITY);
    let mut turn_future = AssertUnwindSafe(agent.run(*turn, sink)).catch_unwind();
    let overdue = async {
        run.cancel.cancelled().await;
        tokio::time::sleep(CANCEL_BOUND).await;
    };
    tokio::pin!(overdue);

    let ending = loop {
        let suspended = pump.deadline.is_some();
        let deadline = pump.deadline.unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            command = run.control.recv() => {
                pump.on_control(command);
                pump.settle().await;
            }
            () = run.cancel.cancelled(), if suspended => {
                pump.wake_closed("the run was cancelled");
                pump.settle().await;
            }
            () = tokio::time::sleep_until(deadline), if suspended => {
                tracing::info!("suspension timed out; failing closed");
                pump.wake_closed("nobody answered within the suspension timeout");
                pump.settle().await;
            }
            Some(item) = items.recv() => {
                // Backpressure: a reader that keeps reading is never left a whole window
                // behind (a cancelled run no longer waits; its stalled readers are cut).
                tokio::select! {
                    () = pump.writer.thread.journal.room() => {}
                    () = run.cancel.cancelled() => {}
                }
                // What the agent has already produced goes out as one batch: one wake-up
                // of the readers, one write. The batch stops where a step needs the store
                // (a suspension, a new segment) or the window is full.
                pump.writer.quiet = true;
                pump.on_item(*item);
                for _ in 1..DRAIN_BATCH {
                    if pump.deadline.is_some()
                        || pump.pending_park.is_some()
                        || pump.pending_segment.is_some()
                        || !pump.writer.thread.journal.has_room()
                    {
                        break;
                    }
                    let Ok(item) = items.try_recv() else {
                        break;
                    };
                    pump.on_item(*item);
                }
                pump.writer.quiet = false;
                pump.writer.thread.journal.publish();
                pump.settle().await;
            }
            outcome = &mut turn_future => {
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
                    Err(_panic) => {
                        tracing::error!("agent panicked");
                        Ending::Error {
                            code: "AGENT_ERROR".to_owned(),
                            message: "the agent failed unexpectedly".to_owned(),
                        }
                    }
                };
            }
            () = &mut overdue => {
                tracing::warn!(bound_ms = CANCEL_BOUND.as_millis() as u64, "agent did not stop after cancel; ending the run without it");
                if pump.deadline.is_some() {
                    pump.wake_closed("the run was cancelled");
                }
                pump.settle().await;
                break pump.writer.cancelled_ending();
            }
        }
    };
    // Waits nobody took fail closed now, so no answer can take them from here on. An
    // answer that took them as the loop ended told the pump while it held them: its
    // segment opens, and the run's ending is written there, on the answer's stream. That
    // segment replays what the agent sent meanwhile, which may park the run again (a
    // client tool call the agent did not wait for): so again, until no wait is left and
    // nothing is queued.
    loop {
        let left = lock(&run.suspension).take();
        let parked = left.is_some();
        if let Some(suspension) = left {
            pump.writer.expired(&suspension);
            suspension.fail_closed("the run ended");
        }
        let mut told = false;
        while let Some(command) = run.control.try_recv() {
            told = true;
            pump.on_control(command);
            pump.settle().await;
        }
        if !parked && !told {
            break;
        }
    }
    let kind = ending_kind(&ending);
    Box::pin(pump.writer.finish(ending)).await;
    tracing::info!(
        outcome = kind,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "run ended"
    );
}

impl Pump {
    fn on_item(&mut self, item: SinkItem) {
        if !std::mem::replace(&mut self.writer.produced, true) {
            self.writer
                .metrics
                .first_event(self.writer.admitted.elapsed());
        }
        if self.deadline.is_some() {
            self.buffered.push_back(item);
            return;
        }
        match item {
            SinkItem::Event(event) => self.writer.translate(event),
            SinkItem::State { pointer, value } => self.writer.set_state(&pointer, value),
            SinkItem::Ui {
                component,
                props,
                reply,
            } => {
                let verdict = self.writer.rt.inner.options.ui.check(&component, &props);
                if verdict.is_ok() {
                    self.writer.translate(AgentEvent::Activity {
                        message_id: uuid::Uuid::new_v4().to_string(),
                        activity_type: component,
                        content: props,
                    });
                } else if let Err(refusal) = &verdict {
                    tracing::info!(%refusal, "component refused");
                }
                let _ = reply.send(verdict.map_err(|refusal| refusal.to_string()));
            }
            SinkItem::Title(title) => {
                self.writer.rt.inner.store.set_title(
                    &self.writer.thread.key,
                    &title,
                    now_ms() as i64,
                );
            }
            SinkItem::Session { id, how } => {
                lock(&self.writer.thread.state).session_id = Some(id.clone());
                self.writer.rt.inner.store.set_session(
                    &self.writer.thread.key,
                    &id,
                    &how,
                    now_ms() as i64,
                );
                self.writer.set_state("/session", Value::String(id));
            }
            SinkItem::Tool { call, reply } => {
                let id = call.tool_call_id.clone();
                self.writer.translate(AgentEvent::ToolCallStart {
                    tool_call_id: id.clone(),
                    name: call.name,
                    parent_message_id: None,
                });
                self.writer.translate(AgentEvent::ToolCallArgs {
                    tool_call_id: id.clone(),
                    delta: call.arguments,
                });
                self.writer.translate(AgentEvent::ToolCallEnd {
                    tool_call_id: id.clone(),
                });
                if let Some(trace) = &mut self.writer.trace {
                    trace.tool_on_client(&id);
                }
                self.suspend(
                    Channel::ToolMessages,
                    vec![Wait::Tool {
                        tool_call_id: id,
                        reply,
                    }],
                    Vec::new(),
                );
            }
            SinkItem::Permission { request, reply } => match self.hitl {
                Hitl::Tool => {
                    let id = format!("perm-{}", uuid::Uuid::new_v4());
                    self.writer.translate(AgentEvent::ToolCallStart {
                        tool_call_id: id.clone(),
                        name: suspension::PERMISSION_TOOL.to_owned(),
                        parent_message_id: None,
                    });
                    self.writer.translate(AgentEvent::ToolCallArgs {
                        tool_call_id: id.clone(),
                        delta: suspension::permission_arguments(
                            &request.title,
                            request.tool_call_id.as_deref(),
                            &request.options,
                        ),
                    });
                    self.writer.translate(AgentEvent::ToolCallEnd {
                        tool_call_id: id.clone(),
                    });
                    if let Some(trace) = &mut self.writer.trace {
                        trace.tool_on_client(&id);
                    }
                    self.suspend(
                        Channel::ToolMessages,
                        vec![Wait::Permission {
                            answer_id: id,
                            options: request.options,
                            reply,
                        }],
                        Vec::new(),
                    );
                }
                Hitl::Interrupt => {
                    let interrupt = self.interrupt(
                        "confirmation",
                        &request.title,
                        request.tool_call_id.clone(),
                        suspension::response_schema(&request.options),
                        Some(serde_json::json!({"options": request.options})),
                    );
                    let id = interrupt.id.clone();
                    self.suspend(
                        Channel::Interrupts,
                        vec![Wait::Permission {
                            answer_id: id,
                            options: request.options,
                            reply,
                        }],
                        vec![interrupt],
                    );
                }
            },
            SinkItem::Input { request, reply } => match self.hitl {
                Hitl::Tool => {
                    let id = format!("input-{}", uuid::Uuid::new_v4());
                    self.writer.translate(AgentEvent::ToolCallStart {
                        tool_call_id: id.clone(),
                        name: suspension::INPUT_TOOL.to_owned(),
                        parent_message_id: None,
                    });
                    self.writer.translate(AgentEvent::ToolCallArgs {
                        tool_call_id: id.clone(),
                        delta: suspension::input_arguments(&request),
                    });
                    self.writer.translate(AgentEvent::ToolCallEnd {
                        tool_call_id: id.clone(),
                    });
                    self.suspend(
                        Channel::ToolMessages,
                        vec![Wait::Input {
                            answer_id: id,
                            schema: request.schema,
                            reply,
                        }],
                        Vec::new(),
                    );
                }
                Hitl::Interrupt => {
                    let interrupt = self.interrupt(
                        "input_required",
                        &request.message,
                        request.tool_call_id.clone(),
                        request.schema.clone(),
                        None,
                    );
                    let id = interrupt.id.clone();
                    self.suspend(
                        Channel::Interrupts,
                        vec![Wait::Input {
                            answer_id: id,
                            schema: request.schema,
                            reply,
                        }],
                        vec![interrupt],
                    );
                }
            },
        }
    }

    /// A new AG-UI interrupt that expires with the suspension timeout.
    fn interrupt(
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
    fn suspend(&mut self, channel: Channel, waits: Vec<Wait>, interrupts: Vec<Interrupt>) {
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
        self.pending_park = Some(ending);
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
    async fn settle(&mut self) {
        if self.pending_park.is_none() && self.pending_segment.is_none() {
            return;
        }
        // Boxed, as every await a run makes once or rarely: the run's task holds room for
        // the largest future it awaits for as long as the run lives (idle ones too).
        Box::pin(self.settle_pending()).await;
    }

    async fn settle_pending(&mut self) {
        loop {
            if let Some(ending) = self.pending_park.take() {
                if !self.writer.commit().await {
                    tracing::error!("suspension announced although the store failed");
                }
                self.writer.park(ending);
                tracing::info!(
                    waits = pending_len(&self.writer.run),
                    "run suspended, waiting on the client"
                );
            } else if let Some(next) = self.pending_segment.take() {
                if !self.writer.commit().await {
                    tracing::error!("segment started although the store failed");
                }
                self.open_segment(next);
            } else {
                return;
            }
        }
    }

    fn on_control(&mut self, command: Control) {
        match command {
            Control::Resume(next) => self.next_segment(*next),
        }
    }

    /// Fails the open waits closed (if the runtime has not taken them) and opens a
    /// continuation segment for what the agent does next.
    fn wake_closed(&mut self, why: &str) {
        let taken = lock(&self.writer.run.suspension).take();
        let Some(suspension) = taken else {
            // A request took the waits at the same moment; its Resume is on the way.
            return;
        };
        self.writer.expired(&suspension);
        self.next_segment(NextSegment {
            run_id: suspension.segment_run_id.clone(),
            parent_run_id: None,
            abandoned: suspension.unanswered_calls(&[]),
            why: why.to_owned(),
            link: None,
        });
        suspension.fail_closed(why);
    }

    /// Ends the suspension; the next segment opens once what answered it is stored
    /// ([`Pump::settle`]).
    fn next_segment(&mut self, next: NextSegment) {
        self.deadline = None;
        self.pending_segment = Some(next);
    }

    /// Opens the next segment of the run: answers the abandoned client tool calls with a
    /// cancelled result, then replays what the agent sent meanwhile.
    fn open_segment(&mut self, next: NextSegment) {
        let mut translator = Translator::new(&self.writer.thread.id, &next.run_id);
        for id in &self.known_tools {
            translator.know_tool_call(id);
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
        self.writer.link = next.link;
        self.writer.start(next.parent_run_id, None);
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

    fn remember_tools(&mut self) {
        let translator = lock(&self.writer.run.translator);
        self.known_tools
            .extend(translator.known_tool_calls().cloned());
    }
}

/// How a run's ending is recorded (`runs.outcome`) and logged.
fn ending_kind(ending: &Ending) -> &'static str {
    match ending {
        Ending::Finished { .. } => "finished",
        Ending::Cancelled => "cancelled",
        _ => "error",
    }
}

/// The ending of a run on a node that lost its thread's lease to another node (cluster):
/// nothing more it does for the thread is stored.
fn lease_lost() -> Ending {
    Ending::Error {
        code: "LEASE_LOST".to_owned(),
        message: "another node took this thread over; reattach to follow it there".to_owned(),
    }
}

/// The ending of a run whose writes the store could not commit.
fn store_failed() -> Ending {
    Ending::Error {
        code: "STORE_UNAVAILABLE".to_owned(),
        message: "the run could not be stored; send it again".to_owned(),
    }
}

fn pending_len(run: &LiveRun) -> usize {
    lock(&run.suspension).as_ref().map_or(0, |s| s.waits.len())
}

/// Cancels the run once nobody has been attached for the disconnect grace, counted from
/// the detach numbered `generation` (spawned by [`LiveRun::detach`]; it gives up to a later
/// detach's watcher, or when a stream attaches). A suspended run is waiting on the client
/// by design (its stream ended with the segment): it is not cancelled for that, its
/// suspension timeout applies instead, and the grace counts again once it wakes.
pub(super) async fn watch_disconnect(run: Arc<LiveRun>, generation: u64) {
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

/// Writes segments into the journal and cleans up after the run, even on panic.
struct SegmentWriter {
    rt: Runtime,
    thread: Arc<Thread>,
    run: Arc<LiveRun>,
    permit: Option<super::Slot>,
    /// Within a batch: frames are journaled without waking readers (the pump publishes
    /// once at the end of the batch).
    quiet: bool,
    /// The agent's run counters, and when the run was admitted.
    metrics: Arc<AgentRunMetrics>,
    admitted: std::time::Instant,
    /// The agent has produced something (its first output is timed).
    produced: bool,
    /// The run's spans, when traces are on.
    trace: Option<RunTrace>,
    /// The span of the request that opens the next segment (its turn links to it).
    link: Option<SpanContext>,
}

impl SegmentWriter {
    /// `RUN_STARTED`, the history snapshot when due, and the state snapshot.
    fn start(&mut self, parent_run_id: Option<String>, history: Option<Value>) {
        let mut translator = lock(&self.run.translator);
        let mut out: Vec<Event> = translator.start(parent_run_id).into_iter().collect();
        if let Some(messages) = history {
            out.push(Event::MessagesSnapshot { messages });
        }
        out.push(Event::StateSnapshot {
            snapshot: lock(&self.thread.state).document.value(&self.thread.agent),
        });
        self.emit(&mut translator, &out);
        let run_id = translator.run_id().to_owned();
        drop(translator);
        if let Some(trace) = &mut self.trace {
            trace.turn_started(&run_id, self.link.take());
        }
        if run_id != self.run.id {
            // A later segment: counted on the run, shown as running again.
            self.rt.inner.store.record_run_start(
                &self.thread.key,
                &self.thread.agent,
                None,
                &self.run.id,
                Vec::new(),
                now_ms() as i64,
            );
        }
    }

    fn translate(&mut self, event: AgentEvent) {
        if let Some(trace) = &mut self.trace {
            match &event {
                AgentEvent::ToolCallStart {
                    tool_call_id, name, ..
                } => trace.tool_started(tool_call_id, name),
                AgentEvent::ToolCallResult { tool_call_id, .. } => trace.tool_ended(tool_call_id),
                _ => {}
            }
        }
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        translator.translate(event, &mut out);
        self.emit(&mut translator, &out);
    }

    /// Sets a member of the shared state and sends the delta.
    fn set_state(&mut self, pointer: &str, value: Value) {
        let mut translator = lock(&self.run.translator);
        let delta = {
            let mut state = lock(&self.thread.state);
            state::set(state.document.make_mut(&self.thread.agent), pointer, value)
        };
        match delta {
            Ok(delta) if delta.as_array().is_some_and(|ops| !ops.is_empty()) => {
                self.emit(&mut translator, &[Event::StateDelta { delta }]);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%pointer, %error, "agent state change dropped"),
        }
    }

    /// Closes what is open before a suspension's terminal event (and, for an interrupt,
    /// hands the client the whole picture), and records the thread as suspended.
    fn close_for_park(&mut self, ending: &Ending) {
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        if matches!(ending, Ending::Interrupt { .. }) {
            // The client needs the whole picture to answer an interrupt.
            translator.close_open_for_park(&mut out);
            let (messages, document) = {
                let state = lock(&self.thread.state);
                (
                    super::transcript_json(&state.transcript),
                    state.document.value(&self.thread.agent),
                )
            };
            self.emit(&mut translator, &out);
            out.clear();
            self.emit(
                &mut translator,
                &[
                    Event::StateSnapshot { snapshot: document },
                    Event::MessagesSnapshot { messages },
                ],
            );
        } else {
            translator.close_open_for_park(&mut out);
            self.emit(&mut translator, &out);
        }
        drop(translator);
        self.rt
            .inner
            .store
            .set_status(&self.thread.key, "suspended", now_ms() as i64);
    }

    /// Ends the segment because the run waits on the client: the terminal event, once
    /// [`SegmentWriter::close_for_park`]'s writes are committed.
    fn park(&mut self, ending: Ending) {
        if let Some(trace) = &mut self.trace {
            let how = match ending {
                Ending::Interrupt { .. } => TurnOutcome::Interrupted,
                _ => TurnOutcome::Suspended,
            };
            trace.turn_ended(how, None);
        }
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        translator.finish(ending, &mut out);
        self.emit(&mut translator, &out);
        drop(translator);
        // Unless a client has answered already and taken the suspension.
        if let Some(suspension) = lock(&self.run.suspension).as_mut() {
            suspension.terminal = out.pop();
        }
    }

    /// Waits until every write queued so far is durable; `false` when the store failed,
    /// or (cluster) when a write for the thread was refused because its lease was lost.
    async fn commit(&self) -> bool {
        match self.rt.inner.store.commit().await {
            Ok(()) => !self.rt.lease_lost(&self.thread.key),
            Err(error) => {
                tracing::error!(%error, "store commit failed");
                false
            }
        }
    }

    /// The terminal event in place of one whose writes did not commit.
    fn failed_ending(&self) -> Ending {
        if self.rt.lease_lost(&self.thread.key) {
            lease_lost()
        } else {
            store_failed()
        }
    }

    /// Remembers the interrupts of a suspension that failed closed (a late resume for them
    /// is then reported as expired).
    fn expired(&self, suspension: &Suspension) {
        if suspension.channel == Channel::Interrupts {
            let mut state = lock(&self.thread.state);
            for id in suspension.ids() {
                state.expired_interrupts.insert(id);
            }
        }
    }

    /// Ends the run: closes what is open, records the outcome, and writes the terminal
    /// event only once all of it is committed (the terminal event is the client's
    /// acknowledgement).
    async fn finish(&mut self, ending: Ending) {
        {
            let mut translator = lock(&self.run.translator);
            let mut out = Vec::new();
            if translator.is_ended() {
                let run_id = translator.run_id().to_owned();
                *translator = Translator::new(&self.thread.id, &run_id);
                out.extend(translator.start(None));
            }
            translator.close_open(&mut out);
            self.emit(&mut translator, &out);
        }
        if let Ending::Error { code, message } = &ending {
            self.record_error(code, message);
        }
        self.record_end(&ending);
        let ending = if self.commit().await {
            ending
        } else {
            self.failed_ending()
        };
        self.count_end(&ending);
        self.trace_end(&ending);
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        translator.finish(ending, &mut out);
        self.emit(&mut translator, &out);
    }

    /// Ends the run's spans with the run.
    fn trace_end(&mut self, ending: &Ending) {
        let Some(trace) = &mut self.trace else {
            return;
        };
        let (how, code) = match ending {
            Ending::Finished { .. } => (TurnOutcome::Finished, None),
            Ending::Cancelled => (TurnOutcome::Cancelled, None),
            Ending::Error { code, .. } => (TurnOutcome::Error, Some(code.as_str())),
            Ending::Suspended { .. } => (TurnOutcome::Suspended, None),
            Ending::Interrupt { .. } => (TurnOutcome::Interrupted, None),
        };
        trace.ended(how, code);
    }

    /// Records a run's error in the transcript as an assistant message (`<runId>-error`,
    /// `Error: <message>`), so a client that loads the thread again shows it where it
    /// happened; the stream itself carries only the `RUN_ERROR`. Not for a shutdown or a
    /// store failure, which say nothing about the conversation.
    fn record_error(&self, code: &str, message: &str) {
        if matches!(code, "SHUTDOWN" | "STORE_UNAVAILABLE" | "LEASE_LOST") {
            return;
        }
        let run_id = lock(&self.run.translator).run_id().to_owned();
        let mut state = lock(&self.thread.state);
        let mut id = format!("{run_id}-error");
        if state.seen.contains(&id) {
            id = format!("{run_id}-error-{}", uuid::Uuid::new_v4());
        }
        let recorded = Message::Assistant(AssistantMessage {
            id: id.clone(),
            content: Some(format!("Error: {message}")),
            name: None,
            tool_calls: Vec::new(),
        });
        state.seen.insert(id);
        state.transcript.push(recorded.clone());
        drop(state);
        self.rt
            .inner
            .store
            .record_messages(&self.thread.key, vec![recorded], now_ms() as i64);
    }

    fn record_end(&self, ending: &Ending) {
        self.rt.inner.store.record_run_end(
            &self.thread.key,
            &self.run.id,
            ending_kind(ending),
            "idle",
            now_ms() as i64,
        );
    }

    /// [`SegmentWriter::finish`] without waiting for the store (a pump that ended without
    /// a terminal event, from `Drop`).
    fn finish_now(&mut self, ending: Ending) {
        let outcome_row = ending_kind(&ending);
        self.count_end(&ending);
        self.trace_end(&ending);
        let mut translator = lock(&self.run.translator);
        if translator.is_ended() {
            // The run ended while parked (its last segment is already closed): give the
            // ending its own segment so every attached or later stream sees it.
            let run_id = translator.run_id().to_owned();
            *translator = Translator::new(&self.thread.id, &run_id);
            let mut out: Vec<Event> = translator.start(None).into_iter().collect();
            translator.finish(ending, &mut out);
            self.emit(&mut translator, &out);
        } else {
            let mut out = Vec::new();
            translator.finish(ending, &mut out);
            self.emit(&mut translator, &out);
        }
        drop(translator);
        self.rt.inner.store.record_run_end(
            &self.thread.key,
            &self.run.id,
            outcome_row,
            "idle",
            now_ms() as i64,
        );
    }

    /// Appends events to the journal and records what they completed, while the translator
    /// is locked, so a resync sees journal, transcript and open items at one position.
    fn emit(&self, translator: &mut Translator, events: &[Event]) {
        let journal = &self.thread.journal;
        let pushed = if self.quiet {
            journal.push_all_quietly(events, now_ms())
        } else {
            journal.push_all(events, now_ms())
        };
        if let Some(last) = pushed {
            tracing::trace!(events = events.len(), last = %last, "events journaled");
        }
        let completed = translator.take_completed();
        if completed.is_empty() {
            return;
        }
        let mut changed = Vec::new();
        {
            let mut state = lock(&self.thread.state);
            for produced in completed {
                if let Produced::ToolCall { id, .. } = &produced {
                    state.seen.insert(id.clone());
                }
                let message = absorb(&mut state.transcript, produced);
                state.seen.insert(message.id().to_owned());
                changed.push(message);
            }
        }
        self.rt
            .inner
            .store
            .record_messages(&self.thread.key, changed, now_ms() as i64);
    }

    fn count_end(&self, ending: &Ending) {
        let outcome = match ending {
            Ending::Finished { .. } => Outcome::Finished,
            Ending::Cancelled => Outcome::Cancelled,
            Ending::Error { code, .. } if code == "SHUTDOWN" => Outcome::Shutdown,
            _ => Outcome::Error,
        };
        self.metrics.finished(outcome, self.admitted.elapsed());
    }

    fn ending_for(&self, result: Result<TurnEnd, AgentError>) -> Ending {
        match result {
            Ok(TurnEnd::Finished { result, usage }) => Ending::Finished { result, usage },
            Ok(TurnEnd::Cancelled) => self.cancelled_ending(),
            Err(AgentError::Failed { code, message }) => Ending::Error {
                code,
                message: self.sanitize(&message),
            },
            Err(AgentError::Backend(message)) => {
                let message = self.sanitize(&message);
                tracing::warn!(error = %message, "agent backend error");
                Ending::Error {
                    code: "AGENT_ERROR".to_owned(),
                    message,
                }
            }
        }
    }

    fn cancelled_ending(&self) -> Ending {
        match self.run.reason() {
            Some(CancelReason::Shutdown) => Ending::Error {
                code: "SHUTDOWN".to_owned(),
                message: "the server is shutting down".to_owned(),
            },
            Some(CancelReason::LeaseLost) => lease_lost(),
            Some(CancelReason::Requested | CancelReason::Abandoned) | None => Ending::Cancelled,
        }
    }

    fn sanitize(&self, message: &str) -> String {
        let secrets: Vec<&str> = self
            .rt
            .inner
            .options
            .secrets
            .iter()
            .map(String::as_str)
            .collect();
        sanitize(message, &secrets)
    }
}

impl SegmentWriter {
    /// Once the disconnect grace has passed (a client cut near the end can still reattach
    /// exactly until then), a finished run's frames leave memory unless a new run is live;
    /// a later cursor into them gets a resync.
    fn release_later(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let thread = Arc::downgrade(&self.thread);
        let rt = self.rt.clone();
        let after = rt.inner.options.disconnect_grace;
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(thread) = thread.upgrade() {
                rt.grace_over(&thread);
            }
        });
    }
}

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        let open = !lock(&self.run.translator).is_ended();
        if open {
            tracing::error!("run ended without a terminal event; ending it with RUN_ERROR");
            self.finish_now(Ending::Error {
                code: "INTERNAL".to_owned(),
                message: "the run ended unexpectedly".to_owned(),
            });
        }
        if let Some(suspension) = lock(&self.run.suspension).take() {
            suspension.fail_closed("the run ended");
        }
        {
            let mut state = lock(&self.thread.state);
            if state
                .live
                .as_ref()
                .is_some_and(|live| Arc::ptr_eq(live, &self.run))
            {
                state.live = None;
            }
        }
        {
            let aliases = lock(&self.run.aliases).clone();
            let mut runs = lock(&self.rt.inner.runs);
            for alias in aliases {
                let key = self.thread.run_key(&alias);
                if runs.get(&key).is_some_and(|r| Arc::ptr_eq(r, &self.run)) {
                    runs.remove(&key);
                }
            }
        }
        self.run.phase.set(Phase::Running);
        self.run.finished.cancel();
        self.rt.fleet_changed();
        self.release_later();
        // Released exactly once, after the thread no longer shows this run as live.
        self.permit.take();
        self.rt.run_ended(&self.thread);
    }
}

/// Adds one completed item to the transcript; returns the message to persist (a tool call
/// is merged into its parent assistant message when there is one).
fn absorb(transcript: &mut Vec<Message>, mut produced: Produced) -> Message {
    // Text grown delta by delta has up to twice its length in capacity: kept for the
    // thread's lifetime, it is trimmed once complete.
    if let Produced::Text { content, .. } | Produced::Reasoning { content, .. } = &mut produced {
        content.shrink_to_fit();
    }
    let message = match produced {
        Produced::Text { id, content } => Message::Assistant(AssistantMessage {
            id,
            content: Some(content),
            name: None,
            tool_calls: Vec::new(),
        }),
        Produced::Reasoning { id, content } => Message::Reasoning(TextMessage {
            id,
            content,
            name: None,
        }),
        Produced::ToolCall {
            id,
            name,
            arguments,
            parent_message_id,
        } => {
            let call = ToolCall {
                id: id.clone(),
                kind: FunctionKind::Function,
                function: FunctionCall { name, arguments },
            };
            let parent = parent_message_id.as_ref().and_then(|pid| {
                transcript.iter_mut().rev().find_map(|m| match m {
                    Message::Assistant(a) if &a.id == pid => Some(a),
                    _ => None,
                })
            });
            if let Some(parent) = parent {
                parent.tool_calls.push(call);
                return Message::Assistant(parent.clone());
            }
            Message::Assistant(AssistantMessage {
                id: parent_message_id.unwrap_or(id),
                content: None,
                name: None,
                tool_calls: vec![call],
            })
        }
        Produced::ToolResult {
            id,
            tool_call_id,
            content,
        } => Message::Tool(ToolMessage {
            id,
            content: Content::Text(content),
            tool_call_id,
            error: None,
        }),
        Produced::Activity {
            id,
            activity_type,
            content,
        } => Message::Activity(crate::protocol::input::ActivityMessage {
            id,
            activity_type,
            content,
        }),
    };
    transcript.push(message.clone());
    message
}
