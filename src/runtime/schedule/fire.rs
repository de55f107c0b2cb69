//! The scheduler: one task per node, among the runtime's run tasks, ended by the drain.
//!
//! It reads the soonest schedules from the store, handles each one that is due, and sleeps
//! until the next one is (or a schedule is created or deleted here; in a cluster it also
//! looks again every [`CLUSTER_RESCAN`], since another node may have created one). Each due
//! occurrence is claimed with [`Store::claim_occurrence`](crate::store::Store::claim_occurrence)
//! before anything runs: the claim moves `next_fire` on only if it still holds that
//! occurrence, so of the nodes that try, one gets it.
//!
//! An occurrence reached within [`LATE_TOLERANCE`] of its time runs once (a late wake-up
//! fires it once, however many later occurrences also passed meanwhile: those are counted
//! as missed). One that no node reached in time, because none was running, is not run at
//! all: it is recorded as missed on the schedule (count, first and last) and logged, and
//! the schedule goes on from its next occurrence after now. A run hours late is often the
//! wrong run (a morning report in the afternoon); the owner sees what was missed and can
//! start a run by hand.
//!
//! A firing on a thread another node owns (cluster) is left to that node for the
//! tolerance, as a request for it would be sent there; past it, any node records it missed.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use super::CronSchedule;
use super::cron::Span;
use crate::access::{Capability, Caps, Principal};
use crate::metrics::ScheduleOutcome;
use crate::protocol::decode_run_input;
use crate::runtime::{Runtime, StartError};
use crate::store::{Fired, Missed, Occurrence, ScheduleRow, StoreError};

/// How late an occurrence may be reached and still run.
pub const LATE_TOLERANCE: Duration = Duration::from_secs(30);
/// How often a node of a cluster looks for schedules other nodes created.
const CLUSTER_RESCAN: Duration = Duration::from_secs(1);
/// How often a lone node looks again with nothing due (a bound on how long a change of the
/// system clock goes unnoticed).
const RESCAN: Duration = Duration::from_secs(60);
/// After a store failure.
const RETRY: Duration = Duration::from_secs(1);
/// Schedules read per look.
const BATCH: usize = 256;
/// Missed occurrences counted per gap, at most (a one-second schedule down for a week).
const MISSED_COUNT_CAP: i64 = 100_000;

impl Runtime {
    /// Starts this node's scheduler (the server does, once). It ends when the runtime
    /// drains; shutdown waits for it with the runs.
    pub fn spawn_scheduler(&self) {
        let runtime = self.clone();
        self.admission().spawn(async move {
            runtime.schedule_loop().await;
            tracing::debug!("scheduler stopped");
        });
    }

