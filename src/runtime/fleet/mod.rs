//! The ambient plane: one JSON document describing the fleet (live and suspended runs,
//! agents, totals), and its history as RFC 6902 patches, for `GET {path}/fleet/stream`.
//!
//! The runtime rebuilds the document when something changed (a run started, suspended,
//! resumed or ended; at least once a second for the agents' states) and [`Fleet::update`]
//! keeps the patch from the previous one, numbered. A subscriber gets the patches after its
//! cursor (replay), then the snapshot, then each new patch as it comes. Patches are kept up
//! to a bound. A subscriber more than a quarter of it behind is ended while what it needs is
//! still kept, so it reconnects from its last id and replays exactly; one whose cursor fell
//! out of it altogether gets a fresh snapshot on reconnect. Never a silent gap. The
//! document holds metadata only: ids, names, phases, times; never message text or tool
//! arguments.
//!
//! A principal that does not see everyone gets a view: only its own runs and its agents,
//! with totals of those. Its patches are computed from the views before and after each
//! change, so they carry the same ids as everyone's.
//!
//! Subscribers share: every view that has subscribers is kept once, in the history, with
//! its changes encoded once as SSE frames (reference-counted bytes) that each of its
//! subscribers takes in turn; a subscriber holds only its cursor. What the history and its
//! views hold is counted on the memory meter. Subscriptions are capped in total and per
//! principal ([`FleetLimits`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use json_patch::Patch;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::memory::{Meter, json_size};
use crate::access::Principal;
use crate::protocol::{Event, event_frame};
use crate::sync::lock;

mod document;
pub(in crate::runtime) use document::FleetRoom;
mod stream;

pub use stream::{FleetItem, FleetStream};

/// Patches kept for replay by default.
pub const DEFAULT_FLEET_HISTORY: usize = 4096;

/// How long the document is kept up to date after the last subscriber left (so that a
/// reconnect replays exactly); after that, until the next subscriber, it is not rebuilt.
pub const WATCHED_FOR: Duration = Duration::from_secs(600);

/// How many fleet streams may be open.
#[derive(Debug, Clone, Copy)]
pub struct FleetLimits {
    /// In all.
    pub total: usize,
    /// For one principal (the operator's namespace counts as one).
    pub per_principal: usize,
}

impl Default for FleetLimits {
    fn default() -> Self {
        FleetLimits {
            total: 1024,
            per_principal: 64,
        }
    }
}

/// A fleet stream refused: the cap it met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetFull {
    Total(usize),
    Principal(usize),
}

/// One change of the document.
#[derive(Debug, Clone)]
struct Delta {
    seq: u64,
    at_ms: u64,
    patch: Patch,
}

/// A view subscribers hold, kept current at every change.
struct Shared {
    subscribers: usize,
    /// What the view shows now (`None` for the whole document: that is `current`).
    shown: Option<Value>,
    /// Its recent visible changes, encoded once for all its subscribers.
    frames: VecDeque<(u64, Bytes)>,
    /// Its snapshot as of a sequence number, encoded once.
    snapshot: Option<(u64, Bytes)>,
    /// What is counted on the meter for it.
    metered: usize,
}

impl Shared {
    fn measure(&self) -> usize {
        self.shown.as_ref().map_or(0, json_size)
            + self.frames.iter().map(|(_, f)| f.len()).sum::<usize>()
            + self.snapshot.as_ref().map_or(0, |(_, f)| f.len())
    }
}

struct History {
    /// The document as of `base_seq` (before the oldest kept patch), and when that was.
    base: Value,
    base_seq: u64,
    base_at_ms: u64,
    deltas: VecDeque<Delta>,
    /// The document now.
    current: Value,
    /// The views subscribers hold.
    views: HashMap<View, Shared>,
    /// Open subscriptions by principal namespace, and in all.
    open: HashMap<String, usize>,
    total: usize,
    /// When the last subscription ended.
    last_left: Option<std::time::Instant>,
    /// What is counted on the meter for the document and its patches.
    metered: usize,
}

