//! The store's contract, one async fn per promise, run against each backend through the
//! public `Store` API: SQLite in `tests/sqlite_store.rs`, PostgreSQL in `tests/pg_store.rs`.
//! Each takes the store and `hold`, which makes a thread writable before its first write:
//! PostgreSQL writes only the threads whose lease this node holds, SQLite writes any.

#![allow(unreachable_pub)]

use std::time::Instant;

use agui_serve::access::scoped_key;
use agui_serve::protocol::Message;
use agui_serve::protocol::input::{Content, TextMessage, UserMessage};
use agui_serve::store::{
    Fired, ListScope, Missed, Occurrence, QueuedRow, ScheduleRow, Store, decode_cursor,
};

pub fn user(id: &str, text: &str) -> Message {
    Message::User(UserMessage {
        id: id.into(),
        content: Content::Text(text.into()),
        name: None,
    })
}

/// A thread's messages, session, title and runs are read back as written; a read of an
/// unknown thread is `None`; a delete takes the thread with it.
pub async fn threads_messages_and_runs_round_trip(store: &Store, hold: impl AsyncFn(&str)) {
    hold("t1").await;
    store.record_run_start(
        "t1",
        "demo",
        Some("hi".into()),
        "r1",
        vec![user("u1", "hi")],
        10,
    );
    store.record_messages(
        "t1",
        vec![Message::Reasoning(TextMessage {
            id: "x".into(),
            content: "hm".into(),
            name: None,
        })],
        11,
    );
    store.set_session("t1", "s1", "new", 11);
    store.set_title("t1", "a title", 11);
    store.record_run_end("t1", "r1", "finished", "idle", 12);
    let row = store.thread("t1").await.expect("read").expect("exists");
    assert_eq!(row.message_count, 2);
    assert_eq!(row.status, "idle");
    assert_eq!(row.title.as_deref(), Some("a title"));
    assert_eq!(row.session_id.as_deref(), Some("s1"));
    assert_eq!(row.metadata.expect("metadata")["session"]["how"], "new");
    assert_eq!((row.created_at, row.updated_at), (10, 12));
    let run = row.last_run.expect("run");
    assert_eq!(
        (run.id.as_str(), run.outcome.as_deref(), run.ended_at),
        ("r1", Some("finished"), Some(12))
    );
    // A second segment of the same run counts, and the latest run is the last one.
    store.record_run_start("t1", "demo", None, "r1", vec![], 13);
    store.record_run_start("t1", "demo", None, "r2", vec![], 13);
    let row = store.thread("t1").await.expect("read").expect("exists");
    assert_eq!(row.last_run.expect("run").id, "r2");
    let (messages, truncated) = store
        .messages("t1", 1)
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(messages.len(), 1);
    assert!(truncated);
    assert_eq!(messages[0]["role"], "reasoning");
    let loaded = store
        .load_thread("t1")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(loaded.transcript.len(), 2);
    assert_eq!(loaded.transcript[0].id(), "u1");
    assert!(store.messages("nope", 5).await.expect("read").is_none());
    assert!(store.delete_thread("t1").await.expect("delete"));
    assert!(!store.delete_thread("t1").await.expect("delete"));
    assert!(store.thread("t1").await.expect("read").is_none());
}

/// A listing pages newest activity first through its cursors, and filters by agent.
/// A thread's state document is read back with it as last kept; a thread that never kept
/// one has none.
pub async fn a_threads_state_is_kept(store: &Store, hold: impl AsyncFn(&str)) {
    hold("s1").await;
    store.record_run_start("s1", "demo", None, "r1", vec![user("u1", "hi")], 10);
    store.record_run_end("s1", "r1", "finished", "idle", 11);
    let fresh = store
        .load_thread("s1")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(fresh.state, None);
    store.set_state("s1", &serde_json::json!({"agent": "demo", "mode": "plan"}));
    store.set_state(
        "s1",
        &serde_json::json!({"agent": "demo", "mode": "default", "usage": {"total": {"totalTokens": 7}}}),
    );
    store.commit().await.expect("commit");
    let kept = store
        .load_thread("s1")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(kept.state.expect("state")["mode"], "default");
    assert_eq!(kept.transcript.len(), 1);
}

