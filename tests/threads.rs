//! Threads over real sockets: the thread API, reattach, fan-out to many streams, a stalled
//! reader, admission, racing POSTs, delete.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

#[tokio::test]
async fn thread_api_lists_shows_and_deletes() {
    let server = TestServer::start().await;
    for i in 0..3 {
        let frames = SseReader::new(
            post_run(
                &server,
                "demo",
                &run_body(&format!("th{i}"), "r", &format!("hello {i}")),
            )
            .await,
        )
        .collect()
        .await;
        assert_valid_segment(&frames);
    }
    let (status, page) = get_json(&server, "/threads?limit=2").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = page["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| t["threadId"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["th2", "th1"], "newest activity first");
    let first = &page["threads"][0];
    for key in [
        "agent",
        "title",
        "createdAt",
        "updatedAt",
        "messageCount",
        "status",
    ] {
        assert!(first.get(key).is_some(), "{key} in {first}");
    }
    assert_eq!(first["status"], "idle");
    assert_eq!(first["messageCount"], 2);
    assert_eq!(first["title"], "hello 2");
    let cursor = page["nextCursor"].as_str().expect("next page");
    let (_, page) = get_json(&server, &format!("/threads?limit=2&cursor={cursor}")).await;
    assert_eq!(page["threads"][0]["threadId"], "th0");
    assert!(page.get("nextCursor").is_none(), "last page");

    let (status, _) = get_json(&server, "/threads?agent=nobody").await;
    assert_eq!(status, 200);
    let (status, body) = get_json(&server, "/threads?cursor=zz").await;
    assert_eq!(status, 400);
    assert_eq!(body["field"], "cursor");
    let (status, _) = get_json(&server, "/threads?limit=0").await;
    assert_eq!(status, 400);

    let (status, thread) = get_json(&server, "/threads/th1").await;
    assert_eq!(status, 200);
    assert_eq!(thread["lastRun"]["outcome"], "finished");
    let (status, messages) = get_json(&server, "/threads/th1/messages").await;
    assert_eq!(status, 200);
    assert_eq!(messages["truncated"], false);
    assert_eq!(messages["messages"][0]["role"], "user");
    assert_eq!(messages["messages"][1]["content"], "You said: hello 1");
    let (_, messages) = get_json(&server, "/threads/th1/messages?limit=1").await;
    assert_eq!(messages["truncated"], true);
    assert_eq!(messages["messages"].as_array().expect("array").len(), 1);

    let r = server.delete("/threads/th1").sent().await;
    assert_eq!(r.status(), 204);
    let (status, _) = get_json(&server, "/threads/th1").await;
    assert_eq!(status, 404);
    let (status, _) = get_json(&server, "/threads/th1/messages").await;
    assert_eq!(status, 404);
    let r = server.delete("/threads/th1").sent().await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn deleting_a_thread_cancels_its_live_run_first() {
    let server = TestServer::start().await;
    let mut reader =
        SseReader::new(post_run(&server, "demo", &run_body("d", "r", "/slow 500 20")).await);
    assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");
    let r = server.delete("/threads/d").sent().await;
    assert_eq!(r.status(), 204);
    let rest = reader.collect().await;
    let last = rest.last().expect("terminal");
    assert_eq!(last.kind(), "RUN_FINISHED");
    assert_eq!(last.data["outcome"]["type"], "cancelled");
    let (status, _) = get_json(&server, "/threads/d").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn stream_route_reattaches_exactly_and_says_so() {
    let server = TestServer::start().await;
    let mut first =
        SseReader::new(post_run(&server, "demo", &run_body("s", "r", "/slow 30 20")).await);
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(first.next().await.expect("frame"));
    }
    drop(first); // the tab closed
    let last_id = seen.last().and_then(|f| f.id.clone()).expect("id");
    let r = server
        .get("/threads/s/stream")
        .header("last-event-id", &last_id)
        .sent()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["agui-resume"], "exact");
    let rest = SseReader::new(r).collect().await;
    let mut all = seen.clone();
    all.extend(rest);
    assert_valid_segment(&all);
    let chunks = all
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .count();
    assert_eq!(chunks, 30, "no loss, no duplicate");

    // The same through the query parameter, and a resync for a bad id.
    let r = server
        .get(&format!("/threads/s/stream?lastEventId={last_id}"))
        .sent()
        .await;
    assert_eq!(r.headers()["agui-resume"], "exact");
    let r = server
        .get("/threads/s/stream")
        .header("last-event-id", "1-2-3")
        .sent()
        .await;
    assert_eq!(r.headers()["agui-resume"], "resync");
    let frames = SseReader::new(r).collect().await;
    assert_eq!(kinds(&frames), SNAPSHOT_RUN);
    // An id that is not even text (bytes over 0x7f) is malformed too, not absent.
    let r = server
        .get("/threads/s/stream")
        .header(
            "last-event-id",
            reqwest::header::HeaderValue::from_bytes(b"1-2-\xff").expect("obs-text"),
        )
        .sent()
        .await;
    assert_eq!(r.headers()["agui-resume"], "resync");
    SseReader::new(r).collect().await;
    let r = server.get("/threads/unknown/stream").sent().await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn ten_streams_on_one_run_receive_identical_bytes() {
    let server = TestServer::start().await;
    let body = run_body("fan", "r1", "/slow 40 10");
    let mut readers = vec![post_run(&server, "demo", &body).await];
    for i in 0..9 {
        // Same transcript, new runId: no new input, so this attaches to the live run.
        let mut again = body.clone();
        again["runId"] = json!(format!("attach-{i}"));
        readers.push(post_run(&server, "demo", &again).await);
    }
    let mut logs = Vec::new();
    for reader in readers {
        assert_eq!(reader.status(), 200);
        logs.push(reader.bytes().await.expect("body"));
    }
    let text = String::from_utf8_lossy(&logs[0]);
    assert!(text.contains("RUN_FINISHED"), "{text}");
    assert_eq!(text.matches("TEXT_MESSAGE_CONTENT").count(), 40);
    for log in &logs[1..] {
        assert_eq!(log, &logs[0]);
    }
}

#[tokio::test]
async fn a_reader_that_stops_reading_is_cut_and_the_others_are_not_slowed() {
    let server = TestServer::with(|c| c.stall_timeout = Duration::from_secs(2)).await;
    // Paced (1 ms a chunk, about 4 s in all): the run outlives the stall timeout.
    let body = run_body("stall", "r1", "/slow 4000 1");
    // The stalled reader: a tiny receive window, and it never reads.
    let mut stalled = raw_post_run(&server, &body).await;
    // Give the run a head start so the others attach to it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut others = Vec::new();
    for i in 0..9 {
        let mut again = body.clone();
        again["runId"] = json!(format!("attach-{i}"));
        others.push(tokio::spawn({
            let url = server.url("/demo");
            let again = again.clone();
            async move {
                client()
                    .post(url)
                    .bearer_auth(TOKEN)
                    .json(&again)
                    .sent()
                    .await
                    .bytes()
                    .await
                    .expect("body")
            }
        }));
    }
    let mut logs = Vec::new();
    for task in others {
        logs.push(task.await.expect("reader"));
    }
    for log in &logs {
        let text = String::from_utf8_lossy(log);
        assert!(
            text.contains("RUN_FINISHED"),
            "a steady reader missed the end"
        );
        assert_eq!(text.matches("TEXT_MESSAGE_CONTENT").count(), 4000);
        assert_eq!(log, &logs[0]);
    }
    // Now drain the stalled socket: its body ended without the terminal event.
    let got = read_raw_to_end(&mut stalled, Duration::from_secs(10), Duration::ZERO).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"));
    assert!(text.contains("RUN_STARTED"));
    assert!(
        !text.contains("RUN_FINISHED"),
        "the stalled reader was not cut"
    );
}

#[tokio::test]
async fn over_capacity_refuses_exactly_the_excess_and_creates_no_rows_for_it() {
    let (cap, extra) = (3usize, 4usize);
    let server = TestServer::with(|c| c.max_concurrent_runs = cap).await;
    let mut tasks = Vec::new();
    for i in 0..cap + extra {
        let url = server.url("/demo");
        let body = run_body(&format!("adm{i}"), &format!("r{i}"), "/slow 30 30");
        tasks.push(tokio::spawn(async move {
            let r = client()
                .post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .sent()
                .await;
            let status = r.status().as_u16();
            let retry = r.headers().contains_key("retry-after");
            let body = r.bytes().await.expect("body");
            (i, status, retry, body)
        }));
    }
    let mut refused = Vec::new();
    let mut served = 0;
    for task in tasks {
        let (i, status, retry, body) = task.await.expect("task");
        match status {
            200 => served += 1,
            503 => {
                assert!(retry, "Retry-After");
                assert!(String::from_utf8_lossy(&body).contains("OVER_CAPACITY"));
                refused.push(i);
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(served, cap);
    assert_eq!(refused.len(), extra);
    for i in refused {
        let (status, _) = get_json(&server, &format!("/threads/adm{i}")).await;
        assert_eq!(status, 404, "no row for a refused run");
    }
    let (_, page) = get_json(&server, "/threads").await;
    assert_eq!(page["threads"].as_array().expect("threads").len(), cap);
}

#[tokio::test]
async fn racing_posts_on_one_thread_never_start_two_runs() {
    let server = TestServer::start().await;
    for round in 0..15 {
        let thread = format!("race{round}");
        let message =
            json!([{"id": format!("{thread}-m"), "role": "user", "content": "/slow 5 10"}]);
        let mut tasks = Vec::new();
        for run in ["a", "b"] {
            let url = server.url("/demo");
            let body = json!({"threadId": thread, "runId": format!("{thread}-{run}"),
                "protocolVersion": "1.0", "messages": message});
            tasks.push(tokio::spawn(async move {
                let r = client()
                    .post(url)
                    .bearer_auth(TOKEN)
                    .json(&body)
                    .sent()
                    .await;
                let status = r.status().as_u16();
                (status, r.bytes().await.expect("body"))
            }));
        }
        let mut run_ids = HashSet::new();
        for task in tasks {
            let (status, body) = task.await.expect("task");
            match status {
                200 => {
                    let text = String::from_utf8_lossy(&body);
                    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
                        let v: Value = serde_json::from_str(line).expect("json");
                        if v["type"] == "RUN_STARTED" {
                            run_ids.insert(v["runId"].as_str().expect("runId").to_owned());
                        }
                    }
                }
                409 => {}
                other => panic!("unexpected status {other}"),
            }
        }
        assert_eq!(run_ids.len(), 1, "round {round}: {run_ids:?}");
        let (_, messages) = get_json(&server, &format!("/threads/{thread}/messages")).await;
        assert_eq!(messages["messages"].as_array().expect("messages").len(), 2);
    }
}

#[tokio::test]
async fn different_new_input_while_running_is_refused_but_the_same_transcript_attaches() {
    let server = TestServer::start().await;
    let body = run_body("att", "r1", "/slow 20 20");
    let first = post_run(&server, "demo", &body).await;
    let mut again = body.clone();
    again["runId"] = json!("r2");
    let attached = post_run(&server, "demo", &again).await;
    assert_eq!(attached.status(), 200);
    let frames = SseReader::new(attached).collect().await;
    assert_eq!(frames[0].data["runId"], "r1", "attached to the live run");
    assert_valid_segment(&frames);
    drop(first);
}

#[tokio::test]
async fn a_delete_racing_new_input_never_leaves_two_live_runs() {
    let server = TestServer::start().await;
    for round in 0..20 {
        let thread = format!("dr{round}");
        let post = |run: &str, text: &str| {
            let body = json!({"threadId": thread, "runId": format!("{thread}-{run}"),
                "protocolVersion": "1.0",
                "messages": [{"id": format!("{thread}-{run}-m"), "role": "user", "content": text}]});
            let request = server.post("/demo").json(&body);
            async move {
                let r = request.sent().await;
                r.status().as_u16()
            }
        };
        // A live run, then a delete racing new input, then more new input.
        let first = server
            .post("/demo")
            .json(&json!({"threadId": thread, "runId": format!("{thread}-a"), "protocolVersion": "1.0",
                "messages": [{"id": format!("{thread}-a-m"), "role": "user", "content": "/slow 100 50"}]}))
            .sent()
            .await;
        assert_eq!(first.status(), 200);
        let delete = server.delete(&format!("/threads/{thread}")).sent();
        let (deleted, second) = tokio::join!(delete, post("b", "/slow 100 50"));
        assert_eq!(deleted.status(), 204);
        let third = post("c", "/slow 100 50").await;
        let started = [second, third].iter().filter(|s| **s == 200).count();
        assert!(
            started <= 1,
            "round {round}: second {second}, third {third}: two live runs"
        );
        for status in [second, third] {
            assert!(status == 200 || status == 409, "round {round}: {status}");
        }
        drop(first);
        server.delete(&format!("/threads/{thread}")).sent().await;
    }
}

#[tokio::test]
async fn a_new_thread_refused_for_a_live_run_id_leaves_nothing_behind() {
    let server = TestServer::start().await;
    let live = server
        .post("/demo")
        .json(
            &json!({"threadId": "owner", "runId": "shared", "protocolVersion": "1.0",
            "messages": [{"id": "o-m", "role": "user", "content": "/slow 100 50"}]}),
        )
        .sent()
        .await;
    assert_eq!(live.status(), 200);
    let refused = server
        .post("/demo")
        .json(
            &json!({"threadId": "other", "runId": "shared", "protocolVersion": "1.0",
            "messages": [{"id": "x-m", "role": "user", "content": "hi"}]}),
        )
        .sent()
        .await;
    assert_eq!(refused.status(), 409);
    assert_eq!(get_json(&server, "/threads/other").await.0, 404);
    let stream = server.get("/threads/other/stream").sent().await;
    assert_eq!(stream.status(), 404);
}

async fn outcome_of(server: &TestServer, thread: &str) -> String {
    for _ in 0..200 {
        let (status, body) = get_json(server, &format!("/threads/{thread}")).await;
        if status == 200
            && let Some(outcome) = body["lastRun"]["outcome"].as_str()
            && outcome != "running"
        {
            return outcome.to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the run on {thread} did not end");
}

#[tokio::test]
async fn a_run_started_with_no_stream_runs_to_its_end_and_can_be_followed() {
    let server = TestServer::with(|c| {
        c.disconnect_grace = std::time::Duration::from_millis(100);
    })
    .await;
    // A run whose only stream is dropped at once is cancelled after the grace...
    drop(post_run(&server, "demo", &run_body("fg", "r1", "/slow 15 50")).await);
    assert_eq!(outcome_of(&server, "fg").await, "cancelled");

    // ...one started with no stream is not.
    let response = server
        .post("/threads/bg/runs")
        .json(&json!({"agent": "demo", "messages": [
            {"id": "m1", "role": "user", "content": "/slow 15 50"}]}))
        .sent()
        .await;
    assert_eq!(response.status(), 202);
    let started: Value = response.json().await.expect("json");
    assert_eq!(started["threadId"], "bg");
    let run_id = started["runId"].as_str().expect("runId").to_owned();
    // Anyone may follow it on the thread's stream, and leave again.
    let response = server
        .get("/threads/bg/stream")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    let mut reader = SseReader::new(response);
    let first = reader.next().await.expect("a frame");
    assert_eq!(first.kind(), "RUN_STARTED");
    assert_eq!(first.data["runId"], run_id);
    drop(reader);
    assert_eq!(outcome_of(&server, "bg").await, "finished");
    let (_, messages) = get_json(&server, "/threads/bg/messages").await;
    let reply = messages["messages"][1]["content"]
        .as_str()
        .expect("a reply");
    assert!(reply.ends_with("chunk 15/15\n"), "{reply}");

    // New input while it runs follows the multitask strategy (reject: 409 with its id).
    let response = server
        .post("/threads/bg/runs")
        .json(&json!({"agent": "demo", "runId": "r2", "messages": [
            {"id": "m2", "role": "user", "content": "/slow 40 50"}]}))
        .sent()
        .await;
    assert_eq!(response.status(), 202);
    let busy = server
        .post("/threads/bg/runs")
        .json(&json!({"agent": "demo", "messages": [
            {"id": "m3", "role": "user", "content": "again"}]}))
        .sent()
        .await;
    assert_eq!(busy.status(), 409);
    let error: Value = busy.json().await.expect("json");
    assert_eq!(error["runId"], "r2");

    // What the route cannot start is refused by name.
    for (body, field) in [
        (json!({"messages": []}), "agent"),
        (
            json!({"agent": "demo", "threadId": "other", "messages": []}),
            "threadId",
        ),
    ] {
        let response = server.post("/threads/bg/runs").json(&body).sent().await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["field"], field, "{body}");
    }
}

#[tokio::test]
async fn a_thread_stream_with_follow_all_sees_every_later_run() {
    let server = TestServer::start().await;
    let first = post_run(&server, "demo", &run_body("fa", "r1", "hello")).await;
    SseReader::new(first).collect().await;

    let response = server
        .get("/threads/fa/stream?follow=all")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let mut reader = SseReader::new(response);
    // The thread as it is: a short run with its snapshots.
    let mut hydration = Vec::new();
    while let Some(frame) = reader.next().await {
        let end = frame.kind() == "RUN_FINISHED";
        hydration.push(frame);
        if end {
            break;
        }
    }
    assert_eq!(
        kinds(&hydration),
        [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "STATE_SNAPSHOT",
            "RUN_FINISHED"
        ]
    );

    // A run started with no stream, then one started by another client: both arrive on
    // the same stream, each whole.
    let response = server
        .post("/threads/fa/runs")
        .json(&json!({"agent": "demo", "runId": "r2", "messages": [
            {"id": "m2", "role": "user", "content": "from a schedule"}]}))
        .sent()
        .await;
    assert_eq!(response.status(), 202);
    let mut runs: Vec<Vec<SseFrame>> = Vec::new();
    let mut current = Vec::new();
    while runs.len() < 2 {
        let frame = reader.next().await.expect("the stream goes on");
        let end = matches!(frame.kind(), "RUN_FINISHED" | "RUN_ERROR");
        current.push(frame);
        if end {
            runs.push(std::mem::take(&mut current));
            if runs.len() == 1 {
                let mut body = run_body("fa", "r3", "from another tab");
                body["messages"] = json!([
                    {"id": "m3", "role": "user", "content": "from another tab"}]);
                SseReader::new(post_run(&server, "demo", &body).await)
                    .collect()
                    .await;
            }
        }
    }
    assert_eq!(runs[0][0].data["runId"], "r2");
    assert_eq!(text_of(&runs[0]), "You said: from a schedule");
    assert_eq!(runs[1][0].data["runId"], "r3");
    assert_eq!(text_of(&runs[1]), "You said: from another tab");
    for run in &runs {
        assert_valid_segment(run);
    }

    let response = server
        .get("/threads/fa/stream?follow=forever")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(response.status(), 400);
}
