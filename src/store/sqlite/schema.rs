//! The SQLite database at open: its file's mode, its settings, its migrations, the runs a
//! previous process left live, and the threads it holds.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::store::StoreError;
use crate::store::known::KnownThreads;

/// The embedded migrations, in order. `user_version` = number applied.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/0001_init.sql"),
    include_str!("../../../migrations/0002_owners.sql"),
    include_str!("../../../migrations/0003_lean_threads.sql"),
    include_str!("../../../migrations/0004_thread_state.sql"),
    include_str!("../../../migrations/0005_thread_archived.sql"),
    include_str!("../../../migrations/0006_run_queue.sql"),
    include_str!("../../../migrations/0007_budget_days.sql"),
    include_str!("../../../migrations/0008_webhook_outbox.sql"),
    include_str!("../../../migrations/0009_schedules.sql"),
    include_str!("../../../migrations/0010_claims.sql"),
];

/// Creates the database file readable and writable by this user only (0600), whatever the
/// umask, and makes an existing one and its `-wal` / `-shm` files so. SQLite creates the
/// `-wal` and `-shm` files with the database file's mode.
pub(super) fn make_private(db: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(db)?;
    for suffix in ["", "-wal", "-shm"] {
        let path = sibling(db, suffix);
        match std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

/// `db`'s file with `suffix` appended to its name (SQLite's `-wal` and `-shm`).
pub(super) fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

pub(super) fn prepare(conn: &mut Connection) -> Result<(), StoreError> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Savepoints and sorts keep their scratch in memory, not in temporary files.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > MIGRATIONS.len() as i64 {
        return Err(StoreError::TooNew(version));
    }
    // Migrations run with foreign keys off, so that one may rebuild a table others refer to
    // (dropping it would otherwise cascade to them); one that leaves a reference dangling
    // is rolled back.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let dangling = |conn: &Connection| {
        conn.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
            r.get::<_, i64>(0)
        })
    };
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        let before = dangling(&tx)?;
        tx.execute_batch(sql)?;
        if dangling(&tx)? > before {
            return Err(StoreError::Migration(i + 1));
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
        tracing::info!(version = i + 1, "database migrated");
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

/// The filter of the threads `conn`'s database holds, with room for twice as many (one
/// read of every id, at open).
pub(super) fn known_threads(conn: &Connection) -> Result<KnownThreads, StoreError> {
    let count: i64 = conn.query_row("SELECT COUNT(*) FROM threads", [], |r| r.get(0))?;
    let known = KnownThreads::with_capacity(usize::try_from(count).unwrap_or(0) * 2);
    let mut stmt = conn.prepare("SELECT id FROM threads")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        known.add(&row.get::<_, String>(0)?);
    }
    Ok(known)
}

/// Marks runs and threads a previous process left live; returns how many runs.
pub(super) fn recover(conn: &mut Connection) -> Result<usize, StoreError> {
    let now = crate::store::now_ms();
    let tx = conn.transaction()?;
    let runs = tx.execute(
        "UPDATE runs SET outcome = 'interrupted', ended_at = ?1 WHERE outcome IS NULL",
        [now],
    )?;
    tx.execute(
        "UPDATE threads SET status = 'idle' WHERE status != 'idle'",
        [],
    )?;
    tx.commit()?;
    Ok(runs)
}
