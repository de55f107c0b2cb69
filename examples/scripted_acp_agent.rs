//! A scripted Agent Client Protocol agent, built on the official SDK (agent side), for
//! exercising agui-serve's ACP backend without any model provider.
//!
//! It reads the prompt text and plays a script:
//!
//! | prompt | behaviour |
//! |---|---|
//! | anything else | `Echo: <text>` in two message chunks |
//! | `think` | a thought, then a message |
//! | `tool` | a tool call (pending, no status key) with input and locations, then its completion with text and a diff |
//! | `terminal` | a command run as a tool call (`kind: execute`, a display terminal) whose output comes in two pieces in `_meta.terminal_output`, its exit (status 0) in `_meta.terminal_exit`, then its completion with no content |
//! | `tools` | two tool calls, `call_1` (title `get_weather`, kind `execute`) and `call_2` (title `List the files`, kind `read`), each completed; the same ids every turn |
//! | `plan` | a plan of three entries |
//! | `usage` | a usage update, and the turn's token counts in the prompt's answer (100 in, 50 out, 150 in all, 10 thought, 20 cached) |
//! | `elicit` | asks for a form (`elicitation/create`: name, age, color) and reports the answer: `Form accepted: {...}`, `Form declined.` or `Form cancelled.` |
//! | `subagent` | a subagent (`researcher`) that runs, says something and sends a plan in its own session, and finishes; then a message |
//! | `subagent-fail` | a subagent that stops on an error |
//! | `settings` | `Mode: <mode>; model: <model>; fast_apply: <bool>; sets: <set_config_option requests so far>` |
//! | `misc` | commands, mode, config and session info updates, and one unknown update variant |
//! | `permission` | a tool call, then `session/request_permission`; reports what was chosen |
//! | `permission-later` | the same after 1 s |
//! | `permission-edit` | the same for an edit of `src/app.py` whose tool call carries its diff |
//! | `slow N` | N chunks 50 ms apart; honours `session/cancel`; a steering message that arrives meanwhile shows as `[steered: TEXT] ` in the next chunk |
//! | `pid` | `Pid: <this process's id>` |
//! | `late-title TITLE` | `Titled later.`, then 200 ms after the turn a session title update |
//! | `crash` | one chunk, a line on stderr, then exits with status 3 |
//! | `hog MIB` | holds MIB MiB of memory it has touched, then answers `Held MIB MiB` |
//! | `auth` | answers the prompt with error -32000 |
//! | `recall` | `Heard: <every prompt line this session received, joined by " | ">` |
//! | `blocks` | `Blocks: <the prompt's content blocks as JSON>` |
//! | `mcp TOOL JSON` | reports a tool call, then calls TOOL on the `frontend` MCP server it was given (streamable HTTP), and reports the result |
//! | `pwd` | `Cwd: <the session's working directory>` |
//! | `write NAME TEXT` | writes TEXT (and a newline) to NAME in the session's directory: `Wrote NAME` or `Write failed: ...` |
//! | `fill NAME BYTES` | writes BYTES zero bytes to NAME there |
//! | `symlink NAME TARGET` | makes NAME there a symlink to TARGET |
//! | `probe JSON` | tries what a prompt-injected agent tries and reports each outcome (`ok`, `denied`, `error: ...`) as `Probe: {...}`: `{"read":[paths],"list":[dirs],"write":[paths],"connect":["host:port"],"signal":[pids],"run":[[label,python code]]}` (relative paths are in the session's directory; each code runs under `/usr/bin/python3 -c` and its outcome is what it printed) |
//!
//! Prompts may carry audio and embedded resources (`promptCapabilities.audio` and
//! `embeddedContext`), and images only with `SCRIPTED_AGENT_IMAGES=1`.
//!
//! Modes `code` (current at first) and `plan`, and config options `model` (`fast` or
//! `smart`) and `fast_apply` (a boolean), are offered with every new session and can be
//! set (`session/set_mode`, `session/set_config_option`); an unknown mode or value is an
//! invalid-params error.
//!
//! Sessions can be loaded (`loadSession`): the history is kept in `$SCRIPTED_AGENT_STATE`
//! (a directory) when set, so a new process can replay it (a session it has no history of
//! is error -32002 there). With `SCRIPTED_AGENT_RESUME=1` it offers `session/resume`
//! instead of `session/load`. `session/close` and `session/delete` are offered and leave a
//! `<session>.closed` / `.deleted` marker there. `session/list` lists the sessions with a
//! history there (title: the first prompt), and `session/fork` copies a session's history
//! to a new session.
//!
//! Steering: `_session/steering` (advertised as `_meta.steering.supported`, unless
//! `SCRIPTED_AGENT_NO_STEERING` is set) hands its text to the session's running turn
//! (`{"outcome":"injected"}`), or answers `{"outcome":"promptRequired"}` with none running.
//!
//! Request log: with `SCRIPTED_AGENT_LOG=<path>`, a line is appended there for each
//! `initialize` (`initialize <pid>`), `session/new` (`new <session> <pid> <cwd> <the names
//! of its MCP servers, joined by commas>`), `session/load` (`load <session> <pid>`),
//! `session/prompt` (`prompt <session> <pid>`) and `session/close` (`close <session>
//! <pid>`), so a test can tell which requests a process got, and when.
//!
//! Authentication switch: with `SCRIPTED_AGENT_AUTH_FILE=<path>`, the agent advertises two
//! auth methods and, while that file exists, answers `session/new` with error -32000
//! (`SCRIPTED_AGENT_AUTH_AT=prompt`: answers `session/prompt` so instead). Removing the file
//! stands for adding credentials.
//!
//! Run: `cargo run --example scripted_acp_agent` (speaks ACP on stdin/stdout).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodAgent, CancelNotification, CloseSessionRequest,
    CloseSessionResponse, CreateElicitationRequest, DeleteSessionRequest, DeleteSessionResponse,
    ElicitationAction, ElicitationFormMode, ElicitationSchema, ElicitationSessionScope,
    ForkSessionRequest, ForkSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    IntegerPropertySchema, ListSessionsRequest, ListSessionsResponse, LoadSessionRequest,
    LoadSessionResponse, McpCapabilities, NewSessionRequest, NewSessionResponse, PermissionOption,
    PermissionOptionKind, PromptCapabilities, PromptRequest, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, ResumeSessionRequest,
    ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities, SessionConfigOption,
    SessionConfigOptionValue, SessionConfigSelectOption, SessionDeleteCapabilities,
    SessionForkCapabilities, SessionInfo, SessionListCapabilities, SessionMode, SessionModeState,
    SessionResumeCapabilities, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
    SetSessionModeRequest, SetSessionModeResponse, StopReason, StringPropertySchema,
    ToolCallUpdate, ToolCallUpdateFields, Usage,
};
use agent_client_protocol::{Agent, ByteStreams, Client, Error, UntypedMessage};
use serde_json::{Value, json};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

