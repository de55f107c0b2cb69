//! The newer ACP surface against the scripted agent (`examples/scripted_acp_agent.rs`):
//! end-of-turn token usage, form elicitation (as an interrupt and as a tool call),
//! subagents, modes and config options set from the client, the agent's sessions listed
//! and imported as threads, threads forked, and multimodal input mapped to the blocks the
//! agent takes (or refused by name).

mod support;

use std::time::Duration;

use agui_serve::config::{
    AcpConfig, AgentConfig, AgentKind, Config, FrontendMcp, Hitl, Permissions,
};
use serde_json::{Value, json};
use support::*;

fn agent(name: &str, hitl: Hitl, state: &std::path::Path) -> AgentConfig {
    let mut env = std::collections::BTreeMap::new();
    env.insert(
        "SCRIPTED_AGENT_STATE".to_owned(),
        state.to_str().expect("utf8").to_owned(),
    );
    AgentConfig {
        name: name.to_owned(),
        description: "scripted ACP agent".to_owned(),
        hitl,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(AcpConfig {
            command: vec![scripted_agent().to_str().expect("utf8").to_owned()],
            cwd: None,
            env,
            pool_size: 1,
            idle_ttl: Duration::from_secs(600),
            permissions: Permissions::Ask,
            frontend_mcp: FrontendMcp::Auto,
            sandbox: agui_serve::confine::Sandbox {
                write: vec![state.to_owned()],
                ..Default::default()
            },
            ..AcpConfig::new(Vec::new())
        }),
    }
}

async fn server(tag: &str) -> TestServer {
    server_on(&temp_dir(tag), None).await
}

/// The scripted agents keeping their sessions in `state`, and the demo agent; on the data
/// directory `data` when given.
async fn server_on(state: &std::path::Path, data: Option<&std::path::Path>) -> TestServer {
    let (state, data) = (state.to_owned(), data.map(std::path::Path::to_owned));
    TestServer::with(move |c: &mut Config| {
        c.agents = vec![
            agent("scripted", Hitl::Tool, &state),
            agent("scripted-interrupt", Hitl::Interrupt, &state),
            AgentConfig::demo(),
        ];
        if let Some(data) = data {
            c.data_dir = data;
        }
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

fn only<'a>(frames: &'a [SseFrame], kind: &str) -> &'a SseFrame {
    let found: Vec<&SseFrame> = frames.iter().filter(|f| f.kind() == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in {:?}", kinds(frames));
    found[0]
}

/// The same transcript as the client would send it: every user message so far.
fn turns(thread: &str, run: &str, texts: &[&str], legacy: bool) -> Value {
    let messages: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": format!("{thread}-u{i}"), "role": "user", "content": t}))
        .collect();
    let mut body = json!({"threadId": thread, "runId": run, "messages": messages});
    if !legacy {
        body["protocolVersion"] = json!("1.0");
    }
    body
}

#[tokio::test]
async fn end_of_turn_usage_is_run_finished_usage_and_adds_up_in_state() {
    let server = server("acp-usage").await;
    let first = run(&server, "scripted", &turns("u", "r1", &["usage"], false)).await;
    let finished = only(&first, "RUN_FINISHED");
    let expected = json!([{"inputTokens": 100, "outputTokens": 50, "totalTokens": 150,
        "reasoningTokens": 10, "cachedInputTokens": 20}]);
    assert_eq!(finished.data["usage"], expected);
    let view = apply_state(&first, None).expect("state");
    assert_eq!(view["usage"]["turn"], expected[0]);
    assert_eq!(view["usage"]["total"], expected[0]);
    // The context-window report and the token counts live side by side.
    assert_eq!(view["usage"]["used"], 1200);

    // A turn without usage reports none.
    let plain = run(
        &server,
        "scripted",
        &turns("u", "r2", &["usage", "hi"], false),
    )
    .await;
    assert!(only(&plain, "RUN_FINISHED").data.get("usage").is_none());

    // The pre-1.0 profile does not get the 1.0 field, but the state still adds up.
    let legacy = run(
        &server,
        "scripted",
        &turns("u", "r3", &["usage", "hi", "usage"], true),
    )
    .await;
    assert!(only(&legacy, "RUN_FINISHED").data.get("usage").is_none());
    let view = apply_state(&legacy, None).expect("state");
    assert_eq!(view["usage"]["turn"]["inputTokens"], 100);
    assert_eq!(view["usage"]["total"]["inputTokens"], 200);
    assert_eq!(view["usage"]["total"]["totalTokens"], 300);
}

fn form_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "title": "Name", "minLength": 1},
            "age": {"type": "integer", "minimum": 0},
            "color": {"type": "string", "enum": ["red", "blue"]}
        },
        "required": ["name"]
    })
}

