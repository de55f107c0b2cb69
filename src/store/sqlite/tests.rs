//! The embedded store's own tests: its migrations, its indexes, its filter of known
//! threads, recovery at open, and the WAL's bound.

use super::schema::MIGRATIONS;
use super::*;
use crate::protocol::input::{Content, UserMessage};
use std::path::PathBuf;

use crate::store::Store;

fn user(id: &str, text: &str) -> Message {
    Message::User(UserMessage {
        id: id.into(),
        content: Content::Text(text.into()),
        name: None,
    })
}

/// A fresh data directory, removed when the test is done with it.
struct Temp(PathBuf);

impl std::ops::Deref for Temp {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp() -> Temp {
    let dir = std::env::temp_dir().join(format!("agui-store-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    Temp(dir)
}

/// A database written by a build before the lean threads table (schema 2) keeps every
/// thread, message and run through the migration: rebuilding `threads` cascades to
/// nothing.
#[tokio::test]
async fn the_lean_threads_migration_keeps_every_row() {
    let dir = temp();
    {
        let conn = Connection::open(dir.join("agui-serve.db")).expect("open");
        conn.pragma_update(None, "foreign_keys", "ON").expect("fk");
        for sql in &MIGRATIONS[..2] {
            conn.execute_batch(sql).expect("migrate");
        }
        conn.pragma_update(None, "user_version", 2)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO threads (id, owner, agent, title, created_at, updated_at, status)
                 VALUES ('alice/t', 'alice', 'demo', 'hi', 1, 5, 'idle');
             INSERT INTO messages (thread_id, seq, id, role, body)
                 VALUES ('alice/t', 1, 'u', 'user', '{\"id\":\"u\",\"role\":\"user\",\"content\":\"hi\"}');
             INSERT INTO runs (thread_id, id, started_at, ended_at, outcome)
                 VALUES ('alice/t', 'r', 2, 5, 'finished');",
        )
        .expect("rows");
    }
    let store = Store::open(&dir).expect("migrated");
    let row = store.thread("alice/t").await.expect("read").expect("kept");
    assert_eq!((row.message_count, row.title.as_deref()), (1, Some("hi")));
    assert_eq!(
        row.last_run.expect("run").outcome.as_deref(),
        Some("finished")
    );
    let scope = ListScope {
        owner: Some("alice".into()),
        agents: None,
        archived: false,
    };
    let page = store
        .list_threads(10, None, None, scope)
        .await
        .expect("list");
    assert_eq!(page.threads.len(), 1);
    // Foreign keys hold again after the migration: deleting cascades.
    assert!(store.delete_thread("alice/t").await.expect("delete"));
    let conn = Connection::open(dir.join("agui-serve.db")).expect("open");
    let left: i64 = conn
        .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))
        .expect("count");
    assert_eq!(left, 0);
}

/// One principal's listing reads its own threads through the owner index, not every
/// thread in order of activity.
#[test]
fn an_owners_listing_uses_the_owner_index() {
    let mut conn = Connection::open_in_memory().expect("open");
    prepare(&mut conn).expect("schema");
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {}", list_sql(true)))
        .expect("plan")
        .query_map(
            params![
                None::<String>,
                0,
                "",
                true,
                10,
                "alice",
                None::<String>,
                false
            ],
            |r| r.get::<_, String>(3),
        )
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("plan");
    assert!(
        plan.iter().any(|step| step.contains("threads_by_owner")),
        "{plan:?}"
    );
}

/// A thread the database holds loads, after a restart too; loading one it has never
/// held queues no read.
#[tokio::test]
async fn only_threads_the_database_may_hold_are_read() {
    let dir = temp();
    {
        let store = SqliteStore::open(&dir).expect("open");
        store.record_run_start("t", "demo", None, "r", vec![user("u", "x")], 1, None);
        store.commit().await.expect("commit");
        assert!(store.load_thread("t").await.expect("load").is_some());
    }
    let store = SqliteStore::open(&dir).expect("reopen");
    let queued = store.shared.runner.last();
    assert!(store.load_thread("never").await.expect("load").is_none());
    assert_eq!(store.shared.runner.last(), queued, "a read was queued");
    let loaded = store.load_thread("t").await.expect("load").expect("held");
    assert_eq!(loaded.transcript.len(), 1);
    assert_eq!(store.shared.runner.last(), queued + 1);
}

#[tokio::test]
async fn reopening_marks_live_runs_interrupted_and_keeps_the_schema() {
    let dir = temp();
    {
        let store = Store::open(&dir).expect("open");
        store.record_run_start("t", "demo", None, "r", vec![user("u", "x")], 1);
        store.flush().await.expect("flush");
    }
    let store = Store::open(&dir).expect("reopen");
    let row = store.thread("t").await.expect("read").expect("exists");
    assert_eq!(row.status, "idle");
    assert_eq!(
        row.last_run.expect("run").outcome.as_deref(),
        Some("interrupted")
    );
}

/// Back-to-back runs never leave the background checkpoint a moment with the WAL fully
/// copied, so without a bound it would grow for as long as they come (and stay that
/// size). The bound holds across 5,000 of them, each committed before the next; the log
/// restarts over its file rather than cutting it (a cut file is extended again, a page
/// at a time, by the commits that follow).
#[tokio::test]
async fn the_wal_stays_bounded_across_back_to_back_runs() {
    let dir = temp();
    let store = Store::open(&dir).expect("open");
    let wal = dir.join("agui-serve.db-wal");
    let size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let text = "a few words of an answer ".repeat(80);
    let (mut peak, mut written, mut restarts) = (0, 0, 0);
    let (mut log, mut file) = (0, 0);
    for i in 0..5_000 {
        let thread = format!("t{}", i % 50);
        let now = i as i64;
        store.record_run_start(
            &thread,
            "demo",
            None,
            &format!("r{i}"),
            vec![user(&format!("u{i}"), &text)],
            now,
        );
        store.record_messages(&thread, vec![user(&format!("a{i}"), &text)], now);
        store.record_run_end(&thread, &format!("r{i}"), "finished", "idle", now);
        store.commit().await.expect("commit");
        // The log's length as of this commit (the frames since it last restarted).
        let now_log = store.metrics().wal_bytes();
        if now_log < log {
            restarts += 1;
            written += now_log;
        } else {
            written += now_log - log;
        }
        log = now_log;
        let now_file = size();
        assert!(
            now_file >= file,
            "the WAL's file was cut from {file} to {now_file} bytes"
        );
        file = now_file;
        peak = peak.max(now_file).max(now_log);
    }
    // The WAL did carry more than the bound, restarting on the way (or the test proves
    // nothing) ...
    assert!(written > 2 * WAL_LIMIT, "wrote only {written} bytes of WAL");
    assert!(restarts >= 2, "the log restarted {restarts} times");
    // ... and never passed it: it restarts while another batch still fits.
    assert!(peak <= WAL_LIMIT, "the WAL reached {peak} bytes");
    assert!(log > 0 && log <= peak, "the gauge says {log}");
}
