//! Steering (`forwardedProps.agui.multitask = "steer"`): new input on a running turn goes
//! to an agent that takes input mid-turn (`_session/steering`), and the turn goes on with
//! it; an agent that does not gets the input enqueued, or its run interrupted, as its own
//! strategy says, and the stream says which.

mod support;

use agui_serve::confine::Confinement;
use serde_json::{Value, json};
use support::probe::*;
use support::*;

fn steering(thread: &str, run: &str, id: &str, text: &str) -> Value {
    json!({"threadId": thread, "runId": run, "tools": [], "context": [], "state": {},
        "messages": [{"id": id, "role": "user", "content": text}],
        "forwardedProps": {"agui": {"multitask": "steer"}}})
}

fn steer_note(frames: &[SseFrame]) -> Option<Value> {
    frames
        .iter()
        .find(|f| f.kind() == "CUSTOM" && f.data["name"] == "agui.steer")
        .map(|f| f.data["value"].clone())
}

#[tokio::test]
async fn a_steering_message_reaches_the_running_turn_which_goes_on_with_it() {
    let s = setup("steer", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let live = client()
        .post(s.server.url("/probe"))
        .bearer_auth(&alice)
        .json(&run_body("t", "r0", "slow 40"))
        .sent()
        .await;
    assert_eq!(live.status(), 200);
    let mut live = SseReader::new(live);
    // Wait for the turn to be under way.
    while let Some(frame) = live.next().await {
        if frame.kind() == "TEXT_MESSAGE_CONTENT" {
            break;
        }
    }

    let steered = client()
        .post(s.server.url("/probe"))
        .bearer_auth(&alice)
        .json(&steering("t", "r1", "s1", "prefer tabs"))
        .sent()
        .await;
    assert_eq!(steered.status(), 200);
    // The steering request follows the running turn.
    let frames = SseReader::new(steered).collect().await;
    assert_eq!(frames[0].data["runId"], "r0", "{:?}", kinds(&frames));
    assert_eq!(frames.last().map(SseFrame::kind), Some("RUN_FINISHED"));
    let note = steer_note(&frames).expect("the stream says the input was steered");
    assert_eq!(note, json!({"messageIds": ["s1"], "delivery": "steered"}));
    let start = frames
        .iter()
        .position(|f| f.kind() == "TEXT_MESSAGE_START" && f.data["messageId"] == "s1")
        .expect("the steering message in the stream");
    assert_eq!(frames[start].data["role"], "user");
    // The agent took it into the turn: its answer goes on with it.
    assert!(
        text_of(&frames).contains("[steered: prefer tabs]"),
        "{}",
        text_of(&frames)
    );
    let rest = live.collect().await;
    assert_eq!(rest.last().map(SseFrame::kind), Some("RUN_FINISHED"));

    // The transcript records it where it landed: after the question, inside the turn.
    let transcript: Value = client()
        .get(s.server.url("/threads/t/messages"))
        .bearer_auth(&alice)
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let messages = transcript["messages"].as_array().expect("messages");
    let roles: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or(""),
                m["id"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(roles.len(), 3, "{roles:?}");
    assert_eq!(roles[1], ("user", "s1"), "{roles:?}");
    assert_eq!(roles[2].0, "assistant");
    assert!(
        messages[2]["content"]
            .as_str()
            .is_some_and(|t| t.contains("[steered: prefer tabs]"))
    );
}

#[tokio::test]
async fn an_agent_that_takes_no_input_mid_turn_gets_it_enqueued_or_interrupted_and_says_so() {
    // The demo agent takes no input while a turn runs.
    let server = TestServer::start().await;
    let live = server
        .post("/demo")
        .json(&run_body("q", "r0", "/slow 10 50"))
        .sent()
        .await;
    let mut live = SseReader::new(live);
    assert_eq!(live.next().await.expect("frame").kind(), "RUN_STARTED");
    let queued = server
        .post("/demo")
        .json(&steering("q", "r1", "s1", "after"))
        .sent()
        .await;
    assert_eq!(queued.status(), 200);
    let first = live.collect().await;
    assert_eq!(
        first.last().map(SseFrame::kind),
        Some("RUN_FINISHED"),
        "not interrupted"
    );
    let frames = SseReader::new(queued).collect().await;
    assert_eq!(frames[0].data["runId"], "r1");
    let note = steer_note(&frames).expect("the stream says the input was enqueued");
    assert_eq!(note["delivery"], "enqueued");
    assert_eq!(note["messageIds"], json!(["s1"]));
    assert!(note["reason"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(text_of(&frames), "You said: after");
    server.stop().await;

    // An agent whose own strategy interrupts: the running turn is interrupted.
    let server = TestServer::with(|config| {
        for agent in &mut config.agents {
            agent.multitask = agui_serve::agent::Multitask::Interrupt;
        }
    })
    .await;
    let live = server
        .post("/demo")
        .json(&run_body("i", "r0", "/slow 100 50"))
        .sent()
        .await;
    let mut live = SseReader::new(live);
    assert_eq!(live.next().await.expect("frame").kind(), "RUN_STARTED");
    let now = server
        .post("/demo")
        .json(&steering("i", "r1", "s1", "now"))
        .sent()
        .await;
    assert_eq!(now.status(), 200);
    let first = live.collect().await;
    let chunks = first
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .count();
    assert!(
        chunks < 100,
        "interrupted, not run to its end: {chunks} chunks"
    );
    let frames = SseReader::new(now).collect().await;
    let note = steer_note(&frames).expect("the stream says the run was interrupted");
    assert_eq!(note["delivery"], "interrupted");
    assert_eq!(text_of(&frames), "You said: now");
    server.stop().await;
}

#[tokio::test]
async fn steering_an_idle_thread_is_an_ordinary_run() {
    let server = TestServer::start().await;
    let response = server
        .post("/demo")
        .json(&steering("idle", "r0", "m1", "hello"))
        .sent()
        .await;
    let frames = SseReader::new(response).collect().await;
    assert_eq!(text_of(&frames), "You said: hello");
    assert!(steer_note(&frames).is_none());
    server.stop().await;
}
