//! Turns an agent's domain events into a valid AG-UI event sequence for one run segment.
//!
//! The translator owns the lifecycle rules the official clients enforce (fatal when broken):
//! - `RUN_STARTED` (with `protocolVersion`) first, exactly one terminal event last;
//! - every message, reasoning block, tool call, step and subagent opened is closed before
//!   the terminal event (an open subagent gets `SUBAGENT_FINISHED`, with the `suspended`
//!   outcome when the segment ends because the run waits on the client);
//! - no CONTENT/ARGS/END for an id that is not open, no second START for an open id, no
//!   `TOOL_CALL_RESULT` for a tool call never opened;
//! - no empty deltas.
//!
//! An agent that breaks a rule is corrected (a delta for an unopened message opens it) or,
//! when no correction exists, the event is dropped with a warning in the log.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::agent::AgentEvent;
use crate::protocol::events::{
    Event, Interrupt, Outcome, ReasoningRole, SubagentOutcome, TextRole, TokenUsage,
};

mod events;

/// How a segment ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Finished {
        result: Option<Value>,
        /// `RUN_FINISHED.usage` (omitted when empty).
        usage: Vec<TokenUsage>,
    },
    Cancelled,
    Error {
        code: String,
        message: String,
    },
    /// The run waits on these frontend tool calls (`pendingToolCallIds`).
    Suspended {
        pending: Vec<String>,
    },
    /// The run waits on these interrupts (AG-UI 1.0 interrupt outcome).
    Interrupt {
        interrupts: Vec<Interrupt>,
    },
}

/// One run segment's lifecycle state.
#[derive(Debug)]
pub struct Translator {
    thread_id: String,
    run_id: String,
    started: bool,
    ended: bool,
    open_text: Vec<String>,
    open_reasoning: Vec<String>,
    open_tools: Vec<String>,
    open_steps: Vec<String>,
    /// Open text messages that are a subagent's: message id -> `subagentRunId`.
    text_owner: BTreeMap<String, String>,
    /// Subagents started and not finished: id, name, description.
    open_subagents: Vec<(String, String, Option<String>)>,
    /// Subagents finished in this segment (an id is not reused within one).
    finished_subagents: BTreeSet<String>,
    /// Tool calls opened in this thread that a result may answer.
    known_tools: BTreeSet<String>,
    /// Tool calls already answered by a `TOOL_CALL_RESULT`.
    answered_tools: BTreeSet<String>,
    /// What the agent produced in this segment, content accumulated as it streams.
    transcript: Vec<Produced>,
    /// Indexes into `transcript` of items completed since the last `take_completed`.
    completed: Vec<usize>,
    /// Messages an earlier segment cut (closed at its park while the agent was still
    /// writing them): the agent's id -> the id their rest goes out under here.
    carried: BTreeMap<String, String>,
}

/// A message the agent produced in this segment, as it would appear in the transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Produced {
    Text {
        id: String,
        content: String,
    },
    Reasoning {
        id: String,
        content: String,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: String,
        parent_message_id: Option<String>,
    },
    ToolResult {
        id: String,
        tool_call_id: String,
        content: String,
    },
    Activity {
        id: String,
        activity_type: String,
        content: Value,
    },
}

impl Translator {
    pub fn new(thread_id: &str, run_id: &str) -> Translator {
        Translator {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            started: false,
            ended: false,
            open_text: Vec::new(),
            open_reasoning: Vec::new(),
            open_tools: Vec::new(),
            open_steps: Vec::new(),
            text_owner: BTreeMap::new(),
            open_subagents: Vec::new(),
            finished_subagents: BTreeSet::new(),
            known_tools: BTreeSet::new(),
            answered_tools: BTreeSet::new(),
            transcript: Vec::new(),
            completed: Vec::new(),
            carried: BTreeMap::new(),
        }
    }

    /// The agent's ids of the text and reasoning messages open now (a park cuts them).
    pub fn open_messages(&self) -> Vec<String> {
        self.open_text
            .iter()
            .chain(&self.open_reasoning)
            .map(|shown| {
                self.carried
                    .iter()
                    .find(|(_, out)| *out == shown)
                    .map_or_else(|| shown.clone(), |(agent, _)| agent.clone())
            })
            .collect()
    }

