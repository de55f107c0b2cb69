//! `POST {path}/threads/{id}/rewind`: a thread taken back to one of its messages (see
//! `runtime/rewind.rs`).

use http::{Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{is_json, json_response, read_json};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::input::check_id;
use crate::runtime::{ForkAt, RewindScope, rewind_json};

/// `{"messageId", "scope"?}` (scope `conversation`, `files` or `both`, the default): 200
/// with the thread as it is now and what was done; 409 while a run is live.
pub(super) async fn rewind(
    app: &App,
    principal: &Principal,
    id: &str,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    if !is_json(&parts.headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let body = read_json(body, &parts.headers, conn).await?;
    let Some(message_id) = body.get("messageId").and_then(|v| v.as_str()) else {
        return Err(ApiError::invalid_input(
            "messageId (a string: the message the thread goes back to) is required",
            Some("messageId".to_owned()),
        ));
    };
    let scope = match body.get("scope") {
        None | Some(serde_json::Value::Null) => RewindScope::Both,
        Some(value) => value.as_str().and_then(RewindScope::parse).ok_or_else(|| {
            ApiError::invalid_input(
                "scope must be \"conversation\", \"files\" or \"both\"",
                Some("scope".to_owned()),
            )
        })?,
    };
    let rewound = app
        .runtime
        .rewind_thread(principal, id, message_id, scope)
        .await?;
    let mut answer = rewind_json(&rewound);
    answer["threadId"] = json!(id);
    answer["messageId"] = json!(message_id);
    answer["runId"] = json!(rewound.run_id);
    answer["messages"] = rewound.messages;
    answer["state"] = rewound.state;
    Ok(json_response(StatusCode::OK, answer))
}

/// A fork's body: `{"threadId"?, "messageId"?, "files"?}` (an empty body names none).
pub(super) async fn fork_request(
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<(Option<String>, ForkAt), ApiError> {
    let (parts, body) = req.into_parts();
    let body = super::common::read_request_body(body, &parts.headers, conn).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((None, ForkAt::default()));
    }
    if !is_json(&parts.headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let body = super::common::parse_json(&body)?;
    if !body.is_object() {
        return Err(ApiError::invalid_input(
            "the body must be a JSON object",
            None,
        ));
    }
    let id = |field: &str| match body.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(id)) => check_id(id, field)
            .map(|()| Some(id.clone()))
            .map_err(ApiError::from),
        Some(_) => Err(ApiError::invalid_input(
            format!("{field} must be a string"),
            Some(field.to_owned()),
        )),
    };
    let files = match body.get("files") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(files)) => *files,
        Some(_) => {
            return Err(ApiError::invalid_input(
                "files must be a boolean",
                Some("files".to_owned()),
            ));
        }
    };
    let at = ForkAt {
        message_id: id("messageId")?,
        files,
    };
    Ok((id("threadId")?, at))
}