#[tokio::test]
async fn a_form_is_an_interrupt_with_its_schema_answered_through_resume() {
    let server = server("acp-elicit-int").await;
    let agent = "scripted-interrupt";
    let asked = run(&server, agent, &turns("e", "r1", &["elicit"], false)).await;
    let outcome = &only(&asked, "RUN_FINISHED").data["outcome"];
    assert_eq!(outcome["type"], "interrupt");
    let interrupt = &outcome["interrupts"][0];
    assert_eq!(interrupt["reason"], "input_required");
    assert_eq!(interrupt["message"], "Who are you?");
    assert_eq!(interrupt["responseSchema"], form_schema());
    let id = interrupt["id"].clone();

    // Values that do not fit the schema are refused in-band; the form still waits.
    let mut bad = turns("e", "r2", &["elicit"], false);
    bad["resume"] = json!([{"interruptId": id, "status": "resolved", "payload": {"age": 3}}]);
    let refused = run(&server, agent, &bad).await;
    assert_eq!(only(&refused, "RUN_ERROR").data["code"], "INVALID_RESUME");

    let mut good = turns("e", "r3", &["elicit"], false);
    good["resume"] = json!([{"interruptId": id, "status": "resolved",
        "payload": {"name": "Ada", "age": 36}}]);
    let answered = run(&server, agent, &good).await;
    assert_eq!(
        text_of(&answered),
        r#"Form accepted: {"age":36,"name":"Ada"}"#
    );

    // Dismissing the form declines it.
    let asked = run(&server, agent, &turns("e2", "r1", &["elicit"], false)).await;
    let id = only(&asked, "RUN_FINISHED").data["outcome"]["interrupts"][0]["id"].clone();
    let mut dismissed = turns("e2", "r2", &["elicit"], false);
    dismissed["resume"] = json!([{"interruptId": id, "status": "cancelled"}]);
    assert_eq!(
        text_of(&run(&server, agent, &dismissed).await),
        "Form declined."
    );
}

async fn elicit_by_tool(server: &TestServer, thread: &str, answer: &str) -> Vec<SseFrame> {
    let user = json!({"id": format!("{thread}-u"), "role": "user", "content": "elicit"});
    let body = json!({"threadId": thread, "runId": "r1", "protocolVersion": "1.0",
        "messages": [user]});
    let first = run(server, "scripted", &body).await;
    let start = only(&first, "TOOL_CALL_START");
    assert_eq!(start.data["toolCallName"], "agui_input_request");
    let call_id = start.data["toolCallId"].as_str().expect("id").to_owned();
    let args: Value = serde_json::from_str(
        only(&first, "TOOL_CALL_ARGS").data["delta"]
            .as_str()
            .expect("args"),
    )
    .expect("JSON arguments");
    assert_eq!(args["message"], "Who are you?");
    assert_eq!(args["schema"], form_schema());
    assert_eq!(
        only(&first, "RUN_FINISHED").data["outcome"]["pendingToolCallIds"],
        json!([call_id])
    );
    let body = json!({"threadId": thread, "runId": "r2", "protocolVersion": "1.0", "messages": [
        user,
        {"id": format!("{thread}-a"), "role": "assistant", "toolCalls": [
            {"id": call_id, "type": "function", "function": {"name": "agui_input_request", "arguments": "{}"}}]},
        {"id": format!("{thread}-t"), "role": "tool", "toolCallId": call_id, "content": answer}
    ]});
    run(server, "scripted", &body).await
}

