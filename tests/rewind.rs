//! Rewind (`POST {path}/threads/{id}/rewind`): the scripted ACP agent writes files over
//! three turns; the thread is taken back to a message, its conversation, its files or
//! both, and the next turn's agent sees only the kept history.

mod support;

use agui_serve::confine::Confinement;
use serde_json::{Value, json};
use support::probe::*;
use support::*;

async fn get(server: &TestServer, path: &str, token: &str) -> reqwest::Response {
    client()
        .get(server.url(path))
        .bearer_auth(token)
        .sent()
        .await
}

async fn rewind(server: &TestServer, token: &str, thread: &str, body: Value) -> reqwest::Response {
    client()
        .post(server.url(&format!("/threads/{thread}/rewind")))
        .bearer_auth(token)
        .json(&body)
        .sent()
        .await
}

/// The thread's stored transcript.
async fn messages(server: &TestServer, token: &str, thread: &str) -> Vec<Value> {
    let answer: Value = get(server, &format!("/threads/{thread}/messages"), token)
        .await
        .json()
        .await
        .expect("json");
    answer["messages"].as_array().expect("messages").clone()
}

/// A file of the thread's workspace, `None` when it is not there.
async fn file(server: &TestServer, token: &str, thread: &str, path: &str) -> Option<String> {
    let response = get(
        server,
        &format!("/threads/{thread}/workspace/file?path={path}"),
        token,
    )
    .await;
    match response.status().as_u16() {
        200 => Some(response.text().await.expect("text")),
        404 => None,
        other => panic!("workspace file {path}: {other}"),
    }
}

