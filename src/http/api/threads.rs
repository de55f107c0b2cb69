//! Threads: the principal's listing, one thread, its transcript, its stream (reattach),
//! delete and fork.

use http::{HeaderMap, Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{
    check_accept, is_json, json_response, parse_json, query_param, query_usize, read_json,
    read_optional_json, read_request_body, rfc3339, stream_response,
};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody, empty};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::Offer;
use crate::protocol::input::check_id;
use crate::runtime::LoadError;
use crate::store;

/// `GET {path}/threads`: a page of the principal's threads.
pub(super) async fn list_threads(
    app: &App,
    principal: &Principal,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let limit = query_usize(query, "limit", 50, 200)?;
    let cursor =
        match query_param(query, "cursor") {
            Some(cursor) => Some(store::decode_cursor(&cursor).ok_or_else(|| {
                ApiError::invalid_input("invalid cursor", Some("cursor".to_owned()))
            })?),
            None => None,
        };
    // `agentId` is CopilotKit's name for the same filter.
    let agent = query_param(query, "agent").or_else(|| query_param(query, "agentId"));
    let archived = match query_param(query, "includeArchived").as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(ApiError::invalid_input(
                "includeArchived must be true or false",
                Some("includeArchived".to_owned()),
            ));
        }
    };
    let page = app
        .runtime
        .list_threads_as(principal, limit, cursor, agent, archived)
        .await
        .map_err(|error| {
            tracing::error!(%error, "thread listing failed");
            ApiError::store_unavailable()
        })?;
    let threads: Vec<_> = page
        .threads
        .iter()
        .map(|row| thread_json(app, row, false))
        .collect();
    let mut body = json!({"threads": threads});
    if let Some(next) = page.next_cursor {
        body["nextCursor"] = json!(next);
    }
    Ok(json_response(StatusCode::OK, body))
}

/// `GET {path}/threads/{id}`.
pub(super) async fn get(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let row = visible_thread(app, principal, id).await?;
    Ok(json_response(StatusCode::OK, thread_json(app, &row, true)))
}

/// `PATCH {path}/threads/{id}`: CopilotKit's rename and unarchive, body `{"agentId"?,
/// "name"?, "archived"?}`; the thread as it is then.
pub(super) async fn update(
    app: &App,
    principal: &Principal,
    id: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_json(body, &parts.headers, conn).await?;
    let Some(fields) = body.as_object() else {
        return Err(ApiError::invalid_input(
            "the body must be a JSON object",
            None,
        ));
    };
    for key in fields.keys() {
        if !matches!(key.as_str(), "agentId" | "name" | "archived") {
            return Err(ApiError::invalid_input(
                format!("{key:?} cannot be changed (only name and archived)"),
                Some(key.clone()),
            ));
        }
    }
    let name = match fields.get("name") {
        None => None,
        Some(serde_json::Value::String(name)) => {
            let name = name.trim();
            if name.is_empty() || name.chars().count() > 200 {
                return Err(ApiError::invalid_input(
                    "name must be 1 to 200 characters",
                    Some("name".to_owned()),
                ));
            }
            Some(name.to_owned())
        }
        Some(_) => {
            return Err(ApiError::invalid_input(
                "name must be a string",
                Some("name".to_owned()),
            ));
        }
    };
    let archived = match fields.get("archived") {
        None => None,
        Some(serde_json::Value::Bool(archived)) => Some(*archived),
        Some(_) => {
            return Err(ApiError::invalid_input(
                "archived must be true or false",
                Some("archived".to_owned()),
            ));
        }
    };
    change(
        app,
        principal,
        id,
        fields.get("agentId"),
        name.as_deref(),
        archived,
    )
    .await
    .map(|row| json_response(StatusCode::OK, thread_json(app, &row, false)))
}

/// `POST {path}/threads/{id}/archive`: CopilotKit's archive, body `{"agentId"?}`.
pub(super) async fn archive(
    app: &App,
    principal: &Principal,
    id: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_optional_json(body, &parts.headers, conn).await?;
    let agent = body.as_ref().and_then(|body| body.get("agentId"));
    change(app, principal, id, agent, None, Some(true)).await?;
    Ok(json_response(
        StatusCode::OK,
        json!({"threadId": id, "archived": true}),
    ))
}

/// Applies a rename or (un)archive to thread `id`: 404 when the principal has no such
/// thread, or it is another agent's than the `agentId` CopilotKit names.
async fn change(
    app: &App,
    principal: &Principal,
    id: &str,
    agent: Option<&serde_json::Value>,
    name: Option<&str>,
    archived: Option<bool>,
) -> Result<store::ThreadRow, ApiError> {
    let row = visible_thread(app, principal, id).await?;
    match agent {
        None => {}
        Some(serde_json::Value::String(agent)) if *agent == row.agent => {}
        Some(serde_json::Value::String(_)) => return Err(ApiError::not_found("thread")),
        Some(_) => {
            return Err(ApiError::invalid_input(
                "agentId must be a string",
                Some("agentId".to_owned()),
            ));
        }
    }
    match app
        .runtime
        .update_thread_as(principal, id, name, archived)
        .await
    {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(ApiError::not_found("thread")),
        Err(error) => {
            tracing::error!(%error, "thread update failed");
            Err(ApiError::store_unavailable())
        }
    }
}