#[tokio::test]
async fn a_form_is_an_agui_input_request_tool_call_in_the_tool_style() {
    let server = server("acp-elicit-tool").await;
    let accepted = elicit_by_tool(
        &server,
        "t1",
        r#"{"action":"accept","content":{"name":"Bo","color":"blue"}}"#,
    )
    .await;
    assert_eq!(
        text_of(&accepted),
        r#"Form accepted: {"color":"blue","name":"Bo"}"#
    );
    let declined = elicit_by_tool(&server, "t2", r#"{"action":"decline"}"#).await;
    assert_eq!(text_of(&declined), "Form declined.");
    // Values that do not fit the form fail closed.
    let unfit = elicit_by_tool(
        &server,
        "t3",
        r#"{"action":"accept","content":{"color":"green"}}"#,
    )
    .await;
    assert_eq!(text_of(&unfit), "Form cancelled.");
}

#[tokio::test]
async fn subagents_are_subagent_events_in_both_profiles() {
    let server = server("acp-subagent").await;
    for legacy in [false, true] {
        let thread = if legacy { "s-legacy" } else { "s" };
        let frames = run(
            &server,
            "scripted",
            &turns(thread, "r1", &["subagent"], legacy),
        )
        .await;
        let started = only(&frames, "SUBAGENT_STARTED");
        let id = started.data["subagentRunId"]
            .as_str()
            .expect("id")
            .to_owned();
        assert!(id.starts_with("sub-sess-"), "{id}");
        assert_eq!(started.data["name"], "researcher");
        assert_eq!(started.data["description"], "looks things up");
        // Its message is its own; its other updates come as CUSTOM events.
        let said = frames
            .iter()
            .find(|f| f.kind() == "TEXT_MESSAGE_START" && f.data.get("subagentRunId").is_some())
            .expect("the subagent's message");
        assert_eq!(said.data["subagentRunId"], id.as_str());
        let message = said.data["messageId"].clone();
        let of_it = |f: &&SseFrame| f.data["messageId"] == message;
        for frame in frames.iter().filter(of_it) {
            assert_eq!(frame.data["subagentRunId"], id.as_str(), "{:?}", frame.data);
        }
        let words: String = frames
            .iter()
            .filter(of_it)
            .filter_map(|f| f.data["delta"].as_str())
            .collect();
        assert_eq!(words, "Looking it up.");
        let plan = only(&frames, "CUSTOM");
        assert_eq!(plan.data["name"], "acp.subagent.plan");
        assert_eq!(plan.data["value"]["subagentRunId"], id.as_str());
        assert_eq!(
            plan.data["value"]["update"]["entries"][0]["content"],
            "search"
        );
        let finished = only(&frames, "SUBAGENT_FINISHED");
        assert_eq!(finished.data["subagentRunId"], id.as_str());
        assert_eq!(finished.data["outcome"], json!({"type": "success"}));
        let k = kinds(&frames);
        let at = |kind: &str| k.iter().position(|x| x == kind).expect(kind);
        assert!(at("SUBAGENT_STARTED") < at("TEXT_MESSAGE_START"));
        assert!(at("TEXT_MESSAGE_END") < at("SUBAGENT_FINISHED"));
        assert!(at("CUSTOM") < at("SUBAGENT_FINISHED"));
        // The agent's own reply is not the subagent's.
        let own: String = frames
            .iter()
            .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT" && f.data.get("subagentRunId").is_none())
            .filter_map(|f| f.data["delta"].as_str())
            .collect();
        assert_eq!(own, "Subagent done.");
    }

    let failed = run(
        &server,
        "scripted",
        &turns("sf", "r1", &["subagent-fail"], false),
    )
    .await;
    let error = only(&failed, "SUBAGENT_ERROR");
    assert_eq!(error.data["message"], "the lookup failed");
    assert!(failed.iter().all(|f| f.kind() != "SUBAGENT_FINISHED"));
    assert_eq!(only(&failed, "RUN_FINISHED").data["threadId"], "sf");
}

#[tokio::test]
async fn modes_and_config_options_are_set_through_forwarded_props() {
    let server = server("acp-settings").await;
    let first = run(&server, "scripted", &turns("m", "r1", &["settings"], false)).await;
    assert_eq!(
        text_of(&first),
        "Mode: code; model: fast; fast_apply: false; sets: 0"
    );
    let view = apply_state(&first, None).expect("state");
    assert_eq!(view["mode"], "code");
    assert_eq!(view["modes"][1], json!({"id": "plan", "name": "Plan"}));
    assert_eq!(view["config"]["configOptions"][0]["currentValue"], "fast");

    let mut body = turns("m", "r2", &["settings", "settings"], false);
    body["forwardedProps"] = json!({"acp": {"mode": "plan",
        "configOptions": {"model": "smart", "fast_apply": true}}});
    let set = run(&server, "scripted", &body).await;
    assert_eq!(
        text_of(&set),
        "Mode: plan; model: smart; fast_apply: true; sets: 2"
    );
    let view = apply_state(&set, None).expect("state");
    assert_eq!(view["mode"], "plan");
    let options = &view["config"]["configOptions"];
    assert_eq!(options[0]["currentValue"], "smart");
    assert_eq!(options[1]["currentValue"], true);

    // The same settings again (a client sends its forwardedProps with every run): the
    // state already shows them, so the agent is not asked again.
    let mut again = turns("m", "r2b", &["settings", "settings", "settings"], false);
    again["forwardedProps"] = body["forwardedProps"].clone();
    let same = run(&server, "scripted", &again).await;
    assert_eq!(
        text_of(&same),
        "Mode: plan; model: smart; fast_apply: true; sets: 2"
    );

    // A malformed setting is a 400 naming the field, before any stream; one the agent
    // refuses fails the run with the agent's reason.
    let mut malformed = turns("m", "r3", &["settings", "settings", "settings"], false);
    malformed["forwardedProps"] = json!({"acp": {"mode": 3}});
    let response = post_run(&server, "scripted", &malformed).await;
    assert_eq!(response.status().as_u16(), 400);
    let error: Value = response.json().await.expect("JSON error");
    assert_eq!(error["code"], "INVALID_INPUT");
    assert_eq!(error["field"], "forwardedProps.acp.mode");
    let mut refused = turns("m", "r4", &["settings", "settings", "settings", "x"], false);
    refused["forwardedProps"] = json!({"acp": {"mode": "nope"}});
    let frames = run(&server, "scripted", &refused).await;
    let error = only(&frames, "RUN_ERROR");
    assert_eq!(error.data["code"], "AGENT_ERROR");
    assert!(
        error.data["message"]
            .as_str()
            .expect("message")
            .contains("mode \"nope\"")
    );
}

async fn post_json(server: &TestServer, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = server.post(path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "JSON for {path}"
    );
    (status, response.json().await.expect("JSON body"))
}

fn contents(messages: &Value) -> Vec<(String, String)> {
    messages
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().expect("role").to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_agent_s_sessions_are_listed_and_one_is_imported_as_a_thread() {
    let state = temp_dir("acp-import-state");
    // Sessions made elsewhere: by another daemon on its own data directory.
    let elsewhere = server_on(&state, Some(&temp_dir("acp-import-a"))).await;
    run(
        &elsewhere,
        "scripted",
        &turns("orig", "r1", &["hello one"], false),
    )
    .await;
    let second = run(
        &elsewhere,
        "scripted",
        &turns("orig", "r2", &["hello one", "hello two"], false),
    )
    .await;
    let view = apply_state(&second, None).expect("state");
    let session = view["session"].as_str().expect("session").to_owned();
    elsewhere.stop().await;

    let server = server_on(&state, Some(&temp_dir("acp-import-b"))).await;
    let (status, listed) = get_json(&server, "/agents/scripted/sessions").await;
    assert_eq!(status, 200, "{listed}");
    let entry = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["sessionId"] == session.as_str())
        .expect("the session is listed")
        .clone();
    assert_eq!(entry["title"], "hello one");

    let (status, imported) = post_json(
        &server,
        &format!("/agents/scripted/sessions/{session}/import"),
        None,
    )
    .await;
    assert_eq!(status, 201, "{imported}");
    assert_eq!(imported["messageCount"], 4);
    let thread = imported["threadId"].as_str().expect("thread").to_owned();
    let (_, messages) = get_json(&server, &format!("/threads/{thread}/messages")).await;
    let expected: Vec<(String, String)> = [
        ("user", "hello one"),
        ("assistant", "Echo: hello one"),
        ("user", "hello two"),
        ("assistant", "Echo: hello two"),
    ]
    .iter()
    .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(contents(&messages["messages"]), expected);
    let (_, row) = get_json(&server, &format!("/threads/{thread}")).await;
    assert_eq!(row["title"], "hello one");
    assert_eq!(row["status"], "idle");
    assert_eq!(
        row["metadata"]["session"],
        json!({"id": session, "how": "imported"})
    );

    // Hydration serves it like any thread.
    let response = server
        .get(&format!("/threads/{thread}/stream"))
        .send()
        .await
        .expect("stream");
    let frames = SseReader::new(response).collect().await;
    let snapshot = only(&frames, "MESSAGES_SNAPSHOT");
    assert_eq!(contents(&snapshot.data["messages"]), expected);

    // The thread goes on in the imported session: only the new message is prompted.
    let mut body = turns(&thread, "r3", &["recall"], false);
    let mut history = messages["messages"].as_array().expect("messages").clone();
    history.push(body["messages"][0].clone());
    body["messages"] = Value::Array(history);
    let frames = run(&server, "scripted", &body).await;
    assert_eq!(text_of(&frames), "Heard: recall");
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(view["session"], session.as_str());

    // Refusals, each a JSON error before anything is created.
    let path = format!("/agents/scripted/sessions/{session}/import");
    let (status, error) = post_json(&server, &path, None).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (409, Some("SESSION_IN_USE"))
    );
    let (status, error) =
        post_json(&server, "/agents/scripted/sessions/sess-nope/import", None).await;
    assert_eq!((status, error["code"].as_str()), (404, Some("NOT_FOUND")));
    let (status, error) = post_json(
        &server,
        "/agents/scripted/sessions/sess-nope/import",
        Some(json!({"threadId": thread})),
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (409, Some("THREAD_EXISTS"))
    );
    let (status, error) = post_json(
        &server,
        "/agents/scripted/sessions/sess-nope/import",
        Some(json!({"threadId": 5})),
    )
    .await;
    assert_eq!((status, error["field"].as_str()), (400, Some("threadId")));
    let (status, error) = get_json(&server, "/agents/demo/sessions").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("NOT_SUPPORTED"))
    );
    let (status, error) = get_json(&server, "/agents/nope/sessions").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("UNKNOWN_AGENT"))
    );
    let unauthenticated = client()
        .get(server.url("/agents/scripted/sessions"))
        .send()
        .await
        .expect("request");
    assert_eq!(unauthenticated.status(), 401);
}

