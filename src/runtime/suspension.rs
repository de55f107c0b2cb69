//! A run waiting on the client: frontend tool calls, permission requests (as the
//! `agui_permission_request` frontend tool, or as AG-UI 1.0 interrupts), forms to fill in
//! (as the `agui_input_request` frontend tool, or as interrupts whose `responseSchema` is
//! the form), and how a later request's tool messages or `resume[]` answer them.
//!
//! Every wait fails closed: a timeout, a cancel, a shutdown or new user input instead of the
//! answer resolve it as an error (tool), a denial (permission) or a cancelled form.

use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::agent::{
    InputAnswer, InputRequest, PermissionOption, PermissionOutcome, PermissionRequest, ToolAnswer,
};
use crate::protocol::Event;
use crate::protocol::input::{Content, Message, Resume, ResumeStatus};

/// The frontend tool through which permission requests reach the client.
pub const PERMISSION_TOOL: &str = "agui_permission_request";
/// The `RUN_ERROR` code of an answer to a wait that no longer exists.
pub(super) const SUSPENSION_LOST: &str = "SUSPENSION_LOST";
/// The frontend tool through which forms (ACP elicitations) reach the client.
pub const INPUT_TOOL: &str = "agui_input_request";

/// How a suspension is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Trailing `tool` messages answering the pending tool call ids.
    ToolMessages,
    /// `RunAgentInput.resume[]` answering every open interrupt.
    Interrupts,
}

/// One thing the run waits for.
#[derive(Debug)]
pub enum Wait {
    Tool {
        tool_call_id: String,
        reply: oneshot::Sender<ToolAnswer>,
    },
    Permission {
        /// The id the client answers: the `agui_permission_request` call, or (interrupt
        /// mode) the interrupt id.
        answer_id: String,
        options: Vec<PermissionOption>,
        /// The daemon's own question whether to extend a budget reached (never an
        /// agent's: an agent may name its options anything).
        budget: bool,
        reply: oneshot::Sender<PermissionOutcome>,
    },
    Input {
        /// The `agui_input_request` call, or (interrupt mode) the interrupt id.
        answer_id: String,
        /// The form's JSON Schema; an answer must fit it.
        schema: Value,
        reply: oneshot::Sender<InputAnswer>,
    },
}

impl Wait {
    pub fn answer_id(&self) -> &str {
        match self {
            Wait::Tool { tool_call_id, .. } => tool_call_id,
            Wait::Permission { answer_id, .. } => answer_id,
            Wait::Input { answer_id, .. } => answer_id,
        }
    }

    /// Resolves the wait as failed closed.
    pub fn fail_closed(self, why: &str) {
        match self {
            Wait::Tool { reply, .. } => {
                let _ = reply.send(ToolAnswer::Error(why.to_owned()));
            }
            Wait::Permission { reply, .. } => {
                let _ = reply.send(PermissionOutcome::Denied {
                    reason: why.to_owned(),
                });
            }
            Wait::Input { reply, .. } => {
                let _ = reply.send(InputAnswer::Cancelled {
                    reason: why.to_owned(),
                });
            }
        }
    }
}

/// A parked run's open waits.
#[derive(Debug)]
pub struct Suspension {
    pub channel: Channel,
    pub waits: Vec<Wait>,
    /// The AG-UI run id of the segment that ended with the suspension.
    pub segment_run_id: String,
    /// That segment's terminal event (pending tool calls or interrupts), once written: a
    /// stream that attaches with no cursor gets the suspension point again from it.
    pub terminal: Option<Event>,
}

/// An answer matched to a wait.
#[derive(Debug)]
pub enum Answer {
    Tool(ToolAnswer),
    Permission(PermissionOutcome),
    Input(InputAnswer),
}

impl Suspension {
    /// The ids the client must answer.
    pub fn ids(&self) -> Vec<String> {
        self.waits
            .iter()
            .map(|w| w.answer_id().to_owned())
            .collect()
    }

