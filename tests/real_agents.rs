//! The real Claude Code and Codex adapters, from npm at the versions `scripts/test.sh`
//! pins, driven through the daemon by a scripted model API on loopback
//! (`support/scripted_model.rs`). Ignored by a bare `cargo test` (they need the adapters
//! and node); `scripts/test.sh` installs the adapters into `target/tools/real-agents` and
//! runs them with `--ignored`, `AGUI_REAL_AGENTS` naming that folder.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agui_serve::config::{AcpConfig, AgentConfig, AgentKind, Config, Hitl, Permissions};
use agui_serve::egress::{Relay, RelayConfig};
use serde_json::{Value, json};
use support::probe::key_file;
use support::scripted_model::{ScriptedModel, Step};
use support::*;

/// The folder holding the adapters' `node_modules` (`AGUI_REAL_AGENTS`).
fn tools() -> PathBuf {
    let dir = std::env::var_os("AGUI_REAL_AGENTS")
        .map(PathBuf::from)
        .expect("AGUI_REAL_AGENTS names the folder scripts/test.sh installs the adapters into");
    assert!(
        dir.join("node_modules/.bin/claude-agent-acp").exists(),
        "{} holds no claude-agent-acp",
        dir.display()
    );
    dir
}

/// The operator's key for the scripted model: the relays add it; no agent is given it.
const MODEL_KEY: &str = "sk-operator-scripted-5f3c2a";

/// A relay to the scripted model at `path` (its API's prefix), with [`MODEL_KEY`] in
/// `header`, its address in the agent's `base_url_env`.
fn relay_to(
    model: &ScriptedModel,
    path: &str,
    header: &str,
    base_url_env: &str,
    placeholder_env: &str,
) -> Arc<Relay> {
    let config = RelayConfig {
        upstream: format!("{}{path}", model.url),
        header: header.to_owned(),
        secret_file: key_file(&format!("real-{base_url_env}"), MODEL_KEY),
        base_url_env: base_url_env.to_owned(),
        placeholder_env: Some(placeholder_env.to_owned()),
    };
    Arc::new(Relay::new(&config).expect("relay"))
}

