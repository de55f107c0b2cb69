//! Byte-exact golden tests: every AG-UI event type and the SSE framing.

use agui_serve::protocol::events::{
    EncryptedSubtype, Event, Interrupt, Outcome, ReasoningRole, SubagentOutcome, TextRole,
    TokenUsage, ToolRole,
};
use agui_serve::protocol::{KEEP_ALIVE, Profile, encode_event, sse_frame};
use serde_json::json;

fn check(event: Event, expected: &str) {
    let bytes = encode_event(&event, None);
    assert_eq!(
        std::str::from_utf8(&bytes).expect("utf8"),
        expected,
        "{}",
        event.type_name()
    );
}

fn s(v: &str) -> String {
    v.to_owned()
}

#[test]
fn text_message_events() {
    check(
        Event::TextMessageStart {
            message_id: s("m"),
            role: Some(TextRole::Assistant),
            name: None,
            subagent_run_id: None,
        },
        r#"{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}"#,
    );
    check(
        Event::TextMessageStart {
            message_id: s("m"),
            role: None,
            name: Some(s("bot")),
            subagent_run_id: None,
        },
        r#"{"type":"TEXT_MESSAGE_START","messageId":"m","name":"bot"}"#,
    );
    check(
        Event::TextMessageContent {
            message_id: s("m"),
            delta: s("hi \"x\"\n"),
            subagent_run_id: None,
        },
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"hi \"x\"\n"}"#,
    );
    // A subagent's message says whose it is.
    check(
        Event::TextMessageStart {
            message_id: s("m"),
            role: Some(TextRole::Assistant),
            name: None,
            subagent_run_id: Some(s("sub-1")),
        },
        r#"{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant","subagentRunId":"sub-1"}"#,
    );
    check(
        Event::TextMessageContent {
            message_id: s("m"),
            delta: s("x"),
            subagent_run_id: Some(s("sub-1")),
        },
        r#"{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"x","subagentRunId":"sub-1"}"#,
    );
    check(
        Event::TextMessageEnd {
            message_id: s("m"),
            subagent_run_id: Some(s("sub-1")),
        },
        r#"{"type":"TEXT_MESSAGE_END","messageId":"m","subagentRunId":"sub-1"}"#,
    );
    check(
        Event::TextMessageEnd {
            message_id: s("m"),
            subagent_run_id: None,
        },
        r#"{"type":"TEXT_MESSAGE_END","messageId":"m"}"#,
    );
    check(
        Event::TextMessageChunk {
            message_id: Some(s("m")),
            role: Some(TextRole::User),
            delta: Some(s("d")),
            name: None,
        },
        r#"{"type":"TEXT_MESSAGE_CHUNK","messageId":"m","role":"user","delta":"d"}"#,
    );
    check(
        Event::TextMessageChunk {
            message_id: None,
            role: None,
            delta: None,
            name: None,
        },
        r#"{"type":"TEXT_MESSAGE_CHUNK"}"#,
    );
}

#[test]
fn tool_call_events() {
    check(
        Event::ToolCallStart {
            tool_call_id: s("c"),
            tool_call_name: s("f"),
            parent_message_id: Some(s("m")),
        },
        r#"{"type":"TOOL_CALL_START","toolCallId":"c","toolCallName":"f","parentMessageId":"m"}"#,
    );
    check(
        Event::ToolCallArgs {
            tool_call_id: s("c"),
            delta: s("{\"a\":1}"),
        },
        r#"{"type":"TOOL_CALL_ARGS","toolCallId":"c","delta":"{\"a\":1}"}"#,
    );
    check(
        Event::ToolCallEnd {
            tool_call_id: s("c"),
        },
        r#"{"type":"TOOL_CALL_END","toolCallId":"c"}"#,
    );
    check(
        Event::ToolCallChunk {
            tool_call_id: Some(s("c")),
            tool_call_name: Some(s("f")),
            parent_message_id: None,
            delta: Some(s("{")),
        },
        r#"{"type":"TOOL_CALL_CHUNK","toolCallId":"c","toolCallName":"f","delta":"{"}"#,
    );
    check(
        Event::ToolCallResult {
            message_id: s("r"),
            tool_call_id: s("c"),
            content: s("ok"),
            role: Some(ToolRole::Tool),
        },
        r#"{"type":"TOOL_CALL_RESULT","messageId":"r","toolCallId":"c","content":"ok","role":"tool"}"#,
    );
}

