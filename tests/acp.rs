//! The ACP backend against a scripted agent built on the official SDK
//! (`examples/scripted_acp_agent.rs`): every mapped update, permissions, cancel, crash,
//! restart-then-continue with `session/load`, pooling and idle reaping.

mod support;

use std::time::Duration;

use agui_serve::config::{
    AcpConfig, AgentConfig, AgentKind, Config, FrontendMcp, Hitl, Permissions,
};
use serde_json::{Value, json};
use support::*;

fn acp_agent(
    name: &str,
    permissions: Permissions,
    pool_size: usize,
    state: &std::path::Path,
) -> AgentConfig {
    let mut env = std::collections::BTreeMap::new();
    env.insert(
        "SCRIPTED_AGENT_STATE".to_owned(),
        state.to_str().expect("utf8").to_owned(),
    );
    AgentConfig {
        name: name.to_owned(),
        description: "scripted ACP agent".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(AcpConfig {
            command: vec![scripted_agent().to_str().expect("utf8").to_owned()],
            cwd: None,
            env,
            pool_size,
            idle_ttl: Duration::from_secs(600),
            permissions,
            frontend_mcp: FrontendMcp::Auto,
            sandbox: agui_serve::confine::Sandbox {
                write: vec![state.to_owned()],
                ..Default::default()
            },
            ..AcpConfig::new(Vec::new())
        }),
    }
}

fn configure(c: &mut Config, state: &std::path::Path) {
    c.agents = vec![
        acp_agent("scripted", Permissions::Ask, 1, state),
        acp_agent("scripted-allow", Permissions::Allow, 1, state),
        acp_agent("scripted-deny", Permissions::Deny, 1, state),
    ];
}

/// The scripted agents on the data directory `data` (the same one across a restart).
async fn server_on(state: &std::path::Path, data: &std::path::Path) -> TestServer {
    let (s, d) = (state.to_owned(), data.to_owned());
    TestServer::with(move |c| {
        configure(c, &s);
        c.data_dir = d;
    })
    .await
}

async fn run(server: &TestServer, agent: &str, body: &Value) -> Vec<SseFrame> {
    let r = post_run(server, agent, body).await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert_valid_segment(&frames);
    frames
}