fn ids(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Three turns on `thread`: notes.md written "one" then "two", other.md "three".
async fn three_turns(server: &TestServer, token: &str, thread: &str) -> Vec<Value> {
    say(server, token, "probe", thread, "write notes.md one").await;
    say(server, token, "probe", thread, "write notes.md two").await;
    say(server, token, "probe", thread, "write other.md three").await;
    let transcript = messages(server, token, thread).await;
    assert_eq!(transcript.len(), 6, "{transcript:?}");
    transcript
}

#[tokio::test]
async fn rewinding_both_puts_back_files_and_transcript_and_the_next_turn_sees_the_kept_history() {
    let s = setup("rewind-both", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let transcript = three_turns(&s.server, &alice, "t").await;
    // A client following every run of the thread sees the rewind.
    let follow = client()
        .get(s.server.url("/threads/t/stream?follow=all"))
        .bearer_auth(&alice)
        .sent()
        .await;
    assert_eq!(follow.status(), 200);

    let first_answer = transcript[1]["id"].as_str().expect("id");
    let answer = rewind(
        &s.server,
        &alice,
        "t",
        json!({"messageId": first_answer, "scope": "both"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("json");
    assert_eq!(answer["session"], "new", "{answer}");
    assert!(answer["files"]["checkpoint"].is_string(), "{answer}");
    assert_eq!(
        ids(answer["messages"].as_array().expect("messages")),
        ids(&transcript[..2])
    );

    assert_eq!(
        ids(&messages(&s.server, &alice, "t").await),
        ids(&transcript[..2])
    );
    assert_eq!(
        file(&s.server, &alice, "t", "notes.md").await.as_deref(),
        Some("one\n")
    );
    assert_eq!(file(&s.server, &alice, "t", "other.md").await, None);

    let mut reader = SseReader::new(follow);
    let mut seen = Vec::new();
    while let Some(frame) = reader.next().await {
        seen.push(frame.kind().to_owned());
        if frame.kind() == "RUN_FINISHED" && frame.data["result"]["rewound"].is_object() {
            break;
        }
    }
    assert!(
        seen.ends_with(&[
            "RUN_STARTED".to_owned(),
            "MESSAGES_SNAPSHOT".to_owned(),
            "STATE_SNAPSHOT".to_owned(),
            "RUN_FINISHED".to_owned()
        ]),
        "{seen:?}"
    );

    // The next turn runs in a new session given the kept history, and nothing later.
    let heard = say(&s.server, &alice, "probe", "t", "recall").await;
    assert!(heard.contains("User: write notes.md one"), "{heard}");
    assert!(heard.contains("Assistant: Wrote notes.md"), "{heard}");
    assert!(
        !heard.contains("two") && !heard.contains("three"),
        "{heard}"
    );
    let after = messages(&s.server, &alice, "t").await;
    assert_eq!(after.len(), 4);
    assert_eq!(ids(&after[..2]), ids(&transcript[..2]));

    // A later turn goes on in that session, with nothing given twice.
    let heard = say(&s.server, &alice, "probe", "t", "recall").await;
    assert_eq!(
        heard.matches("User: write notes.md one").count(),
        1,
        "{heard}"
    );
}

#[tokio::test]
async fn files_only_and_conversation_only_each_leave_the_other_alone() {
    let s = setup("rewind-scopes", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;

    let transcript = three_turns(&s.server, &alice, "f").await;
    let first_answer = transcript[1]["id"].as_str().expect("id");
    let answer = rewind(
        &s.server,
        &alice,
        "f",
        json!({"messageId": first_answer, "scope": "files"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("json");
    assert_eq!(answer["session"], "kept");
    assert_eq!(
        file(&s.server, &alice, "f", "notes.md").await.as_deref(),
        Some("one\n")
    );
    assert_eq!(file(&s.server, &alice, "f", "other.md").await, None);
    assert_eq!(
        ids(&messages(&s.server, &alice, "f").await),
        ids(&transcript)
    );

    let transcript = three_turns(&s.server, &alice, "c").await;
    // To the second user message: its answer goes too.
    let second_question = transcript[2]["id"].as_str().expect("id");
    let answer = rewind(
        &s.server,
        &alice,
        "c",
        json!({"messageId": second_question, "scope": "conversation"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("json");
    assert_eq!(answer["session"], "new");
    assert!(answer["files"].is_null());
    assert_eq!(
        ids(&messages(&s.server, &alice, "c").await),
        ids(&transcript[..3])
    );
    assert_eq!(
        file(&s.server, &alice, "c", "notes.md").await.as_deref(),
        Some("two\n")
    );
    assert_eq!(
        file(&s.server, &alice, "c", "other.md").await.as_deref(),
        Some("three\n")
    );
}

#[tokio::test]
async fn a_rewind_is_refused_while_a_run_is_live_and_for_what_does_not_exist() {
    let s = setup("rewind-refused", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    say(&s.server, &alice, "probe", "r", "write a.md x").await;
    let first = messages(&s.server, &alice, "r").await[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let unknown = rewind(&s.server, &alice, "r", json!({"messageId": "nope"})).await;
    assert_eq!(unknown.status(), 404);
    let bad = rewind(
        &s.server,
        &alice,
        "r",
        json!({"messageId": first, "scope": "all"}),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let missing = rewind(&s.server, &alice, "r", json!({"scope": "both"})).await;
    assert_eq!(missing.status(), 400);
    // Another principal's thread of that id does not exist for her.
    let bob = token_for(&s.server, "bob").await;
    let foreign = rewind(&s.server, &bob, "r", json!({"messageId": first})).await;
    assert_eq!(foreign.status(), 404);

    let started = client()
        .post(s.server.url("/threads/r/runs"))
        .bearer_auth(&alice)
        .json(&json!({"agent": "probe", "runId": "slow-run",
            "messages": [{"id": "s1", "role": "user", "content": "slow 100"}]}))
        .sent()
        .await;
    assert_eq!(started.status(), 202);
    let live = rewind(&s.server, &alice, "r", json!({"messageId": first})).await;
    assert_eq!(live.status(), 409);
    let error: Value = live.json().await.expect("json");
    assert_eq!(error["code"], "RUN_IN_PROGRESS");
    // Nothing changed.
    assert_eq!(
        file(&s.server, &alice, "r", "a.md").await.as_deref(),
        Some("x\n")
    );
}

#[tokio::test]
async fn the_demo_agent_rewinds_its_conversation_but_has_no_files_to_put_back() {
    let server = TestServer::start().await;
    for (i, text) in ["one", "two"].iter().enumerate() {
        let response = server
            .post("/demo")
            .json(&run_body("d", &format!("run-{i}"), text))
            .sent()
            .await;
        SseReader::new(response).collect().await;
    }
    let transcript = messages(&server, TOKEN, "d").await;
    assert_eq!(transcript.len(), 4);
    let first_answer = transcript[1]["id"].as_str().expect("id");
    let files = rewind(&server, TOKEN, "d", json!({"messageId": first_answer})).await;
    assert_eq!(files.status(), 409);
    let error: Value = files.json().await.expect("json");
    assert_eq!(error["code"], "NO_CHECKPOINTS");
    assert_eq!(
        messages(&server, TOKEN, "d").await.len(),
        4,
        "nothing changed"
    );

    let conversation = rewind(
        &server,
        TOKEN,
        "d",
        json!({"messageId": first_answer, "scope": "conversation"}),
    )
    .await;
    assert_eq!(conversation.status(), 200);
    assert_eq!(
        ids(&messages(&server, TOKEN, "d").await),
        ids(&transcript[..2])
    );
}

/// A run of `messages` on `thread` (the probe agent) with `forwarded` as its
/// `forwardedProps`: its frames.
async fn run_with(
    server: &TestServer,
    token: &str,
    thread: &str,
    messages: Value,
    forwarded: Value,
) -> Vec<SseFrame> {
    let response = client()
        .post(server.url("/probe"))
        .bearer_auth(token)
        .json(
            &json!({"threadId": thread, "runId": uuid::Uuid::new_v4().to_string(),
            "messages": messages, "tools": [], "context": [], "state": {},
            "forwardedProps": forwarded}),
        )
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_eq!(
        frames.last().map(SseFrame::kind),
        Some("RUN_FINISHED"),
        "{:?}",
        kinds(&frames)
    );
    frames
}

#[tokio::test]
async fn a_client_that_owns_its_history_edits_and_regenerates() {
    let s = setup("rewind-client", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let client_owned = json!({"agui": {"history": "client"}});

    // The second message edited: the thread and its files go back to after the first
    // turn, and the edited message runs there.
    let transcript = three_turns(&s.server, &alice, "e").await;
    let edited = json!([transcript[0], transcript[1],
        {"id": "edited", "role": "user", "content": "write notes.md edited"}]);
    let frames = run_with(&s.server, &alice, "e", edited, client_owned.clone()).await;
    assert_eq!(text_of(&frames), "Wrote notes.md");
    let after = messages(&s.server, &alice, "e").await;
    assert_eq!(
        ids(&after[..3]),
        [&ids(&transcript[..2])[..], &["edited".to_owned()]].concat()
    );
    assert_eq!(after.len(), 4);
    assert_eq!(
        file(&s.server, &alice, "e", "notes.md").await.as_deref(),
        Some("edited\n")
    );
    assert_eq!(file(&s.server, &alice, "e", "other.md").await, None);

    // Regenerate: the last answer dropped; its question runs again, and replaces it.
    let transcript = three_turns(&s.server, &alice, "g").await;
    let frames = run_with(
        &s.server,
        &alice,
        "g",
        json!(transcript[..5]),
        client_owned.clone(),
    )
    .await;
    assert_eq!(text_of(&frames), "Wrote other.md");
    let after = messages(&s.server, &alice, "g").await;
    assert_eq!(after.len(), 6);
    assert_eq!(ids(&after[..5]), ids(&transcript[..5]));
    assert_ne!(after[5]["id"], transcript[5]["id"], "a new answer");
    assert_eq!(
        file(&s.server, &alice, "g", "other.md").await.as_deref(),
        Some("three\n")
    );

    // The same history sent again with new input: only appended.
    let mut more = after.clone();
    more.push(json!({"id": "more", "role": "user", "content": "pwd"}));
    run_with(&s.server, &alice, "g", json!(more), client_owned).await;
    assert_eq!(messages(&s.server, &alice, "g").await.len(), 8);
}

#[tokio::test]
async fn a_client_that_is_behind_still_appends_and_is_told_what_it_missed() {
    let s = setup("rewind-behind", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    say(&s.server, &alice, "probe", "b", "write notes.md one").await;
    let first_tab = messages(&s.server, &alice, "b").await;
    // Another tab runs a turn meanwhile.
    say(&s.server, &alice, "probe", "b", "write notes.md two").await;
    let stored = messages(&s.server, &alice, "b").await;

    let behind = json!([first_tab[0], first_tab[1],
        {"id": "late", "role": "user", "content": "write other.md three"}]);
    let frames = run_with(&s.server, &alice, "b", behind, json!({})).await;
    let told = frames
        .iter()
        .find(|f| f.kind() == "CUSTOM" && f.data["name"] == "agui.history.unsent")
        .expect("the stream names what the client did not send");
    assert_eq!(told.data["value"]["messageIds"], json!(ids(&stored[2..])));
    let after = messages(&s.server, &alice, "b").await;
    assert_eq!(after.len(), 6, "appended, nothing rewound");
    assert_eq!(
        file(&s.server, &alice, "b", "notes.md").await.as_deref(),
        Some("two\n")
    );

    // A client that sends only its new input is not behind: nothing is said.
    let frames = turn(&s.server, &alice, "probe", "b", "pwd").await;
    assert!(
        !frames
            .iter()
            .any(|f| f.data["name"] == "agui.history.unsent")
    );
}

async fn fork(server: &TestServer, token: &str, thread: &str, body: Value) -> Value {
    let response = client()
        .post(server.url(&format!("/threads/{thread}/fork")))
        .bearer_auth(token)
        .json(&body)
        .sent()
        .await;
    assert_eq!(response.status(), 201);
    response.json().await.expect("json")
}

#[tokio::test]
async fn a_fork_at_a_message_starts_from_there_with_or_without_its_files() {
    let s = setup("rewind-fork", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let transcript = three_turns(&s.server, &alice, "s").await;
    let first_answer = transcript[1]["id"].as_str().expect("id");

    let forked = fork(
        &s.server,
        &alice,
        "s",
        json!({"threadId": "then", "messageId": first_answer, "files": true}),
    )
    .await;
    assert_eq!(forked["messageCount"], 2);
    assert!(forked["sessionId"].is_null(), "{forked}");
    assert_eq!(
        ids(&messages(&s.server, &alice, "then").await),
        ids(&transcript[..2])
    );
    assert_eq!(
        file(&s.server, &alice, "then", "notes.md").await.as_deref(),
        Some("one\n")
    );
    assert_eq!(file(&s.server, &alice, "then", "other.md").await, None);
    // The source is as it was.
    assert_eq!(messages(&s.server, &alice, "s").await.len(), 6);
    assert_eq!(
        file(&s.server, &alice, "s", "notes.md").await.as_deref(),
        Some("two\n")
    );
    // The fork's first turn starts a session given its history, and nothing after it.
    let heard = say(&s.server, &alice, "probe", "then", "recall").await;
    assert!(heard.contains("User: write notes.md one"), "{heard}");
    assert!(
        !heard.contains("two") && !heard.contains("three"),
        "{heard}"
    );

    // Without files: the transcript ends there, the files are the source's as they are.
    fork(
        &s.server,
        &alice,
        "s",
        json!({"threadId": "now", "messageId": first_answer}),
    )
    .await;
    assert_eq!(messages(&s.server, &alice, "now").await.len(), 2);
    assert_eq!(
        file(&s.server, &alice, "now", "notes.md").await.as_deref(),
        Some("two\n")
    );
    assert_eq!(
        file(&s.server, &alice, "now", "other.md").await.as_deref(),
        Some("three\n")
    );

    // A message the thread does not hold.
    let unknown = client()
        .post(s.server.url("/threads/s/fork"))
        .bearer_auth(&alice)
        .json(&json!({"messageId": "nope"}))
        .sent()
        .await;
    assert_eq!(unknown.status(), 404);
    let bad = client()
        .post(s.server.url("/threads/s/fork"))
        .bearer_auth(&alice)
        .json(&json!({"files": "yes"}))
        .sent()
        .await;
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn checkpoints_survive_a_restart_and_the_agent_cannot_reach_them() {
    let s = setup("rewind-restart", |c, d| {
        c.agents = vec![probe_agent("probe", Confinement::Landlock, d, None)];
    })
    .await;
    let alice = token_for(&s.server, "alice").await;
    let transcript = three_turns(&s.server, &alice, "k").await;

    // The agent tries the daemon's checkpoint store: to list it, read it, write into it.
    let store = s.data.join("checkpoints").join("probe");
    let repo = std::fs::read_dir(&store)
        .expect("the checkpoint store")
        .next()
        .expect("the thread's repository")
        .expect("entry")
        .path();
    let refs = repo.join("refs").join("checkpoints");
    let planted = refs.join("planted");
    let outcomes = probe(
        &s.server,
        &alice,
        "probe",
        "k",
        json!({"list": [store.display().to_string()],
               "read": [repo.join("HEAD").display().to_string()],
               "write": [planted.display().to_string()]}),
    )
    .await;
    let Value::Object(outcomes) = outcomes else {
        panic!("outcomes: {outcomes}");
    };
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    for (attempt, outcome) in &outcomes {
        assert_eq!(outcome, "denied", "{attempt}");
    }
    assert!(!planted.exists());

    // A restart on the same data directory: the checkpoints are still there, and rewind.
    let (data, token_file) = (s.data.clone(), s.token_file.clone());
    s.server.stop().await;
    let d = data.clone();
    let server = TestServer::with(move |c| {
        c.data_dir = d.clone();
        c.private_files = vec![token_file];
        c.agents = vec![probe_agent("probe", Confinement::Landlock, &d, None)];
    })
    .await;
    let alice = token_for(&server, "alice").await;
    let listed: Value = get(&server, "/threads/k/checkpoints", &alice)
        .await
        .json()
        .await
        .expect("json");
    // Three turns, and the probe's.
    assert_eq!(
        listed["checkpoints"].as_array().map(Vec::len),
        Some(4),
        "{listed}"
    );
    let answer = rewind(
        &server,
        &alice,
        "k",
        json!({"messageId": transcript[1]["id"], "scope": "both"}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        file(&server, &alice, "k", "notes.md").await.as_deref(),
        Some("one\n")
    );
    assert_eq!(file(&server, &alice, "k", "other.md").await, None);

    // They go with the thread.
    let deleted = client()
        .delete(server.url("/threads/k"))
        .bearer_auth(&alice)
        .sent()
        .await;
    assert_eq!(deleted.status(), 204);
    eventually("the thread's checkpoints are removed", || !repo.exists()).await;
}

#[tokio::test]
async fn an_agent_whose_history_is_the_client_s_follows_it_unless_a_request_says_otherwise() {
    let server = TestServer::with(|c| {
        for agent in &mut c.agents {
            agent.history = agui_serve::agent::History::Client;
        }
    })
    .await;
    // Requests that say "server" append, though each sends only its new message.
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        let mut body = run_body("h", &format!("run-{i}"), text);
        body["forwardedProps"] = json!({"agui": {"history": "server"}});
        SseReader::new(server.post("/demo").json(&body).sent().await)
            .collect()
            .await;
    }
    let transcript = messages(&server, TOKEN, "h").await;
    assert_eq!(transcript.len(), 6);
    // No word from the request: the agent's own says the client's history, so the second
    // question edited takes the thread back to after the first answer.
    let body = json!({"threadId": "h", "runId": "run-4", "tools": [], "context": [], "state": {},
        "messages": [transcript[0], transcript[1],
            {"id": "edited", "role": "user", "content": "deux"}]});
    let frames = SseReader::new(server.post("/demo").json(&body).sent().await)
        .collect()
        .await;
    assert_eq!(text_of(&frames), "You said: deux");
    let after = messages(&server, TOKEN, "h").await;
    assert_eq!(after.len(), 4);
    assert_eq!(after[2]["id"], "edited");
    server.stop().await;
}
