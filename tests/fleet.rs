//! The ambient plane: `GET {path}/fleet/stream`. A snapshot of the fleet document, then
//! RFC 6902 patches; applied by a client, they give the daemon's document; replay by event
//! id or time; metadata only; a principal sees its own runs; a subscriber that fell behind
//! the kept history is ended, and its reconnect resyncs.

mod support;

use std::time::Duration;

use agui_serve::http::Limits;
use serde_json::{Value, json};
use support::*;

/// A fleet subscriber that applies what it reads.
struct Follower {
    reader: SseReader,
    doc: Value,
    ids: Vec<String>,
    raw: String,
    /// Replayed patches apply to the document the client had; a follower that had none
    /// only records them.
    apply_patches: bool,
}

impl Follower {
    async fn open(server: &TestServer, token: &str, query: &str, last: Option<&str>) -> Follower {
        let mut request = client()
            .get(server.url(&format!("/fleet/stream{query}")))
            .bearer_auth(token)
            .header("accept", "text/event-stream");
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = request.sent().await;
        assert_eq!(response.status(), 200);
        Follower {
            reader: SseReader::new(response),
            doc: Value::Null,
            ids: Vec::new(),
            raw: String::new(),
            apply_patches: last.is_none()
                && !query.contains("lastEventId")
                && !query.contains("since"),
        }
    }

    /// Reads one frame and applies it; its kind.
    async fn step(&mut self) -> String {
        let frame = tokio::time::timeout(Duration::from_secs(10), self.reader.next())
            .await
            .expect("a fleet frame in time")
            .expect("the stream goes on");
        self.apply(frame)
    }

    fn apply(&mut self, frame: SseFrame) -> String {
        self.raw.push_str(&frame.data.to_string());
        self.ids
            .push(frame.id.clone().expect("every frame has an id"));
        match frame.kind() {
            "STATE_SNAPSHOT" => self.doc = frame.data["snapshot"].clone(),
            "STATE_DELTA" if !self.apply_patches => {}
            "STATE_DELTA" => {
                let patch: json_patch::Patch =
                    serde_json::from_value(frame.data["delta"].clone()).expect("a patch");
                json_patch::patch(&mut self.doc, &patch).expect("the patch applies");
            }
            other => panic!("unexpected {other} on the fleet stream"),
        }
        frame.kind().to_owned()
    }

    /// Reads and applies frames until none comes for `quiet`.
    async fn quiet(&mut self, quiet: Duration) {
        loop {
            let Ok(frame) = tokio::time::timeout(quiet, self.reader.next()).await else {
                return;
            };
            let frame = frame.expect("the stream goes on");
            self.apply(frame);
        }
    }

    /// Reads until `done` holds for the document.
    async fn until(&mut self, what: &str, done: impl Fn(&Value) -> bool) {
        for _ in 0..200 {
            if done(&self.doc) {
                return;
            }
            self.step().await;
        }
        panic!("{what}: {}", self.doc);
    }
}

fn live(doc: &Value) -> usize {
    doc["runs"].as_object().map_or(0, |runs| runs.len())
}

fn phases(doc: &Value) -> Vec<String> {
    let mut phases: Vec<String> = doc["runs"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, run)| run["phase"].as_str().unwrap_or("").to_owned())
        .collect();
    phases.sort();
    phases
}

async fn mint(server: &TestServer, sub: &str) -> String {
    let answer: Value = server
        .post("/tokens")
        .json(&json!({"sub": sub}))
        .sent()
        .await
        .json()
        .await
        .expect("json");
    answer["token"].as_str().expect("token").to_owned()
}