#[tokio::test]
async fn every_mapped_update_variant() {
    let state = temp_dir("acp-state");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;

    let frames = run(&server, "scripted", &run_body("v", "r1", "hello there")).await;
    assert_eq!(text_of(&frames), "Echo: hello there");
    assert_eq!(
        frames
            .iter()
            .filter(|f| f.kind() == "TEXT_MESSAGE_START")
            .count(),
        1,
        "chunks with one messageId are one message"
    );
    let view = apply_state(&frames, None).expect("state");
    assert!(
        view["session"]
            .as_str()
            .expect("session")
            .starts_with("sess-")
    );

    let history = |run: &str, text: &str| {
        let mut b = run_body("v", run, text);
        b["messages"] = json!([{"id": format!("{run}-u"), "role": "user", "content": text}]);
        b
    };
    let frames = run(&server, "scripted", &history("r2", "think")).await;
    let k = kinds(&frames);
    assert!(k.contains(&"REASONING_MESSAGE_CONTENT".to_owned()), "{k:?}");
    assert_eq!(text_of(&frames), "Thought it through.");

    let frames = run(&server, "scripted", &history("r3", "tool")).await;
    let start = frames
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_START")
        .expect("tool call");
    assert_eq!(
        start.data["toolCallName"], "read",
        "named by kind when there is no name"
    );
    let args = frames
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_ARGS")
        .expect("args");
    assert_eq!(args.data["delta"], r#"{"path":"/src/main.rs"}"#);
    let result = frames
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("result");
    assert!(
        result.data["content"]
            .as_str()
            .expect("content")
            .contains("fn main() {}")
    );
    let end = frames
        .iter()
        .position(|f| f.kind() == "TOOL_CALL_END")
        .expect("end");
    let res = frames
        .iter()
        .position(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("result");
    assert!(end < res, "opened and closed before its result");
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(
        view["files"],
        json!([{"path": "/src/main.rs", "action": "read"}, {"path": "/src/lib.rs", "action": "edit"}])
    );

    let frames = run(&server, "scripted", &history("r4", "plan")).await;
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(view["todos"].as_array().expect("todos").len(), 3);
    assert_eq!(
        view["todos"][1],
        json!({"content": "change", "status": "in_progress", "priority": "medium"})
    );
    assert_eq!(
        view["files"].as_array().expect("files").len(),
        2,
        "state survives turns"
    );

    let frames = run(&server, "scripted", &history("r5", "usage")).await;
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(view["usage"]["used"], 1200);
    assert_eq!(view["usage"]["size"], 200000);

    let frames = run(&server, "scripted", &history("r6", "misc")).await;
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(view["commands"][0]["name"], "review");
    assert_eq!(view["mode"], "plan");
    assert_eq!(view["title"], "A scripted session");
    let custom = frames
        .iter()
        .find(|f| f.kind() == "CUSTOM")
        .expect("unknown variant passed on");
    assert_eq!(custom.data["name"], "acp.something_new");
    assert_eq!(custom.data["value"]["detail"], 42);
    let thread: Value = get_json(&server, "/threads/v").await.1;
    assert_eq!(
        thread["title"], "A scripted session",
        "the agent's session title names the thread"
    );
}

async fn permission_round_trip(server: &TestServer, thread: &str, option: &str) -> Vec<SseFrame> {
    let user = json!({"id": format!("{thread}-u"), "role": "user", "content": "permission"});
    let body =
        json!({"threadId": thread, "runId": "r1", "protocolVersion": "1.0", "messages": [user]});
    let first = run(server, "scripted", &body).await;
    let perm = first
        .iter()
        .find(|f| {
            f.kind() == "TOOL_CALL_START" && f.data["toolCallName"] == "agui_permission_request"
        })
        .expect("permission request");
    let perm_id = perm.data["toolCallId"].as_str().expect("id").to_owned();
    let args: String = first
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == perm_id.as_str())
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    let args: Value = serde_json::from_str(&args).expect("json");
    assert_eq!(args["toolCallId"], "call-p");
    assert_eq!(args["options"].as_array().expect("options").len(), 3);
    let body = json!({"threadId": thread, "runId": "r2", "protocolVersion": "1.0", "messages": [
        user,
        {"id": format!("{thread}-a"), "role": "assistant", "toolCalls": [
            {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}]},
        {"id": format!("{thread}-t"), "role": "tool", "toolCallId": perm_id, "content": json!({"optionId": option}).to_string()}
    ]});
    run(server, "scripted", &body).await
}

#[tokio::test]
async fn permissions_ask_allow_and_deny() {
    let state = temp_dir("acp-perm");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let approved = permission_round_trip(&server, "pa", "yes-once").await;
    assert_eq!(text_of(&approved), "Permission allowed.");
    // A generic UI may answer with the option's kind.
    let by_kind = permission_round_trip(&server, "pk", "allow_always").await;
    assert_eq!(text_of(&by_kind), "Permission allowed.");
    let denied = permission_round_trip(&server, "pd", "no").await;
    assert_eq!(text_of(&denied), "Permission rejected.");
    let result = denied
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("result");
    assert_eq!(result.data["toolCallId"], "call-p");
    // An answer naming no offered option is a refusal, not a cancelled turn: the agent is
    // sent its reject option and the turn goes on.
    let unknown = permission_round_trip(&server, "pu", "maybe").await;
    assert_eq!(text_of(&unknown), "Permission rejected.");
    assert_eq!(
        unknown.last().expect("end").kind(),
        "RUN_FINISHED",
        "the turn was not cancelled"
    );

    // Configured answers never reach the client.
    let frames = run(
        &server,
        "scripted-allow",
        &run_body("auto-a", "r", "permission"),
    )
    .await;
    assert!(
        !frames
            .iter()
            .any(|f| f.data["toolCallName"] == "agui_permission_request")
    );
    assert_eq!(text_of(&frames), "Permission allowed.");
    let frames = run(
        &server,
        "scripted-deny",
        &run_body("auto-d", "r", "permission"),
    )
    .await;
    assert_eq!(text_of(&frames), "Permission rejected.");
}

#[tokio::test]
async fn cancel_mid_turn_sends_session_cancel() {
    let state = temp_dir("acp-cancel");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let mut reader =
        SseReader::new(post_run(&server, "scripted", &run_body("c", "rc", "slow 200")).await);
    let mut chunks = 0;
    while chunks < 3 {
        let f = reader.next().await.expect("frame");
        if f.kind() == "TEXT_MESSAGE_CONTENT" {
            chunks += 1;
        }
    }
    let r = server.post("/runs/rc/cancel").sent().await;
    assert_eq!(r.status(), 202);
    let rest = reader.collect().await;
    let last = rest.last().expect("terminal");
    assert_eq!(
        last.data["outcome"]["type"],
        "cancelled",
        "{:?}",
        kinds(&rest)
    );
    let streamed = rest
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .count()
        + chunks;
    assert!(
        streamed < 100,
        "the agent stopped early ({streamed} chunks)"
    );
    // The session is still usable.
    let mut next = run_body("c", "rc2", "after");
    next["messages"] = json!([{"id": "rc-u", "role": "user", "content": "slow 200"}, {"id": "rc2-u", "role": "user", "content": "after"}]);
    assert_eq!(
        text_of(&run(&server, "scripted", &next).await),
        "Echo: after"
    );
}

#[tokio::test]
async fn an_agent_crash_mid_run_is_agent_exited_and_the_thread_goes_on() {
    let state = temp_dir("acp-crash");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    run(&server, "scripted", &run_body("k", "r0", "before")).await;
    let mut crash = run_body("k", "r1", "crash");
    crash["messages"] = json!([{"id": "r0-u", "role": "user", "content": "before"}, {"id": "r1-u", "role": "user", "content": "crash"}]);
    let frames = run(&server, "scripted", &crash).await;
    let last = frames.last().expect("terminal");
    assert_eq!(last.kind(), "RUN_ERROR");
    assert_eq!(last.data["code"], "AGENT_EXITED");
    let message = last.data["message"].as_str().expect("message");
    assert!(message.contains("crashed"), "stderr tail: {message}");
    assert!(!message.contains("abc123secret"), "sanitized: {message}");
    // The next run reloads the session on a fresh process.
    let mut after = crash.clone();
    after["runId"] = json!("r2");
    after["messages"]
        .as_array_mut()
        .expect("messages")
        .push(json!({"id": "r2-u", "role": "user", "content": "again"}));
    assert_eq!(
        text_of(&run(&server, "scripted", &after).await),
        "Echo: again"
    );
    let thread: Value = get_json(&server, "/threads/k").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded");
}

#[tokio::test]
async fn restart_then_continue_loads_the_session() {
    let state = temp_dir("acp-restart");
    let data = temp_dir("acp-restart-data");
    let server = server_on(&state, &data).await;
    let first = run(&server, "scripted", &run_body("rs", "r1", "remember me")).await;
    let session = apply_state(&first, None).expect("state")["session"].clone();
    server.stop().await;

    let server = server_on(&state, &data).await;
    let mut next = run_body("rs", "r2", "still you?");
    next["messages"] = json!([{"id": "r1-u", "role": "user", "content": "remember me"}, {"id": "r2-u", "role": "user", "content": "still you?"}]);
    let frames = run(&server, "scripted", &next).await;
    assert_eq!(
        frames[1].kind(),
        "MESSAGES_SNAPSHOT",
        "history in-band after the restart"
    );
    assert_eq!(text_of(&frames), "Echo: still you?");
    assert_eq!(
        apply_state(&frames, None).expect("state")["session"],
        session,
        "same session"
    );
    let thread: Value = get_json(&server, "/threads/rs").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "loaded");
    // The load replay was not streamed as a live run.
    assert!(!text_of(&frames).contains("remember me"));
}

