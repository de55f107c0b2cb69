//! Schedules as stored: a principal's cron expression with the messages each firing sends,
//! its next occurrence, and what became of its last firing and of the occurrences missed.
//!
//! The one promise that matters across nodes: [`Store::claim_occurrence`] is a
//! compare-and-set on `next_fire`. Every node's scheduler may try the same occurrence;
//! exactly one sees `true` (the update of the others finds `next_fire` already moved on),
//! and only that one starts the run.

use serde_json::Value;

use super::{Backend, Store, StoreError};

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// Chosen by the daemon (a UUID), unique across principals.
    pub id: String,
    /// The principal it belongs to (`""`: the operator).
    pub owner: String,
    pub name: Option<String>,
    pub agent: String,
    pub cron: String,
    /// An IANA time zone name (`UTC` unless one was given).
    pub timezone: String,
    /// The owner's thread each firing runs on (`None`: a new thread each time).
    pub thread_id: Option<String>,
    /// The messages each firing sends (a JSON array, as given at creation).
    pub messages: Value,
    pub created_at: i64,
    /// The next occurrence not yet claimed (ms since the Unix epoch).
    pub next_fire: i64,
    /// The last firing, once there was one.
    pub last: Option<LastFiring>,
    pub missed: Missed,
    /// The `budget` claim of the token that made it: its firings count against it.
    pub budget: Option<crate::budget::Limits>,
}

/// A schedule's last firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastFiring {
    /// When it was claimed.
    pub at: i64,
    pub run_id: String,
    pub thread_id: String,
    /// `starting` (claimed; the run not yet started, or the node stopped there),
    /// `started`, `skipped` (the thread was busy), `failed`.
    pub status: String,
    /// Why it was skipped or failed.
    pub error: Option<String>,
}

/// Occurrences no node ran in time, counted since the schedule was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Missed {
    pub count: i64,
    /// The earliest and the latest of them (ms).
    pub first: Option<i64>,
    pub last: Option<i64>,
}

/// What claiming one occurrence writes: where the schedule goes next, and the firing or the
/// missed occurrences it records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// The `next_fire` the claim expects to find (the occurrence claimed).
    pub due: i64,
    /// The `next_fire` it leaves.
    pub next: i64,
    /// The firing, when this occurrence is run (its status `starting`).
    pub fired: Option<Fired>,
    /// The occurrences passed over (`count` 0: none).
    pub missed: Missed,
}

/// A firing as claimed, before its run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub at: i64,
    pub run_id: String,
    pub thread_id: String,
}

macro_rules! on_backend {
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match &$self.backend {
            Backend::Sqlite(store) => store.$method($($arg),*).await,
            Backend::Postgres(store) => store.$method($($arg),*).await,
        }
    };
}

impl Store {
    /// Stores a new schedule unless its owner has `cap` already (counted and inserted at
    /// once, so parallel creates cannot pass the cap): whether it was stored.
    pub async fn insert_schedule(&self, row: ScheduleRow, cap: usize) -> Result<bool, StoreError> {
        on_backend!(self.insert_schedule(row, cap))
    }

    /// The schedules of `owner` (`None`: everyone's), oldest first.
    pub async fn schedules(&self, owner: Option<String>) -> Result<Vec<ScheduleRow>, StoreError> {
        on_backend!(self.schedules(owner))
    }

    /// Deletes schedule `id` if it is `owner`'s (`None`: whoever's); `false` when there
    /// was no such schedule.
    pub async fn delete_schedule(
        &self,
        id: &str,
        owner: Option<String>,
    ) -> Result<bool, StoreError> {
        on_backend!(self.delete_schedule(id.to_owned(), owner))
    }

    /// Up to `limit` schedules, soonest `next_fire` first (what a scheduler looks at).
    pub async fn soonest_schedules(&self, limit: usize) -> Result<Vec<ScheduleRow>, StoreError> {
        on_backend!(self.soonest_schedules(limit))
    }

    /// Claims `occurrence` of schedule `id`: moves `next_fire` from `occurrence.due` to
    /// `occurrence.next` and records the firing or the missed occurrences, only if
    /// `next_fire` still is `occurrence.due`. `true` for the one claim that did; `false`
    /// when another claim (another node) got there first or the schedule is gone.
    pub async fn claim_occurrence(
        &self,
        id: &str,
        occurrence: Occurrence,
    ) -> Result<bool, StoreError> {
        on_backend!(self.claim_occurrence(id.to_owned(), occurrence))
    }

    /// Records how firing `run_id` of schedule `id` went (`started`, `skipped`, `failed`,
    /// with the reason), unless a later firing has been claimed meanwhile.
    pub async fn record_firing(
        &self,
        id: &str,
        run_id: &str,
        status: &str,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        on_backend!(self.record_firing(id.to_owned(), run_id.to_owned(), status.to_owned(), error))
    }
}