/// Thread `id` as stored once what was written is committed.
async fn committed(id: &str, store: &Store) -> agui_serve::store::StoredThread {
    store.commit().await.expect("commit");
    store.load_thread(id).await.expect("read").expect("exists")
}

/// A rewind cuts the transcript from a message on and lets the session go (the thread
/// says it was rewound until a session is bound again); with no message it cuts nothing.
pub async fn a_rewind_cuts_the_transcript_and_lets_the_session_go(
    store: &Store,
    hold: impl AsyncFn(&str),
) {
    hold("w1").await;
    let messages = vec![
        user("u1", "one"),
        user("u2", "two"),
        user("u3", "three"),
        user("u4", "four"),
    ];
    store.record_run_start("w1", "demo", None, "r1", messages, 10);
    store.record_run_end("w1", "r1", "finished", "idle", 11);
    store.set_session("w1", "sess-1", "new", 12);
    store.rewind("w1", Some("u3"), 13);
    let kept = committed("w1", store).await;
    let ids: Vec<&str> = kept.transcript.iter().map(|m| m.id()).collect();
    assert_eq!(ids, ["u1", "u2"]);
    assert_eq!(kept.row.session_id, None);
    assert!(kept.row.rewound());
    assert_eq!(kept.row.message_count, 2);
    // A message appended after the cut takes the next place.
    store.record_messages("w1", vec![user("u5", "five")], 14);
    store.rewind("w1", None, 15);
    let kept = committed("w1", store).await;
    let ids: Vec<&str> = kept.transcript.iter().map(|m| m.id()).collect();
    assert_eq!(ids, ["u1", "u2", "u5"]);
    store.set_session("w1", "sess-2", "new", 16);
    assert!(!committed("w1", store).await.row.rewound());
}

/// An archived thread leaves the listing unless archived ones are asked for, and comes
/// back when taken out of the archive; its row says which it is.
pub async fn archived_threads_are_listed_only_when_asked(store: &Store, hold: impl AsyncFn(&str)) {
    for (key, now) in [("a1", 10), ("a2", 11)] {
        hold(key).await;
        store.record_run_start(key, "demo", None, "r", vec![], now);
    }
    store.set_archived("a1", true, 12);
    store.commit().await.expect("commit");
    let ids = |archived: bool| {
        let store = store.clone();
        async move {
            let scope = ListScope {
                archived,
                ..ListScope::default()
            };
            let page = store
                .list_threads(10, None, None, scope)
                .await
                .expect("list");
            page.threads
                .iter()
                .map(|t| (t.id.clone(), t.archived))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(false).await, [("a2".to_owned(), false)]);
    assert_eq!(
        ids(true).await,
        [("a1".to_owned(), true), ("a2".to_owned(), false)]
    );
    store.set_archived("a1", false, 13);
    store.commit().await.expect("commit");
    assert_eq!(ids(false).await.len(), 2);
    assert!(
        !store
            .thread("a1")
            .await
            .expect("read")
            .expect("there")
            .archived
    );
}

pub async fn listing_pages_newest_first_with_agent_filter(store: &Store, hold: impl AsyncFn(&str)) {
    for i in 0..5 {
        let key = format!("t{i}");
        hold(&key).await;
        let agent = if i % 2 == 0 { "a" } else { "b" };
        store.record_run_start(&key, agent, None, "r", vec![], 100 + i);
    }
    let page = store
        .list_threads(2, None, None, ListScope::default())
        .await
        .expect("list");
    let ids: Vec<_> = page.threads.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, ["t4", "t3"]);
    let cursor = decode_cursor(page.next_cursor.as_deref().expect("more")).expect("cursor");
    let page = store
        .list_threads(2, Some(cursor), None, ListScope::default())
        .await
        .expect("list");
    let ids: Vec<_> = page.threads.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, ["t2", "t1"]);
    let cursor = decode_cursor(page.next_cursor.as_deref().expect("more")).expect("cursor");
    let page = store
        .list_threads(2, Some(cursor), None, ListScope::default())
        .await
        .expect("list");
    assert_eq!(page.threads.len(), 1);
    assert!(page.next_cursor.is_none());
    let page = store
        .list_threads(10, None, Some("b".into()), ListScope::default())
        .await
        .expect("list");
    assert_eq!(page.threads.len(), 2);
    let only_a = ListScope {
        owner: None,
        agents: Some(vec!["a".into(), "zz".into()]),
        archived: false,
    };
    let page = store
        .list_threads(10, None, None, only_a)
        .await
        .expect("list");
    let ids: Vec<_> = page.threads.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, ["t4", "t2", "t0"]);
}