#[tokio::test]
async fn a_thread_forks_into_a_new_thread_on_a_forked_session() {
    let server = server("acp-fork").await;
    let first = run(
        &server,
        "scripted",
        &turns("f", "r1", &["hello one"], false),
    )
    .await;
    let session = apply_state(&first, None).expect("state")["session"].clone();

    let (status, forked) = post_json(
        &server,
        "/threads/f/fork",
        Some(json!({"threadId": "f-copy"})),
    )
    .await;
    assert_eq!(status, 201, "{forked}");
    assert_eq!(forked["threadId"], "f-copy");
    assert_eq!(forked["forkedFrom"], "f");
    assert_eq!(forked["messageCount"], 2);
    assert_ne!(forked["sessionId"], session, "a session of its own");
    let (_, original) = get_json(&server, "/threads/f/messages").await;
    let (_, copy) = get_json(&server, "/threads/f-copy/messages").await;
    assert_eq!(contents(&copy["messages"]), contents(&original["messages"]));
    let (_, row) = get_json(&server, "/threads/f-copy").await;
    assert_eq!(row["metadata"]["session"]["how"], "forked");

    // Each goes on on its own session.
    let mut body = turns("f-copy", "r2", &["recall"], false);
    let mut history = copy["messages"].as_array().expect("messages").clone();
    history.push(body["messages"][0].clone());
    body["messages"] = Value::Array(history);
    let frames = run(&server, "scripted", &body).await;
    assert_eq!(text_of(&frames), "Heard: recall");
    assert_eq!(
        apply_state(&frames, None).expect("state")["session"],
        forked["sessionId"]
    );
    let frames = run(
        &server,
        "scripted",
        &turns("f", "r2", &["hello one", "recall"], false),
    )
    .await;
    assert_eq!(text_of(&frames), "Heard: hello one | recall");

    // Refusals.
    let (status, error) = post_json(&server, "/threads/nope/fork", None).await;
    assert_eq!((status, error["code"].as_str()), (404, Some("NOT_FOUND")));
    let (status, error) =
        post_json(&server, "/threads/f/fork", Some(json!({"threadId": "f"}))).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (409, Some("THREAD_EXISTS"))
    );
    run(&server, "demo", &turns("d", "r1", &["hi"], false)).await;
    let (status, error) = post_json(&server, "/threads/d/fork", None).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("NOT_SUPPORTED"))
    );
    // Not while a run is live on the thread.
    let live = post_run(
        &server,
        "scripted",
        &turns("busy", "r1", &["slow 40"], false),
    )
    .await;
    let mut reader = SseReader::new(live);
    let started = reader.next().await.expect("a frame");
    assert_eq!(started.kind(), "RUN_STARTED");
    let (status, error) = post_json(&server, "/threads/busy/fork", None).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (409, Some("RUN_IN_PROGRESS"))
    );
    let rest = reader.collect().await;
    assert_eq!(rest.last().expect("terminal").kind(), "RUN_FINISHED");
}

