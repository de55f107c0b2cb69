//! `GET {path}/metrics` and the metrics listener: counters move as runs, cancels,
//! reattaches and refusals happen; every scrape parses as Prometheus text and passes
//! `promtool check metrics`; the route wants the token, the listener does not.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use prometheus_parse::{Scrape, Value};
use serde_json::json;
use support::*;

/// One scrape, parsed, with its text.
struct Metrics {
    text: String,
    scrape: Scrape,
}

impl Metrics {
    /// The value of the sample `name` whose labels include `labels` (0 when absent; every
    /// family this test reads is checked to be documented, so absence is not a typo).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let family = name
            .trim_end_matches("_total")
            .trim_end_matches("_count")
            .trim_end_matches("_sum");
        assert!(
            self.scrape.docs.contains_key(name) || self.scrape.docs.contains_key(family),
            "no HELP for {name} in:\n{}",
            self.text
        );
        self.scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                other => panic!("{name} is not a single number: {other:?}"),
            })
            .sum()
    }
}

/// Parses `text` with a crate (`promtool` checks a whole scrape in
/// `a_scrape_passes_promtool`).
fn parse(text: String) -> Metrics {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = Scrape::parse(lines).expect("metrics parse as Prometheus text");
    assert!(!scrape.samples.is_empty(), "no samples in:\n{text}");
    Metrics { text, scrape }
}

fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) is needed for this test");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool");
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}\n--- input:\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

async fn scrape(server: &TestServer) -> Metrics {
    let response = server.get("/metrics").sent().await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("content-type")
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse(response.text().await.expect("body"))
}

