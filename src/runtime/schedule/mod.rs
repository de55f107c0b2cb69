//! Schedules: a principal's cron expression and the messages each firing sends, as a run
//! nobody's stream started, on one thread of the principal's or on a new thread each time.
//!
//! - This file: the calls the API makes ([`Runtime::create_schedule_as`],
//!   [`Runtime::schedules_as`], [`Runtime::delete_schedule_as`]), each scoped to the
//!   principal as threads are, and the clock schedules read ([`ScheduleClock`]).
//! - `cron.rs`: [`CronSchedule`], the expression in its time zone.
//! - `fire.rs`: the scheduler, one task per node that sleeps until the soonest schedule is
//!   due, claims the occurrence in the store (compare-and-set: on a cluster exactly one
//!   node gets it) and starts its run as a background run
//!   ([`Runtime::start_background_run_as`]); occurrences no node reached in time are
//!   recorded as missed, not run.
//!
//! What a schedule stores is `store::ScheduleRow`; nothing here knows HTTP.

mod cron;
mod fire;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use cron::{CronError, CronSchedule};
pub use fire::LATE_TOLERANCE;

use super::Runtime;
use crate::access::{Capability, Principal};
use crate::metrics::ScheduleMetrics;
use crate::protocol::{InputError, Message};
use crate::store::{Missed, ScheduleRow, StoreError};

/// Schedules one principal may hold.
pub const MAX_SCHEDULES_PER_OWNER: usize = 100;

/// The wall clock schedules are read against: the system's, or (tests) one that moves with
/// tokio's clock, so that paused time drives the scheduler.
#[derive(Debug, Clone)]
pub enum ScheduleClock {
    System,
    /// `origin_ms` at `origin`, then as tokio's clock moves.
    Tokio {
        origin_ms: i64,
        origin: tokio::time::Instant,
    },
}

impl ScheduleClock {
    /// A clock reading `origin_ms` now and moving with tokio's clock from here.
    pub fn following_tokio(origin_ms: i64) -> ScheduleClock {
        ScheduleClock::Tokio {
            origin_ms,
            origin: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            ScheduleClock::System => crate::clock::now_ms() as i64,
            ScheduleClock::Tokio { origin_ms, origin } => {
                origin_ms + origin.elapsed().as_millis() as i64
            }
        }
    }
}

/// A schedule as asked for, its messages already checked as a run's input.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub agent: String,
    pub cron: String,
    /// An IANA name (`None`: UTC).
    pub timezone: Option<String>,
    pub name: Option<String>,
    /// The principal's thread each firing runs on (`None`: a new thread each time).
    pub thread_id: Option<String>,
    pub messages: Vec<Message>,
}

/// Why a schedule was not created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("unknown agent")]
    UnknownAgent,
    #[error("the token lacks the `{}` capability", .0.name())]
    Forbidden(Capability),
    #[error("{}", .0.message)]
    Input(InputError),
    /// `threadId` names no thread of the principal's.
    #[error("no such thread")]
    UnknownThread,
    /// `threadId` names a thread of another agent (named unless the principal may not
    /// use it).
    #[error("thread belongs to another agent")]
    AgentMismatch(Option<String>),
    #[error("a principal may hold at most {0} schedules")]
    TooMany(usize),
    #[error("store unavailable")]
    Store,
}

impl From<StoreError> for ScheduleError {
    fn from(error: StoreError) -> ScheduleError {
        tracing::error!(%error, "store failed on a schedule");
        ScheduleError::Store
    }
}

impl From<CronError> for ScheduleError {
    fn from(error: CronError) -> ScheduleError {
        ScheduleError::Input(InputError {
            field: Some(error.field().to_owned()),
            message: error.to_string(),
        })
    }
}

/// The scheduler's handles in the runtime: how the API wakes it, and how the drain stops it.
#[derive(Default)]
pub(super) struct Scheduling {
    /// A schedule was created or deleted: look again at what is due.
    wake: Notify,
    /// Cancelled by [`Runtime::drain`]: the scheduler ends.
    stop: CancellationToken,
    /// What became of the occurrences this node handled.
    metrics: ScheduleMetrics,
}

impl Scheduling {
    pub(super) fn stop(&self) {
        self.stop.cancel();
    }
}

impl Runtime {
    /// What became of the schedule occurrences this node handled.
    pub fn schedule_metrics(&self) -> &ScheduleMetrics {
        &self.scheduling().metrics
    }

