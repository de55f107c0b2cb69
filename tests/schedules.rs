//! Schedules: created, listed and deleted through the API, scoped like threads (another
//! principal's schedule is 404; creating and deleting need `run`), validated (a bad cron
//! expression or time zone is a 400 naming its field); firing on time as background runs
//! on a new thread or on a given one (seen on `?follow=all`), a busy thread's firing
//! skipped with its reason; on a paused clock, each occurrence once, and occurrences
//! missed while no daemon ran reported and not run; on a two-node cluster sharing
//! PostgreSQL (ignored unless `AGUI_TEST_PG_URL` is set, as `scripts/cluster.sh` does),
//! each occurrence fired by exactly one node, and a firing on a thread one node owns left
//! to that node.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agui_serve::access::{Caps, Principal};
use agui_serve::agent::Agent;
use agui_serve::agent::demo::DemoAgent;
use agui_serve::config::AgentConfig;
use agui_serve::runtime::{NewSchedule, Runtime, RuntimeOptions, ScheduleClock};
use agui_serve::store::{ListScope, ScheduleRow, Store};
use serde_json::{Value, json};
use support::*;

/// Mints a scoped token through `POST {path}/tokens` with the master token.
async fn mint(server: &TestServer, body: Value) -> String {
    let response = server.post("/tokens").json(&body).sent().await;
    let status = response.status();
    let answer: Value = response.json().await.expect("json");
    assert_eq!(status, 200, "{answer}");
    answer["token"].as_str().expect("token").to_owned()
}

/// A request to `server` with `token`.
fn with(
    server: &TestServer,
    token: &str,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    client()
        .request(method, server.url(path))
        .bearer_auth(token)
}

/// Status and JSON body (`null` when there is none).
async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.sent().await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn schedule_body(cron: &str, text: &str) -> Value {
    json!({"agent": "demo", "cron": cron, "messages": [{"role": "user", "content": text}]})
}