/// Scrapes until `check` holds (gauges settle as streams and pumps end).
async fn scrape_until(server: &TestServer, what: &str, check: impl Fn(&Metrics) -> bool) {
    for _ in 0..200 {
        if check(&scrape(server).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "timed out waiting for {what}:\n{}",
        scrape(server).await.text
    );
}

const DEMO: (&str, &str) = ("agent", "demo");

#[tokio::test]
async fn counters_follow_runs_cancels_reattaches_and_refusals() {
    let server = TestServer::with(|c| c.max_concurrent_runs = 1).await;

    let before = scrape(&server).await;
    assert_eq!(before.get("agui_runs_started_total", &[DEMO]), 0.0);
    assert_eq!(
        before.get("agui_runs_finished_total", &[DEMO, ("outcome", "finished")]),
        0.0
    );
    assert_eq!(before.get("agui_runs_live", &[]), 0.0);
    assert_eq!(before.get("agui_runs_capacity", &[]), 1.0);
    assert_eq!(
        before.get("agui_memory_budget_bytes", &[]),
        256.0 * 1024.0 * 1024.0
    );

    // A run that finishes.
    let frames = SseReader::new(post_run(&server, "demo", &run_body("t1", "r1", "hello")).await)
        .collect()
        .await;
    assert_valid_segment(&frames);
    scrape_until(&server, "the first run to be counted as finished", |m| {
        m.get("agui_runs_finished_total", &[DEMO, ("outcome", "finished")]) == 1.0
            && m.get("agui_runs_live", &[]) == 0.0
            && m.get("agui_streams_attached", &[]) == 0.0
    })
    .await;
    let after_run = scrape(&server).await;
    assert_eq!(after_run.get("agui_runs_started_total", &[DEMO]), 1.0);
    assert_eq!(
        after_run.get("agui_run_duration_seconds_count", &[DEMO]),
        1.0
    );
    assert!(after_run.get("agui_run_duration_seconds_sum", &[DEMO]) > 0.0);
    assert_eq!(
        after_run.get("agui_run_first_event_seconds_count", &[DEMO]),
        1.0
    );
    assert!(after_run.get("agui_memory_in_use_bytes", &[]) > 0.0);
    assert!(after_run.get("agui_store_commit_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(
        after_run.get(
            "agui_http_requests_total",
            &[("route", "run"), ("code", "200")]
        ),
        1.0
    );

    // Reattach after the first frame: an exact replay of the rest.
    let first_id = frames[0].id.clone().expect("id");
    let replay = server
        .get("/threads/t1/stream")
        .header("last-event-id", &first_id)
        .sent()
        .await;
    assert_eq!(replay.headers()["agui-resume"], "exact");
    let replayed = SseReader::new(replay).collect().await;
    assert_eq!(replayed.len(), frames.len() - 1);

    // A slow run, followed by a second stream with an unusable id: a resync.
    let slow = post_run(&server, "demo", &run_body("t2", "r2", "/slow 50 50")).await;
    assert_eq!(slow.status(), 200);
    let mut slow = SseReader::new(slow);
    let started = slow.next().await.expect("RUN_STARTED");
    assert_eq!(started.kind(), "RUN_STARTED");
    let resync = server
        .get("/threads/t2/stream")
        .header("last-event-id", "not-an-id")
        .sent()
        .await;
    assert_eq!(resync.headers()["agui-resume"], "resync");
    let mut resync = SseReader::new(resync);
    assert_eq!(resync.next().await.expect("frame").kind(), "RUN_STARTED");

    // Refusals: new input on the running thread (409), a new thread over the cap (503).
    let conflict = post_run(&server, "demo", &run_body("t2", "r3", "again")).await;
    assert_eq!(conflict.status(), 409);
    let over = post_run(&server, "demo", &run_body("t3", "r4", "hi")).await;
    assert_eq!(over.status(), 503);

    // The slow run's own stream and the resync; the replay's has ended.
    scrape_until(&server, "two attached streams", |m| {
        m.get("agui_streams_attached", &[]) == 2.0
    })
    .await;
    let during = scrape(&server).await;
    assert_eq!(during.get("agui_runs_live", &[]), 1.0);
    assert_eq!(during.get("agui_runs_suspended", &[]), 0.0);
    assert_eq!(during.get("agui_runs_started_total", &[DEMO]), 2.0);
    assert_eq!(
        during.get("agui_reattaches_total", &[("kind", "exact")]),
        1.0
    );
    assert_eq!(
        during.get("agui_reattaches_total", &[("kind", "resync")]),
        1.0
    );
    assert_eq!(
        during.get(
            "agui_admission_refusals_total",
            &[("reason", "run_in_progress")]
        ),
        1.0
    );
    assert_eq!(
        during.get(
            "agui_admission_refusals_total",
            &[("reason", "over_capacity")]
        ),
        1.0
    );
    assert_eq!(
        during.get(
            "agui_http_requests_total",
            &[("route", "run"), ("code", "409")]
        ),
        1.0
    );
    assert_eq!(
        during.get(
            "agui_http_requests_total",
            &[("route", "run"), ("code", "503")]
        ),
        1.0
    );

    // Cancel it: both streams end with the cancelled outcome.
    let cancel = server.post("/runs/r2/cancel").sent().await;
    assert_eq!(cancel.status(), 202);
    for reader in [slow, resync] {
        let rest = reader.collect().await;
        let last = rest.last().expect("terminal");
        assert_eq!(last.kind(), "RUN_FINISHED");
        assert_eq!(last.data["outcome"]["type"], "cancelled");
    }
    scrape_until(
        &server,
        "the cancel to be counted and the streams closed",
        |m| {
            m.get(
                "agui_runs_finished_total",
                &[DEMO, ("outcome", "cancelled")],
            ) == 1.0
                && m.get("agui_runs_live", &[]) == 0.0
                && m.get("agui_streams_attached", &[]) == 0.0
        },
    )
    .await;

    // A stream on a thread with nothing live: hydration.
    let hydrate = server.get("/threads/t1/stream").sent().await;
    assert_eq!(
        kinds(&SseReader::new(hydrate).collect().await),
        SNAPSHOT_RUN
    );

    let after = scrape(&server).await;
    assert_eq!(after.get("agui_runs_started_total", &[DEMO]), 2.0);
    assert_eq!(
        after.get("agui_runs_finished_total", &[DEMO, ("outcome", "finished")]),
        1.0
    );
    assert_eq!(after.get("agui_run_duration_seconds_count", &[DEMO]), 2.0);
    assert_eq!(
        after.get("agui_reattaches_total", &[("kind", "hydration")]),
        1.0
    );
    assert_eq!(
        after.get(
            "agui_http_requests_total",
            &[("route", "thread_stream"), ("code", "200")]
        ),
        3.0
    );
    assert_eq!(
        after.get(
            "agui_http_requests_total",
            &[("route", "cancel"), ("code", "202")]
        ),
        1.0
    );
    // Every scrape so far was counted (the one being answered is counted after it).
    assert!(
        after.get(
            "agui_http_requests_total",
            &[("route", "metrics"), ("code", "200")]
        ) >= 5.0
    );
    assert_eq!(after.get("agui_store_queue_depth", &[]), 0.0);
    server.stop().await;
}

#[tokio::test]
async fn the_metrics_route_wants_the_token() {
    let server = TestServer::start().await;
    let bare = client().get(server.url("/metrics")).sent().await;
    assert_eq!(bare.status(), 401);
    assert_eq!(bare.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = bare.json().await.expect("json");
    assert_eq!(body["code"], "UNAUTHORIZED");
    let wrong = client()
        .get(server.url("/metrics"))
        .bearer_auth("not-the-token")
        .sent()
        .await;
    assert_eq!(wrong.status(), 401);
    // The refusals are counted, under the route.
    let metrics = scrape(&server).await;
    assert_eq!(
        metrics.get(
            "agui_http_requests_total",
            &[("route", "metrics"), ("code", "401")]
        ),
        2.0
    );
    server.stop().await;
}

#[tokio::test]
async fn the_metrics_listener_serves_without_a_token() {
    let server =
        TestServer::with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"))).await;
    let addr = server.metrics_addr.expect("metrics listener");
    assert_ne!(addr.port(), server.addr.port());

    let frames = SseReader::new(post_run(&server, "demo", &run_body("t", "r", "hi")).await)
        .collect()
        .await;
    assert_valid_segment(&frames);

    let response = client().get(format!("http://{addr}/metrics")).sent().await;
    assert_eq!(response.status(), 200);
    let metrics = parse(response.text().await.expect("body"));
    assert_eq!(metrics.get("agui_runs_started_total", &[DEMO]), 1.0);

    let other = client()
        .get(format!("http://{addr}/agui/info"))
        .sent()
        .await;
    assert_eq!(other.status(), 404);
    let body: serde_json::Value = other.json().await.expect("json");
    assert_eq!(body["code"], "NOT_FOUND");
    let post = client()
        .post(format!("http://{addr}/metrics"))
        .json(&json!({}))
        .sent()
        .await;
    assert_eq!(post.status(), 405);

    // The listener stops with the server.
    server.stop().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the metrics listener outlived the server"
    );
}

/// Every family the daemon serves, after a run, passes `promtool check metrics`.
#[tokio::test]
#[ignore = "needs promtool (Debian: prometheus): scripts/test.sh runs it"]
async fn a_scrape_passes_promtool() {
    let server = TestServer::start().await;
    let frames = SseReader::new(post_run(&server, "demo", &run_body("t", "r", "hi")).await)
        .collect()
        .await;
    assert_valid_segment(&frames);
    let scrape = scrape(&server).await;
    server.stop().await;
    promtool_check(&scrape.text);
}

/// The check above can fail: promtool refuses what is not Prometheus text.
#[test]
#[ignore = "needs promtool (Debian: prometheus): scripts/test.sh runs it"]
fn promtool_refuses_broken_text() {
    let broken = std::panic::catch_unwind(|| promtool_check("agui_x{le=\"1\" 1\n"));
    assert!(broken.is_err(), "promtool accepted a malformed sample");
    promtool_check("# HELP agui_x An example.\n# TYPE agui_x gauge\nagui_x 1\n");
}

/// `deploy/grafana-dashboard.json` reads only metrics the daemon serves, and every query is
/// valid PromQL (promtool checks them as recording rules, Grafana's variables filled in).
#[tokio::test]
#[ignore = "needs promtool (Debian: prometheus): scripts/test.sh runs it"]
async fn the_dashboard_queries_what_the_daemon_serves() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/grafana-dashboard.json"
        ))
        .expect("deploy/grafana-dashboard.json"),
    )
    .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().expect("targets").iter())
        .map(|target| target["expr"].as_str().expect("expr").to_owned())
        .collect();
    assert!(exprs.len() >= 9, "{exprs:?}");

    let server = TestServer::start().await;
    let frames = SseReader::new(post_run(&server, "demo", &run_body("t", "r", "hi")).await)
        .collect()
        .await;
    assert_valid_segment(&frames);
    let scrape = scrape(&server).await;
    server.stop().await;

    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("agui_") {
                assert!(
                    scrape.text.lines().any(|l| l
                        .strip_prefix(word)
                        .is_some_and(|rest| { rest.starts_with('{') || rest.starts_with(' ') })),
                    "the dashboard reads {word}, which /metrics does not serve"
                );
            }
        }
        let promql = expr.replace("$__rate_interval", "5m").replace("$job", ".+");
        rules.push_str(&format!(
            "      - record: dashboard:panel_{i}\n        expr: {}\n",
            serde_json::to_string(&promql).expect("quoted")
        ));
    }
    let dir = temp_dir("dashboard");
    let path = dir.join("rules.yml");
    std::fs::write(&path, rules).expect("write rules");
    let output = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool (Debian package prometheus) is needed for this test");
    assert!(
        output.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
