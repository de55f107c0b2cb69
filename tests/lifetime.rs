//! Run lifetime with paused time: a disconnect never cancels; nobody attached for the grace
//! does; the slot is released exactly once.

mod support;
use support::run_input;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agui_serve::agent::demo::DemoAgent;
use agui_serve::agent::{
    Agent, AgentError, BoxFuture, EventSink, PermissionOption, PermissionRequest, Turn, TurnEnd,
};
use agui_serve::runtime::{Runtime, RuntimeOptions};
use agui_serve::store::Store;
use tokio::time::Instant;

fn runtime(grace: Duration) -> Runtime {
    runtime_of("demo", Arc::new(DemoAgent), grace)
}

/// A runtime serving `agent` as `name`, with a disconnect grace of `grace`.
fn runtime_of(name: &str, agent: Arc<dyn Agent>, grace: Duration) -> Runtime {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert(name.into(), agent);
    let mut options = RuntimeOptions::new(2);
    options.disconnect_grace = grace;
    let store = Store::open(&support::temp_dir(name)).expect("store");
    Runtime::new(agents, options, store)
}

async fn wait_idle(runtime: &Runtime, thread: &str) {
    for _ in 0..10_000 {
        if runtime
            .live_status(&support::operator_key(thread))
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run never ended");
}

/// Waits for thread `t`'s run to end, then checks it ended `after` `since` (within the
/// clock's 2 s of slack) and was recorded as cancelled.
async fn assert_cancelled_after(runtime: &Runtime, since: Instant, after: Duration) {
    wait_idle(runtime, "t").await;
    let lived = since.elapsed();
    assert!(
        lived >= after && lived < after + Duration::from_secs(2),
        "{lived:?}"
    );
    assert_eq!(last_outcome(runtime).await.as_deref(), Some("cancelled"));
}

/// The outcome of thread `t`'s last run, as stored.
async fn last_outcome(runtime: &Runtime) -> Option<String> {
    runtime.store().flush().await.expect("flush");
    let row = runtime
        .store()
        .thread("t")
        .await
        .expect("read")
        .expect("row");
    row.last_run.expect("run").outcome
}

#[tokio::test(start_paused = true)]
async fn a_disconnected_run_finishes_and_its_transcript_is_stored() {
    let runtime = runtime(Duration::from_secs(30));
    let attachment = runtime
        .start_run("demo", run_input("t", "r", "/slow 5 1000"))
        .await
        .expect("start");
    drop(attachment); // the client went away at once
    let started = Instant::now();
    wait_idle(&runtime, "t").await;
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "ran to the end"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(last_outcome(&runtime).await.as_deref(), Some("finished"));
    let (messages, _) = runtime
        .store()
        .messages("t", 10)
        .await
        .expect("read")
        .expect("thread");
    assert_eq!(messages.len(), 2);
    assert_eq!(
        messages[1]["content"],
        "chunk 1/5\nchunk 2/5\nchunk 3/5\nchunk 4/5\nchunk 5/5\n"
    );
    assert_eq!(runtime.gauge().active, 0, "slot released");
}

#[tokio::test(start_paused = true)]
async fn a_run_with_nobody_attached_for_the_grace_is_cancelled() {
    let runtime = runtime(Duration::from_secs(30));
    let attachment = runtime
        .start_run("demo", run_input("t", "r", "/slow 1000 1000"))
        .await
        .expect("start");
    let started = Instant::now();
    drop(attachment);
    assert_cancelled_after(&runtime, started, Duration::from_secs(30)).await;
    assert_eq!(runtime.gauge().active, 0, "slot released");
}

#[tokio::test(start_paused = true)]
async fn the_grace_counts_from_the_last_stream_to_detach() {
    let runtime = runtime(Duration::from_secs(30));
    let attachment = runtime
        .start_run("demo", run_input("t", "r", "/slow 1000 1000"))
        .await
        .expect("start");
    drop(attachment);
    tokio::time::sleep(Duration::from_secs(20)).await;
    // Back briefly, then gone again: the first detach's grace no longer applies.
    let again = runtime.reattach("t", None).await.expect("reattach");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second = runtime.reattach("t", None).await.expect("reattach");
    drop(again);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = Instant::now();
    drop(second);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("running"),
        "30 s after the first detach"
    );
    assert_cancelled_after(&runtime, left, Duration::from_secs(30)).await;
}

