//! What a turn prompts: the thread's undelivered input and the turn's new messages (or,
//! on a thread that never had a session, the client's transcript), as ACP content blocks
//! after the turn's context; the input kept when it never reached the agent; and input
//! the agent cannot take (`parts.rs` says what it takes), refused by name: before the
//! stream when the agent's capabilities are known, else by the turn, before its prompt.

use std::fmt::Write as _;

use agent_client_protocol::v1::schema::{ContentBlock, PromptCapabilities, TextContent};

use super::parts::{self, Refusal};
use super::{Inner, Stop};
use crate::agent::{AgentError, Turn};
use crate::protocol::InputError;
use crate::protocol::input::{Content, Message, UserMessage};

/// Input of a turn the agent cannot take: the first part refused, and every message
/// holding one.
#[derive(Debug)]
pub(super) struct Refused {
    message_id: String,
    part: usize,
    refusal: Refusal,
    messages: Vec<String>,
}

impl Inner {
    /// What this turn prompts: the thread's undelivered input, then the turn's new
    /// messages (each once). On a thread that never had a session, nothing was delivered:
    /// every user message of the client's transcript.
    ///
    /// When those earlier messages hold the agent's own answers (a thread whose session a
    /// rewind let go), they go first as one recap of the conversation instead.
    pub(super) fn input_for(&self, turn: &Turn) -> Vec<Message> {
        let mut input = self.bindings.take_undelivered(&turn.thread_id);
        let sessionless = turn.session_id.is_none() && !self.bindings.has(&turn.thread_id);
        let earlier: Vec<&Message> = turn
            .messages
            .iter()
            .filter(|m| sessionless && !turn.new_messages.iter().any(|n| n.id() == m.id()))
            .collect();
        let earlier: Vec<Message> = match earlier.iter().any(|m| matches!(m, Message::Assistant(_)))
        {
            true => vec![recap(turn, &earlier)],
            false => earlier
                .into_iter()
                .filter(|m| matches!(m, Message::User(_)))
                .cloned()
                .collect(),
        };
        for message in earlier.iter().chain(&turn.new_messages) {
            if !input.iter().any(|m| m.id() == message.id()) {
                input.push(message.clone());
            }
        }
        input
    }

    /// Keeps input the agent did not receive for the thread's next prompt.
    pub(super) fn keep_undelivered(&self, thread_id: &str, input: Vec<Message>) {
        if input.iter().any(|m| matches!(m, Message::User(_))) {
            tracing::info!(
                messages = input.len(),
                "the agent did not receive the prompt; it goes with the next one"
            );
            self.bindings.keep_undelivered(thread_id, input);
        }
    }

    /// A turn whose input the agent cannot take fails before its prompt, naming the first
    /// part refused (by its place in the request's messages when it is there). The refused
    /// messages are dropped (the client was told); the rest of the input waits for the
    /// thread's next prompt.
    pub(super) fn refuse_input(
        &self,
        turn: &Turn,
        mut input: Vec<Message>,
        refused: Refused,
    ) -> Stop {
        input.retain(|m| !refused.messages.iter().any(|id| id == m.id()));
        self.keep_undelivered(&turn.thread_id, input);
        let field = match turn
            .messages
            .iter()
            .position(|m| m.id() == refused.message_id)
        {
            Some(i) => format!("messages[{i}].content[{}]", refused.part),
            None => format!("message {:?} content[{}]", refused.message_id, refused.part),
        };
        Stop::Failed(AgentError::Failed {
            code: "INVALID_INPUT".to_owned(),
            message: invalid(&field, &refused.refusal, &self.name),
        })
    }
}

/// The most of a recap kept (its newest part), in bytes.
const RECAP_MAX: usize = 256 * 1024;

