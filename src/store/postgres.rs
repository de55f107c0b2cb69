//! The cluster backend: a PostgreSQL database shared by every node, through `tokio-postgres`
//! without TLS (a local socket, or a TLS proxy next to the node).
//!
//! One writer task owns one connection and drains the FIFO of jobs in batches of up to 512,
//! each batch in one transaction and each job in its own savepoint (a failing job is rolled
//! back to it and undoes only itself), and answers the jobs' callers after `COMMIT` (group
//! commit). Reads go through the same FIFO on the same connection: a read queued after a
//! write sees it without a second connection or a barrier, and its answer, like a write's,
//! waits for its batch's commit. Within a job, statements that do not depend on each other
//! are pipelined. When the connection is found closed before a batch, the writer connects
//! again (one attempt per batch; a batch on a dead connection fails and is counted so).
//!
//! Migrations are the files in `migrations/postgres/`, embedded, tracked in
//! `schema_migrations`; each runs in its own transaction under a transaction-scoped
//! advisory lock, so nodes starting together against an empty database migrate it once.
//! Connecting recovers nothing: other nodes may be running their threads; a thread's cut
//! runs are recovered by [`Store::recover_thread`](super::Store::recover_thread) once this
//! node holds its lease.
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

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_postgres::config::SslMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use super::{
    Fence, ListScope, Progress, RunRow, StoreError, StoredThread, ThreadPage, ThreadRow, now_ms,
};
use crate::metrics::StoreMetrics;
use crate::protocol::Message;

/// The embedded migrations, in order; `schema_migrations` holds the versions applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_init.sql"),
    include_str!("../../migrations/postgres/0002_lease_expiry.sql"),
    include_str!("../../migrations/postgres/0003_node_certificates.sql"),
];
/// The advisory lock a migration holds for its transaction ("agui-mig").
const MIGRATION_LOCK: i64 = 0x6167_7569_2d6d_6967;
/// Jobs at most in one transaction.
const BATCH: usize = 512;
/// How long a connection attempt may take when the connection string does not say.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A thread's row with its message count and last run; one query.
macro_rules! thread_select {
    () => {
        "SELECT t.id, t.agent, t.session_id, t.title, t.created_at, t.updated_at, t.status,
                t.metadata, (SELECT COUNT(*) FROM messages m WHERE m.thread_id = t.id),
                r.id, r.started_at, r.ended_at, r.segments, r.outcome
         FROM threads t LEFT JOIN LATERAL (
             SELECT id, started_at, ended_at, segments, outcome FROM runs
             WHERE runs.thread_id = t.id ORDER BY started_at DESC, ord DESC LIMIT 1
         ) r ON TRUE"
    };
}

type Param<'a> = &'a (dyn ToSql + Sync);
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A caller's answer, sent once the batch has ended (the flag: whether it committed).
type Reply = Box<dyn FnOnce(bool) + Send>;
type Job = Box<dyn FnOnce(Arc<Conn>) -> BoxFuture<Done> + Send>;

/// How a job ended: whether its savepoint is kept, and its caller's answer.
struct Done {
    keep: bool,
    reply: Option<Reply>,
}

/// Handle to the PostgreSQL store: the sending end of the writer task's FIFO.
#[derive(Clone)]
pub(super) struct PgStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// Job numbers and the FIFO together, so that numbers follow the FIFO's order.
    queue: Mutex<Queue>,
    status: Arc<Status>,
    fence: Fence,
}

struct Queue {
    /// The number of the last job queued (jobs are numbered from 1 in FIFO order).
    last: u64,
    jobs: mpsc::UnboundedSender<(u64, Job)>,
}

/// What the writer task reports and the handles read.
struct Status {
    /// How far the writer has got: [`PgStore::commit`] waits on it.
    progress: watch::Sender<Progress>,
    metrics: StoreMetrics,
}

/// One connection and its prepared statements.
struct Conn {
    client: Client,
    statements: Mutex<HashMap<&'static str, Statement>>,
}