#[tokio::test]
async fn two_threads_on_one_process_stream_concurrently_without_interleaving() {
    let state = temp_dir("acp-pool");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let a = tokio::spawn({
        let url = server.url("/scripted");
        async move {
            let r = client()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&run_body("ta", "ra", "slow 20"))
                .sent()
                .await;
            SseReader::new(r).collect().await
        }
    });
    let b = tokio::spawn({
        let url = server.url("/scripted");
        async move {
            let r = client()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&run_body("tb", "rb", "slow 20"))
                .sent()
                .await;
            SseReader::new(r).collect().await
        }
    });
    let (a, b) = (a.await.expect("a"), b.await.expect("b"));
    for (frames, thread) in [(&a, "ta"), (&b, "tb")] {
        assert_valid_segment(frames);
        assert_eq!(frames[0].data["threadId"], thread);
        let text = text_of(frames);
        let expected: String = (1..=20).map(|i| format!("{i} ")).collect();
        assert_eq!(text, expected, "{thread} got exactly its own chunks");
    }
    let sessions: std::collections::HashSet<String> = [&a, &b]
        .iter()
        .map(|f| {
            apply_state(f, None).expect("state")["session"]
                .as_str()
                .expect("s")
                .to_owned()
        })
        .collect();
    assert_eq!(sessions.len(), 2, "two sessions");
}

#[tokio::test]
async fn an_idle_process_is_stopped_after_its_ttl() {
    use agui_serve::agent::Agent;
    use agui_serve::agent::acp::AcpBackend;
    let state = temp_dir("acp-idle");
    let AgentKind::Acp(mut config) = acp_agent("idle", Permissions::Ask, 1, &state).kind else {
        panic!("acp config expected");
    };
    config.idle_ttl = Duration::from_secs(600);
    // Only the process's TTL is measured here (idle sessions: tests/confine.rs).
    config.session_ttl = Duration::from_secs(3600);
    let mut host = agui_serve::agent::acp::AgentHost::new(&state);
    host.launcher = launcher();
    let backend = std::sync::Arc::new(AcpBackend::new("idle", config, host));
    let mut agents: std::collections::BTreeMap<String, std::sync::Arc<dyn Agent>> =
        Default::default();
    agents.insert("idle".into(), backend.clone());
    let runtime = agui_serve::runtime::Runtime::new(
        agents,
        agui_serve::runtime::RuntimeOptions::new(4),
        agui_serve::store::Store::open(&temp_dir("acp-idle-db")).expect("store"),
    );
    // The turn runs on real time (a real process answers); the idle wait is paused time.
    let body = run_body("i", "r", "hello");
    let input = agui_serve::protocol::decode_run_input(body.to_string().as_bytes()).expect("input");
    let mut attachment = runtime.start_run("idle", input).await.expect("start");
    while attachment.next().await.is_some() {}
    assert_eq!(backend.process_count(), 1);
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(590)).await;
    tokio::task::yield_now().await;
    assert_eq!(backend.process_count(), 1, "still within its TTL at 590 s");
    tokio::time::advance(Duration::from_secs(200)).await;
    let mut stopped = false;
    for _ in 0..50 {
        tokio::task::yield_now().await;
        if backend.process_count() == 0 {
            stopped = true;
            break;
        }
    }
    assert!(stopped, "the idle process was not reaped");
    tokio::time::resume();
    backend.shutdown().await;
}

#[tokio::test]
async fn readyz_reports_whether_agents_can_start() {
    let state = temp_dir("acp-ready");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let r = client().get(server.url("/readyz")).sent().await;
    assert_eq!(r.status(), 200);
    let server = TestServer::with(|c| {
        c.agents = vec![AgentConfig {
            name: "missing".into(),
            description: String::new(),
            hitl: Hitl::Tool,
            multitask: Default::default(),
            history: Default::default(),
            budget: None,
            kind: AgentKind::Acp(AcpConfig {
                command: vec!["/nonexistent/agent-binary".into()],
                cwd: None,
                env: Default::default(),
                pool_size: 1,
                idle_ttl: Duration::from_secs(60),
                permissions: Permissions::Ask,
                frontend_mcp: FrontendMcp::Auto,
                ..AcpConfig::new(Vec::new())
            }),
        }];
    })
    .await;
    let r = client().get(server.url("/readyz")).sent().await;
    assert_eq!(r.status(), 503);
    let body = r.text().await.expect("body");
    assert!(
        !body.contains("missing") && !body.contains("nonexistent"),
        "no names or details: {body}"
    );
    // A run on it fails in-band with a clear error.
    let frames = SseReader::new(post_run(&server, "missing", &run_body("m", "r", "hi")).await)
        .collect()
        .await;
    assert_eq!(frames.last().expect("terminal").kind(), "RUN_ERROR");
}

