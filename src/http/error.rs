//! API errors before a stream starts, and the one place that picks their status codes.
//!
//! An [`ApiError`] carries its classification as data (pingora style): status, stable code,
//! a public message, the field to blame, and whether retrying helps (`Retry-After`).

use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use serde_json::json;

use super::body::{Body, BodyError, full};
use crate::agent::SessionError;
use crate::cluster::Owner;
use crate::protocol::InputError;
use crate::runtime::{ReattachError, ScheduleError, SessionRequestError, StartError};

/// An error answered with `{"code","message"[,"field"]}` before any stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    pub retry_after: Option<Duration>,
    pub allow: Option<&'static str>,
    /// Another cluster node owns what the request is about: the request is sent there
    /// (when it can be; otherwise this error is the answer).
    pub forward: Option<Box<Owner>>,
    /// The run the error is about (`runId`: the live run a `409 RUN_IN_PROGRESS` names).
    pub run_id: Option<Box<String>>,
}

impl From<crate::workspace::WorkspaceError> for ApiError {
    fn from(error: crate::workspace::WorkspaceError) -> ApiError {
        use crate::workspace::WorkspaceError;
        match error {
            WorkspaceError::BadPath(why) => {
                ApiError::invalid_input(format!("path {why}"), Some("path".to_owned()))
            }
            WorkspaceError::NotFound => ApiError::not_found("file in the workspace"),
            WorkspaceError::TooLarge { size, cap } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "FILE_TOO_LARGE",
                format!("the file holds {size} bytes, over the {cap} bytes served"),
            ),
            other => {
                tracing::error!(error = %other, "workspace read failed");
                ApiError::internal()
            }
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(error: BodyError) -> ApiError {
        match error {
            BodyError::TooLarge(limit) => ApiError::payload_too_large(limit),
            BodyError::Timeout(timeout) => ApiError::request_timeout(timeout),
            BodyError::Unreadable => {
                ApiError::invalid_request("the request body could not be read")
            }
        }
    }
}

impl From<crate::uploads::UploadError> for ApiError {
    fn from(error: crate::uploads::UploadError) -> ApiError {
        use crate::uploads::UploadError;
        match error {
            UploadError::TooLarge(limit) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!("the file is larger than {limit} bytes"),
            ),
            UploadError::OverQuota(quota) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "UPLOAD_QUOTA",
                format!("the principal's uploads would exceed their quota of {quota} bytes"),
            ),
            UploadError::Type(declared) if declared.is_empty() => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                "an upload needs a Content-Type (the accepted ones are in /info's `uploads.types`)",
            ),
            UploadError::Type(declared) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                format!(
                    "content type {declared:?} is not accepted (the accepted ones are in \
                     /info's `uploads.types`)"
                ),
            ),
            UploadError::Mismatch(declared) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "CONTENT_MISMATCH",
                format!("the file's bytes are not {declared}, as its Content-Type says"),
            ),
            UploadError::Body => ApiError::invalid_request("the request body could not be read"),
            UploadError::Empty => ApiError::invalid_request("the file is empty"),
            UploadError::Io(error) => {
                tracing::error!(%error, "an upload could not be stored");
                ApiError::internal()
            }
        }
    }
}

impl ApiError {
    /// Whether this is a 404 (a thing that is not here may be on another node).
    pub fn is_not_found(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
    }

