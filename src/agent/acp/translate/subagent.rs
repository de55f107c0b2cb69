//! A subagent's updates: its announcement on the parent session opens and ends its AG-UI
//! run, and its own session's message chunks are its text messages while it runs.

use serde_json::{Value, json};

use super::{UpdateTranslator, text_of};
use crate::agent::{AgentEvent, EventSink, SinkClosed};

impl UpdateTranslator {
    /// An update of a subagent's session: its message chunks while it runs are its own
    /// text; anything else is passed on as `CUSTOM acp.subagent.<variant>`.
    pub(super) async fn of_subagent(
        &mut self,
        child: &str,
        kind: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let running = self.subagents.get(child).and_then(|(_, open)| open.clone());
        if let Some(subagent_run_id) = &running
            && kind == "agent_message_chunk"
        {
            return self.child_text(child, subagent_run_id, update, sink).await;
        }
        let subagent_run_id = running.unwrap_or_else(|| child.to_owned());
        let name = if kind.is_empty() { "unknown" } else { kind };
        sink.send(AgentEvent::Custom {
            name: format!("acp.subagent.{name}"),
            value: json!({"subagentRunId": subagent_run_id, "update": update}),
        })
        .await
    }

    /// A subagent announced or changed: opens its AG-UI run when it starts running, ends it
    /// when it goes idle.
    pub(super) async fn subagent(
        &mut self,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let Some(child) = update["sessionId"].as_str().filter(|id| !id.is_empty()) else {
            tracing::debug!("subagent update without a session id ignored");
            return Ok(());
        };
        let entry = self.subagents.entry(child.to_owned()).or_insert((0, None));
        match update["state"]["state"].as_str() {
            Some("running") | Some("requires_action") if entry.1.is_none() => {
                entry.0 += 1;
                let id = if entry.0 == 1 {
                    child.to_owned()
                } else {
                    format!("{child}~{}", entry.0)
                };
                entry.1 = Some(id.clone());
                let name = update["title"]
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .unwrap_or("subagent")
                    .to_owned();
                sink.send(AgentEvent::SubagentStarted {
                    subagent_run_id: id,
                    name,
                    description: update["description"].as_str().map(str::to_owned),
                })
                .await
            }
            Some("idle") => {
                let Some(id) = entry.1.take() else {
                    return Ok(());
                };
                if let Some(message_id) = self.child_text.remove(child) {
                    sink.send(AgentEvent::TextEnd { message_id }).await?;
                }
                if update["state"]["stopReason"] == "error" {
                    let message = update["state"]["error"]["message"]
                        .as_str()
                        .unwrap_or("the subagent stopped on an error")
                        .to_owned();
                    sink.send(AgentEvent::SubagentError {
                        subagent_run_id: id,
                        message,
                    })
                    .await
                } else {
                    sink.send(AgentEvent::SubagentFinished {
                        subagent_run_id: id,
                    })
                    .await
                }
            }
            _ => Ok(()),
        }
    }

    /// A subagent's message chunk: its own text message, attributed to it.
    async fn child_text(
        &mut self,
        child: &str,
        subagent_run_id: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let Some(text) = text_of(&update["content"]) else {
            return Ok(());
        };
        let id = update["messageId"]
            .as_str()
            .filter(|id| !id.is_empty())
            .map(|id| format!("acp-{id}"))
            .or_else(|| self.child_text.get(child).cloned())
            .unwrap_or_else(|| format!("acp-sub-{}", uuid::Uuid::new_v4()));
        if self.child_text.get(child) != Some(&id) {
            if let Some(previous) = self.child_text.remove(child) {
                sink.send(AgentEvent::TextEnd {
                    message_id: previous,
                })
                .await?;
            }
            sink.send(AgentEvent::SubagentTextStart {
                subagent_run_id: subagent_run_id.to_owned(),
                message_id: id.clone(),
            })
            .await?;
            self.child_text.insert(child.to_owned(), id.clone());
        }
        sink.send(AgentEvent::TextDelta {
            message_id: id,
            delta: text,
        })
        .await
    }
}
