//! Shared state, frontend tools and human in the loop over real sockets: suspension and
//! resume, both permission channels, fail-closed paths, reattach while suspended.

mod support;

use std::time::Duration;

use agui_serve::config::{AgentConfig, Hitl};
use serde_json::{Value, json};
use support::*;

fn tools() -> Value {
    json!([{"name": "chart", "description": "draws a chart", "parameters": {"type": "object"}}])
}

fn body(thread: &str, run: &str, messages: &Value, legacy: bool) -> Value {
    let mut b = json!({"threadId": thread, "runId": run, "messages": messages, "tools": tools()});
    if !legacy {
        b["protocolVersion"] = json!("1.0");
    }
    b
}

async fn run(server: &TestServer, body: &Value) -> Vec<SseFrame> {
    let r = post_run(server, "demo", body).await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert_valid_segment(&frames);
    frames
}

fn tool_call(frames: &[SseFrame]) -> (String, String, String) {
    let start = frames
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_START")
        .expect("a tool call");
    let id = start.data["toolCallId"].as_str().expect("id").to_owned();
    let args: String = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == id.as_str())
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    let name = start.data["toolCallName"]
        .as_str()
        .expect("name")
        .to_owned();
    (id, name, args)
}

async fn thread_status(server: &TestServer, thread: &str) -> Value {
    get_json(server, &format!("/threads/{thread}")).await.1
}

/// A reloaded page's reattach (no cursor) to a run suspended on the client: one whole
/// segment that ends where the run waits, then the stream closes.
async fn reattach_suspended(server: &TestServer, thread: &str) -> Vec<SseFrame> {
    let response = server
        .get(&format!("/threads/{thread}/stream"))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["agui-resume"], "exact");
    let frames = tokio::time::timeout(Duration::from_secs(10), SseReader::new(response).collect())
        .await
        .expect("the stream ends at the suspension point");
    assert_valid_segment(&frames);
    assert_eq!(kinds(&frames), SNAPSHOT_RUN);
    frames
}

