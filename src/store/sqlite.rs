//! The embedded backend: SQLite in `<data-dir>/agui-serve.db`, WAL mode; the only code
//! that touches rusqlite, on tokio's blocking pool, one batch at a time.
//!
//! Migrations are the numbered files in `migrations/`, embedded at build time and tracked
//! with `PRAGMA user_version` (`schema.rs`). Every operation is a job in one FIFO, run in
//! order by the store's runner (`runner.rs`) on tokio's blocking pool (no tokio worker ever
//! waits on SQLite); the runner holds the connection while it runs. An answer means
//! durable against a killed process (WAL, `synchronous = NORMAL`). The WAL is checkpointed
//! by a second thread on its own connection, so a commit never waits behind a
//! checkpoint's fsync. One node, no leases: nothing is fenced.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::oneshot;

use super::known::KnownThreads;
use super::runner::{self, Database, Ended, Reply, Runner};
use super::{
    Attempt, Claims, EndpointSummary, ListScope, OutboxRow, OutboxStatus, Outgoing, QueuedRow,
    StoreError, StoredThread, ThreadPage, ThreadRow, now_ms,
};
use crate::metrics::StoreMetrics;
use crate::protocol::Message;

mod outbox;
mod queue;
mod rows;
mod schedules;
mod schema;
mod wal;
use rows::{append_messages, list_sql, thread_row};
use schema::{known_threads, make_private, prepare, recover};
use wal::{WAL_FRAME_HEADER, WAL_LIMIT, note_wal, spawn_checkpointer};

type Job = Box<dyn FnOnce(&mut Connection) -> Option<Reply> + Send>;

