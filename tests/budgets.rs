//! Budgets: a run that reaches its token budget pauses with an interrupt
//! (`reason: "budget_reached"`), is extended once or stopped; a hard budget ends the run
//! with no question; a principal's daily budget ends its run and refuses the next one,
//! also after a restart; a run nobody watches is not asked.

mod support;

use agui_serve::agent::Hitl;
use agui_serve::budget::Limits;
use agui_serve::config::{AgentConfig, Config};
use serde_json::{Value, json};
use support::*;

/// The demo agent counts one token per 4 bytes of output: each `/slow` chunk of this run
/// (`chunk i/10\n`, 11 or 12 bytes) is 3 tokens.
const TEN_CHUNKS: &str = "/slow 10 20";

fn tokens(n: u64) -> Limits {
    Limits {
        tokens: Some(n),
        ..Limits::default()
    }
}

fn interrupting(config: &mut Config) {
    config.agents = vec![AgentConfig {
        hitl: Hitl::Interrupt,
        ..AgentConfig::demo()
    }];
}

async fn run(server: &TestServer, body: &Value) -> Vec<SseFrame> {
    let response = post_run(server, "demo", body).await;
    assert_eq!(response.status(), 200);
    SseReader::new(response).collect().await
}

fn chunks(frames: &[SseFrame]) -> usize {
    text_of(frames).matches("chunk ").count()
}

/// The run's pause: its interrupt.
fn paused(frames: &[SseFrame]) -> Value {
    let last = frames.last().expect("a frame");
    assert_eq!(last.kind(), "RUN_FINISHED", "{:?}", kinds(frames));
    assert_eq!(last.data["outcome"]["type"], "interrupt");
    last.data["outcome"]["interrupts"][0].clone()
}

fn ended_on_budget(frames: &[SseFrame]) -> String {
    let last = frames.last().expect("a frame");
    assert_eq!(last.kind(), "RUN_ERROR", "{:?}", kinds(frames));
    assert_eq!(last.data["code"], "BUDGET_EXCEEDED");
    last.data["message"].as_str().expect("message").to_owned()
}

fn answer(thread: &str, run: &str, interrupt: &Value, option: &str) -> Value {
    json!({
        "threadId": thread,
        "runId": run,
        "protocolVersion": "1.0",
        "messages": [{"id": format!("{thread}-r1-u"), "role": "user", "content": TEN_CHUNKS}],
        "resume": [{"interruptId": interrupt["id"], "status": "resolved",
                    "payload": {"optionId": option}}],
    })
}

#[tokio::test]
async fn a_token_budget_pauses_the_run_at_n_and_extend_continues_it() {
    let server = TestServer::with(|config| {
        interrupting(config);
        config.budgets.run = tokens(12);
    })
    .await;
    let first = run(&server, &run_body("b", "r1", TEN_CHUNKS)).await;
    let interrupt = paused(&first);
    assert_eq!(interrupt["reason"], "budget_reached");
    let about = &interrupt["metadata"];
    assert_eq!(
        (&about["budget"], &about["measure"], &about["limit"]),
        (&json!("run"), &json!("tokens"), &json!(12))
    );
    // Paused at 12 tokens: the fourth chunk (3 tokens each) reaches it, and nothing after
    // it was taken.
    assert_eq!(about["spent"], 12);
    assert_eq!(chunks(&first), 4);
    let state = apply_state(&first, None).expect("state");
    assert_eq!(state["budget"]["run"]["tokens"], 12);

    // Extended once (to 24): the run goes on, four more chunks, and ends at the doubled
    // ceiling (a budget is extended once).
    let second = run(&server, &answer("b", "r2", &interrupt, "extend")).await;
    let message = ended_on_budget(&second);
    assert!(message.contains("the run's budget"), "{message}");
    assert_eq!(chunks(&second), 4, "{}", text_of(&second));
    server.stop().await;
}