/// Claude Code as docs/agents.md recommends: its model reached through a relay (the key
/// added outside its sandbox), no port of the host's, no other host.
fn claude(model: &ScriptedModel, workspaces: &Path, permissions: Permissions) -> AgentConfig {
    let tools = tools();
    let mut env = std::collections::BTreeMap::new();
    for (name, value) in [
        ("IS_SANDBOX", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ] {
        env.insert(name.to_owned(), value.to_owned());
    }
    AgentConfig {
        name: "claude".to_owned(),
        description: "Claude Code".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(AcpConfig {
            env,
            permissions,
            // Claude Code starts sessions in `auto`, which asks nobody.
            session_defaults: json!({"mode": "default"}),
            workspace: Some(agui_serve::workspace::WorkspaceConfig {
                source: agui_serve::workspace::Source::Empty,
                root: workspaces.to_owned(),
                quota: None,
                unit: agui_serve::workspace::Unit::Thread,
                checkpoints: agui_serve::workspace::DEFAULT_CHECKPOINTS,
            }),
            sandbox: agui_serve::confine::Sandbox {
                read: vec![tools.clone()],
                ..Default::default()
            },
            relays: vec![relay_to(
                model,
                "",
                "x-api-key",
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
            )],
            ..AcpConfig::new(vec![
                tools
                    .join("node_modules/.bin/claude-agent-acp")
                    .to_str()
                    .expect("utf8")
                    .to_owned(),
            ])
        }),
    }
}

/// Codex on the scripted model as a custom model provider reached through a relay (the
/// key added outside its sandbox; Codex's `config.toml` names the relay's address, the
/// first relay's in an agent's network, `127.0.0.1:4180`), in the mode that asks the
/// person before a command leaves its own sandbox. Its `config.toml` is in a `CODEX_HOME`
/// of its own.
fn codex(model: &ScriptedModel, workspaces: &Path, home: &Path) -> AgentConfig {
    let tools = tools();
    std::fs::create_dir_all(home).expect("codex home");
    std::fs::write(
        home.join("config.toml"),
        r#"model = "gpt-5.5"
model_provider = "scripted"
check_for_update_on_startup = false

[model_providers.scripted]
name = "Scripted"
base_url = "http://127.0.0.1:4180"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
"#,
    )
    .expect("config.toml");
    let mut env = std::collections::BTreeMap::new();
    for (name, value) in [
        ("CODEX_HOME", home.to_str().expect("utf8")),
        ("INITIAL_AGENT_MODE", "workspace-write"),
        ("NO_BROWSER", "1"),
    ] {
        env.insert(name.to_owned(), value.to_owned());
    }
    AgentConfig {
        name: "codex".to_owned(),
        description: "Codex".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(AcpConfig {
            env,
            workspace: Some(agui_serve::workspace::WorkspaceConfig {
                source: agui_serve::workspace::Source::Empty,
                root: workspaces.to_owned(),
                quota: None,
                unit: agui_serve::workspace::Unit::Thread,
                checkpoints: agui_serve::workspace::DEFAULT_CHECKPOINTS,
            }),
            sandbox: agui_serve::confine::Sandbox {
                read: vec![tools.clone()],
                write: vec![home.to_owned()],
                ..Default::default()
            },
            relays: vec![relay_to(
                model,
                "/v1",
                "authorization",
                "OPENAI_BASE_URL",
                "OPENAI_API_KEY",
            )],
            ..AcpConfig::new(vec![
                tools
                    .join("node_modules/.bin/codex-acp")
                    .to_str()
                    .expect("utf8")
                    .to_owned(),
            ])
        }),
    }
}

/// Codex as docs/agents.md recommends under the daemon: its commands run in the daemon's
/// sandbox (mode `agent-full-access`), since its own (bubblewrap, or Landlock) cannot nest
/// inside it.
fn codex_in_our_sandbox(model: &ScriptedModel, workspaces: &Path, home: &Path) -> AgentConfig {
    let mut agent = codex(model, workspaces, home);
    agent.name = "codex-full".to_owned();
    if let AgentKind::Acp(acp) = &mut agent.kind {
        acp.env.insert(
            "INITIAL_AGENT_MODE".to_owned(),
            "agent-full-access".to_owned(),
        );
    }
    agent
}

async fn server(model: &ScriptedModel, data: &Path) -> TestServer {
    let (workspaces, d) = (data.join("workspaces"), data.to_owned());
    let mut allowing = claude(model, &workspaces, Permissions::Allow);
    allowing.name = "claude-allow".to_owned();
    // The same under bwrap: a network namespace of its own, the model's port forwarded.
    let mut namespaced = claude(model, &workspaces, Permissions::Allow);
    namespaced.name = "claude-bwrap".to_owned();
    if let AgentKind::Acp(acp) = &mut namespaced.kind {
        acp.confinement = Some(agui_serve::confine::Confinement::Bwrap);
    }
    // A budget of a few hundred tokens, asked about when reached.
    let mut tight = claude(model, &workspaces, Permissions::Allow);
    tight.name = "claude-tight".to_owned();
    tight.hitl = Hitl::Interrupt;
    tight.budget = Some(agui_serve::budget::Limits {
        tokens: Some(300),
        ..Default::default()
    });
    let agents = vec![
        claude(model, &workspaces, Permissions::Ask),
        allowing,
        namespaced,
        tight,
        // Outside the data directory, which a confined agent cannot reach.
        codex(model, &workspaces, &temp_dir("codex-home")),
        codex_in_our_sandbox(model, &workspaces, &temp_dir("codex-full-home")),
    ];
    TestServer::with(move |c: &mut Config| {
        c.agents = agents;
        c.data_dir = d;
        c.stall_timeout = Duration::from_secs(120);
    })
    .await
}

async fn run_on(server: &TestServer, agent: &str, body: &Value) -> Vec<SseFrame> {
    let response = post_run(server, agent, body).await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    frames
}

/// A conversation as a client keeps it: every message so far, resent with each run.
struct Conversation {
    agent: &'static str,
    thread: String,
    messages: Vec<Value>,
    runs: usize,
}

impl Conversation {
    fn new(thread: &str) -> Conversation {
        Conversation {
            agent: "claude",
            thread: thread.to_owned(),
            messages: Vec::new(),
            runs: 0,
        }
    }

    fn body(&mut self) -> Value {
        self.runs += 1;
        json!({"threadId": self.thread, "runId": format!("{}-r{}", self.thread, self.runs),
               "protocolVersion": "1.0", "messages": self.messages})
    }

    /// A run with a new user message.
    async fn say(&mut self, server: &TestServer, text: &str) -> Vec<SseFrame> {
        let id = format!("{}-u{}", self.thread, self.messages.len());
        self.messages
            .push(json!({"id": id, "role": "user", "content": text}));
        let body = self.body();
        run_on(server, self.agent, &body).await
    }

    /// A run answering the permission request `asked` (the frames that asked) with the
    /// option of kind `kind`.
    async fn answer(
        &mut self,
        server: &TestServer,
        asked: &[SseFrame],
        kind: &str,
    ) -> Vec<SseFrame> {
        let perm = permission_call_id(asked);
        let n = self.messages.len();
        self.messages.push(
            json!({"id": format!("{}-a{n}", self.thread), "role": "assistant",
            "toolCalls": [{"id": perm, "type": "function",
                "function": {"name": "agui_permission_request", "arguments": "{}"}}]}),
        );
        self.messages.push(
            json!({"id": format!("{}-t{n}", self.thread), "role": "tool",
            "toolCallId": perm, "content": json!({"optionId": kind}).to_string()}),
        );
        let body = self.body();
        run_on(server, self.agent, &body).await
    }
}

/// The arguments of the permission request on a stream.
fn permission_args(frames: &[SseFrame]) -> Value {
    let id = permission_call_id(frames);
    let args: String = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == id.as_str())
        .filter_map(|f| f.data["delta"].as_str())
        .collect();
    serde_json::from_str(&args).expect("JSON arguments")
}

/// The arguments a tool call carried on a stream, parsed.
fn call_args(frames: &[SseFrame], id: &str) -> Value {
    let args: String = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == id)
        .filter_map(|f| f.data["delta"].as_str())
        .collect();
    serde_json::from_str(&args).unwrap_or_else(|_| panic!("{id}: arguments {args:?}"))
}

