//! The webhook outbox as the operator sees it: `GET {path}/webhooks` (each endpoint: its
//! events, what is pending, failing and delivered, the last delivery and the last error)
//! and `GET {path}/webhooks/deliveries` (rows by status). Operator only: the rows name
//! every principal's threads. Never a secret, never a URL's path.

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::App;
use super::common::{json_response, query_param, query_usize, rfc3339};
use crate::http::body::Body;
use crate::http::error::ApiError;
use crate::store::{EndpointSummary, OutboxRow, OutboxStatus};

/// `GET {path}/webhooks`: every configured endpoint with its outbox counts, then any
/// endpoint the outbox still holds rows for that is no longer configured.
pub(super) async fn status(app: &App) -> Result<Response<Body>, ApiError> {
    let summaries = app.runtime.webhook_summary().await.map_err(|error| {
        tracing::error!(%error, "webhook outbox unreadable");
        ApiError::store_unavailable()
    })?;
    let configured = app
        .runtime
        .webhooks()
        .map(|outbox| outbox.endpoints().to_vec())
        .unwrap_or_default();
    let find = |name: &str| summaries.iter().find(|s| s.endpoint == name);
    let mut endpoints: Vec<Value> = configured
        .iter()
        .map(|endpoint| {
            let mut value = counts(find(&endpoint.name), &endpoint.name);
            value["configured"] = json!(true);
            value["url"] = json!(endpoint.url);
            value["events"] = json!(endpoint.events.names());
            value
        })
        .collect();
    for summary in &summaries {
        if !configured.iter().any(|e| e.name == summary.endpoint) {
            let mut value = counts(Some(summary), &summary.endpoint);
            value["configured"] = json!(false);
            endpoints.push(value);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        json!({"endpoints": endpoints}),
    ))
}

/// `GET {path}/webhooks/deliveries?status=pending|failing|delivered&endpoint=NAME&limit=N`:
/// outbox rows, pending and failing oldest first, delivered newest first.
pub(super) async fn deliveries(app: &App, query: Option<&str>) -> Result<Response<Body>, ApiError> {
    let status = match query_param(query, "status").as_deref() {
        None | Some("pending") => OutboxStatus::Pending,
        Some("failing") => OutboxStatus::Failing,
        Some("delivered") => OutboxStatus::Delivered,
        Some(_) => {
            return Err(ApiError::invalid_input(
                "status must be pending, failing or delivered",
                Some("status".to_owned()),
            ));
        }
    };
    let limit = query_usize(query, "limit", 100, 1000)?;
    let endpoint = query_param(query, "endpoint");
    let rows = app
        .runtime
        .webhook_deliveries(status, endpoint, limit)
        .await
        .map_err(|error| {
            tracing::error!(%error, "webhook outbox unreadable");
            ApiError::store_unavailable()
        })?;
    let deliveries: Vec<Value> = rows.iter().map(delivery).collect();
    Ok(json_response(
        StatusCode::OK,
        json!({"deliveries": deliveries}),
    ))
}

/// An endpoint's counts (all zero when the outbox holds nothing for it).
fn counts(summary: Option<&EndpointSummary>, name: &str) -> Value {
    let empty = EndpointSummary::default();
    let s = summary.unwrap_or(&empty);
    json!({
        "name": name,
        "pending": s.pending,
        "failing": s.failing,
        "delivered": s.delivered,
        "oldestPendingAt": s.oldest_pending_at.map(rfc3339),
        "lastDeliveredAt": s.last_delivered_at.map(rfc3339),
        "lastError": s.last_error.as_ref().map(|(message, at)| json!({
            "message": message,
            "at": rfc3339(*at),
        })),
    })
}

/// One outbox row: the event, its thread and owner, and how its delivery goes.
fn delivery(row: &OutboxRow) -> Value {
    let (owner, thread_id) = crate::access::split_key(&row.thread);
    json!({
        "id": row.id,
        "endpoint": row.endpoint,
        "type": row.kind,
        "threadId": (!thread_id.is_empty()).then_some(thread_id),
        "principal": if owner.is_empty() { "operator" } else { owner },
        "createdAt": rfc3339(row.created_at),
        "status": match (row.delivered_at, row.attempts) {
            (Some(_), _) => "delivered",
            (None, 0) => "pending",
            (None, _) => "failing",
        },
        "attempts": row.attempts,
        "nextAttemptAt": row.delivered_at.is_none().then(|| rfc3339(row.next_at)),
        "lastAttemptAt": row.last_attempt_at.map(rfc3339),
        "lastError": row.last_error,
        "deliveredAt": row.delivered_at.map(rfc3339),
    })
}
