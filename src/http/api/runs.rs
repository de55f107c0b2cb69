//! Runs: start one from a `RunAgentInput` (the event stream of its first segment), cancel
//! a live one.

use http::{Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{
    Audit, check_stream_request, json_response, read_json, read_request_body, stream_response,
};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::{Negotiated, Offer, decode_run_input};
use crate::runtime::CancelReason;

/// `POST {path}/{agent}` (and CopilotKit's `{path}/agent/{agent}/run`).
pub(super) async fn run(
    app: &App,
    principal: &Principal,
    agent: &str,
    req: Request<RequestBody>,
    conn: ConnInfo,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let format = check_stream_request(req.headers(), Offer::EventStreamOrProtobuf)?;
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, &conn).await?;
    start_run(app, principal, agent, &body, format, audit).await
}

/// Starts a run of `agent` from a `RunAgentInput` body; the stream of its current segment,
/// in `format`, which the caller negotiated.
pub(super) async fn start_run(
    app: &App,
    principal: &Principal,
    agent: &str,
    body: &[u8],
    format: Negotiated,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let input = decode_run_input(body)?;
    audit.thread = Some(input.thread_id.clone());
    audit.run = Some(input.run_id.clone());
    let attachment = app.runtime.start_run_as(principal, agent, input).await?;
    Ok(stream_response(attachment, format))
}

/// `POST {path}/threads/{id}/runs`: a run no stream follows, started from a
/// `RunAgentInput` that also names its `"agent"` (`threadId` may be left out: the path's;
/// `runId` too: a new one). 202 `{"threadId","runId"}`; the run goes on whether anyone
/// attaches (the thread's stream route) or not.
pub(super) async fn start_background(
    app: &App,
    principal: &Principal,
    thread_id: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let mut body = read_json(body, &parts.headers, conn).await?;
    let Some(fields) = body.as_object_mut() else {
        return Err(ApiError::invalid_input(
            "the body must be a JSON object",
            None,
        ));
    };
    let agent = match fields.remove("agent") {
        Some(serde_json::Value::String(agent)) => agent,
        _ => {
            return Err(ApiError::invalid_input(
                "agent must name the agent to run",
                Some("agent".to_owned()),
            ));
        }
    };
    match fields.get("threadId") {
        None => {
            fields.insert("threadId".to_owned(), json!(thread_id));
        }
        Some(serde_json::Value::String(id)) if id == thread_id => {}
        Some(_) => {
            return Err(ApiError::invalid_input(
                "threadId must be the path's thread id (or left out)",
                Some("threadId".to_owned()),
            ));
        }
    }
    fields
        .entry("runId")
        .or_insert_with(|| json!(uuid::Uuid::new_v4().to_string()));
    let input = decode_run_input(&serde_json::to_vec(&body).unwrap_or_default())?;
    audit.run = Some(input.run_id.clone());
    let run_id = app
        .runtime
        .start_background_run_as(principal, &agent, input)
        .await?;
    Ok(json_response(
        StatusCode::ACCEPTED,
        json!({"threadId": thread_id, "runId": run_id}),
    ))
}

/// `POST {path}/runs/{runId}/cancel`.
pub(super) fn cancel(
    app: &App,
    principal: &Principal,
    run_id: &str,
) -> Result<Response<Body>, ApiError> {
    if app
        .runtime
        .cancel_run_as(principal, run_id, CancelReason::Requested)
    {
        Ok(json_response(
            StatusCode::ACCEPTED,
            json!({"runId": run_id, "status": "cancelling"}),
        ))
    } else {
        Err(ApiError::not_found("live run"))
    }
}
