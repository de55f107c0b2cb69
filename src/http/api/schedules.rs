//! Schedules: create (`POST {path}/schedules`), list (`GET {path}/schedules`), read and
//! delete one (`{path}/schedules/{id}`), each in the principal's namespace as threads are:
//! another principal's schedule is not there (404).

use http::{Request, Response, StatusCode};
use serde_json::{Map, Value, json};

use super::App;
use super::common::{json_response, read_json, rfc3339};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody, empty};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::decode_run_input;
use crate::protocol::input::check_id;
use crate::runtime::NewSchedule;
use crate::store::ScheduleRow;

/// Longest `cron` and `timezone`, in bytes.
const MAX_FIELD_BYTES: usize = 256;
/// Largest `messages`, as JSON: each firing sends them again, and a principal may hold
/// [`crate::runtime::MAX_SCHEDULES_PER_OWNER`] schedules.
const MAX_MESSAGES_BYTES: usize = 256 * 1024;

/// The fields a schedule's body may hold.
const FIELDS: [&str; 6] = ["agent", "cron", "messages", "threadId", "timezone", "name"];

/// `POST {path}/schedules`, body `{"agent","cron","messages","threadId"?,"timezone"?,
/// "name"?}`: 201 with the schedule (its `id` among its fields).
pub(super) async fn create(
    app: &App,
    principal: &Principal,
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
    if let Some(key) = fields.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(ApiError::invalid_input(
            format!(
                "{key:?} is not a schedule field (agent, cron, messages, threadId, timezone, name)"
            ),
            Some(key.clone()),
        ));
    }
    let agent = required_string(fields, "agent")?;
    let cron = required_string(fields, "cron")?;
    let timezone = optional_string(fields, "timezone")?;
    let name = optional_string(fields, "name")?;
    if name
        .as_ref()
        .is_some_and(|n| n.trim().is_empty() || n.chars().count() > 200)
    {
        return Err(ApiError::invalid_input(
            "name must be 1 to 200 characters",
            Some("name".to_owned()),
        ));
    }
    for (key, value) in [("cron", Some(&cron)), ("timezone", timezone.as_ref())] {
        if value.is_some_and(|v| v.len() > MAX_FIELD_BYTES) {
            return Err(ApiError::invalid_input(
                format!("{key} must be at most {MAX_FIELD_BYTES} bytes"),
                Some(key.to_owned()),
            ));
        }
    }
    let thread_id = optional_string(fields, "threadId")?;
    if let Some(id) = &thread_id {
        check_id(id, "threadId")?;
    }
    if !app.runtime.has_agent(&agent) || !principal.may_use(&agent) {
        return Err(ApiError::unknown_agent(&agent));
    }
    let messages = messages(app, &agent, fields.get("messages"))?;
    let row = app
        .runtime
        .create_schedule_as(
            principal,
            NewSchedule {
                agent,
                cron,
                timezone,
                name,
                thread_id,
                messages,
            },
        )
        .await?;
    Ok(json_response(StatusCode::CREATED, schedule_json(&row)))
}

/// `GET {path}/schedules`: the principal's schedules, oldest first.
pub(super) async fn list(app: &App, principal: &Principal) -> Result<Response<Body>, ApiError> {
    let rows = app.runtime.schedules_as(principal).await.map_err(|error| {
        tracing::error!(%error, "schedule listing failed");
        ApiError::store_unavailable()
    })?;
    let schedules: Vec<Value> = rows.iter().map(schedule_json).collect();
    Ok(json_response(
        StatusCode::OK,
        json!({"schedules": schedules}),
    ))
}

/// `GET {path}/schedules/{id}`.
pub(super) async fn get(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let rows = app.runtime.schedules_as(principal).await.map_err(|error| {
        tracing::error!(%error, "schedule read failed");
        ApiError::store_unavailable()
    })?;
    match rows.iter().find(|row| row.id == id) {
        Some(row) => Ok(json_response(StatusCode::OK, schedule_json(row))),
        None => Err(ApiError::not_found("schedule")),
    }
}

/// `DELETE {path}/schedules/{id}`: 204; a run a firing already started goes on.
pub(super) async fn delete(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    match app.runtime.delete_schedule_as(principal, id).await {
        Ok(true) => {
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            Ok(response)
        }
        Ok(false) => Err(ApiError::not_found("schedule")),
        Err(error) => {
            tracing::error!(%error, "schedule delete failed");
            Err(ApiError::store_unavailable())
        }
    }
}

/// The messages each firing sends, checked as a run's `messages` are (a message's `id` may
/// be left out: each firing gives every message a fresh one), and against what the agent
/// reads of a run request.
fn messages(
    app: &App,
    agent: &str,
    messages: Option<&Value>,
) -> Result<Vec<crate::protocol::Message>, ApiError> {
    let Some(Value::Array(messages)) = messages else {
        return Err(ApiError::invalid_input(
            "messages must be an array of the messages each firing sends",
            Some("messages".to_owned()),
        ));
    };
    if Value::Array(messages.clone()).to_string().len() > MAX_MESSAGES_BYTES {
        return Err(ApiError::invalid_input(
            format!("messages must be at most {MAX_MESSAGES_BYTES} bytes of JSON"),
            Some("messages".to_owned()),
        ));
    }
    let mut messages = messages.clone();
    for message in &mut messages {
        if let Value::Object(message) = message {
            message
                .entry("id")
                .or_insert_with(|| json!(uuid::Uuid::new_v4().to_string()));
        }
    }
    let body = json!({"threadId": "schedule", "runId": "schedule", "messages": messages});
    let mut input = decode_run_input(body.to_string().as_bytes())?;
    app.runtime.check_input(agent, &input)?;
    app.runtime.keep_plain(&mut input.messages);
    Ok(input.messages)
}

fn required_string(fields: &Map<String, Value>, key: &str) -> Result<String, ApiError> {
    match fields.get(key) {
        Some(Value::String(value)) if !value.trim().is_empty() => Ok(value.clone()),
        _ => Err(ApiError::invalid_input(
            format!("{key} must be a non-empty string"),
            Some(key.to_owned()),
        )),
    }
}

fn optional_string(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(ApiError::invalid_input(
            format!("{key} must be a string"),
            Some(key.to_owned()),
        )),
    }
}

/// A schedule as the API shows it.
fn schedule_json(row: &ScheduleRow) -> Value {
    let next = (row.next_fire != i64::MAX).then(|| rfc3339(row.next_fire));
    let mut value = json!({
        "id": row.id,
        "agent": row.agent,
        "cron": row.cron,
        "timezone": row.timezone,
        "threadId": row.thread_id,
        "messages": row.messages,
        "createdAt": rfc3339(row.created_at),
        "nextRunAt": next,
        "lastRunAt": null,
        "lastRunId": null,
        "lastThreadId": null,
        "lastStatus": null,
        "lastError": null,
        "missed": {
            "count": row.missed.count,
            "first": row.missed.first.map(rfc3339),
            "last": row.missed.last.map(rfc3339),
        },
    });
    if let Some(name) = &row.name {
        value["name"] = json!(name);
    }
    if !row.owner.is_empty() {
        value["owner"] = json!(row.owner);
    }
    if let Some(last) = &row.last {
        value["lastRunAt"] = json!(rfc3339(last.at));
        value["lastRunId"] = json!(last.run_id);
        value["lastThreadId"] = json!(last.thread_id);
        value["lastStatus"] = json!(last.status);
        value["lastError"] = json!(last.error);
    }
    value
}
