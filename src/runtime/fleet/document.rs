//! The runtime's side of the fleet: the document it builds from its runs and agents, the
//! task that rebuilds it when told that something changed, and subscriptions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::access::Principal;
use crate::clock::{now_ms, rfc3339};
use crate::runtime::Runtime;
use crate::runtime::live::Phase;
use crate::runtime::suspension::{self};
use crate::sync::lock;

/// The runtime's fleet: the document's history and the wake-up of the task that rebuilds
/// it.
pub(in crate::runtime) struct FleetRoom {
    fleet: Arc<Fleet>,
    dirty: Arc<tokio::sync::Notify>,
    /// Per owner, how many of its runs ended and threads went since the start: a client's
    /// cue to read its thread list again (a short run may start and end between two
    /// rebuilds of the document, and never show in `runs`).
    activity: std::sync::Mutex<HashMap<String, u64>>,
    /// Each principal's day as last shown (it changes with every token while runs work:
    /// read anew every second, the document would take a patch a second).
    spending: std::sync::Mutex<Shown>,
}

/// The principals' days as the document last showed them.
#[derive(Default)]
struct Shown {
    at: u64,
    mark: Mark,
    doc: Value,
}

/// What, changed, has the days read anew: the runs (their keys, ids and phases) and the
/// budgets reached by owner.
#[derive(Default, PartialEq)]
struct Mark {
    runs: Vec<String>,
    reached: Vec<(String, u64)>,
}

/// How often the fleet shows each principal's spending anew.
const SPENDING_EVERY_MS: u64 = 10_000;

impl FleetRoom {
    pub(in crate::runtime) fn new(fleet: Fleet) -> FleetRoom {
        FleetRoom {
            fleet: Arc::new(fleet),
            dirty: Arc::default(),
            activity: std::sync::Mutex::default(),
            spending: std::sync::Mutex::default(),
        }
    }

    /// Takes `doc` as the fleet's document now.
    pub(in crate::runtime) fn update(&self, doc: Value) {
        self.fleet.update(doc, now_ms());
    }
}

impl Runtime {
    /// Something the fleet document shows changed (a run started, parked, resumed, ended).
    pub(crate) fn fleet_changed(&self) {
        self.fleet().dirty.notify_one();
    }

    /// One of `owner`'s runs ended, or one of its threads was deleted.
    pub(in crate::runtime) fn fleet_activity(&self, owner: &str) {
        *lock(&self.fleet().activity)
            .entry(owner.to_owned())
            .or_default() += 1;
        self.fleet_changed();
    }

