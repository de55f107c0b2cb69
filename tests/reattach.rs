//! The journal and reattach, at the runtime API: readers that disconnect and reattach at
//! random ids see exactly what a reader that never left saw; ids that cannot be honoured
//! always resynchronise, never a silent gap.

mod support;
use support::{SNAPSHOT_RUN, run_input};

use std::collections::BTreeMap;
use std::sync::Arc;

use agui_serve::agent::demo::DemoAgent;
use agui_serve::agent::{Agent, AgentError, BoxFuture, ClientToolCall, EventSink, Turn, TurnEnd};
use agui_serve::config::Hitl;
use agui_serve::runtime::{
    Attachment, EventId, JournalLimits, Resume, Runtime, RuntimeOptions, StartError,
};
use agui_serve::store::Store;
use bytes::Bytes;
use proptest::prelude::*;

fn runtime(limits: JournalLimits) -> Runtime {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let mut options = RuntimeOptions::new(16);
    options.journal = limits;
    let store = Store::open(&support::temp_dir("rt")).expect("store");
    Runtime::new(agents, options, store)
}

/// The next event frame (keep-alives skipped), or `None` at the end.
async fn next_frame(a: &mut Attachment) -> Option<Bytes> {
    loop {
        let bytes = a.next().await?;
        if !bytes.starts_with(b":") {
            return Some(bytes);
        }
    }
}

fn id_of(frame: &Bytes) -> String {
    let text = std::str::from_utf8(frame).expect("utf8");
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("id: "))
        .expect("id line")
        .to_owned()
}

fn type_of(frame: &Bytes) -> String {
    let text = std::str::from_utf8(frame).expect("utf8");
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("data line");
    let v: serde_json::Value = serde_json::from_str(data).expect("json");
    v["type"].as_str().expect("type").to_owned()
}

