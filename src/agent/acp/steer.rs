//! Steering: new input handed to a thread's running turn (`_session/steering`, which an
//! agent advertises with `_meta.steering.supported` in its `initialize` answer), so the
//! turn goes on with it instead of a new one starting after it. The request opts into
//! `idleBehavior: "promptRequired"`: with no turn running the agent keeps its hands off
//! the input, and the daemon runs it as a turn of its own.

use std::time::Duration;

use agent_client_protocol::UntypedMessage;
use serde_json::{Value, json};

use super::Inner;
use super::process::AcpProcess;
use crate::protocol::input::{Content, ContentPart, Message};

/// The extension method.
const STEER_METHOD: &str = "_session/steering";
/// How long the agent has to take a steering message.
const STEER_WAIT: Duration = Duration::from_secs(10);

/// Whether the agent's process takes input during a turn.
pub(super) fn steers(process: &AcpProcess) -> bool {
    let advertised = |meta: Option<&serde_json::Map<String, Value>>| {
        meta.and_then(|m| m.get("steering"))
            .and_then(|s| s.get("supported"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    advertised(process.initialized.meta.as_ref())
        || advertised(process.capabilities().meta.as_ref())
}

impl Inner {
    /// Hands `messages` (user messages of text) to thread `thread_key`'s running turn.
    /// Why not, when the agent did not take them.
    pub(super) async fn steer(&self, thread_key: &str, messages: &[Message]) -> Result<(), String> {
        let Some(bound) = self.bindings.live(thread_key) else {
            return Err("the thread has no live session".to_owned());
        };
        if !steers(&bound.process) {
            return Err("the agent does not take input while a turn runs".to_owned());
        }
        let prompt = text_blocks(messages)?;
        let params = json!({
            "sessionId": bound.session,
            "prompt": prompt,
            "_meta": {"steering": {"idleBehavior": "promptRequired"}},
        });
        let request = UntypedMessage::new(STEER_METHOD, params).map_err(|e| e.to_string())?;
        let sent = bound.process.connection.send_request(request).block_task();
        let answer = match tokio::time::timeout(STEER_WAIT, sent).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => return Err(format!("the agent refused it: {}", error.message)),
            Err(_) => return Err("the agent did not answer in time".to_owned()),
        };
        match answer["outcome"].as_str() {
            Some("injected") => Ok(()),
            Some(other) => Err(format!("the agent did not take it into the turn ({other})")),
            None => Err("the agent's answer names no outcome".to_owned()),
        }
    }
}

/// The messages' text as ACP text blocks; input other than text is not steered.
fn text_blocks(messages: &[Message]) -> Result<Vec<Value>, String> {
    let mut blocks = Vec::new();
    for message in messages {
        let Message::User(user) = message else {
            return Err("only user messages steer a turn".to_owned());
        };
        match &user.content {
            Content::Text(text) => blocks.push(json!({"type": "text", "text": text})),
            Content::Parts(parts) => {
                for part in parts {
                    let ContentPart::Text(part) = part else {
                        return Err("only text steers a turn".to_owned());
                    };
                    blocks.push(json!({"type": "text", "text": part.text}));
                }
            }
        }
    }
    if blocks.is_empty() {
        return Err("nothing to steer with".to_owned());
    }
    Ok(blocks)
}
