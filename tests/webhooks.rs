//! Webhooks end to end, over real sockets: a receiver on a loopback port
//! (`support/webhook_receiver.rs`) checks every signature with the endpoint's secret and
//! records every attempt.
//!
//! - every event kind arrives, signed; a changed body would not verify;
//! - a receiver that fails for a while gets everything afterwards, in order per thread,
//!   its failing head holding back only its own thread;
//! - thread creation and deletion, each payload naming only the owning principal;
//! - `kill -9` of the binary in the middle of deliveries: after a restart on the same data
//!   directory every event arrives, duplicates only under the same id;
//! - a budget reached (a run that spends its hard budget) goes out like the others.

mod support;
#[path = "support/webhook_receiver.rs"]
mod webhook_receiver;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use agui_serve::config::WebhookConfig;
use agui_serve::webhooks::{Events, Secret, parse_url};
use serde_json::{Value, json};

use support::{Sent, SseReader, TOKEN, TestServer, post_run, run_body, temp_dir};
use webhook_receiver::{Answer, Received, Receiver, verify_independently};

const SECRET: &[u8] = b"whsec-test-0123456789abcdef-0123456789";

/// An endpoint for `receiver`, its secret in a file of `dir`, every event.
fn endpoint(receiver: &Receiver, dir: &std::path::Path, max_backoff: Duration) -> WebhookConfig {
    let secret_file = dir.join("webhook.secret");
    std::fs::write(&secret_file, [receiver.secret.as_slice(), b"\n"].concat()).expect("secret");
    WebhookConfig {
        name: "receiver".to_owned(),
        url: parse_url(&receiver.url).expect("url"),
        secret: Secret::read(&secret_file).expect("secret"),
        secret_file,
        events: Events::all(),
        timeout: Duration::from_secs(5),
        max_backoff,
    }
}

async fn server_for(receiver: &Receiver, max_backoff: Duration) -> TestServer {
    let dir = temp_dir("hooks");
    TestServer::with(|config| config.webhooks = vec![endpoint(receiver, &dir, max_backoff)]).await
}

/// Runs `text` on `thread` as run `run` and reads the stream to its end.
async fn run(server: &TestServer, thread: &str, run: &str, text: &str) -> Vec<support::SseFrame> {
    SseReader::new(post_run(server, "demo", &run_body(thread, run, text)).await)
        .collect()
        .await
}

