//! CopilotKit's runtime protocol over real sockets: `/agent/{id}/run`, `connect` (unknown
//! thread, finished thread, live run), `stop`, and the single-endpoint envelope.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

async fn post_json(server: &TestServer, path: &str, body: &Value) -> reqwest::Response {
    server
        .post(path)
        .header("accept", "text/event-stream")
        .json(body)
        .sent()
        .await
}

async fn frames_of(response: reqwest::Response) -> Vec<SseFrame> {
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "an event stream"
    );
    SseReader::new(response).collect().await
}

#[tokio::test]
async fn run_and_connect_through_the_agent_routes() {
    let server = TestServer::start().await;
    let frames =
        frames_of(post_json(&server, "/agent/demo/run", &run_body("t1", "r1", "hi")).await).await;
    assert_valid_segment(&frames);
    assert_eq!(text_of(&frames), "You said: hi");

    // A thread the agent does not have: 200, an empty stream.
    let unknown = post_json(&server, "/agent/demo/connect", &run_body("nope", "r", "x")).await;
    assert!(frames_of(unknown).await.is_empty());

    // A finished thread: its history as one valid run.
    let mut body = run_body("t1", "r2", "ignored");
    body["messages"] = json!([]);
    let frames = frames_of(post_json(&server, "/agent/demo/connect", &body).await).await;
    assert_eq!(
        kinds(&frames),
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "STATE_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );
    let snapshot = &frames[1].data["messages"];
    assert_eq!(snapshot[0]["content"], "hi");
    assert_eq!(snapshot[1]["content"], "You said: hi");

    // Unknown agent: 404 before any stream.
    let response = post_json(&server, "/agent/nobody/connect", &body).await;
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn connect_joins_a_live_run_and_stop_ends_every_stream_on_it() {
    let server = TestServer::start().await;
    let running = post_json(
        &server,
        "/agent/demo/run",
        &run_body("live", "r1", "/slow 100 50"),
    )
    .await;
    assert_eq!(running.status(), 200);
    let mut first = SseReader::new(running);
    // Wait until the run is producing.
    loop {
        let frame = first.next().await.expect("frame");
        if frame.kind() == "TEXT_MESSAGE_CONTENT" {
            break;
        }
    }
    // A reloaded page: history and the live run, in one stream.
    let joined = post_json(&server, "/agent/demo/connect", &run_body("live", "rc", "x")).await;
    assert_eq!(joined.status(), 200);
    let mut joined = SseReader::new(joined);
    let head = joined.next().await.expect("frame");
    assert_eq!(head.kind(), "RUN_STARTED");
    assert_eq!(
        joined.next().await.expect("frame").kind(),
        "MESSAGES_SNAPSHOT"
    );

    // Stop with the run id CopilotKit knows.
    let (status, answer) = {
        let r = server
            .post("/agent/demo/stop/live")
            .json(&json!({"runId": "r1"}))
            .sent()
            .await;
        (r.status().as_u16(), r.json::<Value>().await.expect("json"))
    };
    assert_eq!(status, 200);
    assert_eq!(answer["stopped"], true, "{answer}");
    assert_eq!(answer["runId"], "r1");

    // Both streams end with a terminal event, well before the 5 s the run would take.
    for reader in [first, joined] {
        let frames = tokio::time::timeout(Duration::from_secs(5), reader.collect())
            .await
            .expect("the stream ends");
        let last = frames.last().expect("frames");
        assert!(
            matches!(last.kind(), "RUN_FINISHED" | "RUN_ERROR"),
            "{:?}",
            kinds(&frames)
        );
    }
    // Nothing left to stop.
    let r = server.post("/agent/demo/stop/live").sent().await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.expect("json");
    assert_eq!(answer["stopped"], false, "{answer}");
    assert!(answer["message"].is_string());
}

#[tokio::test]
async fn the_single_endpoint_envelope_reaches_the_same_handlers() {
    let server = TestServer::start().await;
    let envelope = |method: &str, params: Value, body: Value| json!({"method": method, "params": params, "body": body});

    let r = post_json(&server, "", &envelope("info", json!({}), Value::Null)).await;
    assert_eq!(r.status(), 200);
    let info: Value = r.json().await.expect("json");
    assert_eq!(info["agents"]["demo"]["name"], "demo");
    assert_eq!(info["mode"], "sse");

    let run = envelope(
        "agent/run",
        json!({"agentId": "demo"}),
        run_body("e1", "r1", "hello"),
    );
    let frames = frames_of(post_json(&server, "", &run).await).await;
    assert_eq!(text_of(&frames), "You said: hello");

    let connect = envelope(
        "agent/connect",
        json!({"agentId": "demo"}),
        run_body("e1", "r2", "x"),
    );
    let frames = frames_of(post_json(&server, "", &connect).await).await;
    assert_eq!(kinds(&frames)[1], "MESSAGES_SNAPSHOT");

    let stop = envelope(
        "agent/stop",
        json!({"agentId": "demo", "threadId": "e1"}),
        Value::Null,
    );
    let r = post_json(&server, "", &stop).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["stopped"], false);

    let r = post_json(
        &server,
        "",
        &envelope("agent/dance", json!({}), Value::Null),
    )
    .await;
    assert_eq!(r.status(), 400);
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["code"], "INVALID_INPUT");
    assert_eq!(error["field"], "method");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("agent/dance"),
        "{error}"
    );

    // The envelope is authenticated like every other route.
    let r = client()
        .post(server.url(""))
        .json(&envelope("info", json!({}), Value::Null))
        .sent()
        .await;
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn the_thread_list_reads_as_copilotkits_thread_records() {
    let server = TestServer::start().await;
    for i in 0..3 {
        let body = run_body(&format!("ck{i}"), "r", &format!("hello {i}"));
        frames_of(post_json(&server, "/agent/demo/run", &body).await).await;
    }
    // CopilotKit asks with `agentId`, `limit` and then `cursor`.
    let (status, page) = get_json(&server, "/threads?agentId=demo&limit=2").await;
    assert_eq!(status, 200);
    let first = &page["threads"][0];
    assert_eq!(first["id"], "ck2");
    assert_eq!(first["agentId"], "demo");
    assert_eq!(first["archived"], false);
    assert!(
        first["name"].is_string() || first["name"].is_null(),
        "{first}"
    );
    assert!(first["createdAt"].is_string() && first["updatedAt"].is_string());
    let cursor = page["nextCursor"].as_str().expect("a next page");
    let (status, next) = get_json(
        &server,
        &format!("/threads?agentId=demo&limit=2&cursor={cursor}"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(next["threads"][0]["id"], "ck0");
    // Another agent's filter sees none of them.
    let (_, other) = get_json(&server, "/threads?agentId=other").await;
    assert_eq!(other["threads"], json!([]));
}

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.sent().await;
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn copilotkit_s_thread_mutations_rename_archive_and_delete_their_principal_s_threads() {
    let server = TestServer::start().await;
    for id in ["m1", "m2"] {
        frames_of(post_json(&server, "/agent/demo/run", &run_body(id, "r", "hello")).await).await;
    }
    // Rename: the record as it is then; the listing shows the name and the last run.
    let (status, record) = send(
        server
            .patch("/threads/m1")
            .json(&json!({"agentId": "demo", "name": "  Trip plans "})),
    )
    .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["name"], "Trip plans");
    assert!(record["lastRunAt"].is_string(), "{record}");
    // Archive: gone from the default listing, there with includeArchived (as the drawer
    // asks), and back when unarchived.
    let (status, answer) = send(
        server
            .post("/threads/m1/archive")
            .json(&json!({"agentId": "demo"})),
    )
    .await;
    assert_eq!(
        (status, answer),
        (200, json!({"threadId": "m1", "archived": true}))
    );
    let ids = |page: &Value| -> Vec<(String, bool)> {
        page["threads"]
            .as_array()
            .expect("threads")
            .iter()
            .map(|t| {
                (
                    t["id"].as_str().expect("id").to_owned(),
                    t["archived"] == true,
                )
            })
            .collect()
    };
    let (_, page) = get_json(&server, "/threads?agentId=demo").await;
    assert_eq!(ids(&page), [("m2".to_owned(), false)]);
    let (_, page) = get_json(&server, "/threads?agentId=demo&includeArchived=true").await;
    assert_eq!(
        ids(&page),
        [("m1".to_owned(), true), ("m2".to_owned(), false)]
    );
    let (status, record) = send(
        server
            .patch("/threads/m1")
            .json(&json!({"agentId": "demo", "archived": false})),
    )
    .await;
    assert_eq!((status, record["archived"].clone()), (200, json!(false)));

    // What cannot be changed, or is not this principal's, is refused.
    for (body, field) in [
        (json!({"name": ""}), "name"),
        (json!({"name": 7}), "name"),
        (json!({"archived": "yes"}), "archived"),
        (json!({"agent": "other"}), "agent"),
    ] {
        let (status, error) = send(server.patch("/threads/m1").json(&body)).await;
        assert_eq!(
            (status, error["field"].clone()),
            (400, json!(field)),
            "{body}"
        );
    }
    let (status, _) = send(
        server
            .patch("/threads/m1")
            .json(&json!({"agentId": "other", "name": "x"})),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = send(server.patch("/threads/nope").json(&json!({"name": "x"}))).await;
    assert_eq!(status, 404);
    let (status, _) = send(server.get("/threads?includeArchived=maybe")).await;
    assert_eq!(status, 400);

    // Another principal sees none of it.
    let minted: Value = server
        .post("/tokens")
        .json(&json!({"sub": "eve"}))
        .sent()
        .await
        .json()
        .await
        .expect("token");
    let eve = minted["token"].as_str().expect("token");
    let (status, _) = send(
        client()
            .patch(server.url("/threads/m1"))
            .bearer_auth(eve)
            .json(&json!({"name": "mine"})),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = send(
        client()
            .post(server.url("/threads/m1/archive"))
            .bearer_auth(eve),
    )
    .await;
    assert_eq!(status, 404);

    // Delete, as CopilotKit sends it (with a JSON body).
    let (status, _) = send(
        server
            .delete("/threads/m2")
            .json(&json!({"agentId": "demo"})),
    )
    .await;
    assert_eq!(status, 204);
    let (_, page) = get_json(&server, "/threads?agentId=demo&includeArchived=true").await;
    assert_eq!(ids(&page), [("m1".to_owned(), false)]);
    let (_, page) = get_json(&server, "/threads/m1").await;
    assert_eq!(page["name"], "Trip plans");
}
