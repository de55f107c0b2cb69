//! The segment writer: commits and announces a segment's events, parks and resumes the
//! run, and guarantees (even on panic, in its `Drop`) that the last segment gets its
//! terminal event, the thread's live run is cleared and the admission slot is released
//! exactly once.

use std::sync::Arc;

use serde_json::Value;

use crate::agent::{AgentError, AgentEvent, TurnEnd};
use crate::clock::now_ms;
use crate::metrics::{AgentRunMetrics, Outcome};
use crate::protocol::input::{
    AssistantMessage, Content, FunctionCall, FunctionKind, TextMessage, ToolCall, ToolMessage,
};
use crate::protocol::{Event, Message};
use crate::runtime::CancelReason;
use crate::runtime::live::{Control, LiveRun, Phase};
use crate::runtime::suspension::{Channel, Suspension};
use crate::runtime::thread::{Thread, ThreadState};
use crate::runtime::translator::{Ending, Produced, Translator};
use crate::runtime::{Runtime, notices, state};
use crate::sync::lock;
use crate::traces::{RunTrace, TurnOutcome};
use opentelemetry::trace::SpanContext;

/// The `CUSTOM` event naming the stored messages a client that sent history left out.
pub(in crate::runtime) const UNSENT_EVENT: &str = "agui.history.unsent";

/// What a run's first segment opens with besides the state: the transcript owed to the
/// client, and the ids of the stored messages a client that sent history left out (it is
/// behind: a second tab), so the page can read the thread again.
#[derive(Default)]
pub(in crate::runtime) struct Opening {
    pub(in crate::runtime) history: Option<Value>,
    pub(in crate::runtime) unsent: Vec<String>,
    /// How steering input this run carries was delivered instead (see `steer.rs`).
    pub(in crate::runtime) steer: Option<Value>,
}

/// Writes segments into the journal and cleans up after the run, even on panic.
pub(in crate::runtime) struct SegmentWriter {
    pub(in crate::runtime) rt: Runtime,
    pub(in crate::runtime) thread: Arc<Thread>,
    pub(in crate::runtime) run: Arc<LiveRun>,
    pub(in crate::runtime) permit: Option<crate::runtime::admission::Slot>,
    /// Within a batch: frames are journaled without waking readers (the pump publishes
    /// once at the end of the batch).
    pub(in crate::runtime) quiet: bool,
    /// The agent's run counters, and when the run was admitted.
    pub(in crate::runtime) metrics: Arc<AgentRunMetrics>,
    pub(in crate::runtime) admitted: std::time::Instant,
    /// The agent has produced something (its first output is timed).
    pub(in crate::runtime) produced: bool,
    /// The run's spans, when traces are on (boxed: a run without keeps a pointer).
    pub(in crate::runtime) trace: Option<Box<RunTrace>>,
}

impl SegmentWriter {
    /// The writer of a run's first segment, started in the request's context (the
    /// request's span is the run's parent); the run is counted as started.
    pub(in crate::runtime) fn first(
        rt: &Runtime,
        thread: &Arc<Thread>,
        run: &Arc<LiveRun>,
        permit: crate::runtime::admission::Slot,
    ) -> SegmentWriter {
        let trace = rt
            .options()
            .tracer
            .as_ref()
            .map(|tracer| Box::new(tracer.run(&thread.agent, &thread.id, &run.id)));
        rt.run_metrics().agent(&thread.agent).started();
        SegmentWriter {
            rt: rt.clone(),
            thread: thread.clone(),
            run: run.clone(),
            permit: Some(permit),
            quiet: false,
            metrics: rt.run_metrics().agent(&thread.agent),
            admitted: std::time::Instant::now(),
            produced: false,
            trace,
        }
    }

    /// `RUN_STARTED`, the history snapshot when due, and the state snapshot.
    /// `link`: the span of the request that opened this segment (its turn links to it).
    pub(in crate::runtime) fn start(
        &mut self,
        parent_run_id: Option<String>,
        opening: Opening,
        link: Option<SpanContext>,
    ) {
        let mut translator = lock(&self.run.translator);
        let mut out: Vec<Event> = translator.start(parent_run_id).into_iter().collect();
        if let Some(messages) = opening.history {
            out.push(Event::MessagesSnapshot { messages });
        }
        if let Some(note) = opening.steer {
            out.push(Event::Custom {
                name: super::steer_note::STEER_EVENT.to_owned(),
                value: note,
            });
        }
        if !opening.unsent.is_empty() {
            out.push(Event::Custom {
                name: UNSENT_EVENT.to_owned(),
                value: serde_json::json!({ "messageIds": opening.unsent }),
            });
        }
        out.push(Event::StateSnapshot {
            snapshot: lock(&self.thread.state).document.value(&self.thread.agent),
        });
        self.emit(&mut translator, &out);
        let run_id = translator.run_id().to_owned();
        drop(translator);
        if let Some(trace) = &mut self.trace {
            trace.turn_started(&run_id, link);
        }
        if run_id != self.run.id {
            // A later segment: counted on the run, shown as running again.
            self.rt.store().record_run_start(
                self.thread.key.as_str(),
                &self.thread.agent,
                None,
                &self.run.id,
                Vec::new(),
                now_ms() as i64,
            );
        }
    }

