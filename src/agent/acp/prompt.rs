//! What a turn prompts: the thread's undelivered input and the turn's new messages (or,
//! on a thread that never had a session, the client's transcript), as ACP content blocks
//! after the turn's context; and the input kept when it never reached the agent.

use agent_client_protocol::v1::schema::{ContentBlock, ImageContent, TextContent};

use super::Inner;
use super::process::AcpProcess;
use crate::agent::Turn;
use crate::protocol::input::{BinaryPart, Content, ContentPart, DataSource, MediaSource, Message};
use crate::sync::lock;

impl Inner {
    /// What this turn prompts: the thread's undelivered input, then the turn's new
    /// messages (each once). On a thread that never had a session, nothing was delivered:
    /// every user message of the client's transcript.
    pub(super) fn input_for(&self, turn: &Turn) -> Vec<Message> {
        let mut input = lock(&self.undelivered)
            .remove(&turn.thread_id)
            .unwrap_or_default();
        let sessionless =
            turn.session_id.is_none() && !lock(&self.sessions).contains_key(&turn.thread_id);
        let earlier = turn
            .messages
            .iter()
            .filter(|m| sessionless && matches!(m, Message::User(_)));
        for message in earlier.chain(&turn.new_messages) {
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
            lock(&self.undelivered).insert(thread_id.to_owned(), input);
        }
    }
}

/// The prompt for a turn: context first, then the user messages of `input` (text; images
/// when the agent accepts them).
pub(super) fn prompt_blocks(
    turn: &Turn,
    input: &[Message],
    process: &AcpProcess,
) -> Vec<ContentBlock> {
    let mut blocks = Vec::new();
    if !turn.context.is_empty() {
        let lines: Vec<String> = turn
            .context
            .iter()
            .map(|c| format!("- {}: {}", c.description, c.value))
            .collect();
        blocks.push(text(&format!("Context:\n{}", lines.join("\n"))));
    }
    let images = process.capabilities().prompt_capabilities.image;
    for message in input {
        let Message::User(user) = message else {
            continue;
        };
        match &user.content {
            Content::Text(content) => blocks.push(text(content)),
            Content::Parts(parts) => blocks.extend(parts.iter().filter_map(|p| part(p, images))),
        }
    }
    blocks
}

/// The block of one part of a user message: its text, or its image when the agent
/// accepts `images` (`None`: the part is not sent).
fn part(part: &ContentPart, images: bool) -> Option<ContentBlock> {
    match part {
        ContentPart::Text(part) => Some(text(&part.text)),
        ContentPart::Image(media) if images => match &media.source {
            MediaSource::Data(DataSource { value, mime_type }) => Some(image(value, mime_type)),
            _ => None,
        },
        ContentPart::Binary(BinaryPart {
            mime_type,
            data: Some(data),
            ..
        }) if images && mime_type.starts_with("image/") => Some(image(data, mime_type)),
        _ => None,
    }
}

/// A text block.
fn text(text: &str) -> ContentBlock {
    ContentBlock::Text(TextContent::new(text))
}

/// An image block of base64 `data`.
fn image(data: &str, mime_type: &str) -> ContentBlock {
    ContentBlock::Image(ImageContent::new(data, mime_type))
}