#[tokio::test]
async fn an_agent_without_load_resumes_its_session_after_a_restart() {
    let state = temp_dir("acp-resume");
    let data = temp_dir("acp-resume-data");
    let with_resume = |c: &mut Config, state: &std::path::Path, data: &std::path::Path| {
        let mut agent = acp_agent("scripted", Permissions::Ask, 1, state);
        if let AgentKind::Acp(acp) = &mut agent.kind {
            acp.env.insert("SCRIPTED_AGENT_RESUME".into(), "1".into());
        }
        c.agents = vec![agent];
        c.data_dir = data.to_owned();
    };
    let (s, d) = (state.clone(), data.clone());
    let server = TestServer::with(move |c| with_resume(c, &s, &d)).await;
    let first = run(&server, "scripted", &run_body("rz", "r1", "one")).await;
    let session = apply_state(&first, None).expect("state")["session"].clone();
    server.stop().await;
    let (s, d) = (state.clone(), data.clone());
    let server = TestServer::with(move |c| with_resume(c, &s, &d)).await;
    let mut next = run_body("rz", "r2", "two");
    next["messages"] = json!([{"id": "r1-u", "role": "user", "content": "one"}, {"id": "r2-u", "role": "user", "content": "two"}]);
    let frames = run(&server, "scripted", &next).await;
    assert_eq!(
        apply_state(&frames, None).expect("state")["session"],
        session
    );
    let thread: Value = get_json(&server, "/threads/rz").await.1;
    assert_eq!(thread["metadata"]["session"]["how"], "resumed");
}

#[tokio::test]
async fn deleting_a_thread_closes_and_deletes_its_session() {
    let state = temp_dir("acp-delete");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let frames = run(&server, "scripted", &run_body("del", "r1", "hello")).await;
    let session = apply_state(&frames, None).expect("state")["session"]
        .as_str()
        .expect("session")
        .to_owned();
    let r = server.delete("/threads/del").sent().await;
    assert_eq!(r.status(), 204);
    assert!(
        state.join(format!("{session}.closed")).exists(),
        "session/close sent"
    );
    assert!(
        state.join(format!("{session}.deleted")).exists(),
        "session/delete sent"
    );
}

#[tokio::test]
async fn frontend_tools_reach_the_agent_over_mcp_and_appear_once() {
    let state = temp_dir("acp-mcp");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let tools = json!([{"name": "chart", "description": "draws a chart", "parameters": {"type": "object"}}]);
    let user = json!({"id": "mcp-u", "role": "user", "content": "mcp chart {\"kind\":\"bar\"}"});
    let body = json!({"threadId": "mcp", "runId": "r1", "protocolVersion": "1.0", "tools": tools, "messages": [user]});
    let first = run(&server, "scripted", &body).await;
    let starts: Vec<&SseFrame> = first
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_START")
        .collect();
    assert_eq!(
        starts.len(),
        1,
        "the agent's tool call and the frontend call are one: {:?}",
        kinds(&first)
    );
    assert_eq!(starts[0].data["toolCallName"], "chart");
    let call_id = starts[0].data["toolCallId"]
        .as_str()
        .expect("id")
        .to_owned();
    let args: String = first
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS")
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&args).expect("json"),
        json!({"kind": "bar"})
    );
    assert_eq!(
        first.last().expect("terminal").data["outcome"]["pendingToolCallIds"],
        json!([call_id])
    );

    let body = json!({"threadId": "mcp", "runId": "r2", "protocolVersion": "1.0", "tools": tools, "messages": [
        user,
        {"id": "mcp-a", "role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {"name": "chart", "arguments": args}}]},
        {"id": "mcp-t", "role": "tool", "toolCallId": call_id, "content": "a bar chart"}
    ]});
    let second = run(&server, "scripted", &body).await;
    assert!(
        !second.iter().any(|f| f.kind() == "TOOL_CALL_RESULT"),
        "the browser's result is not echoed"
    );
    assert!(!second.iter().any(|f| f.kind() == "TOOL_CALL_START"));
    assert_eq!(text_of(&second), "MCP chart returned: a bar chart");
}

#[tokio::test]
async fn new_input_while_a_permission_is_pending_is_prompted_as_its_own_turn() {
    let state = temp_dir("acp-supersede");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let user = json!({"id": "sp-u", "role": "user", "content": "permission"});
    let body =
        json!({"threadId": "sp", "runId": "r1", "protocolVersion": "1.0", "messages": [user]});
    let first = run(&server, "scripted", &body).await;
    let perm_id = permission_call_id(&first);
    let body = json!({"threadId": "sp", "runId": "r2", "protocolVersion": "1.0", "messages": [
        user, {"id": "sp-2", "role": "user", "content": "hello again"}]});
    let second = run(&server, "scripted", &body).await;
    assert_eq!(second[0].data["runId"], "r2");
    assert_eq!(text_of(&second), "Echo: hello again");
    let transcript = get_json(&server, "/threads/sp/messages").await.1["messages"].clone();
    assert_every_client_call_answered(&transcript);
    assert!(
        position_of(&transcript, &format!("{perm_id}-cancelled"))
            < position_of(&transcript, "sp-2")
    );
}

