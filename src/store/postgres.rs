//! The cluster backend: a PostgreSQL database shared by every node, through `tokio-postgres`
//! without TLS (a local socket, or a TLS proxy next to the node).
//!
//! The store's runner (`runner.rs`), a task on the runtime, holds one connection and drains
//! the FIFO of jobs in batches of up to 512, each batch in one transaction and each job in
//! its own savepoint (a failing job is rolled back to it and undoes only itself), and
//! answers the jobs' callers after `COMMIT` (group commit). Reads go through the same FIFO
//! on the same connection: a read queued after a write sees it without a second connection
//! or a barrier, and its answer, like a write's, waits for its batch's commit. Within a
//! job, statements that do not depend on each other are pipelined. When the connection is
//! found closed before a batch, the runner connects again (one attempt per batch; a batch
//! on a dead connection fails and is counted so).
//!
//! Migrations are the files in `migrations/postgres/`, embedded, tracked in
//! `schema_migrations`; each runs in its own transaction under a transaction-scoped
//! advisory lock, so nodes starting together against an empty database migrate it once
//! (`conn.rs`). Connecting recovers nothing: other nodes may be running their threads; a
//! thread's cut runs are recovered by [`Store::recover_thread`](super::Store::recover_thread)
//! once this node holds its lease.
//!
//! Fencing ([`Fence`]): every write for a thread is stamped, when queued, with the epoch of
//! this node's lease on it; with no lease it is refused without reaching the database. In
//! its savepoint the job first locks its lease row `FOR SHARE` if the row is still this
//! node's, with that epoch, and unexpired by the database's clock (`agui_now_ms()`), so a
//! takeover (which updates the row) waits for the batch to commit. No such row: the job is
//! rolled back to its savepoint, the thread is marked lost in the fence, and the rest of
//! the batch commits (a refusal is not a failed batch). Deletes are not fenced.
//!
//! The connection string is never logged nor put in an error: it may hold a password.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_postgres::Config;

use super::runner::{self, Database, Ended, Reply, Runner};
use super::{
    Attempt, Claims, EndpointSummary, Fence, ListScope, OutboxRow, OutboxStatus, Outgoing,
    QueuedRow, StoreError, StoredThread, ThreadPage, ThreadRow, now_ms,
};
use crate::metrics::StoreMetrics;
use crate::protocol::Message;

mod conn;
mod outbox;
mod queue;
mod rows;
mod schedules;
use conn::{Conn, migrate, parse};
use rows::{append_messages, list_page, thread_row};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Job = Box<dyn FnOnce(Arc<Conn>) -> BoxFuture<Done> + Send>;

/// How a job ended: whether its savepoint is kept, and its caller's answer.
struct Done {
    keep: bool,
    reply: Option<Reply>,
}

/// Handle to the PostgreSQL store: the FIFO its runner drains.
#[derive(Clone)]
pub(super) struct PgStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// The jobs, the connection while no runner holds it, and how far the runner has got.
    runner: Runner<Job, Arc<Conn>>,
    runtime: tokio::runtime::Handle,
    /// Where to connect again when the connection is found closed.
    config: Config,
    fence: Fence,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgStore")
    }
}