    /// The rest of message `agent_id`, cut by an earlier segment's park, goes out as a
    /// message of its own, `<id>~<segment>`: a client (and the stored transcript) keeps the
    /// part before the park under the first id.
    pub fn carry(&mut self, agent_id: &str, segment: u32) {
        self.carried
            .insert(agent_id.to_owned(), format!("{agent_id}~{segment}"));
    }

    /// `event` with the id a carried message goes on under (see [`Translator::carry`]).
    fn carried_on(&self, event: AgentEvent) -> AgentEvent {
        match event {
            AgentEvent::TextStart { message_id } => AgentEvent::TextStart {
                message_id: self.shown_id(message_id),
            },
            AgentEvent::TextDelta { message_id, delta } => AgentEvent::TextDelta {
                message_id: self.shown_id(message_id),
                delta,
            },
            AgentEvent::TextEnd { message_id } => AgentEvent::TextEnd {
                message_id: self.shown_id(message_id),
            },
            AgentEvent::ReasoningStart { message_id } => AgentEvent::ReasoningStart {
                message_id: self.shown_id(message_id),
            },
            AgentEvent::ReasoningDelta { message_id, delta } => AgentEvent::ReasoningDelta {
                message_id: self.shown_id(message_id),
                delta,
            },
            AgentEvent::ReasoningEnd { message_id } => AgentEvent::ReasoningEnd {
                message_id: self.shown_id(message_id),
            },
            other => other,
        }
    }

    fn shown_id(&self, agent_id: String) -> String {
        self.carried.get(&agent_id).cloned().unwrap_or(agent_id)
    }

    /// Every tool call this translator has seen opened (or was told of).
    pub fn known_tool_calls(&self) -> impl Iterator<Item = &String> {
        self.known_tools.iter()
    }

    /// Marks a tool call from an earlier segment as one a result may answer.
    pub fn know_tool_call(&mut self, tool_call_id: &str) {
        self.known_tools.insert(tool_call_id.to_owned());
    }

    /// `RUN_STARTED`, exactly once, first.
    pub fn start(&mut self, parent_run_id: Option<String>) -> Option<Event> {
        if self.started {
            return None;
        }
        self.started = true;
        Some(Event::run_started(
            &self.thread_id,
            &self.run_id,
            parent_run_id,
        ))
    }

    /// Whether `RUN_STARTED` has been produced.
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// Whether the terminal event has been produced.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// What the agent produced so far in this segment.
    pub fn produced(&self) -> &[Produced] {
        &self.transcript
    }

    /// Translates one agent event, appending the AG-UI events it yields to `out`.
    pub fn translate(&mut self, event: AgentEvent, out: &mut Vec<Event>) {
        if self.ended {
            tracing::warn!(event = ?event_kind(&event), "agent event after the terminal event dropped");
            return;
        }
        if let Some(start) = self.start(None) {
            out.push(start);
        }
        let event = self.carried_on(event);
        match event {
            AgentEvent::TextStart { message_id } => self.open_text_message(message_id, None, out),
            AgentEvent::SubagentTextStart {
                subagent_run_id,
                message_id,
            } => self.on_subagent_text_start(subagent_run_id, message_id, out),
            AgentEvent::TextDelta { message_id, delta } => {
                self.on_text_delta(message_id, delta, out)
            }
            AgentEvent::TextEnd { message_id } => self.on_text_end(message_id, out),
            AgentEvent::ReasoningStart { message_id } => self.open_reasoning_block(message_id, out),
            AgentEvent::ReasoningDelta { message_id, delta } => {
                self.on_reasoning_delta(message_id, delta, out)
            }
            AgentEvent::ReasoningEnd { message_id } => self.on_reasoning_end(message_id, out),
            AgentEvent::ToolCallStart {
                tool_call_id,
                name,
                parent_message_id,
            } => self.on_tool_call_start(tool_call_id, name, parent_message_id, out),
            AgentEvent::ToolCallArgs {
                tool_call_id,
                delta,
            } => self.on_tool_call_args(tool_call_id, delta, out),
            AgentEvent::ToolCallEnd { tool_call_id } => self.on_tool_call_end(tool_call_id, out),
            AgentEvent::ToolCallResult {
                tool_call_id,
                message_id,
                content,
            } => self.on_tool_call_result(tool_call_id, message_id, content, out),
            AgentEvent::StepStarted { name } => self.on_step_started(name, out),
            AgentEvent::StepFinished { name } => self.on_step_finished(name, out),
            AgentEvent::Custom { name, value } => out.push(Event::Custom { name, value }),
            AgentEvent::Activity {
                message_id,
                activity_type,
                content,
            } => self.on_activity(message_id, activity_type, content, out),
            AgentEvent::ActivityLive {
                message_id,
                activity_type,
                content,
            } => out.push(Event::ActivitySnapshot {
                message_id,
                activity_type,
                content,
                replace: None,
            }),
            AgentEvent::ActivityDelta {
                message_id,
                activity_type,
                patch,
            } => out.push(Event::ActivityDelta {
                message_id,
                activity_type,
                patch,
            }),
            AgentEvent::SubagentStarted {
                subagent_run_id,
                name,
                description,
            } => self.on_subagent_started(subagent_run_id, name, description, out),
            AgentEvent::SubagentFinished { subagent_run_id } => {
                self.on_subagent_finished(subagent_run_id, out)
            }
            AgentEvent::SubagentError {
                subagent_run_id,
                message,
            } => self.on_subagent_error(subagent_run_id, message, out),
        }
    }