/// Threads of the same id in different owners' namespaces are apart: listed, read and
/// deleted each in its own.
pub async fn owners_keep_their_own_threads(store: &Store, hold: impl AsyncFn(&str)) {
    for (key, agent, now) in [
        ("t1".to_owned(), "a", 100),
        (scoped_key("alice", "t1"), "a", 101),
        (scoped_key("bob", "t1"), "b", 102),
    ] {
        hold(&key).await;
        store.record_run_start(&key, agent, None, "r", vec![], now);
    }
    let rows = |scope: ListScope| {
        let store = store.clone();
        async move {
            let page = store
                .list_threads(10, None, None, scope)
                .await
                .expect("list");
            page.threads
                .iter()
                .map(|t| (t.owner.clone(), t.id.clone()))
                .collect::<Vec<_>>()
        }
    };
    let pair = |o: &str, i: &str| (o.to_owned(), i.to_owned());
    assert_eq!(
        rows(ListScope::default()).await,
        [pair("bob", "t1"), pair("alice", "t1"), pair("", "t1")]
    );
    let alice = ListScope {
        owner: Some("alice".into()),
        agents: None,
        archived: false,
    };
    assert_eq!(rows(alice).await, [pair("alice", "t1")]);
    let bob_on_a = ListScope {
        owner: Some("bob".into()),
        agents: Some(vec!["a".into()]),
        archived: false,
    };
    assert!(rows(bob_on_a).await.is_empty());
    let row = store
        .thread(&scoped_key("alice", "t1"))
        .await
        .expect("read")
        .expect("there");
    assert_eq!((row.owner.as_str(), row.id.as_str()), ("alice", "t1"));
    assert!(
        store
            .delete_thread(&scoped_key("alice", "t1"))
            .await
            .expect("delete")
    );
    assert!(store.thread("t1").await.expect("read").is_some());
    assert!(
        store
            .thread(&scoped_key("bob", "t1"))
            .await
            .expect("read")
            .is_some()
    );
}

/// Recovering a thread marks its live runs interrupted and the thread idle, once, and
/// leaves every other thread alone.
pub async fn recover_thread_marks_only_that_threads_live_runs(
    store: &Store,
    hold: impl AsyncFn(&str),
) {
    for t in ["t1", "t2"] {
        hold(t).await;
        store.record_run_start(t, "demo", None, "r1", vec![], 1);
        store.record_run_end(t, "r1", "finished", "idle", 2);
        store.record_run_start(t, "demo", None, "r2", vec![], 3);
    }
    assert_eq!(store.recover_thread("t1").await.expect("recover"), 1);
    let row = store.thread("t1").await.expect("read").expect("exists");
    assert_eq!(row.status, "idle");
    let run = row.last_run.expect("run");
    assert_eq!(
        (run.id.as_str(), run.outcome.as_deref()),
        ("r2", Some("interrupted"))
    );
    assert!(run.ended_at.is_some());
    assert_eq!(store.recover_thread("t1").await.expect("recover"), 0);
    let other = store.thread("t2").await.expect("read").expect("exists");
    assert_eq!(other.status, "running");
    assert_eq!(other.last_run.expect("run").outcome, None);
}