impl Conn {
    async fn open(config: &Config) -> Result<Conn, tokio_postgres::Error> {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::error!(%error, "PostgreSQL connection lost");
            }
        });
        Ok(Conn {
            client,
            statements: Mutex::default(),
        })
    }

    /// `sql` prepared once per connection.
    async fn prepare(&self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        let cached = self.lock().get(sql).cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await?;
        self.lock().insert(sql, statement.clone());
        Ok(statement)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Statement>> {
        // Every mutation is a single insert.
        self.statements.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn execute(&self, sql: &'static str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.execute(&statement, params).await?)
    }

    async fn query(&self, sql: &'static str, params: &[Param<'_>]) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query(&statement, params).await?)
    }

    async fn query_opt(
        &self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query_opt(&statement, params).await?)
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgStore")
    }
}

impl PgStore {
    /// Connects, migrates, and starts the writer task.
    pub(super) async fn connect(url: &str, fence: Fence) -> Result<PgStore, StoreError> {
        let config = parse(url)?;
        let conn = Conn::open(&config).await.map_err(StoreError::PgConnect)?;
        migrate(&conn.client).await?;
        let (jobs, queued) = mpsc::unbounded_channel();
        let status = Arc::new(Status {
            progress: watch::Sender::new(Progress::default()),
            metrics: StoreMetrics::default(),
        });
        tokio::spawn(write(Arc::new(conn), config, queued, status.clone()));
        Ok(PgStore {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue { last: 0, jobs }),
                status,
                fence,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every mutation of the queue is a single increment and send.
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn submit(&self, job: Job) {
        let mut queue = self.lock();
        queue.last += 1;
        let number = queue.last;
        // The writer ends only when every handle is gone.
        let _ = queue.jobs.send((number, job));
    }

    /// Runs `f` in the store and waits for its result (after its batch's commit).
    async fn call<R, F, Fut>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, StoreError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(move |conn| {
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
        }));
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
        self.submit(Box::new(move |conn| {
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
        }));
    }

    pub(super) async fn commit(&self) -> Result<(), StoreError> {
        super::wait_committed(&self.shared.status.progress, || self.lock().last).await
    }

    pub(super) fn metrics(&self) -> &StoreMetrics {
        &self.shared.status.metrics
    }