#[test]
fn state_and_message_events() {
    check(
        Event::StateSnapshot {
            snapshot: json!({"a": [1]}),
        },
        r#"{"type":"STATE_SNAPSHOT","snapshot":{"a":[1]}}"#,
    );
    check(
        Event::StateSnapshot {
            snapshot: json!(null),
        },
        r#"{"type":"STATE_SNAPSHOT","snapshot":null}"#,
    );
    check(
        Event::StateDelta {
            delta: json!([{"op": "add", "path": "/a", "value": 1}]),
        },
        r#"{"type":"STATE_DELTA","delta":[{"op":"add","path":"/a","value":1}]}"#,
    );
    check(
        Event::MessagesSnapshot {
            messages: json!([{"id": "1", "role": "user", "content": "x"}]),
        },
        r#"{"type":"MESSAGES_SNAPSHOT","messages":[{"id":"1","role":"user","content":"x"}]}"#,
    );
    check(
        Event::ActivitySnapshot {
            message_id: s("a"),
            activity_type: s("progress"),
            content: json!({"p": 1}),
            replace: Some(false),
        },
        r#"{"type":"ACTIVITY_SNAPSHOT","messageId":"a","activityType":"progress","content":{"p":1},"replace":false}"#,
    );
    check(
        Event::ActivityDelta {
            message_id: s("a"),
            activity_type: s("progress"),
            patch: json!([]),
        },
        r#"{"type":"ACTIVITY_DELTA","messageId":"a","activityType":"progress","patch":[]}"#,
    );
    check(
        Event::Raw {
            event: json!({"x": 1}),
            source: Some(s("acp")),
        },
        r#"{"type":"RAW","event":{"x":1},"source":"acp"}"#,
    );
    check(
        Event::Custom {
            name: s("acp.x"),
            value: json!(true),
        },
        r#"{"type":"CUSTOM","name":"acp.x","value":true}"#,
    );
}

#[test]
fn run_events() {
    check(
        Event::RunStarted {
            thread_id: s("t"),
            run_id: s("r"),
            protocol_version: Some(s("1.0")),
            parent_run_id: None,
            input: None,
        },
        r#"{"type":"RUN_STARTED","threadId":"t","runId":"r","protocolVersion":"1.0"}"#,
    );
    check(
        Event::RunFinished {
            thread_id: s("t"),
            run_id: s("r"),
            result: None,
            outcome: None,
            usage: None,
        },
        r#"{"type":"RUN_FINISHED","threadId":"t","runId":"r"}"#,
    );
    check(
        Event::RunFinished {
            thread_id: s("t"),
            run_id: s("r"),
            result: Some(json!(1)),
            outcome: Some(Outcome::Success {
                pending_tool_call_ids: Some(vec![s("c")]),
            }),
            usage: Some(vec![TokenUsage {
                input_tokens: Some(3),
                total_tokens: Some(5),
                ..TokenUsage::default()
            }]),
        },
        r#"{"type":"RUN_FINISHED","threadId":"t","runId":"r","result":1,"outcome":{"type":"success","pendingToolCallIds":["c"]},"usage":[{"inputTokens":3,"totalTokens":5}]}"#,
    );
    check(
        Event::RunFinished {
            thread_id: s("t"),
            run_id: s("r"),
            result: None,
            outcome: Some(Outcome::Interrupt {
                interrupts: vec![Interrupt {
                    id: s("i"),
                    reason: s("confirmation"),
                    message: Some(s("ok?")),
                    tool_call_id: Some(s("c")),
                    response_schema: None,
                    expires_at: None,
                    metadata: None,
                }],
            }),
            usage: None,
        },
        r#"{"type":"RUN_FINISHED","threadId":"t","runId":"r","outcome":{"type":"interrupt","interrupts":[{"id":"i","reason":"confirmation","message":"ok?","toolCallId":"c"}]}}"#,
    );
    check(
        Event::RunFinished {
            thread_id: s("t"),
            run_id: s("r"),
            result: None,
            outcome: Some(Outcome::Cancelled),
            usage: None,
        },
        r#"{"type":"RUN_FINISHED","threadId":"t","runId":"r","outcome":{"type":"cancelled"}}"#,
    );
    check(
        Event::RunError {
            message: s("boom"),
            code: Some(s("AGENT_ERROR")),
            usage: None,
        },
        r#"{"type":"RUN_ERROR","message":"boom","code":"AGENT_ERROR"}"#,
    );
    check(
        Event::StepStarted { step_name: s("s") },
        r#"{"type":"STEP_STARTED","stepName":"s"}"#,
    );
    check(
        Event::StepFinished { step_name: s("s") },
        r#"{"type":"STEP_FINISHED","stepName":"s"}"#,
    );
}