/// Writers on many tasks at once, each committing now and then: every thread's transcript
/// holds its messages in the order they were queued. Wants a multi-threaded runtime.
pub async fn group_commit_keeps_order_under_load(store: &Store, hold: impl AsyncFn(&str)) {
    const THREADS: usize = 20;
    const MESSAGES: usize = 250;
    for t in 0..THREADS {
        let key = format!("t{t}");
        hold(&key).await;
        store.record_run_start(&key, "a", None, "r", vec![], 1);
    }
    store.commit().await.expect("commit");
    let began = Instant::now();
    let writers = (0..THREADS).map(|t| {
        let store = store.clone();
        tokio::spawn(async move {
            let key = format!("t{t}");
            for m in 0..MESSAGES {
                store.record_messages(&key, vec![user(&format!("m{m}"), "x")], 2);
                if m % 50 == 49 {
                    store.commit().await.expect("commit");
                }
            }
        })
    });
    for writer in futures_util::future::join_all(writers).await {
        writer.expect("writer");
    }
    store.commit().await.expect("commit");
    let took = began.elapsed();
    eprintln!(
        "{} message writes committed in {took:?} ({:.0}/s)",
        THREADS * MESSAGES,
        (THREADS * MESSAGES) as f64 / took.as_secs_f64()
    );
    for t in 0..THREADS {
        let loaded = store
            .load_thread(&format!("t{t}"))
            .await
            .expect("read")
            .expect("there");
        let ids: Vec<_> = loaded
            .transcript
            .iter()
            .map(|m| m.id().to_owned())
            .collect();
        let expected: Vec<_> = (0..MESSAGES).map(|m| format!("m{m}")).collect();
        assert_eq!(ids, expected);
    }
}

/// A thread's queue is read back with it in order; an item put again keeps its place with
/// the new input; a removed item is gone; the threads with a queue are listed; a deleted
/// thread takes its queue with it.
pub async fn a_threads_queue_is_kept_in_order(store: &Store, hold: impl AsyncFn(&str)) {
    hold("q1").await;
    store.record_run_start("q1", "demo", None, "r0", vec![user("u0", "hi")], 10);
    let item = |id: &str, seq: i64, input: &str| QueuedRow {
        id: id.into(),
        seq,
        capped: seq == 2,
        // A claim is kept with its item.
        budget: (seq == 2).then(|| agui_serve::budget::Limits {
            tokens: Some(20),
            ..Default::default()
        }),
        input: input.into(),
        created_at: 20 + seq,
    };
    store.queue_put("q1", &item("b", 2, "{\"b\":1}"));
    store.queue_put("q1", &item("a", 1, "{\"a\":1}"));
    store.queue_put("q1", &item("c", 3, "{\"c\":1}"));
    store.queue_put("q1", &item("b", 2, "{\"b\":2}"));
    store.queue_remove("q1", "c");
    let loaded = store
        .load_thread("q1")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(
        loaded.queue,
        [item("a", 1, "{\"a\":1}"), item("b", 2, "{\"b\":2}")]
    );
    assert_eq!(store.queued_threads().await.expect("read"), ["q1"]);
    assert!(store.delete_thread("q1").await.expect("delete"));
    assert!(store.queued_threads().await.expect("read").is_empty());
}

/// What a principal spends is added up per day, and each day and principal apart.
pub async fn a_principal_s_spending_is_added_up_per_day(store: &Store) {
    use agui_serve::budget::Spend;
    let spend = |tokens, tool_calls| Spend {
        tokens,
        wall_time_ms: 10,
        tool_calls,
    };
    store.add_spend("alice", 100, &spend(5, 1));
    store.add_spend("alice", 100, &spend(7, 0));
    store.add_spend("alice", 101, &spend(1, 1));
    store.add_spend("bob", 100, &spend(2, 2));
    assert_eq!(
        store.spent_on("alice", 100).await.expect("read"),
        Spend {
            tokens: 12,
            wall_time_ms: 20,
            tool_calls: 1
        }
    );
    assert_eq!(store.spent_on("alice", 101).await.expect("read").tokens, 1);
    assert_eq!(
        store.spent_on("bob", 100).await.expect("read").tool_calls,
        2
    );
    assert_eq!(
        store.spent_on("carol", 100).await.expect("read"),
        Spend::default()
    );
}

/// An event for the outbox contract: to endpoints `a` and `b`.
fn outgoing(id: &str, thread: &str) -> agui_serve::store::Outgoing {
    agui_serve::store::Outgoing {
        id: id.to_owned(),
        thread: thread.to_owned(),
        kind: "run.finished".to_owned(),
        body: format!("{{\"id\":\"{id}\"}}"),
        created_at: 1,
        endpoints: vec!["a".to_owned(), "b".to_owned()],
    }
}

/// The ids of `endpoint`'s due heads, claimed for `node`.
async fn claim(store: &Store, endpoint: &str, node: &str, claim_ms: i64) -> Vec<String> {
    store
        .claim_outgoing(endpoint, node, 10, claim_ms)
        .await
        .expect("claim")
        .rows
        .into_iter()
        .map(|row| row.id)
        .collect()
}