    /// The client tool calls (frontend tools, permission requests as a tool) that
    /// `new_messages` leave unanswered; interrupts have no tool call to answer.
    pub fn unanswered_calls(&self, new_messages: &[Message]) -> Vec<String> {
        if self.channel != Channel::ToolMessages {
            return Vec::new();
        }
        self.waits
            .iter()
            .map(Wait::answer_id)
            .filter(|id| {
                !new_messages
                    .iter()
                    .any(|m| matches!(m, Message::Tool(tool) if tool.tool_call_id == *id))
            })
            .map(str::to_owned)
            .collect()
    }

    /// Whether `messages` (the new ones of a request) answer at least one wait.
    pub fn answered_by_messages(&self, new_messages: &[Message]) -> bool {
        self.channel == Channel::ToolMessages
            && new_messages.iter().any(|m| match m {
                Message::Tool(tool) => self
                    .waits
                    .iter()
                    .any(|w| w.answer_id() == tool.tool_call_id),
                _ => false,
            })
    }

    /// Whether `new_messages` hold a tool message that is not one answer to one of this
    /// suspension's waits: a tool message for a call nothing here waits on (answered
    /// before, or never the client's), or a second answer to the same call. Such a message
    /// is new input to the thread, not an answer.
    pub fn has_stray_tool_messages(&self, new_messages: &[Message]) -> bool {
        let mut answered: Vec<&str> = Vec::new();
        for message in new_messages {
            let Message::Tool(tool) = message else {
                continue;
            };
            let id = tool.tool_call_id.as_str();
            let waited = self.channel == Channel::ToolMessages
                && self.waits.iter().any(|w| w.answer_id() == id);
            if !waited || answered.contains(&id) {
                return true;
            }
            answered.push(id);
        }
        false
    }

