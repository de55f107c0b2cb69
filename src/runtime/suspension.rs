//! A run waiting on the client: frontend tool calls, permission requests (as the
//! `agui_permission_request` frontend tool, or as AG-UI 1.0 interrupts), and how a later
//! request's tool messages or `resume[]` answer them.
//!
//! Every wait fails closed: a timeout, a cancel, a shutdown or new user input instead of the
//! answer resolve it as an error (tool) or a denial (permission).

use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::agent::{PermissionOption, PermissionOutcome, ToolAnswer};
use crate::protocol::Event;
use crate::protocol::input::{Content, Message, Resume, ResumeStatus};

/// The frontend tool through which permission requests reach the client.
pub const PERMISSION_TOOL: &str = "agui_permission_request";

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
        reply: oneshot::Sender<PermissionOutcome>,
    },
}

impl Wait {
    pub fn answer_id(&self) -> &str {
        match self {
            Wait::Tool { tool_call_id, .. } => tool_call_id,
            Wait::Permission { answer_id, .. } => answer_id,
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

fn answer_for(wait: &Wait, new_messages: &[Message], resume: &[Resume]) -> Option<Answer> {
    if let Some(entry) = resume.iter().find(|e| e.interrupt_id == wait.answer_id()) {
        return Some(match (wait, entry.status) {
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
        });
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

/// The `agui_permission_request` arguments for a permission request.
pub fn permission_arguments(
    title: &str,
    tool_call_id: Option<&str>,
    options: &[PermissionOption],
) -> String {
    let mut args = json!({"title": title, "options": options});
    if let Some(id) = tool_call_id {
        args["toolCallId"] = json!(id);
    }
    args.to_string()
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