#[tokio::test(start_paused = true)]
async fn reattaching_within_the_grace_keeps_the_run_alive() {
    let runtime = runtime(Duration::from_secs(30));
    let attachment = runtime
        .start_run("demo", run_input("t", "r", "/slow 90 1000"))
        .await
        .expect("start");
    let started = Instant::now();
    drop(attachment);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("running")
    );
    let mut again = runtime.reattach("t", None).await.expect("reattach");
    // Attached past the first grace: still alive at 45 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("running")
    );
    // Read it to the end: it finishes on its own.
    let mut last = Vec::new();
    while let Some(frame) = again.next().await {
        last = frame.to_vec();
    }
    assert!(String::from_utf8_lossy(&last).contains("RUN_FINISHED"));
    assert!(started.elapsed() >= Duration::from_secs(89));
    assert!(!String::from_utf8_lossy(&last).contains("cancelled"));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_approval_times_out_as_a_denial() {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let mut options = RuntimeOptions::new(2);
    options.suspend_timeout = Duration::from_secs(15 * 60);
    let store = Store::open(&support::temp_dir("timeout")).expect("store");
    let runtime = Runtime::new(agents, options, store);
    let mut attachment = runtime
        .start_run("demo", run_input("t", "r", "/approve delete everything"))
        .await
        .expect("start");
    let mut last = Vec::new();
    while let Some(frame) = attachment.next().await {
        last = frame.to_vec();
    }
    assert!(String::from_utf8_lossy(&last).contains("pendingToolCallIds"));
    let suspended_at = Instant::now();
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("suspended")
    );
    assert_eq!(runtime.gauge().active, 1, "a suspended run holds its slot");
    tokio::time::sleep(Duration::from_secs(14 * 60)).await;
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("suspended"),
        "still waiting at 14 min"
    );
    wait_idle(&runtime, "t").await;
    let waited = suspended_at.elapsed();
    assert!(
        waited >= Duration::from_secs(15 * 60) && waited < Duration::from_secs(15 * 60 + 5),
        "{waited:?}"
    );
    runtime.store().flush().await.expect("flush");
    let (messages, _) = runtime
        .store()
        .messages("t", 20)
        .await
        .expect("read")
        .expect("thread");
    let last = messages.last().expect("message");
    assert_eq!(last["content"], "Denied: delete everything");
    assert_eq!(runtime.gauge().active, 0, "slot released");
}

#[tokio::test(start_paused = true)]
async fn keep_alives_come_after_each_stretch_of_silence_and_never_between_frames() {
    let runtime = runtime(Duration::from_secs(30));
    let mut attachment = runtime
        .start_run("demo", run_input("ka", "r", "/slow 3 40000"))
        .await
        .expect("start");
    let origin = tokio::time::Instant::now();
    // (seconds since the start, whether it was a keep-alive), up to the first 60 s.
    let mut seen = Vec::new();
    while let Some(bytes) = attachment.next().await {
        let at = origin.elapsed().as_secs();
        if at > 60 {
            break;
        }
        seen.push((at, bytes.starts_with(b":")));
    }
    let keep_alives: Vec<u64> = seen.iter().filter(|(_, k)| *k).map(|(at, _)| *at).collect();
    // Chunks at 0, 40 and 80 s; 15 s of silence after each before a keep-alive.
    assert_eq!(keep_alives, [15, 30, 55], "{seen:?}");
}

/// Asks for permission, then works for a long while whatever the answer.
struct AsksThenWorks;

impl Agent for AsksThenWorks {
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        Box::pin(async move {
            let asked = sink
                .request_permission(PermissionRequest {
                    title: "Go on?".to_owned(),
                    tool_call_id: None,
                    tool_call: None,
                    options: vec![PermissionOption {
                        option_id: "yes".to_owned(),
                        name: "Yes".to_owned(),
                        kind: "allow_once".to_owned(),
                    }],
                })
                .await;
            if asked.is_err() {
                return Ok(TurnEnd::Cancelled);
            }
            tokio::select! {
                () = turn.cancel.cancelled() => Ok(TurnEnd::Cancelled),
                () = tokio::time::sleep(Duration::from_secs(1000)) => Ok(TurnEnd::Finished {
                    result: None,
                    usage: Vec::new(),
                }),
            }
        })
    }
}

