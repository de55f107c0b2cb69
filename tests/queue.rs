//! The enqueue strategy: input sent while a run is live waits in the thread's queue and
//! runs, in order, each as a run of its own with its own stream; a queued item can be
//! listed, edited and cancelled until it starts, and the queue outlives a restart.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

fn enqueued(thread: &str, run: &str, text: &str) -> Value {
    let mut body = run_body(thread, run, text);
    body["forwardedProps"] = json!({"agui": {"multitask": "enqueue"}});
    body
}

fn ending(frames: &[SseFrame]) -> (String, Option<String>) {
    let last = frames.last().expect("a frame");
    (
        last.kind().to_owned(),
        last.data["code"].as_str().map(str::to_owned),
    )
}

async fn queue_ids(server: &TestServer, thread: &str) -> Vec<String> {
    let (status, body) = get_json(server, &format!("/threads/{thread}/queue")).await;
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test]
async fn three_messages_sent_while_a_run_is_live_run_in_order_each_with_its_own_stream() {
    let server = TestServer::start().await;
    let live = post_run(&server, "demo", &run_body("q", "r0", "/slow 20 50")).await;
    assert_eq!(live.status(), 200);
    let mut live = SseReader::new(live);
    assert_eq!(live.next().await.expect("frame").kind(), "RUN_STARTED");

    // Three messages while r0 runs: each request is answered with a stream at once.
    let mut waiting = Vec::new();
    for (run, text) in [("r1", "one"), ("r2", "two"), ("r3", "three")] {
        let response = post_run(&server, "demo", &enqueued("q", run, text)).await;
        assert_eq!(response.status(), 200, "{run}");
        waiting.push(SseReader::new(response));
    }
    assert_eq!(queue_ids(&server, "q").await, ["r1", "r2", "r3"]);
    let (_, thread) = get_json(&server, "/threads/q").await;
    assert_eq!(thread["queued"], 3);

    // The live run is not disturbed.
    let frames = live.collect().await;
    assert_eq!(frames.last().expect("end").kind(), "RUN_FINISHED");

    // Each queued message has a complete stream of its own run.
    let mut finished_at = Vec::new();
    for (reader, (run, text)) in
        waiting
            .into_iter()
            .zip([("r1", "one"), ("r2", "two"), ("r3", "three")])
    {
        let frames = reader.collect().await;
        assert_valid_segment(&frames);
        assert_eq!(frames[0].data["runId"], run);
        assert_eq!(frames.last().expect("end").kind(), "RUN_FINISHED");
        assert_eq!(text_of(&frames), format!("You said: {text}"));
        finished_at.push(frames.last().expect("end").id.clone());
    }
    // In order: each later run's events come after the earlier one's in the journal.
    let seqs: Vec<u64> = finished_at
        .iter()
        .map(|id| {
            id.as_deref()
                .and_then(|id| id.rsplit('-').next())
                .and_then(|n| u64::from_str_radix(n, 16).ok())
                .expect("event id ends with a sequence number")
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // The transcript holds the four turns in order.
    let (_, messages) = get_json(&server, "/threads/q/messages").await;
    let users: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().expect("text"))
        .collect();
    assert_eq!(users, ["/slow 20 50", "one", "two", "three"]);
    assert!(queue_ids(&server, "q").await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn queued_input_counts_against_the_memory_budget() {
    const MIB: usize = 1024 * 1024;
    let server = TestServer::with(|c| c.memory_budget = 64 * MIB).await;
    // Two threads with a live run each (a thread queues 32 items at most).
    let mut live = Vec::new();
    for thread in ["m0", "m1"] {
        let run = post_run(
            &server,
            "demo",
            &run_body(thread, &format!("{thread}-r0"), "/slow 100 100"),
        )
        .await;
        assert_eq!(run.status(), 200);
        let mut run = SseReader::new(run);
        assert_eq!(run.next().await.expect("frame").kind(), "RUN_STARTED");
        live.push(run);
    }
    // 64 items of 4 MiB: no more than the budget's worth is taken.
    let big = "x".repeat(4 * MIB);
    let (mut taken, mut refused) = (0, 0);
    let mut waiting = Vec::new();
    for i in 0..64 {
        let thread = format!("m{}", i % 2);
        let response = post_run(
            &server,
            "demo",
            &enqueued(&thread, &format!("big{i}"), &big),
        )
        .await;
        match response.status().as_u16() {
            200 => {
                taken += 1;
                waiting.push(response);
            }
            503 => {
                let error: Value = response.json().await.expect("json");
                assert_eq!(error["code"], "QUEUE_MEMORY", "{error}");
                refused += 1;
            }
            other => panic!("item {i}: {other}"),
        }
    }
    assert!(refused > 0, "every item was taken: {taken}");
    assert!(
        taken * 4 <= 64,
        "{taken} items of 4 MiB under a budget of 64 MiB"
    );
    let scrape = server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("scrape");
    let in_use: f64 = scrape
        .lines()
        .find_map(|l| l.strip_prefix("agui_memory_in_use_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the meter");
    assert!(
        in_use >= (taken * 4 * MIB) as f64,
        "the queued input is counted: {in_use}"
    );
    for thread in ["m0", "m1"] {
        let _ = server
            .post(&format!("/threads/{thread}/cancel"))
            .sent()
            .await;
    }
    drop(waiting);
    drop(live);
}

#[tokio::test]
async fn a_cancelled_item_never_runs_and_an_edited_one_runs_as_edited() {
    let server = TestServer::start().await;
    let live = post_run(&server, "demo", &run_body("c", "r0", "/slow 20 50")).await;
    let mut live = SseReader::new(live);
    assert_eq!(live.next().await.expect("frame").kind(), "RUN_STARTED");
    let first = SseReader::new(post_run(&server, "demo", &enqueued("c", "r1", "keep")).await);
    let second = SseReader::new(post_run(&server, "demo", &enqueued("c", "r2", "drop")).await);
    let third = SseReader::new(post_run(&server, "demo", &enqueued("c", "r3", "before")).await);

    // Cancel r2; edit r3.
    let response = server.delete("/threads/c/queue/r2").sent().await;
    assert_eq!(response.status(), 200);
    let edit = server
        .patch("/threads/c/queue/r3")
        .json(&json!({"messages": [{"id": "r3-u", "role": "user", "content": "after"}]}))
        .sent()
        .await;
    assert_eq!(edit.status(), 200);
    let edited: Value = edit.json().await.expect("json");
    assert_eq!(edited["position"], 1);
    assert_eq!(edited["messages"][0]["content"], "after");
    // Unknown items, and bad edits, are refused.
    assert_eq!(
        server.delete("/threads/c/queue/r2").sent().await.status(),
        404
    );
    let bad = server
        .patch("/threads/c/queue/r3")
        .json(&json!({"messages": [{"role": "user"}]}))
        .sent()
        .await;
    assert_eq!(bad.status(), 400);
    assert_eq!(queue_ids(&server, "c").await, ["r1", "r3"]);

    // The cancelled item's stream ends at once, in-band.
    let dropped = second.collect().await;
    assert_eq!(kinds(&dropped), ["RUN_STARTED", "RUN_ERROR"]);
    assert_eq!(ending(&dropped).1.as_deref(), Some("RUN_DEQUEUED"));

    live.collect().await;
    assert_eq!(text_of(&first.collect().await), "You said: keep");
    assert_eq!(text_of(&third.collect().await), "You said: after");
    let (_, messages) = get_json(&server, "/threads/c/messages").await;
    let text = messages.to_string();
    assert!(!text.contains("\"drop\""), "{text}");
    assert!(!text.contains("\"before\""), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn the_queue_is_scoped_and_bad_requests_are_refused() {
    let server = TestServer::start().await;
    // No such thread.
    let (status, _) = get_json(&server, "/threads/none/queue").await;
    assert_eq!(status, 404);
    // A thread with nothing live runs enqueued input at once, as any input.
    let frames = SseReader::new(post_run(&server, "demo", &enqueued("idle", "r1", "hi")).await)
        .collect()
        .await;
    assert_eq!(text_of(&frames), "You said: hi");
    // A run id already queued or live is refused.
    let live = post_run(&server, "demo", &run_body("d", "r0", "/slow 10 50")).await;
    let mut live = SseReader::new(live);
    live.next().await.expect("started");
    let _queued = post_run(&server, "demo", &enqueued("d", "r1", "x")).await;
    let again = post_run(&server, "demo", &enqueued("d", "r1", "y")).await;
    assert_eq!(again.status(), 409);
    let mut body = enqueued("d", "r0", "y");
    body["messages"][0]["id"] = json!("another");
    let again = post_run(&server, "demo", &body).await;
    assert_eq!(again.status(), 409);
    // An agent's default strategy applies when the request names none.
    live.collect().await;
    server.stop().await;

    let server = TestServer::with(|config| {
        for agent in &mut config.agents {
            agent.multitask = agui_serve::agent::Multitask::Enqueue;
        }
    })
    .await;
    let live = post_run(&server, "demo", &run_body("e", "r0", "/slow 5 50")).await;
    let mut live = SseReader::new(live);
    live.next().await.expect("started");
    let queued = post_run(&server, "demo", &run_body("e", "r1", "next")).await;
    assert_eq!(queued.status(), 200);
    // A run started with no stream waits its turn the same way: 202 with its run id.
    let mut body = run_body("e", "r2", "after");
    body["agent"] = json!("demo");
    let background = server.post("/threads/e/runs").json(&body).sent().await;
    assert_eq!(background.status(), 202);
    assert_eq!(queue_ids(&server, "e").await, ["r1", "r2"]);
    live.collect().await;
    assert_eq!(
        text_of(&SseReader::new(queued).collect().await),
        "You said: next"
    );
    let mut replies = Vec::new();
    for _ in 0..200 {
        let (_, messages) = get_json(&server, "/threads/e/messages").await;
        replies = messages["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect();
        if replies.iter().any(|r| r == "You said: after") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        replies.iter().any(|r| r == "You said: after"),
        "{replies:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_queue_survives_a_restart_and_runs_in_order_after_it() {
    let data_dir = temp_dir("queue-restart");
    let dir = data_dir.clone();
    let server = TestServer::with(move |config| {
        config.data_dir = dir;
        config.shutdown_grace = Duration::from_millis(500);
    })
    .await;
    let live = post_run(&server, "demo", &run_body("s", "r0", "/slow 200 50")).await;
    let mut live = SseReader::new(live);
    live.next().await.expect("started");
    let mut waiting = Vec::new();
    for (run, text) in [("r1", "one"), ("r2", "two")] {
        let response = post_run(&server, "demo", &enqueued("s", run, text)).await;
        assert_eq!(response.status(), 200);
        waiting.push(response);
    }
    // Stopping cuts the live run; the queued items are not run by a stopping daemon.
    server.stop().await;
    drop(waiting);

    let dir = data_dir.clone();
    let server = TestServer::with(move |config| config.data_dir = dir).await;
    // After the restart the stored items run by themselves, in order.
    let mut users = Vec::new();
    for _ in 0..200 {
        let (_, messages) = get_json(&server, "/threads/s/messages").await;
        users = messages["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .filter(|m| m["role"] == "user")
                    .map(|m| m["content"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        let (_, thread) = get_json(&server, "/threads/s").await;
        if users.len() == 3 && thread["status"] == "idle" && thread["queued"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(users, ["/slow 200 50", "one", "two"]);
    let (_, messages) = get_json(&server, "/threads/s/messages").await;
    let replies: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "assistant")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(replies.contains(&"You said: one"), "{replies:?}");
    assert!(replies.contains(&"You said: two"), "{replies:?}");
    assert!(queue_ids(&server, "s").await.is_empty());
    server.stop().await;
}

/// The daemon binary, killed (SIGKILL) and reaped when dropped.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon binary on `data`, plain HTTP on a free port; its base URL.
fn daemon(data: &std::path::Path, home: &std::path::Path) -> (Daemon, String) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Daemon(
        Command::new(env!("CARGO_BIN_EXE_agui-serve"))
            .args(["--no-tls", "--port", "0", "--token", TOKEN, "--data-dir"])
            .arg(data)
            .env_remove("AGUI_TOKEN")
            .env_remove("AGUI_CONFIG")
            .env_remove("STATE_DIRECTORY")
            .env_remove("NOTIFY_SOCKET")
            .env("HOME", home)
            .env("XDG_STATE_HOME", home.join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agui-serve"),
    );
    let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "daemon ended");
        if let Some(url) = line.trim().strip_prefix("agui-serve listening on ") {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut out, &mut std::io::sink());
            });
            return (child, url.to_owned());
        }
    }
}

#[tokio::test]
async fn queued_input_acknowledged_before_a_kill_9_runs_after_the_restart() {
    let (data, home) = (temp_dir("queue-kill"), temp_dir("queue-kill-home"));
    let http = client();
    let post = |base: &str, body: Value| {
        http.post(format!("{base}/demo"))
            .bearer_auth(TOKEN)
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
    };
    let (child, base) = daemon(&data, &home);
    let live = post(&base, run_body("k", "r0", "/slow 400 50"))
        .await
        .expect("run");
    let mut live = SseReader::new(live);
    live.next().await.expect("started");
    for (run, text) in [("r1", "one"), ("r2", "two"), ("r3", "three")] {
        // The stream's headers are the acknowledgement: the item is stored by then.
        let response = post(&base, enqueued("k", run, text))
            .await
            .expect("enqueue");
        assert_eq!(response.status(), 200);
    }
    drop(child); // SIGKILL

    let (child, base) = daemon(&data, &home);
    let mut users = Vec::new();
    for _ in 0..400 {
        let messages: Value = http
            .get(format!("{base}/threads/k/messages"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("messages")
            .json()
            .await
            .expect("json");
        users = messages["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .filter(|m| m["role"] == "user" || m["role"] == "assistant")
                    .filter_map(|m| m["content"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if users.iter().any(|text| text == "You said: three") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(child);
    // Each queued message ran once, in order, after the cut run.
    let turns: Vec<&str> = users
        .iter()
        .map(String::as_str)
        .filter(|text| {
            !text.starts_with("/slow") && !text.chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect();
    assert_eq!(
        turns,
        [
            "one",
            "You said: one",
            "two",
            "You said: two",
            "three",
            "You said: three"
        ],
        "{users:?}"
    );
}

#[tokio::test]
async fn input_sent_while_a_run_waits_for_an_approval_waits_its_turn_instead_of_superseding() {
    let server = TestServer::start().await;
    let first =
        SseReader::new(post_run(&server, "demo", &run_body("a", "r0", "/approve ship it")).await)
            .collect()
            .await;
    let call = first
        .iter()
        .find(|f| {
            f.kind() == "TOOL_CALL_START" && f.data["toolCallName"] == "agui_permission_request"
        })
        .expect("the permission request")
        .data["toolCallId"]
        .as_str()
        .expect("id")
        .to_owned();
    // New input that answers nothing: queued, the approval still open.
    let queued = post_run(&server, "demo", &enqueued("a", "r1", "next")).await;
    assert_eq!(queued.status(), 200);
    assert_eq!(queue_ids(&server, "a").await, ["r1"]);
    // The approval is answered: the run ends as approved, then the queued input runs.
    let answer = json!({
        "threadId": "a", "runId": "r0b", "protocolVersion": "1.0",
        "messages": [
            {"id": "r0-u", "role": "user", "content": "/approve ship it"},
            {"id": "ans", "role": "tool", "toolCallId": call, "content": "{\"optionId\":\"allow\"}"},
        ],
    });
    let answered = SseReader::new(post_run(&server, "demo", &answer).await)
        .collect()
        .await;
    assert_eq!(text_of(&answered), "Approved: ship it");
    assert_eq!(
        text_of(&SseReader::new(queued).collect().await),
        "You said: next"
    );
    server.stop().await;
}
