//! ACP `session/update` -> agent events and shared-state changes, per the mapping in
//! the ACP notes: message and thought chunks, tool calls (opened before any result), plan,
//! usage, locations and diffs, commands/mode/config/session info, and unknown variants as
//! `CUSTOM acp.<variant>`. Works on the update's JSON so a variant this build does not know
//! is passed on, never dropped and never fatal.
//!
//! Subagents: a `subagent_update` on the session announces a child session; while its
//! state is `running` it is an open AG-UI subagent (`SUBAGENT_STARTED`, `subagentRunId` =
//! the child's session id, `~N` for its N-th run), and its `idle` state ends it
//! (`SUBAGENT_FINISHED`, or `SUBAGENT_ERROR` when it stopped on an error). The child's own
//! updates, which the agent sends under the child's session id, are its text messages
//! (`TEXT_MESSAGE_*` with its `subagentRunId`) while it runs; any other update of it (and
//! any update while it is not running) is passed on as `CUSTOM acp.subagent.<variant>`
//! with the `subagentRunId` and the update.
//!
//! Tool-call ids are unique per thread on the AG-UI side: an agent may reuse `call_1` in
//! every turn, so a call whose id the thread has already used is renamed (`call_1~2`,
//! `call_1~3`, ...) for the whole turn: stream, transcript, permission request and
//! frontend-tool call alike. The agent never sees the new name; its answers travel by
//! JSON-RPC request, not by tool-call id.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::agent::{AgentEvent, EventSink, SinkClosed};

mod content;
mod subagent;
pub(super) use content::text_of;
use content::{
    contents_text, diffs, terminal_output, todos, tool_call_details, tool_name, unified_diff,
    usage, without_tag,
};

/// The start of the id the daemon gives a message the agent sent without `messageId`.
const UNNAMED: &str = "acp~";

/// One session turn's translation state.
#[derive(Debug, Default)]
pub(super) struct UpdateTranslator {
    text: Option<String>,
    thought: Option<String>,
    /// Tool calls opened on the AG-UI stream.
    tools: HashSet<String>,
    /// Every tool call of the turn as the agent last described it (its updates merged),
    /// by ACP id.
    calls: HashMap<String, Value>,
    /// Calls reported but not opened yet, in the order the agent reported them: their
    /// input may still change (see [`UpdateTranslator::tool_call`]).
    pending: Vec<String>,
    /// Tool calls already answered with a result.
    answered: HashSet<String>,
    files: Vec<Value>,
    /// The files a call names, by ACP id, as `(path, action)`: filed in `/files` when the
    /// call completes, dropped when it fails (a refused write changed nothing).
    proposed: HashMap<String, Vec<(String, String)>>,
    /// Output of the commands running in calls (`_meta.terminal_output`), by ACP id.
    terminals: HashMap<String, Terminal>,
    /// Every diff a call's updates carried, by ACP id (a later update's `content` may
    /// replace the one that carried it), and how many of them are on the stream.
    call_diffs: HashMap<String, (Vec<Value>, usize)>,
    /// Names of the browser's tools (served to the agent over MCP).
    frontend: Vec<String>,
    /// The agent's own tool calls for frontend tools, held back: id -> tool name.
    held: Vec<(String, String, bool)>,
    /// Tool-call ids the thread has used on the AG-UI side (earlier turns and this one).
    used: HashSet<String>,
    /// This turn's ACP tool-call id -> its AG-UI id.
    wire: HashMap<String, String>,
    /// Subagent session id -> (runs started so far, the open run's `subagentRunId`).
    subagents: HashMap<String, (u32, Option<String>)>,
    /// Subagent session id -> its open text message.
    child_text: HashMap<String, String>,
}

impl UpdateTranslator {
    /// Whether the ACP tool call `tool_call_id` is open on the AG-UI stream.
    pub(super) fn is_open(&self, tool_call_id: &str) -> bool {
        self.tools.contains(tool_call_id)
    }

    /// Starts from the tool-call ids the thread already uses.
    pub(super) fn with_used_ids(mut self, ids: HashSet<String>) -> UpdateTranslator {
        self.used = ids;
        self
    }

