//! The runner both backends share: group commit over one FIFO.
//!
//! Every operation is a job, numbered in FIFO order as it is queued. At most one runner
//! drains the queue at a time: it takes the jobs queued at one moment (up to [`BATCH`]),
//! has the database run them in one transaction ([`Database::run_batch`]), answers their
//! callers once that transaction has ended, counts the batch in [`StoreMetrics`] and in
//! its progress, and goes on until the queue is empty; it then parks the connection for
//! the next runner, which the next job queued starts ([`Database::start`]).
//! [`Runner::commit`] adds no job: it waits for the batch holding the last job queued, so
//! it never waits behind work queued after it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::StoreError;
use crate::metrics::StoreMetrics;
use crate::sync::lock;

/// Jobs at most in one transaction.
const BATCH: usize = 512;

/// A caller's answer, sent once its batch's transaction has ended (the flag: whether it
/// committed).
pub(super) type Reply = Box<dyn FnOnce(bool) + Send>;

/// How a batch's transaction ended, and the answers its jobs owe their callers.
pub(super) struct Ended {
    pub(super) committed: bool,
    pub(super) replies: Vec<Reply>,
}

/// A database as the runner drives it: its connection, its jobs, and how it runs a batch.
pub(super) trait Database: Send + Sync + Sized + 'static {
    /// What a runner holds while it runs.
    type Conn: Send + 'static;
    /// One queued operation.
    type Job: Send + 'static;

    /// The queue this database's jobs go through.
    fn runner(&self) -> &Runner<Self::Job, Self::Conn>;

    /// Starts a runner that runs [`drain`] on `conn`.
    fn start(self: Arc<Self>, conn: Self::Conn);

    /// Runs `jobs` in one transaction on `conn`, each in its own savepoint, and ends it.
    fn run_batch(
        &self,
        conn: &mut Self::Conn,
        jobs: Vec<Self::Job>,
    ) -> impl Future<Output = Ended> + Send;

    /// Readies `conn` for the next batch, outside the batch's timing (PostgreSQL connects
    /// again when it finds the connection closed).
    fn before_batch(&self, _conn: &mut Self::Conn) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Runs after each batch has been answered and counted, so that no caller waits on it
    /// (SQLite bounds its WAL).
    fn after_batch(&self, _conn: &mut Self::Conn) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The runner's progress through the FIFO.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Every job numbered up to this one has run, and its batch has ended.
    through: u64,
    /// Batches whose commit failed so far.
    failures: u64,
}

/// The FIFO of jobs, its numbering, and what the runner reports.
pub(super) struct Runner<J, C> {
    queue: Mutex<Queue<J, C>>,
    /// How far the runner has got: [`Runner::commit`] waits on it.
    progress: watch::Sender<Progress>,
    metrics: StoreMetrics,
}

struct Queue<J, C> {
    jobs: VecDeque<J>,
    /// The number of the last job queued (jobs are numbered from 1 in FIFO order).
    last: u64,
    /// The connection while no runner holds it; `None` while one runs.
    idle: Option<C>,
}

/// The jobs one batch runs, and the number of its last.
struct Batch<J> {
    jobs: Vec<J>,
    through: u64,
}

impl<J, C> Runner<J, C> {
    /// An empty queue, its connection parked.
    pub(super) fn new(conn: C) -> Runner<J, C> {
        Runner {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                last: 0,
                idle: Some(conn),
            }),
            progress: watch::Sender::new(Progress::default()),
            metrics: StoreMetrics::default(),
        }
    }

    /// Queues `job`; the parked connection when no runner holds it, for the caller to
    /// start one with.
    fn push(&self, job: J) -> Option<C> {
        let mut queue = lock(&self.queue);
        queue.jobs.push_back(job);
        queue.last += 1;
        queue.idle.take()
    }

    /// The next batch, with `conn` handed back; `None` when the queue is empty, and then
    /// `conn` is parked (under the same lock, so a job queued meanwhile starts a runner).
    fn next_batch(&self, conn: C) -> Option<(C, Batch<J>)> {
        let mut queue = lock(&self.queue);
        if queue.jobs.is_empty() {
            queue.idle = Some(conn);
            return None;
        }
        let n = queue.jobs.len().min(BATCH);
        let through = queue.last - (queue.jobs.len() - n) as u64;
        let jobs = queue.jobs.drain(..n).collect();
        Some((conn, Batch { jobs, through }))
    }

    /// Counts a batch that ended in `took` through job `through`.
    fn ended(&self, through: u64, took: Duration, committed: bool) {
        self.metrics.batch(took, committed);
        self.progress.send_modify(|p| {
            p.through = through;
            if !committed {
                p.failures += 1;
            }
        });
    }

    /// The number of the last job queued.
    pub(super) fn last(&self) -> u64 {
        lock(&self.queue).last
    }

    /// Waits until the batch holding the last job queued before this call has ended; an
    /// error when a batch failed to commit meanwhile. The failures are counted before the
    /// last job is read, so no failure of that batch is missed.
    pub(super) async fn commit(&self) -> Result<(), StoreError> {
        let mut progress = self.progress.subscribe();
        let before = progress.borrow().failures;
        let target = self.last();
        let reached = progress
            .wait_for(|p| p.through >= target)
            .await
            .map_err(|_| StoreError::Closed)?;
        if reached.failures > before {
            return Err(StoreError::Commit);
        }
        Ok(())
    }

    /// The commit latency and failure counters.
    pub(super) fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }

    /// Jobs queued and not yet committed (the one running included).
    pub(super) fn queue_depth(&self) -> u64 {
        let last = self.last();
        last.saturating_sub(self.progress.borrow().through)
    }
}

/// Queues `job` in `db`'s FIFO; starts a runner when none is running.
pub(super) fn submit<D: Database>(db: &Arc<D>, job: D::Job) {
    if let Some(conn) = db.runner().push(job) {
        db.clone().start(conn);
    }
}

/// The runner: runs the queued jobs in batches until the queue is empty, then parks the
/// connection.
pub(super) async fn drain<D: Database>(db: &D, mut conn: D::Conn) {
    let runner = db.runner();
    while let Some((held, batch)) = runner.next_batch(conn) {
        conn = held;
        db.before_batch(&mut conn).await;
        let began = Instant::now();
        let ended = db.run_batch(&mut conn, batch.jobs).await;
        for reply in ended.replies {
            reply(ended.committed);
        }
        runner.ended(batch.through, began.elapsed(), ended.committed);
        db.after_batch(&mut conn).await;
    }
}
