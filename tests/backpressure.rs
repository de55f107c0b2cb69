//! Readers and the journal window: a reader that keeps reading gets every frame however far
//! the agent runs ahead, and a frame larger than the window is still delivered.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

/// POSTs `body` with a tiny receive buffer, takes nothing for `pause`, then reads slowly
/// (a short pause after every read) to the end; returns the raw bytes.
async fn slow_read(server: &TestServer, body: &serde_json::Value, pause: Duration) -> Vec<u8> {
    let mut stream = raw_post_run(server, body).await;
    tokio::time::sleep(pause).await;
    read_raw_to_end(
        &mut stream,
        Duration::from_secs(60),
        Duration::from_micros(200),
    )
    .await
}

fn count(haystack: &[u8], needle: &str) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle.as_bytes())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_far_behind_the_agent_still_gets_every_frame() {
    let server = TestServer::start().await;
    // 100 000 unpaced chunks; the reader takes nothing for 2 s, so the agent is a whole
    // journal window (4096 frames) ahead of it, then it reads slowly.
    let body = run_body("far", "r1", "/slow 100000 0");
    let got = slow_read(&server, &body, Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert_eq!(count(&got, "\"type\":\"RUN_STARTED\""), 1);
    assert_eq!(count(&got, "\"type\":\"TEXT_MESSAGE_CONTENT\""), 100_000);
    assert!(text.contains("chunk 100000/100000"));
    assert_eq!(
        count(&got, "\"type\":\"RUN_FINISHED\""),
        1,
        "ends with its terminal"
    );
    let end = text.rfind("RUN_FINISHED").expect("terminal");
    assert!(
        !text[end..].contains("\"type\""),
        "nothing after the terminal"
    );
}

#[tokio::test]
async fn a_message_larger_than_the_window_is_delivered_with_its_terminal_event() {
    let server = TestServer::start().await;
    let word = "x".repeat(6 * 1024 * 1024);
    let response = post_run(&server, "demo", &run_body("big", "r1", &word)).await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    let echoed: usize = frames
        .iter()
        .filter(|f| f.kind() == "TEXT_MESSAGE_CONTENT")
        .map(|f| f.data["delta"].as_str().expect("delta").len())
        .sum();
    assert!(echoed >= word.len(), "{echoed}");
}

#[tokio::test]
async fn a_state_larger_than_the_window_is_delivered_with_its_terminal_event() {
    let server = TestServer::start().await;
    let mut body = run_body("bigstate", "r1", "hello");
    body["state"] = json!({"blob": "y".repeat(6 * 1024 * 1024)});
    let response = post_run(&server, "demo", &body).await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    let snapshot = frames
        .iter()
        .find(|f| f.kind() == "STATE_SNAPSHOT")
        .expect("snapshot");
    assert_eq!(
        snapshot.data["snapshot"]["client"]["blob"]
            .as_str()
            .expect("blob")
            .len(),
        6 * 1024 * 1024
    );
}
