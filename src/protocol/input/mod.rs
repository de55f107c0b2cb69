//! `RunAgentInput`, the body of `POST {path}/{agent}`, with every message role and content
//! part, decoded with errors that name the offending field (`messages[2].role`).
//!
//! Unknown fields are tolerated, as the protocol asks. Messages serialize back to the AG-UI
//! `Message` shape (for transcripts and `MESSAGES_SNAPSHOT`).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::decode;
pub use super::decode::InputError;

/// The decoded body of a run request (serialized back as it reads: a queued run's input is
/// stored so).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    pub thread_id: String,
    pub run_id: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// `null` is the same as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<Tool>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub context: Vec<Context>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_props: Option<Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resume: Vec<Resume>,
    /// Sent by 1.0 clients as `"1.0"`; absent from pre-1.0 clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
}

/// A frontend tool the client offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// A piece of application context the client shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub description: String,
    pub value: String,
}

/// The answer to one interrupt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resume {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// An AG-UI message, by `role`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    Developer(TextMessage),
    System(TextMessage),
    Assistant(AssistantMessage),
    User(UserMessage),
    Tool(ToolMessage),
    Activity(ActivityMessage),
    Reasoning(TextMessage),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextMessage {
    pub id: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    pub id: String,
    pub content: Content,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolMessage {
    pub id: String,
    pub content: Content,
    pub tool_call_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityMessage {
    pub id: String,
    pub activity_type: String,
    pub content: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionCall,
}

/// The constant `type:"function"` of a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// Message content: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of multimodal content.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentPart {
    Text(TextPart),
    Image(MediaPart),
    Audio(MediaPart),
    Video(MediaPart),
    Document(MediaPart),
    /// The pre-1.0 part (`@ag-ui/client` 0.0.59).
    Binary(BinaryPart),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextPart {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaPart {
    pub source: MediaSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BinaryPart {
    pub mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

/// Where a media part's bytes are.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum MediaSource {
    Data(DataSource),
    Url(LinkedSource),
    File(LinkedSource),
}

/// Inline base64 data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataSource {
    pub value: String,
    pub mime_type: String,
}

/// A URL or a file id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkedSource {
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

// The enums choose their variant themselves so that an error inside one names its whole
// path (serde's own tagged and untagged enums lose it): see `decode.rs`.

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (role, rest) = decode::tagged(deserializer, "role")?;
        Ok(match role.as_str() {
            "developer" => Message::Developer(decode::nested(rest)?),
            "system" => Message::System(decode::nested(rest)?),
            "assistant" => Message::Assistant(decode::nested(rest)?),
            "user" => Message::User(decode::nested(rest)?),
            "tool" => Message::Tool(decode::nested(rest)?),
            "activity" => Message::Activity(decode::nested(rest)?),
            "reasoning" => Message::Reasoning(decode::nested(rest)?),
            other => {
                return Err(decode::unknown(
                    "role",
                    other,
                    &[
                        "developer",
                        "system",
                        "assistant",
                        "user",
                        "tool",
                        "activity",
                        "reasoning",
                    ],
                ));
            }
        })
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Content::Text(text)),
            parts @ Value::Array(_) => Ok(Content::Parts(decode::nested(parts)?)),
            other => Err(serde::de::Error::custom(format!(
                "expected a string or an array of content parts, found {}",
                decode::kind(&other)
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (kind, rest) = decode::tagged(deserializer, "type")?;
        Ok(match kind.as_str() {
            "text" => ContentPart::Text(decode::nested(rest)?),
            "image" => ContentPart::Image(decode::nested(rest)?),
            "audio" => ContentPart::Audio(decode::nested(rest)?),
            "video" => ContentPart::Video(decode::nested(rest)?),
            "document" => ContentPart::Document(decode::nested(rest)?),
            "binary" => ContentPart::Binary(decode::nested(rest)?),
            other => {
                return Err(decode::unknown(
                    "type",
                    other,
                    &["text", "image", "audio", "video", "document", "binary"],
                ));
            }
        })
    }
}

impl<'de> Deserialize<'de> for MediaSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (kind, rest) = decode::tagged(deserializer, "type")?;
        Ok(match kind.as_str() {
            "data" => MediaSource::Data(decode::nested(rest)?),
            "url" => MediaSource::Url(decode::nested(rest)?),
            "file" => MediaSource::File(decode::nested(rest)?),
            other => return Err(decode::unknown("type", other, &["data", "url", "file"])),
        })
    }
}

/// Decodes a request body, naming the offending field on failure.
pub fn decode_run_input(body: &[u8]) -> Result<RunAgentInput, InputError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let input: RunAgentInput = serde_path_to_error::deserialize(&mut de)
        .map_err(|error| InputError::from_json("RunAgentInput", error))?;
    de.end().map_err(|_| InputError {
        field: None,
        message: "invalid RunAgentInput: trailing characters after the JSON body".to_owned(),
    })?;
    input.validate()?;
    Ok(input)
}

