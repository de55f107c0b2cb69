//! An agent's own sessions (operator only): list them, import one as a thread.

use http::{Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{json_response, query_param};
use super::threads::requested_thread_id;
use crate::access::Principal;
use crate::http::body::{Body, RequestBody};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;

/// `GET {path}/agents/{agent}/sessions`: a page of `session/list`.
pub(super) async fn list(
    app: &App,
    agent: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let cursor = query_param(query, "cursor");
    let page = app.runtime.agent_sessions(agent, cursor).await?;
    let mut body = json!({"agent": agent, "sessions": page.sessions});
    if let Some(cursor) = page.next_cursor {
        body["nextCursor"] = json!(cursor);
    }
    Ok(json_response(StatusCode::OK, body))
}

/// `POST {path}/agents/{agent}/sessions/{sessionId}/import`: the session as a new thread.
pub(super) async fn import(
    app: &App,
    principal: &Principal,
    agent: &str,
    session: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let thread_id = requested_thread_id(req, conn).await?;
    let new = app
        .runtime
        .import_session(principal, agent, session, thread_id)
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        json!({"threadId": new.thread_id, "agent": agent, "sessionId": new.session_id,
            "messageCount": new.message_count}),
    ))
}
