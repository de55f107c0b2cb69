//! `RunAgentInput`, the body of `POST {path}/{agent}`, with every message role and content
//! part, decoded with errors that name the offending field (`messages[2].role`).
//!
//! Unknown fields are tolerated, as the protocol asks. Messages serialize back to the AG-UI
//! `Message` shape (for transcripts and `MESSAGES_SNAPSHOT`).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::decode;
pub use super::decode::InputError;

/// The decoded body of a run request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    pub thread_id: String,
    pub run_id: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub parent_run_id: Option<String>,
    /// `null` is the same as absent.
    #[serde(default)]
    pub state: Option<Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<Tool>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub context: Vec<Context>,
    #[serde(default)]
    pub forwarded_props: Option<Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resume: Vec<Resume>,
    /// Sent by 1.0 clients as `"1.0"`; absent from pre-1.0 clients.
    #[serde(default)]
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
mod tests {
    use super::*;

    fn err(body: &str) -> InputError {
        match decode_run_input(body.as_bytes()) {
            Ok(input) => panic!("expected an error, got {input:?}"),
            Err(err) => err,
        }
    }

    #[test]
    fn minimal_input_decodes() {
        let input =
            decode_run_input(br#"{"threadId":"t","runId":"r","messages":[]}"#).expect("valid");
        assert_eq!(input.thread_id, "t");
        assert!(input.protocol_version.is_none());
        assert!(input.tools.is_empty());
    }

    #[test]
    fn nulls_are_absent() {
        let input = decode_run_input(
            br#"{"threadId":"t","runId":"r","messages":[],"state":null,"tools":null,"context":null,"resume":null,"forwardedProps":null}"#,
        )
        .expect("valid");
        assert!(input.state.is_none());
    }

    #[test]
    fn missing_top_level_field_is_named() {
        let e = err(r#"{"threadId":"t","messages":[]}"#);
        assert_eq!(e.field.as_deref(), Some("runId"));
        assert!(e.message.contains("runId"), "{}", e.message);
    }

    #[test]
    fn bad_message_role_is_named_with_its_index() {
        let e = err(
            r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":"x"},{"id":"2","role":"wizard","content":"x"}]}"#,
        );
        assert_eq!(
            e.field.as_deref(),
            Some("messages[1].role"),
            "{}",
            e.message
        );
        assert!(e.message.contains("wizard"), "{}", e.message);
    }

    #[test]
    fn missing_nested_field_is_named() {
        let e = err(
            r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"tool","content":"x"}]}"#,
        );
        assert_eq!(
            e.field.as_deref(),
            Some("messages[0].toolCallId"),
            "{}",
            e.message
        );
    }

    #[test]
    fn every_role_and_part_decodes_and_round_trips() {
        let body = r#"{"threadId":"t","runId":"r","protocolVersion":"1.0","messages":[
            {"id":"d","role":"developer","content":"dev"},
            {"id":"s","role":"system","content":"sys"},
            {"id":"u","role":"user","content":[
                {"type":"text","text":"hi"},
                {"type":"image","source":{"type":"data","value":"AAAA","mimeType":"image/png"}},
                {"type":"audio","source":{"type":"url","value":"https://x/a.mp3"}},
                {"type":"video","source":{"type":"file","value":"f1"}},
                {"type":"document","source":{"type":"url","value":"https://x/d.pdf","mimeType":"application/pdf"}},
                {"type":"binary","mimeType":"image/png","data":"AAAA"}
            ]},
            {"id":"a","role":"assistant","toolCalls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"id":"tm","role":"tool","content":"ok","toolCallId":"c1"},
            {"id":"ac","role":"activity","activityType":"progress","content":{"p":1}},
            {"id":"re","role":"reasoning","content":"hmm"}
        ],"tools":[{"name":"f","description":"d","parameters":{"type":"object"}}],
        "context":[{"description":"c","value":"v"}],
        "resume":[{"interruptId":"i","status":"resolved","payload":{"ok":true}}],
        "unknownField":1}"#;
        let input = decode_run_input(body.as_bytes()).expect("valid");
        assert_eq!(input.messages.len(), 7);
        let round = serde_json::to_value(&input.messages).expect("serializes");
        let original: Value = serde_json::from_str(body).expect("json");
        assert_eq!(round, original["messages"]);
    }

    #[test]
    fn empty_thread_id_is_rejected() {
        let e = err(r#"{"threadId":"","runId":"r","messages":[]}"#);
        assert_eq!(e.field.as_deref(), Some("threadId"));
    }

    #[test]
    fn ids_with_control_characters_or_over_the_limit_are_refused_naming_the_field() {
        let long = "é".repeat(MAX_ID_BYTES / 2 + 1);
        let at_limit = "é".repeat(MAX_ID_BYTES / 2);
        for (body, field) in [
            (r#"{"threadId":"t\r\nforged","runId":"r","messages":[]}"#.to_owned(), "threadId"),
            (r#"{"threadId":"t","runId":"r\u001b[31m","messages":[]}"#.to_owned(), "runId"),
            (r#"{"threadId":"t","runId":"r","parentRunId":"p\u007f","messages":[]}"#.to_owned(), "parentRunId"),
            (format!(r#"{{"threadId":"{long}","runId":"r","messages":[]}}"#), "threadId"),
            (r#"{"threadId":"t","runId":"r","messages":[{"id":"m\u0000","role":"user","content":"x"}]}"#.to_owned(), "messages[0].id"),
            (r#"{"threadId":"t","runId":"r","messages":[{"id":"a","role":"assistant","toolCalls":[{"id":"c\n","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#.to_owned(), "messages[0].toolCalls[0].id"),
            (r#"{"threadId":"t","runId":"r","messages":[{"id":"x","role":"tool","content":"ok","toolCallId":"c\u0085"}]}"#.to_owned(), "messages[0].toolCallId"),
            (r#"{"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"i\t","status":"cancelled"}]}"#.to_owned(), "resume[0].interruptId"),
        ] {
            let e = err(&body);
            assert_eq!(e.field.as_deref(), Some(field), "{body}: {}", e.message);
            assert!(e.message.contains(field), "{}", e.message);
        }
        let ok = format!(r#"{{"threadId":"{at_limit}","runId":"r","messages":[]}}"#);
        assert!(decode_run_input(ok.as_bytes()).is_ok());
    }

    #[test]
    fn errors_name_the_whole_path_in_plain_words() {
        let base =
            |messages: &str| format!(r#"{{"threadId":"t","runId":"r","messages":[{messages}]}}"#);
        for (body, field, says) in [
            (
                base(r#"{"id":"1","role":"user","content":5}"#),
                Some("messages[0].content"),
                "expected a string or an array of content parts, found a number",
            ),
            (
                base(
                    r#"{"id":"1","role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"data","value":1,"mimeType":"image/png"}}]}"#,
                ),
                Some("messages[0].content[1].source.value"),
                "expected a string, found the number 1",
            ),
            (
                base(
                    r#"{"id":"1","role":"user","content":[{"type":"image","source":{"type":"data","value":"AA"}}]}"#,
                ),
                Some("messages[0].content[0].source.mimeType"),
                "is required",
            ),
            (
                base(r#"{"id":"1","role":"user","content":[{"type":"gif"}]}"#),
                Some("messages[0].content[0].type"),
                "unknown value \"gif\"",
            ),
            (
                base(
                    r#"{"id":"1","role":"assistant","toolCalls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}"#,
                ),
                Some("messages[0].toolCalls[0].function.arguments"),
                "expected a string, found an object",
            ),
            (
                base(r#"{"id":"1","content":"x"}"#),
                Some("messages[0].role"),
                "is required",
            ),
            (
                base(r#"{"id":1,"role":"user","content":"x"}"#),
                Some("messages[0].id"),
                "expected a string, found the number 1",
            ),
            (
                r#"{"threadId":5,"runId":"r","messages":[]}"#.to_owned(),
                Some("threadId"),
                "expected a string, found the number 5",
            ),
            (
                r#"{"threadId":"t","runId":"r","messages":{}}"#.to_owned(),
                Some("messages"),
                "expected an array, found an object",
            ),
            (
                r#"{"threadId":"t","runId":"r","messages":[{"id":"1","role":"user","content":"x""#
                    .to_owned(),
                None,
                "ends before its JSON is complete",
            ),
            (
                "not json".to_owned(),
                None,
                "not valid JSON (line 1, column 2)",
            ),
        ] {
            let e = err(&body);
            assert_eq!(e.field.as_deref(), field, "{body}: {}", e.message);
            assert!(e.message.contains(says), "{body}: {}", e.message);
            for internal in ["untagged", "EOF", "ident", "`?`", "\u{1}", "variant"] {
                assert!(!e.message.contains(internal), "{body}: {}", e.message);
            }
        }
    }

    #[test]
    fn not_json_is_rejected_without_a_field() {
        let e = err("nope");
        assert_eq!(e.field, None);
    }
}
