//! CopilotKit's runtime protocol, served on the same runtime as the AG-UI routes, so that
//! CopilotKit's `runtimeUrl` can point at `{path}` with no Node server in between.
//!
//! What CopilotKit's client (`@copilotkit/core` 1.74) calls, and what each becomes here:
//! - `POST {path}/agent/{id}/run`: the run route (`POST {path}/{id}`);
//! - `POST {path}/agent/{id}/connect` (a `RunAgentInput` plus an optional
//!   `lastSeenEventId`): the stream route, i.e. the thread's history as a run, then its live
//!   run to the end; after a `lastSeenEventId` of this boot, an exact replay. A thread this
//!   agent does not have is an empty 200 stream;
//! - `POST {path}/agent/{id}/stop/{threadId}` (body `{"runId"}` or none): cancels the live
//!   run, whose terminal event then ends every stream attached to it;
//! - `POST {path}` with `{"method","params","body"}` (the single-endpoint transport):
//!   `info`, `agent/run`, `agent/connect`, `agent/stop`, onto the same handlers.

use http::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};

use super::App;
use super::common::{
    Audit, check_accept, check_stream_request, is_json, json_response, read_json, require,
    sse_headers, stream_response,
};
use super::runs::start_run;
use crate::access::{Capability, Principal};
use crate::http::body::{Body, RequestBody, empty};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::input::check_id;
use crate::protocol::{Negotiated, Offer};

/// `POST {path}/agent/{id}/connect` as it arrives: an event-stream request with a JSON body.
pub(super) async fn connect_request(
    app: &App,
    principal: &Principal,
    agent: &str,
    req: http::Request<RequestBody>,
    conn: &ConnInfo,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    check_stream_request(req.headers(), Offer::EventStream)?;
    let (parts, body) = req.into_parts();
    let body = read_json(body, &parts.headers, conn).await?;
    connect(app, principal, agent, &body, audit).await
}

/// `POST {path}` as it arrives: the single-endpoint transport's envelope, in JSON.
pub(super) async fn envelope_request(
    app: &App,
    principal: &Principal,
    req: http::Request<RequestBody>,
    conn: ConnInfo,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    if !is_json(req.headers()) {
        return Err(ApiError::unsupported_media_type());
    }
    let (parts, body) = req.into_parts();
    let request = read_json(body, &parts.headers, &conn).await?;
    let uri = parts.uri.clone();
    envelope(app, principal, &parts.headers, &request, audit, || {
        super::info::info(app, principal, &parts.headers, &uri, conn.tls)
    })
    .await
}

/// `POST {path}/agent/{id}/connect`: `body` is the request's JSON.
pub(super) async fn connect(
    app: &App,
    principal: &Principal,
    agent: &str,
    body: &Value,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    if !app.runtime.has_agent(agent) || !principal.may_use(agent) {
        return Err(ApiError::unknown_agent(agent));
    }
    let thread_id = string_field(body, "threadId")?
        .ok_or_else(|| ApiError::invalid_input("missing field threadId", field("threadId")))?;
    check_id(&thread_id, "threadId")?;
    audit.thread = Some(thread_id.clone());
    let last_seen = string_field(body, "lastSeenEventId")?;
    let known = app
        .runtime
        .visible_thread(principal, &thread_id)
        .await
        .map_err(|error| {
            tracing::error!(%error, "thread read failed");
            ApiError::store_unavailable()
        })?
        .is_some_and(|row| row.agent == agent);
    if !known {
        // Nothing to hand over: an empty stream, which CopilotKit takes as "no history".
        let mut response = Response::new(empty());
        sse_headers(response.headers_mut());
        return Ok(response);
    }
    let attachment = app
        .runtime
        .reattach_as(principal, &thread_id, last_seen.as_deref())
        .await?;
    Ok(stream_response(attachment, Negotiated::EventStream))
}

/// `POST {path}/agent/{id}/stop/{threadId}`: `body` is the request's JSON, if any.
pub(super) async fn stop(
    app: &App,
    principal: &Principal,
    agent: &str,
    thread_id: &str,
    body: Option<&Value>,
) -> Result<Response<Body>, ApiError> {
    if !app.runtime.has_agent(agent) || !principal.may_use(agent) {
        return Err(ApiError::unknown_agent(agent));
    }
    let run_id = match body {
        Some(body) => string_field(body, "runId")?,
        None => None,
    };
    let stopped = app
        .runtime
        .cancel_thread_run(principal, thread_id, agent, run_id.as_deref());
    if stopped.is_none()
        && let Some(owner) = app.runtime.owner_elsewhere_as(principal, thread_id).await
    {
        return Err(ApiError::elsewhere(owner));
    }
    let answer = match stopped {
        Some(run_id) => json!({"stopped": true, "threadId": thread_id, "runId": run_id}),
        None => json!({
            "stopped": false,
            "threadId": thread_id,
            "message": match run_id {
                Some(_) => "that run is not in progress on this thread",
                None => "no run is in progress on this thread",
            },
        }),
    };
    Ok(json_response(StatusCode::OK, answer))
}

/// The single-endpoint transport: `{"method","params","body"}` posted to `{path}`.
pub(super) async fn envelope(
    app: &App,
    principal: &Principal,
    headers: &HeaderMap,
    envelope: &Value,
    audit: &mut Audit,
    info: impl FnOnce() -> Value,
) -> Result<Response<Body>, ApiError> {
    let method = string_field(envelope, "method")?
        .ok_or_else(|| ApiError::invalid_input("missing field method", field("method")))?;
    let params = envelope.get("params").unwrap_or(&Value::Null);
    let body = envelope.get("body");
    let agent = || {
        string_field(params, "agentId")?.ok_or_else(|| {
            ApiError::invalid_input("missing field params.agentId", field("params.agentId"))
        })
    };
    let body_or_empty = || body.cloned().unwrap_or_else(|| json!({}));
    match method.as_str() {
        "info" => Ok(json_response(StatusCode::OK, info())),
        "agent/run" => {
            let format = check_accept(headers, Offer::EventStream)?;
            let bytes = serde_json::to_vec(&body_or_empty()).unwrap_or_default();
            start_run(app, principal, &agent()?, &bytes, format, audit).await
        }
        "agent/connect" => {
            require(principal, Capability::Read)?;
            connect(app, principal, &agent()?, &body_or_empty(), audit).await
        }
        "agent/stop" => {
            require(principal, Capability::Run)?;
            let thread_id = string_field(params, "threadId")?.ok_or_else(|| {
                ApiError::invalid_input("missing field params.threadId", field("params.threadId"))
            })?;
            check_id(&thread_id, "params.threadId")?;
            audit.thread = Some(thread_id.clone());
            stop(app, principal, &agent()?, &thread_id, body).await
        }
        other => Err(ApiError::invalid_input(
            format!(
                "unknown method {other:?}: expected info, agent/run, agent/connect or agent/stop"
            ),
            field("method"),
        )),
    }
}

fn field(name: &str) -> Option<String> {
    Some(name.to_owned())
}

/// A string member of a JSON object: `None` when absent or null, an error when another type.
fn string_field(value: &Value, name: &str) -> Result<Option<String>, ApiError> {
    match value.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::invalid_input(
            format!("{name} must be a string"),
            field(name),
        )),
    }
}
