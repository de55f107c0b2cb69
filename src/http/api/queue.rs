//! A thread's queue: input sent with `forwardedProps.agui.multitask = "enqueue"` while a
//! run was live, waiting for runs of its own. Listed, cancelled and edited here, scoped like
//! the thread.

use http::{Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{json_response, read_json, rfc3339};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::input::decode_run_input;
use crate::runtime::LoadError;
use crate::runtime::queue::{QueueError, QueuedItem};

/// `GET {path}/threads/{id}/queue`: the items in order, each with its id (the run id it
/// will start with).
pub(super) async fn list(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let items = app
        .runtime
        .queue_of(principal, id)
        .await
        .map_err(queue_error)?;
    let items: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(position, item)| item_json(item, position))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        json!({"threadId": id, "items": items}),
    ))
}

/// `DELETE {path}/threads/{id}/queue/{itemId}`: the item never runs; the stream waiting
/// for it ends with `RUN_ERROR{code:"RUN_DEQUEUED"}`.
pub(super) async fn cancel(
    app: &App,
    principal: &Principal,
    id: &str,
    item: &str,
) -> Result<Response<Body>, ApiError> {
    app.runtime
        .dequeue(principal, id, item)
        .await
        .map_err(queue_error)?;
    Ok(json_response(
        StatusCode::OK,
        json!({"threadId": id, "id": item, "status": "cancelled"}),
    ))
}

/// `PATCH {path}/threads/{id}/queue/{itemId}`, body `{"messages": [...]}` (AG-UI
/// messages, checked as a run's are): the item's messages replaced; it keeps its place.
pub(super) async fn edit(
    app: &App,
    principal: &Principal,
    id: &str,
    item: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_json(body, &parts.headers, conn).await?;
    let Some(messages) = body.as_object().and_then(|fields| fields.get("messages")) else {
        return Err(ApiError::invalid_input(
            "the body must be an object with the item's new messages",
            Some("messages".to_owned()),
        ));
    };
    // Checked as the messages of a run request are.
    let input = json!({"threadId": id, "runId": item, "messages": messages});
    let input = decode_run_input(&serde_json::to_vec(&input).unwrap_or_default())?;
    let (position, edited) = app
        .runtime
        .edit_queued(principal, id, item, input.messages)
        .await
        .map_err(queue_error)?;
    Ok(json_response(StatusCode::OK, item_json(&edited, position)))
}

fn item_json(item: &QueuedItem, position: usize) -> serde_json::Value {
    json!({
        "id": item.id,
        "runId": item.id,
        "position": position,
        "createdAt": rfc3339(item.created_at),
        "messages": item.messages,
    })
}

fn queue_error(error: QueueError) -> ApiError {
    match error {
        QueueError::NoThread => ApiError::not_found("thread"),
        QueueError::NoItem => ApiError::not_found("queued item"),
        QueueError::Load(LoadError::Elsewhere(owner)) => ApiError::elsewhere(owner),
        QueueError::Load(LoadError::Store) => ApiError::store_unavailable(),
    }
}