    /// Rebuilds the fleet document when told that something changed (a burst is taken
    /// together), and at least once a second (agents' states change on their own), while
    /// anyone watches it (and for [`fleet::WATCHED_FOR`] after the last subscriber left, so
    /// a reconnect replays): a daemon nobody watches pays nothing for it. One task; it ends
    /// with the runtime.
    pub(in crate::runtime) fn spawn_fleet(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = self.downgrade();
        let dirty = self.fleet().dirty.clone();
        handle.spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_secs(1), dirty.notified()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Some(runtime) = weak.upgrade() else {
                    return;
                };
                let room = runtime.fleet();
                if room.fleet.is_watched() {
                    room.update(runtime.fleet_document());
                }
            }
        });
    }

    /// The fleet as it is: live runs (metadata only), agents, totals.
    pub fn fleet_document(&self) -> Value {
        let threads = self.threads().all();
        let mut runs = serde_json::Map::new();
        for thread in threads {
            let (run, queued) = {
                let state = lock(&thread.state);
                let Some(run) = state.live.clone() else {
                    continue;
                };
                (run, state.queue.len())
            };
            let suspended = run.phase.get() == Phase::Suspended;
            let mut entry = json!({
                "threadId": thread.id,
                "agent": thread.agent,
                "runId": run.id,
                "phase": if suspended { "suspended" } else { "running" },
                "startedAt": rfc3339(run.started_at_ms as i64),
            });
            if !thread.owner().is_empty() {
                entry["owner"] = json!(thread.owner());
            }
            if queued > 0 {
                entry["queued"] = json!(queued);
            }
            if suspended && let Some(suspension) = lock(&run.suspension).as_ref() {
                let waits: Vec<Value> = suspension
                    .waits
                    .iter()
                    .map(|wait| {
                        let kind = match wait {
                            suspension::Wait::Tool { .. } => "tool",
                            suspension::Wait::Permission { budget: true, .. } => "budget",
                            suspension::Wait::Permission { .. } => "approval",
                            suspension::Wait::Input { .. } => "input",
                        };
                        json!({"kind": kind, "id": wait.answer_id()})
                    })
                    .collect();
                entry["waitingFor"] = Value::Array(waits);
            }
            runs.insert(thread.key.to_string(), entry);
        }
        let processes: HashMap<&str, crate::agent::Processes> =
            self.agent_processes().into_iter().collect();
        let agents: serde_json::Map<String, Value> = self
            .agents()
            .iter()
            .map(|(name, agent)| {
                let status = agent.status();
                let mut entry = json!({"state": status.state});
                // Each limit hit changes the document: the stream carries it as a patch.
                if !status.breaches.is_none() {
                    entry["breaches"] = json!(status.breaches);
                }
                // An egress refusal (an injected agent reaching out, say) shows as it happens.
                if !status.egress.is_none() {
                    entry["egress"] = json!(status.egress);
                }
                if let Some(p) = processes.get(name.as_str()) {
                    entry["processes"] = json!({"busy": p.busy, "idle": p.idle});
                }
                (name.clone(), entry)
            })
            .collect();
        let totals = totals(&runs);
        let principals = self.principals_today(&runs);
        let activity = json!(*lock(&self.fleet().activity));
        json!({"runs": runs, "agents": agents, "totals": totals, "principals": principals,
               "activity": activity})
    }

    /// What each principal spent today (UTC) on this node, its daily ceiling and how many
    /// budgets its runs reached, keyed by owner (`""`: the operator). Counted while any
    /// budget is configured. Read anew when the runs changed (`runs`: the document's runs
    /// now), a budget was reached, or [`SPENDING_EVERY_MS`] passed; else as last shown.
    fn principals_today(&self, runs: &serde_json::Map<String, Value>) -> Value {
        let now = now_ms();
        let days = self.days().on(crate::budget::day_of(now));
        let mark = Mark {
            runs: runs
                .iter()
                .map(|(key, run)| format!("{key}:{}:{}", run["runId"], run["phase"]))
                .collect(),
            reached: days
                .iter()
                .map(|day| (day.owner.clone(), day.reached))
                .collect(),
        };
        let mut shown = lock(&self.fleet().spending);
        if now.saturating_sub(shown.at) < SPENDING_EVERY_MS && shown.mark == mark {
            return shown.doc.clone();
        }
        let doc: serde_json::Map<String, Value> = days
            .into_iter()
            .map(|day| {
                let entry = json!({
                    "spent": day.spent,
                    "limits": day.limits,
                    "reached": day.reached,
                });
                (day.owner, entry)
            })
            .collect();
        *shown = Shown {
            at: now,
            mark,
            doc: Value::Object(doc),
        };
        shown.doc.clone()
    }

    /// A fleet stream for `principal` (its view of the fleet), from `from`.
    pub fn fleet_stream(
        &self,
        principal: &Principal,
        from: FleetFrom,
    ) -> Result<FleetStream, FleetFull> {
        // Nobody may have watched for a while: the document is brought up to date first.
        let room = self.fleet();
        room.update(self.fleet_document());
        room.fleet.subscribe(
            principal,
            from,
            self.options().keep_alive,
            self.stop_token().clone(),
        )
    }
}
