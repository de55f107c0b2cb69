//! The fleet history's tests.
use super::*;
use crate::access::Caps;
use std::sync::Arc;

fn doc(runs: Value) -> Value {
    let runs = runs.as_object().cloned().unwrap_or_default();
    json!({"runs": runs, "agents": {"demo": {"state": "ready"}}, "totals": totals(&runs)})
}

fn run(owner: &str, phase: &str) -> Value {
    json!({"threadId": "t", "owner": owner, "agent": "demo", "runId": "r", "phase": phase})
}

fn fleet(epoch: u64, max_deltas: usize, initial: Value, now_ms: u64) -> Arc<Fleet> {
    let limits = FleetLimits::default();
    Arc::new(Fleet::new(
        epoch,
        max_deltas,
        initial,
        now_ms,
        limits,
        Arc::default(),
    ))
}

fn subscribe(fleet: &Arc<Fleet>, principal: &Principal, from: FleetFrom) -> FleetStream {
    let second = Duration::from_secs(1);
    fleet
        .subscribe(principal, from, second, CancellationToken::new())
        .expect("under the caps")
}

/// An SSE frame's id and its event's JSON.
fn parse(frame: &[u8]) -> (String, Value) {
    let text = std::str::from_utf8(frame).expect("utf8");
    let (id, data) = text
        .strip_prefix("id: ")
        .and_then(|t| t.split_once("\ndata: "))
        .expect("a frame");
    let data = serde_json::from_str(data.trim_end()).expect("json");
    (id.to_owned(), data)
}

async fn drain(stream: &mut FleetStream) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while !stream.queue.is_empty() {
        match stream.next().await {
            Some(FleetItem::Frame(frame)) => out.push(parse(&frame)),
            _ => break,
        }
    }
    out
}

fn apply(events: &[(String, Value)], mut state: Value) -> Value {
    for (_, event) in events {
        match event["type"].as_str() {
            Some("STATE_SNAPSHOT") => state = event["snapshot"].clone(),
            Some("STATE_DELTA") => {
                let patch: Patch = serde_json::from_value(event["delta"].clone()).expect("patch");
                json_patch::patch(&mut state, &patch).expect("applies");
            }
            other => unreachable!("{other:?}"),
        }
    }
    state
}