    /// The AG-UI id of this turn's ACP tool call `acp_id`: the same id unless the thread
    /// already used it, else the first free `acp_id~N` (N = 2, 3, ...).
    pub(super) fn wire_id(&mut self, acp_id: &str) -> String {
        if let Some(id) = self.wire.get(acp_id) {
            return id.clone();
        }
        let mut id = acp_id.to_owned();
        let mut n = 1;
        while self.used.contains(&id) {
            n += 1;
            id = format!("{acp_id}~{n}");
        }
        self.used.insert(id.clone());
        self.wire.insert(acp_id.to_owned(), id.clone());
        id
    }

    /// The browser's tools, whose MCP calls the agent also reports as its own tool calls.
    pub(super) fn with_frontend_tools(mut self, names: Vec<String>) -> UpdateTranslator {
        self.frontend = names;
        self
    }

    /// The AG-UI id of a held agent tool call for frontend tool `name`, not yet used.
    pub(super) fn claim_frontend(&mut self, name: &str) -> Option<String> {
        let held = self
            .held
            .iter_mut()
            .find(|(_, tool, claimed)| tool == name && !*claimed)?;
        held.2 = true;
        let acp_id = held.0.clone();
        Some(self.wire_id(&acp_id))
    }

    /// Whether this update is the agent's own report of a frontend tool call (held back:
    /// the frontend call carries it on the AG-UI stream).
    fn frontend_report(&mut self, id: &str, update: &Value) -> bool {
        if self.held.iter().any(|(held, _, _)| held == id) {
            return true;
        }
        if self.tools.contains(id) {
            return false;
        }
        let label = ["name", "title"]
            .iter()
            .filter_map(|k| update[*k].as_str())
            .find_map(|label| {
                self.frontend.iter().find(|tool| {
                    label == tool.as_str()
                        || [
                            format!("__{tool}"),
                            format!("/{tool}"),
                            format!(".{tool}"),
                            format!(":{tool}"),
                        ]
                        .iter()
                        .any(|suffix| label.ends_with(suffix.as_str()))
                })
            })
            .cloned();
        match label {
            Some(tool) => {
                self.held.push((id.to_owned(), tool, false));
                true
            }
            None => false,
        }
    }

    /// Translates one `session/update` of the session, or (`subagent`) of one of its
    /// subagents' sessions.
    pub(super) async fn apply(
        &mut self,
        subagent: Option<&str>,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let kind = update["sessionUpdate"].as_str().unwrap_or("");
        if let Some(child) = subagent {
            return self.of_subagent(child, kind, update, sink).await;
        }
        match kind {
            "subagent_update" => self.subagent(update, sink).await,
            "agent_message_chunk" => self.message_chunk(update, sink).await,
            "agent_thought_chunk" => self.thought_chunk(update, sink).await,
            "user_message_chunk" => Ok(()),
            "tool_call" => self.tool_call(update, sink).await,
            "tool_call_update" => self.tool_call_update(update, sink).await,
            "plan" => sink.set_state("/todos", todos(update)).await,
            "usage_update" => usage(update, sink).await,
            "available_commands_update" => {
                sink.set_state("/commands", update["availableCommands"].clone())
                    .await
            }
            "current_mode_update" => {
                sink.set_state("/mode", update["currentModeId"].clone())
                    .await
            }
            "config_option_update" => sink.set_state("/config", without_tag(update)).await,
            "session_info_update" => {
                if let Some(title) = update["title"].as_str() {
                    sink.set_state("/title", json!(title)).await?;
                    sink.set_title(title).await?;
                }
                Ok(())
            }
            other => {
                let name = if other.is_empty() { "unknown" } else { other };
                sink.send(AgentEvent::Custom {
                    name: format!("acp.{name}"),
                    value: update.clone(),
                })
                .await
            }
        }
    }

    /// An `agent_message_chunk`: a delta of the agent's text message, which opens after
    /// the thought and any earlier message are closed.
    async fn message_chunk(&mut self, update: &Value, sink: &EventSink) -> Result<(), SinkClosed> {
        let Some(text) = text_of(&update["content"]) else {
            return Ok(());
        };
        self.close_thought(sink).await?;
        let id = self.message_id(update, false);
        if self.text.as_deref() != Some(id.as_str()) {
            self.close_text(sink).await?;
            sink.send(AgentEvent::TextStart {
                message_id: id.clone(),
            })
            .await?;
            self.text = Some(id.clone());
        }
        sink.send(AgentEvent::TextDelta {
            message_id: id,
            delta: text,
        })
        .await
    }