/// The conversation before this turn, as one user message of text: for an agent given a
/// new session on a thread that has history (its own answers included).
fn recap(turn: &Turn, earlier: &[&Message]) -> Message {
    let mut lines = Vec::new();
    for message in earlier {
        let line = match message {
            Message::User(user) => format!("User: {}", user.content.text()),
            Message::Assistant(assistant) => {
                let mut line = format!("Assistant: {}", assistant.content.as_deref().unwrap_or(""));
                for call in &assistant.tool_calls {
                    let _ = write!(
                        line,
                        "\n[called {} {}]",
                        call.function.name, call.function.arguments
                    );
                }
                line
            }
            Message::Tool(tool) => format!("[tool result] {}", tool.content.text()),
            Message::System(m) | Message::Developer(m) => format!("System: {}", m.content),
            Message::Activity(_) | Message::Reasoning(_) => continue,
        };
        lines.push(line);
    }
    let mut text = lines.join("\n\n");
    if text.len() > RECAP_MAX {
        let mut cut = text.len() - RECAP_MAX;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text = format!("[earlier turns left out]\n{}", &text[cut..]);
    }
    Message::User(UserMessage {
        id: format!("{}-recap", turn.run_id),
        content: Content::Text(format!(
            "This conversation goes on in a new session. What was said before, in order:\n\n\
             {text}\n\n(End of the earlier conversation. The next message is the new one.)"
        )),
        name: None,
    })
}

/// The prompt for a turn: context first, then the user messages of `input`, each part as
/// the block an agent with `capabilities` takes; or, when a part cannot go, what was
/// refused (nothing is sent then: a message never goes without one of its parts).
pub(super) fn prompt_blocks(
    turn: &Turn,
    input: &[Message],
    capabilities: &PromptCapabilities,
) -> Result<Vec<ContentBlock>, Refused> {
    let mut blocks = Vec::new();
    if !turn.context.is_empty() {
        let lines: Vec<String> = turn
            .context
            .iter()
            .map(|c| format!("- {}: {}", c.description, c.value))
            .collect();
        blocks.push(text(&format!("Context:\n{}", lines.join("\n"))));
    }
    let mut refused: Option<Refused> = None;
    for message in input {
        let Message::User(user) = message else {
            continue;
        };
        let parts = match &user.content {
            Content::Text(content) => {
                blocks.push(text(content));
                continue;
            }
            Content::Parts(parts) => parts,
        };
        // Once a part is refused nothing is sent: the rest are only checked.
        if let Some(refused) = &mut refused {
            if parts
                .iter()
                .any(|part| parts::check(part, Some(capabilities)).is_err())
            {
                refused.messages.push(user.id.clone());
            }
            continue;
        }
        let mapped: Result<Vec<ContentBlock>, (usize, Refusal)> = parts
            .iter()
            .enumerate()
            .map(|(i, part)| parts::block(part, &user.id, i, capabilities).map_err(|r| (i, r)))
            .collect();
        match mapped {
            Ok(mapped) => blocks.extend(mapped),
            Err((part, refusal)) => {
                refused = Some(Refused {
                    message_id: user.id.clone(),
                    part,
                    refusal,
                    messages: vec![user.id.clone()],
                });
            }
        }
    }
    match refused {
        Some(refused) => Err(refused),
        None => Ok(blocks),
    }
}

/// Checks the parts of a run request's new messages (`new`: each with its index in the
/// request's `messages`) before any stream starts: a part no agent can take, or one an
/// agent with `capabilities` (when known) cannot, is an error naming it.
pub(super) fn check_parts(
    new: &[(usize, &Message)],
    capabilities: Option<&PromptCapabilities>,
    agent: &str,
) -> Result<(), InputError> {
    for (i, message) in new {
        let Message::User(UserMessage {
            content: Content::Parts(parts),
            ..
        }) = message
        else {
            continue;
        };
        for (j, part) in parts.iter().enumerate() {
            if let Err(refusal) = parts::check(part, capabilities) {
                let field = format!("messages[{i}].content[{j}]");
                return Err(InputError {
                    message: invalid(&field, &refusal, agent),
                    field: Some(field),
                });
            }
        }
    }
    Ok(())
}

/// The message of a refused part at `field`.
fn invalid(field: &str, refusal: &Refusal, agent: &str) -> String {
    format!(
        "invalid RunAgentInput at `{field}`: {}",
        refusal.reason(agent)
    )
}