impl PgStore {
    /// Connects and migrates; the runner starts with the first job.
    pub(super) async fn connect(url: &str, fence: Fence) -> Result<PgStore, StoreError> {
        let config = parse(url)?;
        let conn = Conn::open(&config).await.map_err(StoreError::PgConnect)?;
        migrate(&conn.client).await?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StoreError::NoRuntime)?;
        Ok(PgStore {
            shared: Arc::new(Shared {
                runner: Runner::new(Arc::new(conn)),
                runtime,
                config,
                fence,
            }),
        })
    }

    /// Runs `f` in the store and waits for its result (after its batch's commit).
    async fn call<R, F, Fut>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, StoreError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                Box::pin(async move {
                    let result = f(conn).await;
                    Done {
                        keep: result.is_ok(),
                        reply: Some(Box::new(move |committed: bool| {
                            let _ = tx.send(match result {
                                Ok(_) if !committed => Err(StoreError::Commit),
                                other => other,
                            });
                        })),
                    }
                })
            }),
        );
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues a write for thread `key` without waiting, fenced by this node's lease on it;
    /// failures and refusals are logged.
    fn write<F, Fut>(&self, what: &'static str, key: &str, f: F)
    where
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let fence = self.shared.fence.clone();
        let Some(epoch) = fence.epoch(key) else {
            // Not held, hence already lost for the fence.
            tracing::error!(op = what, thread.id = %key, "thread write refused: no lease held");
            return;
        };
        let key = key.to_owned();
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                Box::pin(async move {
                    let keep = match check_lease(&conn, &fence, &key, epoch).await {
                        Ok(()) => match f(conn).await {
                            Ok(()) => true,
                            Err(error) => {
                                tracing::error!(%error, op = what, "store write failed");
                                false
                            }
                        },
                        Err(StoreError::LeaseLost) => {
                            tracing::warn!(op = what, thread.id = %key, epoch, "thread write refused: lease lost");
                            false
                        }
                        Err(error) => {
                            tracing::error!(%error, op = what, "store write failed");
                            false
                        }
                    };
                    Done { keep, reply: None }
                })
            }),
        );
    }

    pub(super) async fn commit(&self) -> Result<(), StoreError> {
        self.shared.runner.commit().await
    }

    pub(super) fn metrics(&self) -> &StoreMetrics {
        self.shared.runner.metrics()
    }

    pub(super) fn queue_depth(&self) -> u64 {
        self.shared.runner.queue_depth()
    }

    pub(super) async fn load_thread(&self, id: &str) -> Result<Option<StoredThread>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| async move {
            let Some(row) = thread_row(&conn, &id).await? else {
                return Ok(None);
            };
            let bodies = conn
                .query(
                    "SELECT body FROM messages WHERE thread_id = $1 ORDER BY seq",
                    &[&id],
                )
                .await?;
            let mut transcript = Vec::with_capacity(bodies.len());
            for body in bodies {
                match serde_json::from_str::<Message>(body.try_get(0)?) {
                    Ok(message) => transcript.push(message),
                    Err(error) => {
                        tracing::warn!(%error, thread.id = %id, "stored message unreadable; skipped");
                    }
                }
            }
            let state: Option<String> = match conn
                .query_opt("SELECT state FROM threads WHERE id = $1", &[&id])
                .await?
            {
                Some(row) => row.try_get(0)?,
                None => None,
            };
            let queue = conn
                .query(
                    "SELECT id, seq, capped, input, created_at, budget FROM run_queue
                     WHERE thread_id = $1 ORDER BY seq",
                    &[&id],
                )
                .await?
                .iter()
                .map(|r| {
                    Ok(QueuedRow {
                        id: r.try_get(0)?,
                        seq: r.try_get(1)?,
                        capped: r.try_get(2)?,
                        input: r.try_get(3)?,
                        created_at: r.try_get(4)?,
                        budget: super::claim_of(r.try_get(5)?),
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            Ok(Some(StoredThread {
                row,
                transcript,
                state: super::read_state(&id, state),
                queue,
            }))
        })
        .await
    }

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
        let (key, agent, run_id) = (thread_id.to_owned(), agent.to_owned(), run_id.to_owned());
        self.write("run_start", thread_id, move |conn| async move {
            let owner = crate::access::split_key(&key).0;
            let creates = match &outgoing {
                Some(_) => conn
                    .query_opt("SELECT 1 FROM threads WHERE id = $1", &[&key])
                    .await?
                    .is_none(),
                None => false,
            };
            conn.execute(
                "INSERT INTO threads (id, owner, agent, title, created_at, updated_at, status)
                 VALUES ($1, $5, $2, $3, $4, $4, 'running')
                 ON CONFLICT (id) DO UPDATE SET status = 'running', updated_at = $4,
                     title = COALESCE(threads.title, excluded.title)",
                &[&key, &agent, &title, &now, &owner],
            )
            .await?;
            append_messages(&conn, &key, &messages).await?;
            conn.execute(
                "INSERT INTO runs (thread_id, id, started_at) VALUES ($1, $2, $3)
                 ON CONFLICT (thread_id, id) DO UPDATE SET segments = runs.segments + 1,
                     ended_at = NULL, outcome = NULL",
                &[&key, &run_id, &now],
            )
            .await?;
            if let Some(outgoing) = outgoing.as_ref().filter(|_| creates) {
                outbox::insert(&conn, outgoing).await?;
            }
            Ok(())
        });
    }

    pub(super) fn record_messages(&self, thread_id: &str, messages: Vec<Message>, now: i64) {
        if messages.is_empty() {
            return;
        }
        let key = thread_id.to_owned();
        self.write("messages", thread_id, move |conn| async move {
            append_messages(&conn, &key, &messages).await?;
            conn.execute(
                "UPDATE threads SET updated_at = $2 WHERE id = $1",
                &[&key, &now],
            )
            .await?;
            Ok(())
        });
    }

    pub(super) fn record_run_end(
        &self,
        thread_id: &str,
        run_id: &str,
        outcome: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        let (key, run_id, outcome, status) = (
            thread_id.to_owned(),
            run_id.to_owned(),
            outcome.to_owned(),
            status.to_owned(),
        );
        self.write("run_end", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE runs SET ended_at = $3, outcome = $4 WHERE thread_id = $1 AND id = $2",
                &[&key, &run_id, &now, &outcome],
            )
            .await?;
            conn.execute(
                "UPDATE threads SET status = $2, updated_at = $3 WHERE id = $1",
                &[&key, &status, &now],
            )
            .await?;
            if let Some(outgoing) = &outgoing {
                outbox::insert(&conn, outgoing).await?;
            }
            Ok(())
        });
    }

    pub(super) fn set_session(&self, thread_id: &str, session_id: &str, how: &str, now: i64) {
        let (key, session_id) = (thread_id.to_owned(), session_id.to_owned());
        let metadata = serde_json::json!({"session": {"id": session_id, "how": how}}).to_string();
        self.write("session", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET session_id = $2, metadata = $3, updated_at = $4 WHERE id = $1",
                &[&key, &session_id, &metadata, &now],
            )
            .await?;
            Ok(())
        });
    }

    pub(super) fn rewind(&self, thread_id: &str, first_cut: Option<&str>, now: i64) {
        let (key, first_cut) = (thread_id.to_owned(), first_cut.map(str::to_owned));
        self.write("rewind", thread_id, move |conn| async move {
            rows::rewind(&conn, &key, first_cut.as_deref(), now).await
        });
    }

    pub(super) fn set_title(&self, thread_id: &str, title: &str, now: i64) {
        let (key, title) = (thread_id.to_owned(), title.to_owned());
        self.write("title", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET title = $2, updated_at = $3 WHERE id = $1",
                &[&key, &title, &now],
            )
            .await?;
            Ok(())
        });
    }

    pub(super) fn set_archived(&self, thread_id: &str, archived: bool, now: i64) {
        let key = thread_id.to_owned();
        self.write("archived", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET archived = $2, updated_at = $3 WHERE id = $1",
                &[&key, &archived, &now],
            )
            .await?;
            Ok(())
        });
    }

    pub(super) fn set_state(&self, thread_id: &str, state: &Value) {
        let (key, state) = (thread_id.to_owned(), state.to_string());
        self.write("state", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET state = $2 WHERE id = $1",
                &[&key, &state],
            )
            .await?;
            Ok(())
        });
    }

    pub(super) fn set_status(
        &self,
        thread_id: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        let (key, status) = (thread_id.to_owned(), status.to_owned());
        self.write("status", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET status = $2, updated_at = $3 WHERE id = $1",
                &[&key, &status, &now],
            )
            .await?;
            if let Some(outgoing) = &outgoing {
                outbox::insert(&conn, outgoing).await?;
            }
            Ok(())
        });
    }

    /// The epoch this node's lease on `key` is held with, for a fenced call.
    fn held_epoch(&self, key: &str) -> Result<i64, StoreError> {
        self.shared.fence.epoch(key).ok_or(StoreError::LeaseLost)
    }

    pub(super) async fn recover_thread(&self, id: &str) -> Result<usize, StoreError> {
        let id = id.to_owned();
        let (fence, epoch) = (self.shared.fence.clone(), self.held_epoch(&id)?);
        self.call(move |conn| async move {
            check_lease(&conn, &fence, &id, epoch).await?;
            let runs = conn
                .execute(
                    "UPDATE runs SET outcome = 'interrupted', ended_at = $2
                     WHERE thread_id = $1 AND outcome IS NULL",
                    &[&id, &now_ms()],
                )
                .await?;
            conn.execute(
                "UPDATE threads SET status = 'idle' WHERE id = $1 AND status <> 'idle'",
                &[&id],
            )
            .await?;
            Ok(runs as usize)
        })
        .await
    }

    pub(super) async fn thread(&self, id: &str) -> Result<Option<ThreadRow>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| async move { thread_row(&conn, &id).await })
            .await
    }

    pub(super) async fn list_threads(
        &self,
        limit: usize,
        cursor: Option<(i64, String)>,
        agent: Option<String>,
        scope: ListScope,
    ) -> Result<ThreadPage, StoreError> {
        self.call(move |conn| async move { list_page(&conn, limit, cursor, agent, scope).await })
            .await
    }

    pub(super) async fn messages(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| async move {
            let Some(total) = conn
                .query_opt(
                    "SELECT (SELECT COUNT(*) FROM messages WHERE thread_id = $1)
                     FROM threads WHERE id = $1",
                    &[&id],
                )
                .await?
            else {
                return Ok(None);
            };
            let total: i64 = total.try_get(0)?;
            let rows = conn
                .query(
                    "SELECT body FROM (SELECT seq, body FROM messages WHERE thread_id = $1
                       ORDER BY seq DESC LIMIT $2) AS last ORDER BY seq",
                    &[&id, &(limit as i64)],
                )
                .await?;
            let mut messages = Vec::with_capacity(rows.len());
            for row in &rows {
                if let Ok(message) = serde_json::from_str::<Value>(row.try_get(0)?) {
                    messages.push(message);
                }
            }
            Ok(Some((messages, total > limit as i64)))
        })
        .await
    }

    pub(super) async fn delete_thread(
        &self,
        id: &str,
        outgoing: Option<Outgoing>,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        let (fence, epoch) = (self.shared.fence.clone(), self.held_epoch(&id)?);
        self.call(move |conn| async move {
            check_lease(&conn, &fence, &id, epoch).await?;
            // Its messages and runs go with it (ON DELETE CASCADE).
            let n = conn
                .execute("DELETE FROM threads WHERE id = $1", &[&id])
                .await?;
            if n > 0
                && let Some(outgoing) = &outgoing
            {
                outbox::insert(&conn, outgoing).await?;
            }
            Ok(n > 0)
        })
        .await
    }

    /// Writes `outgoing` on its own: fenced by this node's lease when it is about a thread
    /// this node holds, else (a principal's event) as it is.
    pub(super) fn add_outgoing(&self, outgoing: Outgoing) {
        let key = outgoing.thread.clone();
        if self.shared.fence.epoch(&key).is_some() {
            self.write("outgoing", &key, move |conn| async move {
                outbox::insert(&conn, &outgoing).await
            });
            return;
        }
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                Box::pin(async move {
                    let keep = match outbox::insert(&conn, &outgoing).await {
                        Ok(()) => true,
                        Err(error) => {
                            tracing::error!(%error, op = "outgoing", "store write failed");
                            false
                        }
                    };
                    Done { keep, reply: None }
                })
            }),
        );
    }

    pub(super) async fn claim_outgoing(
        &self,
        endpoint: &str,
        node: &str,
        limit: usize,
        claim_ms: i64,
    ) -> Result<Claims, StoreError> {
        let (endpoint, node) = (endpoint.to_owned(), node.to_owned());
        self.call(move |conn| async move {
            outbox::claim(&conn, &endpoint, &node, limit, claim_ms).await
        })
        .await
    }

    pub(super) async fn record_attempts(
        &self,
        node: &str,
        attempts: Vec<Attempt>,
    ) -> Result<(), StoreError> {
        let node = node.to_owned();
        self.call(move |conn| async move { outbox::record(&conn, &node, &attempts).await })
            .await
    }

    pub(super) async fn outbox_summary(&self) -> Result<Vec<EndpointSummary>, StoreError> {
        self.call(|conn| async move { outbox::summary(&conn).await })
            .await
    }

    pub(super) async fn outbox_rows(
        &self,
        status: OutboxStatus,
        endpoint: Option<String>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.call(move |conn| async move {
            outbox::rows(&conn, status, endpoint.as_deref(), limit).await
        })
        .await
    }

    pub(super) async fn prune_outbox(&self, before: i64) -> Result<u64, StoreError> {
        self.call(move |conn| async move { outbox::prune(&conn, before).await })
            .await
    }
}