    /// An `agent_thought_chunk`: a delta of the agent's reasoning, which opens after the
    /// text and any earlier thought are closed.
    async fn thought_chunk(&mut self, update: &Value, sink: &EventSink) -> Result<(), SinkClosed> {
        let Some(text) = text_of(&update["content"]) else {
            return Ok(());
        };
        self.close_text(sink).await?;
        let id = self.message_id(update, true);
        if self.thought.as_deref() != Some(id.as_str()) {
            self.close_thought(sink).await?;
            sink.send(AgentEvent::ReasoningStart {
                message_id: id.clone(),
            })
            .await?;
            self.thought = Some(id.clone());
        }
        sink.send(AgentEvent::ReasoningDelta {
            message_id: id,
            delta: text,
        })
        .await
    }

    /// A `tool_call`: noted (unless it is the agent's report of a frontend call), and
    /// opened once its input has settled.
    ///
    /// Agents report a call before its input is known (Claude Code sends `rawInput: {}`
    /// and "Preparing file…" while the model still streams the input, then the real input,
    /// title and diff in `tool_call_update`s). So a call opens on the AG-UI stream only when
    /// its input has settled: when it runs (`in_progress`), ends (`completed`, `failed`), a
    /// permission is asked about it ([`UpdateTranslator::settle`]) or the turn ends; then it
    /// carries the latest title, kind and input.
    async fn tool_call(&mut self, update: &Value, sink: &EventSink) -> Result<(), SinkClosed> {
        self.close_text(sink).await?;
        self.close_thought(sink).await?;
        self.tool_call_update(update, sink).await
    }

    /// A `tool_call_update` (or a `tool_call`): merged into what the call is; the call
    /// opened when its input has settled, its files noted, and its result once it has one.
    async fn tool_call_update(
        &mut self,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        if id.is_empty() || self.frontend_report(&id, update) {
            return Ok(());
        }
        self.merge(&id, update);
        let status = update["status"].as_str().unwrap_or("");
        let output = terminal_output(update);
        if !self.tools.contains(&id)
            && (matches!(status, "in_progress" | "completed" | "failed") || output.is_some())
        {
            // A call that runs (or ran) has settled.
            self.pending.retain(|p| *p != id);
            let call = self.calls.get(&id).cloned().unwrap_or_default();
            self.open_tool(&id, &call, sink).await?;
        }
        if !self.tools.contains(&id) {
            return Ok(());
        }
        if let Some(data) = output {
            self.terminal_output(&id, data, sink).await?;
        }
        if let Some(exit) = update["_meta"].get("terminal_exit") {
            self.terminal_exit(&id, exit, sink).await?;
        }
        let call = self.calls.get(&id).cloned().unwrap_or_default();
        self.after_open(&id, &call, sink).await
    }

    /// A piece of a running command's output: shown live as an activity of type
    /// `terminal` (`{"toolCallId","output":[pieces...],"exit":null}`; each later piece an
    /// `ACTIVITY_DELTA` adding to `/output`).
    async fn terminal_output(
        &mut self,
        acp_id: &str,
        data: &str,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let id = self.wire_id(acp_id);
        let terminal = self.terminals.entry(acp_id.to_owned()).or_default();
        terminal.output.push(data.to_owned());
        if terminal.shown {
            return sink
                .send(AgentEvent::ActivityDelta {
                    message_id: format!("terminal-{id}"),
                    activity_type: "terminal".to_owned(),
                    patch: json!([{"op": "add", "path": "/output/-", "value": data}]),
                })
                .await;
        }
        terminal.shown = true;
        sink.send(AgentEvent::ActivityLive {
            message_id: format!("terminal-{id}"),
            activity_type: "terminal".to_owned(),
            content: json!({"toolCallId": id, "output": [data], "exit": null}),
        })
        .await
    }

    /// A command's end (`_meta.terminal_exit`: `exit_code`, `signal`): its activity's last
    /// state, kept in the transcript.
    async fn terminal_exit(
        &mut self,
        acp_id: &str,
        exit: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let id = self.wire_id(acp_id);
        let terminal = self.terminals.entry(acp_id.to_owned()).or_default();
        if terminal.exit.is_some() {
            return Ok(());
        }
        let exit = json!({"exitCode": exit["exit_code"], "signal": exit["signal"]});
        terminal.exit = Some(exit.clone());
        sink.send(AgentEvent::Activity {
            message_id: format!("terminal-{id}"),
            activity_type: "terminal".to_owned(),
            content: json!({"toolCallId": id, "output": terminal.output, "exit": exit}),
        })
        .await
    }

