//! The memory budget: finished runs' frames and idle threads leave memory when the count is
//! over the budget (oldest first), and what was let go of is still served, by a resync from
//! the store.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agui_serve::agent::Agent;
use agui_serve::agent::demo::DemoAgent;
use agui_serve::runtime::{Attachment, Resume, Runtime, RuntimeOptions};
use agui_serve::store::Store;
use bytes::Bytes;
use support::run_input;

fn runtime(budget: usize, grace: Duration) -> Runtime {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let mut options = RuntimeOptions::new(4);
    options.memory_budget = budget;
    options.disconnect_grace = grace;
    let store = Store::open(&support::temp_dir("mem")).expect("store");
    Runtime::new(agents, options, store)
}

/// Every event frame of an attachment (keep-alives skipped).
async fn drain(mut attachment: Attachment) -> Vec<Bytes> {
    let mut frames = Vec::new();
    while let Some(bytes) = attachment.next().await {
        if !bytes.starts_with(b":") {
            frames.push(bytes);
        }
    }
    frames
}

/// Waits until the thread has no live run (its pump has finished, not only its stream).
async fn wait_idle(runtime: &Runtime, thread: &str) {
    for _ in 0..10_000 {
        if runtime
            .live_status(&support::operator_key(thread))
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("run never ended");
}

fn id_of(frame: &Bytes) -> String {
    let text = std::str::from_utf8(frame).expect("utf8");
    text.lines()
        .find_map(|l| l.strip_prefix("id: "))
        .expect("id")
        .to_owned()
}

fn words(n: usize) -> String {
    vec!["word"; n].join(" ")
}

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_runs_beyond_the_budget_leave_memory_oldest_first() {
    // A long grace: without the budget every finished run's frames would stay for it.
    let runtime = runtime(MIB, Duration::from_secs(3600));
    let text = words(2_000);
    let mut logs = Vec::new();
    for i in 0..20 {
        let thread = format!("t{i}");
        let attachment = runtime
            .start_run("demo", run_input(&thread, &format!("r{i}"), &text))
            .await
            .expect("start");
        logs.push(drain(attachment).await);
        // The budget is enforced as the run's pump finishes, just after its stream ends.
        support::eventually(&format!("run {i} within the budget"), || {
            runtime.memory_in_use() <= MIB
        })
        .await;
    }
    // Each run's frames alone are a good part of the budget: the oldest went.
    let one_run: usize = logs[0].iter().map(Bytes::len).sum();
    assert!(one_run * 20 > 2 * MIB, "the runs outgrow the budget");

    // The newest run is still replayed exactly from any point.
    let newest = logs.last().expect("runs");
    let cut = newest.len() / 2;
    let again = runtime
        .reattach("t19", Some(&id_of(&newest[cut])))
        .await
        .expect("reattach");
    assert_eq!(again.resume(), Resume::Exact);
    assert_eq!(drain(again).await, newest[cut + 1..]);

    // The oldest is served by a resync: its transcript from the store, nothing lost.
    let again = runtime
        .reattach("t0", Some(&id_of(&logs[0][cut])))
        .await
        .expect("reattach");
    assert_eq!(again.resume(), Resume::Resync);
    let frames = drain(again).await;
    let text = String::from_utf8_lossy(&frames.concat()).into_owned();
    assert!(text.contains("MESSAGES_SNAPSHOT"), "{}", &text[..300]);
    assert!(
        text.contains("You said: word word"),
        "the reply is in the snapshot"
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_idle_thread_leaves_memory_after_the_grace_and_comes_back_from_the_store() {
    let runtime = runtime(MIB, Duration::from_secs(30));
    // What an idle runtime counts: the fleet document, unwatched and so not rebuilt.
    let idle = runtime.memory_in_use();
    assert!(idle < 1024, "{idle}");
    // About 2 x 40 kB of transcript: more than a sixteenth of the budget.
    let attachment = runtime
        .start_run("demo", run_input("big", "r1", &words(8_000)))
        .await
        .expect("start");
    let frames = drain(attachment).await;
    assert!(!frames.is_empty());
    wait_idle(&runtime, "big").await;
    support::eventually("the thread counted", || runtime.memory_in_use() > MIB / 16).await;
    assert!(runtime.memory_in_use() <= MIB);

    tokio::time::sleep(Duration::from_secs(31)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        runtime.memory_in_use(),
        idle,
        "frames released, thread evicted"
    );

    // The next turn finds the conversation in the store.
    let mut input = run_input("big", "r2", "again");
    let mut history = run_input("big", "r1", &words(8_000)).messages;
    history.append(&mut input.messages);
    input.messages = history;
    let frames = drain(runtime.start_run("demo", input).await.expect("start")).await;
    let text = String::from_utf8_lossy(&frames.concat()).into_owned();
    assert!(text.contains(r#""delta":"again""#), "the reply streams");
    assert!(
        text.contains("MESSAGES_SNAPSHOT") && text.contains("You said: word word"),
        "the history, reloaded from the store, comes first"
    );
}