    /// `/readyz` when the daemon is draining or an agent cannot start: 503, in the shape
    /// of the ready answer (`{"status":"unavailable"}`), not an error object.
    pub fn not_ready() -> Response<Body> {
        let mut response = Response::new(full(Bytes::from_static(br#"{"status":"unavailable"}"#)));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
            allow: None,
            forward: None,
            run_id: None,
        }
    }

    /// Another node owns the thread. Sent on to it when possible; as an answer (a request
    /// that was already sent on once, or an owner that cannot be reached), a 503 to retry
    /// once the lease has moved or been renewed.
    pub fn elsewhere(owner: Owner) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "OWNER_UNAVAILABLE",
            "another node owns this thread and could not be reached; retry",
        );
        e.retry_after = Some(owner.expires_in.max(Duration::from_secs(1)));
        e.forward = Some(Box::new(owner));
        e
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no such {what}"),
        )
    }

    pub fn unknown_agent(name: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "UNKNOWN_AGENT",
            format!("no agent named {name:?}"),
        )
    }

    pub fn method_not_allowed(allow: &'static str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("method not allowed; allowed: {allow}"),
        );
        e.allow = Some(allow);
        e
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "missing or invalid bearer token",
        )
    }

    /// A token that was presented and refused, with the reason (expired, wrong audience,
    /// ...); the token itself is never echoed.
    pub fn unauthorized_because(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", reason)
    }

    /// The principal may call, but not this: a capability its token lacks, or an
    /// operator-only route.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN", message)
    }

    /// A link to an upload that does not hold (altered, expired, another daemon's).
    pub fn forbidden_link(error: crate::uploads::PreviewError) -> ApiError {
        let code = match error {
            crate::uploads::PreviewError::Expired => "LINK_EXPIRED",
            _ => "BAD_LINK",
        };
        ApiError::new(StatusCode::FORBIDDEN, code, error.to_string())
    }

    /// The principal holds as many runs as it may.
    pub fn principal_busy() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_RUNS",
            "this principal already has its most concurrent runs; retry when one ends",
        );
        e.retry_after = Some(Duration::from_secs(1));
        e
    }

    /// `origin` (the request's, as sent) is not allowed: the message names the flag
    /// that would allow it.
    pub fn forbidden_origin(origin: &str) -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "FORBIDDEN_ORIGIN",
            format!(
                "origin not allowed: {origin} is not the daemon's own origin nor in its allowed \
                 origins; start it with --allowed-origin {origin} (or allowed_origins in [server])"
            ),
        )
    }

    /// A fleet stream over a cap.
    pub fn fleet_full(full: crate::runtime::FleetFull) -> ApiError {
        let message = match full {
            crate::runtime::FleetFull::Total(n) => {
                format!("the daemon serves at most {n} fleet streams at once")
            }
            crate::runtime::FleetFull::Principal(n) => {
                format!("a principal may hold at most {n} fleet streams at once")
            }
        };
        let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_STREAMS", message);
        e.retry_after = Some(Duration::from_secs(5));
        e
    }

    pub fn not_acceptable() -> ApiError {
        ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "NOT_ACCEPTABLE",
            "this endpoint produces text/event-stream",
        )
    }

    pub fn unsupported_media_type() -> ApiError {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the request body must be application/json",
        )
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("request body exceeds {limit} bytes"),
        )
    }

    pub fn invalid_input(message: impl Into<String>, field: Option<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "INVALID_INPUT", message);
        e.field = field;
        e
    }

    pub fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_INPUT", message)
    }

    /// A token is required but none is configured: fail closed.
    pub fn auth_misconfigured() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "AUTH_MISCONFIGURED",
            "the server requires a token but none is configured",
        )
    }

    pub fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "internal error",
        )
    }

    pub fn store_unavailable() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "the thread store is unavailable",
        )
    }

    pub fn draining() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "DRAINING",
            "the server is shutting down",
        );
        e.retry_after = Some(Duration::from_secs(5));
        e
    }

    pub fn over_capacity() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "OVER_CAPACITY",
            "too many concurrent runs; retry later",
        );
        e.retry_after = Some(Duration::from_secs(1));
        e
    }

    /// The request body did not arrive within the body-read timeout.
    pub fn request_timeout(timeout: Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "REQUEST_TIMEOUT",
            format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        )
    }

    /// A connection over the listener's connection cap.
    pub fn too_many_connections() -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "OVER_CAPACITY",
            "too many open connections; retry later",
        );
        e.retry_after = Some(Duration::from_secs(1));
        e
    }

    /// A request the HTTP/1.1 parser refused before routing, by the status it chose: 400
    /// (bad request line or header), 414 (URI too long) or 431 (headers too large).
    pub fn unparsable_request(status: StatusCode) -> ApiError {
        match status {
            StatusCode::URI_TOO_LONG => ApiError::uri_too_long(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ApiError::headers_too_large(),
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "MALFORMED_REQUEST",
                "the request line or a header is malformed",
            ),
        }
    }

    /// The request target is over the URI limit.
    pub fn uri_too_long() -> ApiError {
        ApiError::new(
            StatusCode::URI_TOO_LONG,
            "URI_TOO_LONG",
            format!(
                "the request target exceeds {} bytes",
                super::body::MAX_URI_BYTES
            ),
        )
    }

    /// The request's headers are over the header limit.
    pub fn headers_too_large() -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "HEADERS_TOO_LARGE",
            format!(
                "the request headers exceed {} bytes",
                super::body::MAX_HEADER_BYTES
            ),
        )
    }

    /// The JSON body: `{"code","message"[,"field"]}`.
    pub fn body(&self) -> Bytes {
        let mut body = json!({"code": self.code, "message": self.message});
        if let Some(field) = &self.field {
            body["field"] = json!(field);
        }
        if let Some(run) = &self.run_id {
            body["runId"] = json!(**run);
        }
        Bytes::from(body.to_string())
    }

    /// The response for this error.
    pub fn into_response(self) -> Response<Body> {
        let mut response = Response::new(full(self.body()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(retry) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry.as_secs().max(1)));
        }
        if let Some(allow) = self.allow {
            headers.insert(ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

impl From<InputError> for ApiError {
    fn from(e: InputError) -> ApiError {
        ApiError::invalid_input(e.message, e.field)
    }
}

impl From<StartError> for ApiError {
    fn from(e: StartError) -> ApiError {
        match e {
            StartError::UnknownAgent(name) => ApiError::unknown_agent(&name),
            StartError::Draining => ApiError::draining(),
            StartError::OverCapacity => ApiError::over_capacity(),
            StartError::RunInProgress(run) => {
                let mut error = ApiError::new(
                    StatusCode::CONFLICT,
                    "RUN_IN_PROGRESS",
                    "a run is in progress on this thread (`runId`); attach to it, wait for it \
                     to end, or send with forwardedProps.agui.multitask = \"interrupt\"",
                );
                error.run_id = Some(Box::new(run));
                error
            }
            StartError::RunIdInUse => ApiError::new(
                StatusCode::CONFLICT,
                "RUN_IN_PROGRESS",
                "runId is already in use by a live run",
            ),
            StartError::Store => ApiError::store_unavailable(),
            StartError::AgentMismatch(agent) => ApiError::invalid_input(
                match agent {
                    Some(agent) => format!("thread belongs to agent {agent:?}"),
                    None => "thread belongs to another agent".to_owned(),
                },
                Some("threadId".to_owned()),
            ),
            StartError::PrincipalBusy => ApiError::principal_busy(),
            StartError::Elsewhere(owner) => ApiError::elsewhere(owner),
            StartError::Forbidden(capability) => ApiError::forbidden(format!(
                "this token lacks the `{}` capability",
                capability.name()
            )),
            StartError::Input(error) => error.into(),
            StartError::BudgetExceeded(why) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "BUDGET_EXCEEDED", why)
            }
            StartError::QueueMemory(bytes) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "QUEUE_MEMORY",
                format!(
                    "the daemon's memory budget has no room for {bytes} more bytes of queued input; wait for the queue to run, or send less"
                ),
            ),
            StartError::QueueFull => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "QUEUE_FULL",
                "the thread's queue holds its most items; wait for one to run or cancel one",
            ),
            StartError::Rewind(why) => {
                tracing::error!(%why, "the rewind of a client-owned history failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "REWIND_FAILED",
                    "the thread could not be taken back to the history the client sent",
                )
            }
        }
    }
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> ApiError {
        match e {
            ScheduleError::UnknownAgent => {
                ApiError::new(StatusCode::NOT_FOUND, "UNKNOWN_AGENT", "no such agent")
            }
            ScheduleError::Forbidden(capability) => ApiError::forbidden(format!(
                "this token lacks the `{}` capability",
                capability.name()
            )),
            ScheduleError::Input(error) => error.into(),
            ScheduleError::UnknownThread => ApiError::not_found("thread"),
            ScheduleError::AgentMismatch(agent) => StartError::AgentMismatch(agent).into(),
            ScheduleError::TooMany(n) => ApiError::new(
                StatusCode::CONFLICT,
                "TOO_MANY_SCHEDULES",
                format!("a principal may hold at most {n} schedules; delete one first"),
            ),
            ScheduleError::Store => ApiError::store_unavailable(),
        }
    }
}