#[tokio::test]
async fn an_extended_run_finishes_and_stop_ends_it() {
    let server = TestServer::with(|config| {
        interrupting(config);
        config.budgets.run = tokens(18);
    })
    .await;
    // 30 tokens in all: paused at 18, extended to 36, finished.
    let first = run(&server, &run_body("e", "r1", TEN_CHUNKS)).await;
    let interrupt = paused(&first);
    assert_eq!(chunks(&first), 6);
    let second = run(&server, &answer("e", "r2", &interrupt, "extend")).await;
    assert_eq!(second.last().expect("end").kind(), "RUN_FINISHED");
    assert_ne!(
        second.last().expect("end").data["outcome"]["type"],
        "interrupt"
    );
    assert_eq!(chunks(&second), 4);

    // Stop: the run ends, naming the budget; the agent's output stops where it paused.
    let first = run(&server, &run_body("s", "r1", TEN_CHUNKS)).await;
    let interrupt = paused(&first);
    let mut stop = answer("s", "r2", &interrupt, "stop");
    stop["messages"][0]["id"] = json!("s-r1-u");
    let second = run(&server, &stop).await;
    let message = ended_on_budget(&second);
    assert!(message.contains("stopped at the run's budget"), "{message}");
    assert_eq!(chunks(&second), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_hard_budget_ends_the_run_and_cannot_be_extended() {
    let server = TestServer::with(|config| {
        interrupting(config);
        config.budgets.run = tokens(100);
        config.budgets.hard = tokens(12);
    })
    .await;
    let frames = run(&server, &run_body("h", "r1", TEN_CHUNKS)).await;
    let message = ended_on_budget(&frames);
    assert!(message.contains("hard budget"), "{message}");
    assert!(
        !frames
            .iter()
            .any(|f| f.data["outcome"]["type"] == "interrupt"),
        "no question is asked"
    );
    assert_eq!(chunks(&frames), 4);
    server.stop().await;
}

#[tokio::test]
async fn a_run_nobody_watches_ends_at_its_budget_instead_of_pausing() {
    let server = TestServer::with(|config| {
        interrupting(config);
        config.budgets.run = tokens(12);
    })
    .await;
    let mut body = run_body("bg", "r1", TEN_CHUNKS);
    body["agent"] = json!("demo");
    let response = server.post("/threads/bg/runs").json(&body).sent().await;
    assert_eq!(response.status(), 202);
    let mut outcome = None;
    for _ in 0..200 {
        let (_, thread) = get_json(&server, "/threads/bg").await;
        if let Some(done) = thread["lastRun"]["outcome"].as_str()
            && done != "running"
        {
            outcome = Some(done.to_owned());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(outcome.as_deref(), Some("error"));
    let (_, messages) = get_json(&server, "/threads/bg/messages").await;
    assert!(
        messages.to_string().contains("the run's budget is spent"),
        "{messages}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_principal_s_daily_budget_ends_its_run_and_refuses_the_next_also_after_a_restart() {
    let data_dir = temp_dir("budget-day");
    let dir = data_dir.clone();
    let server = TestServer::with(move |config| config.data_dir = dir).await;
    let response = server
        .post("/tokens")
        .json(&json!({"sub": "alice", "budget": {"tokens": 12}}))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let token = response.json::<Value>().await.expect("json")["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let as_alice = |server: &TestServer, body: &Value| {
        client()
            .post(server.url("/demo"))
            .bearer_auth(&token)
            .json(body)
            .send()
    };
    let response = as_alice(&server, &run_body("d", "r1", TEN_CHUNKS))
        .await
        .expect("run");
    let frames = SseReader::new(response).collect().await;
    let message = ended_on_budget(&frames);
    assert!(message.contains("daily budget"), "{message}");

    // The day's next run is refused before anything starts.
    let refused = as_alice(&server, &run_body("d2", "r1", "hello"))
        .await
        .expect("run");
    assert_eq!(refused.status(), 429);
    let error: Value = refused.json().await.expect("json");
    assert_eq!(error["code"], "BUDGET_EXCEEDED");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("daily budget"),
        "{error}"
    );
    // Another principal, and the operator, are not affected.
    assert_eq!(
        post_run(&server, "demo", &run_body("o", "r1", "hi"))
            .await
            .status(),
        200
    );
    server.stop().await;

    // What was spent is stored: after a restart the day is still spent.
    let dir = data_dir.clone();
    let server = TestServer::with(move |config| config.data_dir = dir).await;
    let refused = as_alice(&server, &run_body("d3", "r1", "hello"))
        .await
        .expect("run");
    assert_eq!(refused.status(), 429);
    server.stop().await;
}

#[tokio::test]
async fn parallel_runs_share_one_daily_budget() {
    let server = TestServer::with(|c| c.access.max_runs_per_principal = 8).await;
    let response = server
        .post("/tokens")
        .json(&json!({"sub": "carol", "budget": {"tokens": 100}}))
        .sent()
        .await;
    let token = response.json::<Value>().await.expect("json")["token"]
        .as_str()
        .expect("token")
        .to_owned();
    // Eight runs at once, each of 50 paced chunks (about 150 tokens, reported per chunk).
    let runs = (0..8).map(|i| {
        let (url, token) = (server.url("/demo"), token.clone());
        async move {
            let response = client()
                .post(url)
                .bearer_auth(token)
                .json(&run_body(
                    &format!("p{i}"),
                    &format!("p{i}-r1"),
                    "/slow 50 20",
                ))
                .send()
                .await
                .expect("run");
            // A run that starts once the day is spent is refused before anything starts.
            if response.status() == 429 {
                return None;
            }
            assert_eq!(response.status(), 200);
            Some(SseReader::new(response).collect().await)
        }
    });
    let all = futures_util::future::join_all(runs).await;
    let mut spent = 0;
    for frames in all.iter().flatten() {
        ended_on_budget(frames);
        let state = apply_state(frames, None).expect("state");
        spent += state["budget"]["run"]["tokens"].as_u64().expect("tokens");
    }
    // Each run may pass the day's ceiling by the one report that crossed it, no more.
    assert!(
        spent <= 100 + 8 * 3,
        "the runs spent {spent} of a daily budget of 100"
    );
}

#[tokio::test]
async fn the_permission_tool_carries_the_budget_question_where_the_agent_asks_by_tool() {
    let server = TestServer::with(|config| config.budgets.run = tokens(12)).await;
    let first = run(&server, &run_body("t", "r1", TEN_CHUNKS)).await;
    let start = first
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_START")
        .expect("a tool call");
    assert_eq!(start.data["toolCallName"], "agui_permission_request");
    let call = start.data["toolCallId"].as_str().expect("id").to_owned();
    let args: Value = serde_json::from_str(
        &first
            .iter()
            .filter(|f| f.kind() == "TOOL_CALL_ARGS")
            .map(|f| f.data["delta"].as_str().expect("delta"))
            .collect::<String>(),
    )
    .expect("arguments are JSON");
    assert_eq!(args["reason"], "budget_reached");
    // Answered with the tool's result: extended once; the run then stops at 24.
    let body = json!({
        "threadId": "t", "runId": "r2", "protocolVersion": "1.0",
        "messages": [
            {"id": "t-r1-u", "role": "user", "content": TEN_CHUNKS},
            {"id": "ans", "role": "tool", "toolCallId": call, "content": "{\"optionId\":\"extend\"}"},
        ],
    });
    let second = run(&server, &body).await;
    ended_on_budget(&second);
    assert_eq!(chunks(&second), 4);
    server.stop().await;
}

#[tokio::test]
async fn wall_time_is_limited_too() {
    let server = TestServer::with(|config| {
        config.budgets.hard = Limits {
            wall_time: Some(1),
            ..Limits::default()
        };
    })
    .await;
    // A run of 5 s ends after about one.
    let frames = run(&server, &run_body("w", "r1", "/slow 100 50")).await;
    let message = ended_on_budget(&frames);
    assert!(message.contains("wall time"), "{message}");
    assert!(chunks(&frames) < 100);
    server.stop().await;
}

#[tokio::test]
async fn an_agent_that_ends_its_turn_while_the_budget_question_waits_is_still_held_to_the_answer() {
    let server = TestServer::with(|config| {
        interrupting(config);
        config.budgets.run = tokens(12);
    })
    .await;
    // Six chunks: the agent has produced the last two and ended its turn long before anyone
    // answers the question the fourth one raised.
    let first = run(&server, &run_body("held", "h1", "/slow 6 20")).await;
    let interrupt = paused(&first);
    assert_eq!(chunks(&first), 4);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let thread: Value = server
        .get("/threads/held")
        .sent()
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(thread["status"], "suspended", "{thread}");
    let said = transcript(&server, "held").await;
    assert!(
        !said.contains("chunk 5/6"),
        "output past the budget was taken: {said}"
    );

    // Extended, the rest goes out and the run finishes.
    let mut body = answer("held", "h2", &interrupt, "extend");
    body["messages"][0]["content"] = json!("/slow 6 20");
    let second = run(&server, &body).await;
    assert_eq!(
        second.last().expect("frame").kind(),
        "RUN_FINISHED",
        "{:?}",
        kinds(&second)
    );
    assert_eq!(chunks(&second), 2, "{}", text_of(&second));
    // The message the pause cut is kept in two parts, the rest under an id of its own:
    // nothing of the first part is lost from the stored transcript.
    let said = transcript(&server, "held").await;
    for n in 1..=6 {
        assert!(
            said.contains(&format!("chunk {n}/6")),
            "chunk {n} lost: {said}"
        );
    }
    server.stop().await;
}

async fn transcript(server: &TestServer, thread: &str) -> String {
    let body: Value = server
        .get(&format!("/threads/{thread}/messages"))
        .sent()
        .await
        .json()
        .await
        .expect("json");
    body["messages"].to_string()
}