#[tokio::test]
async fn an_answer_to_a_permission_after_a_restart_is_suspension_lost() {
    let state = temp_dir("acp-lost");
    let data = temp_dir("acp-lost-data");
    let server = server_on(&state, &data).await;
    let user = json!({"id": "al-u", "role": "user", "content": "permission"});
    let body =
        json!({"threadId": "al", "runId": "r1", "protocolVersion": "1.0", "messages": [user]});
    let first = run(&server, "scripted", &body).await;
    let perm_id = permission_call_id(&first);
    server.stop().await;

    let server = server_on(&state, &data).await;
    let body = json!({"threadId": "al", "runId": "r2", "protocolVersion": "1.0", "messages": [
        user,
        {"id": "al-a", "role": "assistant", "toolCalls": [
            {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}]},
        {"id": "al-t", "role": "tool", "toolCallId": perm_id, "content": r#"{"optionId":"yes-once"}"#}
    ]});
    let answer = run(&server, "scripted", &body).await;
    assert_eq!(
        kinds(&answer),
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_ERROR"]
    );
    assert_eq!(answer[2].data["code"], "SUSPENSION_LOST");
    let transcript = get_json(&server, "/threads/al/messages").await.1["messages"].clone();
    assert_every_client_call_answered(&transcript);
}

/// The body of a run on `thread` whose user said each of `texts`, one run each.
fn turns(thread: &str, texts: &[&str]) -> Value {
    let messages: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"id": format!("{thread}-u{i}"), "role": "user", "content": text}))
        .collect();
    json!({"threadId": thread, "runId": format!("{thread}-r{}", texts.len()),
        "protocolVersion": "1.0", "messages": messages})
}

fn tool_call_ids(frames: &[SseFrame]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_START")
        .map(|f| f.data["toolCallId"].as_str().expect("id").to_owned())
        .collect()
}

/// Tool-call ids of the calls in a transcript, and of the results, in order.
fn transcript_calls(messages: &Value) -> (Vec<String>, Vec<String>) {
    let messages = messages.as_array().expect("messages");
    let calls = messages
        .iter()
        .flat_map(|m| m["toolCalls"].as_array().cloned().unwrap_or_default())
        .map(|c| c["id"].as_str().expect("id").to_owned())
        .collect();
    let results = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["toolCallId"].as_str().expect("id").to_owned())
        .collect();
    (calls, results)
}

#[tokio::test]
async fn tool_call_ids_an_agent_reuses_across_turns_stay_unique_through_a_restart() {
    let state = temp_dir("acp-ids");
    let data = temp_dir("acp-ids-data");
    let server = server_on(&state, &data).await;
    let first = run(&server, "scripted", &turns("ids", &["tools"])).await;
    assert_eq!(tool_call_ids(&first), ["call_1", "call_2"]);
    let second = run(&server, "scripted", &turns("ids", &["tools", "tools"])).await;
    assert_eq!(
        tool_call_ids(&second),
        ["call_1~2", "call_2~2"],
        "the agent's reused ids are renamed"
    );
    let results: Vec<&Value> = second
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_RESULT")
        .map(|f| &f.data["toolCallId"])
        .collect();
    assert_eq!(results, [&json!("call_1~2"), &json!("call_2~2")]);
    let all = ["call_1", "call_2", "call_1~2", "call_2~2"];
    let transcript = get_json(&server, "/threads/ids/messages").await.1["messages"].clone();
    assert_eq!(
        transcript_calls(&transcript),
        (
            all.map(String::from).to_vec(),
            all.map(String::from).to_vec()
        )
    );
    server.stop().await;

    // After a restart the history (from the store) has every call and every result.
    let server = server_on(&state, &data).await;
    let transcript = get_json(&server, "/threads/ids/messages").await.1["messages"].clone();
    assert_eq!(
        transcript_calls(&transcript),
        (
            all.map(String::from).to_vec(),
            all.map(String::from).to_vec()
        )
    );
    let hydration = SseReader::new(server.get("/threads/ids/stream").sent().await)
        .collect()
        .await;
    let snapshot = hydration
        .iter()
        .find(|f| f.kind() == "MESSAGES_SNAPSHOT")
        .expect("snapshot");
    assert_eq!(
        transcript_calls(&snapshot.data["messages"]),
        (
            all.map(String::from).to_vec(),
            all.map(String::from).to_vec()
        ),
        "the snapshot that replaces the client's messages keeps every turn's calls"
    );
    // The thread's ids are known after the restart too.
    let third = run(
        &server,
        "scripted",
        &turns("ids", &["tools", "tools", "tools"]),
    )
    .await;
    assert_eq!(tool_call_ids(&third), ["call_1~3", "call_2~3"]);
}