/// Refuses (and marks lost) unless this node still holds `key`'s lease with `epoch`,
/// unexpired; the row stays locked `FOR SHARE` until the batch commits, so a takeover
/// waits for it.
async fn check_lease(conn: &Conn, fence: &Fence, key: &str, epoch: i64) -> Result<(), StoreError> {
    let leased = conn
        .query_opt(
            "SELECT 1 FROM leases WHERE thread_key = $1 AND node = $2 AND epoch = $3
               AND expires_at > agui_now_ms() FOR SHARE",
            &[&key, &fence.node(), &epoch],
        )
        .await?;
    if leased.is_none() {
        fence.mark_lost(key, epoch);
        return Err(StoreError::LeaseLost);
    }
    Ok(())
}

impl Database for Shared {
    type Conn = Arc<Conn>;
    type Job = Job;

    fn runner(&self) -> &Runner<Job, Arc<Conn>> {
        &self.runner
    }

    fn start(self: Arc<Self>, conn: Arc<Conn>) {
        self.runtime
            .clone()
            .spawn(async move { runner::drain(&*self, conn).await });
    }

    async fn before_batch(&self, conn: &mut Arc<Conn>) {
        if conn.client.is_closed() {
            match Conn::open(&self.config).await {
                Ok(fresh) => {
                    tracing::info!("reconnected to PostgreSQL");
                    *conn = Arc::new(fresh);
                }
                Err(error) => tracing::error!(%error, "cannot reconnect to PostgreSQL"),
            }
        }
    }