    /// Creates a schedule in `principal`'s namespace: its agent one the principal may use
    /// (else [`ScheduleError::UnknownAgent`]), the `run` capability, the expression and
    /// time zone valid with an occurrence ahead, its messages ones the agent can take, its
    /// thread (when given) one of the principal's on that agent. Its first occurrence is
    /// the first after now.
    pub async fn create_schedule_as(
        &self,
        principal: &Principal,
        new: NewSchedule,
    ) -> Result<ScheduleRow, ScheduleError> {
        let Some(backend) = self
            .agents()
            .get(&new.agent)
            .filter(|_| principal.may_use(&new.agent))
            .cloned()
        else {
            return Err(ScheduleError::UnknownAgent);
        };
        if !principal.can(Capability::Run) {
            return Err(ScheduleError::Forbidden(Capability::Run));
        }
        let timezone = new.timezone.unwrap_or_else(|| "UTC".to_owned());
        let cron = CronSchedule::parse(&new.cron, &timezone)?;
        let now = self.options().schedule_clock.now_ms();
        let next_fire = cron.after(now).ok_or(CronError::Never)?;
        if new.messages.is_empty() {
            return Err(ScheduleError::Input(InputError {
                field: Some("messages".to_owned()),
                message: "messages must hold at least one message for each firing to send"
                    .to_owned(),
            }));
        }
        for (i, message) in new.messages.iter().enumerate() {
            if !matches!(
                message,
                Message::User(_) | Message::System(_) | Message::Developer(_)
            ) {
                return Err(ScheduleError::Input(InputError {
                    field: Some(format!("messages[{i}].role")),
                    message: "a schedule sends user, system or developer messages".to_owned(),
                }));
            }
        }
        let indexed: Vec<(usize, &Message)> = new.messages.iter().enumerate().collect();
        backend
            .check_new_messages(&indexed)
            .map_err(ScheduleError::Input)?;
        if let Some(thread) = &new.thread_id {
            match self.visible_thread(principal, thread).await? {
                None => return Err(ScheduleError::UnknownThread),
                Some(row) if row.agent != new.agent => {
                    return Err(ScheduleError::AgentMismatch(
                        principal.may_use(&row.agent).then_some(row.agent),
                    ));
                }
                Some(_) => {}
            }
        }
        let store = self.store();
        let row = ScheduleRow {
            id: uuid::Uuid::new_v4().to_string(),
            owner: principal.owner().to_owned(),
            name: new.name,
            agent: new.agent,
            cron: new.cron,
            timezone,
            thread_id: new.thread_id,
            messages: serde_json::to_value(&new.messages).map_err(StoreError::Encode)?,
            created_at: now,
            next_fire,
            last: None,
            missed: Missed::default(),
            budget: principal.budget().copied(),
        };
        if !store
            .insert_schedule(row.clone(), MAX_SCHEDULES_PER_OWNER)
            .await?
        {
            return Err(ScheduleError::TooMany(MAX_SCHEDULES_PER_OWNER));
        }
        tracing::info!(schedule.id = %row.id, agent = %row.agent, cron = %row.cron, "schedule created");
        self.scheduling().wake.notify_one();
        Ok(row)
    }

    /// `principal`'s schedules (every principal's for the operator), of the agents it may
    /// use, oldest first.
    pub async fn schedules_as(
        &self,
        principal: &Principal,
    ) -> Result<Vec<ScheduleRow>, StoreError> {
        let owner = (!principal.sees_everyone()).then(|| principal.owner().to_owned());
        let mut rows = self.store().schedules(owner).await?;
        rows.retain(|row| principal.may_use(&row.agent));
        Ok(rows)
    }

    /// Deletes schedule `id` of `principal`'s (whoever's for the operator); `false` when
    /// it has no such schedule. A firing already started goes on as the run it is.
    pub async fn delete_schedule_as(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<bool, StoreError> {
        let visible = self
            .schedules_as(principal)
            .await?
            .iter()
            .any(|row| row.id == id);
        if !visible {
            return Ok(false);
        }
        let owner = (!principal.sees_everyone()).then(|| principal.owner().to_owned());
        let deleted = self.store().delete_schedule(id, owner).await?;
        if deleted {
            tracing::info!(schedule.id = %id, "schedule deleted");
            self.scheduling().wake.notify_one();
        }
        Ok(deleted)
    }
}