#[tokio::test]
async fn frontend_tool_round_trip_for_both_profiles() {
    let server = TestServer::start().await;
    for legacy in [false, true] {
        let thread = format!("tool-{legacy}");
        let user = json!({"id": format!("{thread}-u"), "role": "user", "content": "/tool chart {\"x\":1}"});
        let first = run(&server, &body(&thread, "r1", &json!([user]), legacy)).await;
        let (call_id, name, args) = tool_call(&first);
        assert_eq!(name, "chart");
        assert_eq!(args, "{\"x\":1}");
        let last = first.last().expect("terminal");
        assert_eq!(last.kind(), "RUN_FINISHED");
        if legacy {
            assert!(last.data.get("outcome").is_none(), "{}", last.data);
        } else {
            assert_eq!(last.data["outcome"]["type"], "success");
            assert_eq!(last.data["outcome"]["pendingToolCallIds"], json!([call_id]));
        }
        assert_eq!(thread_status(&server, &thread).await["status"], "suspended");

        let messages = json!([
            user,
            {"id": call_id, "role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {"name": "chart", "arguments": args}}]},
            {"id": format!("{thread}-t"), "role": "tool", "toolCallId": call_id, "content": "a bar chart"}
        ]);
        let second = run(&server, &body(&thread, "r2", &messages, legacy)).await;
        assert_eq!(
            second[0].data["runId"], "r2",
            "the resumed segment runs under the new runId"
        );
        assert!(
            !second.iter().any(|f| f.kind() == "TOOL_CALL_RESULT"),
            "the browser's own result is not echoed back"
        );
        assert_eq!(text_of(&second), "Tool chart returned: a bar chart");
        assert_eq!(thread_status(&server, &thread).await["status"], "idle");
        // The transcript holds the call once, the result and the reply.
        let transcript: Value = get_json(&server, &format!("/threads/{thread}/messages"))
            .await
            .1;
        let roles: Vec<&str> = transcript["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["role"].as_str().expect("role"))
            .collect();
        assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    }
}

#[tokio::test]
async fn a_tool_the_client_does_not_offer_is_not_called() {
    let server = TestServer::start().await;
    let user = json!({"id": "u", "role": "user", "content": "/tool missing {}"});
    let frames = run(&server, &body("nt", "r", &json!([user]), false)).await;
    assert!(!frames.iter().any(|f| f.kind() == "TOOL_CALL_START"));
    assert_eq!(
        text_of(&frames),
        "Tool missing is not available in this client"
    );
}

async fn approve_via_tool(
    server: &TestServer,
    thread: &str,
    answer: &str,
) -> (Vec<SseFrame>, Vec<SseFrame>) {
    let user = json!({"id": format!("{thread}-u"), "role": "user", "content": "/approve deploy"});
    let first = run(server, &body(thread, "r1", &json!([user]), false)).await;
    let starts: Vec<&SseFrame> = first
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_START")
        .collect();
    assert_eq!(starts.len(), 2, "the action and the permission request");
    assert_eq!(starts[0].data["toolCallName"], "demo_action");
    let action_id = starts[0].data["toolCallId"]
        .as_str()
        .expect("id")
        .to_owned();
    let perm_id = starts[1].data["toolCallId"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(starts[1].data["toolCallName"], "agui_permission_request");
    let args: String = first
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_ARGS" && f.data["toolCallId"] == perm_id.as_str())
        .map(|f| f.data["delta"].as_str().expect("delta").to_owned())
        .collect();
    let args: Value = serde_json::from_str(&args).expect("JSON arguments");
    assert!(args["title"].as_str().expect("title").contains("deploy"));
    assert_eq!(args["toolCallId"], action_id);
    let options = args["options"].as_array().expect("options");
    assert!(
        options
            .iter()
            .all(|o| o["optionId"].is_string() && o["name"].is_string() && o["kind"].is_string())
    );
    assert_eq!(
        first.last().expect("terminal").data["outcome"]["pendingToolCallIds"],
        json!([perm_id])
    );
    let messages = json!([
        user,
        {"id": format!("{thread}-a"), "role": "assistant", "toolCalls": [
            {"id": action_id, "type": "function", "function": {"name": "demo_action", "arguments": "{}"}},
            {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}
        ]},
        {"id": format!("{thread}-t"), "role": "tool", "toolCallId": perm_id, "content": answer}
    ]);
    let second = run(server, &body(thread, "r2", &messages, false)).await;
    let result = second
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("the action's result");
    assert_eq!(result.data["toolCallId"], action_id);
    (first, second)
}

#[tokio::test]
async fn approve_and_deny_through_agui_permission_request() {
    let server = TestServer::start().await;
    let (_, approved) = approve_via_tool(&server, "ap1", r#"{"optionId":"allow"}"#).await;
    assert_eq!(text_of(&approved), "Approved: deploy");
    let (_, denied) = approve_via_tool(&server, "ap2", r#"{"optionId":"deny"}"#).await;
    assert_eq!(text_of(&denied), "Denied: deploy");
    // An answer that names no offered option fails closed.
    let (_, garbage) = approve_via_tool(&server, "ap3", "yes please").await;
    assert_eq!(text_of(&garbage), "Denied: deploy");
}

async fn interrupt_server(timeout: Duration) -> TestServer {
    TestServer::with(move |c| {
        c.suspend_timeout = timeout;
        c.agents = vec![AgentConfig {
            hitl: Hitl::Interrupt,
            multitask: Default::default(),
            history: Default::default(),
            ..AgentConfig::demo()
        }];
    })
    .await
}

async fn open_interrupt(server: &TestServer, thread: &str) -> (Value, Vec<SseFrame>, Value) {
    let user = json!({"id": format!("{thread}-u"), "role": "user", "content": "/approve ship it"});
    let first = run(server, &body(thread, "r1", &json!([user]), false)).await;
    let k = kinds(&first);
    let n = k.len();
    assert_eq!(
        &k[n - 3..],
        ["STATE_SNAPSHOT", "MESSAGES_SNAPSHOT", "RUN_FINISHED"],
        "{k:?}"
    );
    let outcome = &first[n - 1].data["outcome"];
    assert_eq!(outcome["type"], "interrupt");
    let interrupt = outcome["interrupts"][0].clone();
    assert!(interrupt["id"].is_string() && interrupt["reason"].is_string());
    assert!(interrupt["expiresAt"].is_string());
    assert_eq!(interrupt["toolCallId"], tool_call(&first).0);
    (user, first, interrupt)
}

#[tokio::test]
async fn interrupt_answered_with_resume_continues_without_re_emitting_the_call() {
    let server = interrupt_server(Duration::from_secs(60)).await;
    let (user, _, interrupt) = open_interrupt(&server, "int1").await;
    let mut resume = body("int1", "r2", &json!([user]), false);
    resume["resume"] = json!([{"interruptId": interrupt["id"], "status": "resolved", "payload": {"optionId": "allow"}}]);
    let second = run(&server, &resume).await;
    assert!(
        !second.iter().any(|f| f.kind() == "TOOL_CALL_START"),
        "{:?}",
        kinds(&second)
    );
    let result = second
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_RESULT")
        .expect("result");
    assert_eq!(result.data["toolCallId"], interrupt["toolCallId"]);
    assert_eq!(text_of(&second), "Approved: ship it");

    // A cancelled interrupt is a denial.
    let (user, _, interrupt) = open_interrupt(&server, "int2").await;
    let mut resume = body("int2", "r2", &json!([user]), false);
    resume["resume"] = json!([{"interruptId": interrupt["id"], "status": "cancelled"}]);
    assert_eq!(text_of(&run(&server, &resume).await), "Denied: ship it");
}

#[tokio::test]
async fn reattach_without_a_cursor_to_an_open_interrupt_hands_it_over_again() {
    let server = interrupt_server(Duration::from_secs(60)).await;
    let (user, _, interrupt) = open_interrupt(&server, "int-reload").await;
    let frames = reattach_suspended(&server, "int-reload").await;
    assert_eq!(frames[0].data["runId"], "r1");
    assert_eq!(frames[3].data["outcome"]["type"], "interrupt");
    assert_eq!(frames[3].data["outcome"]["interrupts"], json!([interrupt]));
    // Answered from the reloaded page.
    let mut resume = body("int-reload", "r2", &json!([user]), false);
    resume["resume"] = json!([{"interruptId": interrupt["id"], "status": "resolved", "payload": {"optionId": "allow"}}]);
    assert_eq!(text_of(&run(&server, &resume).await), "Approved: ship it");
}

#[tokio::test]
async fn bad_resumes_are_run_errors_and_the_thread_stays_usable() {
    let server = interrupt_server(Duration::from_secs(60)).await;
    let (user, _, interrupt) = open_interrupt(&server, "bad").await;
    let attempts = [
        json!([{"interruptId": "nope", "status": "resolved", "payload": {"optionId": "allow"}}]),
        json!([{"interruptId": interrupt["id"], "status": "resolved"}]),
        json!([{"interruptId": interrupt["id"], "status": "resolved", "payload": {"optionId": "maybe"}}]),
    ];
    for (i, attempt) in attempts.iter().enumerate() {
        let mut b = body("bad", &format!("bad-{i}"), &json!([user]), false);
        b["resume"] = attempt.clone();
        let frames = run(&server, &b).await;
        assert_eq!(kinds(&frames), ["RUN_STARTED", "RUN_ERROR"], "{attempt}");
        assert_eq!(thread_status(&server, "bad").await["status"], "suspended");
    }
    let mut good = body("bad", "good", &json!([user]), false);
    good["resume"] = json!([{"interruptId": interrupt["id"], "status": "resolved", "payload": {"optionId": "deny"}}]);
    assert_eq!(text_of(&run(&server, &good).await), "Denied: ship it");
    // A resume with nothing waiting is refused in-band too.
    let frames = run(&server, &good).await;
    assert_eq!(kinds(&frames), ["RUN_STARTED", "RUN_ERROR"]);
}

#[tokio::test]
async fn an_expired_interrupt_fails_closed_and_a_late_resume_is_an_error() {
    let server = interrupt_server(Duration::from_millis(300)).await;
    let (user, _, interrupt) = open_interrupt(&server, "exp").await;
    // The suspension times out: the permission is denied and the turn finishes.
    let mut done = false;
    for _ in 0..100 {
        if thread_status(&server, "exp").await["status"] == "idle" {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(done, "the run did not fail closed");
    let transcript: Value = get_json(&server, "/threads/exp/messages").await.1;
    let last = transcript["messages"]
        .as_array()
        .expect("messages")
        .last()
        .cloned()
        .expect("message");
    assert_eq!(last["content"], "Denied: ship it");
    let mut late = body("exp", "late", &json!([user]), false);
    late["resume"] = json!([{"interruptId": interrupt["id"], "status": "resolved", "payload": {"optionId": "allow"}}]);
    let frames = run(&server, &late).await;
    assert_eq!(kinds(&frames), ["RUN_STARTED", "RUN_ERROR"]);
    assert!(
        frames[1].data["message"]
            .as_str()
            .expect("message")
            .contains("expired")
    );
    // The thread goes on.
    let next = json!([user, {"id": "exp-2", "role": "user", "content": "still there?"}]);
    assert_eq!(
        text_of(&run(&server, &body("exp", "r3", &next, false)).await),
        "You said: still there?"
    );
}

#[tokio::test]
async fn cancel_while_suspended_releases_the_wait_and_the_slot() {
    let server = TestServer::with(|c| c.max_concurrent_runs = 1).await;
    let user = json!({"id": "c-u", "role": "user", "content": "/approve wait"});
    run(&server, &body("c", "r1", &json!([user]), false)).await;
    // Suspended, still holding the only slot.
    let r = post_run(&server, "demo", &run_body("other", "o1", "hi")).await;
    assert_eq!(r.status(), 503);
    let r = server.post("/runs/r1/cancel").sent().await;
    assert_eq!(r.status(), 202);
    let mut freed = false;
    for _ in 0..100 {
        let r = post_run(&server, "demo", &run_body("other", "o2", "hi")).await;
        if r.status() == 200 {
            SseReader::new(r).collect().await;
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "slot not released");
    let thread = thread_status(&server, "c").await;
    assert_eq!(thread["lastRun"]["outcome"], "cancelled");
    assert_eq!(thread["status"], "idle");
}

#[tokio::test]
async fn disconnected_while_suspended_then_reattach_and_answer_completes_the_run() {
    let server = TestServer::with(|c| c.disconnect_grace = Duration::from_millis(100)).await;
    let user = json!({"id": "d-u", "role": "user", "content": "/tool chart {}"});
    let first = run(&server, &body("d", "r1", &json!([user]), false)).await;
    let (call_id, _, _) = tool_call(&first);
    // Well past the disconnect grace: a suspended run is not abandoned.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(thread_status(&server, "d").await["status"], "suspended");
    // The reloaded page reattaches with its last id, then answers.
    let last_id = first.last().and_then(|f| f.id.clone()).expect("id");
    let reattached = server
        .get("/threads/d/stream")
        .header("last-event-id", last_id)
        .sent()
        .await;
    assert_eq!(reattached.headers()["agui-resume"], "exact");
    let follower = tokio::spawn(SseReader::new(reattached).collect());
    let messages = json!([
        user,
        {"id": "d-a", "role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {"name": "chart", "arguments": "{}"}}]},
        {"id": "d-t", "role": "tool", "toolCallId": call_id, "content": "done"}
    ]);
    let second = run(&server, &body("d", "r2", &messages, false)).await;
    assert_eq!(text_of(&second), "Tool chart returned: done");
    let followed = follower.await.expect("follower");
    assert_eq!(
        text_of(&followed),
        "Tool chart returned: done",
        "the reattached stream saw it too"
    );
}

#[tokio::test]
async fn reattach_without_a_cursor_to_a_suspended_run_hands_over_the_suspension_point() {
    let server = TestServer::start().await;
    for legacy in [false, true] {
        let thread = format!("reload-{legacy}");
        let user =
            json!({"id": format!("{thread}-u"), "role": "user", "content": "/tool chart {}"});
        let first = run(&server, &body(&thread, "r1", &json!([user]), legacy)).await;
        let (call_id, _, _) = tool_call(&first);
        // A reloaded page: no Last-Event-ID.
        let frames = reattach_suspended(&server, &thread).await;
        assert_eq!(frames[0].data["runId"], "r1");
        let calls = frames[1].data["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .flat_map(|m| m["toolCalls"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["id"] == call_id.as_str())
            .count();
        assert_eq!(calls, 1, "the pending call is in the transcript");
        let finished = &frames[3].data;
        if legacy {
            assert!(finished.get("outcome").is_none(), "{finished}");
        } else {
            assert_eq!(finished["outcome"]["pendingToolCallIds"], json!([call_id]));
        }
        assert_eq!(thread_status(&server, &thread).await["status"], "suspended");
        // The page answers from there, and the run completes.
        let messages = json!([
            user,
            {"id": format!("{thread}-a"), "role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {"name": "chart", "arguments": "{}"}}]},
            {"id": format!("{thread}-t"), "role": "tool", "toolCallId": call_id, "content": "drawn"}
        ]);
        let second = run(&server, &body(&thread, "r2", &messages, legacy)).await;
        assert_eq!(text_of(&second), "Tool chart returned: drawn");
    }
}

#[tokio::test]
async fn new_user_input_instead_of_an_answer_fails_closed_then_runs() {
    let server = TestServer::start().await;
    let user = json!({"id": "n-u", "role": "user", "content": "/approve launch"});
    run(&server, &body("n", "r1", &json!([user]), false)).await;
    let messages = json!([user, {"id": "n-2", "role": "user", "content": "never mind"}]);
    let second = run(&server, &body("n", "r2", &messages, false)).await;
    assert_eq!(second[0].data["runId"], "r2");
    assert_eq!(text_of(&second), "You said: never mind");
    let transcript: Value = get_json(&server, "/threads/n/messages").await.1;
    let contents: Vec<String> = transcript["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    assert!(
        contents.contains(&"Denied: launch".to_owned()),
        "{contents:?}"
    );
}

#[tokio::test]
async fn todo_state_reaches_the_client_as_snapshot_plus_deltas() {
    let server = TestServer::start().await;
    let first = run(
        &server,
        &run_body("todo", "r1", "/todo write tests; ship; rest"),
    )
    .await;
    assert!(first.iter().any(|f| f.kind() == "STATE_DELTA"));
    let client_view = apply_state(&first, None).expect("state");
    let todos = client_view["todos"].as_array().expect("todos");
    assert_eq!(todos.len(), 3);
    assert_eq!(todos[0]["content"], "write tests");
    for todo in todos {
        assert!(todo["status"].is_string() && todo["priority"].is_string());
    }
    // The daemon's own document, as a hydration run shows it, is what the client built.
    let r = server.get("/threads/todo/stream").sent().await;
    let hydration = SseReader::new(r).collect().await;
    let daemon_view = hydration
        .iter()
        .find(|f| f.kind() == "STATE_SNAPSHOT")
        .map(|f| f.data["snapshot"].clone())
        .expect("snapshot");
    assert_eq!(daemon_view, client_view);

    // State survives turns; a later change is a delta on top of it.
    let mut next = run_body("todo", "r2", "/usage");
    next["messages"] = json!([
        {"id": "r1-u", "role": "user", "content": "/todo write tests; ship; rest"},
        {"id": "r2-u", "role": "user", "content": "/usage"}
    ]);
    let second = run(&server, &next).await;
    let view = apply_state(&second, None).expect("state");
    assert_eq!(view["todos"].as_array().expect("todos").len(), 3);
    assert!(view["usage"]["totalTokens"].as_u64().expect("tokens") > 0);
}

#[tokio::test]
async fn client_state_is_echoed_read_only_under_client() {
    let server = TestServer::start().await;
    let mut b = run_body("cs", "r1", "hi");
    b["state"] = json!({"theme": "dark"});
    let frames = run(&server, &b).await;
    let view = apply_state(&frames, None).expect("state");
    assert_eq!(view["client"], json!({"theme": "dark"}));
    // Sending the document back (as CopilotKit does) does not nest it.
    let mut again = run_body("cs", "r2", "again");
    again["messages"] = json!([
        {"id": "r1-u", "role": "user", "content": "hi"},
        {"id": "r2-u", "role": "user", "content": "again"}
    ]);
    again["state"] = view.clone();
    let frames = run(&server, &again).await;
    assert_eq!(
        apply_state(&frames, None).expect("state")["client"],
        json!({"theme": "dark"})
    );
}

#[tokio::test]
async fn new_input_instead_of_an_answer_leaves_a_cancelled_result_for_the_request() {
    let server = TestServer::start().await;
    let user = json!({"id": "nc-u", "role": "user", "content": "/approve launch"});
    let first = run(&server, &body("nc", "r1", &json!([user]), false)).await;
    let perm_id = permission_call_id(&first);
    let messages = json!([user, {"id": "nc-2", "role": "user", "content": "never mind"}]);
    let second = run(&server, &body("nc", "r2", &messages, false)).await;
    assert_eq!(text_of(&second), "You said: never mind");
    let transcript = get_json(&server, "/threads/nc/messages").await.1["messages"].clone();
    assert_every_client_call_answered(&transcript);
    let cancelled = position_of(&transcript, &format!("{perm_id}-cancelled"));
    assert!(
        transcript[cancelled]["content"]
            .as_str()
            .expect("content")
            .starts_with("cancelled:")
    );
    assert!(cancelled < position_of(&transcript, "nc-2"));
}

#[tokio::test]
async fn an_answer_after_a_restart_is_refused_in_band_for_both_profiles() {
    for legacy in [false, true] {
        let thread = if legacy { "lost-legacy" } else { "lost-v1" };
        let data = temp_dir("lost");
        let d = data.clone();
        let server = TestServer::with(move |c| c.data_dir = d).await;
        let user =
            json!({"id": format!("{thread}-u"), "role": "user", "content": "/approve deploy"});
        let first = run(&server, &body(thread, "r1", &json!([user]), legacy)).await;
        let (action_id, perm_id) = approval_calls(&first);
        let (action_id, perm_id) = (action_id.as_str(), perm_id.as_str());
        server.stop().await;

        let d = data.clone();
        let server = TestServer::with(move |c| c.data_dir = d).await;
        let messages = json!([
            user,
            {"id": format!("{thread}-a"), "role": "assistant", "toolCalls": [
                {"id": action_id, "type": "function", "function": {"name": "demo_action", "arguments": "{}"}},
                {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}
            ]},
            {"id": format!("{thread}-t"), "role": "tool", "toolCallId": perm_id, "content": r#"{"optionId":"allow"}"#}
        ]);
        let answer = run(&server, &body(thread, "r2", &messages, legacy)).await;
        assert_eq!(
            kinds(&answer),
            ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_ERROR"],
            "{answer:?}"
        );
        assert_every_client_call_answered(&answer[1].data["messages"]);
        assert_eq!(answer[2].data["code"], "SUSPENSION_LOST");
        let message = answer[2].data["message"].as_str().expect("message");
        assert!(
            message.contains("sending it again cannot help: send a new message"),
            "{message}"
        );
        let transcript = get_json(&server, &format!("/threads/{thread}/messages"))
            .await
            .1["messages"]
            .clone();
        assert_every_client_call_answered(&transcript);
        assert!(
            !transcript.to_string().contains("Approved: deploy"),
            "the lost answer did nothing"
        );
        // The same answer again is refused again; new input goes on normally.
        let again = run(&server, &body(thread, "r3", &messages, legacy)).await;
        assert_eq!(again[2].data["code"], "SUSPENSION_LOST");
        let mut next = messages.as_array().expect("messages").clone();
        next.push(json!({"id": format!("{thread}-n"), "role": "user", "content": "hello"}));
        let next = run(&server, &body(thread, "r4", &json!(next), legacy)).await;
        assert_eq!(text_of(&next), "You said: hello");
        server.stop().await;
    }
}

/// The ids of the demo's `/approve` run: its action's tool call and the permission request.
fn approval_calls(frames: &[SseFrame]) -> (String, String) {
    let mut starts = frames
        .iter()
        .filter(|f| f.kind() == "TOOL_CALL_START")
        .map(|f| f.data["toolCallId"].as_str().expect("id").to_owned());
    let action = starts.next().expect("the action's call");
    let permission = starts.next().expect("the permission request");
    (action, permission)
}

/// A second client's answer to a call the first one already answered is refused with
/// advice that fits: nothing was lost, the answer given is in the thread.
#[tokio::test]
async fn an_answer_already_given_by_another_client_says_so() {
    let server = TestServer::start().await;
    let user = json!({"id": "twice-u", "role": "user", "content": "/approve deploy"});
    let first = run(&server, &body("twice", "r1", &json!([user]), false)).await;
    let (action_id, perm_id) = approval_calls(&first);
    let assistant = json!({"id": "twice-a", "role": "assistant", "toolCalls": [
        {"id": action_id, "type": "function", "function": {"name": "demo_action", "arguments": "{}"}},
        {"id": perm_id, "type": "function", "function": {"name": "agui_permission_request", "arguments": "{}"}}
    ]});
    let answer = |id: &str, option: &str| {
        json!([user, assistant, {"id": id, "role": "tool", "toolCallId": perm_id,
            "content": format!(r#"{{"optionId":"{option}"}}"#)}])
    };
    let given = run(
        &server,
        &body("twice", "r2", &answer("twice-t1", "allow"), false),
    )
    .await;
    assert!(text_of(&given).contains("Approved: deploy"), "{given:?}");
    // A page still showing the question clicks Deny: refused, and handed the thread as it
    // is, so its card shows the answer the agent was given, not the stale click.
    let late = run(
        &server,
        &body("twice", "r3", &answer("twice-t2", "deny"), false),
    )
    .await;
    assert_eq!(
        kinds(&late),
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_ERROR"],
        "{late:?}"
    );
    let answers: Vec<&Value> = late[1].data["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool" && m["toolCallId"] == perm_id.as_str())
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], "twice-t1");
    assert!(
        answers[0]["content"]
            .as_str()
            .expect("content")
            .contains("allow")
    );
    assert_eq!(late[2].data["code"], "SUSPENSION_LOST");
    let message = late[2].data["message"].as_str().expect("message");
    assert!(message.contains("already answered"), "{message}");
    assert!(!message.contains("restarted"), "{message}");
    server.stop().await;
}

/// A shutdown does not wait the whole grace for a run parked on the client: nobody can
/// answer it before the daemon is gone, so it fails closed at once.
#[tokio::test]
async fn shutdown_ends_a_run_parked_on_the_client_at_once() {
    let grace = Duration::from_secs(30);
    let server = TestServer::with(|c| c.shutdown_grace = grace).await;
    let user = json!({"id": "sd-u", "role": "user", "content": "/approve deploy"});
    let first = run(&server, &body("sd", "r1", &json!([user]), false)).await;
    assert!(
        first.last().expect("terminal").data["outcome"]["pendingToolCallIds"].is_array(),
        "the run is parked on the permission request"
    );
    assert_eq!(thread_status(&server, "sd").await["status"], "suspended");
    let begun = std::time::Instant::now();
    server.stop().await;
    let took = begun.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?} with a {grace:?} grace"
    );
}
