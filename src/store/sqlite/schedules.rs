//! SQLite's schedules (`store/schedules.rs`): one table, each call one job in the FIFO; the
//! claim's compare-and-set is a conditional `UPDATE` whose changed-row count is the answer.

use rusqlite::{Connection, Row, params};

use super::SqliteStore;
use crate::store::StoreError;
use crate::store::schedules::{LastFiring, Missed, Occurrence, ScheduleRow};

/// The columns [`schedule_row`] reads, in its order.
const COLUMNS: &str = "id, owner, name, agent, cron, timezone, thread_id, messages, created_at,
    next_fire, last_fire, last_run_id, last_thread_id, last_status, last_error, missed_count,
    missed_first, missed_last, budget";

impl SqliteStore {
    pub(in crate::store) async fn insert_schedule(
        &self,
        row: ScheduleRow,
        cap: usize,
    ) -> Result<bool, StoreError> {
        let messages = row.messages.to_string();
        self.call(move |conn| {
            // The count and the insert in one statement: parallel creates cannot pass the
            // cap between them.
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO schedules (id, owner, name, agent, cron, timezone, thread_id,
                         messages, created_at, next_fire, budget)
                     SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?12
                     WHERE (SELECT COUNT(*) FROM schedules WHERE owner = ?2) < ?11",
                )?
                .execute(params![
                    row.id,
                    row.owner,
                    row.name,
                    row.agent,
                    row.cron,
                    row.timezone,
                    row.thread_id,
                    messages,
                    row.created_at,
                    row.next_fire,
                    cap as i64,
                    crate::store::claim_text(row.budget.as_ref())
                ])?;
            Ok(inserted == 1)
        })
        .await
    }

    pub(in crate::store) async fn schedules(
        &self,
        owner: Option<String>,
    ) -> Result<Vec<ScheduleRow>, StoreError> {
        self.call(move |conn| {
            // One owner's through its index; everyone's for the operator.
            let filter = match owner {
                Some(_) => "owner = ?1",
                None => "?1 IS NULL",
            };
            let sql =
                format!("SELECT {COLUMNS} FROM schedules WHERE {filter} ORDER BY created_at, id");
            query(conn, &sql, params![owner])
        })
        .await
    }

    pub(in crate::store) async fn delete_schedule(
        &self,
        id: String,
        owner: Option<String>,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let n = conn
                .prepare_cached(
                    "DELETE FROM schedules WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
                )?
                .execute(params![id, owner])?;
            Ok(n > 0)
        })
        .await
    }

    pub(in crate::store) async fn soonest_schedules(
        &self,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>, StoreError> {
        self.call(move |conn| {
            let sql = format!("SELECT {COLUMNS} FROM schedules ORDER BY next_fire, id LIMIT ?1");
            query(conn, &sql, params![limit as i64])
        })
        .await
    }

    pub(in crate::store) async fn claim_occurrence(
        &self,
        id: String,
        occurrence: Occurrence,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let Occurrence {
                due,
                next,
                fired,
                missed,
            } = occurrence;
            let n = conn
                .prepare_cached(
                    "UPDATE schedules SET next_fire = ?3,
                         last_fire = COALESCE(?4, last_fire),
                         last_run_id = COALESCE(?5, last_run_id),
                         last_thread_id = COALESCE(?6, last_thread_id),
                         last_status = CASE WHEN ?4 IS NULL THEN last_status ELSE 'starting' END,
                         last_error = CASE WHEN ?4 IS NULL THEN last_error ELSE NULL END,
                         missed_count = missed_count + ?7,
                         missed_first = COALESCE(missed_first, ?8),
                         missed_last = COALESCE(?9, missed_last)
                     WHERE id = ?1 AND next_fire = ?2",
                )?
                .execute(params![
                    id,
                    due,
                    next,
                    fired.as_ref().map(|f| f.at),
                    fired.as_ref().map(|f| f.run_id.as_str()),
                    fired.as_ref().map(|f| f.thread_id.as_str()),
                    missed.count,
                    missed.first,
                    missed.last
                ])?;
            Ok(n == 1)
        })
        .await
    }

    pub(in crate::store) async fn record_firing(
        &self,
        id: String,
        run_id: String,
        status: String,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.prepare_cached(
                "UPDATE schedules SET last_status = ?3, last_error = ?4
                 WHERE id = ?1 AND last_run_id = ?2",
            )?
            .execute(params![id, run_id, status, error])?;
            Ok(())
        })
        .await
    }
}

/// The rows `sql` (selecting [`COLUMNS`]) finds.
fn query(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<ScheduleRow>, rusqlite::Error> {
    let mut stmt = conn.prepare_cached(sql)?;
    stmt.query_map(params, schedule_row)?.collect()
}

/// A row of [`COLUMNS`].
fn schedule_row(r: &Row<'_>) -> Result<ScheduleRow, rusqlite::Error> {
    let messages: String = r.get(7)?;
    let last = match (
        r.get::<_, Option<i64>>(10)?,
        r.get::<_, Option<String>>(11)?,
        r.get::<_, Option<String>>(12)?,
    ) {
        (Some(at), Some(run_id), Some(thread_id)) => Some(LastFiring {
            at,
            run_id,
            thread_id,
            status: r.get::<_, Option<String>>(13)?.unwrap_or_default(),
            error: r.get(14)?,
        }),
        _ => None,
    };
    Ok(ScheduleRow {
        id: r.get(0)?,
        owner: r.get(1)?,
        name: r.get(2)?,
        agent: r.get(3)?,
        cron: r.get(4)?,
        timezone: r.get(5)?,
        thread_id: r.get(6)?,
        messages: serde_json::from_str(&messages).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(7, rusqlite::types::Type::Text, Box::new(e))
        })?,
        created_at: r.get(8)?,
        next_fire: r.get(9)?,
        last,
        missed: Missed {
            count: r.get(15)?,
            first: r.get(16)?,
            last: r.get(17)?,
        },
        budget: crate::store::claim_of(r.get(18)?),
    })
}