/// The ids of the schedules `token` lists.
async fn listed(server: &TestServer, token: &str) -> Vec<String> {
    let (status, body) = answer(with(server, token, reqwest::Method::GET, "/schedules")).await;
    assert_eq!(status, 200, "{body}");
    body["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Polls `check` every 50 ms until it gives a value (bounded: 15 s).
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    for _ in 0..300 {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Schedule `id` as the operator lists it, once `ready` holds for it.
async fn schedule_when(
    server: &TestServer,
    id: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    until(what, || async {
        let (_, body) = get_json(server, "/schedules").await;
        body["schedules"]
            .as_array()?
            .iter()
            .find(|s| s["id"] == id)
            .filter(|s| ready(s))
            .cloned()
    })
    .await
}

#[tokio::test]
async fn schedules_are_created_listed_deleted_and_scoped_like_threads() {
    let server = TestServer::with(|c| {
        c.agents = vec![
            AgentConfig::demo(),
            AgentConfig {
                name: "other".to_owned(),
                ..AgentConfig::demo()
            },
        ];
    })
    .await;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let delete = reqwest::Method::DELETE;

    let mut body = schedule_body("0 9 * * 1-5", "the morning report");
    body["name"] = json!("morning");
    body["timezone"] = json!("Europe/Paris");
    let (status, created) = answer(server.post("/schedules").json(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    assert_eq!(created["agent"], "demo");
    assert_eq!(created["cron"], "0 9 * * 1-5");
    assert_eq!(created["timezone"], "Europe/Paris");
    assert_eq!(created["name"], "morning");
    assert_eq!(created["threadId"], Value::Null);
    assert_eq!(created["lastRunId"], Value::Null);
    assert_eq!(created["missed"]["count"], 0);
    assert_eq!(created["messages"][0]["content"], "the morning report");
    // Nine in Paris is seven or eight in UTC, on a weekday.
    let next = created["nextRunAt"].as_str().expect("nextRunAt");
    assert!(
        next.contains("T07:00:00.000Z") || next.contains("T08:00:00.000Z"),
        "{next}"
    );
    let (status, one) = get_json(&server, &format!("/schedules/{id}")).await;
    assert_eq!((status, &one), (200, &created));

    // Another principal sees none of it, and cannot touch it.
    let alice = mint(&server, json!({"sub": "alice"})).await;
    assert!(listed(&server, &alice).await.is_empty());
    let path = format!("/schedules/{id}");
    assert_eq!(
        answer(with(&server, &alice, get.clone(), &path)).await.0,
        404
    );
    assert_eq!(
        answer(with(&server, &alice, delete.clone(), &path)).await.0,
        404
    );

    // Her own, on her own thread; not on the operator's thread of the same id.
    let response = client()
        .post(server.url("/demo"))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .json(&run_body("t1", "r-op", "the operator's"))
        .sent()
        .await;
    SseReader::new(response).collect().await;
    let mut on_thread = schedule_body("*/10 * * * *", "check in");
    on_thread["threadId"] = json!("t1");
    let (status, error) =
        answer(with(&server, &alice, post.clone(), "/schedules").json(&on_thread)).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{error}"
    );
    let response = client()
        .post(server.url("/demo"))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .json(&run_body("t1", "r-alice", "hers"))
        .sent()
        .await;
    SseReader::new(response).collect().await;
    let (status, hers) =
        answer(with(&server, &alice, post.clone(), "/schedules").json(&on_thread)).await;
    assert_eq!(status, 201, "{hers}");
    assert_eq!(hers["threadId"], "t1");
    let hers = hers["id"].as_str().expect("id").to_owned();
    assert_eq!(listed(&server, &alice).await, [hers.as_str()]);
    // The operator lists everyone's, with their owner.
    let (_, all) = get_json(&server, "/schedules").await;
    let owners: Vec<(&str, &str)> = all["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().expect("id"),
                s["owner"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(owners, [(id.as_str(), ""), (hers.as_str(), "alice")]);

    // A token that may only read lists, and may neither create nor delete.
    let reader = mint(&server, json!({"sub": "alice", "capabilities": ["read"]})).await;
    assert_eq!(listed(&server, &reader).await, [hers.as_str()]);
    let (status, error) =
        answer(with(&server, &reader, post.clone(), "/schedules").json(&body)).await;
    assert_eq!(status, 403, "{error}");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("`run`")
    );
    let path = format!("/schedules/{hers}");
    assert_eq!(
        answer(with(&server, &reader, delete.clone(), &path))
            .await
            .0,
        403
    );
    // A token for another agent sees neither the agent nor its schedules.
    let other = mint(&server, json!({"sub": "alice", "agents": ["other"]})).await;
    assert!(listed(&server, &other).await.is_empty());
    let (status, error) =
        answer(with(&server, &other, post.clone(), "/schedules").json(&body)).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("UNKNOWN_AGENT")),
        "{error}"
    );

    // A thread of another agent.
    let response = client()
        .post(server.url("/other"))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .json(&run_body("t-other", "r-other", "elsewhere"))
        .sent()
        .await;
    SseReader::new(response).collect().await;

    // Bad input: a 400 naming the field.
    let bad = |change: &dyn Fn(&mut Value)| {
        let mut body = schedule_body("* * * * *", "hi");
        change(&mut body);
        body
    };
    for (body, field) in [
        (bad(&|b| b["cron"] = json!("every morning")), "cron"),
        (bad(&|b| b["cron"] = json!("61 * * * *")), "cron"),
        (bad(&|b| b["cron"] = json!("0 0 30 2 *")), "cron"),
        (bad(&|b| b["cron"] = json!(5)), "cron"),
        (
            bad(&|b| {
                b.as_object_mut().expect("object").remove("cron");
            }),
            "cron",
        ),
        (bad(&|b| b["timezone"] = json!("Mars/Olympus")), "timezone"),
        (
            bad(&|b| {
                b.as_object_mut().expect("object").remove("messages");
            }),
            "messages",
        ),
        (bad(&|b| b["messages"] = json!([])), "messages"),
        (
            bad(&|b| b["messages"] = json!([{"role": "user", "content": 5}])),
            "messages[0].content",
        ),
        (
            bad(&|b| b["messages"] = json!([{"role": "assistant", "content": "hi"}])),
            "messages[0].role",
        ),
        (bad(&|b| b["threadId"] = json!("a\u{7}b")), "threadId"),
        (bad(&|b| b["everySecond"] = json!(true)), "everySecond"),
        (
            bad(&|b| b["cron"] = json!(format!("0 {}", "1,".repeat(200)))),
            "cron",
        ),
        (
            bad(&|b| b["messages"][0]["content"] = json!("x".repeat(300 * 1024))),
            "messages",
        ),
        (bad(&|b| b["threadId"] = json!("t-other")), "threadId"),
    ] {
        let (status, error) = answer(server.post("/schedules").json(&body)).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["code"], "INVALID_INPUT", "{error}");
        assert_eq!(error["field"], field, "{body}: {error}");
    }
    let (status, error) = answer(
        server
            .post("/schedules")
            .json(&bad(&|b| b["agent"] = json!("nope"))),
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("UNKNOWN_AGENT"))
    );
    let (status, _) = answer(
        server
            .post("/schedules")
            .json(&bad(&|b| b["threadId"] = json!("none-such"))),
    )
    .await;
    assert_eq!(status, 404);

    // Deleted by its owner (or the operator), then gone.
    let path = format!("/schedules/{hers}");
    assert_eq!(
        answer(with(&server, &alice, delete.clone(), &path)).await.0,
        204
    );
    assert_eq!(
        answer(with(&server, &alice, delete.clone(), &path)).await.0,
        404
    );
    assert!(listed(&server, &alice).await.is_empty());
    assert_eq!(
        answer(server.delete(&format!("/schedules/{id}"))).await.0,
        204
    );
    assert!(listed(&server, TOKEN).await.is_empty());
    assert_eq!(answer(server.get(&format!("/schedules/{id}"))).await.0, 404);
}

#[tokio::test]
async fn a_schedule_fires_on_time_as_a_run_on_a_new_thread() {
    let server = TestServer::start().await;
    let (status, created) = answer(
        server
            .post("/schedules")
            .json(&schedule_body("* * * * * *", "good morning")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let fired = schedule_when(&server, &id, "a firing", |s| s["lastStatus"] == "started").await;
    assert_eq!(
        answer(server.delete(&format!("/schedules/{id}"))).await.0,
        204
    );
    let thread = fired["lastThreadId"].as_str().expect("thread").to_owned();
    let run = fired["lastRunId"].as_str().expect("run").to_owned();
    // On time: claimed within the second of its occurrence (every second is one).
    let at = fired["lastRunAt"].as_str().expect("lastRunAt");
    assert!(at.ends_with('Z') && at.len() == 24, "{at}");
    assert_eq!(fired["lastError"], Value::Null);

    // The run is the thread's, finished, its transcript holding the scheduled message and
    // the demo agent's answer.
    let detail = until("the run's end", || async {
        let (status, detail) = get_json(&server, &format!("/threads/{thread}")).await;
        (status == 200 && detail["lastRun"]["outcome"] == "finished").then_some(detail)
    })
    .await;
    assert_eq!(detail["lastRun"]["runId"], run.as_str());
    assert_eq!(detail["agent"], "demo");
    let (_, messages) = get_json(&server, &format!("/threads/{thread}/messages")).await;
    let texts: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(texts, ["good morning", "You said: good morning"]);
}

#[tokio::test]
async fn a_schedule_spends_the_budget_of_the_token_that_made_it() {
    let server = TestServer::start().await;
    let erin = mint(&server, json!({"sub": "erin", "budget": {"tokens": 12}})).await;
    let (status, created) = answer(
        with(&server, &erin, reqwest::Method::POST, "/schedules")
            .json(&schedule_body("* * * * * *", "/slow 10 20")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    // The first firing spends the day (ten chunks, about 30 tokens against 12), so the
    // next ones are refused by the token's claim, which the schedule kept.
    let refused = schedule_when(&server, &id, "a refused firing", |s| {
        s["lastStatus"] == "failed"
    })
    .await;
    let why = refused["lastError"].as_str().expect("lastError");
    assert!(why.contains("daily budget"), "{refused}");
    assert_eq!(
        answer(with(
            &server,
            &erin,
            reqwest::Method::DELETE,
            &format!("/schedules/{id}")
        ))
        .await
        .0,
        204
    );
    // Direct runs are refused as well: the schedule's spending was the token's day.
    let direct = client()
        .post(server.url("/demo"))
        .bearer_auth(&erin)
        .json(&run_body("e-direct", "r1", "hello"))
        .send()
        .await
        .expect("run");
    assert_eq!(direct.status(), 429);
}

#[tokio::test]
async fn a_schedule_on_a_thread_runs_there_and_a_follow_all_stream_sees_it() {
    let server = TestServer::start().await;
    SseReader::new(post_run(&server, "demo", &run_body("ft", "r1", "hello")).await)
        .collect()
        .await;
    let response = server
        .get("/threads/ft/stream?follow=all")
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let mut reader = SseReader::new(response);
    // The hydration run first.
    while let Some(frame) = reader.next().await {
        if frame.kind() == "RUN_FINISHED" {
            break;
        }
    }

    let mut body = schedule_body("* * * * * *", "tick");
    body["threadId"] = json!("ft");
    let (status, created) = answer(server.post("/schedules").json(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let mut run = Vec::new();
    loop {
        let frame = reader.next().await.expect("the stream goes on");
        let end = matches!(frame.kind(), "RUN_FINISHED" | "RUN_ERROR");
        run.push(frame);
        if end {
            break;
        }
    }
    assert_eq!(
        answer(server.delete(&format!("/schedules/{id}"))).await.0,
        204
    );
    assert_valid_segment(&run);
    assert_eq!(run.last().expect("end").kind(), "RUN_FINISHED");
    assert_eq!(text_of(&run), "You said: tick");
    let (_, listed) = get_json(&server, "/schedules").await;
    assert!(
        listed["schedules"]
            .as_array()
            .expect("schedules")
            .is_empty()
    );
    let (_, detail) = get_json(&server, "/threads/ft").await;
    let (_, messages) = get_json(&server, "/threads/ft/messages").await;
    let texts: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        &texts[..4],
        ["hello", "You said: hello", "tick", "You said: tick"]
    );
    // Later firings (before the delete) ran there too, each as its own run.
    assert!(
        texts.len().is_multiple_of(2)
            && texts[4..]
                .chunks(2)
                .all(|p| p == ["tick", "You said: tick"]),
        "{texts:?}"
    );
    assert_eq!(detail["lastRun"]["outcome"], "finished", "{detail}");
}

#[tokio::test]
async fn a_firing_on_a_busy_thread_is_skipped_with_its_reason() {
    let server = TestServer::start().await;
    let response = server
        .post("/threads/busy/runs")
        .json(&json!({"agent": "demo", "runId": "long", "messages": [
            {"id": "m1", "role": "user", "content": "/slow 100 100"}]}))
        .sent()
        .await;
    assert_eq!(response.status(), 202);
    let mut body = schedule_body("* * * * * *", "are you done?");
    body["threadId"] = json!("busy");
    let (status, created) = answer(server.post("/schedules").json(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let skipped = schedule_when(&server, &id, "a skipped firing", |s| {
        s["lastStatus"] == "skipped"
    })
    .await;
    assert_eq!(
        answer(server.delete(&format!("/schedules/{id}"))).await.0,
        204
    );
    let reason = skipped["lastError"].as_str().expect("reason");
    assert!(reason.contains("run long was live"), "{reason}");
    assert_eq!(skipped["lastThreadId"], "busy");
    // The live run went on, untouched.
    let (_, detail) = get_json(&server, "/threads/busy").await;
    assert_eq!(detail["lastRun"]["runId"], "long");
    assert_eq!(detail["status"], "running");
    assert_eq!(server.post("/runs/long/cancel").sent().await.status(), 202);
}

/// 2026-01-01T00:00:00Z.
const NEW_YEAR: i64 = 1_767_225_600_000;
const MINUTE: i64 = 60_000;

/// A runtime on `dir`'s store whose schedules read a clock that moves with paused tokio
/// time from `clock`, its scheduler started.
fn paused_runtime(dir: &std::path::Path, clock: &ScheduleClock) -> Runtime {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let mut options = RuntimeOptions::new(4);
    options.schedule_clock = clock.clone();
    let runtime = Runtime::new(agents, options, Store::open(dir).expect("store"));
    runtime.spawn_scheduler();
    runtime
}

async fn create(runtime: &Runtime, cron: &str, thread: Option<&str>) -> ScheduleRow {
    runtime
        .create_schedule_as(
            &Principal::operator(),
            NewSchedule {
                agent: "demo".into(),
                cron: cron.into(),
                timezone: None,
                name: None,
                thread_id: thread.map(str::to_owned),
                messages: serde_json::from_value(
                    json!([{"id": "m", "role": "user", "content": "tick"}]),
                )
                .expect("messages"),
            },
        )
        .await
        .expect("create")
}

async fn schedule_row(runtime: &Runtime, id: &str) -> ScheduleRow {
    runtime
        .schedules_as(&Principal::operator())
        .await
        .expect("list")
        .into_iter()
        .find(|row| row.id == id)
        .expect("the schedule")
}

/// The threads in the store, with each one's runs' outcomes.
async fn threads(runtime: &Runtime) -> Vec<(String, Option<String>)> {
    runtime.store().flush().await.expect("flush");
    let page = runtime
        .store()
        .list_threads(1_000, None, None, ListScope::default())
        .await
        .expect("list");
    page.threads
        .into_iter()
        .map(|t| (t.id, t.last_run.and_then(|r| r.outcome)))
        .collect()
}

/// Lets paused time run until `at` on `clock` (the scheduler and the runs go on meanwhile).
async fn run_until(clock: &ScheduleClock, at: i64) {
    let left = at - clock.now_ms();
    assert!(left >= 0, "already past");
    tokio::time::sleep(Duration::from_millis(left as u64)).await;
}

/// Stops `runtime` as a shutdown does: the drain stops its scheduler, its runs end.
async fn stop(runtime: Runtime) {
    runtime.drain();
    let ended = runtime
        .wait_runs((tokio::time::Instant::now() + Duration::from_secs(30)).into_std())
        .await;
    assert!(ended, "runs and scheduler ended");
    runtime.flush_store().await;
}

#[tokio::test(start_paused = true)]
async fn each_occurrence_fires_once_on_time_on_a_paused_clock() {
    let dir = temp_dir("sched");
    let clock = ScheduleClock::following_tokio(NEW_YEAR + 10_000);
    let runtime = paused_runtime(&dir, &clock);
    let schedule = create(&runtime, "0 */5 * * * *", None).await;
    assert_eq!(schedule.next_fire, NEW_YEAR + 5 * MINUTE);

    run_until(&clock, NEW_YEAR + 5 * MINUTE - 1).await;
    assert!(
        threads(&runtime).await.is_empty(),
        "nothing before its time"
    );
    run_until(&clock, NEW_YEAR + 5 * MINUTE + 500).await;
    let row = schedule_row(&runtime, &schedule.id).await;
    let last = row.last.expect("fired");
    assert_eq!(last.at, NEW_YEAR + 5 * MINUTE, "fired at its occurrence");
    assert_eq!(row.next_fire, NEW_YEAR + 10 * MINUTE);
    assert_eq!(threads(&runtime).await.len(), 1);

    run_until(&clock, NEW_YEAR + 21 * MINUTE).await;
    let done = threads(&runtime).await;
    assert_eq!(done.len(), 4, "{done:?}");
    assert!(
        done.iter()
            .all(|(_, outcome)| outcome.as_deref() == Some("finished")),
        "{done:?}"
    );
    let row = schedule_row(&runtime, &schedule.id).await;
    assert_eq!(row.last.expect("fired").at, NEW_YEAR + 20 * MINUTE);
    assert_eq!(row.missed.count, 0);
    let last_thread = &done[0].0;
    let stored = runtime
        .store()
        .load_thread(last_thread)
        .await
        .expect("read")
        .expect("thread");
    assert_eq!(stored.transcript.len(), 2);
    assert_eq!(stored.transcript[0].role(), "user");

    // Deleted: no more firings.
    assert!(
        runtime
            .delete_schedule_as(&Principal::operator(), &schedule.id)
            .await
            .expect("delete")
    );
    run_until(&clock, NEW_YEAR + 41 * MINUTE).await;
    assert_eq!(threads(&runtime).await.len(), 4);
    stop(runtime).await;
}

#[tokio::test(start_paused = true)]
async fn occurrences_missed_while_no_daemon_ran_are_reported_and_not_run() {
    let dir = temp_dir("sched-missed");
    let clock = ScheduleClock::following_tokio(NEW_YEAR + 10_000);
    let runtime = paused_runtime(&dir, &clock);
    let schedule = create(&runtime, "0 */5 * * * *", None).await;
    stop(runtime).await;

    // An hour with no daemon: the occurrences of 00:05 to 01:00 pass unseen.
    tokio::time::advance(Duration::from_secs(3_600)).await;
    let runtime = paused_runtime(&dir, &clock);
    let row = until("the missed occurrences", || async {
        let row = schedule_row(&runtime, &schedule.id).await;
        (row.missed.count > 0).then_some(row)
    })
    .await;
    assert_eq!(row.missed.count, 12);
    assert_eq!(row.missed.first, Some(NEW_YEAR + 5 * MINUTE));
    assert_eq!(row.missed.last, Some(NEW_YEAR + 60 * MINUTE));
    assert_eq!(row.last, None, "none of them ran");
    assert_eq!(row.next_fire, NEW_YEAR + 65 * MINUTE);
    assert!(threads(&runtime).await.is_empty());

    // Going on from there: the next occurrence runs, once.
    run_until(&clock, NEW_YEAR + 66 * MINUTE).await;
    let row = schedule_row(&runtime, &schedule.id).await;
    assert_eq!(row.last.expect("fired").at, NEW_YEAR + 65 * MINUTE);
    assert_eq!(row.missed.count, 12);
    assert_eq!(threads(&runtime).await.len(), 1);
    stop(runtime).await;

    // A restart shorter than the tolerance: the occurrence it straddled runs once, late.
    let at_stop = clock.now_ms();
    assert!(at_stop < NEW_YEAR + 70 * MINUTE);
    tokio::time::advance(Duration::from_millis(
        (NEW_YEAR + 70 * MINUTE + 10_000 - at_stop) as u64,
    ))
    .await;
    let runtime = paused_runtime(&dir, &clock);
    let row = until("the late firing", || async {
        let row = schedule_row(&runtime, &schedule.id).await;
        (row.next_fire > NEW_YEAR + 70 * MINUTE).then_some(row)
    })
    .await;
    let last = row.last.expect("fired");
    assert_eq!(last.at, NEW_YEAR + 70 * MINUTE + 10_000);
    assert_eq!(
        row.missed.count, 12,
        "not missed: run late, within the tolerance"
    );
    assert_eq!(threads(&runtime).await.len(), 2);
    stop(runtime).await;
}

#[tokio::test(start_paused = true)]
async fn a_scoped_principals_schedule_runs_in_its_namespace() {
    let dir = temp_dir("sched-scoped");
    let clock = ScheduleClock::following_tokio(NEW_YEAR + 10_000);
    let runtime = paused_runtime(&dir, &clock);
    let alice = Principal::scoped("alice", None, Caps::ALL);
    let schedule = runtime
        .create_schedule_as(
            &alice,
            NewSchedule {
                agent: "demo".into(),
                cron: "0 * * * * *".into(),
                timezone: None,
                name: Some("hers".into()),
                thread_id: None,
                messages: serde_json::from_value(
                    json!([{"id": "m", "role": "user", "content": "hi"}]),
                )
                .expect("messages"),
            },
        )
        .await
        .expect("create");
    assert_eq!(schedule.owner, "alice");
    run_until(&clock, NEW_YEAR + MINUTE + 500).await;
    let row = schedule_row(&runtime, &schedule.id).await;
    let thread = row.last.expect("fired").thread_id;
    runtime.store().flush().await.expect("flush");
    // Her thread, in her namespace: she reads it; the operator's namespace has no such id.
    let hers = runtime.visible_thread(&alice, &thread).await.expect("read");
    assert_eq!(hers.expect("hers").owner, "alice");
    assert!(
        runtime
            .visible_thread(&Principal::operator_as(""), &thread)
            .await
            .expect("read")
            .is_none()
    );
    assert!(
        runtime
            .schedules_as(&Principal::scoped("bob", None, Caps::ALL))
            .await
            .expect("list")
            .is_empty()
    );
    assert!(
        !runtime
            .delete_schedule_as(&Principal::scoped("bob", None, Caps::ALL), &schedule.id)
            .await
            .expect("delete")
    );
    stop(runtime).await;
}

/// A fresh PostgreSQL database for one test (`AGUI_TEST_PG_URL` names the server; its user
/// may create databases), dropped at the end.
struct PgDb {
    name: String,
    url: String,
}

impl PgDb {
    fn base() -> String {
        std::env::var("AGUI_TEST_PG_URL").expect("AGUI_TEST_PG_URL is not set")
    }

    async fn client(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to AGUI_TEST_PG_URL");
        tokio::spawn(connection);
        client
    }

    async fn new() -> PgDb {
        let name = format!("agui_test_{}", uuid::Uuid::new_v4().simple());
        PgDb::client(&PgDb::base())
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        PgDb {
            url: format!("{} dbname={name}", PgDb::base()),
            name,
        }
    }

    async fn drop(self) {
        let _ = PgDb::client(&PgDb::base())
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await;
    }
}

/// A node of a cluster on `db`, named `name`.
async fn node(db: &PgDb, name: &str) -> TestServer {
    let url = db.url.clone();
    let name = name.to_owned();
    TestServer::with(move |c| {
        c.cluster = Some(agui_serve::cluster::ClusterConfig {
            url,
            advertise: format!("http://{name}.invalid:1"),
            node_name: name,
            lease_ttl: Duration::from_secs(3),
            cert: None,
        });
    })
    .await
}

/// Every run in the database: its thread, when it started, and which node holds the
/// thread's lease.
async fn runs_by_node(db: &tokio_postgres::Client) -> Vec<(String, i64, Option<String>)> {
    db.query(
        "SELECT r.thread_id, r.started_at, l.node FROM runs r
         LEFT JOIN leases l ON l.thread_key = r.thread_id ORDER BY r.started_at",
        &[],
    )
    .await
    .expect("runs")
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

/// The node's count of schedule occurrences that ended as `outcome` (its metrics).
async fn occurrences(server: &TestServer, outcome: &str) -> u64 {
    let text = server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("metrics");
    let line = format!("agui_schedule_occurrences_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line} in:\n{text}"))
}

/// Checks that no occurrence of an every-2-seconds schedule ran twice (no two runs in the
/// same two seconds); the occurrences' slots.
fn assert_once_each(runs: &[(String, i64, Option<String>)]) -> Vec<i64> {
    let mut slots: Vec<i64> = runs.iter().map(|(_, at, _)| at / 2_000).collect();
    slots.dedup();
    assert_eq!(slots.len(), runs.len(), "an occurrence ran twice: {runs:?}");
    slots
}

/// Two nodes share one schedule (every 2 s, a new thread each firing): each occurrence
/// runs once, on one node or the other; with one node stopped the other goes on alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn on_a_two_node_cluster_each_occurrence_fires_once() {
    let db = PgDb::new().await;
    let admin = PgDb::client(&db.url).await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    let (status, created) = answer(
        a.post("/schedules")
            .json(&schedule_body("*/2 * * * * *", "tick")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    // One store: the other node lists it too.
    assert_eq!(listed(&b, TOKEN).await, [id.as_str()]);

    let runs_at_least = |n: usize| {
        let admin = &admin;
        async move {
            until(&format!("{n} runs"), || async {
                let runs = runs_by_node(admin).await;
                (runs.len() >= n).then_some(runs)
            })
            .await
        }
    };
    let both = runs_at_least(4).await;
    // Just after a firing (the next is two seconds away): each node's count of what it
    // did with the occurrences adds up to the runs stored, and the node that did not
    // start one found it claimed: both tried.
    let counts = until("the counts to match the runs", || async {
        let a_counts = (
            occurrences(&a, "started").await,
            occurrences(&a, "lost").await,
        );
        let b_counts = (
            occurrences(&b, "started").await,
            occurrences(&b, "lost").await,
        );
        let stored = runs_by_node(&admin).await.len() as u64;
        (a_counts.0 + b_counts.0 == stored).then_some((a_counts, b_counts, stored))
    })
    .await;
    let ((a_started, a_lost), (b_started, b_lost), stored) = counts;
    assert_once_each(&runs_by_node(&admin).await);
    eprintln!(
        "a started {a_started} lost {a_lost}; b started {b_started} lost {b_lost}; {stored} runs"
    );
    assert!(
        a_lost + b_lost >= 1,
        "no claim ever lost: only one node tried"
    );
    assert!(a_lost + b_lost <= stored);
    // Node a goes away: b fires the rest alone.
    a.stop().await;
    let before = runs_by_node(&admin).await.len();
    let runs = runs_at_least(before + 3).await;
    let (status, schedule) = get_json(&b, &format!("/schedules/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(answer(b.delete(&format!("/schedules/{id}"))).await.0, 204);

    let slots = assert_once_each(&runs);
    // Every occurrence from the first to the last ran, or is counted missed.
    let span = slots.last().expect("runs") - slots[0] + 1;
    let missed = schedule["missed"]["count"].as_i64().expect("missed");
    assert!(
        runs.len() as i64 + missed >= span,
        "{runs:?} missed {missed}"
    );
    // After a stopped, only b started runs.
    let after: Vec<_> = runs[before..]
        .iter()
        .map(|(_, _, node)| node.clone())
        .collect();
    assert!(
        after
            .iter()
            .all(|node| node.as_deref().is_some_and(|n| n.starts_with('b'))),
        "{after:?}"
    );
    eprintln!(
        "{} runs, {missed} missed; while both ran: {} on a, {} on b",
        runs.len(),
        both.iter()
            .filter(|(_, _, n)| n.as_deref().is_some_and(|n| n.starts_with('a')))
            .count(),
        both.iter()
            .filter(|(_, _, n)| n.as_deref().is_some_and(|n| n.starts_with('b')))
            .count(),
    );
    b.stop().await;
    drop(admin);
    db.drop().await;
}

#[tokio::test]
async fn parallel_creates_do_not_pass_the_cap() {
    let server = TestServer::start().await;
    let dave = mint(&server, json!({"sub": "dave"})).await;
    let body = schedule_body("0 0 1 1 *", "happy new year");
    let creates = (0..140).map(|_| {
        let request = with(&server, &dave, reqwest::Method::POST, "/schedules").json(&body);
        async move { answer(request).await.0 }
    });
    let statuses = futures_util::future::join_all(creates).await;
    let created = statuses.iter().filter(|s| **s == 201).count();
    let refused = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((created, refused), (100, 40), "{statuses:?}");
    assert_eq!(listed(&server, &dave).await.len(), 100);
}

#[tokio::test]
async fn a_principal_holds_at_most_its_schedules() {
    let server = TestServer::start().await;
    let carol = mint(&server, json!({"sub": "carol"})).await;
    let body = schedule_body("0 0 1 1 *", "happy new year");
    for _ in 0..agui_serve::runtime::MAX_SCHEDULES_PER_OWNER {
        let (status, created) =
            answer(with(&server, &carol, reqwest::Method::POST, "/schedules").json(&body)).await;
        assert_eq!(status, 201, "{created}");
    }
    let (status, error) =
        answer(with(&server, &carol, reqwest::Method::POST, "/schedules").json(&body)).await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["code"], "TOO_MANY_SCHEDULES");
    // Another principal's count is its own.
    let (status, _) = answer(server.post("/schedules").json(&body)).await;
    assert_eq!(status, 201);
    // One deleted, one more fits.
    let first = listed(&server, &carol).await.remove(0);
    let path = format!("/schedules/{first}");
    assert_eq!(
        answer(with(&server, &carol, reqwest::Method::DELETE, &path))
            .await
            .0,
        204
    );
    let (status, _) =
        answer(with(&server, &carol, reqwest::Method::POST, "/schedules").json(&body)).await;
    assert_eq!(status, 201);
}

/// A schedule on a thread one node owns: the other node leaves each firing to it, so the
/// runs all start on the owner (no request between nodes is needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn on_a_cluster_a_firing_on_a_thread_is_left_to_the_node_that_owns_it() {
    let db = PgDb::new().await;
    let admin = PgDb::client(&db.url).await;
    let a = node(&db, "a").await;
    let b = node(&db, "b").await;
    // b runs thread ct, and so holds its lease.
    SseReader::new(post_run(&b, "demo", &run_body("ct", "r1", "hello")).await)
        .collect()
        .await;
    let mut body = schedule_body("*/2 * * * * *", "tick");
    body["threadId"] = json!("ct");
    let (status, created) = answer(a.post("/schedules").json(&body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    until("three firings", || async {
        let rows = admin
            .query("SELECT id FROM runs WHERE thread_id = 'ct'", &[])
            .await
            .expect("runs");
        (rows.len() >= 4).then_some(())
    })
    .await;
    let (_, schedule) = get_json(&b, &format!("/schedules/{id}")).await;
    assert_eq!(answer(a.delete(&format!("/schedules/{id}"))).await.0, 204);
    let (a_started, b_started) = (
        occurrences(&a, "started").await,
        occurrences(&b, "started").await,
    );
    assert_eq!(a_started, 0, "a fired on b's thread");
    assert_eq!(
        occurrences(&a, "failed").await,
        0,
        "a claimed a firing on b's thread"
    );
    assert!(b_started >= 3, "{b_started}");
    assert_eq!(schedule["lastThreadId"], "ct");
    assert!(
        matches!(
            schedule["lastStatus"].as_str(),
            Some("started" | "starting")
        ),
        "{schedule}"
    );
    let owner: String = admin
        .query_one("SELECT node FROM leases WHERE thread_key = 'ct'", &[])
        .await
        .expect("lease")
        .get(0);
    assert!(owner.starts_with('b'), "{owner}");
    a.stop().await;
    b.stop().await;
    drop(admin);
    db.drop().await;
}