fn attempt(id: &str, failed: Option<(&str, i64)>) -> agui_serve::store::Attempt {
    agui_serve::store::Attempt {
        id: id.to_owned(),
        endpoint: "a".to_owned(),
        failed: failed.map(|(why, ms)| (why.to_owned(), ms)),
    }
}

/// The webhook outbox: events ride with the writes of their facts (a creation only when
/// the write creates the thread, a delete's only when there was a thread); each endpoint
/// gets a thread's events one at a time, in order; a failure holds back its own thread
/// only; a claim holds until it lapses; the rows are summed up, listed and pruned.
pub async fn webhook_outbox_claims_in_order_per_thread(store: &Store, hold: impl AsyncFn(&str)) {
    use agui_serve::store::OutboxStatus;
    hold("w1").await;
    hold("w2").await;
    store.record_run_start_notifying(
        "w1",
        "demo",
        None,
        "r1",
        vec![],
        1,
        Some(outgoing("c1", "w1")),
    );
    store.record_run_start_notifying(
        "w1",
        "demo",
        None,
        "r2",
        vec![],
        2,
        Some(outgoing("c1-again", "w1")),
    );
    store.record_run_end_notifying(
        "w1",
        "r2",
        "finished",
        "idle",
        3,
        Some(outgoing("e1", "w1")),
    );
    store.set_status_notifying("w1", "suspended", 4, Some(outgoing("e2", "w1")));
    store.record_run_start_notifying(
        "w2",
        "demo",
        None,
        "r1",
        vec![],
        1,
        Some(outgoing("c2", "w2")),
    );
    store.add_outgoing(outgoing("e3", "w2"));
    store.commit().await.expect("commit");

    let claims = store
        .claim_outgoing("a", "n1", 10, 60_000)
        .await
        .expect("claim");
    assert_eq!(
        claims.pending, 5,
        "the second start did not create the thread"
    );
    let heads: Vec<&str> = claims.rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(heads, ["c1", "c2"], "each thread's oldest event");
    assert!(
        claims
            .rows
            .iter()
            .all(|r| r.attempts == 0 && r.body.contains(&r.id))
    );
    assert!(
        claim(store, "a", "n2", 60_000).await.is_empty(),
        "claimed, and behind claims"
    );
    assert_eq!(
        claim(store, "b", "n2", 0).await,
        ["c1", "c2"],
        "endpoints are apart"
    );
    // n2's claims lapsed at once: the heads are anyone's again.
    assert_eq!(claim(store, "b", "n3", 60_000).await, ["c1", "c2"]);
    assert!(claim(store, "b", "n2", 60_000).await.is_empty());

    // w1's head fails (due again at once), w2's is delivered: w2 moves on, w1 retries.
    store
        .record_attempts(
            "n1",
            vec![
                attempt("c1", Some(("answered 500", 0))),
                attempt("c2", None),
            ],
        )
        .await
        .expect("record");
    let retried = store
        .claim_outgoing("a", "n1", 10, 60_000)
        .await
        .expect("claim");
    let heads: Vec<(&str, i64)> = retried
        .rows
        .iter()
        .map(|r| (r.id.as_str(), r.attempts))
        .collect();
    assert_eq!(heads, [("c1", 1), ("e3", 0)]);
    // Failing again, not due for a minute: w1 waits, and nothing of it comes out of order.
    store
        .record_attempts(
            "n1",
            vec![
                attempt("c1", Some(("answered 503", 60_000))),
                attempt("e3", None),
            ],
        )
        .await
        .expect("record");
    assert!(claim(store, "a", "n1", 60_000).await.is_empty());
    // Only the claim's holder records a failure: another node's late report is ignored.
    store
        .record_attempts("n9", vec![attempt("c1", Some(("late", 0)))])
        .await
        .expect("record");
    assert!(claim(store, "a", "n1", 60_000).await.is_empty());

    let summary = store.outbox_summary().await.expect("summary");
    let a = summary.iter().find(|s| s.endpoint == "a").expect("a");
    assert_eq!((a.pending, a.failing, a.delivered), (3, 1, 2));
    assert_eq!(
        a.last_error.as_ref().map(|(e, _)| e.as_str()),
        Some("answered 503")
    );
    assert!(a.last_delivered_at.is_some() && a.oldest_pending_at == Some(1));
    let pending: Vec<String> = store
        .outbox_rows(OutboxStatus::Pending, Some("a".to_owned()), 10)
        .await
        .expect("rows")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(pending, ["c1", "e1", "e2"]);
    let delivered: Vec<String> = store
        .outbox_rows(OutboxStatus::Delivered, Some("a".to_owned()), 10)
        .await
        .expect("rows")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(delivered, ["e3", "c2"], "newest first");
    let failing = store
        .outbox_rows(OutboxStatus::Failing, None, 10)
        .await
        .expect("rows");
    assert_eq!(failing.len(), 1);
    assert_eq!((failing[0].id.as_str(), failing[0].attempts), ("c1", 2));

    // A delete's event only when there was a thread to delete.
    assert!(
        store
            .delete_thread_notifying("w2", Some(outgoing("d2", "w2")))
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_thread_notifying("w2", Some(outgoing("d2-again", "w2")))
            .await
            .expect("delete")
    );
    assert_eq!(claim(store, "a", "n1", 60_000).await, ["d2"]);

    assert_eq!(store.prune_outbox(i64::MAX).await.expect("prune"), 2);
    let delivered = store
        .outbox_rows(OutboxStatus::Delivered, None, 10)
        .await
        .expect("rows");
    assert!(delivered.is_empty());
}