    /// Opens call `update.toolCallId` now, as the permission request about it describes it
    /// (merged over what the agent said before).
    pub(super) async fn settle(
        &mut self,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let id = update["toolCallId"].as_str().unwrap_or_default().to_owned();
        if id.is_empty() || self.frontend_report(&id, update) {
            return Ok(());
        }
        self.merge(&id, update);
        if self.tools.contains(&id) {
            return self.after_open(&id, update, sink).await;
        }
        self.close_text(sink).await?;
        self.close_thought(sink).await?;
        self.open_pending(&id, sink).await
    }

    /// What call `acp_id` is about, for a permission prompt: its name, kind, input and
    /// diffs (`{"name","kind"?,"input"?,"diff"?:[{"path","oldText","newText"}]}`).
    pub(super) fn describe(&self, acp_id: &str) -> Option<Value> {
        let call = self.calls.get(acp_id)?;
        let mut about = json!({"name": tool_name(call)});
        if let Some(kind) = call.get("kind").filter(|v| !v.is_null()) {
            about["kind"] = kind.clone();
        }
        if let Some(input) = call.get("rawInput").filter(|v| !v.is_null()) {
            about["input"] = input.clone();
        }
        if let Some((diffs, _)) = self.call_diffs.get(acp_id).filter(|(d, _)| !d.is_empty()) {
            about["diff"] = Value::Array(diffs.clone());
        }
        Some(about)
    }

    /// Merges an update into what call `id` is: each field the update carries replaces
    /// the one before (ACP's rule for `tool_call_update`).
    fn merge(&mut self, id: &str, update: &Value) {
        let (known, _) = self.call_diffs.entry(id.to_owned()).or_default();
        for diff in diffs(&update["content"]) {
            if !known.contains(&diff) {
                known.push(diff);
            }
        }
        let call = self.calls.entry(id.to_owned()).or_insert_with(|| {
            self.pending.push(id.to_owned());
            json!({})
        });
        if let (Some(call), Some(fields)) = (call.as_object_mut(), update.as_object()) {
            for (key, value) in fields {
                if key != "sessionUpdate" && !value.is_null() {
                    call.insert(key.clone(), value.clone());
                }
            }
        }
    }

    /// Opens pending call `id` as it now is: details, start, input, end; then its files,
    /// diffs and result.
    async fn open_pending(&mut self, id: &str, sink: &EventSink) -> Result<(), SinkClosed> {
        self.pending.retain(|p| p != id);
        let call = self.calls.get(id).cloned().unwrap_or_default();
        self.open_tool(id, &call, sink).await?;
        self.after_open(id, &call, sink).await
    }

    /// What an update of an open call shows: its files, its diffs and its result.
    async fn after_open(
        &mut self,
        id: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        self.track_files(id, update, sink).await?;
        self.show_diffs(id, sink).await?;
        self.maybe_result(id, update, sink).await
    }

    /// Opens every call still pending (the turn ends, or a permission is asked).
    async fn open_all_pending(&mut self, sink: &EventSink) -> Result<(), SinkClosed> {
        for id in std::mem::take(&mut self.pending) {
            if !self.tools.contains(&id) {
                self.open_pending(&id, sink).await?;
            }
        }
        Ok(())
    }

    /// Closes the open text messages and thought, and opens the calls still pending
    /// (before a question to the client, or at the end).
    pub(super) async fn close(&mut self, sink: &EventSink) -> Result<(), SinkClosed> {
        self.open_all_pending(sink).await?;
        self.close_text(sink).await?;
        for (_, message_id) in std::mem::take(&mut self.child_text) {
            sink.send(AgentEvent::TextEnd { message_id }).await?;
        }
        self.close_thought(sink).await
    }

    async fn close_text(&mut self, sink: &EventSink) -> Result<(), SinkClosed> {
        if let Some(id) = self.text.take() {
            sink.send(AgentEvent::TextEnd { message_id: id }).await?;
        }
        Ok(())
    }

    async fn close_thought(&mut self, sink: &EventSink) -> Result<(), SinkClosed> {
        if let Some(id) = self.thought.take() {
            sink.send(AgentEvent::ReasoningEnd { message_id: id })
                .await?;
        }
        Ok(())
    }

