//! The ambient plane: one JSON document describing the fleet (live and suspended runs,
//! agents, totals), and its history as RFC 6902 patches, for `GET {path}/fleet/stream`.
//!
//! The runtime rebuilds the document when something changed (a run started, suspended,
//! resumed or ended; at least once a second for the agents' states) and [`Fleet::update`]
//! keeps the patch from the previous one, numbered. A subscriber gets the patches after its
//! cursor (replay), then the snapshot, then each new patch as it comes. Patches are kept up
//! to a bound. A subscriber more than a quarter of it behind is ended while what it needs is
//! still kept, so it reconnects from its last id and replays exactly; one whose cursor fell
//! out of it altogether gets a fresh snapshot on reconnect. Never a silent gap. The document holds metadata only: ids, names,
//! phases, times; never message text or tool arguments.
//!
//! A principal that does not see everyone gets a view: only its own runs and its agents,
//! with totals of those. Its patches are computed from the views before and after each
//! change, so they carry the same ids as everyone's.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use json_patch::Patch;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::lock;
use crate::access::Principal;
use crate::protocol::Event;

/// Patches kept for replay by default.
pub const DEFAULT_FLEET_HISTORY: usize = 4096;

/// How long the document is kept up to date after the last subscriber left (so that a
/// reconnect replays exactly); after that, until the next subscriber, it is not rebuilt.
pub const WATCHED_FOR: Duration = Duration::from_secs(600);

/// One change of the document.
#[derive(Debug, Clone)]
struct Delta {
    seq: u64,
    at_ms: u64,
    patch: Patch,
}

struct History {
    /// The document as of `base_seq` (before the oldest kept patch), and when that was.
    base: Value,
    base_seq: u64,
    base_at_ms: u64,
    deltas: VecDeque<Delta>,
    /// The document now.
    current: Value,
}

impl History {
    fn last_seq(&self) -> u64 {
        self.deltas.back().map_or(self.base_seq, |d| d.seq)
    }
}

/// The fleet document and its recent history.
pub struct Fleet {
    history: Mutex<History>,
    /// The last sequence number, for subscribers to wait on.
    changed: watch::Sender<u64>,
    epoch: u64,
    max_deltas: usize,
    /// Open subscriptions, and when the last one ended.
    watchers: Mutex<(usize, Option<std::time::Instant>)>,
}

/// Where a subscriber starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetFrom {
    /// Just the snapshot.
    Now,
    /// After this event id (`Last-Event-ID`).
    After(String),
    /// After this time, in milliseconds since the epoch (`?since=`).
    Since(u64),
}

/// What a subscriber sees of the document.
#[derive(Debug, Clone)]
struct View {
    /// Only runs of this owner (`None`: every owner's).
    owner: Option<String>,
    /// Only these agents (`None`: every agent).
    agents: Option<Vec<String>>,
}

impl View {
    fn of(principal: &Principal) -> View {
        View {
            owner: (!principal.sees_everyone()).then(|| principal.owner().to_owned()),
            agents: principal.agents().map(<[String]>::to_vec),
        }
    }

    fn is_everything(&self) -> bool {
        self.owner.is_none() && self.agents.is_none()
    }

    fn allows_agent(&self, name: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|agents| agents.iter().any(|a| a == name))
    }

    /// The part of `doc` this view shows, with its own totals.
    fn apply(&self, doc: &Value) -> Value {
        if self.is_everything() {
            return doc.clone();
        }
        let runs: serde_json::Map<String, Value> = doc["runs"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, run)| {
                let owner = run["owner"].as_str().unwrap_or("");
                self.owner.as_deref().is_none_or(|o| o == owner)
                    && self.allows_agent(run["agent"].as_str().unwrap_or(""))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let agents: serde_json::Map<String, Value> = doc["agents"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(name, _)| self.allows_agent(name))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let totals = totals(&runs);
        json!({"runs": runs, "agents": agents, "totals": totals})
    }
}

/// `{"live","suspended"}` of a document's runs.
pub(super) fn totals(runs: &serde_json::Map<String, Value>) -> Value {
    let suspended = runs
        .values()
        .filter(|run| run["phase"] == "suspended")
        .count();
    json!({"live": runs.len(), "suspended": suspended})
}