/// The tool results the model was sent in its newest request of script `marker`.
fn results_sent(model: &ScriptedModel, marker: &str) -> Vec<Value> {
    let requests = model.scripted_requests(marker);
    let last = requests.last().expect("a request");
    last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|part| part["type"] == "tool_result")
        .cloned()
        .collect()
}

fn text_of_result(result: &Value) -> String {
    match &result["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn only<'a>(frames: &'a [SseFrame], kind: &str) -> &'a SseFrame {
    let found: Vec<&SseFrame> = frames.iter().filter(|f| f.kind() == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}: {frames:#?}");
    found[0]
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_asks_with_the_input_then_writes_then_runs_a_command() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-write",
        vec![
            Step::Tool(
                "Write".to_owned(),
                json!({"file_path": "{cwd}/notes.txt", "content": "hello from claude\n"}),
            ),
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "echo bye >> notes.txt && wc -c notes.txt", "description": "Add a line"}),
            ),
            Step::Say("All done.".to_owned()),
        ],
    );
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let mut chat = Conversation::new("w");

    // The Write is asked about with what it writes, not "{}".
    let asked = chat.say(&server, "task-write: write notes").await;
    let args = permission_args(&asked);
    let write_id = args["toolCallId"].as_str().expect("toolCallId").to_owned();
    assert_eq!(args["title"], "Write notes.txt");
    assert_eq!(args["toolCall"]["name"], "Write");
    assert_eq!(args["toolCall"]["input"]["content"], "hello from claude\n");
    assert_eq!(
        args["toolCall"]["diff"][0]["newText"], "hello from claude\n",
        "the approval carries the diff: {args}"
    );
    let input = call_args(&asked, &write_id);
    assert!(
        input["file_path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/notes.txt")),
        "the call's arguments are its settled input: {input}"
    );
    let details = asked
        .iter()
        .find(|f| f.kind() == "CUSTOM" && f.data["name"] == "acp.tool_call")
        .expect("details");
    assert_eq!(details.data["value"]["title"], "Write notes.txt");
    assert_eq!(
        asked
            .iter()
            .filter(|f| f.kind() == "TOOL_CALL_START" && f.data["toolCallId"] == write_id.as_str())
            .count(),
        1
    );
    let diff = asked
        .iter()
        .find(|f| f.kind() == "ACTIVITY_SNAPSHOT" && f.data["activityType"] == "diff")
        .expect("the diff as an activity");
    assert_eq!(diff.data["content"]["toolCallId"], write_id.as_str());
    assert_eq!(diff.data["content"]["newText"], "hello from claude\n");

    // Allowed: written, then the command asked about.
    let asked = chat.answer(&server, &asked, "allow_once").await;
    let file = std::fs::read_dir(data.join("workspaces/claude/_operator/threads"))
        .expect("workspaces")
        .filter_map(Result::ok)
        .map(|e| e.path().join("notes.txt"))
        .find(|p| p.exists())
        .expect("notes.txt written in the thread's workspace");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "hello from claude\n"
    );
    let result = asked
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT" && f.data["toolCallId"] == write_id.as_str())
        .expect("the write's result");
    let said = result.data["content"].as_str().expect("text");
    assert!(
        said.contains("File created") && said.contains("+hello from claude"),
        "the result carries the agent's words and the diff: {said}"
    );
    let args = permission_args(&asked);
    assert_eq!(args["toolCall"]["name"], "Bash");
    assert_eq!(
        args["toolCall"]["input"]["command"],
        "echo bye >> notes.txt && wc -c notes.txt"
    );

    // Allowed: the command's output comes back, and the answer.
    let done = chat.answer(&server, &asked, "allow_once").await;
    let bash_id = args["toolCallId"].as_str().expect("id");
    let output = done
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT" && f.data["toolCallId"] == bash_id)
        .expect("the command's result");
    assert!(
        output.data["content"]
            .as_str()
            .expect("text")
            .contains("22 notes.txt"),
        "{}",
        output.data
    );
    assert_eq!(text_of(&done).trim(), "All done.");
    assert!(only(&done, "RUN_FINISHED").data.get("outcome").is_none());

    // The model was sent both results.
    let sent = results_sent(&model, "task-write");
    assert_eq!(sent.len(), 2, "{sent:#?}");
    assert!(text_of_result(&sent[0]).contains("notes.txt"));
    assert!(text_of_result(&sent[1]).contains("22 notes.txt"));

    // The transcript keeps the settled input, as JSON.
    let transcript = get_json(&server, "/threads/w/messages").await.1["messages"].clone();
    let write = transcript
        .as_array()
        .expect("messages")
        .iter()
        .flat_map(|m| m["toolCalls"].as_array().cloned().unwrap_or_default())
        .find(|c| c["id"] == write_id.as_str())
        .expect("the write in the transcript");
    let stored: Value =
        serde_json::from_str(write["function"]["arguments"].as_str().expect("arguments"))
            .expect("JSON arguments");
    assert_eq!(stored["content"], "hello from claude\n");
    assert_every_client_call_answered(&transcript);
    // A write is filed once, as an edit (and the command that named the file as a command).
    let state = apply_state(&done, None).expect("state");
    let actions: Vec<&str> = state["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["action"].as_str())
        .collect();
    assert_eq!(actions, ["edit", "execute"], "{state}");
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_is_told_a_person_refused() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-refuse",
        vec![
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "touch refused.txt", "description": "Make a file"}),
            ),
            Step::Say("Understood.".to_owned()),
        ],
    );
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let mut chat = Conversation::new("d");
    let asked = chat.say(&server, "task-refuse: make a file").await;
    let done = chat.answer(&server, &asked, "reject_once").await;
    assert_eq!(text_of(&done).trim(), "Understood.");
    let sent = results_sent(&model, "task-refuse");
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let said = text_of_result(&sent[0]);
    assert_eq!(sent[0]["is_error"], true);
    assert!(
        !said.to_lowercase().contains("abort"),
        "a refusal is not an aborted tool use: {said}"
    );
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn codex_streams_a_commands_output_after_approval() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-shell",
        vec![
            Step::Tool(
                "exec_command".to_owned(),
                json!({"cmd": "echo one; sleep 1; echo two; sleep 1; echo three", "yield_time_ms": 10000,
                       "sandbox_permissions": "require_escalated",
                       "justification": "to print two lines"}),
            ),
            Step::Say("The command printed two lines.".to_owned()),
        ],
    );
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let mut chat = Conversation::new("c");
    chat.agent = "codex";
    let asked = chat.say(&server, "task-shell: run the command").await;
    let args = permission_args(&asked);
    let call = args["toolCallId"].as_str().expect("id").to_owned();
    assert_eq!(
        args["toolCall"]["input"]["command"],
        "echo one; sleep 1; echo two; sleep 1; echo three"
    );
    let done = chat.answer(&server, &asked, "allow_once").await;
    // Through its relay: every request the model got carried the operator's key.
    for request in model.requests() {
        assert_eq!(
            request.credential,
            Some(format!("Bearer {MODEL_KEY}")),
            "{}",
            request.path
        );
    }
    let terminal: Vec<&SseFrame> = done
        .iter()
        .filter(|f| f.data["activityType"] == "terminal")
        .collect();
    // Shown as it ran: a first state, changes as lines come, then how it ended. (Codex
    // may leave out output printed at once after the approval: the first line is not
    // asserted.)
    assert_eq!(
        terminal.first().expect("output").kind(),
        "ACTIVITY_SNAPSHOT"
    );
    assert_eq!(terminal[0].data["content"]["toolCallId"], call.as_str());
    assert_eq!(terminal[0].data["content"]["exit"], Value::Null);
    assert!(
        terminal
            .iter()
            .any(|f| f.kind() == "ACTIVITY_DELTA" && f.data["patch"][0]["value"] == "three\n"),
        "{terminal:#?}"
    );
    let last = terminal.last().expect("end");
    assert_eq!(last.kind(), "ACTIVITY_SNAPSHOT");
    assert_eq!(last.data["content"]["exit"]["exitCode"], 0);
    let output: String = last.data["content"]["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(output.ends_with("two\nthree\n"), "{output:?}");
    let result = done
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT" && f.data["toolCallId"] == call.as_str())
        .expect("the command's result");
    assert_eq!(
        result.data["content"],
        format!("{output}\n(exit code 0)"),
        "the whole output in the result"
    );
    assert_eq!(text_of(&done).trim(), "The command printed two lines.");
    // The transcript keeps the command's output as the activity's last state.
    let transcript = get_json(&server, "/threads/c/messages").await.1["messages"].clone();
    let kept = transcript
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "activity" && m["activityType"] == "terminal")
        .unwrap_or_else(|| panic!("the terminal in the transcript: {transcript:#}"));
    assert_eq!(kept["content"], last.data["content"]);
}

