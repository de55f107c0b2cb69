//! The WAL's bound: a thread that checkpoints it on a connection of its own, so a commit
//! never waits behind a checkpoint's fsync, and the runner's restart of the log when
//! back-to-back commits leave the background checkpoint no moment to restart it.
//!
//! The log's file is not cut short while the store is open (`journal_size_limit` is the
//! bound itself): a restarted log is written over the file's blocks, which the page cache
//! still holds. A truncated file is extended again by the next commits, a page at a time
//! (new blocks, new cache pages zeroed): under sustained back-to-back short runs,
//! restarting the log instead took 0.87x to 0.95x the daemon's CPU per run
//! (docs/benchmark.md). At close the checkpoint thread truncates it.

use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::Connection;

use super::Shared;
use crate::store::StoreError;
use crate::sync::lock;

/// How often the checkpoint thread folds the WAL back into the database.
pub(super) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// The WAL's bound. The background checkpoint copies frames without blocking a commit, but
/// under back-to-back commits it never finds the log fully copied, and SQLite restarts
/// the log only then; so a runner that finds the log longer than this, between two
/// batches, checkpoints it and restarts it itself (the batches queued meanwhile wait for
/// that one fsync of the database, the only one a commit ever waits for). The log's file
/// never grows past it either.
pub(super) const WAL_LIMIT: u64 = 64 << 20;

impl Shared {
    /// When the log (as the batch's commit reported it) has no room left under
    /// [`WAL_LIMIT`] for another batch as large as the largest so far, copies the rest of
    /// the log into the database and restarts it (the next commit writes from the file's
    /// start): so the log stays under the bound, not a batch past it. No transaction is
    /// open, and this runner is the only writer, so the checkpoint completes (after the
    /// background one's, if that is running). A batch that wrote nothing leaves the log as
    /// it was.
    pub(super) fn bound_wal(&self, conn: &Connection) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(frames) = WAL_FRAMES.take() else {
            return;
        };
        let mut wal = WAL_HEADER + u64::from(frames) * self.frame;
        let grew = wal.saturating_sub(self.last_wal.swap(wal, Relaxed));
        // (At most half the bound: one huge batch does not make every later one checkpoint.)
        let room = self
            .largest_batch
            .fetch_max(grew, Relaxed)
            .max(grew)
            .min(WAL_LIMIT / 2);
        if wal + room > WAL_LIMIT {
            let _checkpointing = lock(&self.checkpointing);
            match conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0)) {
                Ok(0) => {
                    tracing::debug!(bytes = wal, "WAL restarted");
                    wal = 0;
                    self.last_wal.store(0, Relaxed);
                }
                // The next batch's commit reports the log again, and it is retried.
                Ok(_) => tracing::warn!(bytes = wal, "WAL checkpoint was blocked; it is retried"),
                Err(error) => tracing::warn!(%error, bytes = wal, "WAL checkpoint failed"),
            }
        }
        self.runner.metrics().wal(wal);
    }
}

/// The WAL's header, and each frame's header before its page (SQLite's file format).
pub(super) const WAL_HEADER: u64 = 32;
pub(super) const WAL_FRAME_HEADER: u64 = 24;

thread_local! {
    /// The frames in the WAL after the last commit on this thread's connection, until
    /// [`Shared::bound_wal`] takes them: the runner commits and bounds on one thread.
    static WAL_FRAMES: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// SQLite's WAL hook: a commit left `frames` frames in the log (no file to measure).
pub(super) fn note_wal(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.set(Some(u32::try_from(frames).unwrap_or(0)));
    Ok(())
}

/// Starts the thread that checkpoints the WAL on a connection of its own, so commits on
/// the runner never waits for the checkpoint's fsync. It stops when the returned
/// sender is dropped.
pub(super) fn spawn_checkpointer(
    path: &Path,
    checkpointing: Arc<Mutex<()>>,
) -> Result<mpsc::Sender<()>, StoreError> {
    let conn = Connection::open(path).map_err(|source| StoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("agui-checkpoint".to_owned())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY)
            {
                let _checkpointing = lock(&checkpointing);
                if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                {
                    tracing::warn!(%error, "WAL checkpoint failed");
                }
            }
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        })
        .map_err(StoreError::Thread)?;
    Ok(stop)
}