impl Fleet {
    pub fn new(epoch: u64, max_deltas: usize, initial: Value, now_ms: u64) -> Fleet {
        Fleet {
            history: Mutex::new(History {
                base: initial.clone(),
                base_seq: 0,
                base_at_ms: now_ms,
                deltas: VecDeque::new(),
                current: initial,
            }),
            changed: watch::Sender::new(0),
            epoch,
            max_deltas: max_deltas.max(1),
            watchers: Mutex::new((0, None)),
        }
    }

    /// Whether anyone watches the document, or did within [`WATCHED_FOR`].
    pub fn is_watched(&self) -> bool {
        let (open, last) = *lock(&self.watchers);
        open > 0 || last.is_some_and(|at| at.elapsed() < WATCHED_FOR)
    }

    /// Makes `doc` the document; `true` when it differed (a new patch was kept).
    pub fn update(&self, doc: Value, now_ms: u64) -> bool {
        let mut history = lock(&self.history);
        let patch = json_patch::diff(&history.current, &doc);
        if patch.0.is_empty() {
            return false;
        }
        let seq = history.last_seq() + 1;
        history.deltas.push_back(Delta {
            seq,
            at_ms: now_ms,
            patch,
        });
        history.current = doc;
        while history.deltas.len() > self.max_deltas {
            if let Some(oldest) = history.deltas.pop_front() {
                // Applying a patch made from this very document cannot fail.
                let _ = json_patch::patch(&mut history.base, &oldest.patch);
                history.base_seq = oldest.seq;
                history.base_at_ms = oldest.at_ms;
            }
        }
        drop(history);
        self.changed.send_replace(seq);
        true
    }

    /// The document now.
    pub fn document(&self) -> Value {
        lock(&self.history).current.clone()
    }

    fn id(&self, seq: u64) -> String {
        format!("{}-{seq}", self.epoch)
    }

    /// The sequence number of an event id of this boot.
    fn parse_id(&self, id: &str) -> Option<u64> {
        let (epoch, seq) = id.trim().split_once('-')?;
        (epoch.parse::<u64>().ok()? == self.epoch)
            .then(|| seq.parse().ok())
            .flatten()
    }

    /// A subscription for `principal` starting at `from`: the replay (when `from` can be
    /// honoured), then the snapshot, then live patches. `exact` says whether the replay
    /// covers everything after `from` (else the snapshot stands in for it).
    pub fn subscribe(
        self: &std::sync::Arc<Fleet>,
        principal: &Principal,
        from: FleetFrom,
        keep_alive: Duration,
        stop: CancellationToken,
    ) -> FleetStream {
        let view = View::of(principal);
        let history = lock(&self.history);
        let last = history.last_seq();
        // The sequence number the replay starts after, when it can be honoured.
        let start = match &from {
            FleetFrom::Now => None,
            FleetFrom::After(id) => self
                .parse_id(id)
                .filter(|seq| (history.base_seq..=last).contains(seq)),
            FleetFrom::Since(ms) if *ms >= history.base_at_ms => Some(
                history
                    .deltas
                    .iter()
                    .take_while(|d| d.at_ms <= *ms)
                    .last()
                    .map_or(history.base_seq, |d| d.seq),
            ),
            FleetFrom::Since(_) => None,
        };
        let exact = start.is_some() || from == FleetFrom::Now;
        let mut doc = history.base.clone();
        let mut queue = VecDeque::new();
        let start_seq = start.unwrap_or(last);
        for delta in history.deltas.iter().filter(|d| d.seq <= start_seq) {
            let _ = json_patch::patch(&mut doc, &delta.patch);
        }
        let mut shown = view.apply(&doc);
        let replay: Vec<Delta> = history
            .deltas
            .iter()
            .filter(|d| d.seq > start_seq)
            .cloned()
            .collect();
        drop(history);
        lock(&self.watchers).0 += 1;
        for delta in replay {
            if let Some(patch) = view_patch(&view, &mut doc, &mut shown, &delta) {
                queue.push_back((delta.seq, delta.at_ms, Event::StateDelta { delta: patch }));
            }
        }
        queue.push_back((
            last,
            super::now_ms(),
            Event::StateSnapshot {
                snapshot: shown.clone(),
            },
        ));
        FleetStream {
            fleet: self.clone(),
            view,
            cursor: last,
            doc,
            shown,
            queue,
            changed: self.changed.subscribe(),
            stop,
            keep_alive,
            exact,
            ended: false,
        }
    }
}