type Connection = agent_client_protocol::v1::ConnectionTo<Client>;

#[derive(Default)]
struct Shared {
    cancelled: Mutex<HashSet<String>>,
    /// session id -> the `mcpServers` it was given.
    mcp: Mutex<std::collections::HashMap<String, Value>>,
    /// session id -> every prompt line it received.
    heard: Mutex<std::collections::HashMap<String, Vec<String>>>,
    /// session id -> (mode, model, fast_apply).
    settings: Mutex<std::collections::HashMap<String, (String, String, bool)>>,
    /// session id -> how many `session/set_config_option` requests it got.
    config_sets: Mutex<std::collections::HashMap<String, usize>>,
    /// session id -> its working directory.
    cwds: Mutex<std::collections::HashMap<String, std::path::PathBuf>>,
    /// Sessions with a turn running.
    running: Mutex<HashSet<String>>,
    /// session id -> steering messages not yet taken by its running turn.
    steered: Mutex<std::collections::HashMap<String, Vec<String>>>,
}

impl Shared {
    fn cwd(&self, session: &str) -> std::path::PathBuf {
        self.cwds
            .lock()
            .ok()
            .and_then(|c| c.get(session).cloned())
            .unwrap_or_else(|| ".".into())
    }

    fn settings(&self, session: &str) -> (String, String, bool) {
        self.settings
            .lock()
            .ok()
            .and_then(|s| s.get(session).cloned())
            .unwrap_or_else(|| ("code".to_owned(), "fast".to_owned(), false))
    }
}

/// The file `permission-edit` proposes to change, before and after.
const EDIT_BEFORE: &str = "def greet():\n    return 'hi'\n\nprint(greet())\n";
const EDIT_AFTER: &str = "def greet(name):\n    return f'hi {name}'\n\nprint(greet('ops'))\n";

/// The modes a session offers (`code` first).
fn session_modes() -> SessionModeState {
    SessionModeState::new(
        "code",
        vec![
            SessionMode::new("code", "Code").description("Writes code".to_owned()),
            SessionMode::new("plan", "Plan"),
        ],
    )
}

fn config_options(model: &str, fast_apply: bool) -> Vec<SessionConfigOption> {
    vec![
        SessionConfigOption::select(
            "model",
            "Model",
            model.to_owned(),
            vec![
                SessionConfigSelectOption::new("fast", "Fast"),
                SessionConfigSelectOption::new("smart", "Smart"),
            ],
        ),
        SessionConfigOption::boolean("fast_apply", "Fast apply", fast_apply),
    ]
}

/// Whether the authentication switch says `at` (`new` or `prompt`) fails now.
fn auth_fails(at: &str) -> bool {
    let Some(file) = std::env::var_os("SCRIPTED_AGENT_AUTH_FILE") else {
        return false;
    };
    let configured = std::env::var("SCRIPTED_AGENT_AUTH_AT").unwrap_or_else(|_| "new".into());
    configured == at && std::path::Path::new(&file).exists()
}

fn auth_required() -> Error {
    Error::new(-32000, "Authentication required")
}