/// A text block.
fn text(text: &str) -> ContentBlock {
    ContentBlock::Text(TextContent::new(text))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::protocol::input::Context;

    fn turn(context: Vec<Context>) -> Turn {
        Turn {
            thread_id: "t".to_owned(),
            run_id: "r".to_owned(),
            messages: Vec::new(),
            new_messages: Vec::new(),
            tools: Vec::new(),
            context,
            client_state: None,
            forwarded_props: None,
            session_id: None,
            document: Value::Null,
            tool_call_ids: HashSet::new(),
            cancel: CancellationToken::new(),
        }
    }

    fn user(id: &str, content: Value) -> Message {
        serde_json::from_value(json!({"id": id, "role": "user", "content": content}))
            .expect("a user message")
    }

    fn image() -> Value {
        json!({"type": "image", "source": {"type": "data", "value": "iVBO", "mimeType": "image/png"}})
    }

    fn audio() -> Value {
        json!({"type": "audio", "source": {"type": "data", "value": "UklGRg==", "mimeType": "audio/wav"}})
    }

    fn pdf() -> Value {
        json!({"type": "document", "source": {"type": "data", "value": "JVBERi0x",
            "mimeType": "application/pdf"}})
    }

    fn json_of(blocks: &[ContentBlock]) -> Value {
        serde_json::to_value(blocks).expect("serializes")
    }

    #[test]
    fn an_image_only_message_to_an_agent_without_images_is_refused_not_an_empty_prompt() {
        let input = [user("u1", json!([image()]))];
        let refused = prompt_blocks(&turn(Vec::new()), &input, &PromptCapabilities::new())
            .expect_err("refused");
        assert_eq!((refused.message_id.as_str(), refused.part), ("u1", 0));
        assert!(
            refused
                .refusal
                .reason("a")
                .contains("does not accept images")
        );
    }

    #[test]
    fn context_comes_first_then_every_part_in_order() {
        let context = vec![Context {
            description: "page".to_owned(),
            value: "home".to_owned(),
        }];
        let input = [
            user("u1", json!("hello")),
            user(
                "u2",
                json!([{"type": "text", "text": "listen"}, audio(), pdf(), image()]),
            ),
        ];
        let everything = PromptCapabilities::new()
            .image(true)
            .audio(true)
            .embedded_context(true);
        let blocks = prompt_blocks(&turn(context), &input, &everything).expect("prompted");
        assert_eq!(
            json_of(&blocks),
            json!([
                {"type": "text", "text": "Context:\n- page: home"},
                {"type": "text", "text": "hello"},
                {"type": "text", "text": "listen"},
                {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"blob": "JVBERi0x",
                    "mimeType": "application/pdf", "uri": "agui:message/u2/content/2"}},
                {"type": "image", "data": "iVBO", "mimeType": "image/png"},
            ])
        );
    }

    #[test]
    fn every_message_with_a_refused_part_is_named_and_none_goes_in_part() {
        let input = [
            user("u1", json!("fine")),
            user(
                "u2",
                json!([{"type": "text", "text": "hear this"}, audio()]),
            ),
            user("u3", json!([pdf()])),
            user("u4", json!([image()])),
        ];
        let images = PromptCapabilities::new().image(true);
        let refused = prompt_blocks(&turn(Vec::new()), &input, &images).expect_err("refused");
        assert_eq!((refused.message_id.as_str(), refused.part), ("u2", 1));
        assert_eq!(refused.messages, ["u2", "u3"]);
    }

    #[test]
    fn new_parts_are_checked_by_their_place_in_the_request() {
        let assistant: Message =
            serde_json::from_value(json!({"id": "a", "role": "assistant", "content": "hi"}))
                .expect("assistant");
        let first = user("u1", json!("text only"));
        let second = user("u2", json!([{"type": "text", "text": "see"}, image()]));
        let new = [(2, &assistant), (3, &first), (4, &second)];
        let error =
            check_parts(&new, Some(&PromptCapabilities::new()), "coder").expect_err("refused");
        assert_eq!(error.field.as_deref(), Some("messages[4].content[1]"));
        assert_eq!(
            error.message,
            "invalid RunAgentInput at `messages[4].content[1]`: an image part (image/png): \
             agent \"coder\" does not accept images (its ACP promptCapabilities.image is \
             false); send it as a URL, which goes as a link, or leave it out"
        );
        // With the capabilities unknown, only what no agent takes is refused here.
        assert_eq!(check_parts(&new, None, "coder"), Ok(()));
        let file = user(
            "u3",
            json!([{"type": "video", "source": {"type": "file", "value": "f1"}}]),
        );
        let error = check_parts(&[(0, &file)], None, "coder").expect_err("refused");
        assert_eq!(error.field.as_deref(), Some("messages[0].content[0]"));
    }
}
