//! What the handlers share: the audit record, capability checks, request bodies and query
//! parameters, and the JSON and event-stream responses.

use bytes::Bytes;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, VARY};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::access::{Capability, Principal};
pub(super) use crate::clock::rfc3339;
use crate::http::body::{
    Body, MAX_BODY_BYTES, RequestBody, event_stream, full, protobuf_stream, read_body,
};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::protocol::{Negotiated, Offer, negotiate, proto};
use crate::runtime::Attachment;

/// What the audit line of a request says besides its principal, action and outcome.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    /// `operator` for the master token, else the principal's name.
    pub(crate) principal: Option<String>,
    /// How the request authenticated (`none` until it has).
    pub(crate) auth: Option<&'static str>,
    /// The namespace acted in (`""`: the operator's own).
    pub(crate) owner: String,
    pub(crate) thread: Option<String>,
    pub(crate) run: Option<String>,
}

/// An error unless `principal` has `capability`.
pub(super) fn require(principal: &Principal, capability: Capability) -> Result<(), ApiError> {
    if principal.can(capability) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "this token lacks the `{}` capability",
            capability.name()
        )))
    }
}

/// A request answered with an event stream: a JSON body, and an `Accept` that allows one
/// of the representations `offer` names; the one to send.
pub(super) fn check_stream_request(
    headers: &HeaderMap,
    offer: Offer,
) -> Result<Negotiated, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::unsupported_media_type());
    }
    check_accept(headers, offer)
}

/// The representation `headers` accept among those `offer` names, else 406.
pub(super) fn check_accept(headers: &HeaderMap, offer: Offer) -> Result<Negotiated, ApiError> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    negotiate(accept, offer).ok_or_else(ApiError::not_acceptable)
}

/// Reads a JSON request body (within the body limits).
pub(super) async fn read_json(
    body: RequestBody,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Result<serde_json::Value, ApiError> {
    let bytes = read_request_body(body, headers, conn).await?;
    parse_json(&bytes)
}

/// Reads a request body whole, within the body limits.
pub(super) async fn read_request_body(
    body: RequestBody,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Result<bytes::Bytes, ApiError> {
    read_body(body, headers, MAX_BODY_BYTES, conn.limits.body_read_timeout)
        .await
        .map_err(ApiError::from)
}

/// A request body that may be empty: `None` for nothing (or whitespace), else its JSON.
pub(super) async fn read_optional_json(
    body: RequestBody,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Result<Option<serde_json::Value>, ApiError> {
    let bytes = read_request_body(body, headers, conn).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    parse_json(&bytes).map(Some)
}

pub(super) fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| {
        ApiError::invalid_input(format!("the body is not valid JSON: {error}"), None)
    })
}

pub(super) fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

pub(super) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// A positive integer query parameter, defaulted and capped.
pub(super) fn query_usize(
    query: Option<&str>,
    key: &str,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match query_param(query, key) {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n.min(max)),
            _ => Err(ApiError::invalid_input(
                format!("{key} must be a positive integer"),
                Some(key.to_owned()),
            )),
        },
    }
}

pub(super) fn json_response(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The 200 event-stream response for an attachment, in the negotiated representation.
pub(super) fn stream_response(attachment: Attachment, format: Negotiated) -> Response<Body> {
    let resume = attachment.resume();
    let mut response = match format {
        Negotiated::EventStream => Response::new(event_stream(attachment)),
        Negotiated::Protobuf => Response::new(protobuf_stream(attachment)),
    };
    let headers = response.headers_mut();
    sse_headers(headers);
    if format == Negotiated::Protobuf {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(proto::MEDIA_TYPE));
    }
    headers.insert("agui-resume", HeaderValue::from_static(resume.as_str()));
    response
}

/// The headers of every event stream.
pub(super) fn sse_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(VARY, HeaderValue::from_static("accept"));
}