/// A run that parks on the client while the daemon is already shutting down fails closed
/// at once, like one parked before: the shutdown waits for the other run, not the grace.
#[tokio::test]
async fn a_run_that_parks_during_shutdown_ends_at_once() {
    let state = temp_dir("acp-drain");
    let grace = Duration::from_secs(30);
    let server = TestServer::with(move |c: &mut Config| {
        c.agents = vec![agent("scripted", Hitl::Tool, &state)];
        c.shutdown_grace = grace;
    })
    .await;
    // One run keeps the drain busy for about 2 s; the other asks permission after 1 s.
    let busy = post_run(
        &server,
        "scripted",
        &turns("busy", "r-busy", &["slow 40"], false),
    )
    .await;
    let parking = post_run(
        &server,
        "scripted",
        &turns("park", "r-park", &["permission-later"], false),
    )
    .await;
    assert_eq!(
        (busy.status().as_u16(), parking.status().as_u16()),
        (200, 200)
    );
    let (mut busy, mut parking) = (SseReader::new(busy), SseReader::new(parking));
    assert_eq!(busy.next().await.expect("frame").kind(), "RUN_STARTED");
    assert_eq!(parking.next().await.expect("frame").kind(), "RUN_STARTED");
    let busy = tokio::spawn(busy.collect());
    let parking = tokio::spawn(parking.collect());
    let begun = std::time::Instant::now();
    server.stop().await;
    let took = begun.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?} with a {grace:?} grace"
    );
    let parked = parking.await.expect("reader");
    let terminal = parked.last().expect("terminal");
    assert!(
        terminal.data["outcome"]["pendingToolCallIds"].is_array(),
        "the run parked: {:?}",
        kinds(&parked)
    );
    let busy = busy.await.expect("reader");
    assert_eq!(busy.last().expect("terminal").kind(), "RUN_FINISHED");
}