/// The accepted events of `thread`, as `type` (or `type:runId`), in arrival order.
fn kinds_of(received: &[Received], thread: &str) -> Vec<String> {
    received
        .iter()
        .filter(|r| r.accepted && r.thread() == thread)
        .map(|r| match r.body["runId"].as_str() {
            Some(run) => format!("{}:{run}", r.kind()),
            None => r.kind().to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn every_event_kind_arrives_signed_and_a_changed_body_would_not_verify() {
    let receiver = Receiver::start(SECRET, Answer::Ok).await;
    let server = server_for(&receiver, Duration::from_secs(1)).await;

    let finished = run(&server, "t1", "r1", "hello").await;
    assert_eq!(finished.last().expect("terminal").kind(), "RUN_FINISHED");
    let failed = run(&server, "t1", "r2", "/fail boom").await;
    assert_eq!(failed.last().expect("terminal").kind(), "RUN_ERROR");
    // A run cancelled from another connection.
    let mut slow =
        SseReader::new(post_run(&server, "demo", &run_body("t2", "r3", "/slow 200 20")).await);
    assert_eq!(slow.next().await.expect("frame").kind(), "RUN_STARTED");
    let cancel = server.post("/runs/r3/cancel").sent().await;
    assert_eq!(cancel.status(), 202);
    slow.collect().await;
    // A run parked on an approval the client must give.
    let parked = run(&server, "t3", "r4", "/approve deploy").await;
    let outcome = &parked.last().expect("terminal").data["outcome"];
    assert!(outcome["pendingToolCallIds"].is_array(), "{outcome}");
    let deleted = server.delete("/threads/t1").sent().await;
    assert_eq!(deleted.status(), 204);

    receiver
        .wait_until("every event", Duration::from_secs(20), |r| {
            r.iter().filter(|r| r.accepted).count() >= 8
        })
        .await;
    let received = receiver.received();
    assert_eq!(
        kinds_of(&received, "t1"),
        [
            "thread.created:r1",
            "run.finished:r1",
            "run.failed:r2",
            "thread.deleted"
        ]
    );
    assert_eq!(
        kinds_of(&received, "t2"),
        ["thread.created:r3", "run.cancelled:r3"]
    );
    assert_eq!(
        kinds_of(&received, "t3"),
        ["thread.created:r4", "run.waiting:r4"]
    );
    assert!(
        received.iter().all(|r| r.verified),
        "every signature verifies"
    );
    assert_eq!(received.len(), 8, "nothing was sent twice or refused");
    let ids: HashSet<&str> = received.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), 8, "every event has its own id");
    for r in &received {
        assert_eq!(
            r.body["id"],
            r.id.as_str(),
            "the header names the body's id"
        );
        assert_eq!(r.body["principal"], "operator");
        assert_eq!(r.body["agent"], "demo");
        assert!(r.body["createdAt"].is_string());
    }
    let failure = received
        .iter()
        .find(|r| r.kind() == "run.failed")
        .expect("run.failed");
    assert_eq!(failure.body["data"]["message"], "boom");
    assert!(failure.body["data"]["code"].is_string());
    let waiting = received
        .iter()
        .find(|r| r.kind() == "run.waiting")
        .expect("run.waiting");
    assert_eq!(waiting.body["data"]["waits"][0]["kind"], "permission");
    assert_eq!(
        waiting.body["data"]["waits"][0]["id"],
        outcome["pendingToolCallIds"][0]
    );

    // The checks are real: one changed byte of the body, or the wrong secret, fails both.
    let signed = &received[0];
    let mut tampered = signed.raw.to_vec();
    let at = tampered.len() / 2;
    tampered[at] ^= 0x01;
    assert!(verify_independently(SECRET, &signed.signature, &signed.raw));
    assert!(!verify_independently(SECRET, &signed.signature, &tampered));
    assert!(!verify_independently(
        b"another secret",
        &signed.signature,
        &signed.raw
    ));
    let now = signed.signature[2..12].parse::<u64>().expect("t");
    assert!(
        agui_serve::webhooks::sign::verify(SECRET, &signed.signature, &signed.raw, now, 300)
            .is_ok()
    );
    assert!(
        agui_serve::webhooks::sign::verify(SECRET, &signed.signature, &tampered, now, 300).is_err()
    );

    // The operator sees the outbox: everything delivered, nothing pending.
    let status: Value = server
        .get("/webhooks")
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let endpoint = &status["endpoints"][0];
    assert_eq!(endpoint["name"], "receiver");
    assert_eq!(endpoint["delivered"], 8);
    assert_eq!(endpoint["pending"], 0);
    assert!(endpoint["lastDeliveredAt"].is_string());
    let url = endpoint["url"].as_str().expect("url");
    assert!(
        !url.contains("s3cret-path"),
        "the URL's path is not shown: {url}"
    );
    let delivered: Value = server
        .get("/webhooks/deliveries?status=delivered")
        .sent()
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(delivered["deliveries"].as_array().expect("rows").len(), 8);
    let bad = server.get("/webhooks/deliveries?status=lost").sent().await;
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.expect("json");
    assert_eq!(error["field"], "status");
    server.stop().await;
}

#[tokio::test]
async fn a_receiver_that_fails_for_a_while_gets_everything_afterwards_in_order_per_thread() {
    // The backoff is capped at 250ms here (default 5m) so that an outage of a few seconds
    // already retries at the cap many times over: past the cap every round is the same,
    // so a longer outage only repeats them (see docs/webhooks.md).
    let receiver = Receiver::start(SECRET, Answer::Fail).await;
    let server = server_for(&receiver, Duration::from_millis(250)).await;
    let threads = ["o1", "o2", "o3"];
    for (i, thread) in threads.iter().enumerate() {
        for n in 0..3 {
            run(
                &server,
                thread,
                &format!("{thread}-r{n}"),
                &format!("hello {i} {n}"),
            )
            .await;
        }
    }
    // Refused for at least three seconds and a dozen attempts of each thread's head.
    let outage = tokio::time::Instant::now();
    receiver
        .wait_until("attempts refused", Duration::from_secs(30), |r| {
            threads
                .iter()
                .all(|t| r.iter().filter(|r| r.thread() == *t && !r.accepted).count() >= 12)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(outage.elapsed())).await;
    let during = receiver.received();
    assert!(during.iter().all(|r| !r.accepted));
    for thread in threads {
        // Only the thread's first event was ever tried: the others wait behind it.
        let tried: HashSet<String> = during
            .iter()
            .filter(|r| r.thread() == thread)
            .map(|r| r.kind().to_owned())
            .collect();
        assert_eq!(
            tried,
            HashSet::from(["thread.created".to_owned()]),
            "{thread}"
        );
    }
    let status: Value = server
        .get("/webhooks")
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let endpoint = &status["endpoints"][0];
    assert_eq!(endpoint["pending"], 12, "{status}");
    assert_eq!(
        endpoint["failing"], 3,
        "one failing head per thread: {status}"
    );
    assert_eq!(endpoint["lastError"]["message"], "answered 500");
    let failing: Value = server
        .get("/webhooks/deliveries?status=failing")
        .sent()
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(failing["deliveries"].as_array().expect("rows").len(), 3);
    let metrics = server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("agui_webhook_pending{endpoint=\"receiver\"} 12"),
        "{metrics}"
    );

    receiver.answer(Answer::Ok);
    receiver
        .wait_until(
            "every event after the outage",
            Duration::from_secs(30),
            |r| r.iter().filter(|r| r.accepted).count() >= 12,
        )
        .await;
    let received = receiver.received();
    for thread in threads {
        let mut expected = vec![format!("thread.created:{thread}-r0")];
        expected.extend((0..3).map(|n| format!("run.finished:{thread}-r{n}")));
        assert_eq!(kinds_of(&received, thread), expected, "{thread}");
    }
    let accepted: Vec<&str> = received
        .iter()
        .filter(|r| r.accepted)
        .map(|r| r.id.as_str())
        .collect();
    let unique: HashSet<&str> = accepted.iter().copied().collect();
    assert_eq!(accepted.len(), unique.len(), "each event accepted once");
    // A refused event kept its id across its attempts.
    let created_o1: HashSet<&str> = received
        .iter()
        .filter(|r| r.thread() == "o1" && r.kind() == "thread.created")
        .map(|r| r.id.as_str())
        .collect();
    assert_eq!(created_o1.len(), 1);
    let metrics = server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("agui_webhook_deliveries_total{endpoint=\"receiver\"} 12"),
        "{metrics}"
    );
    let failed_attempts = metric(
        &metrics,
        "agui_webhook_failed_attempts_total{endpoint=\"receiver\"}",
    );
    assert!(failed_attempts >= 36.0, "{failed_attempts}");
    server.stop().await;
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test]
async fn a_2xx_head_is_the_delivery_however_slow_its_body() {
    let receiver = Receiver::start(SECRET, Answer::SlowBody(Duration::from_secs(30))).await;
    let dir = temp_dir("hooks-slow-body");
    let mut hook = endpoint(&receiver, &dir, Duration::from_secs(1));
    hook.timeout = Duration::from_millis(500);
    let server = TestServer::with(move |config| config.webhooks = vec![hook]).await;
    run(&server, "slow-body", "r1", "hello").await;
    receiver
        .wait_until("the run's events", Duration::from_secs(10), |r| {
            r.iter().any(|r| r.kind() == "run.finished")
        })
        .await;
    // Well past the attempt's timeout and the first retry's backoff: nothing came twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let received = receiver.received();
    let mut ids: Vec<&str> = received.iter().map(|r| r.id.as_str()).collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all, "an event was delivered again: {received:?}");
}