/// A suspended run is not cancelled for having nobody attached (its suspension timeout
/// applies); once it wakes with nobody attached, the disconnect grace runs from the wake.
#[tokio::test(start_paused = true)]
async fn a_run_that_wakes_with_nobody_attached_is_cancelled_a_grace_later() {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("asks".into(), Arc::new(AsksThenWorks));
    let mut options = RuntimeOptions::new(2);
    options.disconnect_grace = Duration::from_secs(30);
    options.suspend_timeout = Duration::from_secs(120);
    let store = Store::open(&support::temp_dir("wake")).expect("store");
    let runtime = Runtime::new(agents, options, store);
    let mut attachment = runtime
        .start_run("asks", run_input("t", "r", "go"))
        .await
        .expect("start");
    while attachment.next().await.is_some() {}
    let suspended_at = Instant::now();
    drop(attachment);
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(
        runtime.live_status(&support::operator_key("t")),
        Some("suspended"),
        "not cancelled"
    );
    assert_cancelled_after(&runtime, suspended_at, Duration::from_secs(150)).await;
}

/// An agent that never finishes forgetting a thread.
struct NeverForgets;

impl Agent for NeverForgets {
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        DemoAgent.run(turn, sink)
    }

    fn forget_thread(&self, _thread_id: &str) -> BoxFuture<()> {
        Box::pin(std::future::pending())
    }
}

/// A delete waits in the thread's decide section for the agent to forget the thread, but
/// only so long: an agent that hangs there neither holds the delete nor freezes the thread.
#[tokio::test(start_paused = true)]
async fn an_agent_that_never_forgets_does_not_freeze_a_deleted_thread() {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(NeverForgets));
    let store = Store::open(&support::temp_dir("forget")).expect("store");
    let runtime = Runtime::new(agents, RuntimeOptions::new(2), store);
    let attachment = runtime
        .start_run("demo", run_input("t", "r1", "hello"))
        .await
        .expect("run");
    drop(attachment);
    wait_idle(&runtime, "t").await;

    let since = Instant::now();
    let deleted = tokio::time::timeout(Duration::from_secs(60), runtime.delete_thread("t"))
        .await
        .expect("the delete waited on the agent for a minute")
        .expect("delete");
    assert!(deleted);
    let waited = since.elapsed();
    assert!(
        waited >= agui_serve::runtime::FORGET_BOUND
            && waited < agui_serve::runtime::FORGET_BOUND + Duration::from_secs(1),
        "{waited:?}"
    );
    // The thread is usable again at once: a new run on the same id starts a new thread.
    let again = runtime
        .start_run("demo", run_input("t", "r2", "again"))
        .await;
    assert!(again.is_ok(), "{:?}", again.err());
}

/// An agent that ignores its turn's cancel and never ends.
struct IgnoresCancel;

impl Agent for IgnoresCancel {
    fn run(&self, _turn: Turn, _sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        Box::pin(std::future::pending())
    }
}

/// A cancelled run whose agent does not stop ends without it, the cancel bound (1.5 s)
/// after the cancel, as cancelled.
#[tokio::test(start_paused = true)]
async fn a_cancelled_run_whose_agent_never_stops_ends_a_bound_later() {
    let runtime = runtime_of("stuck", Arc::new(IgnoresCancel), Duration::from_secs(30));
    let attachment = runtime
        .start_run("stuck", run_input("t", "r", "go"))
        .await
        .expect("start");
    let detached_at = Instant::now();
    drop(attachment);
    // The grace cancels the run at 30 s; the agent ignores it; the run ends 1.5 s later.
    assert_cancelled_after(&runtime, detached_at, Duration::from_millis(31_500)).await;
    assert_eq!(runtime.gauge().active, 0, "slot released");
}
