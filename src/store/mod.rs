//! Durable threads behind one API, [`Store`], on one of two backends:
//!
//! - [`Store::open`]: an embedded SQLite database in the data directory (`sqlite.rs`, the
//!   only rusqlite user, on tokio's blocking pool);
//! - [`Store::connect_postgres`]: a PostgreSQL database shared by the nodes of a cluster
//!   (`postgres.rs`), whose thread writes are fenced by this node's leases ([`Fence`]).
//!
//! Both keep the same contract. Callers get a cheap-to-clone [`Store`] handle; every
//! operation is a job in one FIFO, run in order by a single runner, so a read enqueued
//! after a write sees it. Writes from the run pump are enqueued without waiting (errors are
//! logged); reads, deletes and [`Store::commit`] are awaited.
//!
//! Group commit (`runner.rs`, shared by both backends): the runner runs the jobs queued at
//! one moment (up to 512) inside one transaction, each job in its own savepoint so that a
//! failing job undoes only itself, and answers the jobs' callers only after that
//! transaction commits. An answer therefore means durable. [`Store::commit`] adds no job:
//! it waits for the batch holding the last job queued before the call, and fails when a
//! batch failed to commit meanwhile.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod fence;
mod known;
mod postgres;
mod runner;
mod sqlite;
pub use fence::{Fence, Held};

use crate::metrics::StoreMetrics;
use crate::protocol::Message;
use crate::protocol::input::MAX_ID_BYTES;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// This node no longer holds the thread's lease (cluster): the write was refused.
    #[error("the thread's lease is held by another node")]
    LeaseLost,
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "{0} is held by another agui-serve: a data directory serves one daemon (several share PostgreSQL, with --store)"
    )]
    InUse(PathBuf),
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make database {path} private: {source}")]
    Private {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store is closed")]
    Closed,
    #[error("cannot start the checkpoint thread: {0}")]
    Thread(std::io::Error),
    #[error("database schema version {0} is newer than this build understands")]
    TooNew(i64),
    #[error("database migration {0} would leave references dangling; not applied")]
    Migration(usize),
    #[error("the write could not be committed")]
    Commit,
    #[error("the store must be opened inside a tokio runtime")]
    NoRuntime,
    #[error("invalid PostgreSQL connection string: {0}")]
    PgConfig(tokio_postgres::Error),
    #[error(
        "TLS to PostgreSQL is not supported (sslmode={0}): connect over a local socket or through a TLS proxy"
    )]
    PgTls(String),
    #[error("cannot connect to PostgreSQL: {0}")]
    PgConnect(tokio_postgres::Error),
    #[error("cannot encode a message: {0}")]
    Encode(serde_json::Error),
    #[error("database error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// Thread metadata as the thread API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadRow {
    /// The key in its owner's namespace.
    pub key: crate::access::ThreadKey,
    /// The thread id its owner chose.
    pub id: String,
    /// The owning principal (`""`: the operator).
    pub owner: String,
    pub agent: String,
    pub session_id: Option<String>,
    pub title: Option<String>,
    /// Archived by its owner (left out of the listing unless asked for).
    pub archived: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub status: String,
    pub message_count: i64,
    pub metadata: Option<Value>,
    pub last_run: Option<RunRow>,
}

impl ThreadRow {
    /// Whether a rewind let the thread's session go, and no turn has bound a new one yet.
    pub fn rewound(&self) -> bool {
        self.session_id.is_none()
            && self
                .metadata
                .as_ref()
                .is_some_and(|m| m["session"]["how"] == "rewound")
    }
}

/// One run as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: String,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub segments: i64,
    pub outcome: Option<String>,
}

/// Whose threads a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListScope {
    /// Only this owner's (`None`: every owner's).
    pub owner: Option<String>,
    /// Only threads of these agents (`None`: every agent's).
    pub agents: Option<Vec<String>>,
    /// Archived threads too.
    pub archived: bool,
}

/// A page of threads.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadPage {
    pub threads: Vec<ThreadRow>,
    pub next_cursor: Option<String>,
}