/// `DELETE {path}/threads/{id}`.
pub(super) async fn delete(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    match app.runtime.delete_thread_as(principal, id).await {
        Ok(true) => {
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            Ok(response)
        }
        Ok(false) => Err(ApiError::not_found("thread")),
        Err(LoadError::Elsewhere(owner)) => Err(ApiError::elsewhere(owner)),
        Err(LoadError::Store) => Err(ApiError::store_unavailable()),
    }
}

/// `GET {path}/threads/{id}/messages`: the last `?limit=` messages.
pub(super) async fn messages(
    app: &App,
    principal: &Principal,
    id: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let limit = query_usize(query, "limit", 1000, 10_000)?;
    match app.runtime.thread_messages(principal, id, limit).await {
        Ok(Some((messages, truncated))) => Ok(json_response(
            StatusCode::OK,
            json!({"threadId": id, "messages": messages, "truncated": truncated}),
        )),
        Ok(None) => Err(ApiError::not_found("thread")),
        Err(error) => {
            tracing::error!(%error, "messages read failed");
            Err(ApiError::store_unavailable())
        }
    }
}

/// `GET {path}/threads/{id}/stream`: replay after `Last-Event-ID` (or `?lastEventId=`),
/// then the live run.
pub(super) async fn stream(
    app: &App,
    principal: &Principal,
    id: &str,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let format = check_accept(headers, Offer::EventStreamOrProtobuf)?;
    let last = last_event_id(headers, query);
    let attachment = match query_param(query, "follow").as_deref() {
        None | Some("run") => {
            app.runtime
                .reattach_as(principal, id, last.as_deref())
                .await?
        }
        Some("all") => {
            app.runtime
                .follow_thread_as(principal, id, last.as_deref())
                .await?
        }
        Some(_) => {
            return Err(ApiError::invalid_input(
                "follow must be run (the default) or all",
                Some("follow".to_owned()),
            ));
        }
    };
    Ok(stream_response(attachment, format))
}

/// The id a reconnecting client last saw. A header that is not text is a malformed id
/// (resync), not an absent one.
pub(super) fn last_event_id(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    headers
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| query_param(query, "lastEventId"))
}

/// `POST {path}/threads/{id}/fork`: a new thread with this one's transcript (up to a
/// message, with the files as they were then, when the body says so).
pub(super) async fn fork(
    app: &App,
    principal: &Principal,
    source: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let (thread_id, at) = super::rewind::fork_request(req, conn).await?;
    let new = app
        .runtime
        .fork_thread(principal, source, thread_id, at)
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        json!({"threadId": new.thread_id, "forkedFrom": source,
            "sessionId": new.session_id, "messageCount": new.message_count}),
    ))
}

/// Thread `id` of `principal`'s namespace, when it is one of an agent it may use; else
/// 404, as for a thread that does not exist.
pub(super) async fn visible_thread(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<store::ThreadRow, ApiError> {
    match app.runtime.visible_thread(principal, id).await {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(ApiError::not_found("thread")),
        Err(error) => {
            tracing::error!(%error, "thread read failed");
            Err(ApiError::store_unavailable())
        }
    }
}

/// The `threadId` an import or fork body may name (`{"threadId": "..."}`; an empty body
/// names none).
pub(super) async fn requested_thread_id(
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Option<String>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, conn).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !is_json(&parts.headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let body = parse_json(&body)?;
    let field = || Some("threadId".to_owned());
    match body.get("threadId") {
        _ if !body.is_object() => Err(ApiError::invalid_input(
            "the body must be a JSON object",
            None,
        )),
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(id)) => {
            check_id(id, "threadId")?;
            Ok(Some(id.clone()))
        }
        Some(_) => Err(ApiError::invalid_input(
            "threadId must be a string",
            field(),
        )),
    }
}

/// A thread as the API shows it; `detail` adds the last run and the session.
pub(super) fn thread_json(app: &App, row: &store::ThreadRow, detail: bool) -> serde_json::Value {
    let status = app
        .runtime
        .live_status(&row.key)
        .unwrap_or(row.status.as_str());
    let mut value = json!({
        "threadId": row.id,
        "agent": row.agent,
        "createdAt": rfc3339(row.created_at),
        "updatedAt": rfc3339(row.updated_at),
        "messageCount": row.message_count,
        "status": status,
        // CopilotKit's thread record (`ThreadRecord` of @copilotkit/core 1.74), so its
        // thread list reads this route as it is.
        "id": row.id,
        "agentId": row.agent,
        "name": row.title,
        "archived": row.archived,
        // Input waiting for runs of its own (`{path}/threads/{id}/queue`).
        "queued": app.runtime.queued_count(&row.key),
    });
    if let Some(run) = &row.last_run {
        value["lastRunAt"] = json!(rfc3339(run.started_at));
    }
    if let Some(title) = &row.title {
        value["title"] = json!(title);
    }
    if !row.owner.is_empty() {
        value["owner"] = json!(row.owner);
    }
    if detail {
        if let Some(session) = &row.session_id {
            value["sessionId"] = json!(session);
        }
        if let Some(metadata) = &row.metadata {
            value["metadata"] = metadata.clone();
        }
        if let Some(run) = &row.last_run {
            let mut last = json!({
                "runId": run.id,
                "startedAt": rfc3339(run.started_at),
                "segments": run.segments,
                "outcome": run.outcome.as_deref().unwrap_or("running"),
            });
            if let Some(ended) = run.ended_at {
                last["endedAt"] = json!(rfc3339(ended));
            }
            value["lastRun"] = last;
        }
    }
    value
}