impl History {
    fn last_seq(&self) -> u64 {
        self.deltas.back().map_or(self.base_seq, |d| d.seq)
    }

    fn measure(&self) -> usize {
        json_size(&self.base)
            + json_size(&self.current)
            + self
                .deltas
                .iter()
                .map(|d| json_size(&d.patch))
                .sum::<usize>()
    }
}

/// The fleet document and its recent history.
pub struct Fleet {
    history: Mutex<History>,
    /// The last sequence number, for subscribers to wait on.
    changed: watch::Sender<u64>,
    epoch: u64,
    max_deltas: usize,
    limits: FleetLimits,
    meter: Arc<Meter>,
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
        // Keyed by owner: a view of one owner takes its own entry, every owner's all.
        let own = |section: &str| -> serde_json::Map<String, Value> {
            let all = doc[section].as_object();
            match &self.owner {
                None => all.cloned().unwrap_or_default(),
                Some(owner) => all
                    .and_then(|all| all.get(owner))
                    .map(|entry| (owner.clone(), entry.clone()))
                    .into_iter()
                    .collect(),
            }
        };
        let totals = totals(&runs);
        json!({"runs": runs, "agents": agents, "totals": totals,
               "principals": own("principals"), "activity": own("activity")})
    }
}

/// `{"live","suspended","queued"}` of a document's runs.
pub(super) fn totals(runs: &serde_json::Map<String, Value>) -> Value {
    let suspended = runs
        .values()
        .filter(|run| run["phase"] == "suspended")
        .count();
    let queued: u64 = runs.values().filter_map(|run| run["queued"].as_u64()).sum();
    json!({"live": runs.len(), "suspended": suspended, "queued": queued})
}

/// The frame of a patch, or `None` when there is nothing to say.
fn delta_frame(id: &str, at_ms: u64, patch: &Patch) -> Option<Bytes> {
    if patch.0.is_empty() {
        return None;
    }
    let delta = serde_json::to_value(patch).ok()?;
    Some(event_frame(id, &Event::StateDelta { delta }, Some(at_ms)))
}

impl Fleet {
    pub fn new(
        epoch: u64,
        max_deltas: usize,
        initial: Value,
        now_ms: u64,
        limits: FleetLimits,
        meter: Arc<Meter>,
    ) -> Fleet {
        let mut history = History {
            base: initial.clone(),
            base_seq: 0,
            base_at_ms: now_ms,
            deltas: VecDeque::new(),
            current: initial,
            views: HashMap::new(),
            open: HashMap::new(),
            total: 0,
            last_left: None,
            metered: 0,
        };
        history.metered = history.measure();
        meter.add(history.metered);
        Fleet {
            history: Mutex::new(history),
            changed: watch::Sender::new(0),
            epoch,
            max_deltas: max_deltas.max(1),
            limits,
            meter,
        }
    }

    /// Whether anyone watches the document, or did within [`WATCHED_FOR`].
    pub fn is_watched(&self) -> bool {
        let history = lock(&self.history);
        history.total > 0
            || history
                .last_left
                .is_some_and(|at| at.elapsed() < WATCHED_FOR)
    }

    /// How far behind a subscriber may fall before it is ended (in patches).
    fn window(&self) -> u64 {
        (self.max_deltas as u64 / 4).max(1)
    }