/// The patch `delta` makes to what `view` shows (`None` when it shows no change), with
/// `doc` and `shown` brought forward past it.
fn view_patch(view: &View, doc: &mut Value, shown: &mut Value, delta: &Delta) -> Option<Value> {
    if view.is_everything() {
        let _ = json_patch::patch(doc, &delta.patch);
        *shown = doc.clone();
        return serde_json::to_value(&delta.patch).ok();
    }
    let _ = json_patch::patch(doc, &delta.patch);
    let next = view.apply(doc);
    let patch = json_patch::diff(shown, &next);
    *shown = next;
    if patch.0.is_empty() {
        None
    } else {
        serde_json::to_value(&patch).ok()
    }
}

/// One subscriber's stream of fleet events.
pub struct FleetStream {
    fleet: std::sync::Arc<Fleet>,
    view: View,
    /// The last sequence number this subscriber has been given (or skipped as invisible).
    cursor: u64,
    /// The whole document and this view of it, as of `cursor`.
    doc: Value,
    shown: Value,
    queue: VecDeque<(u64, u64, Event)>,
    changed: watch::Receiver<u64>,
    stop: CancellationToken,
    keep_alive: Duration,
    exact: bool,
    ended: bool,
}

/// What a fleet subscriber gets next.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // One at a time, on the stack of one stream.
pub enum FleetItem {
    /// An event, its id and its timestamp.
    Event {
        id: String,
        at_ms: u64,
        event: Event,
    },
    /// Nothing for a keep-alive period.
    KeepAlive,
}

impl Drop for FleetStream {
    fn drop(&mut self) {
        let mut watchers = lock(&self.fleet.watchers);
        watchers.0 = watchers.0.saturating_sub(1);
        watchers.1 = Some(std::time::Instant::now());
    }
}

impl FleetStream {
    /// Whether the replay honoured the subscriber's cursor (`agui-resume: exact`) or the
    /// snapshot replaces it (`resync`).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The next item; `None` when the stream ends (shutdown, or this subscriber fell so
    /// far behind that the patches it needs are gone: it reconnects and resyncs).
    pub async fn next(&mut self) -> Option<FleetItem> {
        loop {
            if self.ended {
                return None;
            }
            if let Some((seq, at_ms, event)) = self.queue.pop_front() {
                return Some(FleetItem::Event {
                    id: self.fleet.id(seq),
                    at_ms,
                    event,
                });
            }
            if self.stop.is_cancelled() {
                self.ended = true;
                return None;
            }
            self.changed.borrow_and_update();
            let fresh: Option<Vec<Delta>> = {
                let history = lock(&self.fleet.history);
                // Ended while what it needs is still kept (a quarter of the history
                // behind), so its reconnect from its last id replays exactly; or once it is
                // gone.
                let lag = history.last_seq().saturating_sub(self.cursor);
                if self.cursor < history.base_seq || lag > (self.fleet.max_deltas as u64 / 4).max(1)
                {
                    None
                } else {
                    Some(
                        history
                            .deltas
                            .iter()
                            .filter(|d| d.seq > self.cursor)
                            .cloned()
                            .collect(),
                    )
                }
            };
            let Some(fresh) = fresh else {
                tracing::info!(
                    cursor = self.cursor,
                    "fleet subscriber fell behind; ended (it reconnects and replays)"
                );
                self.ended = true;
                return None;
            };
            if !fresh.is_empty() {
                for delta in fresh {
                    self.cursor = delta.seq;
                    if let Some(patch) =
                        view_patch(&self.view, &mut self.doc, &mut self.shown, &delta)
                    {
                        self.queue.push_back((
                            delta.seq,
                            delta.at_ms,
                            Event::StateDelta { delta: patch },
                        ));
                    }
                }
                continue;
            }
            tokio::select! {
                changed = self.changed.changed() => {
                    if changed.is_err() {
                        self.ended = true;
                        return None;
                    }
                }
                () = self.stop.cancelled() => {}
                () = tokio::time::sleep(self.keep_alive) => return Some(FleetItem::KeepAlive),
            }
        }
    }
}

#[cfg(test)]
mod tests {
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

