//! The webhook outbox's SQL on SQLite (`store/outbox.rs` has the contract): rows written
//! inside the jobs of the facts they report, claims, attempts, the summary and listing.
//! One process owns the database, so the clock is this process's and claims left by a
//! previous process are cleared at open.

use rusqlite::{Connection, OptionalExtension, params};

use crate::store::{
    Attempt, Claimed, Claims, EndpointSummary, OutboxRow, OutboxStatus, Outgoing, now_ms,
};

/// Writes `outgoing`'s rows (one per endpoint), inside the caller's savepoint.
pub(super) fn insert(conn: &Connection, outgoing: &Outgoing) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO webhook_outbox (id, endpoint, thread, kind, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for endpoint in &outgoing.endpoints {
        stmt.execute(params![
            outgoing.id,
            endpoint,
            outgoing.thread,
            outgoing.kind,
            outgoing.body,
            outgoing.created_at
        ])?;
    }
    Ok(())
}

/// Forgets the claims of a process that is gone (the embedded store has one process).
pub(super) fn clear_claims(conn: &Connection) -> rusqlite::Result<usize> {
    conn.execute(
        "UPDATE webhook_outbox SET claimed_by = NULL, claim_until = NULL
         WHERE claimed_by IS NOT NULL",
        [],
    )
}

/// Claims up to `limit` due heads of `endpoint`'s threads for `node`.
pub(super) fn claim(
    conn: &Connection,
    endpoint: &str,
    node: &str,
    limit: usize,
    claim_ms: i64,
) -> rusqlite::Result<Claims> {
    let now = now_ms();
    let mut stmt = conn.prepare_cached(
        "UPDATE webhook_outbox SET claimed_by = ?1, claim_until = ?2 + ?3
         WHERE seq IN (
             SELECT o.seq FROM webhook_outbox o
             WHERE o.endpoint = ?4 AND o.delivered_at IS NULL AND o.next_at <= ?2
               AND (o.claim_until IS NULL OR o.claim_until <= ?2)
               AND o.seq = (SELECT MIN(p.seq) FROM webhook_outbox p
                            WHERE p.endpoint = o.endpoint AND p.thread = o.thread
                              AND p.delivered_at IS NULL)
             ORDER BY o.seq LIMIT ?5)
         RETURNING seq, id, body, attempts",
    )?;
    let mut rows = stmt
        .query_map(params![node, now, claim_ms, endpoint, limit as i64], |r| {
            Ok(Claimed {
                seq: r.get(0)?,
                id: r.get(1)?,
                body: r.get(2)?,
                attempts: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_by_key(|row| row.seq);
    let pending = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM webhook_outbox WHERE endpoint = ?1 AND delivered_at IS NULL",
        )?
        .query_row([endpoint], |r| r.get(0))?;
    Ok(Claims { rows, pending })
}

/// Records attempts by `node`.
pub(super) fn record(conn: &Connection, node: &str, attempts: &[Attempt]) -> rusqlite::Result<()> {
    let now = now_ms();
    for attempt in attempts {
        match &attempt.failed {
            None => {
                conn.prepare_cached(
                    "UPDATE webhook_outbox SET delivered_at = COALESCE(delivered_at, ?3),
                         attempts = attempts + 1, last_attempt_at = ?3,
                         claimed_by = NULL, claim_until = NULL
                     WHERE id = ?1 AND endpoint = ?2",
                )?
                .execute(params![attempt.id, attempt.endpoint, now])?;
            }
            Some((error, retry_ms)) => {
                conn.prepare_cached(
                    "UPDATE webhook_outbox SET attempts = attempts + 1, last_attempt_at = ?3,
                         last_error = ?4, next_at = ?3 + ?5,
                         claimed_by = NULL, claim_until = NULL
                     WHERE id = ?1 AND endpoint = ?2 AND delivered_at IS NULL
                       AND claimed_by = ?6",
                )?
                .execute(params![
                    attempt.id,
                    attempt.endpoint,
                    now,
                    error,
                    retry_ms,
                    node
                ])?;
            }
        }
    }
    Ok(())
}

/// Every endpoint's rows, summed up.
pub(super) fn summary(conn: &Connection) -> rusqlite::Result<Vec<EndpointSummary>> {
    let mut stmt = conn.prepare_cached(
        "SELECT endpoint,
             SUM(CASE WHEN delivered_at IS NULL THEN 1 ELSE 0 END),
             SUM(CASE WHEN delivered_at IS NULL AND attempts > 0 THEN 1 ELSE 0 END),
             SUM(CASE WHEN delivered_at IS NULL THEN 0 ELSE 1 END),
             MIN(CASE WHEN delivered_at IS NULL THEN created_at END),
             MAX(delivered_at)
         FROM webhook_outbox GROUP BY endpoint ORDER BY endpoint",
    )?;
    let mut out = stmt
        .query_map([], |r| {
            Ok(EndpointSummary {
                endpoint: r.get(0)?,
                pending: r.get(1)?,
                failing: r.get(2)?,
                delivered: r.get(3)?,
                oldest_pending_at: r.get(4)?,
                last_delivered_at: r.get(5)?,
                last_error: None,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut last_error = conn.prepare_cached(
        "SELECT last_error, last_attempt_at FROM webhook_outbox
         WHERE endpoint = ?1 AND last_error IS NOT NULL
         ORDER BY last_attempt_at DESC LIMIT 1",
    )?;
    for summary in &mut out {
        summary.last_error = last_error
            .query_row([&summary.endpoint], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
    }
    Ok(out)
}

/// Up to `limit` rows of `status`, of `endpoint` if given.
pub(super) fn rows(
    conn: &Connection,
    status: OutboxStatus,
    endpoint: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<OutboxRow>> {
    let sql = match status {
        OutboxStatus::Pending => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NULL
               AND (?1 IS NULL OR endpoint = ?1) ORDER BY seq LIMIT ?2"
        }
        OutboxStatus::Failing => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NULL AND attempts > 0
               AND (?1 IS NULL OR endpoint = ?1) ORDER BY seq LIMIT ?2"
        }
        OutboxStatus::Delivered => {
            "SELECT seq, id, endpoint, thread, kind, created_at, attempts, next_at,
                 last_attempt_at, last_error, delivered_at
             FROM webhook_outbox WHERE delivered_at IS NOT NULL
               AND (?1 IS NULL OR endpoint = ?1) ORDER BY seq DESC LIMIT ?2"
        }
    };
    let mut stmt = conn.prepare_cached(sql)?;
    stmt.query_map(params![endpoint, limit as i64], |r| {
        Ok(OutboxRow {
            seq: r.get(0)?,
            id: r.get(1)?,
            endpoint: r.get(2)?,
            thread: r.get(3)?,
            kind: r.get(4)?,
            created_at: r.get(5)?,
            attempts: r.get(6)?,
            next_at: r.get(7)?,
            last_attempt_at: r.get(8)?,
            last_error: r.get(9)?,
            delivered_at: r.get(10)?,
        })
    })?
    .collect()
}

/// Deletes the rows delivered before `before`.
pub(super) fn prune(conn: &Connection, before: i64) -> rusqlite::Result<u64> {
    let n = conn
        .prepare_cached(
            "DELETE FROM webhook_outbox WHERE delivered_at IS NOT NULL AND delivered_at < ?1",
        )?
        .execute([before])?;
    Ok(n as u64)
}
