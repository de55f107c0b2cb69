//! The pump: one task per run that drives the agent and is the only writer of the thread's
//! journal for as long as the run lives.
//!
//! The pump owns the run's [`Translator`]; agent events flow agent -> sink -> pump ->
//! translator -> journal. The HTTP request that started the run only reads the journal, so
//! a disconnect never stops the agent. A [`SegmentWriter`] guarantees, even on panic, that
//! the segment gets its terminal event, the thread's live run is cleared and the admission
//! slot is released exactly once.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use serde_json::Value;

use super::attach::{Attachment, Mode};
use super::sanitize::sanitize;
use super::translator::{Ending, Produced, Translator};
use super::{CancelReason, LiveRun, Runtime, Thread, lock, now_ms};
use crate::agent::{Agent, AgentError, AgentEvent, EventSink, Turn, TurnEnd};
use crate::protocol::input::{
    AssistantMessage, Content, FunctionCall, FunctionKind, TextMessage, ToolCall, ToolMessage,
};
use crate::protocol::{Event, Message, Profile, RunAgentInput};

/// How long an agent may take to stop after its run was cancelled before the pump gives up
/// on it and ends the segment anyway.
const CANCEL_BOUND: Duration = Duration::from_millis(1500);
/// Agent events buffered between the agent and the pump.
const SINK_CAPACITY: usize = 64;