/// A schedule as a test stores it: `owner`'s, next due at `next_fire`.
pub fn schedule(id: &str, owner: &str, next_fire: i64) -> ScheduleRow {
    ScheduleRow {
        id: id.into(),
        owner: owner.into(),
        name: Some(format!("{id} by {owner}")),
        agent: "demo".into(),
        cron: "*/5 * * * * *".into(),
        timezone: "UTC".into(),
        thread_id: (owner == "alice").then(|| "t1".to_owned()),
        messages: serde_json::json!([{"id": "m", "role": "user", "content": "hi"}]),
        created_at: 1_000,
        next_fire,
        last: None,
        missed: Missed::default(),
        // A claim is kept with its schedule.
        budget: (owner == "alice").then(|| agui_serve::budget::Limits {
            tokens: Some(20),
            ..Default::default()
        }),
    }
}

/// The claim of `due` that fires run `run` and moves on to `next`.
pub fn firing(due: i64, next: i64, run: &str) -> Occurrence {
    Occurrence {
        due,
        next,
        fired: Some(Fired {
            at: due + 3,
            run_id: run.into(),
            thread_id: format!("thread-of-{run}"),
        }),
        missed: Missed::default(),
    }
}

/// Schedules are read back as stored, each owner's apart, soonest first for a scheduler;
/// an occurrence is claimed once (a claim of a `next_fire` that moved on changes nothing);
/// a firing's result lands on the firing it is about only; missed occurrences add up;
/// a delete is the owner's.
pub async fn schedules_are_kept_per_owner_and_claimed_once(store: &Store) {
    assert!(
        store
            .insert_schedule(schedule("s1", "", 20_000), 100)
            .await
            .expect("insert")
    );
    assert!(
        store
            .insert_schedule(schedule("s2", "alice", 10_000), 100)
            .await
            .expect("insert")
    );
    // At its cap an owner's next schedule is not stored.
    assert!(
        !store
            .insert_schedule(schedule("s3", "alice", 10_000), 1)
            .await
            .expect("insert")
    );
    let ids = |rows: Vec<ScheduleRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(store.schedules(None).await.expect("all")), ["s1", "s2"]);
    let alice = store
        .schedules(Some("alice".into()))
        .await
        .expect("alice's");
    assert_eq!(alice, [schedule("s2", "alice", 10_000)]);
    assert!(
        store
            .schedules(Some("bob".into()))
            .await
            .expect("bob's")
            .is_empty()
    );
    assert_eq!(
        ids(store.soonest_schedules(10).await.expect("soonest")),
        ["s2", "s1"]
    );
    assert_eq!(
        ids(store.soonest_schedules(1).await.expect("soonest")),
        ["s2"]
    );

    // An occurrence that is not the one due changes nothing; the one due is claimed once.
    assert!(
        !store
            .claim_occurrence("s2", firing(9_000, 15_000, "r0"))
            .await
            .expect("claim")
    );
    assert!(
        store
            .claim_occurrence("s2", firing(10_000, 15_000, "r1"))
            .await
            .expect("claim")
    );
    assert!(
        !store
            .claim_occurrence("s2", firing(10_000, 15_000, "r2"))
            .await
            .expect("claim")
    );
    assert!(
        !store
            .claim_occurrence("nope", firing(10_000, 15_000, "r3"))
            .await
            .expect("claim")
    );
    let row = &store.schedules(Some("alice".into())).await.expect("read")[0];
    assert_eq!(row.next_fire, 15_000);
    let last = row.last.clone().expect("fired");
    assert_eq!(
        (
            last.at,
            last.run_id.as_str(),
            last.thread_id.as_str(),
            last.status.as_str()
        ),
        (10_003, "r1", "thread-of-r1", "starting")
    );
    assert_eq!(last.error, None);
    store
        .record_firing("s2", "r1", "skipped", Some("busy".into()))
        .await
        .expect("record");
    // A result about another firing than the last one claimed is dropped.
    store
        .record_firing("s2", "r0", "started", None)
        .await
        .expect("record");
    let last = store.schedules(Some("alice".into())).await.expect("read")[0]
        .last
        .clone()
        .expect("fired");
    assert_eq!(
        (last.status.as_str(), last.error.as_deref()),
        ("skipped", Some("busy"))
    );

    // Missed occurrences: counted, the first one kept, the last one moved on; the last
    // firing stays as it was.
    for (due, next, count, first, latest) in [
        (15_000, 40_000, 5, 15_000, 35_000),
        (40_000, 50_000, 2, 40_000, 45_000),
    ] {
        let claimed = store
            .claim_occurrence(
                "s2",
                Occurrence {
                    due,
                    next,
                    fired: None,
                    missed: Missed {
                        count,
                        first: Some(first),
                        last: Some(latest),
                    },
                },
            )
            .await
            .expect("claim");
        assert!(claimed);
    }
    let row = &store.schedules(Some("alice".into())).await.expect("read")[0];
    assert_eq!(row.next_fire, 50_000);
    assert_eq!(
        row.missed,
        Missed {
            count: 7,
            first: Some(15_000),
            last: Some(45_000)
        }
    );
    assert_eq!(row.last.as_ref().map(|l| l.run_id.as_str()), Some("r1"));
    // A new firing clears the last one's error.
    assert!(
        store
            .claim_occurrence("s2", firing(50_000, 55_000, "r4"))
            .await
            .expect("claim")
    );
    let last = store.schedules(Some("alice".into())).await.expect("read")[0]
        .last
        .clone()
        .expect("fired");
    assert_eq!((last.status.as_str(), last.error), ("starting", None));

    assert!(
        !store
            .delete_schedule("s2", Some("bob".into()))
            .await
            .expect("delete")
    );
    assert!(
        store
            .delete_schedule("s2", Some("alice".into()))
            .await
            .expect("delete")
    );
    assert!(!store.delete_schedule("s2", None).await.expect("delete"));
    assert!(store.delete_schedule("s1", None).await.expect("delete"));
    assert!(store.schedules(None).await.expect("all").is_empty());
}

/// Many claims of one occurrence at once, through each of `stores` (one per node sharing
/// the database, or one): exactly one goes through.
pub async fn concurrent_claims_of_one_occurrence_let_one_through(stores: &[Store]) {
    stores[0]
        .insert_schedule(schedule("s", "", 1_000), 100)
        .await
        .expect("insert");
    for round in 0..5i64 {
        let due = 1_000 + round * 1_000;
        let claims = stores.iter().cycle().take(8).enumerate().map(|(i, store)| {
            let store = store.clone();
            async move {
                store
                    .claim_occurrence("s", firing(due, due + 1_000, &format!("r{round}-{i}")))
                    .await
                    .expect("claim")
            }
        });
        let won = futures_util::future::join_all(claims)
            .await
            .into_iter()
            .filter(|won| *won)
            .count();
        assert_eq!(won, 1, "round {round}");
    }
    let row = &stores[0].schedules(None).await.expect("read")[0];
    assert_eq!(row.next_fire, 6_000);
}
