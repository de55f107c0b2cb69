//! How each agent event becomes AG-UI events: messages, reasoning, tool calls, steps,
//! activities and subagents, each checked against what is open.

use serde_json::Value;

use crate::protocol::events::{Event, SubagentOutcome, ToolRole};

use super::*;

impl Translator {
    /// [`AgentEvent::SubagentTextStart`].
    pub(super) fn on_subagent_text_start(
        &mut self,
        subagent_run_id: String,
        message_id: String,
        out: &mut Vec<Event>,
    ) {
        if !self.open_subagents.iter().any(|s| s.0 == subagent_run_id) {
            tracing::warn!(subagent = %subagent_run_id, "a message of a subagent that is not open is the agent's own");
            self.open_text_message(message_id, None, out);
        } else {
            self.open_text_message(message_id, Some(subagent_run_id), out);
        }
    }

    /// [`AgentEvent::TextDelta`].
    pub(super) fn on_text_delta(
        &mut self,
        message_id: String,
        delta: String,
        out: &mut Vec<Event>,
    ) {
        if delta.is_empty() {
            return;
        }
        if !self.open_text.contains(&message_id) {
            self.open_text_message(message_id.clone(), None, out);
        }
        self.append(&message_id, &delta, false);
        let subagent_run_id = self.text_owner.get(&message_id).cloned();
        out.push(Event::TextMessageContent {
            message_id,
            delta,
            subagent_run_id,
        });
    }

    /// [`AgentEvent::TextEnd`].
    pub(super) fn on_text_end(&mut self, message_id: String, out: &mut Vec<Event>) {
        if remove(&mut self.open_text, &message_id) {
            self.complete(&message_id, Kind::Text);
            let subagent_run_id = self.text_owner.remove(&message_id);
            out.push(Event::TextMessageEnd {
                message_id,
                subagent_run_id,
            });
        } else {
            tracing::warn!(message.id = %message_id, "end of a text message that is not open dropped");
        }
    }

    /// [`AgentEvent::ReasoningDelta`].
    pub(super) fn on_reasoning_delta(
        &mut self,
        message_id: String,
        delta: String,
        out: &mut Vec<Event>,
    ) {
        if delta.is_empty() {
            return;
        }
        if !self.open_reasoning.contains(&message_id) {
            self.open_reasoning_block(message_id.clone(), out);
        }
        self.append(&message_id, &delta, true);
        out.push(Event::ReasoningMessageContent { message_id, delta });
    }

    /// [`AgentEvent::ReasoningEnd`].
    pub(super) fn on_reasoning_end(&mut self, message_id: String, out: &mut Vec<Event>) {
        if remove(&mut self.open_reasoning, &message_id) {
            self.complete(&message_id, Kind::Reasoning);
            close_reasoning(message_id, out);
        } else {
            tracing::warn!(message.id = %message_id, "end of a reasoning block that is not open dropped");
        }
    }

    /// [`AgentEvent::ToolCallStart`].
    pub(super) fn on_tool_call_start(
        &mut self,
        tool_call_id: String,
        name: String,
        parent_message_id: Option<String>,
        out: &mut Vec<Event>,
    ) {
        if self.open_tools.contains(&tool_call_id) {
            tracing::warn!(tool_call.id = %tool_call_id, "second start of an open tool call dropped");
            return;
        }
        self.open_tools.push(tool_call_id.clone());
        self.known_tools.insert(tool_call_id.clone());
        self.transcript.push(Produced::ToolCall {
            id: tool_call_id.clone(),
            name: name.clone(),
            arguments: String::new(),
            parent_message_id: parent_message_id.clone(),
        });
        out.push(Event::ToolCallStart {
            tool_call_id,
            tool_call_name: name,
            parent_message_id,
        });
    }

    /// [`AgentEvent::ToolCallArgs`].
    pub(super) fn on_tool_call_args(
        &mut self,
        tool_call_id: String,
        delta: String,
        out: &mut Vec<Event>,
    ) {
        if delta.is_empty() {
            return;
        }
        if !self.open_tools.contains(&tool_call_id) {
            tracing::warn!(tool_call.id = %tool_call_id, "arguments for a tool call that is not open dropped");
            return;
        }
        for produced in self.transcript.iter_mut().rev() {
            if let Produced::ToolCall { id, arguments, .. } = produced
                && *id == tool_call_id
            {
                arguments.push_str(&delta);
                break;
            }
        }
        out.push(Event::ToolCallArgs {
            tool_call_id,
            delta,
        });
    }