impl ThreadPage {
    /// A page of `threads`, with a cursor after its last one when `more` follow.
    fn new(threads: Vec<ThreadRow>, more: bool) -> ThreadPage {
        let next_cursor = more
            .then(|| {
                threads
                    .last()
                    .map(|t| encode_cursor(t.updated_at, t.key.as_str()))
            })
            .flatten();
        ThreadPage {
            threads,
            next_cursor,
        }
    }
}

/// A rewound thread's metadata: its session was let go, and the next turn starts a new one
/// given the kept transcript.
pub const REWOUND_METADATA: &str = r#"{"session":{"id":null,"how":"rewound"}}"#;

/// What the runtime needs to resume a thread after a restart.
#[derive(Debug, Clone)]
pub struct StoredThread {
    pub row: ThreadRow,
    pub transcript: Vec<Message>,
    /// The shared state document its last run left (`None`: never kept, or unreadable).
    pub state: Option<Value>,
    /// Its queue of input waiting for a run of its own, in order.
    pub queue: Vec<QueuedRow>,
}

/// One item of a thread's queue: input sent while a run was live, to run when the runs
/// before it have ended.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRow {
    /// The item's id (its run's id).
    pub id: String,
    /// Its place in the thread's queue (ascending).
    pub seq: i64,
    /// The principal that sent it has a run cap.
    pub capped: bool,
    /// The `budget` claim of the token that sent it.
    pub budget: Option<crate::budget::Limits>,
    /// The `RunAgentInput`, as JSON.
    pub input: String,
    pub created_at: i64,
}

/// A stored `budget` claim as its column holds it (JSON; `None`: none).
fn claim_text(claim: Option<&crate::budget::Limits>) -> Option<String> {
    claim.and_then(|c| serde_json::to_string(c).ok())
}

/// A `budget` claim read back; one that does not parse grants nothing (an empty budget
/// of zero tokens), never more than was claimed.
fn claim_of(text: Option<String>) -> Option<crate::budget::Limits> {
    let text = text?;
    Some(serde_json::from_str(&text).unwrap_or_else(|error| {
        tracing::warn!(%error, "a stored budget claim does not parse; nothing may be spent");
        crate::budget::Limits {
            tokens: Some(0),
            ..crate::budget::Limits::default()
        }
    }))
}

/// A stored state document, read back; one that does not parse is left out (logged).
fn read_state(id: &str, text: Option<String>) -> Option<Value> {
    let text = text?;
    match serde_json::from_str(&text) {
        Ok(state) => Some(state),
        Err(error) => {
            tracing::warn!(%error, thread.id = %id, "stored state unreadable; a fresh one used");
            None
        }
    }
}

/// The data directory's lock, held by a daemon on the embedded store while it runs.
#[derive(Debug)]
pub struct DataDirLock {
    _held: nix::fcntl::Flock<std::fs::File>,
}

/// Handle to the store, on either backend. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

/// Runs the same call on whichever backend the store is.
macro_rules! dispatch {
    ($self:ident.$method:ident($($arg:expr),*).await) => {
        match &$self.backend {
            Backend::Sqlite(store) => store.$method($($arg),*).await,
            Backend::Postgres(store) => store.$method($($arg),*).await,
        }
    };
    ($self:ident.$method:ident($($arg:expr),*)) => {
        match &$self.backend {
            Backend::Sqlite(store) => store.$method($($arg),*),
            Backend::Postgres(store) => store.$method($($arg),*),
        }
    };
}

// After the macro, which it uses.
mod outbox;
pub use outbox::{
    Attempt, Claimed, Claims, DELIVERED_KEPT_MS, EndpointSummary, OutboxRow, OutboxStatus, Outgoing,
};
mod schedules;
pub use schedules::{Fired, LastFiring, Missed, Occurrence, ScheduleRow};