/// Longest id accepted (thread, run, message, tool call, interrupt), in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 256;

/// Checks an id a client chose: at most [`MAX_ID_BYTES`], no control characters (C0, DEL,
/// C1), so that it can be logged, stored and paged through as it is.
pub fn check_id(id: &str, field: &str) -> Result<(), InputError> {
    let problem = if id.len() > MAX_ID_BYTES {
        format!("must be at most {MAX_ID_BYTES} bytes")
    } else if id.chars().any(char::is_control) {
        "must not contain control characters".to_owned()
    } else {
        return Ok(());
    };
    Err(InputError {
        field: Some(field.to_owned()),
        message: format!("invalid id at `{field}`: {problem}"),
    })
}

impl RunAgentInput {
    fn validate(&self) -> Result<(), InputError> {
        let empty = |field: &str| InputError {
            field: Some(field.to_owned()),
            message: format!("invalid RunAgentInput at `{field}`: must not be empty"),
        };
        if self.thread_id.is_empty() {
            return Err(empty("threadId"));
        }
        if self.run_id.is_empty() {
            return Err(empty("runId"));
        }
        check_id(&self.thread_id, "threadId")?;
        check_id(&self.run_id, "runId")?;
        if let Some(parent) = &self.parent_run_id {
            check_id(parent, "parentRunId")?;
        }
        for (i, message) in self.messages.iter().enumerate() {
            check_id(message.id(), &format!("messages[{i}].id"))?;
            match message {
                Message::Assistant(m) => {
                    for (j, call) in m.tool_calls.iter().enumerate() {
                        check_id(&call.id, &format!("messages[{i}].toolCalls[{j}].id"))?;
                    }
                }
                Message::Tool(m) => {
                    check_id(&m.tool_call_id, &format!("messages[{i}].toolCallId"))?
                }
                _ => {}
            }
        }
        for (i, tool) in self.tools.iter().enumerate() {
            if tool.name.is_empty() {
                return Err(empty(&format!("tools[{i}].name")));
            }
            check_id(&tool.name, &format!("tools[{i}].name"))?;
        }
        for (i, resume) in self.resume.iter().enumerate() {
            check_id(&resume.interrupt_id, &format!("resume[{i}].interruptId"))?;
        }
        Ok(())
    }
}

impl Message {
    /// The message id.
    pub fn id(&self) -> &str {
        match self {
            Message::Developer(m) | Message::System(m) | Message::Reasoning(m) => &m.id,
            Message::Assistant(m) => &m.id,
            Message::User(m) => &m.id,
            Message::Tool(m) => &m.id,
            Message::Activity(m) => &m.id,
        }
    }
}

impl Message {
    /// The wire name of this message's role.
    pub fn role(&self) -> &'static str {
        match self {
            Message::Developer(_) => "developer",
            Message::System(_) => "system",
            Message::Assistant(_) => "assistant",
            Message::User(_) => "user",
            Message::Tool(_) => "tool",
            Message::Activity(_) => "activity",
            Message::Reasoning(_) => "reasoning",
        }
    }
}

impl Content {
    /// The text of this content: the string itself, or its text parts joined by newlines.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text(part) => Some(part.text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests;