#[tokio::test]
async fn a_reused_tool_call_id_is_renamed_in_permission_and_frontend_tool_calls() {
    let state = temp_dir("acp-ids-hitl");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    // Permission: the same `call-p` in two turns; each answer reaches the agent.
    let first = permission_round_trip(&server, "pr", "yes-once").await;
    assert_eq!(text_of(&first), "Permission allowed.");
    let user =
        |i: usize| json!({"id": format!("pr-u{i}"), "role": "user", "content": "permission"});
    let body =
        json!({"threadId": "pr", "runId": "r3", "protocolVersion": "1.0", "messages": [user(2)]});
    let asked = run(&server, "scripted", &body).await;
    assert_eq!(tool_call_ids(&asked)[0], "call-p~2");
    let perm_id = permission_call_id(&asked);
    let args: String = asked
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == perm_id.as_str())
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    let args: Value = serde_json::from_str(&args).expect("json");
    assert_eq!(
        args["toolCallId"], "call-p~2",
        "the request names the renamed call"
    );
    let body = json!({"threadId": "pr", "runId": "r4", "protocolVersion": "1.0", "messages": [
        user(2),
        {"id": "pr-a2", "role": "assistant", "toolCalls": [
            {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}]},
        {"id": "pr-t2", "role": "tool", "toolCallId": perm_id, "content": r#"{"optionId":"no"}"#}
    ]});
    let answered = run(&server, "scripted", &body).await;
    assert_eq!(text_of(&answered), "Permission rejected.");
    let result = answered
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("result");
    assert_eq!(result.data["toolCallId"], "call-p~2");
    let transcript = get_json(&server, "/threads/pr/messages").await.1["messages"].clone();
    let (calls, _) = transcript_calls(&transcript);
    assert_eq!(
        calls.iter().collect::<std::collections::HashSet<_>>().len(),
        calls.len(),
        "unique ids: {calls:?}"
    );
    assert!(calls.contains(&"call-p".to_owned()) && calls.contains(&"call-p~2".to_owned()));

    // Frontend tool over MCP: the agent's `call-mcp` in two turns.
    let tools = json!([{"name": "chart", "description": "draws a chart", "parameters": {"type": "object"}}]);
    let mut history: Vec<Value> = Vec::new();
    for (turn, expected) in [(0, "call-mcp"), (1, "call-mcp~2")] {
        history
            .push(json!({"id": format!("fm-u{turn}"), "role": "user", "content": "mcp chart {}"}));
        let body = json!({"threadId": "fm", "runId": format!("fm-r{turn}"), "protocolVersion": "1.0",
            "tools": tools, "messages": history});
        let asked = run(&server, "scripted", &body).await;
        assert_eq!(tool_call_ids(&asked), [expected]);
        history.push(json!({"id": format!("fm-a{turn}"), "role": "assistant", "toolCalls": [
            {"id": expected, "type": "function", "function": {"name": "chart", "arguments": "{}"}}]}));
        history.push(
            json!({"id": format!("fm-t{turn}"), "role": "tool", "toolCallId": expected,
            "content": format!("chart {turn}")}),
        );
        let body = json!({"threadId": "fm", "runId": format!("fm-s{turn}"), "protocolVersion": "1.0",
            "tools": tools, "messages": history});
        let answered = run(&server, "scripted", &body).await;
        assert_eq!(
            text_of(&answered),
            format!("MCP chart returned: chart {turn}"),
            "the answer to {expected} reached the agent"
        );
    }
}

/// A scripted agent whose authentication fails (at `session/new` or at `session/prompt`,
/// per `at`) while `switch` exists.
fn with_auth_switch(state: &std::path::Path, switch: &std::path::Path, at: &str) -> AgentConfig {
    let mut agent = acp_agent("scripted", Permissions::Ask, 1, state);
    if let AgentKind::Acp(acp) = &mut agent.kind {
        acp.env.insert(
            "SCRIPTED_AGENT_AUTH_FILE".into(),
            switch.to_str().expect("utf8").into(),
        );
        acp.env.insert("SCRIPTED_AGENT_AUTH_AT".into(), at.into());
    }
    agent
}

fn terminal(frames: &[SseFrame]) -> &SseFrame {
    frames.last().expect("terminal")
}

#[tokio::test]
async fn a_prompt_refused_for_authentication_at_session_new_is_sent_once_credentials_work() {
    let state = temp_dir("acp-auth-new");
    let switch = state.join("needs-auth");
    std::fs::write(&switch, b"").expect("switch");
    let (s, w) = (state.clone(), switch.clone());
    let server = TestServer::with(move |c| c.agents = vec![with_auth_switch(&s, &w, "new")]).await;
    let failed = run(&server, "scripted", &turns("an", &["hello"])).await;
    assert_eq!(terminal(&failed).data["code"], "AUTH_REQUIRED");

    std::fs::remove_file(&switch).expect("credentials");
    let mut again = turns("an", &["hello"]);
    again["runId"] = json!("an-again");
    let frames = run(&server, "scripted", &again).await;
    assert_eq!(
        text_of(&frames),
        "Echo: hello",
        "the message that never reached the agent is sent now"
    );
    let frames = run(&server, "scripted", &turns("an", &["hello", "recall"])).await;
    assert_eq!(text_of(&frames), "Heard: hello | recall", "and only once");
}