/// Sends one `session/update`. Updates are written as JSON on purpose: the script sends
/// shapes a typed build would not (an update variant no schema knows, a pending tool call
/// with no `status` key), to exercise the daemon's forward-compatible translation.
fn update(cx: &Connection, session: &str, update: Value) -> Result<(), Error> {
    cx.send_notification(UntypedMessage::new(
        "session/update",
        json!({"sessionId": session, "update": update}),
    )?)
}

fn chunk(cx: &Connection, session: &str, kind: &str, id: &str, text: &str) -> Result<(), Error> {
    update(
        cx,
        session,
        json!({"sessionUpdate": kind, "messageId": id, "content": {"type": "text", "text": text}}),
    )
}

/// The sessions with a history in `$SCRIPTED_AGENT_STATE`, oldest first.
fn listed_sessions(cwd: &str) -> Vec<SessionInfo> {
    let Some(dir) = std::env::var_os("SCRIPTED_AGENT_STATE") else {
        return Vec::new();
    };
    let mut sessions: Vec<(std::time::SystemTime, SessionInfo)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let session = name.strip_suffix(".jsonl")?.to_owned();
            let modified = entry.metadata().and_then(|m| m.modified()).ok()?;
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let title = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["role"] == "user")
                .and_then(|e| e["text"].as_str().map(str::to_owned));
            Some((modified, SessionInfo::new(session, cwd).title(title)))
        })
        .collect();
    sessions.sort_by_key(|(modified, _)| *modified);
    sessions.into_iter().map(|(_, info)| info).collect()
}

fn not_found(session: &str) -> Error {
    Error::new(-32002, "Resource not found").data(format!("no session {session}"))
}

fn history_path(session: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("SCRIPTED_AGENT_STATE")?;
    Some(std::path::Path::new(&dir).join(format!("{session}.jsonl")))
}

fn remember(session: &str, role: &str, text: &str) {
    if let Some(path) = history_path(session) {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{}", json!({"role": role, "text": text}));
        }
    }
}

/// Calls one tool on a streamable-HTTP MCP server, as an MCP client would.
async fn call_mcp(server: &Value, tool: &str, args: &Value) -> Result<String, String> {
    let url = server["url"].as_str().ok_or("no url")?;
    let auth = server["headers"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["name"] == "Authorization"))
        .and_then(|h| h["value"].as_str())
        .unwrap_or("")
        .to_owned();
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())?;
    let mut session_id: Option<String> = None;
    let mut post = async |body: Value| -> Result<Option<Value>, String> {
        let mut request = http
            .post(url)
            .header("authorization", &auth)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2025-06-18")
            .body(body.to_string());
        if let Some(id) = &session_id {
            request = request.header("mcp-session-id", id);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        if let Some(id) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            session_id = Some(id.to_owned());
        }
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("HTTP {status}: {text}"));
        }
        // A JSON body, or an SSE stream whose data lines carry the JSON-RPC messages.
        let messages: Vec<Value> = if text.trim_start().starts_with('{') {
            serde_json::from_str(&text).into_iter().collect()
        } else {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .collect()
        };
        Ok(messages
            .into_iter()
            .find(|m| m.get("result").is_some() || m.get("error").is_some()))
    };
    post(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "scripted-acp-agent", "version": "1.0.0"}}}),
    )
    .await?;
    post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
    let listed = post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await?;
    let shown = listed.clone().unwrap_or(Value::Null).to_string();
    let offered = listed
        .and_then(|l| l["result"]["tools"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|t| t["name"] == tool);
    if !offered {
        return Err(format!("tool {tool} not listed in {shown}"));
    }
    let called = post(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": tool, "arguments": args}}))
    .await?
    .ok_or("no answer")?;
    if let Some(error) = called.get("error") {
        return Err(error.to_string());
    }
    Ok(called["result"]["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n"))
}

fn mark(session: &str, what: &str) {
    if let Some(dir) = std::env::var_os("SCRIPTED_AGENT_STATE") {
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("{session}.{what}")),
            b"",
        );
    }
}