/// A form nobody answers fails closed: the agent is told `cancel`, and the turn goes on in
/// a continuation segment that records the unanswered call.
#[tokio::test]
async fn an_unanswered_form_is_cancelled_after_the_suspension_timeout() {
    let state = temp_dir("acp-elicit-timeout");
    let server = TestServer::with(move |c: &mut Config| {
        c.agents = vec![agent("scripted", Hitl::Tool, &state)];
        c.suspend_timeout = Duration::from_millis(300);
    })
    .await;
    let asked = run(
        &server,
        "scripted",
        &turns("late", "r1", &["elicit"], false),
    )
    .await;
    let call = only(&asked, "TOOL_CALL_START").data["toolCallId"].clone();
    let last = asked.last().expect("terminal");
    assert!(last.data["outcome"]["pendingToolCallIds"].is_array());
    // Follow the run from where the segment ended: its continuation.
    let response = server
        .get("/threads/late/stream")
        .header("last-event-id", last.id.clone().expect("event id"))
        .send()
        .await
        .expect("stream");
    assert_eq!(response.headers()["agui-resume"], "exact");
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    let result = only(&frames, "TOOL_CALL_RESULT");
    assert_eq!(result.data["toolCallId"], call);
    assert!(
        result.data["content"]
            .as_str()
            .expect("content")
            .starts_with("cancelled: "),
        "{:?}",
        result.data
    );
    assert_eq!(text_of(&frames), "Form cancelled.");
}