#[tokio::test]
async fn a_prompt_refused_for_authentication_at_session_prompt_goes_with_the_next_one() {
    let state = temp_dir("acp-auth-prompt");
    let switch = state.join("needs-auth");
    let (s, w) = (state.clone(), switch.clone());
    let server =
        TestServer::with(move |c| c.agents = vec![with_auth_switch(&s, &w, "prompt")]).await;
    let frames = run(&server, "scripted", &turns("ap", &["one"])).await;
    assert_eq!(text_of(&frames), "Echo: one");
    std::fs::write(&switch, b"").expect("switch");
    let failed = run(&server, "scripted", &turns("ap", &["one", "two"])).await;
    assert_eq!(terminal(&failed).data["code"], "AUTH_REQUIRED");
    // Sessions still work, so the probe (which makes one) proves nothing: not ready until
    // a prompt succeeds, through several probe intervals.
    let until = tokio::time::Instant::now() + Duration::from_millis(4500);
    while tokio::time::Instant::now() < until {
        assert_eq!(readyz(&server).await.0, 503);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    std::fs::remove_file(&switch).expect("credentials");
    let frames = run(&server, "scripted", &turns("ap", &["one", "two", "recall"])).await;
    assert_eq!(text_of(&frames), "Heard: one | two | recall");
    assert_eq!(readyz(&server).await.0, 200);
}

#[tokio::test]
async fn a_prompt_refused_for_authentication_is_sent_after_a_restart_with_credentials() {
    let state = temp_dir("acp-auth-restart");
    let data = temp_dir("acp-auth-restart-data");
    let switch = state.join("needs-auth");
    std::fs::write(&switch, b"").expect("switch");
    let start = |state: &std::path::Path, data: &std::path::Path, switch: &std::path::Path| {
        let (s, d, w) = (state.to_owned(), data.to_owned(), switch.to_owned());
        TestServer::with(move |c| {
            c.agents = vec![with_auth_switch(&s, &w, "new")];
            c.data_dir = d;
        })
    };
    let server = start(&state, &data, &switch).await;
    let failed = run(&server, "scripted", &turns("ar", &["hello"])).await;
    assert_eq!(terminal(&failed).data["code"], "AUTH_REQUIRED");
    server.stop().await;

    std::fs::remove_file(&switch).expect("credentials");
    let server = start(&state, &data, &switch).await;
    let frames = run(&server, "scripted", &turns("ar", &["hello", "recall"])).await;
    assert_eq!(text_of(&frames), "Heard: hello | recall");
}

async fn readyz(server: &TestServer) -> (u16, String) {
    let r = client().get(server.url("/readyz")).sent().await;
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// The `GET {path}/agents` entry of `name`.
async fn agent_entry(server: &TestServer, name: &str) -> Value {
    let (status, body) = get_json(server, "/agents").await;
    assert_eq!(status, 200, "{body}");
    body["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .find(|a| a["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no agent {name}: {body}"))
}

#[tokio::test]
async fn readiness_follows_authentication_and_the_agents_route_names_the_auth_methods() {
    let state = temp_dir("acp-ready-auth");
    let switch = state.join("needs-auth");
    std::fs::write(&switch, b"").expect("switch");
    let (s, w) = (state.clone(), switch.clone());
    let server = TestServer::with(move |c| c.agents = vec![with_auth_switch(&s, &w, "new")]).await;
    assert_eq!(readyz(&server).await.0, 200, "nothing known yet");
    assert_eq!(agent_entry(&server, "scripted").await["state"], "ready");

    let failed = run(&server, "scripted", &turns("ra", &["hello"])).await;
    let error = terminal(&failed);
    assert_eq!(error.data["code"], "AUTH_REQUIRED");
    let message = error.data["message"].as_str().expect("message");
    assert!(
        message.contains("scripted-key") && message.contains("oauth-personal"),
        "the error says what to do: {message}"
    );
    let (status, body) = readyz(&server).await;
    assert_eq!(status, 503, "an agent that wants credentials is not ready");
    assert!(
        !body.contains("scripted") && !body.contains("auth"),
        "no names or details: {body}"
    );
    let entry = agent_entry(&server, "scripted").await;
    assert_eq!(entry["state"], "auth_required");
    assert_eq!(
        entry["authMethods"],
        json!([
            {"id": "scripted-key", "name": "API key",
             "description": "Set SCRIPTED_KEY in the agent's environment"},
            {"id": "oauth-personal", "name": "Log in with a browser",
             "description": "Run the agent once in a terminal and log in"}
        ])
    );
    assert!(
        entry["detail"]
            .as_str()
            .expect("detail")
            .contains("scripted-key")
    );
    let r = client().get(server.url("/agents")).sent().await;
    assert_eq!(r.status(), 401, "the agents route is authenticated");

    // Credentials arrive: readiness probes find out without any run.
    std::fs::remove_file(&switch).expect("credentials");
    let mut ready = false;
    for _ in 0..100 {
        if readyz(&server).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "readyz back to 200 once the agent takes sessions");
    let entry = agent_entry(&server, "scripted").await;
    assert_eq!(entry["state"], "ready");
    assert!(entry.get("authMethods").is_none(), "{entry}");
}

#[tokio::test]
async fn an_agent_that_keeps_crashing_is_a_crash_loop_until_a_turn_works() {
    let state = temp_dir("acp-crash-loop");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    for i in 0..3 {
        let frames = run(
            &server,
            "scripted",
            &run_body(&format!("cl{i}"), "r", "crash"),
        )
        .await;
        assert_eq!(terminal(&frames).data["code"], "AGENT_EXITED");
        if i < 2 {
            assert_eq!(readyz(&server).await.0, 200, "one exit is not a loop");
        }
    }
    assert_eq!(readyz(&server).await.0, 503);
    assert_eq!(
        agent_entry(&server, "scripted").await["state"],
        "crash_loop"
    );
    assert_eq!(
        agent_entry(&server, "scripted-allow").await["state"],
        "ready",
        "per agent"
    );
    let frames = run(&server, "scripted", &run_body("cl-ok", "r", "hello")).await;
    assert_eq!(text_of(&frames), "Echo: hello");
    assert_eq!(readyz(&server).await.0, 200);
}

#[tokio::test]
async fn an_agent_whose_command_is_missing_is_unavailable_on_the_agents_route() {
    let server = TestServer::with(|c| {
        c.agents = vec![AgentConfig {
            name: "missing".into(),
            description: String::new(),
            hitl: Hitl::Tool,
            multitask: Default::default(),
            history: Default::default(),
            budget: None,
            kind: AgentKind::Acp(AcpConfig {
                command: vec!["/nonexistent/agent-binary".into()],
                cwd: None,
                env: Default::default(),
                pool_size: 1,
                idle_ttl: Duration::from_secs(60),
                permissions: Permissions::Ask,
                frontend_mcp: FrontendMcp::Auto,
                ..AcpConfig::new(Vec::new())
            }),
        }];
    })
    .await;
    let entry = agent_entry(&server, "missing").await;
    assert_eq!(entry["state"], "unavailable");
    assert!(
        entry["detail"]
            .as_str()
            .expect("detail")
            .contains("command")
    );
}

#[tokio::test]
async fn a_tool_call_is_named_by_its_title_when_that_is_a_name_and_keeps_its_details() {
    let state = temp_dir("acp-names");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let frames = run(&server, "scripted", &turns("tn", &["tools"])).await;
    let names: Vec<&Value> = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_START")
        .map(|f| &f.data["toolCallName"])
        .collect();
    assert_eq!(
        names,
        [&json!("get_weather"), &json!("read")],
        "a title that is a name names the call; a sentence leaves it to the kind"
    );
    let details: Vec<&Value> = frames
        .iter()
        .filter(|f| f.kind() == "CUSTOM" && f.data["name"] == "acp.tool_call")
        .map(|f| &f.data["value"])
        .collect();
    assert_eq!(
        details,
        [
            &json!({"toolCallId": "call_1", "title": "get_weather", "kind": "execute"}),
            &json!({"toolCallId": "call_2", "title": "List the files", "kind": "read",
                    "locations": [{"path": "/src"}]}),
        ]
    );
    let first_start = frames
        .iter()
        .position(|f| f.kind() == "TOOL_CALL_START")
        .expect("start");
    let first_details = frames
        .iter()
        .position(|f| f.kind() == "CUSTOM")
        .expect("details");
    assert!(
        first_details < first_start,
        "the details come before the call"
    );
}

#[tokio::test]
async fn an_acp_agent_shows_components_through_emit_ui_over_mcp() {
    let state = temp_dir("acp-ui");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let ask = |thread: &str, component: &str, props: Value| {
        let call = json!({"component": component, "props": props});
        json!({"threadId": thread, "runId": format!("{thread}-r"), "protocolVersion": "1.0",
            "messages": [{"id": format!("{thread}-u"), "role": "user",
                "content": format!("mcp emit_ui {call}")}]})
    };
    let shown = run(
        &server,
        "scripted",
        &ask(
            "ui-ok",
            "progress",
            json!({"label": "Indexing", "percent": 40}),
        ),
    )
    .await;
    let activity = shown
        .iter()
        .find(|f| f.kind() == "ACTIVITY_SNAPSHOT")
        .unwrap_or_else(|| panic!("no activity: {:?}", kinds(&shown)));
    assert_eq!(activity.data["activityType"], "progress");
    assert_eq!(activity.data["content"]["percent"], 40);
    let (_, messages) = get_json(&server, "/threads/ui-ok/messages").await;
    assert!(
        messages["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .any(|m| m["role"] == "activity" && m["activityType"] == "progress")
    );
    // Off the list: nothing shown, and the agent got the reason as its tool's error.
    let refused = run(
        &server,
        "scripted",
        &ask("ui-no", "script_runner", json!({"code": "alert(1)"})),
    )
    .await;
    assert!(!refused.iter().any(|f| f.kind() == "ACTIVITY_SNAPSHOT"));
    let result = refused
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("the agent reports the tool's result");
    assert!(
        result.data["content"]
            .as_str()
            .expect("text")
            .contains("unknown component"),
        "{result:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_update_between_turns_is_shown_by_the_next_turn() {
    let state = temp_dir("acp-late");
    let s = state.clone();
    let server = TestServer::with(move |c| configure(c, &s)).await;
    let first = run(
        &server,
        "scripted",
        &turns("late", &["late-title Named afterwards"]),
    )
    .await;
    assert_eq!(text_of(&first), "Titled later.");
    // The title comes after the turn ended: nobody listens to the session then.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = run(
        &server,
        "scripted",
        &turns("late", &["late-title Named afterwards", "hello"]),
    )
    .await;
    assert_eq!(text_of(&second), "Echo: hello");
    let state = apply_state(&second, None).expect("state");
    assert_eq!(state["title"], "Named afterwards", "{state}");
    let (_, thread) = get_json(&server, "/threads/late").await;
    assert_eq!(thread["title"], "Named afterwards");
}

#[tokio::test]
async fn a_cold_burst_of_new_threads_spreads_over_the_pool() {
    let state = temp_dir("acp-burst");
    let s = state.clone();
    let server = TestServer::with(move |c| {
        c.agents = vec![acp_agent("pooled", Permissions::Ask, 2, &s)];
    })
    .await;
    let bodies: Vec<Value> = (0..4)
        .map(|i| run_body(&format!("burst{i}"), &format!("burst-r{i}"), "pid"))
        .collect();
    let runs = bodies.iter().map(|body| run(&server, "pooled", body));
    let pids: std::collections::HashSet<String> = futures_util::future::join_all(runs)
        .await
        .iter()
        .map(|frames| text_of(frames))
        .collect();
    assert_eq!(
        pids.len(),
        2,
        "four new threads on both processes: {pids:?}"
    );
}
