//! PostgreSQL's schedules (`store/schedules.rs`), shared by every node and not fenced (a
//! schedule is no thread's). The claim is a conditional `UPDATE`: a second node's update of
//! the same row waits for the first one's batch to commit, then finds `next_fire` moved on
//! and changes nothing, so exactly one node's claim of an occurrence answers `true`.

use tokio_postgres::Row;

use super::PgStore;
use crate::store::StoreError;
use crate::store::schedules::{LastFiring, Missed, Occurrence, ScheduleRow};

/// The columns [`schedule_row`] reads, in its order.
macro_rules! schedule_select {
    () => {
        "SELECT id, owner, name, agent, cron, timezone, thread_id, messages, created_at,
                next_fire, last_fire, last_run_id, last_thread_id, last_status, last_error,
                missed_count, missed_first, missed_last, budget
         FROM schedules"
    };
}

impl PgStore {
    pub(in crate::store) async fn insert_schedule(
        &self,
        row: ScheduleRow,
        cap: usize,
    ) -> Result<bool, StoreError> {
        let messages = row.messages.to_string();
        self.call(move |conn| async move {
            // The owner's creates one at a time, on every node, until the batch commits:
            // the count then the insert cannot be passed by another's.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('agui-schedules:' || $1, 0))",
                &[&row.owner],
            )
            .await?;
            let inserted = conn
                .execute(
                    "INSERT INTO schedules (id, owner, name, agent, cron, timezone, thread_id,
                         messages, created_at, next_fire, budget)
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $12
                     WHERE (SELECT COUNT(*) FROM schedules WHERE owner = $2) < $11",
                    &[
                        &row.id,
                        &row.owner,
                        &row.name,
                        &row.agent,
                        &row.cron,
                        &row.timezone,
                        &row.thread_id,
                        &messages,
                        &row.created_at,
                        &row.next_fire,
                        &(cap as i64),
                        &crate::store::claim_text(row.budget.as_ref()),
                    ],
                )
                .await?;
            Ok(inserted == 1)
        })
        .await
    }

    pub(in crate::store) async fn schedules(
        &self,
        owner: Option<String>,
    ) -> Result<Vec<ScheduleRow>, StoreError> {
        self.call(move |conn| async move {
            rows(
                conn.query(
                    concat!(
                        schedule_select!(),
                        " WHERE ($1::text IS NULL OR owner = $1) ORDER BY created_at, id"
                    ),
                    &[&owner],
                )
                .await?,
            )
        })
        .await
    }

    pub(in crate::store) async fn delete_schedule(
        &self,
        id: String,
        owner: Option<String>,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| async move {
            let n = conn
                .execute(
                    "DELETE FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2)",
                    &[&id, &owner],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }

    pub(in crate::store) async fn soonest_schedules(
        &self,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>, StoreError> {
        self.call(move |conn| async move {
            rows(
                conn.query(
                    concat!(schedule_select!(), " ORDER BY next_fire, id LIMIT $1"),
                    &[&(limit as i64)],
                )
                .await?,
            )
        })
        .await
    }

    pub(in crate::store) async fn claim_occurrence(
        &self,
        id: String,
        occurrence: Occurrence,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| async move {
            let Occurrence {
                due,
                next,
                fired,
                missed,
            } = occurrence;
            let at = fired.as_ref().map(|f| f.at);
            let run_id = fired.as_ref().map(|f| f.run_id.clone());
            let thread_id = fired.as_ref().map(|f| f.thread_id.clone());
            let n = conn
                .execute(
                    "UPDATE schedules SET next_fire = $3,
                         last_fire = COALESCE($4, last_fire),
                         last_run_id = COALESCE($5, last_run_id),
                         last_thread_id = COALESCE($6, last_thread_id),
                         last_status = CASE WHEN $4::bigint IS NULL THEN last_status ELSE 'starting' END,
                         last_error = CASE WHEN $4::bigint IS NULL THEN last_error ELSE NULL END,
                         missed_count = missed_count + $7,
                         missed_first = COALESCE(missed_first, $8),
                         missed_last = COALESCE($9, missed_last)
                     WHERE id = $1 AND next_fire = $2",
                    &[
                        &id,
                        &due,
                        &next,
                        &at,
                        &run_id,
                        &thread_id,
                        &missed.count,
                        &missed.first,
                        &missed.last,
                    ],
                )
                .await?;
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
        self.call(move |conn| async move {
            conn.execute(
                "UPDATE schedules SET last_status = $3, last_error = $4
                 WHERE id = $1 AND last_run_id = $2",
                &[&id, &run_id, &status, &error],
            )
            .await?;
            Ok(())
        })
        .await
    }
}

/// The schedules of `rows` (selected with `schedule_select!`).
fn rows(rows: Vec<Row>) -> Result<Vec<ScheduleRow>, StoreError> {
    rows.iter().map(schedule_row).collect()
}

fn schedule_row(r: &Row) -> Result<ScheduleRow, StoreError> {
    let messages: String = r.try_get(7)?;
    let last = match (
        r.try_get::<_, Option<i64>>(10)?,
        r.try_get::<_, Option<String>>(11)?,
        r.try_get::<_, Option<String>>(12)?,
    ) {
        (Some(at), Some(run_id), Some(thread_id)) => Some(LastFiring {
            at,
            run_id,
            thread_id,
            status: r.try_get::<_, Option<String>>(13)?.unwrap_or_default(),
            error: r.try_get(14)?,
        }),
        _ => None,
    };
    Ok(ScheduleRow {
        id: r.try_get(0)?,
        owner: r.try_get(1)?,
        name: r.try_get(2)?,
        agent: r.try_get(3)?,
        cron: r.try_get(4)?,
        timezone: r.try_get(5)?,
        thread_id: r.try_get(6)?,
        messages: serde_json::from_str(&messages).map_err(StoreError::Encode)?,
        created_at: r.try_get(8)?,
        next_fire: r.try_get(9)?,
        last,
        missed: Missed {
            count: r.try_get(15)?,
            first: r.try_get(16)?,
            last: r.try_get(17)?,
        },
        budget: crate::store::claim_of(r.try_get(18)?),
    })
}