/// Starts a run on `thread`; the caller holds the thread's decide lock and `permit`.
pub(super) fn start(
    rt: &Runtime,
    thread: &Arc<Thread>,
    agent: Arc<dyn Agent>,
    input: RunAgentInput,
    profile: Profile,
    permit: OwnedSemaphorePermit,
) -> Attachment {
    let inner = &rt.inner;
    let segment_start = thread.journal.next_seq();
    let run = Arc::new(LiveRun {
        id: input.run_id.clone(),
        cancel: CancellationToken::new(),
        reason: Mutex::new(None),
        attached: watch::Sender::new(0),
        segment_start: AtomicU64::new(segment_start),
        finished: CancellationToken::new(),
        translator: Mutex::new(Translator::new(&thread.id, &input.run_id)),
    });
    let (new_messages, history) = {
        let mut state = lock(&thread.state);
        let new: Vec<Message> = input
            .messages
            .iter()
            .filter(|m| !state.seen.contains(m.id()))
            .cloned()
            .collect();
        for message in &new {
            state.seen.insert(message.id().to_owned());
            state.transcript.push(message.clone());
        }
        state.live = Some(run.clone());
        state.persisted = true;
        if let Some(client) = &input.state {
            state.document["client"] = client.clone();
        }
        let history = std::mem::take(&mut state.history_pending).then(|| {
            capped_history(
                &state.transcript,
                inner.options.history_max_messages,
                inner.options.history_max_bytes,
            )
        });
        (new, history)
    };
    let title = new_messages.iter().find_map(|m| match m {
        Message::User(user) => Some(title_of(&user.content.text())),
        _ => None,
    });
    inner.store.record_run_start(
        &thread.id,
        &thread.agent,
        title,
        &run.id,
        new_messages.clone(),
        now_ms() as i64,
    );
    lock(&inner.runs).insert(run.id.clone(), run.clone());

    // Attached before the pump starts, so the disconnect watcher sees this stream.
    let attachment = rt.attachment(
        thread,
        segment_start.saturating_sub(1),
        profile,
        Some(run.clone()),
        Mode::Segment,
    );

    let turn = Turn {
        thread_id: thread.id.clone(),
        run_id: run.id.clone(),
        messages: input.messages,
        new_messages,
        tools: input.tools,
        context: input.context,
        client_state: input.state,
        cancel: run.cancel.child_token(),
    };
    let span = tracing::info_span!("run", thread.id = %thread.id, run.id = %run.id);
    let writer = SegmentWriter {
        rt: rt.clone(),
        thread: thread.clone(),
        run: run.clone(),
        permit: Some(permit),
    };
    inner
        .run_tasks
        .spawn(drive(writer, agent, turn, input.parent_run_id, history).instrument(span.clone()));
    inner
        .run_tasks
        .spawn(watch_disconnect(run, inner.options.disconnect_grace).instrument(span));
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

/// A thread title from its first user message: one line, at most 80 characters.
fn title_of(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

async fn drive(
    mut writer: SegmentWriter,
    agent: Arc<dyn Agent>,
    turn: Turn,
    parent_run_id: Option<String>,
    history: Option<Value>,
) {
    tracing::info!("run started");
    let started = std::time::Instant::now();
    writer.start(parent_run_id, history);
    let run = writer.run.clone();
    let (sink, mut events) = EventSink::channel(SINK_CAPACITY);
    let mut turn_future = AssertUnwindSafe(agent.run(turn, sink)).catch_unwind();
    let overdue = async {
        run.cancel.cancelled().await;
        tokio::time::sleep(CANCEL_BOUND).await;
    };
    tokio::pin!(overdue);

    let ending = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => writer.translate(event),
            outcome = &mut turn_future => {
                while let Ok(event) = events.try_recv() {
                    writer.translate(event);
                }
                break match outcome {
                    Ok(result) => writer.ending_for(result),
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
                break writer.cancelled_ending();
            }
        }
    };
    let kind = match &ending {
        Ending::Finished { .. } => "finished",
        Ending::Cancelled => "cancelled",
        Ending::Error { .. } => "error",
    };
    writer.finish(ending);
    tracing::info!(
        outcome = kind,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "run ended"
    );
}

/// Cancels the run once nobody has been attached for `grace`.
async fn watch_disconnect(run: Arc<LiveRun>, grace: Duration) {
    let mut attached = run.attached.subscribe();
    let ended = run.cancel.clone();
    loop {
        tokio::select! {
            () = ended.cancelled() => return,
            () = run.finished.cancelled() => return,
            nobody = attached.wait_for(|n| *n == 0) => if nobody.is_err() { return },
        }
        tokio::select! {
            () = ended.cancelled() => return,
            () = run.finished.cancelled() => return,
            back = tokio::time::timeout(grace, attached.wait_for(|n| *n > 0)) => match back {
                Ok(Ok(_)) => continue,
                Ok(Err(_)) => return,
                Err(_elapsed) => {
                    tracing::info!(grace_ms = grace.as_millis() as u64, "no stream attached for the disconnect grace; cancelling");
                    run.cancel_with(CancelReason::Abandoned);
                    return;
                }
            },
        }
    }
}

/// Writes one segment into the journal and cleans up after the run, even on panic.
struct SegmentWriter {
    rt: Runtime,
    thread: Arc<Thread>,
    run: Arc<LiveRun>,
    permit: Option<OwnedSemaphorePermit>,
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
            snapshot: lock(&self.thread.state).document.clone(),
        });
        self.emit(&mut translator, &out);
    }

    fn translate(&mut self, event: AgentEvent) {
        let mut translator = lock(&self.run.translator);
        let mut out = Vec::new();
        translator.translate(event, &mut out);
        self.emit(&mut translator, &out);
    }

    fn finish(&mut self, ending: Ending) {
        let outcome = match &ending {
            Ending::Finished { .. } => "finished",
            Ending::Cancelled => "cancelled",
            Ending::Error { .. } => "error",
        };
        let mut translator = lock(&self.run.translator);
        if translator.is_ended() {
            return;
        }
        let mut out = Vec::new();
        translator.finish(ending, &mut out);
        self.emit(&mut translator, &out);
        self.rt.inner.store.record_run_end(
            &self.thread.id,
            &self.run.id,
            outcome,
            "idle",
            now_ms() as i64,
        );
    }

    /// Appends events to the journal and records what they completed, while the translator
    /// is locked, so a resync sees journal, transcript and open items at one position.
    fn emit(&self, translator: &mut Translator, events: &[Event]) {
        for event in events {
            let id = self.thread.journal.push(event, now_ms());
            tracing::trace!(event = event.type_name(), id = %id, "event");
        }
        let completed = translator.take_completed();
        if completed.is_empty() {
            return;
        }
        let mut changed = Vec::new();
        {
            let mut state = lock(&self.thread.state);
            for produced in completed {
                let message = absorb(&mut state.transcript, produced);
                state.seen.insert(message.id().to_owned());
                changed.push(message);
            }
        }
        self.rt
            .inner
            .store
            .record_messages(&self.thread.id, changed, now_ms() as i64);
    }

    fn ending_for(&self, result: Result<TurnEnd, AgentError>) -> Ending {
        match result {
            Ok(TurnEnd::Finished { result }) => Ending::Finished { result },
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

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        if !lock(&self.run.translator).is_ended() {
            tracing::error!("run ended without a terminal event; ending it with RUN_ERROR");
            self.finish(Ending::Error {
                code: "INTERNAL".to_owned(),
                message: "the run ended unexpectedly".to_owned(),
            });
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
        lock(&self.rt.inner.runs).remove(&self.run.id);
        self.run.finished.cancel();
        // Released exactly once, after the thread no longer shows this run as live.
        self.permit.take();
    }
}

/// Adds one completed item to the transcript; returns the message to persist (a tool call
/// is merged into its parent assistant message when there is one).
fn absorb(transcript: &mut Vec<Message>, produced: Produced) -> Message {
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
    };
    transcript.push(message.clone());
    message
}