    /// Checks a `resume[]` against the open interrupts: every one answered, none unknown,
    /// every payload usable. The error is the message of the `RUN_ERROR`.
    pub fn check_resume(&self, resume: &[Resume]) -> Result<(), String> {
        if self.channel != Channel::Interrupts {
            return Err("this run is not waiting on an interrupt".to_owned());
        }
        for entry in resume {
            if !self
                .waits
                .iter()
                .any(|w| w.answer_id() == entry.interrupt_id)
            {
                return Err(format!("unknown interrupt {:?}", entry.interrupt_id));
            }
        }
        for wait in &self.waits {
            let Some(entry) = resume.iter().find(|e| e.interrupt_id == wait.answer_id()) else {
                return Err(format!(
                    "interrupt {:?} was not answered; every open interrupt must be",
                    wait.answer_id()
                ));
            };
            if let (Wait::Input { schema, .. }, ResumeStatus::Resolved) = (wait, entry.status) {
                let payload = entry.payload.as_ref().unwrap_or(&Value::Null);
                if let Err(why) = check_form(schema, payload) {
                    return Err(format!(
                        "resume for {:?} does not fit its responseSchema: {why}",
                        entry.interrupt_id
                    ));
                }
            }
            if let (Wait::Permission { options, .. }, ResumeStatus::Resolved) = (wait, entry.status)
            {
                let chosen = entry
                    .payload
                    .as_ref()
                    .and_then(|p| p.get("optionId"))
                    .and_then(Value::as_str);
                match chosen {
                    Some(id) if options.iter().any(|o| o.option_id == id || o.kind == id) => {}
                    Some(id) => return Err(format!("unknown optionId {id:?}")),
                    None => {
                        return Err(format!(
                            "resume for {:?} needs payload {{\"optionId\": ...}}",
                            entry.interrupt_id
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Resolves every wait: answered ones with their answer, the rest failed closed.
    pub fn resolve(self, new_messages: &[Message], resume: &[Resume]) {
        for wait in self.waits {
            match answer_for(&wait, new_messages, resume) {
                Some(Answer::Tool(answer)) => {
                    if let Wait::Tool { reply, .. } = wait {
                        let _ = reply.send(answer);
                    }
                }
                Some(Answer::Permission(outcome)) => {
                    if let Wait::Permission { reply, .. } = wait {
                        let _ = reply.send(outcome);
                    }
                }
                Some(Answer::Input(answer)) => {
                    if let Wait::Input { reply, .. } = wait {
                        let _ = reply.send(answer);
                    }
                }
                None => wait.fail_closed("no answer was given"),
            }
        }
    }

    /// Fails every wait closed.
    pub fn fail_closed(self, why: &str) {
        for wait in self.waits {
            wait.fail_closed(why);
        }
    }
}

/// The answer `new_messages` or `resume` give `wait`, if any: a `resume[]` entry for it
/// first, else the last tool message that answers it.
fn answer_for(wait: &Wait, new_messages: &[Message], resume: &[Resume]) -> Option<Answer> {
    if let Some(entry) = resume.iter().find(|e| e.interrupt_id == wait.answer_id()) {
        return Some(resumed(wait, entry));
    }
    let tool = new_messages.iter().rev().find_map(|m| match m {
        Message::Tool(tool) if tool.tool_call_id == wait.answer_id() => Some(tool),
        _ => None,
    })?;
    let text = match &tool.content {
        Content::Text(text) => text.clone(),
        parts @ Content::Parts(_) => parts.text(),
    };
    Some(match wait {
        Wait::Input { schema, .. } => Answer::Input(input_answer(schema, &text)),
        Wait::Tool { .. } => match &tool.error {
            Some(error) => Answer::Tool(ToolAnswer::Error(error.clone())),
            None => Answer::Tool(ToolAnswer::Result(text)),
        },
        Wait::Permission { options, .. } => {
            let chosen = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("optionId").and_then(Value::as_str).map(str::to_owned));
            // An option is named by its id, or by its kind (`allow_once`, ...).
            let option = chosen.and_then(|chosen| {
                options
                    .iter()
                    .find(|o| o.option_id == chosen)
                    .or_else(|| options.iter().find(|o| o.kind == chosen))
            });
            match option {
                Some(option) => Answer::Permission(PermissionOutcome::Selected {
                    option_id: option.option_id.clone(),
                }),
                None => Answer::Permission(PermissionOutcome::Denied {
                    reason: "the answer did not name one of the offered options".to_owned(),
                }),
            }
        }
    })
}

/// What a `resume[]` entry answers `wait`.
fn resumed(wait: &Wait, entry: &Resume) -> Answer {
    match (wait, entry.status) {
        (Wait::Permission { options, .. }, ResumeStatus::Resolved) => {
            let chosen = entry
                .payload
                .as_ref()
                .and_then(|p| p.get("optionId"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let option_id = options
                .iter()
                .find(|o| o.option_id == chosen)
                .or_else(|| options.iter().find(|o| o.kind == chosen))
                .map_or_else(|| chosen.to_owned(), |o| o.option_id.clone());
            Answer::Permission(PermissionOutcome::Selected { option_id })
        }
        (Wait::Permission { .. }, ResumeStatus::Cancelled) => {
            Answer::Permission(PermissionOutcome::Denied {
                reason: "cancelled by the user".to_owned(),
            })
        }
        (Wait::Tool { .. }, ResumeStatus::Resolved) => Answer::Tool(ToolAnswer::Result(
            entry
                .payload
                .as_ref()
                .map(|p| match p {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_default(),
        )),
        (Wait::Tool { .. }, ResumeStatus::Cancelled) => {
            Answer::Tool(ToolAnswer::Error("cancelled by the user".to_owned()))
        }
        (Wait::Input { schema, .. }, ResumeStatus::Resolved) => {
            let payload = entry.payload.as_ref().unwrap_or(&Value::Null);
            Answer::Input(match check_form(schema, payload) {
                Ok(values) => InputAnswer::Accepted(values),
                Err(why) => InputAnswer::Cancelled { reason: why },
            })
        }
        // The person dismissed the form: a refusal, not a failure.
        (Wait::Input { .. }, ResumeStatus::Cancelled) => Answer::Input(InputAnswer::Declined),
    }
}

/// The `agui_permission_request` arguments for a permission request:
/// `{"title","options","toolCallId"?,"toolCall"?}` (`toolCall`: what the call is about,
/// see [`PermissionRequest::tool_call`]).
pub fn permission_arguments(request: &PermissionRequest) -> String {
    let mut args = json!({"title": request.title, "options": request.options});
    if let Some(id) = &request.tool_call_id {
        args["toolCallId"] = json!(id);
    }
    if let Some(about) = &request.tool_call {
        args["toolCall"] = about.clone();
    }
    args.to_string()
}

/// The `agui_input_request` arguments for a form: `{"message","schema","toolCallId"?}`.
pub fn input_arguments(request: &InputRequest) -> String {
    let mut args = json!({"message": request.message, "schema": request.schema});
    if let Some(id) = &request.tool_call_id {
        args["toolCallId"] = json!(id);
    }
    args.to_string()
}

/// The answer an `agui_input_request` tool message gives: JSON
/// `{"action":"accept","content":{...}}` (the values, which must fit the form),
/// `{"action":"decline"}` or `{"action":"cancel"}`; anything else fails closed.
fn input_answer(schema: &Value, text: &str) -> InputAnswer {
    let Ok(answer) = serde_json::from_str::<Value>(text) else {
        return InputAnswer::Cancelled {
            reason: "the answer is not JSON".to_owned(),
        };
    };
    match answer["action"].as_str() {
        Some("accept") => match check_form(schema, &answer["content"]) {
            Ok(values) => InputAnswer::Accepted(values),
            Err(why) => InputAnswer::Cancelled { reason: why },
        },
        Some("decline") => InputAnswer::Declined,
        Some("cancel") => InputAnswer::Cancelled {
            reason: "cancelled by the user".to_owned(),
        },
        _ => InputAnswer::Cancelled {
            reason: "the answer names no action (accept, decline or cancel)".to_owned(),
        },
    }
}

/// Checks form values against the form's schema (the ACP elicitation subset: an object of
/// strings, numbers, integers, booleans and arrays of strings, with `required`, `enum`,
/// `minimum`/`maximum` and `minLength`/`maxLength`); the values, or why not.
pub fn check_form(
    schema: &Value,
    values: &Value,
) -> Result<serde_json::Map<String, Value>, String> {
    let Value::Object(values) = values else {
        return Err("the answer must be a JSON object".to_owned());
    };
    let properties = schema["properties"].as_object();
    for name in schema["required"].as_array().into_iter().flatten() {
        if let Some(name) = name.as_str()
            && !values.contains_key(name)
        {
            return Err(format!("{name:?} is required"));
        }
    }
    for (name, value) in values {
        let Some(property) = properties.and_then(|p| p.get(name)) else {
            return Err(format!("{name:?} is not a field of the form"));
        };
        let fits = match property["type"].as_str() {
            Some("string") => value.as_str().is_some_and(|text| {
                let chars = text.chars().count() as u64;
                property["minLength"]
                    .as_u64()
                    .is_none_or(|min| chars >= min)
                    && property["maxLength"]
                        .as_u64()
                        .is_none_or(|max| chars <= max)
                    && property["enum"]
                        .as_array()
                        .is_none_or(|allowed| allowed.contains(value))
                    && property["oneOf"]
                        .as_array()
                        .is_none_or(|choices| choices.iter().any(|c| c["const"] == *value))
            }),
            Some("number") => value.as_f64().is_some_and(|n| in_range(property, n)),
            Some("integer") => value.as_i64().is_some_and(|n| in_range(property, n as f64)),
            Some("boolean") => value.is_boolean(),
            Some("array") => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            _ => false,
        };
        if !fits {
            return Err(format!("{name:?} does not fit its schema"));
        }
    }
    Ok(values.clone())
}

fn in_range(property: &Value, n: f64) -> bool {
    property["minimum"].as_f64().is_none_or(|min| n >= min)
        && property["maximum"].as_f64().is_none_or(|max| n <= max)
}

/// The JSON schema of an interrupt answer for these options.
pub fn response_schema(options: &[PermissionOption]) -> Value {
    let ids: Vec<&str> = options.iter().map(|o| o.option_id.as_str()).collect();
    json!({
        "type": "object",
        "properties": {"optionId": {"type": "string", "enum": ids}},
        "required": ["optionId"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permission(id: &str) -> (Wait, oneshot::Receiver<PermissionOutcome>) {
        let (reply, rx) = oneshot::channel();
        (
            Wait::Permission {
                answer_id: id.to_owned(),
                options: vec![PermissionOption {
                    option_id: "ok".to_owned(),
                    name: "OK".to_owned(),
                    kind: "allow_once".to_owned(),
                }],
                budget: false,
                reply,
            },
            rx,
        )
    }

    fn resume(id: &str, payload: Option<Value>) -> Resume {
        Resume {
            interrupt_id: id.to_owned(),
            status: ResumeStatus::Resolved,
            payload,
        }
    }

    #[test]
    fn form_answers_are_checked_against_the_form() {
        let schema = json!({"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1},
            "age": {"type": "integer", "minimum": 0},
            "color": {"type": "string", "enum": ["red", "blue"]},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}}
        }});
        let good = json!({"name": "Ada", "age": 36, "color": "red", "ok": true, "tags": ["x"]});
        assert!(check_form(&schema, &good).is_ok());
        for bad in [
            json!({"age": 3}),
            json!({"name": ""}),
            json!({"name": "A", "age": -1}),
            json!({"name": "A", "age": 1.5}),
            json!({"name": "A", "color": "green"}),
            json!({"name": "A", "ok": "yes"}),
            json!({"name": "A", "tags": [1]}),
            json!({"name": "A", "extra": 1}),
            json!("Ada"),
            Value::Null,
        ] {
            assert!(check_form(&schema, &bad).is_err(), "{bad} passed");
        }
        assert_eq!(
            input_answer(&schema, r#"{"action":"accept","content":{"name":"Ada"}}"#),
            InputAnswer::Accepted(
                json!({"name": "Ada"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            )
        );
        assert_eq!(
            input_answer(&schema, r#"{"action":"decline"}"#),
            InputAnswer::Declined
        );
        for unusable in [
            r#"{"action":"accept","content":{}}"#,
            r#"{"name":"Ada"}"#,
            "Ada",
        ] {
            assert!(
                matches!(
                    input_answer(&schema, unusable),
                    InputAnswer::Cancelled { .. }
                ),
                "{unusable}"
            );
        }
    }

    #[test]
    fn every_open_interrupt_must_be_answered() {
        let (a, _ra) = permission("a");
        let (b, _rb) = permission("b");
        let s = Suspension {
            channel: Channel::Interrupts,
            waits: vec![a, b],
            segment_run_id: "r".to_owned(),
            terminal: None,
        };
        let ok = Some(json!({"optionId": "ok"}));
        let err = s
            .check_resume(&[resume("a", ok.clone())])
            .expect_err("b unanswered");
        assert!(err.contains("\"b\""), "{err}");
        assert!(
            s.check_resume(&[resume("a", ok.clone()), resume("c", ok.clone())])
                .is_err()
        );
        assert!(
            s.check_resume(&[resume("a", ok.clone()), resume("b", None)])
                .is_err()
        );
        assert!(
            s.check_resume(&[resume("a", ok.clone()), resume("b", ok)])
                .is_ok()
        );
    }

    #[tokio::test]
    async fn resolve_answers_and_fails_the_rest_closed() {
        let (a, ra) = permission("a");
        let (b, rb) = permission("b");
        let s = Suspension {
            channel: Channel::Interrupts,
            waits: vec![a, b],
            segment_run_id: "r".to_owned(),
            terminal: None,
        };
        s.resolve(&[], &[resume("a", Some(json!({"optionId": "ok"})))]);
        assert_eq!(
            ra.await.expect("answer"),
            PermissionOutcome::Selected {
                option_id: "ok".to_owned()
            }
        );
        assert!(matches!(
            rb.await.expect("answer"),
            PermissionOutcome::Denied { .. }
        ));
    }
}