/// The text of each message on a stream, in order.
fn message_texts(frames: &[SseFrame]) -> Vec<String> {
    let mut texts: Vec<(String, String)> = Vec::new();
    for frame in frames.iter().filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT") {
        let id = frame.data["messageId"].as_str().unwrap_or_default();
        let delta = frame.data["delta"].as_str().unwrap_or_default();
        match texts.iter_mut().find(|(known, _)| known == id) {
            Some((_, text)) => text.push_str(delta),
            None => texts.push((id.to_owned(), delta.to_owned())),
        }
    }
    texts.into_iter().map(|(_, text)| text).collect()
}

/// The texts of a request's messages of `role`, as the model was sent them.
fn texts_sent(request: &Value, role: &str) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == role)
        .flat_map(|m| match &m["content"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_keeps_its_session_across_turns_and_a_restart() {
    let model = ScriptedModel::start().await;
    model.script("turn-one", vec![Step::Say("First answer.".to_owned())]);
    model.script("turn-two", vec![Step::Say("Second answer.".to_owned())]);
    model.script("turn-three", vec![Step::Say("Third answer.".to_owned())]);
    let data = temp_dir("real");
    let daemon = server(&model, &data).await;
    let mut chat = Conversation::new("k");
    let first = chat.say(&daemon, "turn-one: hello").await;
    assert_eq!(text_of(&first).trim(), "First answer.");
    chat.messages
        .push(json!({"id": "k-a1", "role": "assistant", "content": "First answer."}));
    let second = chat.say(&daemon, "turn-two: and again").await;
    assert_eq!(text_of(&second).trim(), "Second answer.");
    chat.messages
        .push(json!({"id": "k-a2", "role": "assistant", "content": "Second answer."}));
    let before = apply_state(&second, None).expect("state");
    assert_eq!(before["mode"], "default");
    let session = before["session"].clone();
    daemon.stop().await;

    // A new daemon on the same data directory: the third turn loads the same session.
    let daemon = server(&model, &data).await;
    let third = chat.say(&daemon, "turn-three: once more").await;
    // (Claude may add a notice of its own as a message apart.)
    assert!(
        message_texts(&third).contains(&"Third answer.".to_owned()),
        "{:?}",
        message_texts(&third)
    );
    let request = model
        .scripted_requests("turn-three")
        .pop()
        .expect("the third turn's request");
    let said = texts_sent(&request, "assistant").join("\n");
    assert!(
        said.contains("First answer.") && said.contains("Second answer."),
        "the model was sent the earlier turns (the session was loaded): {said}"
    );
    let after = apply_state(&third, None).expect("state");
    assert_eq!(after["session"], session);
    // What the session's load answer says, and what the thread summed, survive.
    assert_eq!(after["mode"], "default", "{after}");
    assert!(
        after["modes"].as_array().is_some_and(|m| !m.is_empty()),
        "{after}"
    );
    assert_eq!(
        after["usage"]["total"]["totalTokens"],
        before["usage"]["total"]["totalTokens"]
            .as_u64()
            .expect("total")
            + after["usage"]["turn"]["totalTokens"]
                .as_u64()
                .expect("turn"),
        "{after}"
    );
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_stops_a_running_command_when_the_run_is_cancelled() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-long",
        vec![
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "touch started.txt && sleep 300 && touch finished.txt",
                       "description": "Wait a long time"}),
            ),
            Step::Say("Waited.".to_owned()),
        ],
    );
    model.script("task-after", vec![Step::Say("Still here.".to_owned())]);
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let body = json!({"threadId": "x", "runId": "x-r1", "protocolVersion": "1.0",
        "messages": [{"id": "x-u1", "role": "user", "content": "task-long: wait"}]});
    let mut reader = SseReader::new(post_run(&server, "claude-allow", &body).await);
    while let Some(frame) = reader.next().await {
        if frame.kind() == "TOOL_CALL_END" {
            break;
        }
    }
    // The command has started once its file exists.
    let threads = data.join("workspaces/claude-allow/_operator/threads");
    eventually("the command starts", || {
        std::fs::read_dir(&threads)
            .map(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.path().join("started.txt").exists())
            })
            .unwrap_or(false)
    })
    .await;
    let r = server.post("/runs/x-r1/cancel").sent().await;
    assert_eq!(r.status(), 202);
    let rest = reader.collect().await;
    let last = rest.last().expect("end");
    assert_eq!(
        last.data["outcome"]["type"],
        "cancelled",
        "{:?}",
        kinds(&rest)
    );
    // The thread goes on.
    let body = json!({"threadId": "x", "runId": "x-r2", "protocolVersion": "1.0",
        "messages": [{"id": "x-u1", "role": "user", "content": "task-long: wait"},
                     {"id": "x-u2", "role": "user", "content": "task-after: go on"}]});
    let next = run_on(&server, "claude-allow", &body).await;
    assert_eq!(text_of(&next).trim(), "Still here.");
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn two_claude_threads_at_once() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-left",
        vec![Step::Slow(
            Duration::from_millis(500),
            Box::new(Step::Say("Left answer.".to_owned())),
        )],
    );
    model.script(
        "task-right",
        vec![Step::Slow(
            Duration::from_millis(500),
            Box::new(Step::Say("Right answer.".to_owned())),
        )],
    );
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let (mut left, mut right) = (Conversation::new("l"), Conversation::new("r"));
    let (l, r) = tokio::join!(
        left.say(&server, "task-left: go"),
        right.say(&server, "task-right: go")
    );
    assert_eq!(text_of(&l).trim(), "Left answer.");
    assert_eq!(text_of(&r).trim(), "Right answer.");
    let (sl, sr) = (
        apply_state(&l, None).expect("state")["session"].clone(),
        apply_state(&r, None).expect("state")["session"].clone(),
    );
    assert_ne!(sl, sr, "each thread its own session");
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_on_a_spare_keeps_its_session_across_a_restart_loaded_ahead() {
    let model = ScriptedModel::start().await;
    model.script("spare-one", vec![Step::Say("First answer.".to_owned())]);
    model.script("spare-two", vec![Step::Say("Second answer.".to_owned())]);
    let data = temp_dir("real-spare");
    let start = || {
        let mut agent = claude(&model, &data.join("workspaces"), Permissions::Allow);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.warm.spares = 1;
            acp.warm.preload_sessions = 4;
        }
        let d = data.clone();
        TestServer::with(move |c: &mut Config| {
            c.agents = vec![agent];
            c.data_dir = d;
            c.stall_timeout = Duration::from_secs(120);
        })
    };
    let spares_ready = |server: &TestServer| {
        let request = server.get("/agents");
        async move {
            let agents: Value = request.sent().await.json().await.expect("json");
            agents["agents"][0]["spares"] == 1
        }
    };
    let daemon = start().await;
    let mut ready = false;
    for _ in 0..600 {
        if spares_ready(&daemon).await {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "Claude's spare was never ready");
    let mut chat = Conversation::new("spare");
    let first = chat.say(&daemon, "spare-one: hello").await;
    assert_eq!(text_of(&first).trim(), "First answer.");
    let before = apply_state(&first, None).expect("state");
    assert_eq!(before["mode"], "default", "the session defaults, set ahead");
    let thread: Value = get_json(&daemon, "/threads/spare").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "new");
    chat.messages
        .push(json!({"id": "spare-a1", "role": "assistant", "content": "First answer."}));
    daemon.stop().await;

    // Restarted: the session is loaded at start-up in the workspace the thread adopted.
    let daemon = start().await;
    let second = chat.say(&daemon, "spare-two: and again").await;
    assert!(
        message_texts(&second).contains(&"Second answer.".to_owned()),
        "{:?}",
        message_texts(&second)
    );
    let after = apply_state(&second, None).expect("state");
    assert_eq!(after["session"], before["session"]);
    let thread: Value = get_json(&daemon, "/threads/spare").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded");
    let request = model
        .scripted_requests("spare-two")
        .pop()
        .expect("the second turn's request");
    let said = texts_sent(&request, "assistant").join("\n");
    assert!(
        said.contains("First answer."),
        "the model was sent the first turn (the session was loaded): {said}"
    );
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_under_bwrap_reaches_its_model_from_a_network_of_its_own() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-netns",
        vec![Step::Say("Answered from inside.".to_owned())],
    );
    let data = temp_dir("real-bwrap");
    let server = server(&model, &data).await;
    let mut talk = Conversation::new("n");
    talk.agent = "claude-bwrap";
    let frames = talk.say(&server, "task-netns: go").await;
    assert_eq!(
        frames.last().map(SseFrame::kind),
        Some("RUN_FINISHED"),
        "{:?}",
        kinds(&frames)
    );
    assert_eq!(text_of(&frames).trim(), "Answered from inside.");
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_reaches_its_model_only_through_its_relay_and_holds_no_key() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-env",
        vec![
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "env | sort", "description": "Show the environment"}),
            ),
            Step::Say("Printed.".to_owned()),
        ],
    );
    let data = temp_dir("real-relay");
    let server = server(&model, &data).await;
    let mut talk = Conversation::new("env");
    talk.agent = "claude-allow";
    let frames = talk.say(&server, "task-env: print your environment").await;
    let end = only(&frames, "RUN_FINISHED");
    assert_eq!(text_of(&frames).trim(), "Printed.", "{:?}", kinds(&frames));
    // The agent's own shell printed its environment: a placeholder, never the key.
    let printed = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_RESULT")
        .filter_map(|f| f.data["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        printed.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:"),
        "{printed}"
    );
    assert!(
        printed.contains(agui_serve::egress::PLACEHOLDER),
        "{printed}"
    );
    assert!(printed.contains("HTTPS_PROXY="), "{printed}");
    assert!(
        !printed.contains(MODEL_KEY),
        "the key reached the agent: {printed}"
    );
    // Every request the model got carried the operator's key, added by the relay.
    let asked = model.requests();
    assert!(!asked.is_empty());
    for request in &asked {
        assert_eq!(
            request.credential.as_deref(),
            Some(MODEL_KEY),
            "{}",
            request.path
        );
    }
    // The run's usage is what the model billed through the relay (each answer of the
    // scripted model bills 100 tokens in and 20 out).
    let billed = end.data["usage"][0]["totalTokens"].as_u64().expect("usage");
    assert!(billed >= 240 && billed.is_multiple_of(120), "{}", end.data);
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_pauses_inside_its_turn_at_a_token_budget() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-spend",
        vec![
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "echo one", "description": "One"}),
            ),
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "echo two", "description": "Two"}),
            ),
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "echo three", "description": "Three"}),
            ),
            Step::Say("Spent it all.".to_owned()),
        ],
    );
    let data = temp_dir("real-budget");
    let server = server(&model, &data).await;
    let mut talk = Conversation::new("spend");
    talk.agent = "claude-tight";
    let frames = talk.say(&server, "task-spend: go").await;
    let end = only(&frames, "RUN_FINISHED");
    assert_eq!(
        end.data["outcome"]["type"],
        "interrupt",
        "{:?}",
        kinds(&frames)
    );
    assert_eq!(
        end.data["outcome"]["interrupts"][0]["reason"],
        "budget_reached"
    );
    // Paused inside the turn: the model had not given its last answer when the budget
    // of 300 tokens was reached, and its end is not on the stream.
    assert!(
        !text_of(&frames).contains("Spent it all."),
        "{:?}",
        kinds(&frames)
    );
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn codex_runs_a_plain_command_in_the_daemons_sandbox_and_streams_its_output() {
    let model = ScriptedModel::start().await;
    model.script(
        "task-plain",
        vec![
            Step::Tool(
                "exec_command".to_owned(),
                json!({"cmd": "echo one; sleep 1; env; echo two", "yield_time_ms": 10000}),
            ),
            Step::Say("It printed two lines.".to_owned()),
        ],
    );
    let data = temp_dir("real-codex-plain");
    let server = server(&model, &data).await;
    let mut chat = Conversation::new("plain");
    chat.agent = "codex-full";
    let done = chat.say(&server, "task-plain: run the command").await;
    // No escalation asked for, none needed: the command ran where the agent runs.
    assert!(
        !done.iter().any(|f| f.kind() == "TOOL_CALL_START"
            && f.data["toolCallName"] == "agui_permission_request"),
        "{:?}",
        kinds(&done)
    );
    let terminal: Vec<&SseFrame> = done
        .iter()
        .filter(|f| f.data["activityType"] == "terminal")
        .collect();
    let last = terminal.last().expect("the command's output");
    assert_eq!(last.data["content"]["exit"]["exitCode"], 0, "{}", last.data);
    let output: String = last.data["content"]["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // (Codex may leave out what a command prints at once: the first line is not asserted.)
    assert!(output.ends_with("two\n"), "{output:?}");
    // Its own shell's environment: the relay's address and a placeholder, never the key.
    assert!(
        output.contains("OPENAI_BASE_URL=http://127.0.0.1:"),
        "{output:?}"
    );
    assert!(
        output.contains(&format!(
            "OPENAI_API_KEY={}",
            agui_serve::egress::PLACEHOLDER
        )),
        "{output:?}"
    );
    assert!(
        !output.contains(MODEL_KEY),
        "the key reached Codex: {output:?}"
    );
    assert_eq!(text_of(&done).trim(), "It printed two lines.");
}

/// From nothing to Claude Code behind the daemon with `agui-serve init`: the adapter found
/// in the tools folder at its version (installed there by npm otherwise), the recipe, the
/// key file and the token written, the daemon started on that configuration alone, and a
/// turn answered by the model through the relay.
#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn init_sets_up_claude_code_and_the_daemon_serves_it() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    let model = ScriptedModel::start().await;
    model.script("task-init", vec![Step::Say("Set up by init.".to_owned())]);
    let dir = temp_dir("real-init");
    let data = dir.join("data");
    let key = key_file("real-init", MODEL_KEY);
    let init = Command::new(launcher())
        .args([
            "init",
            "--agent",
            "claude-code",
            "--yes",
            "--port",
            "0",
            "--no-tls",
        ])
        .arg("--data-dir")
        .arg(&data)
        .arg("--tools-dir")
        .arg(tools())
        .args(["--anthropic-url", &model.url])
        .arg("--anthropic-key-file")
        .arg(&key)
        .env_remove("AGUI_CONFIG")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("agui-serve init runs");
    let said = String::from_utf8_lossy(&init.stdout).into_owned();
    assert!(
        init.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert!(
        init.stderr.is_empty(),
        "init warned: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let line = |name: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} line in {said}"))
            .to_owned()
    };
    let token = line("token: ");
    assert!(line("url: ").ends_with("/agui/claude"), "{said}");
    let config = std::fs::read_to_string(data.join("config.toml")).expect("config");
    assert!(
        !config.contains(MODEL_KEY) && config.contains("mode = \"default\""),
        "{config}"
    );

    let mut daemon = Command::new(launcher())
        .arg("--config")
        .arg(data.join("config.toml"))
        .env_remove("AGUI_TOKEN")
        .env_remove("STATE_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the daemon starts");
    let mut out = BufReader::new(daemon.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the listening line");
    let base = first
        .trim()
        .strip_prefix("agui-serve listening on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    let response = client()
        .post(format!("{base}/claude"))
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .json(&run_body("init", "r1", "task-init: hello"))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(
        frames.last().map(SseFrame::kind),
        Some("RUN_FINISHED"),
        "{:?}",
        kinds(&frames)
    );
    assert_eq!(text_of(&frames).trim(), "Set up by init.");
    assert!(
        model
            .requests()
            .iter()
            .all(|r| r.credential.as_deref() == Some(MODEL_KEY))
    );
}

/// A file of thread `thread`'s workspace, as the workspace route shows it.
async fn workspace_file(server: &TestServer, thread: &str, path: &str) -> Option<String> {
    let response = server
        .get(&format!("/threads/{thread}/workspace/file?path={path}"))
        .sent()
        .await;
    (response.status() == 200).then_some(response.text().await.expect("text"))
}

/// The stored transcript of `thread`.
async fn stored_messages(server: &TestServer, thread: &str) -> Vec<Value> {
    let answer: Value = server
        .get(&format!("/threads/{thread}/messages"))
        .sent()
        .await
        .json()
        .await
        .expect("json");
    answer["messages"].as_array().expect("messages").clone()
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_rewound_has_its_file_back_and_goes_on_in_a_consistent_session() {
    let model = ScriptedModel::start().await;
    for (marker, text) in [("write-one", "one"), ("write-two", "two")] {
        model.script(
            marker,
            vec![
                Step::Tool(
                    "Write".to_owned(),
                    json!({"file_path": "{cwd}/notes.md", "content": format!("{text}\n")}),
                ),
                Step::Say(format!("Wrote {text}.")),
            ],
        );
    }
    model.script("after-rewind", vec![Step::Say("Back at one.".to_owned())]);
    model.script("and-then", vec![Step::Say("Still consistent.".to_owned())]);
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let say = |thread: &str, run: &str, text: &str| {
        json!({"threadId": thread, "runId": run, "protocolVersion": "1.0",
            "messages": [{"id": format!("{run}-u"), "role": "user", "content": text}]})
    };
    let first = run_on(&server, "claude-allow", &say("rw", "rw-1", "write-one: go")).await;
    assert!(message_texts(&first).contains(&"Wrote one.".to_owned()));
    run_on(&server, "claude-allow", &say("rw", "rw-2", "write-two: go")).await;
    assert_eq!(
        workspace_file(&server, "rw", "notes.md").await.as_deref(),
        Some("two\n")
    );

    // Back to the first turn's answer: the file as that turn left it, a new session.
    let transcript = stored_messages(&server, "rw").await;
    let second_question = transcript
        .iter()
        .position(|m| m["id"] == "rw-2-u")
        .expect("the second question");
    let first_answer = transcript[second_question - 1]["id"].clone();
    let rewound = server
        .post("/threads/rw/rewind")
        .json(&json!({"messageId": first_answer, "scope": "both"}))
        .sent()
        .await;
    assert_eq!(rewound.status(), 200);
    let rewound: Value = rewound.json().await.expect("json");
    assert_eq!(rewound["session"], "new", "{rewound}");
    assert_eq!(
        workspace_file(&server, "rw", "notes.md").await.as_deref(),
        Some("one\n")
    );
    assert_eq!(stored_messages(&server, "rw").await.len(), second_question);

    // The next turn's model request holds the kept conversation and nothing after it.
    let next = run_on(
        &server,
        "claude-allow",
        &say("rw", "rw-3", "after-rewind: where"),
    )
    .await;
    assert!(
        message_texts(&next).contains(&"Back at one.".to_owned()),
        "{:?}",
        message_texts(&next)
    );
    let request = model
        .scripted_requests("after-rewind")
        .pop()
        .expect("asked");
    let sent = texts_sent(&request, "user").join("\n");
    assert!(
        sent.contains("write-one: go") && sent.contains("Wrote one."),
        "{sent}"
    );
    assert!(
        !sent.contains("write-two") && !sent.contains("Wrote two."),
        "{sent}"
    );
    // And the session goes on from there.
    run_on(
        &server,
        "claude-allow",
        &say("rw", "rw-4", "and-then: go on"),
    )
    .await;
    let request = model.scripted_requests("and-then").pop().expect("asked");
    let answers = texts_sent(&request, "assistant").join("\n");
    assert!(answers.contains("Back at one."), "{answers}");
    assert!(!answers.contains("Wrote two."), "{answers}");
}

#[tokio::test]
#[ignore = "needs the real adapters: scripts/test.sh installs them"]
async fn claude_takes_a_steering_message_during_a_long_turn() {
    let model = ScriptedModel::start().await;
    model.script(
        "long-task",
        vec![
            Step::Tool(
                "Bash".to_owned(),
                json!({"command": "sleep 6 && echo slept", "description": "Wait a while"}),
            ),
            Step::Say("Task done.".to_owned()),
        ],
    );
    model.script("steer-note", vec![Step::Say("Noted: tabs.".to_owned())]);
    let data = temp_dir("real");
    let server = server(&model, &data).await;
    let body = json!({"threadId": "st", "runId": "st-1", "protocolVersion": "1.0",
        "messages": [{"id": "st-u1", "role": "user", "content": "long-task: go"}]});
    let mut live = SseReader::new(post_run(&server, "claude-allow", &body).await);
    while let Some(frame) = live.next().await {
        if frame.kind() == "TOOL_CALL_END" {
            break;
        }
    }
    let steer = json!({"threadId": "st", "runId": "st-2", "protocolVersion": "1.0",
        "messages": [{"id": "st-u2", "role": "user", "content": "steer-note: use tabs"}],
        "forwardedProps": {"agui": {"multitask": "steer"}}});
    let response = post_run(&server, "claude-allow", &steer).await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    let note = frames
        .iter()
        .find(|f| f.kind() == "CUSTOM" && f.data["name"] == "agui.steer")
        .map(|f| f.data["value"].clone())
        .expect("the stream says how the input went");
    assert_eq!(note["delivery"], "steered", "{note}");
    // The running turn took it: the model was asked about it before the turn ended.
    assert_eq!(frames[0].data["runId"], "st-1");
    assert!(
        !model.scripted_requests("steer-note").is_empty(),
        "the model saw the steering message"
    );
    assert!(
        message_texts(&frames).contains(&"Noted: tabs.".to_owned()),
        "{:?}",
        message_texts(&frames)
    );
    let transcript = stored_messages(&server, "st").await;
    let at = transcript
        .iter()
        .position(|m| m["id"] == "st-u2")
        .expect("the steering message in the transcript");
    assert!(
        at > 0 && at < transcript.len() - 1,
        "it landed inside the turn: {transcript:?}"
    );
}