    /// The AG-UI id of a chunk's message: the agent's `messageId`; else the open message,
    /// when that has no id of the agent's either (an agent that never sends ids); else a
    /// new one. So a chunk without an id (an agent's notice) never joins the model's
    /// answer, whose chunks carry an id.
    fn message_id(&mut self, update: &Value, thought: bool) -> String {
        if let Some(id) = update["messageId"].as_str().filter(|id| !id.is_empty()) {
            return format!("acp-{id}");
        }
        let current = if thought { &self.thought } else { &self.text };
        if let Some(id) = current.as_ref().filter(|id| id.starts_with(UNNAMED)) {
            return id.clone();
        }
        format!(
            "{UNNAMED}{}-{}",
            if thought { "thought" } else { "msg" },
            uuid::Uuid::new_v4()
        )
    }

    async fn open_tool(
        &mut self,
        id: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        if !self.tools.insert(id.to_owned()) {
            return Ok(());
        }
        let id = &self.wire_id(id);
        sink.send(AgentEvent::Custom {
            name: "acp.tool_call".to_owned(),
            value: tool_call_details(id, update),
        })
        .await?;
        sink.send(AgentEvent::ToolCallStart {
            tool_call_id: id.to_owned(),
            name: tool_name(update),
            parent_message_id: None,
        })
        .await?;
        if let Some(input) = update.get("rawInput").filter(|v| !v.is_null()) {
            sink.send(AgentEvent::ToolCallArgs {
                tool_call_id: id.to_owned(),
                delta: input.to_string(),
            })
            .await?;
        }
        sink.send(AgentEvent::ToolCallEnd {
            tool_call_id: id.to_owned(),
        })
        .await
    }

    /// The call's result, once: when it has `completed` or `failed`, its text content and
    /// diffs, else its `rawOutput`.
    async fn maybe_result(
        &mut self,
        acp_id: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let status = update["status"].as_str().unwrap_or("");
        if !matches!(status, "completed" | "failed") || self.answered.contains(acp_id) {
            return Ok(());
        }
        self.answered.insert(acp_id.to_owned());
        let call = self.calls.get(acp_id).cloned().unwrap_or_default();
        let mut content = contents_text(&call["content"]);
        if content.is_empty()
            && let Some(raw) = call.get("rawOutput").filter(|v| !v.is_null())
        {
            content = match raw {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
        if content.is_empty()
            && let Some(terminal) = self.terminals.get(acp_id)
        {
            content = terminal.output.concat();
            if let Some(code) = terminal.exit.as_ref().and_then(|e| e["exitCode"].as_i64()) {
                content.push_str(&format!("\n(exit code {code})"));
            }
        }
        // A failed call (a refused write) changed nothing: no diff in its result.
        let carried = match status {
            "failed" => Vec::new(),
            _ => self
                .call_diffs
                .get(acp_id)
                .map(|(all, _)| all.clone())
                .unwrap_or_default(),
        };
        for diff in carried {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&unified_diff(
                diff["path"].as_str().unwrap_or_default(),
                diff["oldText"].as_str().unwrap_or(""),
                diff["newText"].as_str().unwrap_or(""),
            ));
        }
        if status == "failed" && content.is_empty() {
            content = "the tool call failed".to_owned();
        }
        let id = self.wire_id(acp_id);
        sink.send(AgentEvent::ToolCallResult {
            tool_call_id: id.clone(),
            message_id: format!("result-{id}"),
            content,
        })
        .await
    }

    /// Notes the files an update of call `acp_id` names: its locations under the call's
    /// kind as the agent last gave it (`read`, `edit`, `delete`, `move`, `execute`; any
    /// other kind, or none, as `read`), its diffs as edits. They are filed in `/files` once
    /// the call has completed; a call that failed (refused) files none.
    async fn track_files(
        &mut self,
        acp_id: &str,
        update: &Value,
        sink: &EventSink,
    ) -> Result<(), SinkClosed> {
        let kind = self
            .calls
            .get(acp_id)
            .and_then(|c| c["kind"].as_str())
            .unwrap_or("read");
        let action = match kind {
            "read" | "edit" | "delete" | "move" | "execute" => kind,
            _ => "read",
        }
        .to_owned();
        let named = self.proposed.entry(acp_id.to_owned()).or_default();
        let mut propose = |path: &str, action: &str| {
            let entry = (path.to_owned(), action.to_owned());
            if !named.contains(&entry) {
                named.push(entry);
            }
        };
        for location in update["locations"].as_array().into_iter().flatten() {
            if let Some(path) = location["path"].as_str() {
                propose(path, &action);
            }
        }
        for item in update["content"].as_array().into_iter().flatten() {
            if item["type"] == "diff"
                && let Some(path) = item["path"].as_str()
            {
                propose(path, "edit");
            }
        }
        let status = self
            .calls
            .get(acp_id)
            .and_then(|c| c["status"].as_str())
            .or_else(|| update["status"].as_str())
            .unwrap_or("");
        let mut changed = false;
        match status {
            "completed" => {
                for (path, action) in self.proposed.remove(acp_id).unwrap_or_default() {
                    changed |= self.note_file(&path, &action);
                }
            }
            "failed" => {
                self.proposed.remove(acp_id);
            }
            _ => {}
        }
        if changed {
            sink.set_state("/files", Value::Array(self.files.clone()))
                .await?;
        }
        Ok(())
    }

    /// Shows each diff call `acp_id` has carried as an activity of type `diff`
    /// (`{"toolCallId","path","oldText","newText"}`, `oldText` null for a new file), once
    /// per diff.
    async fn show_diffs(&mut self, acp_id: &str, sink: &EventSink) -> Result<(), SinkClosed> {
        let id = self.wire_id(acp_id);
        let Some((all, shown)) = self.call_diffs.get_mut(acp_id) else {
            return Ok(());
        };
        let new: Vec<Value> = all[*shown..].to_vec();
        *shown = all.len();
        for mut content in new {
            content["toolCallId"] = json!(id);
            sink.send(AgentEvent::Activity {
                message_id: format!("diff-{}", uuid::Uuid::new_v4()),
                activity_type: "diff".to_owned(),
                content,
            })
            .await?;
        }
        Ok(())
    }

    fn note_file(&mut self, path: &str, action: &str) -> bool {
        let entry = json!({"path": path, "action": action});
        if self.files.contains(&entry) {
            return false;
        }
        self.files.push(entry);
        true
    }

    /// Starts from the files the thread's state already lists.
    pub(super) fn with_files(mut self, files: Vec<Value>) -> UpdateTranslator {
        self.files = files;
        self
    }
}

/// What a call's command has printed so far, and how it ended.
#[derive(Debug, Default)]
struct Terminal {
    output: Vec<String>,
    /// Whether its activity is on the stream yet.
    shown: bool,
    /// `{"exitCode","signal"}` once it ended.
    exit: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::SinkItem;