#[test]
fn reasoning_events() {
    check(
        Event::ReasoningStart { message_id: s("r") },
        r#"{"type":"REASONING_START","messageId":"r"}"#,
    );
    check(
        Event::ReasoningMessageStart {
            message_id: s("r"),
            role: ReasoningRole::Reasoning,
        },
        r#"{"type":"REASONING_MESSAGE_START","messageId":"r","role":"reasoning"}"#,
    );
    check(
        Event::ReasoningMessageContent {
            message_id: s("r"),
            delta: s("hm"),
        },
        r#"{"type":"REASONING_MESSAGE_CONTENT","messageId":"r","delta":"hm"}"#,
    );
    check(
        Event::ReasoningMessageEnd { message_id: s("r") },
        r#"{"type":"REASONING_MESSAGE_END","messageId":"r"}"#,
    );
    check(
        Event::ReasoningEnd { message_id: s("r") },
        r#"{"type":"REASONING_END","messageId":"r"}"#,
    );
    check(
        Event::ReasoningMessageChunk {
            message_id: Some(s("r")),
            delta: None,
        },
        r#"{"type":"REASONING_MESSAGE_CHUNK","messageId":"r"}"#,
    );
    check(
        Event::ReasoningEncryptedValue {
            subtype: EncryptedSubtype::ToolCall,
            entity_id: s("c"),
            encrypted_value: s("xyz"),
        },
        r#"{"type":"REASONING_ENCRYPTED_VALUE","subtype":"tool-call","entityId":"c","encryptedValue":"xyz"}"#,
    );
}

#[test]
fn subagent_events() {
    check(
        Event::SubagentStarted {
            subagent_run_id: s("sa"),
            name: s("helper"),
            description: None,
            parent_subagent_run_id: None,
            parent_tool_call_id: Some(s("c")),
            parent_message_id: None,
        },
        r#"{"type":"SUBAGENT_STARTED","subagentRunId":"sa","name":"helper","parentToolCallId":"c"}"#,
    );
    check(
        Event::SubagentFinished {
            subagent_run_id: s("sa"),
            result: None,
            outcome: Some(SubagentOutcome::Suspended {
                interrupt_ids: Some(vec![s("i")]),
            }),
        },
        r#"{"type":"SUBAGENT_FINISHED","subagentRunId":"sa","outcome":{"type":"suspended","interruptIds":["i"]}}"#,
    );
    check(
        Event::SubagentFinished {
            subagent_run_id: s("sa"),
            result: None,
            outcome: Some(SubagentOutcome::Success),
        },
        r#"{"type":"SUBAGENT_FINISHED","subagentRunId":"sa","outcome":{"type":"success"}}"#,
    );
    check(
        Event::SubagentError {
            subagent_run_id: s("sa"),
            message: s("x"),
            code: None,
        },
        r#"{"type":"SUBAGENT_ERROR","subagentRunId":"sa","message":"x"}"#,
    );
}

#[test]
fn timestamps_are_integer_milliseconds() {
    let bytes = encode_event(
        &Event::TextMessageEnd {
            message_id: s("m"),
            subagent_run_id: None,
        },
        Some(1_700_000_000_123),
    );
    assert_eq!(
        std::str::from_utf8(&bytes).expect("utf8"),
        r#"{"type":"TEXT_MESSAGE_END","messageId":"m","timestamp":1700000000123}"#
    );
}

#[test]
fn sse_frame_is_id_then_data_lf_only() {
    let frame = sse_frame("1a-00000001", br#"{"type":"RUN_STARTED"}"#);
    assert_eq!(
        &frame[..],
        b"id: 1a-00000001\ndata: {\"type\":\"RUN_STARTED\"}\n\n"
    );
    assert!(!frame.contains(&b'\r'));
    assert_eq!(KEEP_ALIVE, b": keep-alive\n\n");
}

#[test]
fn legacy_profile_rewrites_only_what_pre_1_0_clients_reject() {
    let cancelled = Event::RunFinished {
        thread_id: s("t"),
        run_id: s("r"),
        result: None,
        outcome: Some(Outcome::Cancelled),
        usage: None,
    };
    let adapted = Profile::Legacy.adapt(&cancelled).expect("rewritten");
    assert_eq!(
        String::from_utf8(encode_event(&adapted, None)).expect("utf8"),
        r#"{"type":"RUN_ERROR","message":"run cancelled","code":"cancelled"}"#
    );
    let pending = Event::RunFinished {
        thread_id: s("t"),
        run_id: s("r"),
        result: None,
        outcome: Some(Outcome::Success {
            pending_tool_call_ids: Some(vec![s("c")]),
        }),
        usage: None,
    };
    let adapted = Profile::Legacy.adapt(&pending).expect("rewritten");
    assert_eq!(
        String::from_utf8(encode_event(&adapted, None)).expect("utf8"),
        r#"{"type":"RUN_FINISHED","threadId":"t","runId":"r"}"#
    );
    assert!(Profile::V1.adapt(&cancelled).is_none());
    assert!(
        Profile::Legacy
            .adapt(&Event::TextMessageEnd {
                message_id: s("m"),
                subagent_run_id: None,
            })
            .is_none()
    );
}