impl From<ReattachError> for ApiError {
    fn from(e: ReattachError) -> ApiError {
        match e {
            ReattachError::UnknownThread => ApiError::not_found("thread"),
            ReattachError::Store => ApiError::store_unavailable(),
            ReattachError::Elsewhere(owner) => ApiError::elsewhere(owner),
        }
    }
}

impl From<crate::runtime::RewindError> for ApiError {
    fn from(e: crate::runtime::RewindError) -> ApiError {
        use crate::runtime::RewindError;
        match e {
            RewindError::UnknownThread => ApiError::not_found("thread"),
            RewindError::UnknownMessage(id) => {
                let mut e = ApiError::new(
                    StatusCode::NOT_FOUND,
                    "UNKNOWN_MESSAGE",
                    format!("the thread has no message {id:?}"),
                );
                e.field = Some("messageId".to_owned());
                e
            }
            RewindError::RunInProgress => ApiError::new(
                StatusCode::CONFLICT,
                "RUN_IN_PROGRESS",
                "a run is live on this thread; rewind it once the run has ended",
            ),
            RewindError::NoCheckpoints(message) => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "NO_CHECKPOINTS", message);
                e.field = Some("scope".to_owned());
                e
            }
            RewindError::Workspace(message) => {
                tracing::error!(%message, "a rewind could not put the workspace back");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "WORKSPACE_ERROR",
                    "the thread's workspace could not be put back",
                )
            }
            RewindError::Store => ApiError::store_unavailable(),
            RewindError::Elsewhere(owner) => ApiError::elsewhere(owner),
        }
    }
}