impl Store {
    /// Opens (creating if needed) the SQLite database in `data_dir`, migrates it, and marks
    /// runs left live by a previous process as interrupted.
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Sqlite(sqlite::SqliteStore::open(data_dir)?),
        })
    }

    /// Connects to the PostgreSQL database at `url` (a `postgres://` URL or `key=value`
    /// pairs; a Unix socket directory as the host), and migrates it. Nothing is recovered:
    /// other nodes may be live; a thread's cut runs are recovered by
    /// [`Store::recover_thread`] once its lease is taken. Every thread write is fenced by
    /// `fence`. TLS to the database is not supported: `sslmode=require` or `verify-*` is
    /// refused.
    pub async fn connect_postgres(url: &str, fence: Fence) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Postgres(postgres::PgStore::connect(url, fence).await?),
        })
    }

    /// Waits until every job enqueued before this call has run and its transaction has
    /// ended; an error when a transaction failed to commit meanwhile.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.commit().await
    }

    /// Waits until every write enqueued before this call is durable. It adds no job: it
    /// waits for the batch that holds the last queued job to commit.
    pub async fn commit(&self) -> Result<(), StoreError> {
        dispatch!(self.commit().await)
    }

    /// The commit latency and failure counters.
    pub fn metrics(&self) -> &StoreMetrics {
        dispatch!(self.metrics())
    }

    /// Jobs queued and not yet committed (the one running included).
    pub fn queue_depth(&self) -> u64 {
        dispatch!(self.queue_depth())
    }

    /// Takes `data_dir`'s lock file for as long as the returned value lives: the embedded
    /// store's database has one writer (see `known.rs`), so a second daemon on the same
    /// data directory is refused.
    pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = data_dir.join("agui-serve.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StoreError::Lock {
                path: path.clone(),
                source,
            })?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(held) => Ok(DataDirLock { _held: held }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(StoreError::InUse(path)),
            Err((_, errno)) => Err(StoreError::Lock {
                path,
                source: errno.into(),
            }),
        }
    }

    /// A thread and its transcript, if it exists.
    pub async fn load_thread(&self, id: &str) -> Result<Option<StoredThread>, StoreError> {
        dispatch!(self.load_thread(id).await)
    }

    /// Records the start of a run: creates the thread if new, appends `messages`, inserts
    /// the run, marks the thread running.
    pub fn record_run_start(
        &self,
        thread_id: &str,
        agent: &str,
        title: Option<String>,
        run_id: &str,
        messages: Vec<Message>,
        now: i64,
    ) {
        dispatch!(self.record_run_start(thread_id, agent, title, run_id, messages, now, None))
    }

    /// Appends messages the agent completed.
    pub fn record_messages(&self, thread_id: &str, messages: Vec<Message>, now: i64) {
        dispatch!(self.record_messages(thread_id, messages, now))
    }

    /// Records how a run ended and marks the thread `status`.
    pub fn record_run_end(
        &self,
        thread_id: &str,
        run_id: &str,
        outcome: &str,
        status: &str,
        now: i64,
    ) {
        dispatch!(self.record_run_end(thread_id, run_id, outcome, status, now, None))
    }

    /// Puts an item in a thread's queue, or replaces the item of the same id.
    pub fn queue_put(&self, thread_id: &str, item: &QueuedRow) {
        dispatch!(self.queue_put(thread_id, item))
    }

    /// Takes an item out of a thread's queue.
    pub fn queue_remove(&self, thread_id: &str, id: &str) {
        dispatch!(self.queue_remove(thread_id, id))
    }

    /// Adds `spend` to what `owner` spent on `day`.
    pub fn add_spend(&self, owner: &str, day: i64, spend: &crate::budget::Spend) {
        dispatch!(self.add_spend(owner, day, spend))
    }

    /// What `owner` spent on `day`.
    pub async fn spent_on(
        &self,
        owner: &str,
        day: i64,
    ) -> Result<crate::budget::Spend, StoreError> {
        dispatch!(self.spent_on(owner, day).await)
    }

    /// The keys of the threads with a non-empty queue.
    pub async fn queued_threads(&self) -> Result<Vec<String>, StoreError> {
        dispatch!(self.queued_threads().await)
    }

    /// Cuts thread `thread_id`'s transcript from its message `first_cut` on (a rewind;
    /// `None` cuts nothing) and lets its agent session go: the next turn starts a new one,
    /// given the kept transcript (the metadata says `{"session": {"id": null, "how":
    /// "rewound"}}`).
    pub fn rewind(&self, thread_id: &str, first_cut: Option<&str>, now: i64) {
        dispatch!(self.rewind(thread_id, first_cut, now))
    }

    /// Binds a thread to an agent session; `how` (new, loaded, ...) goes into metadata.
    pub fn set_session(&self, thread_id: &str, session_id: &str, how: &str, now: i64) {
        dispatch!(self.set_session(thread_id, session_id, how, now))
    }

    /// Sets a thread's title.
    pub fn set_title(&self, thread_id: &str, title: &str, now: i64) {
        dispatch!(self.set_title(thread_id, title, now))
    }

    /// Archives a thread or takes it out of the archive.
    pub fn set_archived(&self, thread_id: &str, archived: bool, now: i64) {
        dispatch!(self.set_archived(thread_id, archived, now))
    }

    /// Keeps a thread's shared state document (read back by [`Store::load_thread`]).
    pub fn set_state(&self, thread_id: &str, state: &Value) {
        dispatch!(self.set_state(thread_id, state))
    }

    /// Sets a thread's status (`idle|running|suspended`).
    pub fn set_status(&self, thread_id: &str, status: &str, now: i64) {
        dispatch!(self.set_status(thread_id, status, now, None))
    }

    /// Marks the runs of thread `id` that a process left live (no outcome) `interrupted`,
    /// ending now, and the thread idle; returns how many runs.
    pub async fn recover_thread(&self, id: &str) -> Result<usize, StoreError> {
        dispatch!(self.recover_thread(id).await)
    }

    /// One thread's metadata.
    pub async fn thread(&self, id: &str) -> Result<Option<ThreadRow>, StoreError> {
        dispatch!(self.thread(id).await)
    }

    /// Threads, newest activity first: of `agent` if given, of `scope`'s owner if it names
    /// one, of `scope`'s agents if it limits them.
    pub async fn list_threads(
        &self,
        limit: usize,
        cursor: Option<(i64, String)>,
        agent: Option<String>,
        scope: ListScope,
    ) -> Result<ThreadPage, StoreError> {
        dispatch!(self.list_threads(limit, cursor, agent, scope).await)
    }

    /// The last `limit` messages of a thread (in order) and whether older ones were left out;
    /// `None` for an unknown thread.
    pub async fn messages(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        dispatch!(self.messages(id, limit).await)
    }

    /// Deletes a thread with its messages and runs; `false` when it did not exist.
    pub async fn delete_thread(&self, id: &str) -> Result<bool, StoreError> {
        dispatch!(self.delete_thread(id, None).await)
    }
}

