//! A loaded session's replay as a transcript: for a session imported as a thread.

use serde_json::Value;

use super::translate::text_of;
use crate::protocol::input::{AssistantMessage, Content, Message, UserMessage};

/// The transcript a loaded session's replay tells: its user and agent messages as AG-UI
/// messages (chunks of one message joined; ids `acp-<messageId>`, or `import-<uuid>` when
/// the agent gives none). Thoughts, tool calls and plans are not carried over.
pub(super) fn transcript_of(updates: &[Value]) -> Vec<Message> {
    struct Open {
        user: bool,
        acp_id: String,
        id: String,
        text: String,
    }
    fn close(open: Option<Open>, messages: &mut Vec<Message>) {
        let Some(open) = open else {
            return;
        };
        messages.push(if open.user {
            Message::User(UserMessage {
                id: open.id,
                content: Content::Text(open.text),
                name: None,
            })
        } else {
            Message::Assistant(AssistantMessage {
                id: open.id,
                content: Some(open.text),
                name: None,
                tool_calls: Vec::new(),
            })
        });
    }
    let mut messages = Vec::new();
    let mut open: Option<Open> = None;
    for update in updates {
        let user = match update["sessionUpdate"].as_str() {
            Some("user_message_chunk") => true,
            Some("agent_message_chunk") => false,
            _ => continue,
        };
        let Some(text) = text_of(&update["content"]) else {
            continue;
        };
        let acp_id = update["messageId"].as_str().unwrap_or_default().to_owned();
        match &mut open {
            Some(current) if current.user == user && current.acp_id == acp_id => {
                current.text.push_str(&text);
            }
            _ => {
                close(open.take(), &mut messages);
                let id = if acp_id.is_empty() {
                    format!("import-{}", uuid::Uuid::new_v4())
                } else {
                    format!("acp-{acp_id}")
                };
                open = Some(Open {
                    user,
                    acp_id,
                    id,
                    text,
                });
            }
        }
    }
    close(open, &mut messages);
    messages
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_replay_becomes_a_transcript_of_whole_messages() {
        let chunk = |kind: &str, id: Option<&str>, text: &str| {
            let mut update =
                json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}});
            if let Some(id) = id {
                update["messageId"] = json!(id);
            }
            update
        };
        let transcript = transcript_of(&[
            chunk("user_message_chunk", Some("u1"), "hello "),
            chunk("user_message_chunk", Some("u1"), "there"),
            chunk("agent_thought_chunk", Some("t1"), "hmm"),
            chunk("agent_message_chunk", Some("a1"), "Hi"),
            chunk("agent_message_chunk", Some("a2"), "Again"),
            chunk("agent_message_chunk", None, "no "),
            chunk("agent_message_chunk", None, "id"),
        ]);
        let shown: Vec<Value> = transcript
            .iter()
            .map(|m| serde_json::to_value(m).expect("serializes"))
            .collect();
        assert_eq!(
            shown[0],
            json!({"role": "user", "id": "acp-u1", "content": "hello there"})
        );
        assert_eq!(
            shown[1],
            json!({"role": "assistant", "id": "acp-a1", "content": "Hi"})
        );
        assert_eq!(
            shown[2],
            json!({"role": "assistant", "id": "acp-a2", "content": "Again"})
        );
        assert_eq!(shown[3]["content"], "no id");
        assert!(shown[3]["id"].as_str().expect("id").starts_with("import-"));
        assert_eq!(shown.len(), 4);
    }
}
