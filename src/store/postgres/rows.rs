//! PostgreSQL's reads and writes of rows that several operations share: a thread's row
//! with its message count and last run, a page of the listing, the transcript's appends.

use tokio_postgres::Row;

use super::conn::{Conn, Param};
use crate::protocol::Message;
use crate::store::{ListScope, RunRow, StoreError, ThreadPage, ThreadRow};

/// A thread's row with its message count and last run; one query.
macro_rules! thread_select {
    () => {
        "SELECT t.id, t.agent, t.session_id, t.title, t.created_at, t.updated_at, t.status,
                t.metadata, (SELECT COUNT(*) FROM messages m WHERE m.thread_id = t.id),
                r.id, r.started_at, r.ended_at, r.segments, r.outcome, t.archived
         FROM threads t LEFT JOIN LATERAL (
             SELECT id, started_at, ended_at, segments, outcome FROM runs
             WHERE runs.thread_id = t.id ORDER BY started_at DESC, ord DESC LIMIT 1
         ) r ON TRUE"
    };
}

/// The page of threads after `cursor`, newest activity first: of `agent` if given, of
/// `scope`'s owner if it names one, of `scope`'s agents if it limits them.
pub(super) async fn list_page(
    conn: &Conn,
    limit: usize,
    cursor: Option<(i64, String)>,
    agent: Option<String>,
    scope: ListScope,
) -> Result<ThreadPage, StoreError> {
    let (after_time, after_id) = cursor.unwrap_or((i64::MAX, String::new()));
    let unbounded = after_time == i64::MAX;
    let rows = conn
        .query(
            concat!(
                thread_select!(),
                " WHERE ($1::text IS NULL OR t.agent = $1)
                    AND ($6::text IS NULL OR t.owner = $6)
                    AND ($7::text[] IS NULL OR t.agent = ANY($7::text[]))
                    AND ($8 OR NOT t.archived)
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
                &scope.archived,
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
}

/// Appends `messages` to thread `key`'s transcript; the inserts are pipelined (each takes
/// the next sequence number in turn; a message already there keeps its place and gets the
/// new body).
pub(super) async fn append_messages(
    conn: &Conn,
    key: &str,
    messages: &[Message],
) -> Result<(), StoreError> {
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

/// Thread `key`'s row, with its message count and last run.
pub(super) async fn thread_row(conn: &Conn, key: &str) -> Result<Option<ThreadRow>, StoreError> {
    conn.query_opt(concat!(thread_select!(), " WHERE t.id = $1"), &[&key])
        .await?
        .as_ref()
        .map(thread_from)
        .transpose()
}

/// A row of [`thread_select!`] as a thread.
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
        key: crate::access::ThreadKey::stored(key),
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
        archived: r.try_get(14)?,
        last_run,
    })
}

/// Cuts thread `key`'s transcript from its message `first_cut` on and lets its session go
/// (see `Store::rewind`); the job's transaction holds both.
pub(super) async fn rewind(
    conn: &Conn,
    key: &str,
    first_cut: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM messages WHERE thread_id = $1 AND seq >=
             (SELECT seq FROM messages WHERE thread_id = $1 AND id = $2)",
        &[&key, &first_cut],
    )
    .await?;
    conn.execute(
        "UPDATE threads SET session_id = NULL, metadata = $2, updated_at = $3 WHERE id = $1",
        &[&key, &crate::store::REWOUND_METADATA, &now],
    )
    .await?;
    Ok(())
}