/// Handle to the store: a FIFO of jobs, drained in batches by at most one runner at a time
/// on tokio's blocking pool (the runner holds the connection while it runs).
#[derive(Clone)]
pub(super) struct SqliteStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// The jobs, the connection while no runner holds it, and how far the runner has got.
    runner: Runner<Job, Connection>,
    runtime: tokio::runtime::Handle,
    /// Stops the checkpoint thread when the last handle goes.
    _checkpointer: mpsc::Sender<()>,
    /// Held by whichever connection checkpoints: SQLite refuses a checkpoint while another
    /// one runs (SQLITE_BUSY at once, without the busy handler), so the runner waits here.
    checkpointing: Arc<Mutex<()>>,
    /// The bytes one frame of the WAL takes (the page and its header).
    frame: u64,
    /// The log's length after the last batch, and the most one batch has added to it.
    last_wal: AtomicU64,
    largest_batch: AtomicU64,
    /// The threads the database may hold (see `known.rs`).
    known: KnownThreads,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database in `data_dir`, migrates it, and marks runs
    /// left live by a previous process as interrupted.
    pub(super) fn open(data_dir: &Path) -> Result<SqliteStore, StoreError> {
        let path = data_dir.join("agui-serve.db");
        make_private(&path).map_err(|source| StoreError::Private {
            path: path.clone(),
            source,
        })?;
        let mut conn = Connection::open(&path).map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        prepare(&mut conn)?;
        let interrupted = recover(&mut conn)?;
        // Claims of the previous process: it is gone, so its rows are due again.
        outbox::clear_claims(&conn)?;
        let known = known_threads(&conn)?;
        if interrupted > 0 {
            tracing::info!(
                runs = interrupted,
                "runs cut by the previous process marked interrupted"
            );
        }
        // Checkpoints happen on their own thread (below), never inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // After the pragma, which replaces any WAL hook: each commit says how long the log is.
        conn.wal_hook(Some(note_wal));
        let page: u64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        // The log's file is not cut when the log restarts (see `wal`): it stays at most the
        // bound, and is written over.
        conn.pragma_update(None, "journal_size_limit", WAL_LIMIT as i64)?;
        conn.set_prepared_statement_cache_capacity(64);
        let checkpointing = Arc::new(Mutex::new(()));
        let checkpointer = spawn_checkpointer(&path, checkpointing.clone())?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StoreError::NoRuntime)?;
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                runner: Runner::new(conn),
                runtime,
                _checkpointer: checkpointer,
                checkpointing,
                frame: WAL_FRAME_HEADER + page,
                last_wal: AtomicU64::new(0),
                largest_batch: AtomicU64::new(0),
                known,
            }),
        })
    }

    /// Runs `f` in the store and waits for its result.
    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R, rusqlite::Error> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (tx, rx) = oneshot::channel();
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                let result = f(conn);
                Some(Box::new(move |committed: bool| {
                    let _ = tx.send(match result {
                        Ok(_) if !committed => Err(StoreError::Commit),
                        Ok(value) => Ok(value),
                        Err(error) => Err(StoreError::from(error)),
                    });
                }) as Reply)
            }),
        );
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` in the store without waiting; failures are logged.
    fn enqueue(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<(), rusqlite::Error> + Send + 'static,
    ) {
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                if let Err(error) = f(conn) {
                    tracing::error!(%error, op = what, "store write failed");
                }
                None
            }),
        );
    }

    /// Waits until every write enqueued before this call is durable. It adds no job: it
    /// waits for the batch that holds the last queued job to commit.
    pub(super) async fn commit(&self) -> Result<(), StoreError> {
        self.shared.runner.commit().await
    }

    /// The commit latency and failure counters.
    pub(super) fn metrics(&self) -> &StoreMetrics {
        self.shared.runner.metrics()
    }

    /// Jobs queued and not yet committed (the one running included).
    pub(super) fn queue_depth(&self) -> u64 {
        self.shared.runner.queue_depth()
    }

    /// A thread and its transcript, if it exists.
    pub(super) async fn load_thread(&self, id: &str) -> Result<Option<StoredThread>, StoreError> {
        if !self.shared.known.may_hold(id) {
            // A thread nobody has used: no read needed to say so.
            return Ok(None);
        }
        let id = id.to_owned();
        self.call(move |conn| {
            let Some(row) = thread_row(conn, &id)? else {
                return Ok(None);
            };
            let mut stmt =
                conn.prepare_cached("SELECT body FROM messages WHERE thread_id = ?1 ORDER BY seq")?;
            let transcript = stmt
                .query_map([&id], |r| r.get::<_, String>(0))?
                .filter_map(|body| match body {
                    Ok(body) => match serde_json::from_str::<Message>(&body) {
                        Ok(message) => Some(Ok(message)),
                        Err(error) => {
                            tracing::warn!(%error, thread.id = %id, "stored message unreadable; skipped");
                            None
                        }
                    },
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let state: Option<String> = conn
                .prepare_cached("SELECT state FROM threads WHERE id = ?1")?
                .query_row([&id], |r| r.get(0))?;
            let queue = conn
                .prepare_cached(
                    "SELECT id, seq, capped, input, created_at, budget FROM run_queue
                     WHERE thread_id = ?1 ORDER BY seq",
                )?
                .query_map([&id], |r| {
                    Ok(QueuedRow {
                        id: r.get(0)?,
                        seq: r.get(1)?,
                        capped: r.get(2)?,
                        input: r.get(3)?,
                        created_at: r.get(4)?,
                        budget: super::claim_of(r.get(5)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(StoredThread {
                row,
                transcript,
                state: super::read_state(&id, state),
                queue,
            }))
        })
        .await
    }

    /// Records the start of a run: creates the thread if new, appends `messages`, inserts
    /// the run, marks the thread running; writes `outgoing` with it if this creates the
    /// thread.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_run_start(
        &self,
        thread_id: &str,
        agent: &str,
        title: Option<String>,
        run_id: &str,
        messages: Vec<Message>,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        self.shared.known.add(thread_id);
        let (thread_id, agent, run_id) =
            (thread_id.to_owned(), agent.to_owned(), run_id.to_owned());
        self.enqueue("run_start", move |conn| {
            let tx = conn.savepoint()?;
            let creates = outgoing.is_some()
                && tx
                    .prepare_cached("SELECT 1 FROM threads WHERE id = ?1")?
                    .query_row([&thread_id], |_| Ok(()))
                    .optional()?
                    .is_none();
            tx.prepare_cached(
                "INSERT INTO threads (id, owner, agent, title, created_at, updated_at, status)
                 VALUES (?1, ?5, ?2, ?3, ?4, ?4, 'running')
                 ON CONFLICT (id) DO UPDATE SET status = 'running', updated_at = ?4,
                     title = COALESCE(threads.title, excluded.title)",
            )?
            .execute(params![
                thread_id,
                agent,
                title,
                now,
                crate::access::split_key(&thread_id).0
            ])?;
            append_messages(&tx, &thread_id, &messages)?;
            tx.prepare_cached(
                "INSERT INTO runs (thread_id, id, started_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (thread_id, id) DO UPDATE SET segments = runs.segments + 1,
                     ended_at = NULL, outcome = NULL",
            )?
            .execute(params![thread_id, run_id, now])?;
            if let Some(outgoing) = outgoing.as_ref().filter(|_| creates) {
                outbox::insert(&tx, outgoing)?;
            }
            tx.commit()
        });
    }

    /// Appends messages the agent completed.
    pub(super) fn record_messages(&self, thread_id: &str, messages: Vec<Message>, now: i64) {
        if messages.is_empty() {
            return;
        }
        let thread_id = thread_id.to_owned();
        self.enqueue("messages", move |conn| {
            let tx = conn.savepoint()?;
            append_messages(&tx, &thread_id, &messages)?;
            tx.prepare_cached("UPDATE threads SET updated_at = ?2 WHERE id = ?1")?
                .execute(params![thread_id, now])?;
            tx.commit()
        });
    }

    /// Records how a run ended and marks the thread `status`; writes `outgoing` with it.
    pub(super) fn record_run_end(
        &self,
        thread_id: &str,
        run_id: &str,
        outcome: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        let (thread_id, run_id, outcome, status) = (
            thread_id.to_owned(),
            run_id.to_owned(),
            outcome.to_owned(),
            status.to_owned(),
        );
        self.enqueue("run_end", move |conn| {
            let tx = conn.savepoint()?;
            tx.prepare_cached(
                "UPDATE runs SET ended_at = ?3, outcome = ?4 WHERE thread_id = ?1 AND id = ?2",
            )?
            .execute(params![thread_id, run_id, now, outcome])?;
            tx.prepare_cached("UPDATE threads SET status = ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![thread_id, status, now])?;
            if let Some(outgoing) = &outgoing {
                outbox::insert(&tx, outgoing)?;
            }
            tx.commit()
        });
    }

    /// Binds a thread to an agent session; `how` (new, loaded, ...) goes into metadata.
    pub(super) fn set_session(&self, thread_id: &str, session_id: &str, how: &str, now: i64) {
        let (thread_id, session_id) = (thread_id.to_owned(), session_id.to_owned());
        let metadata = serde_json::json!({"session": {"id": session_id, "how": how}}).to_string();
        self.enqueue("session", move |conn| {
            conn.prepare_cached(
                "UPDATE threads SET session_id = ?2, metadata = ?3, updated_at = ?4 WHERE id = ?1",
            )?
            .execute(params![thread_id, session_id, metadata, now])?;
            Ok(())
        });
    }

    pub(super) fn rewind(&self, thread_id: &str, first_cut: Option<&str>, now: i64) {
        let (thread_id, first_cut) = (thread_id.to_owned(), first_cut.map(str::to_owned));
        self.enqueue("rewind", move |conn| {
            let tx = conn.savepoint()?;
            tx.prepare_cached(
                "DELETE FROM messages WHERE thread_id = ?1 AND seq >=
                     (SELECT seq FROM messages WHERE thread_id = ?1 AND id = ?2)",
            )?
            .execute(params![thread_id, first_cut])?;
            tx.prepare_cached(
                "UPDATE threads SET session_id = NULL, metadata = ?2, updated_at = ?3
                 WHERE id = ?1",
            )?
            .execute(params![thread_id, super::REWOUND_METADATA, now])?;
            tx.commit()
        });
    }

    /// Sets a thread's title.
    pub(super) fn set_title(&self, thread_id: &str, title: &str, now: i64) {
        let (thread_id, title) = (thread_id.to_owned(), title.to_owned());
        self.enqueue("title", move |conn| {
            conn.prepare_cached("UPDATE threads SET title = ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![thread_id, title, now])?;
            Ok(())
        });
    }

    /// Archives a thread or takes it out of the archive.
    pub(super) fn set_archived(&self, thread_id: &str, archived: bool, now: i64) {
        let thread_id = thread_id.to_owned();
        self.enqueue("archived", move |conn| {
            conn.prepare_cached("UPDATE threads SET archived = ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![thread_id, archived, now])?;
            Ok(())
        });
    }

    /// Keeps a thread's state document.
    pub(super) fn set_state(&self, thread_id: &str, state: &Value) {
        let (thread_id, state) = (thread_id.to_owned(), state.to_string());
        self.enqueue("state", move |conn| {
            conn.prepare_cached("UPDATE threads SET state = ?2 WHERE id = ?1")?
                .execute(params![thread_id, state])?;
            Ok(())
        });
    }

    /// Sets a thread's status (`idle|running|suspended`); writes `outgoing` with it.
    pub(super) fn set_status(
        &self,
        thread_id: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        let (thread_id, status) = (thread_id.to_owned(), status.to_owned());
        self.enqueue("status", move |conn| {
            let tx = conn.savepoint()?;
            tx.prepare_cached("UPDATE threads SET status = ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![thread_id, status, now])?;
            if let Some(outgoing) = &outgoing {
                outbox::insert(&tx, outgoing)?;
            }
            tx.commit()
        });
    }

    /// Marks thread `id`'s runs left live (no outcome) interrupted and the thread idle;
    /// returns how many runs.
    pub(super) async fn recover_thread(&self, id: &str) -> Result<usize, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let tx = conn.savepoint()?;
            let runs = tx
                .prepare_cached(
                    "UPDATE runs SET outcome = 'interrupted', ended_at = ?2
                     WHERE thread_id = ?1 AND outcome IS NULL",
                )?
                .execute(params![id, now_ms()])?;
            tx.prepare_cached(
                "UPDATE threads SET status = 'idle' WHERE id = ?1 AND status != 'idle'",
            )?
            .execute([&id])?;
            tx.commit()?;
            Ok(runs)
        })
        .await
    }

    /// One thread's metadata.
    pub(super) async fn thread(&self, id: &str) -> Result<Option<ThreadRow>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| thread_row(conn, &id)).await
    }

    /// Threads, newest activity first: of `agent` if given, of `scope`'s owner if it names
    /// one, of `scope`'s agents if it limits them.
    pub(super) async fn list_threads(
        &self,
        limit: usize,
        cursor: Option<(i64, String)>,
        agent: Option<String>,
        scope: ListScope,
    ) -> Result<ThreadPage, StoreError> {
        self.call(move |conn| {
            let (after_time, after_id) = cursor.unwrap_or((i64::MAX, String::new()));
            let unbounded = after_time == i64::MAX;
            let agents = scope
                .agents
                .map(|agents| serde_json::Value::from(agents).to_string());
            let mut stmt = conn.prepare_cached(list_sql(scope.owner.is_some()))?;
            let ids = stmt
                .query_map(
                    params![
                        agent,
                        after_time,
                        after_id,
                        unbounded,
                        (limit + 1) as i64,
                        scope.owner,
                        agents,
                        scope.archived
                    ],
                    |r| r.get::<_, String>(0),
                )?
                .collect::<Result<Vec<_>, _>>()?;
            let mut threads = Vec::new();
            for id in ids.iter().take(limit) {
                if let Some(row) = thread_row(conn, id)? {
                    threads.push(row);
                }
            }
            Ok(ThreadPage::new(threads, ids.len() > limit))
        })
        .await
    }

    /// The last `limit` messages of a thread (in order) and whether older ones were left out;
    /// `None` for an unknown thread.
    pub(super) async fn messages(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let exists: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM threads WHERE id = ?1")?
                .query_row([&id], |r| r.get(0))
                .optional()?;
            if exists.is_none() {
                return Ok(None);
            }
            let total: i64 = conn
                .prepare_cached("SELECT COUNT(*) FROM messages WHERE thread_id = ?1")?
                .query_row([&id], |r| r.get(0))?;
            let mut stmt = conn.prepare_cached(
                "SELECT body FROM (SELECT seq, body FROM messages WHERE thread_id = ?1
                   ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )?;
            let bodies = stmt
                .query_map(params![id, limit as i64], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            let messages = bodies
                .iter()
                .filter_map(|b| serde_json::from_str::<Value>(b).ok())
                .collect();
            Ok(Some((messages, total > limit as i64)))
        })
        .await
    }

    /// Deletes a thread with its messages and runs, and writes `outgoing` when it existed;
    /// `false` when it did not.
    pub(super) async fn delete_thread(
        &self,
        id: &str,
        outgoing: Option<Outgoing>,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let tx = conn.savepoint()?;
            tx.prepare_cached("DELETE FROM messages WHERE thread_id = ?1")?
                .execute([&id])?;
            tx.prepare_cached("DELETE FROM runs WHERE thread_id = ?1")?
                .execute([&id])?;
            tx.prepare_cached("DELETE FROM run_queue WHERE thread_id = ?1")?
                .execute([&id])?;
            let n = tx
                .prepare_cached("DELETE FROM threads WHERE id = ?1")?
                .execute([&id])?;
            if n > 0
                && let Some(outgoing) = &outgoing
            {
                outbox::insert(&tx, outgoing)?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    /// Writes `outgoing` on its own.
    pub(super) fn add_outgoing(&self, outgoing: Outgoing) {
        self.enqueue("outgoing", move |conn| {
            let tx = conn.savepoint()?;
            outbox::insert(&tx, &outgoing)?;
            tx.commit()
        });
    }

    pub(super) async fn claim_outgoing(
        &self,
        endpoint: &str,
        node: &str,
        limit: usize,
        claim_ms: i64,
    ) -> Result<Claims, StoreError> {
        let (endpoint, node) = (endpoint.to_owned(), node.to_owned());
        self.call(move |conn| outbox::claim(conn, &endpoint, &node, limit, claim_ms))
            .await
    }

    pub(super) async fn record_attempts(
        &self,
        node: &str,
        attempts: Vec<Attempt>,
    ) -> Result<(), StoreError> {
        let node = node.to_owned();
        self.call(move |conn| {
            let tx = conn.savepoint()?;
            outbox::record(&tx, &node, &attempts)?;
            tx.commit()
        })
        .await
    }

    pub(super) async fn outbox_summary(&self) -> Result<Vec<EndpointSummary>, StoreError> {
        self.call(|conn| outbox::summary(conn)).await
    }

    pub(super) async fn outbox_rows(
        &self,
        status: OutboxStatus,
        endpoint: Option<String>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.call(move |conn| outbox::rows(conn, status, endpoint.as_deref(), limit))
            .await
    }

    pub(super) async fn prune_outbox(&self, before: i64) -> Result<u64, StoreError> {
        self.call(move |conn| outbox::prune(conn, before)).await
    }
}

impl Database for Shared {
    type Conn = Connection;
    type Job = Job;

    fn runner(&self) -> &Runner<Job, Connection> {
        &self.runner
    }

    fn start(self: Arc<Self>, conn: Connection) {
        let runtime = self.runtime.clone();
        // The runner runs on the blocking pool, driven by `block_on`: every step of a
        // SQLite batch is synchronous, so its futures never wait. Blocking-pool work also
        // keeps a paused test clock from jumping while a caller waits on the store.
        self.runtime
            .clone()
            .spawn_blocking(move || runtime.block_on(runner::drain(&*self, conn)));
    }

    async fn run_batch(&self, conn: &mut Connection, jobs: Vec<Job>) -> Ended {
        run_batch(conn, jobs)
    }

    async fn after_batch(&self, conn: &mut Connection) {
        self.bound_wal(conn);
    }
}

/// Runs `batch` in one transaction (each job takes its own savepoint) and ends it: whether
/// it committed, and the jobs' answers.
fn run_batch(conn: &mut Connection, batch: Vec<Job>) -> Ended {
    let began = conn.execute_batch("BEGIN IMMEDIATE");
    if let Err(error) = &began {
        tracing::error!(%error, "store transaction could not begin; running jobs one by one");
    }
    let replies: Vec<Reply> = batch
        .into_iter()
        .filter_map(|job| {
            // A job that panics loses only its own answer (its caller sees the store as
            // closed); the connection and the batch go on.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(conn))).unwrap_or_else(
                |_| {
                    tracing::error!("a store job panicked");
                    None
                },
            )
        })
        .collect();
    let committed = match began {
        Ok(()) => match conn.execute_batch("COMMIT") {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, jobs = replies.len(), "store commit failed");
                let _ = conn.execute_batch("ROLLBACK");
                false
            }
        },
        // Without the outer transaction each savepoint committed on its own.
        Err(_) => true,
    };
    Ended { committed, replies }
}

#[cfg(test)]
mod tests;