impl From<SessionRequestError> for ApiError {
    fn from(e: SessionRequestError) -> ApiError {
        match e {
            SessionRequestError::UnknownAgent => {
                ApiError::new(StatusCode::NOT_FOUND, "UNKNOWN_AGENT", "no such agent")
            }
            SessionRequestError::UnknownThread => ApiError::not_found("thread"),
            SessionRequestError::ThreadExists => {
                let mut e = ApiError::new(
                    StatusCode::CONFLICT,
                    "THREAD_EXISTS",
                    "a thread with this id exists",
                );
                e.field = Some("threadId".to_owned());
                e
            }
            SessionRequestError::RunInProgress => ApiError::new(
                StatusCode::CONFLICT,
                "RUN_IN_PROGRESS",
                "a run is in progress on this thread; fork it once the run has ended",
            ),
            SessionRequestError::Draining => ApiError::draining(),
            SessionRequestError::Elsewhere(owner) => ApiError::elsewhere(owner),
            SessionRequestError::Store => ApiError::store_unavailable(),
            SessionRequestError::Agent(SessionError::Unsupported(what)) => ApiError::new(
                StatusCode::NOT_FOUND,
                "NOT_SUPPORTED",
                format!("the agent {what}"),
            ),
            SessionRequestError::Agent(SessionError::NotFound(message)) => {
                ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
            }
            SessionRequestError::Agent(SessionError::InUse(message)) => {
                ApiError::new(StatusCode::CONFLICT, "SESSION_IN_USE", message)
            }
            // The agent, not the request, failed: a gateway error.
            SessionRequestError::Agent(SessionError::Failed(message)) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "AGENT_ERROR", message)
            }
        }
    }
}
