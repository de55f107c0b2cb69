//! Queued input and the budgets' spending on SQLite: the rows each thread's queue keeps and
//! each principal's day adds up.

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::store::{QueuedRow, StoreError};

impl SqliteStore {
    pub(in crate::store) fn queue_put(&self, thread_id: &str, item: &QueuedRow) {
        let (thread_id, item) = (thread_id.to_owned(), item.clone());
        self.enqueue("queue_put", move |conn| {
            conn.prepare_cached(
                "INSERT INTO run_queue (thread_id, id, seq, capped, input, created_at, budget)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (thread_id, id) DO UPDATE SET input = excluded.input",
            )?
            .execute(params![
                thread_id,
                item.id,
                item.seq,
                item.capped,
                item.input,
                item.created_at,
                crate::store::claim_text(item.budget.as_ref())
            ])?;
            Ok(())
        });
    }

    pub(in crate::store) fn queue_remove(&self, thread_id: &str, id: &str) {
        let (thread_id, id) = (thread_id.to_owned(), id.to_owned());
        self.enqueue("queue_remove", move |conn| {
            conn.prepare_cached("DELETE FROM run_queue WHERE thread_id = ?1 AND id = ?2")?
                .execute([&thread_id, &id])?;
            Ok(())
        });
    }

    pub(in crate::store) fn add_spend(&self, owner: &str, day: i64, spend: &crate::budget::Spend) {
        let (owner, spend) = (owner.to_owned(), *spend);
        self.enqueue("add_spend", move |conn| {
            conn.prepare_cached(
                "INSERT INTO budget_days (owner, day, tokens, wall_time_ms, tool_calls)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (owner, day) DO UPDATE SET
                     tokens = tokens + excluded.tokens,
                     wall_time_ms = wall_time_ms + excluded.wall_time_ms,
                     tool_calls = tool_calls + excluded.tool_calls",
            )?
            .execute(params![
                owner,
                day,
                spend.tokens as i64,
                spend.wall_time_ms as i64,
                spend.tool_calls as i64
            ])?;
            Ok(())
        });
    }

    pub(in crate::store) async fn spent_on(
        &self,
        owner: &str,
        day: i64,
    ) -> Result<crate::budget::Spend, StoreError> {
        let owner = owner.to_owned();
        self.call(move |conn| {
            conn.prepare_cached(
                "SELECT tokens, wall_time_ms, tool_calls FROM budget_days
                 WHERE owner = ?1 AND day = ?2",
            )?
            .query_row(params![owner, day], |r| {
                Ok(crate::budget::Spend {
                    tokens: r.get::<_, i64>(0)? as u64,
                    wall_time_ms: r.get::<_, i64>(1)? as u64,
                    tool_calls: r.get::<_, i64>(2)? as u64,
                })
            })
            .optional()
            .map(Option::unwrap_or_default)
        })
        .await
    }

    pub(in crate::store) async fn queued_threads(&self) -> Result<Vec<String>, StoreError> {
        self.call(|conn| {
            conn.prepare_cached("SELECT DISTINCT thread_id FROM run_queue ORDER BY thread_id")?
                .query_map([], |r| r.get(0))?
                .collect()
        })
        .await
    }
}