    async fn drain(stream: &mut FleetStream) -> Vec<(String, Event)> {
        let mut out = Vec::new();
        while !stream.queue.is_empty() {
            match stream.next().await {
                Some(FleetItem::Event { id, event, .. }) => out.push((id, event)),
                _ => break,
            }
        }
        out
    }

    fn apply(events: &[(String, Event)], mut state: Value) -> Value {
        for (_, event) in events {
            match event {
                Event::StateSnapshot { snapshot } => state = snapshot.clone(),
                Event::StateDelta { delta } => {
                    let patch: Patch = serde_json::from_value(delta.clone()).expect("patch");
                    json_patch::patch(&mut state, &patch).expect("applies");
                }
                _ => unreachable!(),
            }
        }
        state
    }

    #[tokio::test]
    async fn replay_then_snapshot_and_views_see_their_own() {
        let fleet = Arc::new(Fleet::new(7, 100, doc(json!({})), 1_000));
        assert!(fleet.update(doc(json!({"a": run("alice", "running")})), 2_000));
        assert!(!fleet.update(doc(json!({"a": run("alice", "running")})), 2_500));
        assert!(fleet.update(
            doc(json!({"a": run("alice", "suspended"), "b": run("bob", "running")})),
            3_000
        ));
        assert!(fleet.update(doc(json!({"b": run("bob", "running")})), 4_000));
        let everyone = Principal::operator();
        let stop = CancellationToken::new();
        let second = Duration::from_secs(1);

        // After event 1: patches 2 and 3, then the snapshot.
        let mut s = fleet.subscribe(
            &everyone,
            FleetFrom::After("7-1".into()),
            second,
            stop.clone(),
        );
        assert!(s.is_exact());
        let events = drain(&mut s).await;
        let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["7-2", "7-3", "7-3"]);
        assert!(matches!(events[2].1, Event::StateSnapshot { .. }));
        let at_1 = doc(json!({"a": run("alice", "running")}));
        assert_eq!(apply(&events[..2], at_1), fleet.document());

        // By time: after 2.5 s, the same.
        let mut s = fleet.subscribe(&everyone, FleetFrom::Since(2_500), second, stop.clone());
        assert_eq!(drain(&mut s).await.len(), 3);
        // Another boot's id, or one not kept: just the snapshot, as a resync.
        let mut s = fleet.subscribe(
            &everyone,
            FleetFrom::After("8-1".into()),
            second,
            stop.clone(),
        );
        assert!(!s.is_exact());
        assert_eq!(drain(&mut s).await.len(), 1);

        // Alice's view: her run's changes only, with her totals.
        let alice = Principal::scoped("alice", None, Caps::ALL);
        let mut s = fleet.subscribe(&alice, FleetFrom::After("7-0".into()), second, stop.clone());
        let events = drain(&mut s).await;
        let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["7-1", "7-2", "7-3", "7-3"]);
        let start = View::of(&alice).apply(&doc(json!({})));
        let end = apply(&events[..3], start);
        assert_eq!(end["totals"]["live"], 0);
        assert_eq!(end, View::of(&alice).apply(&fleet.document()));
        let text = serde_json::to_string(&events.iter().map(|(_, e)| e).collect::<Vec<_>>())
            .expect("json");
        assert!(!text.contains("bob"), "{text}");

        // Live: a new change reaches a subscriber waiting for it.
        let mut live = fleet.subscribe(&everyone, FleetFrom::Now, second, stop.clone());
        drain(&mut live).await;
        assert!(fleet.update(doc(json!({})), 5_000));
        match live.next().await {
            Some(FleetItem::Event {
                id,
                event: Event::StateDelta { .. },
                ..
            }) => {
                assert_eq!(id, "7-4")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_subscriber_behind_the_kept_history_is_ended() {
        let fleet = Arc::new(Fleet::new(1, 2, doc(json!({})), 0));
        let stop = CancellationToken::new();
        let mut s = fleet.subscribe(
            &Principal::operator(),
            FleetFrom::Now,
            Duration::from_secs(1),
            stop,
        );
        drain(&mut s).await;
        for i in 0..5 {
            fleet.update(doc(json!({format!("r{i}"): run("", "running")})), i);
        }
        assert!(s.next().await.is_none());
    }
}