#[tokio::test]
async fn snapshot_and_patches_follow_the_fleet_with_metadata_only() {
    let server = TestServer::start().await;
    let alice = mint(&server, "alice").await;
    let mut everyone = Follower::open(&server, TOKEN, "", None).await;
    assert_eq!(everyone.step().await, "STATE_SNAPSHOT");
    assert_eq!(everyone.doc["agents"]["demo"]["state"], "ready");
    assert_eq!(live(&everyone.doc), 0);
    let mut hers = Follower::open(&server, &alice, "", None).await;
    assert_eq!(hers.step().await, "STATE_SNAPSHOT");

    let marker = "MARKER-d41d8cd98f00";
    // The operator's long run, and Alice's run that waits for an approval.
    let slow = post_run(
        &server,
        "demo",
        &run_body("f-slow", "f-slow-r", "/slow 40 50"),
    )
    .await;
    let mut slow = SseReader::new(slow);
    slow.next().await.expect("started");
    let wait = client()
        .post(server.url("/demo"))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&run_body(
            "f-wait",
            "f-wait-r",
            &format!("/approve {marker}"),
        ))
        .sent()
        .await;
    SseReader::new(wait).collect().await;
    everyone
        .until("a running and a suspended run", |doc| {
            phases(doc) == ["running", "suspended"]
        })
        .await;
    let waiting = everyone.doc["runs"]
        .as_object()
        .expect("runs")
        .values()
        .find(|run| run["phase"] == "suspended")
        .expect("the waiting run")
        .clone();
    assert_eq!(waiting["threadId"], "f-wait");
    assert_eq!(waiting["owner"], "alice");
    assert_eq!(waiting["agent"], "demo");
    assert_eq!(waiting["runId"], "f-wait-r");
    assert_eq!(waiting["waitingFor"][0]["kind"], "approval");
    assert!(waiting["startedAt"].as_str().expect("time").ends_with('Z'));
    assert_eq!(
        everyone.doc["totals"],
        json!({"live": 2, "suspended": 1, "queued": 0})
    );
    hers.until("her waiting run", |doc| phases(doc) == ["suspended"])
        .await;
    assert_eq!(
        hers.doc["totals"],
        json!({"live": 1, "suspended": 1, "queued": 0})
    );

    // A failing run comes and goes; the slow one ends.
    let failed = post_run(
        &server,
        "demo",
        &run_body("f-fail", "f-fail-r", &format!("/fail {marker}")),
    )
    .await;
    SseReader::new(failed).collect().await;
    slow.collect().await;
    everyone
        .until("only the waiting run", |doc| phases(doc) == ["suspended"])
        .await;

    // Applied, the patches give the daemon's document (a fresh subscriber's snapshot).
    let mut fresh = Follower::open(&server, TOKEN, "", None).await;
    fresh.step().await;
    assert_eq!(everyone.doc, fresh.doc);
    let mut fresh_hers = Follower::open(&server, &alice, "", None).await;
    fresh_hers.step().await;
    assert_eq!(hers.doc, fresh_hers.doc);
    // Her view never showed the operator's runs.
    assert!(!hers.raw.contains("f-slow") && !hers.raw.contains("f-fail"));
    // Metadata only: no message text, no tool arguments.
    for raw in [&everyone.raw, &hers.raw] {
        assert!(!raw.contains(marker), "message text on the fleet stream");
    }
    // Ids strictly increase (the snapshot repeats the id of the last change it holds).
    let seqs: Vec<u64> = everyone
        .ids
        .iter()
        .map(|id| id.rsplit('-').next().expect("seq").parse().expect("number"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
    server.stop().await;
}

#[tokio::test]
async fn replay_by_event_id_or_time_without_gap_or_duplicate() {
    let server = TestServer::start().await;
    let mut first = Follower::open(&server, TOKEN, "", None).await;
    first.step().await;
    let mut times = Vec::new();
    for i in 0..3 {
        times.push(humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string());
        let r = post_run(
            &server,
            "demo",
            &run_body(&format!("rp{i}"), &format!("rp{i}-r"), "/slow 2 100"),
        )
        .await;
        SseReader::new(r).collect().await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Everything up to a quiet second.
    first.quiet(Duration::from_millis(1_500)).await;
    assert_eq!(live(&first.doc), 0);
    let deltas: Vec<String> = first.ids[1..].to_vec();
    assert!(deltas.len() >= 6, "a start and an end per run: {deltas:?}");

    // After the second delta: exactly the rest, then the snapshot.
    let mut again = Follower::open(&server, TOKEN, "", Some(&deltas[1])).await;
    let mut kinds = Vec::new();
    loop {
        let kind = again.step().await;
        kinds.push(kind.clone());
        if kind == "STATE_SNAPSHOT" {
            break;
        }
    }
    assert_eq!(&again.ids[..again.ids.len() - 1], &deltas[2..]);
    assert_eq!(again.ids.last(), deltas.last());
    // The same with the id in the query (EventSource's first connection).
    let mut by_query =
        Follower::open(&server, TOKEN, &format!("?lastEventId={}", deltas[1]), None).await;
    by_query.step().await;
    assert_eq!(by_query.ids[0], deltas[2]);

    // By time: from before the last run, its start and end at least.
    let mut since = Follower::open(&server, TOKEN, &format!("?since={}", times[2]), None).await;
    let mut got = Vec::new();
    loop {
        let kind = since.step().await;
        if kind == "STATE_SNAPSHOT" {
            break;
        }
        got.push(since.ids.last().cloned().expect("id"));
    }
    assert!(
        got.len() >= 2 && deltas.ends_with(&got),
        "{got:?} of {deltas:?}"
    );

    // As a plain EventSource opens it: the token in the query, no headers.
    let plain = client()
        .get(server.url(&format!("/fleet/stream?token={TOKEN}")))
        .sent()
        .await;
    assert_eq!(plain.status(), 200);
    let mut plain = SseReader::new(plain);
    assert_eq!(
        plain.next().await.expect("snapshot").kind(),
        "STATE_SNAPSHOT"
    );

    let bad = server
        .get("/fleet/stream?since=yesterday")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.expect("json");
    assert_eq!(error["field"], "since");
    // An id of another boot: the snapshot, said to be a resync.
    let other = server
        .get("/fleet/stream")
        .header("accept", "text/event-stream")
        .header("last-event-id", "1-1")
        .sent()
        .await;
    assert_eq!(other.headers()["agui-resume"], "resync");
    let mut other = SseReader::new(other);
    assert_eq!(
        other.next().await.expect("snapshot").kind(),
        "STATE_SNAPSHOT"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_is_ended_and_replays_on_reconnect() {
    let limits = Limits {
        send_buffer: 4096,
        ..Limits::default()
    };
    let server = TestServer::with_limits(|c| c.fleet_history = 200, limits).await;
    // A subscriber that stops reading after the headers.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut stalled = socket.connect(server.addr).await.expect("connect");
    {
        use tokio::io::AsyncWriteExt;
        let request = format!(
            "GET /agui/fleet/stream HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\naccept: text/event-stream\r\n\r\n"
        );
        stalled.write_all(request.as_bytes()).await.expect("write");
    }
    // Changes (a start and an end per run), each with a long thread id, so the frames fill
    // both socket buffers (a few dozen frames) and the daemon sees the subscriber fall more
    // than a quarter of the kept history (200) behind, while what it missed is still kept.
    let long = "x".repeat(200);
    for i in 0..60 {
        let r = post_run(
            &server,
            "demo",
            &run_body(&format!("{long}{i}"), &format!("fb{i}-r"), "/slow 2 60"),
        )
        .await;
        SseReader::new(r).collect().await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Read what it was sent: the stream ended (the chunked body is closed).
    let got = read_raw_to_end(&mut stalled, Duration::from_secs(10), Duration::ZERO).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        got.ends_with(b"\r\n0\r\n\r\n"),
        "the stream ends explicitly"
    );
    let last_id = text
        .lines()
        .filter_map(|line| line.strip_prefix("id: "))
        .next_back()
        .expect("some frames")
        .to_owned();
    // It was ended while what it missed is still kept: the reconnect from its last id
    // replays exactly (every later change, in order), then the snapshot.
    let resumed = server
        .get("/fleet/stream")
        .header("accept", "text/event-stream")
        .header("last-event-id", &last_id)
        .sent()
        .await;
    assert_eq!(resumed.headers()["agui-resume"], "exact");
    let mut resumed = SseReader::new(resumed);
    let last_seq: u64 = last_id.rsplit('-').next().expect("seq").parse().expect("n");
    let mut expected = last_seq + 1;
    loop {
        let frame = resumed.next().await.expect("frame");
        let seq: u64 = frame
            .id
            .as_deref()
            .and_then(|id| id.rsplit('-').next())
            .and_then(|n| n.parse().ok())
            .expect("id");
        if frame.kind() == "STATE_SNAPSHOT" {
            assert_eq!(
                seq,
                expected - 1,
                "the snapshot holds every change replayed"
            );
            assert_eq!(frame.data["snapshot"]["totals"]["live"], 0);
            break;
        }
        assert_eq!(seq, expected, "no gap, no duplicate");
        expected += 1;
    }
    assert!(expected > last_seq + 1, "something was replayed");
    server.stop().await;
}

#[tokio::test]
async fn the_fleet_shows_budget_pauses_queued_input_and_each_principal_s_day() {
    let server = TestServer::with(|config| {
        config.budgets.run = agui_serve::budget::Limits {
            tokens: Some(12),
            ..Default::default()
        };
        config.budgets.principal = agui_serve::budget::Limits {
            tokens: Some(1000),
            ..Default::default()
        };
    })
    .await;
    let alice = mint(&server, "alice").await;
    let mut everyone = Follower::open(&server, TOKEN, "", None).await;
    everyone.step().await;
    let mut hers = Follower::open(&server, &alice, "", None).await;
    hers.step().await;

    // Her run reaches its budget and waits on the question.
    let paused = client()
        .post(server.url("/demo"))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&run_body("fb-pause", "fb-pause-r", "/slow 10 20"))
        .sent()
        .await;
    SseReader::new(paused).collect().await;
    everyone
        .until("her run waiting on its budget", |doc| {
            doc["runs"]
                .as_object()
                .into_iter()
                .flatten()
                .any(|(_, run)| run["waitingFor"][0]["kind"] == "budget")
        })
        .await;
    everyone
        .until("her day", |doc| doc["principals"]["alice"]["reached"] == 1)
        .await;
    let day = &everyone.doc["principals"]["alice"];
    assert!(
        day["spent"]["tokens"].as_u64().expect("tokens") >= 12,
        "{day}"
    );
    assert_eq!(day["limits"], json!({"tokens": 1000}));

    // The operator's long run with an input queued behind it.
    let slow = post_run(&server, "demo", &run_body("fb-q", "fb-q-r1", "/slow 40 50")).await;
    let mut slow = SseReader::new(slow);
    slow.next().await.expect("started");
    let mut queued = run_body("fb-q", "fb-q-r2", "after");
    queued["forwardedProps"] = json!({"agui": {"multitask": "enqueue"}});
    let queued = post_run(&server, "demo", &queued).await;
    everyone
        .until("the queued input", |doc| doc["totals"]["queued"] == 1)
        .await;
    assert_eq!(everyone.doc["runs"]["fb-q"]["queued"], 1);
    // Stopped (it may be paused on its own budget by now), it lets the queued input run.
    let stopped = server.post("/runs/fb-q-r1/cancel").sent().await;
    assert_eq!(stopped.status(), 202);
    slow.collect().await;
    let after = SseReader::new(queued).collect().await;
    assert!(
        text_of(&after).contains("You said: after"),
        "{:?}",
        kinds(&after)
    );
    everyone
        .until("the queue emptied", |doc| doc["totals"]["queued"] == 0)
        .await;

    // Her view shows her day only; the operator's has both.
    hers.until("her day", |doc| doc["principals"]["alice"]["reached"] == 1)
        .await;
    assert_eq!(
        hers.doc["principals"]
            .as_object()
            .expect("principals")
            .keys()
            .collect::<Vec<_>>(),
        ["alice"]
    );
    assert!(everyone.doc["principals"][""]["spent"]["tokens"].as_u64() > Some(0));
    server.stop().await;
}