    async fn run_batch(&self, conn: &mut Arc<Conn>, jobs: Vec<Job>) -> Ended {
        run_batch(conn, jobs).await
    }
}

/// Runs `batch` in one transaction, each job in its own savepoint, and ends it: whether it
/// committed, and the jobs' answers.
async fn run_batch(conn: &Arc<Conn>, batch: Vec<Job>) -> Ended {
    let client = &conn.client;
    // One savepoint name, set again after each job: releasing it and taking the next is
    // one round trip; a job rolled back to it leaves it in place for the next.
    let mut open = match client.batch_execute("BEGIN; SAVEPOINT job").await {
        Ok(()) => true,
        Err(error) => {
            tracing::error!(%error, "store transaction could not begin");
            false
        }
    };
    let mut replies = Vec::new();
    for job in batch {
        // A job that panics loses only its own answer (its caller sees the store as
        // closed) and is rolled back; the batch goes on.
        let done = AssertUnwindSafe(job(conn.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                tracing::error!("a store job panicked");
                Done {
                    keep: false,
                    reply: None,
                }
            });
        replies.extend(done.reply);
        if open {
            let next = if done.keep {
                "RELEASE SAVEPOINT job; SAVEPOINT job"
            } else {
                "ROLLBACK TO SAVEPOINT job"
            };
            if let Err(error) = client.batch_execute(next).await {
                tracing::error!(%error, "store savepoint failed");
                open = false;
            }
        }
    }
    let committed = open
        && match client.batch_execute("COMMIT").await {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, jobs = replies.len(), "store commit failed");
                false
            }
        };
    if !committed {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    Ended { committed, replies }
}
