//! The ACP `session/update` translator: any sequence of updates (JSON values, one per
//! line of the input) never panics, and what it reports keeps the lifecycle the runtime
//! relies on: text and reasoning deltas only inside their open message, every message
//! closed by the end of the turn, tool-call arguments, ends and results only for calls it
//! opened.
#![no_main]

use std::collections::HashSet;
use std::sync::OnceLock;

use agui_serve::agent::AgentEvent;
use agui_serve::agent::acp::translate_updates;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|text: &str| {
    let updates: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    if updates.is_empty() {
        return;
    }
    let events = runtime().block_on(translate_updates(&updates, vec!["chart".to_owned()]));
    let mut text_open: Option<String> = None;
    let mut reasoning_open: Option<String> = None;
    let mut tools = HashSet::new();
    for event in &events {
        match event {
            AgentEvent::TextStart { message_id } => {
                assert!(text_open.is_none(), "{events:?}");
                text_open = Some(message_id.clone());
            }
            AgentEvent::TextDelta { message_id, .. } => {
                assert_eq!(text_open.as_ref(), Some(message_id), "{events:?}")
            }
            AgentEvent::TextEnd { message_id } => {
                assert_eq!(text_open.take().as_ref(), Some(message_id), "{events:?}")
            }
            AgentEvent::ReasoningStart { message_id } => {
                assert!(reasoning_open.is_none(), "{events:?}");
                reasoning_open = Some(message_id.clone());
            }
            AgentEvent::ReasoningDelta { message_id, .. } => {
                assert_eq!(reasoning_open.as_ref(), Some(message_id), "{events:?}")
            }
            AgentEvent::ReasoningEnd { message_id } => {
                assert_eq!(
                    reasoning_open.take().as_ref(),
                    Some(message_id),
                    "{events:?}"
                )
            }
            AgentEvent::ToolCallStart { tool_call_id, .. } => {
                tools.insert(tool_call_id.clone());
            }
            AgentEvent::ToolCallArgs { tool_call_id, .. }
            | AgentEvent::ToolCallEnd { tool_call_id }
            | AgentEvent::ToolCallResult { tool_call_id, .. } => {
                assert!(tools.contains(tool_call_id), "{events:?}")
            }
            _ => {}
        }
    }
    assert!(
        text_open.is_none() && reasoning_open.is_none(),
        "{events:?}"
    );
});
