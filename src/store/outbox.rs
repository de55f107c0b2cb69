//! The webhook outbox as the store keeps it (migration 0008, both backends): one row per
//! event and endpoint, written in the same job (so the same transaction) as the fact the
//! event reports, then claimed, attempted and marked delivered by the delivery
//! (`crate::webhooks`).
//!
//! Order: a row's `seq` is its place in writing order. Rows of one thread (`thread`, its
//! key) for one endpoint are delivered in that order: only a thread's oldest undelivered
//! row (its head) can be claimed, so a failing one holds back the thread's later rows for
//! that endpoint and nothing else. A thread is written by one node at a time (its lease),
//! through one FIFO, so `seq` order is the order its facts were stored.
//!
//! Claims: a claim names the process delivering the row and lasts until `claim_until`
//! (the endpoint's timeout and a margin), so that with several nodes on one database each
//! row is attempted by one node at a time (PostgreSQL claims with `FOR UPDATE SKIP
//! LOCKED`, on the database's clock); a node that dies mid-claim leaves the row to the
//! others once its claim lapses. The embedded store clears every claim at open: its
//! database has one process.
//!
//! Delivered rows are kept for [`DELIVERED_KEPT_MS`] (the operator route shows them, and
//! the last delivery), then deleted ([`Store::prune_outbox`]).

use super::{Backend, Store, StoreError};

/// How long a delivered row is kept.
pub const DELIVERED_KEPT_MS: i64 = 24 * 60 * 60 * 1000;

/// An event to write into the outbox: one row per endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The event's id (`agui-event-id`): the same on every endpoint and every attempt.
    pub id: String,
    /// The key of the thread it is about: its events go out in order.
    pub thread: String,
    /// Its type (`run.finished`, ...).
    pub kind: String,
    /// The JSON payload, exactly as it is sent (and signed).
    pub body: String,
    /// When it happened (ms since the epoch).
    pub created_at: i64,
    /// The endpoints (by name) that receive it.
    pub endpoints: Vec<String>,
}

/// A row claimed for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub seq: i64,
    pub id: String,
    pub body: String,
    /// Attempts made before this one.
    pub attempts: i64,
}

/// What one claim pass found for an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// The rows claimed, in `seq` order: each the head of its thread.
    pub rows: Vec<Claimed>,
    /// The endpoint's undelivered rows, claimed ones included.
    pub pending: i64,
}

/// How one attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub id: String,
    pub endpoint: String,
    /// `None`: delivered. Else why not, and how long until the next attempt (ms).
    pub failed: Option<(String, i64)>,
}

/// One endpoint's rows, summed up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointSummary {
    pub endpoint: String,
    /// Undelivered rows.
    pub pending: i64,
    /// Undelivered rows attempted at least once.
    pub failing: i64,
    /// Delivered rows still kept.
    pub delivered: i64,
    /// When the oldest undelivered row was written.
    pub oldest_pending_at: Option<i64>,
    pub last_delivered_at: Option<i64>,
    /// The most recent failure among the kept rows, and when.
    pub last_error: Option<(String, i64)>,
}

/// Which rows a listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxStatus {
    /// Undelivered (oldest first).
    Pending,
    /// Undelivered and attempted at least once (oldest first).
    Failing,
    /// Delivered (newest first).
    Delivered,
}

/// One row as the operator route lists it (no body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub seq: i64,
    pub id: String,
    pub endpoint: String,
    pub thread: String,
    pub kind: String,
    pub created_at: i64,
    pub attempts: i64,
    pub next_at: i64,
    pub last_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub delivered_at: Option<i64>,
}

impl Store {
    /// Records the start of a run as [`Store::record_run_start`] does, and writes
    /// `outgoing` (the thread's creation) in the same transaction if, and only if, this
    /// creates the thread.
    #[allow(clippy::too_many_arguments)]
    pub fn record_run_start_notifying(
        &self,
        thread_id: &str,
        agent: &str,
        title: Option<String>,
        run_id: &str,
        messages: Vec<super::Message>,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        dispatch!(self.record_run_start(thread_id, agent, title, run_id, messages, now, outgoing))
    }

    /// Records how a run ended as [`Store::record_run_end`] does, and writes `outgoing` in
    /// the same transaction.
    pub fn record_run_end_notifying(
        &self,
        thread_id: &str,
        run_id: &str,
        outcome: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        dispatch!(self.record_run_end(thread_id, run_id, outcome, status, now, outgoing))
    }

    /// Sets a thread's status as [`Store::set_status`] does, and writes `outgoing` in the
    /// same transaction.
    pub fn set_status_notifying(
        &self,
        thread_id: &str,
        status: &str,
        now: i64,
        outgoing: Option<Outgoing>,
    ) {
        dispatch!(self.set_status(thread_id, status, now, outgoing))
    }

    /// Deletes a thread as [`Store::delete_thread`] does, and writes `outgoing` in the same
    /// transaction when there was a thread to delete.
    pub async fn delete_thread_notifying(
        &self,
        id: &str,
        outgoing: Option<Outgoing>,
    ) -> Result<bool, StoreError> {
        dispatch!(self.delete_thread(id, outgoing).await)
    }

    /// Writes `outgoing` on its own (an event no other write records), without waiting.
    /// In a cluster, an event about a thread is fenced by this node's lease on it.
    pub fn add_outgoing(&self, outgoing: Outgoing) {
        dispatch!(self.add_outgoing(outgoing))
    }

    /// Claims, for `node`, up to `limit` of `endpoint`'s rows that are due: each the oldest
    /// undelivered row of its thread, not claimed by a live claim; the claim lasts
    /// `claim_ms`.
    pub async fn claim_outgoing(
        &self,
        endpoint: &str,
        node: &str,
        limit: usize,
        claim_ms: i64,
    ) -> Result<Claims, StoreError> {
        dispatch!(self.claim_outgoing(endpoint, node, limit, claim_ms).await)
    }

    /// Records attempts made by `node`: a delivered row is marked so; a failed one gets its
    /// error and its next attempt time, and its claim is released (if still `node`'s).
    pub async fn record_attempts(
        &self,
        node: &str,
        attempts: Vec<Attempt>,
    ) -> Result<(), StoreError> {
        dispatch!(self.record_attempts(node, attempts).await)
    }

    /// Every endpoint's rows, summed up, by endpoint name.
    pub async fn outbox_summary(&self) -> Result<Vec<EndpointSummary>, StoreError> {
        dispatch!(self.outbox_summary().await)
    }

    /// Up to `limit` rows of `status`, of `endpoint` if given.
    pub async fn outbox_rows(
        &self,
        status: OutboxStatus,
        endpoint: Option<String>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        dispatch!(self.outbox_rows(status, endpoint, limit).await)
    }

    /// Deletes the rows delivered before `before` (ms); how many.
    pub async fn prune_outbox(&self, before: i64) -> Result<u64, StoreError> {
        dispatch!(self.prune_outbox(before).await)
    }
}