    /// Ends subagent `id`, closing its open messages first.
    fn close_subagent(&mut self, id: &str, out: &mut Vec<Event>) -> bool {
        let Some(at) = self.open_subagents.iter().position(|s| s.0 == id) else {
            return false;
        };
        self.open_subagents.remove(at);
        self.finished_subagents.insert(id.to_owned());
        self.close_texts_of(id, out);
        true
    }

    fn close_texts_of(&mut self, subagent: &str, out: &mut Vec<Event>) {
        let owned: Vec<String> = self
            .open_text
            .iter()
            .filter(|m| self.text_owner.get(*m).is_some_and(|s| s == subagent))
            .cloned()
            .collect();
        for message_id in owned {
            remove(&mut self.open_text, &message_id);
            self.complete(&message_id, Kind::Text);
            self.text_owner.remove(&message_id);
            out.push(Event::TextMessageEnd {
                message_id,
                subagent_run_id: Some(subagent.to_owned()),
            });
        }
    }

    /// Closes the open subagents: `suspended` when the segment ends because the run waits
    /// on the client (the subagent goes on in the next segment), else finished.
    fn close_subagents(&mut self, suspended: bool, out: &mut Vec<Event>) {
        for (subagent_run_id, _, _) in std::mem::take(&mut self.open_subagents).into_iter().rev() {
            self.finished_subagents.insert(subagent_run_id.clone());
            self.close_texts_of(&subagent_run_id, out);
            out.push(Event::SubagentFinished {
                subagent_run_id,
                result: None,
                outcome: Some(if suspended {
                    SubagentOutcome::Suspended {
                        interrupt_ids: None,
                    }
                } else {
                    SubagentOutcome::Success
                }),
            });
        }
    }

    /// Closes everything still open and produces the one terminal event.
    pub fn finish(&mut self, ending: Ending, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        let suspended = matches!(ending, Ending::Suspended { .. } | Ending::Interrupt { .. });
        self.close_subagents(suspended, out);
        self.close_open(out);
        self.ended = true;
        out.push(match ending {
            Ending::Finished { result, usage } => Event::RunFinished {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                result,
                outcome: None,
                usage: (!usage.is_empty()).then_some(usage),
            },
            Ending::Cancelled => Event::RunFinished {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                result: None,
                outcome: Some(Outcome::Cancelled),
                usage: None,
            },
            Ending::Error { code, message } => Event::RunError {
                message,
                code: Some(code),
                usage: None,
            },
            Ending::Suspended { pending } => Event::RunFinished {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                result: None,
                outcome: Some(Outcome::Success {
                    pending_tool_call_ids: Some(pending),
                }),
                usage: None,
            },
            Ending::Interrupt { interrupts } => Event::RunFinished {
                thread_id: self.thread_id.clone(),
                run_id: self.run_id.clone(),
                result: None,
                outcome: Some(Outcome::Interrupt { interrupts }),
                usage: None,
            },
        });
    }

