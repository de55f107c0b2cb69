//! The newer ACP surface against the scripted agent (`examples/scripted_acp_agent.rs`):
//! end-of-turn token usage, form elicitation (as an interrupt and as a tool call),
//! subagents, and modes and config options set from the client.

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
        kind: AgentKind::Acp(AcpConfig {
            command: vec![scripted_agent().to_str().expect("utf8").to_owned()],
            cwd: None,
            env,
            pool_size: 1,
            idle_ttl: Duration::from_secs(600),
            permissions: Permissions::Ask,
            frontend_mcp: FrontendMcp::Auto,
        }),
    }
}

async fn server(tag: &str) -> TestServer {
    let state = temp_dir(tag);
    TestServer::with(move |c: &mut Config| {
        c.agents = vec![
            agent("scripted", Hitl::Tool, &state),
            agent("scripted-interrupt", Hitl::Interrupt, &state),
        ];
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
        let said = frames
            .iter()
            .find(|f| f.kind() == "CUSTOM")
            .expect("the subagent's own update");
        assert_eq!(said.data["name"], "acp.subagent.agent_message_chunk");
        assert_eq!(said.data["value"]["subagentRunId"], id.as_str());
        assert_eq!(
            said.data["value"]["update"]["content"]["text"],
            "Looking it up."
        );
        let finished = only(&frames, "SUBAGENT_FINISHED");
        assert_eq!(finished.data["subagentRunId"], id.as_str());
        assert_eq!(finished.data["outcome"], json!({"type": "success"}));
        let k = kinds(&frames);
        let at = |kind: &str| k.iter().position(|x| x == kind).expect(kind);
        assert!(at("SUBAGENT_STARTED") < at("CUSTOM"));
        assert!(at("CUSTOM") < at("SUBAGENT_FINISHED"));
        assert_eq!(text_of(&frames), "Subagent done.");
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
        "Mode: code; model: fast; fast_apply: false"
    );
    let view = apply_state(&first, None).expect("state");
    assert_eq!(view["mode"], "code");
    assert_eq!(view["modes"][1], json!({"id": "plan", "name": "Plan"}));
    assert_eq!(view["config"]["configOptions"][0]["currentValue"], "fast");

    let mut body = turns("m", "r2", &["settings", "settings"], false);
    body["forwardedProps"] = json!({"acp": {"mode": "plan",
        "configOptions": {"model": "smart", "fast_apply": true}}});
    let set = run(&server, "scripted", &body).await;
    assert_eq!(text_of(&set), "Mode: plan; model: smart; fast_apply: true");
    let view = apply_state(&set, None).expect("state");
    assert_eq!(view["mode"], "plan");
    let options = &view["config"]["configOptions"];
    assert_eq!(options[0]["currentValue"], "smart");
    assert_eq!(options[1]["currentValue"], true);

    // A malformed setting, and one the agent refuses, fail the run with a reason.
    let mut malformed = turns("m", "r3", &["settings", "settings", "settings"], false);
    malformed["forwardedProps"] = json!({"acp": {"mode": 3}});
    let frames = run(&server, "scripted", &malformed).await;
    let error = only(&frames, "RUN_ERROR");
    assert_eq!(error.data["code"], "INVALID_INPUT");
    assert!(
        error.data["message"]
            .as_str()
            .expect("message")
            .contains("forwardedProps.acp.mode")
    );
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