    /// Applies `updates` in order (then the turn's end) and returns what reached the sink:
    /// events and state changes, as JSON-ish strings.
    async fn translated(updates: &[Value]) -> Vec<String> {
        let (sink, mut items) = EventSink::channel(1024);
        let mut translator = UpdateTranslator::default();
        for update in updates {
            translator.apply(None, update, &sink).await.expect("open");
        }
        translator.close(&sink).await.expect("open");
        drop(sink);
        let mut out = Vec::new();
        while let Some(item) = items.recv().await {
            match *item {
                SinkItem::Event(event) => out.push(format!("{event:?}")),
                SinkItem::State { pointer, value } => out.push(format!("state {pointer} {value}")),
                _ => {}
            }
        }
        out
    }

    #[tokio::test]
    async fn a_call_opens_with_the_input_it_settles_on() {
        let out = translated(&[
            json!({"sessionUpdate": "tool_call", "toolCallId": "t", "name": "Write",
                   "title": "Preparing file…", "kind": "edit", "rawInput": {}, "status": "pending"}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "title": "Write a.txt",
                   "rawInput": {"file_path": "/w/a.txt", "content": "hi"},
                   "locations": [{"path": "/w/a.txt"}],
                   "content": [{"type": "diff", "path": "/w/a.txt", "oldText": null, "newText": "hi"}]}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "completed",
                   "content": [{"type": "content", "content": {"type": "text", "text": "Wrote it"}}]}),
        ])
        .await;
        let joined = out.join("\n");
        assert!(!joined.contains("Preparing"), "{joined}");
        assert!(!joined.contains("delta: \"{}\""), "{joined}");
        assert!(joined.contains(r#"\"file_path\":\"/w/a.txt\""#), "{joined}");
        assert_eq!(
            out.iter()
                .filter(|e| e.starts_with("ToolCallStart"))
                .count(),
            1
        );
        assert!(
            joined.contains(r#"state /files [{"path":"/w/a.txt","action":"edit"}]"#),
            "{joined}"
        );
        assert!(
            !joined.contains(r#""action":"read""#),
            "a write is not filed as a read: {joined}"
        );
        assert!(joined.contains("activity_type: \"diff\""), "{joined}");
        let result = out
            .iter()
            .find(|e| e.starts_with("ToolCallResult"))
            .expect("result");
        assert!(
            result.contains("Wrote it") && result.contains("+hi"),
            "{result}"
        );
    }

    #[test]
    fn an_edits_snippets_show_no_missing_newline_markers() {
        let diff = unified_diff("/w/a.rs", "let a = 1;", "let a = 2;");
        assert!(
            diff.contains("-let a = 1;") && diff.contains("+let a = 2;"),
            "{diff}"
        );
        assert!(!diff.contains("No newline"), "{diff}");
        // A whole file that lost its last newline still says so.
        let diff = unified_diff("/w/b.txt", "x\n", "x");
        assert!(diff.contains("No newline"), "{diff}");
    }

    #[tokio::test]
    async fn a_refused_write_files_nothing_and_shows_no_diff_in_its_result() {
        let out = translated(&[
            json!({"sessionUpdate": "tool_call", "toolCallId": "t", "name": "Write",
                   "title": "Write a.txt", "kind": "edit", "status": "pending",
                   "rawInput": {"file_path": "/w/a.txt", "content": "never"},
                   "locations": [{"path": "/w/a.txt"}],
                   "content": [{"type": "diff", "path": "/w/a.txt", "oldText": null, "newText": "never"}]}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "failed",
                   "content": [{"type": "content", "content": {"type": "text", "text": "The user refused"}}]}),
        ])
        .await;
        let joined = out.join("\n");
        assert!(!joined.contains("state /files"), "{joined}");
        let result = out
            .iter()
            .find(|e| e.starts_with("ToolCallResult"))
            .expect("result");
        assert!(
            result.contains("The user refused") && !result.contains("+never"),
            "{result}"
        );
    }

    #[tokio::test]
    async fn a_call_still_pending_opens_at_the_turns_end() {
        let out = translated(&[json!({"sessionUpdate": "tool_call", "toolCallId": "p",
            "title": "ls", "kind": "execute", "rawInput": {"command": "ls"}, "status": "pending"})])
        .await;
        assert_eq!(
            out.iter()
                .filter(|e| e.starts_with("ToolCallStart"))
                .count(),
            1,
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_notice_without_an_id_does_not_join_the_models_answer() {
        let chunk = |id: Option<&str>, text: &str| {
            let mut update = json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text}});
            if let Some(id) = id {
                update["messageId"] = json!(id);
            }
            update
        };
        let out = translated(&[
            chunk(Some("m1"), "The answer"),
            chunk(None, "Notice"),
            chunk(None, " goes on"),
        ])
        .await;
        let starts: Vec<&String> = out.iter().filter(|e| e.starts_with("TextStart")).collect();
        assert_eq!(starts.len(), 2, "{out:?}");
        let notice = out.iter().find(|e| e.contains("Notice")).expect("notice");
        let continued = out
            .iter()
            .find(|e| e.contains("goes on"))
            .expect("continued");
        let id = |e: &str| e.split('"').nth(1).map(str::to_owned);
        assert_eq!(
            id(notice),
            id(continued),
            "an agent without ids keeps one message"
        );
        assert!(!notice.contains("acp-m1"));
    }

    #[test]
    fn a_title_that_is_a_name_names_the_tool_else_the_kind_does() {
        let named = |update: Value| tool_name(&update);
        assert_eq!(
            named(json!({"title": "get_weather", "kind": "execute"})),
            "get_weather"
        );
        assert_eq!(
            named(json!({"title": "mcp__github__search"})),
            "mcp__github__search"
        );
        assert_eq!(
            named(json!({"title": "Read a file", "kind": "read"})),
            "read"
        );
        assert_eq!(
            named(json!({"title": "rm -rf build/", "kind": "execute"})),
            "execute"
        );
        assert_eq!(named(json!({"title": "Read a file"})), "tool");
        assert_eq!(
            named(json!({"name": "search", "title": "get_weather"})),
            "search"
        );
        assert_eq!(named(json!({"title": "1st", "kind": "other"})), "other");
    }
}
