//! Queued input and the budgets' spending on PostgreSQL: the rows each thread's queue keeps and
//! each principal's day adds up.

use super::{Done, PgStore};
use crate::store::runner;
use crate::store::{QueuedRow, StoreError};

impl PgStore {
    pub(in crate::store) fn queue_put(&self, thread_id: &str, item: &QueuedRow) {
        let (key, item) = (thread_id.to_owned(), item.clone());
        self.write("queue_put", thread_id, move |conn| async move {
            conn.execute(
                "INSERT INTO run_queue (thread_id, id, seq, capped, input, created_at, budget)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (thread_id, id) DO UPDATE SET input = excluded.input",
                &[
                    &key,
                    &item.id,
                    &item.seq,
                    &item.capped,
                    &item.input,
                    &item.created_at,
                    &crate::store::claim_text(item.budget.as_ref()),
                ],
            )
            .await?;
            Ok(())
        });
    }

    pub(in crate::store) fn queue_remove(&self, thread_id: &str, id: &str) {
        let (key, id) = (thread_id.to_owned(), id.to_owned());
        self.write("queue_remove", thread_id, move |conn| async move {
            conn.execute(
                "DELETE FROM run_queue WHERE thread_id = $1 AND id = $2",
                &[&key, &id],
            )
            .await?;
            Ok(())
        });
    }

    /// Not fenced: a principal's day is no thread's, and an addition never undoes another
    /// node's.
    pub(in crate::store) fn add_spend(&self, owner: &str, day: i64, spend: &crate::budget::Spend) {
        let (owner, spend) = (owner.to_owned(), *spend);
        runner::submit(
            &self.shared,
            Box::new(move |conn| {
                Box::pin(async move {
                    let result = conn
                        .execute(
                            "INSERT INTO budget_days (owner, day, tokens, wall_time_ms, tool_calls)
                             VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (owner, day) DO UPDATE SET
                                 tokens = budget_days.tokens + excluded.tokens,
                                 wall_time_ms = budget_days.wall_time_ms + excluded.wall_time_ms,
                                 tool_calls = budget_days.tool_calls + excluded.tool_calls",
                            &[
                                &owner,
                                &day,
                                &(spend.tokens as i64),
                                &(spend.wall_time_ms as i64),
                                &(spend.tool_calls as i64),
                            ],
                        )
                        .await;
                    if let Err(error) = &result {
                        tracing::error!(%error, op = "add_spend", "store write failed");
                    }
                    Done {
                        keep: result.is_ok(),
                        reply: None,
                    }
                })
            }),
        );
    }

    pub(in crate::store) async fn spent_on(
        &self,
        owner: &str,
        day: i64,
    ) -> Result<crate::budget::Spend, StoreError> {
        let owner = owner.to_owned();
        self.call(move |conn| async move {
            let row = conn
                .query_opt(
                    "SELECT tokens, wall_time_ms, tool_calls FROM budget_days
                     WHERE owner = $1 AND day = $2",
                    &[&owner, &day],
                )
                .await?;
            Ok(match row {
                Some(row) => crate::budget::Spend {
                    tokens: row.try_get::<_, i64>(0)? as u64,
                    wall_time_ms: row.try_get::<_, i64>(1)? as u64,
                    tool_calls: row.try_get::<_, i64>(2)? as u64,
                },
                None => crate::budget::Spend::default(),
            })
        })
        .await
    }

    pub(in crate::store) async fn queued_threads(&self) -> Result<Vec<String>, StoreError> {
        self.call(|conn| async move {
            let rows = conn
                .query(
                    "SELECT DISTINCT thread_id FROM run_queue ORDER BY thread_id",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<Vec<String>, _>>()?)
        })
        .await
    }
}