/// Encodes a listing position as an opaque cursor.
pub fn encode_cursor(updated_at: i64, id: &str) -> String {
    crate::hex::encode(format!("{updated_at}:{id}").as_bytes())
}

/// Longest cursor accepted: room for any accepted thread id, so that every page of a
/// listing has a `nextCursor` that is accepted back.
const MAX_CURSOR_LEN: usize = 2048;
const _: () = assert!(
    2 * ("-9223372036854775808:".len() + crate::access::MAX_PRINCIPAL_BYTES + 1 + MAX_ID_BYTES)
        <= MAX_CURSOR_LEN
);

/// Decodes a cursor made by [`encode_cursor`]; `None` when malformed.
pub fn decode_cursor(cursor: &str) -> Option<(i64, String)> {
    if cursor.len() > MAX_CURSOR_LEN {
        return None;
    }
    let raw = String::from_utf8(crate::hex::decode(cursor)?).ok()?;
    let (time, id) = raw.split_once(':')?;
    Some((time.parse().ok()?, id.to_owned()))
}

fn now_ms() -> i64 {
    crate::clock::now_ms() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = encode_cursor(123, "a:b");
        assert_eq!(decode_cursor(&c), Some((123, "a:b".to_owned())));
        for bad in ["", "zz", "abc", "3a"] {
            assert!(decode_cursor(bad).is_none(), "{bad}");
        }
    }
}