    /// Closes everything still open (before a terminal event or a snapshot).
    pub fn close_open(&mut self, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        if let Some(start) = self.start(None) {
            out.push(start);
        }
        for tool_call_id in std::mem::take(&mut self.open_tools) {
            self.complete(&tool_call_id, Kind::Tool);
            out.push(Event::ToolCallEnd { tool_call_id });
        }
        for message_id in std::mem::take(&mut self.open_text) {
            self.complete(&message_id, Kind::Text);
            let subagent_run_id = self.text_owner.remove(&message_id);
            out.push(Event::TextMessageEnd {
                message_id,
                subagent_run_id,
            });
        }
        for message_id in std::mem::take(&mut self.open_reasoning) {
            self.complete(&message_id, Kind::Reasoning);
            close_reasoning(message_id, out);
        }
        for step_name in self.open_steps.drain(..).rev() {
            out.push(Event::StepFinished { step_name });
        }
    }

    /// Closes everything still open before a suspension's terminal event; open subagents
    /// are suspended with the run.
    pub fn close_open_for_park(&mut self, out: &mut Vec<Event>) {
        if self.ended {
            return;
        }
        if let Some(start) = self.start(None) {
            out.push(start);
        }
        self.close_subagents(true, out);
        self.close_open(out);
    }

    /// Items completed since the last call, in completion order.
    pub fn take_completed(&mut self) -> Vec<Produced> {
        std::mem::take(&mut self.completed)
            .into_iter()
            .filter_map(|i| self.transcript.get(i).cloned())
            .collect()
    }