fn media(kind: &str, source: Value) -> Value {
    json!({"type": kind, "source": source})
}

fn data(value: &str, mime_type: &str) -> Value {
    json!({"type": "data", "value": value, "mimeType": mime_type})
}

fn user_parts(id: &str, parts: Value) -> Value {
    json!({"id": id, "role": "user", "content": parts})
}

/// The prompt blocks the scripted agent reports for its `blocks` command.
fn blocks_heard(frames: &[SseFrame]) -> Value {
    let text = text_of(frames);
    let json = text.strip_prefix("Blocks: ").expect("a blocks report");
    serde_json::from_str(json).expect("JSON blocks")
}

#[tokio::test]
async fn audio_documents_and_urls_reach_the_agent_as_the_blocks_it_takes() {
    // The scripted agent takes audio and embedded resources, not images.
    let server = server("acp-parts").await;
    let parts = json!([
        {"type": "text", "text": "blocks"},
        media("audio", data("UklGRg==", "audio/wav")),
        media("document", data("JVBERi0x", "application/pdf")),
        media("image", json!({"type": "url", "value": "https://x.test/cat.png", "mimeType": "image/png"})),
        {"type": "binary", "mimeType": "text/csv", "data": "YSxiCjEsMgo=", "filename": "t.csv"},
    ]);
    let mut body = turns("p", "r1", &[], false);
    body["messages"] = json!([user_parts("p-u0", parts)]);
    let frames = run(&server, "scripted", &body).await;
    assert_eq!(
        blocks_heard(&frames),
        json!([
            {"type": "text", "text": "blocks"},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"blob": "JVBERi0x",
                "mimeType": "application/pdf", "uri": "agui:message/p-u0/content/2"}},
            {"type": "resource_link", "name": "cat.png", "uri": "https://x.test/cat.png",
                "mimeType": "image/png"},
            {"type": "resource", "resource": {"text": "a,b\n1,2\n",
                "mimeType": "text/csv", "uri": "agui:message/p-u0/content/4/t.csv"}},
        ])
    );
    only(&frames, "RUN_FINISHED");
}