    /// [`AgentEvent::ToolCallEnd`].
    pub(super) fn on_tool_call_end(&mut self, tool_call_id: String, out: &mut Vec<Event>) {
        if remove(&mut self.open_tools, &tool_call_id) {
            self.complete(&tool_call_id, Kind::Tool);
            out.push(Event::ToolCallEnd { tool_call_id });
        } else {
            tracing::warn!(tool_call.id = %tool_call_id, "end of a tool call that is not open dropped");
        }
    }

    /// [`AgentEvent::ToolCallResult`].
    pub(super) fn on_tool_call_result(
        &mut self,
        tool_call_id: String,
        message_id: String,
        content: String,
        out: &mut Vec<Event>,
    ) {
        if !self.known_tools.contains(&tool_call_id) {
            tracing::warn!(tool_call.id = %tool_call_id, "result for a tool call never opened dropped");
            return;
        }
        if !self.answered_tools.insert(tool_call_id.clone()) {
            tracing::warn!(tool_call.id = %tool_call_id, "second result for a tool call dropped");
            return;
        }
        if remove(&mut self.open_tools, &tool_call_id) {
            self.complete(&tool_call_id, Kind::Tool);
            out.push(Event::ToolCallEnd {
                tool_call_id: tool_call_id.clone(),
            });
        }
        self.transcript.push(Produced::ToolResult {
            id: message_id.clone(),
            tool_call_id: tool_call_id.clone(),
            content: content.clone(),
        });
        self.completed.push(self.transcript.len() - 1);
        out.push(Event::ToolCallResult {
            message_id,
            tool_call_id,
            content,
            role: Some(ToolRole::Tool),
        });
    }

    /// [`AgentEvent::StepStarted`].
    pub(super) fn on_step_started(&mut self, name: String, out: &mut Vec<Event>) {
        if self.open_steps.contains(&name) {
            tracing::warn!(step = %name, "second start of an open step dropped");
            return;
        }
        self.open_steps.push(name.clone());
        out.push(Event::StepStarted { step_name: name });
    }

    /// [`AgentEvent::StepFinished`].
    pub(super) fn on_step_finished(&mut self, name: String, out: &mut Vec<Event>) {
        if remove(&mut self.open_steps, &name) {
            out.push(Event::StepFinished { step_name: name });
        } else {
            tracing::warn!(step = %name, "finish of a step that is not open dropped");
        }
    }

    /// [`AgentEvent::Activity`].
    pub(super) fn on_activity(
        &mut self,
        message_id: String,
        activity_type: String,
        content: Value,
        out: &mut Vec<Event>,
    ) {
        self.transcript.push(Produced::Activity {
            id: message_id.clone(),
            activity_type: activity_type.clone(),
            content: content.clone(),
        });
        self.completed.push(self.transcript.len() - 1);
        out.push(Event::ActivitySnapshot {
            message_id,
            activity_type,
            content,
            replace: None,
        });
    }

    /// [`AgentEvent::SubagentStarted`].
    pub(super) fn on_subagent_started(
        &mut self,
        subagent_run_id: String,
        name: String,
        description: Option<String>,
        out: &mut Vec<Event>,
    ) {
        if self.open_subagents.iter().any(|s| s.0 == subagent_run_id)
            || self.finished_subagents.contains(&subagent_run_id)
        {
            tracing::warn!(subagent = %subagent_run_id, "second start of a subagent dropped");
            return;
        }
        self.open_subagents
            .push((subagent_run_id.clone(), name.clone(), description.clone()));
        out.push(subagent_started(subagent_run_id, name, description));
    }

    /// [`AgentEvent::SubagentFinished`].
    pub(super) fn on_subagent_finished(&mut self, subagent_run_id: String, out: &mut Vec<Event>) {
        if self.close_subagent(&subagent_run_id, out) {
            out.push(Event::SubagentFinished {
                subagent_run_id,
                result: None,
                outcome: Some(SubagentOutcome::Success),
            });
        } else {
            tracing::warn!(subagent = %subagent_run_id, "finish of a subagent that is not open dropped");
        }
    }

    /// [`AgentEvent::SubagentError`].
    pub(super) fn on_subagent_error(
        &mut self,
        subagent_run_id: String,
        message: String,
        out: &mut Vec<Event>,
    ) {
        if self.close_subagent(&subagent_run_id, out) {
            out.push(Event::SubagentError {
                subagent_run_id,
                message,
                code: None,
            });
        } else {
            tracing::warn!(subagent = %subagent_run_id, "error of a subagent that is not open dropped");
        }
    }
}