    pub(super) fn queue_depth(&self) -> u64 {
        let last = self.lock().last;
        last.saturating_sub(self.shared.status.progress.borrow().through)
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
            Ok(Some(StoredThread { row, transcript }))
        })
        .await
    }

    pub(super) fn record_run_start(
        &self,
        thread_id: &str,
        agent: &str,
        title: Option<String>,
        run_id: &str,
        messages: Vec<Message>,
        now: i64,
    ) {
        let (key, agent, run_id) = (thread_id.to_owned(), agent.to_owned(), run_id.to_owned());
        self.write("run_start", thread_id, move |conn| async move {
            let owner = crate::access::split_key(&key).0;
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

    pub(super) fn set_status(&self, thread_id: &str, status: &str, now: i64) {
        let (key, status) = (thread_id.to_owned(), status.to_owned());
        self.write("status", thread_id, move |conn| async move {
            conn.execute(
                "UPDATE threads SET status = $2, updated_at = $3 WHERE id = $1",
                &[&key, &status, &now],
            )
            .await?;
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
        self.call(move |conn| async move {
            let (after_time, after_id) = cursor.unwrap_or((i64::MAX, String::new()));
            let unbounded = after_time == i64::MAX;
            let rows = conn
                .query(
                    concat!(
                        thread_select!(),
                        " WHERE ($1::text IS NULL OR t.agent = $1)
                            AND ($6::text IS NULL OR t.owner = $6)
                            AND ($7::text[] IS NULL OR t.agent = ANY($7::text[]))
                            AND ($4 OR t.updated_at < $2 OR (t.updated_at = $2 AND t.id < $3))
                          ORDER BY t.updated_at DESC, t.id DESC
                          LIMIT $5"
                    ),
                    &[
                        &agent,
                        &after_time,
                        &after_id,
                        &unbounded,
                        &((limit + 1) as i64),
                        &scope.owner,
                        &scope.agents,
                    ],
                )
                .await?;
            let more = rows.len() > limit;
            let threads = rows
                .iter()
                .take(limit)
                .map(thread_from)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ThreadPage::new(threads, more))
        })
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

    pub(super) async fn delete_thread(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        let (fence, epoch) = (self.shared.fence.clone(), self.held_epoch(&id)?);
        self.call(move |conn| async move {
            check_lease(&conn, &fence, &id, epoch).await?;
            // Its messages and runs go with it (ON DELETE CASCADE).
            let n = conn
                .execute("DELETE FROM threads WHERE id = $1", &[&id])
                .await?;
            Ok(n > 0)
        })
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

/// Parses the connection string; refuses one that asks for TLS. Errors never quote it.
fn parse(url: &str) -> Result<Config, StoreError> {
    let mut config: Config = url.parse().map_err(|error| {
        // tokio-postgres does not know the verify modes: name them rather than "invalid".
        for mode in ["verify-ca", "verify-full"] {
            if url.contains(&format!("sslmode={mode}")) {
                return StoreError::PgTls(mode.to_owned());
            }
        }
        StoreError::PgConfig(error)
    })?;
    match config.get_ssl_mode() {
        SslMode::Disable | SslMode::Prefer => {}
        SslMode::Require => return Err(StoreError::PgTls("require".to_owned())),
        _ => return Err(StoreError::PgTls("other".to_owned())),
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("agui-serve");
    }
    // A batch never sits idle inside its transaction; one that does belongs to a process
    // that stopped (paused, cut off) while holding lease rows `FOR SHARE`: the server ends
    // that session, so a takeover does not wait on it.
    let options = format!(
        "{} -c idle_in_transaction_session_timeout=1000",
        config.get_options().unwrap_or("")
    );
    config.options(options.trim());
    Ok(config)
}

/// Applies the migrations not yet applied, each in its own transaction under the
/// migration lock.
async fn migrate(client: &Client) -> Result<(), StoreError> {
    loop {
        client.batch_execute("BEGIN").await?;
        match migrate_one(client).await {
            Ok(applied) => {
                client.batch_execute("COMMIT").await?;
                match applied {
                    Some(version) => tracing::info!(version, "database migrated"),
                    None => return Ok(()),
                }
            }
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(error);
            }
        }
    }
}

/// In a transaction: takes the migration lock and applies the next migration; which one,
/// or `None` when the schema is current.
async fn migrate_one(client: &Client) -> Result<Option<i32>, StoreError> {
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});
             CREATE TABLE IF NOT EXISTS schema_migrations (
                 version    INT PRIMARY KEY,
                 applied_at BIGINT NOT NULL  -- ms since the Unix epoch
             );"
        ))
        .await?;
    let version: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    if version as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew(version.into()));
    }
    let Some(sql) = MIGRATIONS.get(version as usize) else {
        return Ok(None);
    };
    client.batch_execute(sql).await?;
    let version = version + 1;
    client
        .execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&version, &now_ms()],
        )
        .await?;
    Ok(Some(version))
}

/// The writer task: runs queued jobs in batches until every handle is gone.
async fn write(
    mut conn: Arc<Conn>,
    config: Config,
    mut queued: mpsc::UnboundedReceiver<(u64, Job)>,
    status: Arc<Status>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = queued.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            match queued.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if conn.client.is_closed() {
            match Conn::open(&config).await {
                Ok(fresh) => {
                    tracing::info!("reconnected to PostgreSQL");
                    conn = Arc::new(fresh);
                }
                Err(error) => tracing::error!(%error, "cannot reconnect to PostgreSQL"),
            }
        }
        let through = batch.last().map_or(0, |(number, _)| *number);
        let began = std::time::Instant::now();
        let committed = run_batch(&conn, batch.drain(..).map(|(_, job)| job)).await;
        status.metrics.batch(began.elapsed(), committed);
        status.progress.send_modify(|p| {
            p.through = through;
            if !committed {
                p.failures += 1;
            }
        });
    }
}