fn prompt_text(request: &PromptRequest) -> String {
    let value = serde_json::to_value(&request.prompt).unwrap_or(Value::Null);
    value
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

async fn play(
    cx: Connection,
    shared: Arc<Shared>,
    session: String,
    text: String,
    blocks: Value,
) -> Result<PromptResponse, Error> {
    // The last block is the user's message; earlier ones may be context.
    let command = text.lines().last().unwrap_or("").trim().to_owned();
    remember(&session, "user", &command);
    if let Ok(mut heard) = shared.heard.lock() {
        heard
            .entry(session.clone())
            .or_default()
            .extend(text.lines().map(str::to_owned));
    }
    let (head, rest) = command.split_once(' ').unwrap_or((command.as_str(), ""));
    let mid = format!("m-{}", uuid::Uuid::new_v4());
    match head {
        "think" => {
            chunk(
                &cx,
                &session,
                "agent_thought_chunk",
                &format!("t-{mid}"),
                "pondering",
            )?;
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                "Thought it through.",
            )?;
            remember(&session, "agent", "Thought it through.");
        }
        "tool" => {
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call-1", "title": "Read a file",
                    "kind": "read", "rawInput": {"path": "/src/main.rs"},
                    "locations": [{"path": "/src/main.rs", "line": 1}]
                }),
            )?;
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": "call-1", "status": "completed",
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": "fn main() {}"}},
                        {"type": "diff", "path": "/src/lib.rs", "oldText": "a", "newText": "b"}
                    ]
                }),
            )?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Read it.")?;
        }
        "terminal" => {
            let tool = |meta: Value, status: Option<&str>| {
                let mut body = json!({"sessionUpdate": "tool_call_update",
                    "toolCallId": "call-t", "_meta": meta});
                if let Some(status) = status {
                    body["status"] = json!(status);
                }
                body
            };
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call-t", "title": "echo one; echo two",
                    "kind": "execute", "status": "in_progress",
                    "rawInput": {"command": "echo one; echo two"},
                    "content": [{"type": "terminal", "terminalId": "call-t"}]
                }),
            )?;
            for piece in ["one\n", "two\n"] {
                let output = json!({"terminal_output": {"data": piece, "terminal_id": "call-t"}});
                update(&cx, &session, tool(output, None))?;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let exit =
                json!({"terminal_exit": {"exit_code": 0, "signal": null, "terminal_id": "call-t"}});
            update(&cx, &session, tool(exit, Some("completed")))?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Ran it.")?;
        }
        "tools" => {
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call_1", "title": "get_weather",
                    "kind": "execute", "status": "in_progress", "rawInput": {"city": "Paris"}
                }),
            )?;
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "sunny"}}]
                }),
            )?;
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call_2", "title": "List the files",
                    "kind": "read", "status": "in_progress", "rawInput": {"path": "/src"},
                    "locations": [{"path": "/src"}]
                }),
            )?;
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": "call_2", "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "main.rs"}}]
                }),
            )?;
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                "Used two tools.",
            )?;
        }
        "plan" => {
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "plan", "entries": [
                    {"content": "look", "priority": "high", "status": "completed"},
                    {"content": "change", "priority": "medium", "status": "in_progress"},
                    {"content": "test", "priority": "low", "status": "pending"}
                ]}),
            )?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Planned.")?;
        }
        "usage" => {
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "usage_update", "used": 1200, "size": 200000,
                "cost": {"amount": 0.01, "currency": "USD"}}),
            )?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Counted.")?;
            let usage = Usage::new(150, 100, 50)
                .thought_tokens(10)
                .cached_read_tokens(20);
            return Ok(PromptResponse::new(StopReason::EndTurn).usage(usage));
        }
        "elicit" => {
            let form = ElicitationSchema::new()
                .property(
                    "name",
                    StringPropertySchema::new()
                        .title("Name".to_owned())
                        .min_length(1),
                    true,
                )
                .property("age", IntegerPropertySchema::new().minimum(0), false)
                .property(
                    "color",
                    StringPropertySchema::new()
                        .enum_values(vec!["red".to_owned(), "blue".to_owned()]),
                    false,
                );
            let request = CreateElicitationRequest::new(
                ElicitationFormMode::new(ElicitationSessionScope::new(session.clone()), form),
                "Who are you?",
            );
            let response = cx.send_request(request).block_task().await?;
            let text = match response.action {
                ElicitationAction::Accept(accepted) => format!(
                    "Form accepted: {}",
                    serde_json::to_string(&accepted.content.unwrap_or_default())
                        .unwrap_or_default()
                ),
                ElicitationAction::Decline => "Form declined.".to_owned(),
                _ => "Form cancelled.".to_owned(),
            };
            chunk(&cx, &session, "agent_message_chunk", &mid, &text)?;
        }
        "subagent" | "subagent-fail" => {
            let child = format!("sub-{session}");
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "subagent_update", "sessionId": child,
                    "title": "researcher", "description": "looks things up",
                    "state": {"state": "running"}}),
            )?;
            chunk(
                &cx,
                &child,
                "agent_message_chunk",
                &format!("c-{mid}"),
                "Looking it up.",
            )?;
            update(
                &cx,
                &child,
                json!({"sessionUpdate": "plan", "entries": [
                    {"content": "search", "priority": "high", "status": "in_progress"}
                ]}),
            )?;
            let idle = if head == "subagent" {
                json!({"state": "idle", "stopReason": "end_turn"})
            } else {
                json!({"state": "idle", "stopReason": "error",
                    "error": {"code": -32603, "message": "the lookup failed"}})
            };
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "subagent_update", "sessionId": child, "state": idle}),
            )?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Subagent done.")?;
        }
        "settings" => {
            let (mode, model, fast_apply) = shared.settings(&session);
            let sets = shared
                .config_sets
                .lock()
                .map(|s| s.get(&session).copied().unwrap_or(0))
                .unwrap_or(0);
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                &format!("Mode: {mode}; model: {model}; fast_apply: {fast_apply}; sets: {sets}"),
            )?;
        }
        "misc" => {
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "available_commands_update",
                "availableCommands": [{"name": "review", "description": "review the change"}]}),
            )?;
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"}),
            )?;
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "session_info_update", "title": "A scripted session"}),
            )?;
            update(
                &cx,
                &session,
                json!({"sessionUpdate": "something_new", "detail": 42}),
            )?;
            chunk(&cx, &session, "agent_message_chunk", &mid, "Misc done.")?;
        }
        "permission" | "permission-later" | "permission-edit" => {
            if head == "permission-later" {
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
            let (title, call) = if head == "permission-edit" {
                let (old, new) = (EDIT_BEFORE, EDIT_AFTER);
                let call = json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call-p", "title": "Edit src/app.py",
                    "kind": "edit", "status": "pending",
                    "rawInput": {"path": "src/app.py", "old_string": old, "new_string": new},
                    "content": [{"type": "diff", "path": "src/app.py", "oldText": old, "newText": new}]
                });
                ("Edit src/app.py", call)
            } else {
                let call = json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call-p", "title": "Delete build/",
                    "kind": "delete", "status": "pending", "rawInput": {"path": "build/"}
                });
                ("Delete build/", call)
            };
            update(&cx, &session, call)?;
            let request = RequestPermissionRequest::new(
                session.clone(),
                ToolCallUpdate::new(
                    "call-p",
                    ToolCallUpdateFields::new().title(title.to_owned()),
                ),
                vec![
                    PermissionOption::new(
                        "yes-once",
                        "Allow once",
                        PermissionOptionKind::AllowOnce,
                    ),
                    PermissionOption::new(
                        "yes-always",
                        "Always allow",
                        PermissionOptionKind::AllowAlways,
                    ),
                    PermissionOption::new("no", "Reject", PermissionOptionKind::RejectOnce),
                ],
            );
            let response = cx.send_request(request).block_task().await?;
            let chosen = match response.outcome {
                RequestPermissionOutcome::Selected(selected) => {
                    Some(selected.option_id.to_string())
                }
                _ => None,
            };
            let verdict = match chosen.as_deref() {
                Some("yes-once" | "yes-always") => "allowed",
                Some(_) => "rejected",
                None => "cancelled",
            };
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": "call-p",
                    "status": if verdict == "allowed" { "completed" } else { "failed" },
                    "content": [{"type": "content", "content": {"type": "text", "text": verdict}}]
                }),
            )?;
            if verdict == "cancelled" {
                return Ok(PromptResponse::new(StopReason::Cancelled));
            }
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                &format!("Permission {verdict}."),
            )?;
        }
        "slow" => {
            let n: usize = rest.trim().parse().unwrap_or(10);
            for i in 1..=n {
                if shared
                    .cancelled
                    .lock()
                    .map(|c| c.contains(&session))
                    .unwrap_or(false)
                {
                    return Ok(PromptResponse::new(StopReason::Cancelled));
                }
                chunk(&cx, &session, "agent_message_chunk", &mid, &format!("{i} "))?;
                let steered = shared
                    .steered
                    .lock()
                    .map(|mut s| s.remove(&session).unwrap_or_default())
                    .unwrap_or_default();
                for text in steered {
                    remember(&session, "user", &text);
                    chunk(
                        &cx,
                        &session,
                        "agent_message_chunk",
                        &mid,
                        &format!("[steered: {text}] "),
                    )?;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        "pid" => {
            let pid = format!("Pid: {}", process_identity());
            chunk(&cx, &session, "agent_message_chunk", &mid, &pid)?;
        }
        "late-title" => {
            chunk(&cx, &session, "agent_message_chunk", &mid, "Titled later.")?;
            let (late, session, title) = (cx.clone(), session.clone(), rest.trim().to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = update(
                    &late,
                    &session,
                    json!({"sessionUpdate": "session_info_update", "title": title}),
                );
            });
        }
        "crash" => {
            chunk(&cx, &session, "agent_message_chunk", &mid, "about to fail")?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            eprintln!("fatal: the scripted agent crashed (token=abc123secret)");
            std::process::exit(3);
        }
        "auth" => {
            return Err(auth_required());
        }
        "hog" => {
            // Touches `rest` MiB of memory, page by page, then answers (if still alive).
            let mib: usize = rest.trim().parse().unwrap_or(0);
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..mib {
                held.push(vec![1u8; 1 << 20]);
            }
            let reply = format!("Held {} MiB", held.len());
            chunk(&cx, &session, "agent_message_chunk", &mid, &reply)?;
        }
        "pwd" | "write" | "fill" | "symlink" | "probe" => {
            let reply = files(&shared.cwd(&session), head, rest);
            chunk(&cx, &session, "agent_message_chunk", &mid, &reply)?;
        }
        "recall" => {
            let heard = shared
                .heard
                .lock()
                .map(|h| h.get(&session).cloned().unwrap_or_default())
                .unwrap_or_default();
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                &format!("Heard: {}", heard.join(" | ")),
            )?;
        }
        "blocks" => {
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                &format!("Blocks: {blocks}"),
            )?;
        }
        "mcp" => {
            let (tool, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
            let args: Value = serde_json::from_str(args).unwrap_or(json!({}));
            let servers = shared
                .mcp
                .lock()
                .ok()
                .and_then(|m| m.get(&session).cloned())
                .unwrap_or(Value::Null);
            let server = servers
                .as_array()
                .and_then(|list| list.iter().find(|s| s["name"] == "frontend"))
                .cloned();
            let Some(server) = server else {
                chunk(
                    &cx,
                    &session,
                    "agent_message_chunk",
                    &mid,
                    "No frontend MCP server.",
                )?;
                return Ok(PromptResponse::new(StopReason::EndTurn));
            };
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call", "toolCallId": "call-mcp", "title": format!("mcp__frontend__{tool}"),
                    "kind": "other", "status": "in_progress", "rawInput": args
                }),
            )?;
            let text = match call_mcp(&server, tool, &args).await {
                Ok(text) => text,
                Err(error) => format!("MCP error: {error}"),
            };
            update(
                &cx,
                &session,
                json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": "call-mcp", "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": text}}]
                }),
            )?;
            chunk(
                &cx,
                &session,
                "agent_message_chunk",
                &mid,
                &format!("MCP {tool} returned: {text}"),
            )?;
        }
        _ => {
            chunk(&cx, &session, "agent_message_chunk", &mid, "Echo: ")?;
            chunk(&cx, &session, "agent_message_chunk", &mid, &command)?;
            remember(&session, "agent", &format!("Echo: {command}"));
        }
    }
    Ok(PromptResponse::new(StopReason::EndTurn))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let shared = Arc::new(Shared::default());
    let on_cancel = shared.clone();
    let on_steer = shared.clone();
    let on_prompt = shared.clone();
    let on_new = shared.clone();
    let on_load = shared.clone();
    let on_resume = shared.clone();
    let on_mode = shared.clone();
    let on_config = shared.clone();
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    Agent
        .v1()
        .name("scripted-acp-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                log_request(&format!("initialize {}", process_identity()));
                let resume = std::env::var("SCRIPTED_AGENT_RESUME").is_ok_and(|v| v == "1");
                let auth_methods = if std::env::var_os("SCRIPTED_AGENT_AUTH_FILE").is_some() {
                    vec![
                        AuthMethod::Agent(
                            AuthMethodAgent::new("scripted-key", "API key").description(
                                "Set SCRIPTED_KEY in the agent's environment".to_owned(),
                            ),
                        ),
                        AuthMethod::Agent(
                            AuthMethodAgent::new("oauth-personal", "Log in with a browser")
                                .description(
                                    "Run the agent once in a terminal and log in".to_owned(),
                                ),
                        ),
                    ]
                } else {
                    Vec::new()
                };
                let mut sessions = SessionCapabilities::new()
                    .close(SessionCloseCapabilities::new())
                    .delete(SessionDeleteCapabilities::new())
                    .list(SessionListCapabilities::new())
                    .fork(SessionForkCapabilities::new());
                if resume {
                    sessions = sessions.resume(SessionResumeCapabilities::new());
                }
                let capabilities = AgentCapabilities::new()
                    .load_session(!resume)
                    .prompt_capabilities(
                        PromptCapabilities::new()
                            .image(
                                std::env::var_os("SCRIPTED_AGENT_IMAGES").is_some_and(|v| v == "1"),
                            )
                            .audio(true)
                            .embedded_context(true),
                    )
                    .mcp_capabilities(McpCapabilities::new().http(true))
                    .session_capabilities(sessions);
                let steering = std::env::var_os("SCRIPTED_AGENT_NO_STEERING").is_none();
                let meta = json!({"steering": {"supported": steering}});
                let response = InitializeResponse::new(request.protocol_version)
                    .meta(meta.as_object().cloned())
                    .agent_capabilities(capabilities)
                    .auth_methods(auth_methods)
                    .agent_info(Implementation::new("scripted-acp-agent", "1.0.0"));
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                if auth_fails("new") {
                    return responder.respond_with_error(auth_required());
                }
                let id = format!("sess-{}", uuid::Uuid::new_v4());
                let servers = serde_json::to_value(&request.mcp_servers).unwrap_or(Value::Null);
                let names: Vec<&str> = servers
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["name"].as_str())
                    .collect();
                log_request(&format!(
                    "new {id} {} {} {}",
                    process_identity(),
                    request.cwd.display(),
                    names.join(",")
                ));
                if let Some(dir) = std::env::var_os("SCRIPTED_AGENT_STATE") {
                    let path = std::path::Path::new(&dir).join(format!("{id}.mcp.json"));
                    let _ = std::fs::write(path, servers.to_string());
                }
                if let Ok(mut mcp) = on_new.mcp.lock() {
                    mcp.insert(id.clone(), servers);
                }
                if let Ok(mut cwds) = on_new.cwds.lock() {
                    cwds.insert(id.clone(), request.cwd.clone());
                }
                // A session exists from now on, with an empty history.
                if let Some(path) = history_path(&id) {
                    let _ = std::fs::write(path, b"");
                }
                let response = NewSessionResponse::new(id)
                    .modes(session_modes())
                    .config_options(config_options("fast", false));
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: Connection| {
                let session = request.session_id.to_string();
                log_request(&format!("load {session} {}", process_identity()));
                if let Ok(mut cwds) = on_load.cwds.lock() {
                    cwds.insert(session.clone(), request.cwd.clone());
                }
                if let Some(path) = history_path(&session)
                    && !path.exists()
                {
                    return responder.respond_with_error(not_found(&session));
                }
                // Replay the history before answering, as the protocol asks.
                if let Some(path) = history_path(&session)
                    && let Ok(text) = std::fs::read_to_string(path)
                {
                    for line in text.lines() {
                        let entry: Value = serde_json::from_str(line).unwrap_or(Value::Null);
                        let kind = if entry["role"] == "user" {
                            "user_message_chunk"
                        } else {
                            "agent_message_chunk"
                        };
                        let id = format!("r-{}", uuid::Uuid::new_v4());
                        chunk(
                            &cx,
                            &session,
                            kind,
                            &id,
                            entry["text"].as_str().unwrap_or(""),
                        )?;
                    }
                }
                let response = LoadSessionResponse::new();
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ResumeSessionRequest, responder, _cx| {
                if let Ok(mut cwds) = on_resume.cwds.lock() {
                    cwds.insert(request.session_id.to_string(), request.cwd.clone());
                }
                let response = ResumeSessionResponse::new();
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, cx: Connection| {
                let session = request.session_id.to_string();
                let mode = request.mode_id.to_string();
                log_request(&format!("set_mode {session} {mode}"));
                if mode != "code" && mode != "plan" {
                    return responder.respond_with_error(
                        Error::invalid_params().data(format!("no mode {mode}")),
                    );
                }
                if let Ok(mut settings) = on_mode.settings.lock() {
                    let entry = settings
                        .entry(session.clone())
                        .or_insert_with(|| ("code".to_owned(), "fast".to_owned(), false));
                    entry.0 = mode.clone();
                }
                update(
                    &cx,
                    &session,
                    json!({"sessionUpdate": "current_mode_update", "currentModeId": mode}),
                )?;
                responder.respond(SetSessionModeResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionConfigOptionRequest, responder, _cx| {
                let session = request.session_id.to_string();
                if let Ok(mut sets) = on_config.config_sets.lock() {
                    *sets.entry(session.clone()).or_default() += 1;
                }
                let (mut model, mut fast_apply) = {
                    let (_, model, fast_apply) = on_config.settings(&session);
                    (model, fast_apply)
                };
                match (request.config_id.to_string().as_str(), &request.value) {
                    ("model", SessionConfigOptionValue::ValueId { value })
                        if ["fast", "smart"].contains(&value.to_string().as_str()) =>
                    {
                        model = value.to_string();
                    }
                    ("fast_apply", SessionConfigOptionValue::Boolean { value }) => {
                        fast_apply = *value;
                    }
                    (id, _) => {
                        return responder.respond_with_error(
                            Error::invalid_params().data(format!("bad value for {id}")),
                        );
                    }
                }
                if let Ok(mut settings) = on_config.settings.lock() {
                    let entry = settings
                        .entry(session)
                        .or_insert_with(|| ("code".to_owned(), "fast".to_owned(), false));
                    entry.1 = model.clone();
                    entry.2 = fast_apply;
                }
                let response =
                    SetSessionConfigOptionResponse::new(config_options(&model, fast_apply));
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| {
                let cwd = request
                    .cwd
                    .map_or_else(|| "/".to_owned(), |c| c.display().to_string());
                let response = ListSessionsResponse::new(listed_sessions(&cwd));
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ForkSessionRequest, responder, _cx| {
                let source = request.session_id.to_string();
                let Some(from) = history_path(&source).filter(|p| p.exists()) else {
                    return responder.respond_with_error(not_found(&source));
                };
                let id = format!("sess-{}", uuid::Uuid::new_v4());
                let Some(to) = history_path(&id) else {
                    return responder.respond_with_error(not_found(&source));
                };
                if std::fs::copy(from, to).is_err() {
                    return responder.respond_with_error(not_found(&source));
                }
                let response = ForkSessionResponse::new(id)
                    .modes(session_modes())
                    .config_options(config_options("fast", false));
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest, responder, _cx| {
                log_request(&format!(
                    "close {} {}",
                    request.session_id,
                    process_identity()
                ));
                mark(&request.session_id.to_string(), "closed");
                let response = CloseSessionResponse::new();
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: DeleteSessionRequest, responder, _cx| {
                mark(&request.session_id.to_string(), "deleted");
                let response = DeleteSessionResponse::new();
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: Connection| {
                let session = request.session_id.to_string();
                log_request(&format!("prompt {session} {}", process_identity()));
                let text = prompt_text(&request);
                let blocks = serde_json::to_value(&request.prompt).unwrap_or(Value::Null);
                let shared = on_prompt.clone();
                if let Ok(mut cancelled) = shared.cancelled.lock() {
                    cancelled.remove(&session);
                }
                if auth_fails("prompt") {
                    return responder.respond_with_error(auth_required());
                }
                let worker = cx.clone();
                if let Ok(mut running) = shared.running.lock() {
                    running.insert(session.clone());
                }
                cx.spawn(async move {
                    let played = play(worker, shared.clone(), session.clone(), text, blocks).await;
                    if let Ok(mut running) = shared.running.lock() {
                        running.remove(&session);
                    }
                    match played {
                        Ok(response) => responder.respond(response),
                        Err(error) => responder.respond_with_error(error),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                if let Ok(mut cancelled) = on_cancel.cancelled.lock() {
                    cancelled.insert(notification.session_id.to_string());
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: UntypedMessage, responder, _cx| {
                if request.method != "_session/steering" {
                    return responder.respond_with_error(Error::method_not_found());
                }
                responder.respond(steer(&on_steer, &request.params))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await
}

/// `_session/steering`: the prompt's text handed to the session's running turn
/// (`injected`); with no turn running, `promptRequired` when the request opts in.
fn steer(shared: &Shared, params: &Value) -> Value {
    let session = params["sessionId"].as_str().unwrap_or_default().to_owned();
    let text: Vec<&str> = params["prompt"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect();
    log_request(&format!("steer {session} {}", process_identity()));
    let running = shared
        .running
        .lock()
        .map(|r| r.contains(&session))
        .unwrap_or(false);
    if !running {
        return json!({"outcome": "promptRequired", "reason": "noRunningTurn"});
    }
    if let Ok(mut steered) = shared.steered.lock() {
        steered.entry(session).or_default().push(text.join("\n"));
    }
    json!({"outcome": "injected"})
}

/// Appends `line` to `$SCRIPTED_AGENT_LOG`, when set.
fn log_request(line: &str) {
    use std::io::Write;
    let Some(path) = std::env::var_os("SCRIPTED_AGENT_LOG") else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// The file commands (`pwd`, `write`, `fill`, `symlink`, `probe`) in the session's `cwd`.
fn files(cwd: &std::path::Path, command: &str, rest: &str) -> String {
    let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    let outcome = |result: std::io::Result<()>, done: String| match result {
        Ok(()) => done,
        Err(error) => format!("Write failed: {error}"),
    };
    match command {
        "pwd" => format!("Cwd: {}", cwd.display()),
        "write" => outcome(
            std::fs::write(cwd.join(name), format!("{arg}\n")),
            format!("Wrote {name}"),
        ),
        "fill" => {
            let bytes: usize = arg.trim().parse().unwrap_or(0);
            outcome(
                std::fs::write(cwd.join(name), vec![0u8; bytes]),
                format!("Wrote {name}"),
            )
        }
        "symlink" => outcome(
            std::os::unix::fs::symlink(arg, cwd.join(name)),
            format!("Linked {name}"),
        ),
        _ => format!("Probe: {}", probe(cwd, rest)),
    }
}

/// Tries each access `plan` names; `{"read:PATH": "ok" | "denied" | "error: ...", ...}`.
fn probe(cwd: &std::path::Path, plan: &str) -> Value {
    let plan: Value = serde_json::from_str(plan).unwrap_or(Value::Null);
    let items = |key: &str| -> Vec<String> {
        plan[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let verdict = |result: std::io::Result<()>| match result {
        Ok(()) => "ok".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => "denied".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    let mut out = serde_json::Map::new();
    for path in items("read") {
        let result = std::fs::read(cwd.join(&path)).map(drop);
        out.insert(format!("read:{path}"), json!(verdict(result)));
    }
    for path in items("list") {
        let result = std::fs::read_dir(cwd.join(&path)).map(drop);
        out.insert(format!("list:{path}"), json!(verdict(result)));
    }
    for path in items("write") {
        let result = std::fs::write(cwd.join(&path), b"probe");
        out.insert(format!("write:{path}"), json!(verdict(result)));
    }
    for address in items("connect") {
        let result = address
            .parse::<std::net::SocketAddr>()
            .map_err(std::io::Error::other)
            .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)))
            .map(drop);
        out.insert(format!("connect:{address}"), json!(verdict(result)));
    }
    // `"run": [[label, code], ...]`: each code run by `/usr/bin/python3 -c`, its outcome
    // what it printed (the caller's code prints `ok`, `denied` or `error: ...`).
    for entry in plan["run"].as_array().into_iter().flatten() {
        let (Some(label), Some(code)) = (entry[0].as_str(), entry[1].as_str()) else {
            continue;
        };
        let outcome = match std::process::Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(code)
            .current_dir(cwd)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            }
            Ok(out) => format!(
                "error: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(error) => format!("error: {error}"),
        };
        out.insert(format!("run:{label}"), json!(outcome));
    }
    for pid in items("signal") {
        let result = pid
            .parse::<i32>()
            .map_err(std::io::Error::other)
            .and_then(|pid| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
            });
        out.insert(format!("signal:{pid}"), json!(verdict(result)));
    }
    Value::Object(out)
}

/// This process, named so no other process of the agent has the name, in any PID
/// namespace (under bwrap each process is pid 2 or so of its own): its pid and the time it
/// started.
fn process_identity() -> String {
    static IDENTITY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            let started = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{}.{started}", std::process::id())
        })
        .clone()
}