#[tokio::test]
async fn an_image_to_an_agent_without_images_is_a_400_naming_the_part() {
    let server = server("acp-no-images").await;
    // The agent has started once: its capabilities are known.
    let first = run(&server, "scripted", &turns("i", "r1", &["hello"], false)).await;
    assert_eq!(text_of(&first), "Echo: hello");

    let mut body = turns("i", "r2", &["hello"], false);
    body["messages"]
        .as_array_mut()
        .expect("messages")
        .push(user_parts(
            "i-u1",
            json!([{"type": "text", "text": "what is this?"},
            media("image", data("iVBORw0K", "image/png"))]),
        ));
    let response = post_run(&server, "scripted", &body).await;
    assert_eq!(response.status().as_u16(), 400);
    let error: Value = response.json().await.expect("JSON error");
    assert_eq!(error["code"], "INVALID_INPUT");
    assert_eq!(error["field"], "messages[1].content[1]");
    let message = error["message"].as_str().expect("message");
    assert!(
        message.contains("an image part (image/png)")
            && message.contains("agent \"scripted\" does not accept images"),
        "{message}"
    );
    // A new thread refused so is not made at all.
    let mut fresh = body.clone();
    fresh["threadId"] = json!("i2");
    assert_eq!(
        post_run(&server, "scripted", &fresh)
            .await
            .status()
            .as_u16(),
        400
    );
    assert_eq!(get_json(&server, "/threads/i2").await.0, 404);

    // Nothing of it reached the agent; the thread goes on.
    let next = run(
        &server,
        "scripted",
        &turns("i", "r3", &["hello", "recall"], false),
    )
    .await;
    assert_eq!(text_of(&next), "Heard: hello | recall");
}

#[tokio::test]
async fn an_image_sent_before_the_agent_ever_started_fails_the_run_before_its_prompt() {
    let server = server("acp-no-images-yet").await;
    let image = user_parts(
        "n-u0",
        json!([{"type": "text", "text": "blocks"},
            media("image", data("iVBORw0K", "image/png"))]),
    );
    let mut body = turns("n", "r1", &[], false);
    body["messages"] = json!([image.clone()]);
    let frames = run(&server, "scripted", &body).await;
    let error = only(&frames, "RUN_ERROR");
    assert_eq!(error.data["code"], "INVALID_INPUT");
    let message = error.data["message"].as_str().expect("message");
    assert!(
        message.contains("`messages[0].content[1]`: an image part (image/png)")
            && message.contains("does not accept images"),
        "{message}"
    );
    assert!(frames.iter().all(|f| f.kind() != "RUN_FINISHED"));

    // The client keeps the message in its transcript; it is not prompted again, and the
    // agent never heard any of it.
    let mut next = turns("n", "r2", &[], false);
    next["messages"] = json!([image, {"id": "n-u1", "role": "user", "content": "recall"}]);
    let frames = run(&server, "scripted", &next).await;
    assert_eq!(text_of(&frames), "Heard: recall");
}

#[tokio::test]
async fn an_acp_agent_s_capabilities_say_what_its_initialize_said_once_known() {
    let server = server("acp-caps").await;
    let caps = |info: &Value| info["agents"]["scripted"]["capabilities"].clone();
    let (_, before) = get_json(&server, "/info").await;
    let before = caps(&before);
    assert_eq!(before["identity"]["type"], "agui-serve/acp");
    assert!(
        before.get("multimodal").is_none(),
        "unknown before the agent ever started: {before}"
    );
    run(&server, "scripted", &turns("caps", "r1", &["hello"], false)).await;
    let (_, after) = get_json(&server, "/info").await;
    let after = caps(&after);
    assert_eq!(after["identity"]["provider"], "scripted-acp-agent");
    assert_eq!(after["identity"]["version"], "1.0.0");
    assert_eq!(
        after["multimodal"]["input"],
        json!({"image": false, "audio": true, "pdf": true, "file": true, "video": false}),
        "{after}"
    );
}
