//! The webhook outbox's SQL on PostgreSQL (`store/outbox.rs` has the contract). Nodes
//! share the table: a claim takes the due heads with `FOR UPDATE SKIP LOCKED`, so two nodes
//! claiming at once never take the same row, and times are the database's clock
//! (`agui_now_ms()`), as the leases' are.

use super::conn::Conn;
use crate::store::{
    Attempt, Claimed, Claims, EndpointSummary, OutboxRow, OutboxStatus, Outgoing, StoreError,
};

/// Writes `outgoing`'s rows (one per endpoint), inside the caller's savepoint.
pub(super) async fn insert(conn: &Conn, outgoing: &Outgoing) -> Result<(), StoreError> {
    for endpoint in &outgoing.endpoints {
        conn.execute(
            "INSERT INTO webhook_outbox (id, endpoint, thread, kind, body, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &outgoing.id,
                endpoint,
                &outgoing.thread,
                &outgoing.kind,
                &outgoing.body,
                &outgoing.created_at,
            ],
        )
        .await?;
    }
    Ok(())
}

/// Claims up to `limit` due heads of `endpoint`'s threads for `node`.
pub(super) async fn claim(
    conn: &Conn,
    endpoint: &str,
    node: &str,
    limit: usize,
    claim_ms: i64,
) -> Result<Claims, StoreError> {
    let rows = conn
        .query(
            "UPDATE webhook_outbox SET claimed_by = $1, claim_until = agui_now_ms() + $2
             WHERE seq IN (
                 SELECT o.seq FROM webhook_outbox o
                 WHERE o.endpoint = $3 AND o.delivered_at IS NULL
                   AND o.next_at <= agui_now_ms()
                   AND (o.claim_until IS NULL OR o.claim_until <= agui_now_ms())
                   AND o.seq = (SELECT MIN(p.seq) FROM webhook_outbox p
                                WHERE p.endpoint = o.endpoint AND p.thread = o.thread
                                  AND p.delivered_at IS NULL)
                 ORDER BY o.seq LIMIT $4
                 FOR UPDATE SKIP LOCKED)
             RETURNING seq, id, body, attempts",
            &[&node, &claim_ms, &endpoint, &(limit as i64)],
        )
        .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        claimed.push(Claimed {
            seq: row.try_get(0)?,
            id: row.try_get(1)?,
            body: row.try_get(2)?,
            attempts: row.try_get(3)?,
        });
    }
    claimed.sort_by_key(|row| row.seq);
    let pending: i64 = conn
        .query_opt(
            "SELECT COUNT(*) FROM webhook_outbox WHERE endpoint = $1 AND delivered_at IS NULL",
            &[&endpoint],
        )
        .await?
        .map_or(Ok(0), |row| row.try_get(0))?;
    Ok(Claims {
        rows: claimed,
        pending,
    })
}

/// Records attempts by `node`.
pub(super) async fn record(
    conn: &Conn,
    node: &str,
    attempts: &[Attempt],
) -> Result<(), StoreError> {
    for attempt in attempts {
        match &attempt.failed {
            None => {
                conn.execute(
                    "UPDATE webhook_outbox SET delivered_at = COALESCE(delivered_at, agui_now_ms()),
                         attempts = attempts + 1, last_attempt_at = agui_now_ms(),
                         claimed_by = NULL, claim_until = NULL
                     WHERE id = $1 AND endpoint = $2",
                    &[&attempt.id, &attempt.endpoint],
                )
                .await?;
            }
            Some((error, retry_ms)) => {
                conn.execute(
                    "UPDATE webhook_outbox SET attempts = attempts + 1,
                         last_attempt_at = agui_now_ms(), last_error = $3,
                         next_at = agui_now_ms() + $4, claimed_by = NULL, claim_until = NULL
                     WHERE id = $1 AND endpoint = $2 AND delivered_at IS NULL
                       AND claimed_by = $5",
                    &[&attempt.id, &attempt.endpoint, error, retry_ms, &node],
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Every endpoint's rows, summed up.
pub(super) async fn summary(conn: &Conn) -> Result<Vec<EndpointSummary>, StoreError> {
    let rows = conn
        .query(
            "SELECT endpoint,
                 SUM(CASE WHEN delivered_at IS NULL THEN 1 ELSE 0 END)::BIGINT,
                 SUM(CASE WHEN delivered_at IS NULL AND attempts > 0 THEN 1 ELSE 0 END)::BIGINT,
                 SUM(CASE WHEN delivered_at IS NULL THEN 0 ELSE 1 END)::BIGINT,
                 MIN(CASE WHEN delivered_at IS NULL THEN created_at END),
                 MAX(delivered_at)
             FROM webhook_outbox GROUP BY endpoint ORDER BY endpoint",
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let endpoint: String = row.try_get(0)?;
        let last_error = conn
            .query_opt(
                "SELECT last_error, last_attempt_at FROM webhook_outbox
                 WHERE endpoint = $1 AND last_error IS NOT NULL
                 ORDER BY last_attempt_at DESC LIMIT 1",
                &[&endpoint],
            )
            .await?
            .map(|r| Ok::<_, tokio_postgres::Error>((r.try_get(0)?, r.try_get(1)?)))
            .transpose()?;
        out.push(EndpointSummary {
            endpoint,
            pending: row.try_get(1)?,
            failing: row.try_get(2)?,
            delivered: row.try_get(3)?,
            oldest_pending_at: row.try_get(4)?,
            last_delivered_at: row.try_get(5)?,
            last_error,
        });
    }
    Ok(out)
}

/// Up to `limit` rows of `status`, of `endpoint` if given.
pub(super) async fn rows(
    conn: &Conn,
    status: OutboxStatus,
    endpoint: Option<&str>,
    limit: usize,
) -> Result<Vec<OutboxRow>, StoreError> {
    let sql = match status {
        OutboxStatus::Pending => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NULL
               AND ($1::TEXT IS NULL OR endpoint = $1) ORDER BY seq LIMIT $2"
        }
        OutboxStatus::Failing => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NULL AND attempts > 0
               AND ($1::TEXT IS NULL OR endpoint = $1) ORDER BY seq LIMIT $2"
        }
        OutboxStatus::Delivered => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NOT NULL
               AND ($1::TEXT IS NULL OR endpoint = $1) ORDER BY seq DESC LIMIT $2"
        }
    };
    let rows = conn.query(sql, &[&endpoint, &(limit as i64)]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(OutboxRow {
            seq: r.try_get(0)?,
            id: r.try_get(1)?,
            endpoint: r.try_get(2)?,
            thread: r.try_get(3)?,
            kind: r.try_get(4)?,
            created_at: r.try_get(5)?,
            attempts: r.try_get(6)?,
            next_at: r.try_get(7)?,
            last_attempt_at: r.try_get(8)?,
            last_error: r.try_get(9)?,
            delivered_at: r.try_get(10)?,
        });
    }
    Ok(out)
}

/// Deletes the rows delivered before `before`.
pub(super) async fn prune(conn: &Conn, before: i64) -> Result<u64, StoreError> {
    conn.execute(
        "DELETE FROM webhook_outbox WHERE delivered_at IS NOT NULL AND delivered_at < $1",
        &[&before],
    )
    .await
}