    pub(in crate::runtime) fn translate(&mut self, event: AgentEvent) {
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
        let mut out = scratch::take();
        translator.translate(event, &mut out);
        self.emit(&mut translator, &out);
        scratch::put(out);
    }

    /// Sets a member of the shared state and sends the delta.
    pub(in crate::runtime) fn set_state(&mut self, pointer: &str, value: Value) {
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
    pub(in crate::runtime) fn close_for_park(&mut self, ending: &Ending) {
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        if matches!(ending, Ending::Interrupt { .. }) {
            // The client needs the whole picture to answer an interrupt.
            translator.close_open_for_park(&mut out);
            let (messages, document) = {
                let state = lock(&self.thread.state);
                (
                    crate::runtime::transcript_json(&state.transcript),
                    state.document.value(&self.thread.agent),
                )
            };
            let messages = self.rt.shown(&self.thread.key, messages);
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
        let waiting = lock(&self.run.suspension).as_ref().and_then(|suspension| {
            notices::waiting(&self.rt, &self.thread, &self.run.id, suspension, ending)
        });
        let reported = waiting.is_some();
        self.rt.store().set_status_notifying(
            self.thread.key.as_str(),
            "suspended",
            now_ms() as i64,
            waiting,
        );
        self.rt.outgoing_queued(reported);
    }

    /// Ends the segment because the run waits on the client: the terminal event, once
    /// [`SegmentWriter::close_for_park`]'s writes are committed.
    pub(in crate::runtime) fn park(&mut self, ending: Ending) {
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
    pub(in crate::runtime) async fn commit(&self) -> bool {
        match self.rt.store().commit().await {
            Ok(()) => !self.rt.lease_lost(&self.thread.key),
            Err(error) => {
                tracing::error!(%error, "store commit failed");
                false
            }
        }
    }

    /// The terminal event in place of one whose writes did not commit.
    pub(in crate::runtime) fn failed_ending(&self) -> Ending {
        if self.rt.lease_lost(&self.thread.key) {
            lease_lost()
        } else {
            store_failed()
        }
    }

    /// Remembers the interrupts of a suspension that failed closed (a late resume for them
    /// is then reported as expired).
    pub(in crate::runtime) fn expired(&self, suspension: &Suspension) {
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
    pub(in crate::runtime) async fn finish(&mut self, ending: Ending) {
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
    pub(in crate::runtime) fn trace_end(&mut self, ending: &Ending) {
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
    pub(in crate::runtime) fn record_error(&self, code: &str, message: &str) {
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
            .store()
            .record_messages(self.thread.key.as_str(), vec![recorded], now_ms() as i64);
    }

    /// Records the run's end (with its state document and its webhook event).
    pub(in crate::runtime) fn record_end(&self, ending: &Ending) {
        self.keep_state();
        let ended = notices::ended(&self.rt, &self.thread, &self.run.id, ending);
        let reported = ended.is_some();
        self.rt.store().record_run_end_notifying(
            self.thread.key.as_str(),
            &self.run.id,
            ending_kind(ending),
            "idle",
            now_ms() as i64,
            ended,
        );
        self.rt.outgoing_queued(reported);
    }

    /// Keeps the thread's state document as the run leaves it (when it is not a fresh
    /// thread's), in the same commit as the run's end.
    fn keep_state(&self) {
        let state = lock(&self.thread.state);
        if let Some(document) = state.document.changed() {
            self.rt
                .store()
                .set_state(self.thread.key.as_str(), document);
        }
    }

    /// [`SegmentWriter::finish`] without waiting for the store (a pump that ended without
    /// a terminal event, from `Drop`).
    pub(in crate::runtime) fn finish_now(&mut self, ending: Ending) {
        let recorded = ending.clone();
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
        self.record_end(&recorded);
    }

    /// Appends events to the journal and records what they completed, while the translator
    /// is locked, so a resync sees journal, transcript and open items at one position.
    pub(in crate::runtime) fn emit(&self, translator: &mut Translator, events: &[Event]) {
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
            .store()
            .record_messages(self.thread.key.as_str(), changed, now_ms() as i64);
    }

    pub(in crate::runtime) fn count_end(&self, ending: &Ending) {
        let outcome = match ending {
            Ending::Finished { .. } => Outcome::Finished,
            Ending::Cancelled => Outcome::Cancelled,
            Ending::Error { code, .. } if code == "SHUTDOWN" => Outcome::Shutdown,
            _ => Outcome::Error,
        };
        self.metrics.finished(outcome, self.admitted.elapsed());
    }

    pub(in crate::runtime) fn ending_for(&self, result: Result<TurnEnd, AgentError>) -> Ending {
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

    pub(in crate::runtime) fn cancelled_ending(&self) -> Ending {
        match self.run.reason() {
            Some(CancelReason::Shutdown) => Ending::Error {
                code: "SHUTDOWN".to_owned(),
                message: "the server is shutting down".to_owned(),
            },
            Some(CancelReason::LeaseLost) => lease_lost(),
            Some(CancelReason::Budget) => Ending::Error {
                code: "BUDGET_EXCEEDED".to_owned(),
                message: lock(&self.run.budget_note)
                    .clone()
                    .unwrap_or_else(|| "a budget is spent".to_owned()),
            },
            Some(CancelReason::Requested | CancelReason::Abandoned) | None => Ending::Cancelled,
        }
    }

    pub(in crate::runtime) fn sanitize(&self, message: &str) -> String {
        self.rt.sanitized(message)
    }
}

impl SegmentWriter {
    /// Once the disconnect grace has passed (a client cut near the end can still reattach
    /// exactly until then), a finished run's frames leave memory unless a new run is live;
    /// a later cursor into them gets a resync.
    pub(in crate::runtime) fn release_later(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let thread = Arc::downgrade(&self.thread);
        let rt = self.rt.clone();
        let after = rt.options().disconnect_grace;
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(thread) = thread.upgrade() {
                rt.threads().grace_over(&thread);
            }
        });
    }
}

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        // A panic inside a batch leaves it unpublished: what is written from here on (and
        // the batch with it) is handed to the readers at once.
        self.quiet = false;
        self.thread.journal.publish();
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
            // Steering input handed to this run as it ended (handed over only while it
            // was live, under this lock): recorded after its output.
            while let Some(command) = self.run.control.try_recv() {
                if let Control::Steered(messages) = command {
                    self.record_steered_in(&mut state, messages);
                }
            }
        }
        self.thread.account();
        {
            let aliases = lock(&self.run.aliases).clone();
            let keys = aliases.iter().map(|alias| self.thread.run_key(alias));
            self.rt.runs().remove(keys, &self.run);
        }
        self.run.phase.set(Phase::Running);
        self.run.finished.cancel();
        self.rt.fleet_activity(self.thread.owner());
        self.release_later();
        // Released exactly once, after the thread no longer shows this run as live.
        self.permit.take();
        self.rt.threads().run_ended(&self.thread);
        self.rt.kick_queue(&self.thread);
    }
}

impl SegmentWriter {
    /// Steering input the agent took, added to the transcript where the run is now and
    /// stored.
    pub(in crate::runtime) fn record_steered(&self, messages: Vec<Message>) {
        self.record_steered_in(&mut lock(&self.thread.state), messages);
        self.thread.account();
    }

    /// [`SegmentWriter::record_steered`] under the thread's state lock, held: stored in the
    /// order of the transcript.
    fn record_steered_in(&self, state: &mut ThreadState, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        state.transcript.extend(messages.iter().cloned());
        self.rt
            .store()
            .record_messages(self.thread.key.as_str(), messages, now_ms() as i64);
    }
}

/// Adds one completed item to the transcript; returns the message to persist (a tool call
/// is merged into its parent assistant message when there is one).
pub(in crate::runtime) fn absorb(transcript: &mut Vec<Message>, mut produced: Produced) -> Message {
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

/// How a run's ending is recorded (`runs.outcome`) and logged.
pub(in crate::runtime) fn ending_kind(ending: &Ending) -> &'static str {
    match ending {
        Ending::Finished { .. } => "finished",
        Ending::Cancelled => "cancelled",
        _ => "error",
    }
}

/// The ending of a run on a node that lost its thread's lease to another node (cluster):
/// nothing more it does for the thread is stored.
pub(in crate::runtime) fn lease_lost() -> Ending {
    Ending::Error {
        code: "LEASE_LOST".to_owned(),
        message: "another node took this thread over; reattach to follow it there".to_owned(),
    }
}

/// The ending of a run whose writes the store could not commit.
pub(in crate::runtime) fn store_failed() -> Ending {
    Ending::Error {
        code: "STORE_UNAVAILABLE".to_owned(),
        message: "the run could not be stored; send it again".to_owned(),
    }
}

/// The events one agent event translates to, in a buffer kept per worker thread: no
/// allocation per event, and an idle run holds none.
mod scratch {
    use std::cell::Cell;

    use crate::protocol::Event;

    /// A buffer grown larger than this many events is let go rather than kept.
    const KEEP: usize = 64;

    thread_local! {
        static EVENTS: Cell<Vec<Event>> = const { Cell::new(Vec::new()) };
    }

    /// The thread's buffer (empty), or a new one when it is in use.
    pub(super) fn take() -> Vec<Event> {
        EVENTS.take()
    }

    /// Gives `events` back, emptied, to be used again.
    pub(super) fn put(mut events: Vec<Event>) {
        events.clear();
        if events.capacity() <= KEEP {
            EVENTS.set(events);
        }
    }
}