/// Runs `batch` in one transaction, each job in its own savepoint, then answers the jobs'
/// callers with whether the transaction committed.
async fn run_batch(conn: &Arc<Conn>, batch: impl Iterator<Item = Job>) -> bool {
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
    for reply in replies {
        reply(committed);
    }
    committed
}

/// Appends `messages` to thread `key`'s transcript; the inserts are pipelined (each takes
/// the next sequence number in turn; a message already there keeps its place and gets the
/// new body).
async fn append_messages(conn: &Conn, key: &str, messages: &[Message]) -> Result<(), StoreError> {
    if messages.is_empty() {
        return Ok(());
    }
    let rows = messages
        .iter()
        .map(|m| Ok((m.id(), m.role(), serde_json::to_string(m)?)))
        .collect::<Result<Vec<_>, serde_json::Error>>()
        .map_err(StoreError::Encode)?;
    let statement = conn
        .prepare(
            "INSERT INTO messages (thread_id, seq, id, role, body)
             VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE thread_id = $1),
                     $2, $3, $4)
             ON CONFLICT (thread_id, id) DO UPDATE SET body = excluded.body",
        )
        .await?;
    let params: Vec<[Param<'_>; 4]> = rows
        .iter()
        .map(|(id, role, body)| [&key as Param<'_>, id, role, body])
        .collect();
    futures_util::future::try_join_all(params.iter().map(|p| conn.client.execute(&statement, p)))
        .await?;
    Ok(())
}

async fn thread_row(conn: &Conn, key: &str) -> Result<Option<ThreadRow>, StoreError> {
    conn.query_opt(concat!(thread_select!(), " WHERE t.id = $1"), &[&key])
        .await?
        .as_ref()
        .map(thread_from)
        .transpose()
}

fn thread_from(r: &Row) -> Result<ThreadRow, StoreError> {
    let key: String = r.try_get(0)?;
    let (owner, id) = crate::access::split_key(&key);
    let (owner, id) = (owner.to_owned(), id.to_owned());
    let last_run = match r.try_get::<_, Option<String>>(9)? {
        Some(run) => Some(RunRow {
            id: run,
            started_at: r.try_get(10)?,
            ended_at: r.try_get(11)?,
            segments: r.try_get(12)?,
            outcome: r.try_get(13)?,
        }),
        None => None,
    };
    Ok(ThreadRow {
        id,
        owner,
        key,
        agent: r.try_get(1)?,
        session_id: r.try_get(2)?,
        title: r.try_get(3)?,
        created_at: r.try_get(4)?,
        updated_at: r.try_get(5)?,
        status: r.try_get(6)?,
        metadata: r
            .try_get::<_, Option<String>>(7)?
            .and_then(|m| serde_json::from_str(&m).ok()),
        message_count: r.try_get(8)?,
        last_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_asking_for_tls_are_refused_without_quoting_them() {
        for url in [
            "postgres://u:s3cret@db/x?sslmode=require",
            "host=db user=u password=s3cret sslmode=require",
            "postgres://u:s3cret@db/x?sslmode=verify-full",
            "host=db password=s3cret sslmode=verify-ca",
        ] {
            let error = parse(url).expect_err(url);
            assert!(matches!(error, StoreError::PgTls(_)), "{url}: {error}");
            let text = error.to_string();
            assert!(
                text.contains("TLS to PostgreSQL is not supported"),
                "{text}"
            );
            assert!(!text.contains("s3cret"), "{text}");
        }
        for url in [
            "postgres://u:s3cret@db/x",
            "postgres://u:s3cret@db/x?sslmode=prefer",
            "postgres://u@%2Ftmp%2Fpg:5432/x?sslmode=disable",
            "host=/tmp/pg port=5432 user=u dbname=x",
        ] {
            parse(url).expect(url);
        }
        let error = parse("postgres://u:s3cret@db/x?bogus=1").expect_err("unknown option");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }
}