    /// Makes `doc` the document; `true` when it differed (a new patch was kept).
    pub fn update(&self, doc: Value, now_ms: u64) -> bool {
        let mut history = lock(&self.history);
        let patch = json_patch::diff(&history.current, &doc);
        if patch.0.is_empty() {
            return false;
        }
        let seq = history.last_seq() + 1;
        let id = self.id(seq);
        let window = self.window();
        for (view, shared) in &mut history.views {
            let frame = match &mut shared.shown {
                None => delta_frame(&id, now_ms, &patch),
                Some(shown) => {
                    let next = view.apply(&doc);
                    let frame = delta_frame(&id, now_ms, &json_patch::diff(shown, &next));
                    *shown = next;
                    frame
                }
            };
            shared.frames.extend(frame.map(|f| (seq, f)));
            // A subscriber further behind than the window is ended: nothing older is needed.
            while shared
                .frames
                .front()
                .is_some_and(|(s, _)| s + window <= seq)
            {
                shared.frames.pop_front();
            }
            shared.snapshot = None;
            let measured = shared.measure();
            self.meter.replace(shared.metered, measured);
            shared.metered = measured;
        }
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
        let measured = history.measure();
        self.meter.replace(history.metered, measured);
        history.metered = measured;
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
    /// honoured), then the snapshot, then live patches; refused past the caps.
    pub fn subscribe(
        self: &Arc<Fleet>,
        principal: &Principal,
        from: FleetFrom,
        keep_alive: Duration,
        stop: CancellationToken,
    ) -> Result<FleetStream, FleetFull> {
        let view = View::of(principal);
        let namespace = principal.owner().to_owned();
        let mut history = lock(&self.history);
        if history.total >= self.limits.total {
            return Err(FleetFull::Total(self.limits.total));
        }
        let held = history.open.get(&namespace).copied().unwrap_or(0);
        if held >= self.limits.per_principal {
            return Err(FleetFull::Principal(self.limits.per_principal));
        }
        let last = history.last_seq();
        let start = self.replay_start(&history, &from);
        let exact = start.is_some() || from == FleetFrom::Now;
        let queue = match start {
            Some(start) if start < last => self.replay(&history, &view, start),
            _ => VecDeque::new(),
        };
        let mut queue = queue;
        let now = crate::clock::now_ms();
        let History {
            views,
            current,
            open,
            total,
            ..
        } = &mut *history;
        let shared = views.entry(view.clone()).or_insert_with(|| Shared {
            subscribers: 0,
            shown: (!view.is_everything()).then(|| view.apply(current)),
            frames: VecDeque::new(),
            snapshot: None,
            metered: 0,
        });
        shared.subscribers += 1;
        let snapshot = match &shared.snapshot {
            Some((seq, frame)) if *seq == last => frame.clone(),
            _ => {
                let snapshot = shared.shown.clone().unwrap_or_else(|| current.clone());
                let frame = event_frame(
                    &self.id(last),
                    &Event::StateSnapshot { snapshot },
                    Some(now),
                );
                shared.snapshot = Some((last, frame.clone()));
                frame
            }
        };
        let measured = shared.measure();
        self.meter.replace(shared.metered, measured);
        shared.metered = measured;
        queue.push_back(snapshot);
        *open.entry(namespace.clone()).or_insert(0) += 1;
        *total += 1;
        drop(history);
        Ok(FleetStream {
            fleet: self.clone(),
            view,
            namespace,
            cursor: last,
            queue,
            changed: self.changed.subscribe(),
            stop,
            keep_alive,
            exact,
            ended: false,
        })
    }

    /// The sequence number a replay from `from` starts after, when it can be honoured.
    fn replay_start(&self, history: &History, from: &FleetFrom) -> Option<u64> {
        let last = history.last_seq();
        match from {
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
        }
    }

    /// The frames of what `view` shows change after `start`, computed from the kept patches
    /// (once per subscription; the document copy it needs is dropped at once).
    fn replay(&self, history: &History, view: &View, start: u64) -> VecDeque<Bytes> {
        let mut doc = history.base.clone();
        for delta in history.deltas.iter().take_while(|d| d.seq <= start) {
            let _ = json_patch::patch(&mut doc, &delta.patch);
        }
        let mut shown = view.apply(&doc);
        let mut frames = VecDeque::new();
        for delta in history.deltas.iter().filter(|d| d.seq > start) {
            let id = self.id(delta.seq);
            let _ = json_patch::patch(&mut doc, &delta.patch);
            let frame = if view.is_everything() {
                delta_frame(&id, delta.at_ms, &delta.patch)
            } else {
                let next = view.apply(&doc);
                let frame = delta_frame(&id, delta.at_ms, &json_patch::diff(&shown, &next));
                shown = next;
                frame
            };
            frames.extend(frame);
        }
        frames
    }
}

#[cfg(test)]
mod tests;