#[tokio::test]
async fn thread_events_name_only_the_principal_that_owns_the_thread() {
    let receiver = Receiver::start(SECRET, Answer::Ok).await;
    let dir = temp_dir("hooks-scope");
    let server = TestServer::with(|config| {
        config.webhooks = vec![endpoint(&receiver, &dir, Duration::from_secs(1))];
        config.access.trusted_principal_header = Some(http::HeaderName::from_static("x-user"));
    })
    .await;
    // The same thread id in two principals' namespaces.
    for user in ["alice", "bob"] {
        let response = server
            .post("/demo")
            .header("x-user", user)
            .header("accept", "text/event-stream")
            .json(&run_body("shared", &format!("{user}-r1"), "hello"))
            .sent()
            .await;
        assert_eq!(response.status(), 200);
        SseReader::new(response).collect().await;
    }
    let deleted = server
        .delete("/threads/shared")
        .header("x-user", "alice")
        .sent()
        .await;
    assert_eq!(deleted.status(), 204);
    receiver
        .wait_until("five events", Duration::from_secs(20), |r| {
            r.iter().filter(|r| r.accepted).count() >= 5
        })
        .await;
    let received = receiver.received();
    let by_principal = |who: &str| -> Vec<String> {
        received
            .iter()
            .filter(|r| r.body["principal"] == who)
            .map(|r| r.kind().to_owned())
            .collect()
    };
    assert_eq!(
        by_principal("alice"),
        ["thread.created", "run.finished", "thread.deleted"]
    );
    assert_eq!(by_principal("bob"), ["thread.created", "run.finished"]);
    for r in &received {
        assert_eq!(r.thread(), "shared", "the owner's own id, never the key");
        let text = String::from_utf8_lossy(&r.raw);
        assert!(!text.contains('\u{1f}'), "{text}");
        assert!(!text.contains(TOKEN), "{text}");
        let other = if r.body["principal"] == "alice" {
            "bob"
        } else {
            "alice"
        };
        assert!(
            !text.contains(other),
            "an event names no other principal: {text}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_budget_reached_goes_out_like_any_event() {
    let receiver = Receiver::start(SECRET, Answer::Ok).await;
    let dir = temp_dir("hooks-budget");
    let endpoints = vec![endpoint(&receiver, &dir, Duration::from_secs(1))];
    let server = TestServer::with(move |config| {
        config.webhooks = endpoints;
        config.budgets.hard = agui_serve::budget::Limits {
            tokens: Some(12),
            ..Default::default()
        };
    })
    .await;
    // The demo agent's `/slow 10 20` spends 3 tokens a chunk: the hard budget of 12 ends it.
    let frames =
        SseReader::new(post_run(&server, "demo", &run_body("t9", "r9", "/slow 10 20")).await)
            .collect()
            .await;
    assert_eq!(frames.last().expect("end").data["code"], "BUDGET_EXCEEDED");
    receiver
        .wait_until("the budget event", Duration::from_secs(20), |r| {
            r.iter().any(|r| r.accepted && r.kind() == "budget.reached")
        })
        .await;
    let received = receiver.received();
    let reached = received
        .iter()
        .find(|r| r.kind() == "budget.reached")
        .expect("budget.reached");
    assert!(reached.verified);
    assert_eq!(reached.body["threadId"], "t9");
    assert_eq!(reached.body["runId"], "r9");
    assert_eq!(reached.body["agent"], "demo");
    assert_eq!(
        (
            &reached.body["data"]["budget"],
            &reached.body["data"]["measure"]
        ),
        (&json!("hard"), &json!("tokens"))
    );
    assert_eq!(reached.body["data"]["limit"], 12);
    // The run's end is reported after it, as a failure naming the budget.
    receiver
        .wait_until("the run's end", Duration::from_secs(20), |r| {
            r.iter().any(|r| r.accepted && r.kind() == "run.failed")
        })
        .await;
    let failed = receiver.received();
    let failed = failed
        .iter()
        .find(|r| r.kind() == "run.failed")
        .expect("run.failed");
    assert_eq!(failed.body["data"]["code"], "BUDGET_EXCEEDED");
    server.stop().await;
}

// ---- kill -9 in the middle of deliveries ------------------------------------------------

const BIN: &str = env!("CARGO_BIN_EXE_agui-serve");

/// The binary on `data`, with `config`, answering on a fresh port; killed when dropped.
struct Daemon {
    child: std::process::Child,
    base: String,
}

impl Daemon {
    /// On `port` (0: any free one).
    fn start(
        config: &std::path::Path,
        data: &std::path::Path,
        log: &std::path::Path,
        port: u16,
        log_level: &str,
    ) -> Daemon {
        use std::io::BufRead;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log");
        let mut child = std::process::Command::new(BIN)
            .args([
                "--no-tls",
                "--token",
                TOKEN,
                "--port",
                &port.to_string(),
                "--config",
            ])
            .arg(config)
            .arg("--data-dir")
            .arg(data)
            .env_remove("AGUI_TOKEN")
            .env_remove("AGUI_CONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env("RUST_LOG", log_level)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(log))
            .spawn()
            .expect("spawn agui-serve");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut base = None;
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).expect("stdout") == 0 {
                break;
            }
            if let Some(url) = line.trim().strip_prefix("agui-serve listening on ") {
                base = Some(url.to_owned());
                break;
            }
        }
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let base = base.expect("agui-serve listening");
        Daemon { child, base }
    }

    fn kill9(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("reap");
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn kill_9_in_the_middle_of_deliveries_loses_nothing_and_repeats_only_under_the_same_id() {
    let root = temp_dir("hooks-kill");
    let (data, log, config) = (
        root.join("data"),
        root.join("daemon.log"),
        root.join("agui.toml"),
    );
    std::fs::create_dir_all(&data).expect("data");
    let secret_file = root.join("webhook.secret");
    std::fs::write(&secret_file, SECRET).expect("secret");
    // Refused at first, so events pile up in the outbox.
    let receiver = Receiver::start(SECRET, Answer::Fail).await;
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nname = \"receiver\"\nurl = \"{}\"\nsecret_file = \"{}\"\nevents = [\"*\"]\nmax_backoff = \"200ms\"\n",
            receiver.url,
            secret_file.display()
        ),
    )
    .expect("config");
    let mut daemon = Daemon::start(&config, &data, &log, 0, "trace");
    let http = reqwest::Client::new();
    let threads: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for thread in &threads {
        for n in 0..2 {
            let run_id = format!("{thread}-r{n}");
            let response = http
                .post(format!("{}/demo", daemon.base))
                .bearer_auth(TOKEN)
                .header("accept", "text/event-stream")
                .json(&run_body(thread, &run_id, "hello"))
                .sent()
                .await;
            assert_eq!(response.status(), 200);
            let frames = SseReader::new(response).collect().await;
            assert_eq!(frames.last().expect("terminal").kind(), "RUN_FINISHED");
            let events = expected.entry(thread.clone()).or_default();
            if n == 0 {
                events.push(format!("thread.created:{run_id}"));
            }
            events.push(format!("run.finished:{run_id}"));
        }
    }
    let total: usize = expected.values().map(Vec::len).sum();
    // Slow answers: deliveries are in flight when the kill lands.
    receiver.answer(Answer::Slow(Duration::from_millis(150)));
    receiver
        .wait_until("some deliveries", Duration::from_secs(30), |r| {
            r.iter().filter(|r| r.accepted).count() >= 6
        })
        .await;
    daemon.kill9();
    let before = receiver.accepted().len();
    assert!(
        before < total,
        "the kill landed with deliveries left ({before} of {total})"
    );
    receiver.answer(Answer::Ok);
    let daemon = Daemon::start(&config, &data, &log, 0, "trace");
    receiver
        .wait_until(
            "every event after the restart",
            Duration::from_secs(60),
            |r| {
                let ids: HashSet<&str> = r
                    .iter()
                    .filter(|r| r.accepted)
                    .map(|r| r.id.as_str())
                    .collect();
                ids.len() >= total
            },
        )
        .await;
    let received = receiver.accepted();
    // Each fact arrived under one id: a repeat is the same event again.
    let mut id_of: HashMap<String, String> = HashMap::new();
    for r in &received {
        let fact = format!(
            "{}/{}:{}",
            r.thread(),
            r.kind(),
            r.body["runId"].as_str().unwrap_or("")
        );
        let id = id_of.entry(fact.clone()).or_insert_with(|| r.id.clone());
        assert_eq!(*id, r.id, "{fact} arrived under two ids");
    }
    assert_eq!(id_of.len(), total, "every event, and nothing else");
    // In order per thread: the first arrival of each event.
    for (thread, events) in &expected {
        let mut seen = Vec::new();
        for event in kinds_of(&received, thread) {
            if !seen.contains(&event) {
                seen.push(event);
            }
        }
        assert_eq!(&seen, events, "{thread}");
    }
    assert!(received.iter().all(|r| r.verified));
    // The restarted daemon records its last answers a moment after the receiver has them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status: Value = http
            .get(format!("{}/webhooks", daemon.base))
            .bearer_auth(TOKEN)
            .sent()
            .await
            .json()
            .await
            .expect("json");
        if status["endpoints"][0]["pending"] == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(daemon);
    // Traced throughout, and neither the secret nor the URL's path is in the log.
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(logged.contains("TRACE"), "trace logging was on");
    assert!(
        logged.contains("webhook not delivered"),
        "the failures were logged"
    );
    assert!(!logged.contains(std::str::from_utf8(SECRET).expect("text")));
    assert!(!logged.contains("s3cret-path"));
    let _ = std::fs::remove_dir_all(PathBuf::from(&root));
}

// ---- a cluster: two nodes on one PostgreSQL ---------------------------------------------

/// A free port on 127.0.0.1 a moment ago (a node must advertise its address up front).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Two nodes share one database and one outbox: every event of either node's threads
/// reaches the receiver exactly once. Ignored unless asked: `AGUI_TEST_PG_URL=... cargo
/// test --test webhooks -- --ignored` (`scripts/cluster.sh` runs it).
#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn two_nodes_on_postgresql_deliver_each_event_once() {
    let base_url = std::env::var("AGUI_TEST_PG_URL").expect("AGUI_TEST_PG_URL");
    let db = format!("agui_test_{}", uuid::Uuid::new_v4().simple());
    let (admin, connection) = tokio_postgres::connect(&base_url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create database");
    let url = format!("{base_url} dbname={db}");

    let root = temp_dir("hooks-cluster");
    let secret_file = root.join("webhook.secret");
    std::fs::write(&secret_file, SECRET).expect("secret");
    let receiver = Receiver::start(SECRET, Answer::Ok).await;
    let mut nodes = Vec::new();
    for node in ["A", "B"] {
        let port = free_port();
        let config = root.join(format!("{node}.toml"));
        std::fs::write(
            &config,
            format!(
                "[server]\nstore = {url:?}\nnode_id = \"{node}\"\nadvertise_url = \"http://127.0.0.1:{port}\"\n\n\
                 [[webhooks]]\nname = \"receiver\"\nurl = \"{}\"\nsecret_file = \"{}\"\n",
                receiver.url,
                secret_file.display()
            ),
        )
        .expect("config");
        let data = root.join(node);
        std::fs::create_dir_all(&data).expect("data");
        nodes.push(Daemon::start(
            &config,
            &data,
            &root.join(format!("{node}.log")),
            port,
            "info",
        ));
    }
    let http = reqwest::Client::new();
    let mut facts = HashSet::new();
    for i in 0..8 {
        let node = &nodes[i % 2];
        let thread = format!("c{i}");
        for n in 0..2 {
            let run_id = format!("{thread}-r{n}");
            let response = http
                .post(format!("{}/demo", node.base))
                .bearer_auth(TOKEN)
                .header("accept", "text/event-stream")
                .json(&run_body(&thread, &run_id, "hello"))
                .sent()
                .await;
            assert_eq!(response.status(), 200);
            let frames = SseReader::new(response).collect().await;
            assert_eq!(frames.last().expect("terminal").kind(), "RUN_FINISHED");
            if n == 0 {
                facts.insert(format!("{thread}/thread.created:{run_id}"));
            }
            facts.insert(format!("{thread}/run.finished:{run_id}"));
        }
    }
    receiver
        .wait_until("every event", Duration::from_secs(30), |r| {
            r.iter().filter(|r| r.accepted).count() >= facts.len()
        })
        .await;
    // Both nodes poll the outbox every 2s: a second event would have come by now.
    tokio::time::sleep(agui_serve::webhooks::POLL * 3).await;
    let received = receiver.received();
    let arrived: Vec<String> = received
        .iter()
        .map(|r| {
            format!(
                "{}/{}:{}",
                r.thread(),
                r.kind(),
                r.body["runId"].as_str().unwrap_or("")
            )
        })
        .collect();
    let unique: HashSet<String> = arrived.iter().cloned().collect();
    assert_eq!(
        arrived.len(),
        unique.len(),
        "an event came twice: {arrived:?}"
    );
    assert_eq!(unique, facts);
    let ids: HashSet<&str> = received.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), received.len());
    assert!(received.iter().all(|r| r.verified && r.accepted));
    drop(nodes);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await;
}