    async fn schedule_loop(&self) {
        let scheduling = &self.scheduling();
        let rescan = match self.options().cluster {
            Some(_) => CLUSTER_RESCAN,
            None => RESCAN,
        };
        // Occurrences left to the node that owns their thread: schedule id -> occurrence.
        let mut deferred = HashMap::new();
        loop {
            if scheduling.stop.is_cancelled() {
                return;
            }
            let wait = match self.fire_due(&mut deferred).await {
                Ok(Some(at)) => {
                    let now = self.options().schedule_clock.now_ms();
                    Duration::from_millis((at - now).max(0) as u64).min(rescan)
                }
                Ok(None) => rescan,
                Err(error) => {
                    tracing::warn!(%error, "schedules could not be read; retrying");
                    RETRY
                }
            };
            tokio::select! {
                () = scheduling.stop.cancelled() => return,
                () = scheduling.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Handles the schedules due now; when to look next (`None`: nothing scheduled).
    async fn fire_due(
        &self,
        deferred: &mut HashMap<String, i64>,
    ) -> Result<Option<i64>, StoreError> {
        let rows = self.store().soonest_schedules(BATCH).await?;
        let now = self.options().schedule_clock.now_ms();
        deferred.retain(|id, due| rows.iter().any(|r| r.id == *id && r.next_fire == *due));
        let tolerance = LATE_TOLERANCE.as_millis() as i64;
        let mut wake: Option<i64> = None;
        let mut soonest = |at: i64| wake = Some(wake.map_or(at, |w| w.min(at)));
        for row in rows {
            if self.is_draining() {
                return Ok(None);
            }
            if row.next_fire > now {
                // The rest are later still.
                soonest(row.next_fire);
                break;
            }
            if deferred.get(&row.id) == Some(&row.next_fire) && now - row.next_fire <= tolerance {
                soonest(row.next_fire + tolerance + 1);
                continue;
            }
            if self.occurrence(&row, now, deferred).await? {
                // Its next occurrence is in the store now: look again at once.
                soonest(now);
            } else {
                soonest(row.next_fire + tolerance + 1);
            }
        }
        Ok(wake)
    }

    /// Handles schedule `row`'s due occurrence: records it missed, leaves it to the node
    /// that owns its thread (`false`), or claims and fires it. `true` once the schedule has
    /// moved on (here or on another node).
    async fn occurrence(
        &self,
        row: &ScheduleRow,
        now: i64,
        deferred: &mut HashMap<String, i64>,
    ) -> Result<bool, StoreError> {
        let due = row.next_fire;
        let (cron, next) = match CronSchedule::parse(&row.cron, &row.timezone) {
            Ok(cron) => {
                let next = cron.after(now).unwrap_or(i64::MAX);
                (Some(cron), next)
            }
            Err(error) => {
                // Stored by a build that read it differently: it never fires again here.
                tracing::error!(schedule.id = %row.id, %error, "schedule unreadable; stopped");
                (None, i64::MAX)
            }
        };
        let late = now - due > LATE_TOLERANCE.as_millis() as i64;
        let passed = match &cron {
            // A long gap is many occurrences to count: off the async workers.
            Some(cron) if late => {
                let cron = cron.clone();
                tokio::task::spawn_blocking(move || cron.between(due, now, MISSED_COUNT_CAP))
                    .await
                    .unwrap_or_default()
            }
            Some(cron) => cron.between(due, now, MISSED_COUNT_CAP),
            None => Span::default(),
        };
        if late || cron.is_none() {
            self.record_missed(row, next, passed, cron.is_some())
                .await?;
            return Ok(true);
        }
        if let Some(thread) = &row.thread_id
            && self.options().cluster.is_some()
            && let Some(owner) = self.owner_elsewhere(&principal_of(row).key(thread)).await
        {
            tracing::debug!(schedule.id = %row.id, node = %owner.node, "firing left to the thread's node");
            deferred.insert(row.id.clone(), due);
            return Ok(false);
        }
        let fired = Fired {
            at: now,
            run_id: uuid::Uuid::new_v4().to_string(),
            thread_id: row
                .thread_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        };
        let occurrence = Occurrence {
            due,
            next,
            fired: Some(fired.clone()),
            missed: Missed {
                count: passed.count,
                first: passed.first,
                last: passed.last,
            },
        };
        if !self.store().claim_occurrence(&row.id, occurrence).await? {
            tracing::debug!(schedule.id = %row.id, "occurrence claimed by another node");
            self.schedule_metrics().counted(ScheduleOutcome::Lost, 1);
            return Ok(true);
        }
        self.schedule_metrics()
            .counted(ScheduleOutcome::Missed, passed.count as u64);
        self.start_and_record(row, &fired).await?;
        Ok(true)
    }

    /// Claims `row`'s due occurrence as missed (with the `passed` ones since), not run; a
    /// `readable` schedule's misses are counted and logged.
    async fn record_missed(
        &self,
        row: &ScheduleRow,
        next: i64,
        passed: Span,
        readable: bool,
    ) -> Result<(), StoreError> {
        let due = row.next_fire;
        let missed = Missed {
            count: passed.count + 1,
            first: Some(due),
            last: passed.last.or(Some(due)),
        };
        let occurrence = Occurrence {
            due,
            next,
            fired: None,
            missed,
        };
        if !self.store().claim_occurrence(&row.id, occurrence).await? {
            self.schedule_metrics().counted(ScheduleOutcome::Lost, 1);
        } else if readable {
            self.schedule_metrics()
                .counted(ScheduleOutcome::Missed, missed.count as u64);
            tracing::warn!(
                schedule.id = %row.id,
                missed = missed.count,
                first = %crate::clock::rfc3339(due),
                last = %crate::clock::rfc3339(missed.last.unwrap_or(due)),
                "schedule occurrences missed while no node ran them; not run"
            );
        }
        Ok(())
    }

    /// Starts the claimed occurrence `fired` of `row` and records what became of it.
    async fn start_and_record(&self, row: &ScheduleRow, fired: &Fired) -> Result<(), StoreError> {
        let (status, error) = match self.fire(row, fired).await {
            Ok(()) => {
                tracing::info!(schedule.id = %row.id, thread.id = %fired.thread_id, run.id = %fired.run_id, "schedule fired");
                self.schedule_metrics().counted(ScheduleOutcome::Started, 1);
                ("started", None)
            }
            Err(StartError::RunInProgress(live)) => {
                let reason = format!(
                    "skipped: run {live} was live on the thread and the agent's multitask \
                     strategy refuses new input while a run is live"
                );
                tracing::warn!(schedule.id = %row.id, thread.id = %fired.thread_id, %reason, "schedule firing skipped");
                self.schedule_metrics().counted(ScheduleOutcome::Skipped, 1);
                ("skipped", Some(reason))
            }
            Err(error) => {
                let reason = error.to_string();
                tracing::warn!(schedule.id = %row.id, thread.id = %fired.thread_id, %reason, "schedule firing failed");
                self.schedule_metrics().counted(ScheduleOutcome::Failed, 1);
                ("failed", Some(reason))
            }
        };
        self.store()
            .record_firing(&row.id, &fired.run_id, status, error)
            .await
    }

    /// Starts `fired`'s run of schedule `row`: its messages (with fresh ids, so the thread
    /// takes them as new input) as a background run, in its owner's namespace.
    async fn fire(&self, row: &ScheduleRow, fired: &Fired) -> Result<(), StartError> {
        let principal = principal_of(row);
        if row.thread_id.is_some() {
            match self.visible_thread(&principal, &fired.thread_id).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(StartError::Input(crate::protocol::InputError {
                        field: Some("threadId".to_owned()),
                        message: format!("thread {} no longer exists", fired.thread_id),
                    }));
                }
                Err(_) => return Err(StartError::Store),
            }
        }
        let mut messages = row.messages.clone();
        for message in messages.as_array_mut().into_iter().flatten() {
            if let Some(message) = message.as_object_mut() {
                message.insert("id".to_owned(), json!(uuid::Uuid::new_v4().to_string()));
            }
        }
        let body = json!({
            "threadId": fired.thread_id,
            "runId": fired.run_id,
            "messages": messages,
        });
        let input = decode_run_input(body.to_string().as_bytes()).map_err(StartError::Input)?;
        self.start_background_run_as(&principal, &row.agent, input)
            .await
            .map(drop)
    }
}

/// Who a schedule's runs act for: its owner, with its agent, the `run` and `read`
/// capabilities and the budget claim of the token that made it (the operator for the
/// operator's own schedules).
fn principal_of(row: &ScheduleRow) -> Principal {
    if row.owner.is_empty() {
        Principal::operator()
    } else {
        Principal::scoped(
            &row.owner,
            Some(vec![row.agent.clone()]),
            Caps::NONE.with(Capability::Run).with(Capability::Read),
        )
        .with_budget(row.budget)
    }
}