#[tokio::test]
async fn replay_then_snapshot_and_views_see_their_own() {
    let fleet = fleet(7, 100, doc(json!({})), 1_000);
    assert!(fleet.update(doc(json!({"a": run("alice", "running")})), 2_000));
    assert!(!fleet.update(doc(json!({"a": run("alice", "running")})), 2_500));
    assert!(fleet.update(
        doc(json!({"a": run("alice", "suspended"), "b": run("bob", "running")})),
        3_000
    ));
    assert!(fleet.update(doc(json!({"b": run("bob", "running")})), 4_000));
    let everyone = Principal::operator();

    // After event 1: patches 2 and 3, then the snapshot.
    let mut s = subscribe(&fleet, &everyone, FleetFrom::After("7-1".into()));
    assert!(s.is_exact());
    let events = drain(&mut s).await;
    let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["7-2", "7-3", "7-3"]);
    assert_eq!(events[2].1["type"], "STATE_SNAPSHOT");
    let at_1 = doc(json!({"a": run("alice", "running")}));
    assert_eq!(apply(&events[..2], at_1), fleet.document());

    // By time: after 2.5 s, the same.
    let mut s = subscribe(&fleet, &everyone, FleetFrom::Since(2_500));
    assert_eq!(drain(&mut s).await.len(), 3);
    // Another boot's id, or one not kept: just the snapshot, as a resync.
    let mut s = subscribe(&fleet, &everyone, FleetFrom::After("8-1".into()));
    assert!(!s.is_exact());
    assert_eq!(drain(&mut s).await.len(), 1);

    // Alice's view: her run's changes only, with her totals.
    let alice = Principal::scoped("alice", None, Caps::ALL);
    let mut s = subscribe(&fleet, &alice, FleetFrom::After("7-0".into()));
    let events = drain(&mut s).await;
    let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["7-1", "7-2", "7-3", "7-3"]);
    let start = View::of(&alice).apply(&doc(json!({})));
    let end = apply(&events[..3], start);
    assert_eq!(end["totals"]["live"], 0);
    assert_eq!(end, View::of(&alice).apply(&fleet.document()));
    let text =
        serde_json::to_string(&events.iter().map(|(_, e)| e).collect::<Vec<_>>()).expect("json");
    assert!(!text.contains("bob"), "{text}");

    // Live: a new change reaches a subscriber waiting for it, and alice's view sees
    // only hers.
    let mut live = subscribe(&fleet, &everyone, FleetFrom::Now);
    drain(&mut live).await;
    assert!(fleet.update(doc(json!({})), 5_000));
    match live.next().await {
        Some(FleetItem::Frame(frame)) => {
            let (id, event) = parse(&frame);
            assert_eq!(
                (id.as_str(), &event["type"]),
                ("7-4", &json!("STATE_DELTA"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(fleet.update(doc(json!({"c": run("alice", "running")})), 6_000));
    match s.next().await {
        Some(FleetItem::Frame(frame)) => {
            let (id, event) = parse(&frame);
            assert_eq!(id, "7-5", "bob's end (7-4) was not alice's to see");
            let state = apply(&[(id, event)], end);
            assert_eq!(state, View::of(&alice).apply(&fleet.document()));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_subscriber_behind_the_kept_history_is_ended() {
    let fleet = fleet(1, 2, doc(json!({})), 0);
    let mut s = subscribe(&fleet, &Principal::operator(), FleetFrom::Now);
    drain(&mut s).await;
    for i in 0..5 {
        fleet.update(doc(json!({format!("r{i}"): run("", "running")})), i);
    }
    assert!(s.next().await.is_none());
}

/// Subscribers of one view share its frames (the same bytes, not copies), hold no
/// document of their own, and are counted on the meter once; the caps refuse beyond.
#[tokio::test]
async fn subscribers_share_their_views_frames_within_the_caps() {
    let meter = Arc::new(Meter::default());
    let limits = FleetLimits {
        total: 5,
        per_principal: 3,
    };
    let fleet = Arc::new(Fleet::new(1, 100, doc(json!({})), 0, limits, meter.clone()));
    let alone = meter.get();
    let alice = Principal::scoped("alice", None, Caps::ALL);
    let stop = CancellationToken::new();
    let second = Duration::from_secs(1);
    let mut streams: Vec<FleetStream> = (0..3)
        .map(|_| fleet.subscribe(&alice, FleetFrom::Now, second, stop.clone()))
        .collect::<Result<_, _>>()
        .expect("under the caps");
    assert_eq!(
        fleet
            .subscribe(&alice, FleetFrom::Now, second, stop.clone())
            .err(),
        Some(FleetFull::Principal(3))
    );
    let bob = Principal::scoped("bob", None, Caps::ALL);
    let _bob = (0..2)
        .map(|_| fleet.subscribe(&bob, FleetFrom::Now, second, stop.clone()))
        .collect::<Result<Vec<_>, _>>()
        .expect("under the caps");
    assert_eq!(
        fleet
            .subscribe(&Principal::operator(), FleetFrom::Now, second, stop.clone())
            .err(),
        Some(FleetFull::Total(5))
    );
    let mut snapshots = Vec::new();
    for s in &mut streams {
        match s.next().await {
            Some(FleetItem::Frame(frame)) => snapshots.push(frame),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        snapshots
            .iter()
            .all(|f| f.as_ptr() == snapshots[0].as_ptr())
    );
    let big = "x".repeat(10_000);
    let runs =
        json!({"a": {"threadId": big, "owner": "alice", "agent": "demo", "phase": "running"}});
    assert!(fleet.update(doc(runs), 1));
    let mut frames = Vec::new();
    for s in &mut streams {
        match s.next().await {
            Some(FleetItem::Frame(frame)) => frames.push(frame),
            other => panic!("{other:?}"),
        }
    }
    assert!(frames.iter().all(|f| f.as_ptr() == frames[0].as_ptr()));
    // The document, its patch and alice's view with its frame: a few copies of the
    // big run, whatever the number of subscribers.
    let counted = meter.get() - alone;
    assert!((30_000..80_000).contains(&counted), "{counted}");
    drop(streams);
    drop(_bob);
    assert!(meter.get() < alone + 40_000, "the views left the meter");
    // Room again.
    assert!(
        fleet
            .subscribe(&alice, FleetFrom::Now, second, stop)
            .is_ok()
    );
}
