//! What the pump does with each item of the agent's sink: events to translate, state,
//! components, the title and session, and the waits on the client (a frontend tool, a
//! permission, an input), which park the run.

use serde_json::Value;

use super::drive::Pump;
use crate::agent::Hitl;
use crate::agent::{AgentEvent, SinkItem};
use crate::agent::{InputAnswer, InputRequest, PermissionOutcome, PermissionRequest};
use crate::budget::Spend;
use crate::clock::now_ms;
use crate::runtime::suspension::{self, Channel, Wait};
use crate::sync::lock;

impl Pump {
    /// Takes one item from the agent's sink; while parked, it is buffered for the next
    /// segment.
    pub(in crate::runtime) fn on_item(&mut self, item: SinkItem) {
        if !std::mem::replace(&mut self.writer.produced, true) {
            self.writer
                .metrics
                .first_event(self.writer.admitted.elapsed());
        }
        if self.deadline.is_some() {
            self.buffered.push_back(item);
            return;
        }
        match item {
            SinkItem::Event(event) => {
                if matches!(event, AgentEvent::ToolCallStart { .. }) {
                    self.spend(Spend {
                        tool_calls: 1,
                        ..Spend::default()
                    });
                }
                self.writer.translate(event)
            }
            SinkItem::Usage { tokens } => self.spend(Spend {
                tokens,
                ..Spend::default()
            }),
            SinkItem::State { pointer, value } => self.writer.set_state(&pointer, value),
            SinkItem::Ui {
                component,
                props,
                reply,
            } => {
                let verdict = self.show(component, props);
                let _ = reply.send(verdict);
            }
            SinkItem::Title(title) => {
                self.writer.rt.store().set_title(
                    self.writer.thread.key.as_str(),
                    &title,
                    now_ms() as i64,
                );
            }
            SinkItem::Session { id, how } => {
                lock(&self.writer.thread.state).session_id = Some(id.clone());
                self.writer.rt.store().set_session(
                    self.writer.thread.key.as_str(),
                    &id,
                    &how,
                    now_ms() as i64,
                );
                self.writer.set_state("/session", Value::String(id));
            }
            SinkItem::Tool { call, reply } => {
                self.spend(Spend {
                    tool_calls: 1,
                    ..Spend::default()
                });
                let id = call.tool_call_id.clone();
                self.call_on_client(&id, call.name, call.arguments);
                if let Some(trace) = &mut self.writer.trace {
                    trace.tool_on_client(&id);
                }
                self.suspend(
                    Channel::ToolMessages,
                    vec![Wait::Tool {
                        tool_call_id: id,
                        reply,
                    }],
                    Vec::new(),
                );
            }
            SinkItem::Permission { request, reply } => self.ask_permission(request, reply),
            SinkItem::Input { request, reply } => self.ask_input(request, reply),
        }
    }

    /// A component the agent shows: an activity when the catalog allows it; the verdict
    /// goes back to the agent.
    fn show(&mut self, component: String, props: Value) -> Result<(), String> {
        let verdict = self.writer.rt.options().ui.check(&component, &props);
        if verdict.is_ok() {
            self.writer.translate(AgentEvent::Activity {
                message_id: uuid::Uuid::new_v4().to_string(),
                activity_type: component,
                content: props,
            });
        } else if let Err(refusal) = &verdict {
            tracing::info!(%refusal, "component refused");
        }
        verdict.map_err(|refusal| refusal.to_string())
    }

    /// A tool call the client is to run: start, arguments, end.
    pub(in crate::runtime) fn call_on_client(&mut self, id: &str, name: String, arguments: String) {
        self.writer.translate(AgentEvent::ToolCallStart {
            tool_call_id: id.to_owned(),
            name,
            parent_message_id: None,
        });
        self.writer.translate(AgentEvent::ToolCallArgs {
            tool_call_id: id.to_owned(),
            delta: arguments,
        });
        self.writer.translate(AgentEvent::ToolCallEnd {
            tool_call_id: id.to_owned(),
        });
    }

    /// A permission the agent asks for: a call of the permission tool, or an interrupt.
    fn ask_permission(
        &mut self,
        request: PermissionRequest,
        reply: tokio::sync::oneshot::Sender<PermissionOutcome>,
    ) {
        match self.hitl {
            Hitl::Tool => {
                let id = format!("perm-{}", uuid::Uuid::new_v4());
                let arguments = suspension::permission_arguments(&request);
                self.call_on_client(&id, suspension::PERMISSION_TOOL.to_owned(), arguments);
                if let Some(trace) = &mut self.writer.trace {
                    trace.tool_on_client(&id);
                }
                self.suspend(
                    Channel::ToolMessages,
                    vec![Wait::Permission {
                        answer_id: id,
                        options: request.options,
                        budget: false,
                        reply,
                    }],
                    Vec::new(),
                );
            }
            Hitl::Interrupt => {
                let interrupt = self.interrupt(
                    "confirmation",
                    &request.title,
                    request.tool_call_id.clone(),
                    suspension::response_schema(&request.options),
                    Some(match &request.tool_call {
                        Some(about) => {
                            serde_json::json!({"options": request.options, "toolCall": about})
                        }
                        None => serde_json::json!({"options": request.options}),
                    }),
                );
                let id = interrupt.id.clone();
                self.suspend(
                    Channel::Interrupts,
                    vec![Wait::Permission {
                        answer_id: id,
                        options: request.options,
                        budget: false,
                        reply,
                    }],
                    vec![interrupt],
                );
            }
        }
    }

    /// Input the agent asks for: a call of the input tool, or an interrupt.
    fn ask_input(
        &mut self,
        request: InputRequest,
        reply: tokio::sync::oneshot::Sender<InputAnswer>,
    ) {
        match self.hitl {
            Hitl::Tool => {
                let id = format!("input-{}", uuid::Uuid::new_v4());
                let arguments = suspension::input_arguments(&request);
                self.call_on_client(&id, suspension::INPUT_TOOL.to_owned(), arguments);
                self.suspend(
                    Channel::ToolMessages,
                    vec![Wait::Input {
                        answer_id: id,
                        schema: request.schema,
                        reply,
                    }],
                    Vec::new(),
                );
            }
            Hitl::Interrupt => {
                let interrupt = self.interrupt(
                    "input_required",
                    &request.message,
                    request.tool_call_id.clone(),
                    request.schema.clone(),
                    None,
                );
                let id = interrupt.id.clone();
                self.suspend(
                    Channel::Interrupts,
                    vec![Wait::Input {
                        answer_id: id,
                        schema: request.schema,
                        reply,
                    }],
                    vec![interrupt],
                );
            }
        }
    }
}