    /// Events that re-open, for a reader joining mid-segment, everything open now, with
    /// the content streamed so far (resync).
    pub fn reopen(&self) -> Vec<Event> {
        let mut out = Vec::new();
        for (id, name, description) in &self.open_subagents {
            out.push(subagent_started(
                id.clone(),
                name.clone(),
                description.clone(),
            ));
        }
        for step_name in &self.open_steps {
            out.push(Event::StepStarted {
                step_name: step_name.clone(),
            });
        }
        for produced in &self.transcript {
            match produced {
                Produced::Reasoning { id, content } if self.open_reasoning.contains(id) => {
                    out.push(Event::ReasoningStart {
                        message_id: id.clone(),
                    });
                    out.push(Event::ReasoningMessageStart {
                        message_id: id.clone(),
                        role: ReasoningRole::Reasoning,
                    });
                    if !content.is_empty() {
                        out.push(Event::ReasoningMessageContent {
                            message_id: id.clone(),
                            delta: content.clone(),
                        });
                    }
                }
                Produced::Text { id, content } if self.open_text.contains(id) => {
                    let subagent_run_id = self.text_owner.get(id).cloned();
                    out.push(Event::TextMessageStart {
                        message_id: id.clone(),
                        role: Some(TextRole::Assistant),
                        name: None,
                        subagent_run_id: subagent_run_id.clone(),
                    });
                    if !content.is_empty() {
                        out.push(Event::TextMessageContent {
                            message_id: id.clone(),
                            delta: content.clone(),
                            subagent_run_id,
                        });
                    }
                }
                Produced::ToolCall {
                    id,
                    name,
                    arguments,
                    parent_message_id,
                } if self.open_tools.contains(id) => {
                    out.push(Event::ToolCallStart {
                        tool_call_id: id.clone(),
                        tool_call_name: name.clone(),
                        parent_message_id: parent_message_id.clone(),
                    });
                    if !arguments.is_empty() {
                        out.push(Event::ToolCallArgs {
                            tool_call_id: id.clone(),
                            delta: arguments.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The run id this translator writes.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    fn complete(&mut self, id: &str, kind: Kind) {
        let found = self.transcript.iter().rposition(|p| match (p, kind) {
            (Produced::Text { id: pid, .. }, Kind::Text)
            | (Produced::Reasoning { id: pid, .. }, Kind::Reasoning)
            | (Produced::ToolCall { id: pid, .. }, Kind::Tool) => pid == id,
            _ => false,
        });
        if let Some(i) = found {
            self.completed.push(i);
        }
    }

    fn open_text_message(
        &mut self,
        message_id: String,
        subagent_run_id: Option<String>,
        out: &mut Vec<Event>,
    ) {
        if self.open_text.contains(&message_id) {
            tracing::warn!(message.id = %message_id, "second start of an open text message dropped");
            return;
        }
        push_exact_first(&mut self.open_text, message_id.clone());
        if let Some(subagent) = &subagent_run_id {
            self.text_owner.insert(message_id.clone(), subagent.clone());
        }
        push_exact_first(
            &mut self.transcript,
            Produced::Text {
                id: message_id.clone(),
                content: String::new(),
            },
        );
        out.push(Event::TextMessageStart {
            message_id,
            role: Some(TextRole::Assistant),
            name: None,
            subagent_run_id,
        });
    }

    fn open_reasoning_block(&mut self, message_id: String, out: &mut Vec<Event>) {
        if self.open_reasoning.contains(&message_id) {
            tracing::warn!(message.id = %message_id, "second start of an open reasoning block dropped");
            return;
        }
        self.open_reasoning.push(message_id.clone());
        self.transcript.push(Produced::Reasoning {
            id: message_id.clone(),
            content: String::new(),
        });
        out.push(Event::ReasoningStart {
            message_id: message_id.clone(),
        });
        out.push(Event::ReasoningMessageStart {
            message_id,
            role: ReasoningRole::Reasoning,
        });
    }

    fn append(&mut self, message_id: &str, delta: &str, reasoning: bool) {
        for produced in self.transcript.iter_mut().rev() {
            match produced {
                Produced::Text { id, content } if !reasoning && id == message_id => {
                    content.push_str(delta);
                    return;
                }
                Produced::Reasoning { id, content } if reasoning && id == message_id => {
                    content.push_str(delta);
                    return;
                }
                _ => {}
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Reasoning,
    Tool,
}

/// Pushes `item`; an empty vector gets room for it alone (a run that sits idle holds one
/// message, not room for four), later pushes grow it as usual.
fn push_exact_first<T>(items: &mut Vec<T>, item: T) {
    if items.capacity() == 0 {
        items.reserve_exact(1);
    }
    items.push(item);
}

fn close_reasoning(message_id: String, out: &mut Vec<Event>) {
    out.push(Event::ReasoningMessageEnd {
        message_id: message_id.clone(),
    });
    out.push(Event::ReasoningEnd { message_id });
}

fn remove(list: &mut Vec<String>, id: &str) -> bool {
    match list.iter().position(|x| x == id) {
        Some(i) => {
            list.remove(i);
            true
        }
        None => false,
    }
}

fn event_kind(event: &AgentEvent) -> &'static str {
    match event {
        AgentEvent::TextStart { .. } => "text_start",
        AgentEvent::SubagentTextStart { .. } => "subagent_text_start",
        AgentEvent::TextDelta { .. } => "text_delta",
        AgentEvent::TextEnd { .. } => "text_end",
        AgentEvent::ReasoningStart { .. } => "reasoning_start",
        AgentEvent::ReasoningDelta { .. } => "reasoning_delta",
        AgentEvent::ReasoningEnd { .. } => "reasoning_end",
        AgentEvent::ToolCallStart { .. } => "tool_call_start",
        AgentEvent::ToolCallArgs { .. } => "tool_call_args",
        AgentEvent::ToolCallEnd { .. } => "tool_call_end",
        AgentEvent::ToolCallResult { .. } => "tool_call_result",
        AgentEvent::StepStarted { .. } => "step_started",
        AgentEvent::StepFinished { .. } => "step_finished",
        AgentEvent::Custom { .. } => "custom",
        AgentEvent::Activity { .. } => "activity",
        AgentEvent::ActivityLive { .. } => "activity_live",
        AgentEvent::ActivityDelta { .. } => "activity_delta",
        AgentEvent::SubagentStarted { .. } => "subagent_started",
        AgentEvent::SubagentFinished { .. } => "subagent_finished",
        AgentEvent::SubagentError { .. } => "subagent_error",
    }
}

fn subagent_started(subagent_run_id: String, name: String, description: Option<String>) -> Event {
    Event::SubagentStarted {
        subagent_run_id,
        name,
        description,
        parent_subagent_run_id: None,
        parent_tool_call_id: None,
        parent_message_id: None,
    }
}

#[cfg(test)]
mod tests;