async fn drain(mut a: Attachment) -> Vec<Bytes> {
    let mut out = Vec::new();
    while let Some(f) = next_frame(&mut a).await {
        out.push(f);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn reattaching_readers_see_exactly_what_a_steady_reader_sees(
        chunks in 1u64..60,
        interval_ms in 0u64..3,
        cuts in proptest::collection::vec(1usize..12, 0..8),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async move {
            let runtime = runtime(JournalLimits::default());
            let mut steady = runtime
                .start_run("demo", run_input("t", "r", &format!("/slow {chunks} {interval_ms}")))
                .await
                .expect("start");
            let first = next_frame(&mut steady).await.expect("RUN_STARTED");
            // A second reader that keeps leaving and coming back by its last id.
            let mut hopping = runtime
                .reattach("t", Some(&id_of(&first)))
                .await
                .expect("attach");
            prop_assert_eq!(hopping.resume(), Resume::Exact);
            let mut hopper_log = vec![first.clone()];
            for cut in cuts {
                let mut ended = false;
                for _ in 0..cut {
                    match next_frame(&mut hopping).await {
                        Some(frame) => {
                            ended = matches!(type_of(&frame).as_str(), "RUN_FINISHED" | "RUN_ERROR");
                            hopper_log.push(frame);
                        }
                        None => {
                            ended = true;
                            break;
                        }
                    }
                }
                if ended {
                    break;
                }
                drop(hopping);
                let last = id_of(hopper_log.last().expect("frame"));
                hopping = runtime.reattach("t", Some(&last)).await.expect("reattach");
                prop_assert_eq!(hopping.resume(), Resume::Exact);
            }
            hopper_log.extend(drain(hopping).await);
            let mut steady_log = vec![first];
            steady_log.extend(drain(steady).await);
            prop_assert_eq!(type_of(steady_log.last().expect("frames")), "RUN_FINISHED");
            prop_assert_eq!(steady_log, hopper_log);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn reattach_from_the_start_replays_the_whole_segment_exactly() {
    let runtime = runtime(JournalLimits::default());
    let steady = runtime
        .start_run("demo", run_input("t", "r", "/slow 30 2"))
        .await
        .expect("start");
    let steady_log = drain(steady).await;
    for cut in [0usize, 1, 5, steady_log.len() - 2] {
        let id = id_of(&steady_log[cut]);
        let again = runtime.reattach("t", Some(&id)).await.expect("reattach");
        assert_eq!(again.resume(), Resume::Exact, "cut {cut}");
        let replay = drain(again).await;
        assert_eq!(&replay[..], &steady_log[cut + 1..], "cut {cut}");
    }
}

async fn assert_resync(runtime: &Runtime, thread: &str, id: &str, live: bool) {
    let attachment = runtime.reattach(thread, Some(id)).await.expect("attach");
    assert_eq!(
        attachment.resume(),
        Resume::Resync,
        "id {id:?} (live: {live})"
    );
    let frames = drain(attachment).await;
    let kinds: Vec<String> = frames.iter().map(type_of).collect();
    assert_eq!(
        &kinds[..3],
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"],
        "{kinds:?}"
    );
    assert!(
        matches!(
            kinds.last().map(String::as_str),
            Some("RUN_FINISHED" | "RUN_ERROR")
        ),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn unusable_ids_always_resync() {
    let runtime = runtime(JournalLimits {
        max_frames: 8,
        max_bytes: usize::MAX,
    });
    // Another thread, to borrow a valid-looking id from.
    let other = drain(
        runtime
            .start_run("demo", run_input("other", "r0", "hi"))
            .await
            .expect("start"),
    )
    .await;
    let foreign_thread_id = id_of(&other[1]);

    let live = runtime
        .start_run("demo", run_input("t", "r1", "/slow 40 20"))
        .await
        .expect("start");
    let mut live = live;
    let mut early = Vec::new();
    for _ in 0..12 {
        early.push(next_frame(&mut live).await.expect("frame"));
    }
    // The journal keeps 8 frames: the first ids are evicted by now. The POST's reader
    // keeps reading (a registered reader that stops would hold the run back until its
    // stream is cut for stalling).
    let live = tokio::spawn(drain(live));
    let evicted = id_of(&early[0]);
    let parsed = EventId::parse(&evicted).expect("id");
    let foreign_epoch = EventId {
        epoch: parsed.epoch - 1,
        ..parsed
    }
    .to_string();
    for id in [
        evicted.as_str(),
        foreign_epoch.as_str(),
        "not-an-id",
        "",
        foreign_thread_id.as_str(),
    ] {
        assert_resync(&runtime, "t", id, true).await;
    }
    live.await.expect("reader");
    // With no live run as well.
    for id in [
        evicted.as_str(),
        foreign_epoch.as_str(),
        "garbage",
        foreign_thread_id.as_str(),
    ] {
        assert_resync(&runtime, "t", id, false).await;
    }
}

#[tokio::test]
async fn resync_reopens_the_message_in_flight_with_its_text_so_far() {
    let runtime = runtime(JournalLimits::default());
    let mut live = runtime
        .start_run("demo", run_input("t", "r", "/slow 20 30"))
        .await
        .expect("start");
    let mut seen = 0;
    while seen < 4 {
        let f = next_frame(&mut live).await.expect("frame");
        if type_of(&f) == "TEXT_MESSAGE_CONTENT" {
            seen += 1;
        }
    }
    let attachment = runtime.reattach("t", Some("bogus")).await.expect("attach");
    assert_eq!(attachment.resume(), Resume::Resync);
    let frames = drain(attachment).await;
    let kinds: Vec<String> = frames.iter().map(type_of).collect();
    assert_eq!(kinds[3], "TEXT_MESSAGE_START", "{kinds:?}");
    assert_eq!(kinds[4], "TEXT_MESSAGE_CONTENT", "{kinds:?}");
    let data: serde_json::Value = serde_json::from_str(
        std::str::from_utf8(&frames[4])
            .expect("utf8")
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data"),
    )
    .expect("json");
    assert!(
        data["delta"]
            .as_str()
            .expect("delta")
            .starts_with("chunk 1/20\nchunk 2/20\n"),
        "{data}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("RUN_FINISHED"));
    // The whole resynchronised stream is a valid segment: one START per message.
    assert_eq!(
        kinds.iter().filter(|k| *k == "TEXT_MESSAGE_START").count(),
        kinds.iter().filter(|k| *k == "TEXT_MESSAGE_END").count()
    );
    drain(live).await;
}

#[tokio::test]
async fn no_live_run_gives_a_hydration_run_and_unknown_threads_are_refused() {
    let runtime = runtime(JournalLimits::default());
    drain(
        runtime
            .start_run("demo", run_input("t", "r", "hello"))
            .await
            .expect("start"),
    )
    .await;
    let frames = drain(runtime.reattach("t", None).await.expect("attach")).await;
    let kinds: Vec<String> = frames.iter().map(type_of).collect();
    assert_eq!(kinds, SNAPSHOT_RUN);
    let snapshot = std::str::from_utf8(&frames[1]).expect("utf8");
    assert!(snapshot.contains("You said: hello"), "{snapshot}");
    assert!(runtime.reattach("nope", None).await.is_err());
}

/// A runtime that keeps at most `bound` threads in memory, after one finished run on each of
/// threads `t0` .. `t{threads - 1}`, in order; with each run's first event id.
async fn runs_past_a_thread_bound(bound: usize, threads: usize) -> (Runtime, Vec<String>) {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let mut options = RuntimeOptions::new(16);
    options.max_threads_in_memory = bound;
    let store = Store::open(&support::temp_dir("evict")).expect("store");
    let runtime = Runtime::new(agents, options, store);
    let mut first_ids = Vec::new();
    for i in 0..threads {
        let frames = drain(
            runtime
                .start_run("demo", run_input(&format!("t{i}"), "r", &format!("hi {i}")))
                .await
                .expect("start"),
        )
        .await;
        first_ids.push(id_of(&frames[0]));
    }
    (runtime, first_ids)
}

#[tokio::test]
async fn idle_threads_beyond_the_memory_bound_are_evicted_and_reload_from_the_store() {
    let (runtime, first_ids) = runs_past_a_thread_bound(2, 4).await;
    // t0 was evicted: its journal is gone, so its old id resyncs, and its history comes
    // back from the store.
    let attachment = runtime
        .reattach("t0", Some(&first_ids[0]))
        .await
        .expect("attach");
    assert_eq!(attachment.resume(), Resume::Resync);
    let frames = drain(attachment).await;
    let snapshot = std::str::from_utf8(&frames[1]).expect("utf8");
    assert!(snapshot.contains("You said: hi 0"), "{snapshot}");
    // t3 is still in memory: exact.
    let attachment = runtime
        .reattach("t3", Some(&first_ids[3]))
        .await
        .expect("attach");
    assert_eq!(attachment.resume(), Resume::Exact);
}

/// Crossing the bound evicts down to a sixteenth below it, least recently used first, so
/// the scan that picks them is paid once per that many new threads, not once per thread.
#[tokio::test]
async fn crossing_the_thread_bound_evicts_down_to_a_sixteenth_below_it() {
    let (runtime, first_ids) = runs_past_a_thread_bound(32, 33).await;
    // The 33rd thread took the map to 30: the three least recently used left.
    for (i, expected) in [(3, Resume::Exact), (32, Resume::Exact), (2, Resume::Resync)] {
        let attachment = runtime
            .reattach(&format!("t{i}"), Some(&first_ids[i]))
            .await
            .expect("attach");
        assert_eq!(attachment.resume(), expected, "t{i}");
    }
}

/// Regression: a stream waiting for frames when the terminal frame and the stop signal
/// arrived together could pick the stop and end without the terminal event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_streams_never_drops_a_journaled_terminal_frame() {
    for round in 0..100 {
        let runtime = runtime(JournalLimits::default());
        let mut attachment = runtime
            .start_run("demo", run_input("t", "r", "/slow 1000 5"))
            .await
            .expect("start");
        for _ in 0..4 {
            next_frame(&mut attachment).await.expect("frame");
        }
        // The reader waits for frames on another worker while the run ends and the
        // streams are stopped right after, as in a shutdown.
        let reader = tokio::spawn(drain(attachment));
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        runtime.drain();
        runtime.cancel_all(agui_serve::runtime::CancelReason::Shutdown);
        runtime
            .wait_runs(std::time::Instant::now() + std::time::Duration::from_secs(5))
            .await;
        runtime.stop_streams();
        let rest = reader.await.expect("reader");
        let last = rest.last().map(type_of);
        assert_eq!(last.as_deref(), Some("RUN_ERROR"), "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stopped_before_its_run_ends_closes_its_segment_with_a_shutdown_error() {
    let runtime = runtime(JournalLimits::default());
    let mut attachment = runtime
        .start_run("demo", run_input("t", "r", "/slow 1000 20"))
        .await
        .expect("start");
    for _ in 0..4 {
        next_frame(&mut attachment).await.expect("frame");
    }
    // The grace is over and the run has not ended (it was not even cancelled): streams stop.
    runtime.drain();
    runtime.stop_streams();
    let rest = drain(attachment).await;
    let last = rest.last().expect("a frame");
    assert_eq!(type_of(last), "RUN_ERROR");
    assert!(
        std::str::from_utf8(last)
            .expect("utf8")
            .contains(r#""code":"SHUTDOWN""#)
    );
    assert_eq!(rest.iter().filter(|f| type_of(f) == "RUN_ERROR").count(), 1);
}

/// Holds each agent turn until the test lets one through.
#[derive(Clone)]
struct Gate(Arc<tokio::sync::Semaphore>);

impl Gate {
    fn closed() -> Gate {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    /// Lets `turns` more turns through.
    fn open(&self, turns: usize) {
        self.0.add_permits(turns);
    }

    /// Waits until a turn may go on.
    async fn pass(&self) {
        if let Ok(permit) = self.0.acquire().await {
            permit.forget();
        }
    }
}

/// The demo agent behind a gate.
struct Gated(Gate);

impl Agent for Gated {
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        let gate = self.0.clone();
        Box::pin(async move {
            gate.pass().await;
            DemoAgent.run(turn, sink).await
        })
    }
}

/// Holds the database's write lock (as another writer would) until dropped: the daemon's
/// commits wait meanwhile.
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    fn take(dir: &std::path::Path) -> WriteLock {
        let conn = rusqlite::Connection::open(dir.join("agui-serve.db")).expect("db");
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .expect("timeout");
        conn.execute_batch("BEGIN IMMEDIATE").expect("lock");
        WriteLock(conn)
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

/// A suspension whose terminal event waits for the store: the run's first frames, the
/// stream (its terminal frame not out yet), and the lock that holds it back.
struct Parking {
    runtime: Runtime,
    gate: Gate,
    first: Vec<Bytes>,
    stream: Attachment,
    lock: WriteLock,
}

/// [`Parking`] on thread `thread` after `text`, with the agent `agent` makes of a gate.
async fn parking(
    thread: &str,
    text: &str,
    hitl: Hitl,
    agent: impl FnOnce(Gate) -> Arc<dyn Agent>,
) -> Parking {
    let gate = Gate::closed();
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    agents.insert("demo".into(), agent(gate.clone()));
    let mut options = RuntimeOptions::new(4);
    options.hitl.insert("demo".into(), hitl);
    let dir = support::temp_dir("park");
    let runtime = Runtime::new(agents, options, Store::open(&dir).expect("store"));
    let mut stream = runtime
        .start_run("demo", run_input(thread, "r1", text))
        .await
        .expect("start");
    let started = next_frame(&mut stream).await.expect("RUN_STARTED");
    assert_eq!(type_of(&started), "RUN_STARTED");
    // The run's start is committed; the next commit is the one the park waits for.
    let lock = tokio::task::block_in_place(|| WriteLock::take(&dir));
    gate.open(1);
    for _ in 0..500 {
        if runtime.live_status(&support::operator_key(thread)) == Some("suspended") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        runtime.live_status(&support::operator_key(thread)),
        Some("suspended")
    );
    let mut first = vec![started];
    let last_id = id_of(first.last().expect("frame"));
    // Everything journaled before the park: whatever can be read without waiting.
    while let Ok(Some(frame)) = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        next_frame(&mut stream),
    )
    .await
    {
        assert_ne!(
            type_of(&frame),
            "RUN_FINISHED",
            "the park waits for the store"
        );
        first.push(frame);
    }
    assert_ne!(id_of(first.last().expect("frame")), last_id);
    Parking {
        runtime,
        gate,
        first,
        stream,
        lock,
    }
}

fn input(body: serde_json::Value) -> agui_serve::protocol::RunAgentInput {
    agui_serve::protocol::decode_run_input(body.to_string().as_bytes()).expect("valid input")
}

fn user(thread: &str, text: &str) -> serde_json::Value {
    serde_json::json!({"id": format!("{thread}-u"), "role": "user", "content": text})
}

/// `frames` are whole segments: `RUN_STARTED` first, one terminal event last.
fn assert_whole_segments(frames: &[Bytes]) {
    let kinds: Vec<String> = frames.iter().map(type_of).collect();
    let mut open = false;
    for kind in &kinds {
        match kind.as_str() {
            "RUN_STARTED" => {
                assert!(!open, "RUN_STARTED inside a segment: {kinds:?}");
                open = true;
            }
            "RUN_FINISHED" | "RUN_ERROR" => {
                assert!(open, "a terminal event outside a segment: {kinds:?}");
                open = false;
            }
            _ => assert!(open, "{kind} outside a segment: {kinds:?}"),
        }
    }
    assert!(!open, "an unfinished segment: {kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_while_a_suspension_is_being_stored_carries_an_id_at_a_segment_boundary() {
    let p = parking("pr", "/approve ship it", Hitl::Interrupt, |g| {
        Arc::new(Gated(g))
    })
    .await;
    let bad = input(serde_json::json!({
        "threadId": "pr", "runId": "bad", "messages": [user("pr", "/approve ship it")],
        "resume": [{"interruptId": "nope", "status": "resolved", "payload": {"optionId": "allow"}}]
    }));
    let refused = drain(p.runtime.start_run("demo", bad).await.expect("stream")).await;
    let kinds: Vec<String> = refused.iter().map(type_of).collect();
    assert_eq!(kinds, ["RUN_STARTED", "RUN_ERROR"]);
    drop(p.lock);
    let rest = drain(p.stream).await;
    assert_eq!(
        rest.iter().map(type_of).collect::<Vec<_>>(),
        ["RUN_FINISHED"]
    );
    // Reconnecting with the refusal's last id continues with whole segments.
    let last = id_of(refused.last().expect("frame"));
    let again = p
        .runtime
        .reattach("pr", Some(&last))
        .await
        .expect("reattach");
    assert_eq!(again.resume(), Resume::Exact);
    let mut combined = refused.clone();
    combined.extend(drain(again).await);
    assert_whole_segments(&combined);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_while_a_suspension_is_being_stored_streams_the_next_segment() {
    let p = parking("pa", "/approve deploy", Hitl::Tool, |g| Arc::new(Gated(g))).await;
    let calls: Vec<(String, String)> = p
        .first
        .iter()
        .filter(|f| type_of(f) == "TOOL_CALL_START")
        .map(|f| {
            let text = std::str::from_utf8(f).expect("utf8");
            let data = text
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            let v: serde_json::Value = serde_json::from_str(data).expect("json");
            (
                v["toolCallId"].as_str().expect("id").to_owned(),
                v["toolCallName"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    assert_eq!(calls.len(), 2, "the action and the permission request");
    let tool_calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(id, name)| serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}))
        .collect();
    let answer = input(serde_json::json!({
        "threadId": "pa", "runId": "r2", "messages": [
            user("pa", "/approve deploy"),
            {"id": "pa-a", "role": "assistant", "toolCalls": tool_calls},
            {"id": "pa-t", "role": "tool", "toolCallId": calls[1].0, "content": r#"{"optionId":"allow"}"#}
        ]
    }));
    let answered = p.runtime.start_run("demo", answer).await.expect("stream");
    let answered = tokio::spawn(drain(answered));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(p.lock);
    let rest = drain(p.stream).await;
    assert_eq!(
        rest.iter().map(type_of).collect::<Vec<_>>(),
        ["RUN_FINISHED"]
    );
    let second = answered.await.expect("answer stream");
    assert_whole_segments(&second);
    let kinds: Vec<String> = second.iter().map(type_of).collect();
    assert!(
        kinds.contains(&"TEXT_MESSAGE_CONTENT".to_owned()),
        "{kinds:?}"
    );
}

/// Asks the client for two tool calls without waiting for either, then ends its turn (an
/// agent that gives up on its tool calls, or dies).
struct CallsThenGone(Gate);

impl Agent for CallsThenGone {
    fn run(&self, _turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        use futures_util::FutureExt;
        let gate = self.0.clone();
        Box::pin(async move {
            gate.pass().await;
            for id in ["call-x", "call-y"] {
                let call = ClientToolCall {
                    tool_call_id: id.to_owned(),
                    name: "pick".to_owned(),
                    arguments: "{}".to_owned(),
                };
                let _ = sink.call_client_tool(call).now_or_never();
            }
            Ok(TurnEnd::Finished {
                result: None,
                usage: Vec::new(),
            })
        })
    }
}

/// Every frame of `a`, or a failure when it sends nothing for 5 s (a stream that waits for
/// what will never come).
async fn drain_within(mut a: Attachment) -> Vec<Bytes> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(5), next_frame(&mut a)).await {
            Ok(Some(frame)) => out.push(frame),
            Ok(None) => return out,
            Err(_) => panic!(
                "the stream hung after {:?}",
                out.iter().map(type_of).collect::<Vec<_>>()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_racing_the_end_of_a_run_that_parks_again_all_get_ended_streams() {
    // X's park waits for the store while X is answered; meanwhile the agent has ended its
    // turn with Y sent and unanswered.
    let Parking {
        runtime,
        gate,
        first: read,
        stream,
        lock,
    } = parking("g", "hi", Hitl::Tool, |g| Arc::new(CallsThenGone(g))).await;
    let first = tokio::spawn(drain_within(stream));
    let calls = serde_json::json!([
        {"id": "call-x", "type": "function", "function": {"name": "pick", "arguments": "{}"}},
        {"id": "call-y", "type": "function", "function": {"name": "pick", "arguments": "{}"}}
    ]);
    let mut messages = vec![
        serde_json::json!({"id": "g-u", "role": "user", "content": "hi"}),
        serde_json::json!({"id": "g-a", "role": "assistant", "toolCalls": calls}),
        serde_json::json!({"id": "g-x", "role": "tool", "toolCallId": "call-x", "content": "x"}),
    ];
    let answer_x = input(serde_json::json!({"threadId": "g", "runId": "r2", "messages": messages}));
    let answered_x = runtime.start_run("demo", answer_x).await.expect("answer x");
    let answered_x = tokio::spawn(drain_within(answered_x));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(lock);
    let mut rest = read;
    rest.extend(first.await.expect("first"));
    assert_whole_segments(&rest);
    let x = answered_x.await.expect("answer x stream");
    assert_whole_segments(&x);
    // Y is answered as soon as the client is asked for it, while the run ends (a later turn
    // of the agent is let through at once).
    gate.open(100);
    messages.push(
        serde_json::json!({"id": "g-y", "role": "tool", "toolCallId": "call-y", "content": "y"}),
    );
    let answer_y = input(serde_json::json!({"threadId": "g", "runId": "r3", "messages": messages}));
    // Either a stream that ends, or (the run still ending) a refusal: never a stream that
    // waits on a pump that is gone.
    match runtime.start_run("demo", answer_y).await {
        Ok(answered_y) => assert_whole_segments(&drain_within(answered_y).await),
        Err(error) => assert!(matches!(error, StartError::RunInProgress(_)), "{error:?}"),
    }
    for _ in 0..500 {
        if runtime.live_status(&support::operator_key("g")).is_none() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the run never ended");
}
