//! SQLite's reads and writes of rows that several operations share: a thread's row with
//! its last run, the transcript's appends, and the listing's query.

use rusqlite::{Connection, OptionalExtension, params};

use crate::protocol::Message;
use crate::store::{RunRow, ThreadRow};

/// The thread listing's query: one owner's threads through its index, or everyone's (the
/// operator's listing) in order of activity. Parameters: agent, cursor time, cursor id,
/// unbounded, limit, owner, agents (JSON).
pub(super) fn list_sql(one_owner: bool) -> &'static str {
    macro_rules! listing {
        ($owner:literal) => {
            concat!(
                "SELECT id FROM threads WHERE ",
                $owner,
                " AND (?1 IS NULL OR agent = ?1)
                  AND (?7 IS NULL OR agent IN (SELECT value FROM json_each(?7)))
                  AND (?8 OR archived = 0)
                  AND (?4 OR updated_at < ?2 OR (updated_at = ?2 AND id < ?3))
                ORDER BY updated_at DESC, id DESC
                LIMIT ?5"
            )
        };
    }
    if one_owner {
        listing!("owner = ?6")
    } else {
        listing!("?6 IS NULL")
    }
}

/// Appends `messages` to thread `thread_id`'s transcript (a message already there keeps
/// its place and gets the new body).
pub(super) fn append_messages(
    tx: &Connection,
    thread_id: &str,
    messages: &[Message],
) -> Result<(), rusqlite::Error> {
    let mut next: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE thread_id = ?1")?
        .query_row([thread_id], |r| r.get(0))?;
    let mut stmt = tx.prepare_cached(
        "INSERT INTO messages (thread_id, seq, id, role, body) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (thread_id, id) DO UPDATE SET body = excluded.body",
    )?;
    for message in messages {
        let body = serde_json::to_string(message)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        let changed = stmt.execute(params![thread_id, next, message.id(), message.role(), body])?;
        if changed > 0 {
            next += 1;
        }
    }
    Ok(())
}

/// Thread `id`'s row, with its message count and last run.
pub(super) fn thread_row(
    conn: &Connection,
    id: &str,
) -> Result<Option<ThreadRow>, rusqlite::Error> {
    let row = conn
        .prepare_cached(
            "SELECT id, agent, session_id, title, created_at, updated_at, status, metadata,
                    (SELECT COUNT(*) FROM messages m WHERE m.thread_id = threads.id), archived
             FROM threads WHERE id = ?1",
        )?
        .query_row([id], |r| {
            let key: String = r.get(0)?;
            let (owner, id) = crate::access::split_key(&key);
            Ok(ThreadRow {
                id: id.to_owned(),
                owner: owner.to_owned(),
                key: crate::access::ThreadKey::stored(key.clone()),
                agent: r.get(1)?,
                session_id: r.get(2)?,
                title: r.get(3)?,
                created_at: r.get(4)?,
                updated_at: r.get(5)?,
                status: r.get(6)?,
                metadata: r
                    .get::<_, Option<String>>(7)?
                    .and_then(|m| serde_json::from_str(&m).ok()),
                message_count: r.get(8)?,
                archived: r.get(9)?,
                last_run: None,
            })
        })
        .optional()?;
    let Some(mut row) = row else {
        return Ok(None);
    };
    row.last_run = conn
        .prepare_cached(
            "SELECT id, started_at, ended_at, segments, outcome FROM runs
             WHERE thread_id = ?1 ORDER BY started_at DESC, rowid DESC LIMIT 1",
        )?
        .query_row([id], |r| {
            Ok(RunRow {
                id: r.get(0)?,
                started_at: r.get(1)?,
                ended_at: r.get(2)?,
                segments: r.get(3)?,
                outcome: r.get(4)?,
            })
        })
        .optional()?;
    Ok(Some(row))
}
