//! The 31 AG-UI 1.0 event types as typed Rust, serialized exactly as the wire expects:
//! `type` in SCREAMING_SNAKE_CASE, every field camelCase, absent optionals omitted (never
//! `null`), timestamps as integer milliseconds.
//!
//! This module only describes events. Deciding *which* events to send, and in what order, is
//! the translator's job (`runtime::translator`).

use serde::Serialize;
use serde_json::Value;

/// Who a text message is attributed to (`TEXT_MESSAGE_START.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TextRole {
    Developer,
    System,
    Assistant,
    User,
}

/// `REASONING_ENCRYPTED_VALUE.subtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EncryptedSubtype {
    ToolCall,
    Message,
}

/// One entry of `RUN_FINISHED.usage` / `RUN_ERROR.usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_input_tokens: Option<u64>,
}

/// An open question to the client carried by an interrupt outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    /// RFC 3339 instant after which a resume is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// `RUN_FINISHED.outcome`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Outcome {
    #[serde(rename_all = "camelCase")]
    Success {
        #[serde(skip_serializing_if = "Option::is_none")]
        pending_tool_call_ids: Option<Vec<String>>,
    },
    Interrupt {
        interrupts: Vec<Interrupt>,
    },
    Cancelled,
}

/// `SUBAGENT_FINISHED.outcome`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SubagentOutcome {
    Success,
    #[serde(rename_all = "camelCase")]
    Suspended {
        #[serde(skip_serializing_if = "Option::is_none")]
        interrupt_ids: Option<Vec<String>>,
    },
}

/// Every AG-UI 1.0 event. Field names follow the wire; see `tests/golden_events.rs` for the
/// exact bytes each variant produces.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        message_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        role: Option<TextRole>,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The subagent whose message this is (absent: the run's own agent).
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageContent {
        message_id: String,
        delta: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd {
        message_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        subagent_run_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageChunk {
        #[serde(skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        role: Option<TextRole>,
        #[serde(skip_serializing_if = "Option::is_none")]
        delta: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd {
        tool_call_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallChunk {
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_call_name: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        delta: Option<String>,
    },
    /// `content` is always a string: the form every client profile accepts.
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        role: Option<ToolRole>,
    },
    StateSnapshot {
        snapshot: Value,
    },
    /// RFC 6902 operations.
    StateDelta {
        delta: Value,
    },
    MessagesSnapshot {
        messages: Value,
    },
    #[serde(rename_all = "camelCase")]
    ActivitySnapshot {
        message_id: String,
        activity_type: String,
        content: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        replace: Option<bool>,
    },
    #[serde(rename_all = "camelCase")]
    ActivityDelta {
        message_id: String,
        activity_type: String,
        patch: Value,
    },
    Raw {
        event: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    Custom {
        name: String,
        value: Value,
    },
    #[serde(rename_all = "camelCase")]
    RunStarted {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        protocol_version: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
    },
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<Outcome>,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<TokenUsage>>,
    },
    RunError {
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Vec<TokenUsage>>,
    },
    #[serde(rename_all = "camelCase")]
    StepStarted {
        step_name: String,
    },
    #[serde(rename_all = "camelCase")]
    StepFinished {
        step_name: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningStart {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningEnd {
        message_id: String,
    },
    /// `role` is always `"reasoning"` on the wire.
    #[serde(rename_all = "camelCase")]
    ReasoningMessageStart {
        message_id: String,
        role: ReasoningRole,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageContent {
        message_id: String,
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageEnd {
        message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageChunk {
        #[serde(skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        delta: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    ReasoningEncryptedValue {
        subtype: EncryptedSubtype,
        entity_id: String,
        encrypted_value: String,
    },
    #[serde(rename_all = "camelCase")]
    SubagentStarted {
        subagent_run_id: String,
        name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_subagent_run_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_tool_call_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_message_id: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    SubagentFinished {
        subagent_run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<SubagentOutcome>,
    },
    #[serde(rename_all = "camelCase")]
    SubagentError {
        subagent_run_id: String,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
}

/// The constant `role:"tool"` of `TOOL_CALL_RESULT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolRole {
    Tool,
}

/// The constant `role:"reasoning"` of `REASONING_MESSAGE_START`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningRole {
    Reasoning,
}

impl Event {
    /// The `RUN_STARTED` that opens every segment this server writes: it always names the
    /// protocol version.
    pub fn run_started(thread_id: &str, run_id: &str, parent_run_id: Option<String>) -> Event {
        Event::RunStarted {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            protocol_version: Some(crate::protocol::PROTOCOL_VERSION.to_owned()),
            parent_run_id,
            input: None,
        }
    }

    /// The wire name of this event's type, for logs.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::TextMessageStart { .. } => "TEXT_MESSAGE_START",
            Event::TextMessageContent { .. } => "TEXT_MESSAGE_CONTENT",
            Event::TextMessageEnd { .. } => "TEXT_MESSAGE_END",
            Event::TextMessageChunk { .. } => "TEXT_MESSAGE_CHUNK",
            Event::ToolCallStart { .. } => "TOOL_CALL_START",
            Event::ToolCallArgs { .. } => "TOOL_CALL_ARGS",
            Event::ToolCallEnd { .. } => "TOOL_CALL_END",
            Event::ToolCallChunk { .. } => "TOOL_CALL_CHUNK",
            Event::ToolCallResult { .. } => "TOOL_CALL_RESULT",
            Event::StateSnapshot { .. } => "STATE_SNAPSHOT",
            Event::StateDelta { .. } => "STATE_DELTA",
            Event::MessagesSnapshot { .. } => "MESSAGES_SNAPSHOT",
            Event::ActivitySnapshot { .. } => "ACTIVITY_SNAPSHOT",
            Event::ActivityDelta { .. } => "ACTIVITY_DELTA",
            Event::Raw { .. } => "RAW",
            Event::Custom { .. } => "CUSTOM",
            Event::RunStarted { .. } => "RUN_STARTED",
            Event::RunFinished { .. } => "RUN_FINISHED",
            Event::RunError { .. } => "RUN_ERROR",
            Event::StepStarted { .. } => "STEP_STARTED",
            Event::StepFinished { .. } => "STEP_FINISHED",
            Event::ReasoningStart { .. } => "REASONING_START",
            Event::ReasoningEnd { .. } => "REASONING_END",
            Event::ReasoningMessageStart { .. } => "REASONING_MESSAGE_START",
            Event::ReasoningMessageContent { .. } => "REASONING_MESSAGE_CONTENT",
            Event::ReasoningMessageEnd { .. } => "REASONING_MESSAGE_END",
            Event::ReasoningMessageChunk { .. } => "REASONING_MESSAGE_CHUNK",
            Event::ReasoningEncryptedValue { .. } => "REASONING_ENCRYPTED_VALUE",
            Event::SubagentStarted { .. } => "SUBAGENT_STARTED",
            Event::SubagentFinished { .. } => "SUBAGENT_FINISHED",
            Event::SubagentError { .. } => "SUBAGENT_ERROR",
        }
    }

    /// True for `RUN_FINISHED` and `RUN_ERROR`.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::RunFinished { .. } | Event::RunError { .. })
    }
}
