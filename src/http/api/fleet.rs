//! The ambient plane: `GET {path}/fleet/stream`.

use http::{HeaderMap, HeaderValue, Response};

use super::App;
use super::common::{check_accept, query_param, sse_headers};
use super::threads::last_event_id;
use crate::access::Principal;
use crate::http::body::{Body, fleet_stream};
use crate::http::error::ApiError;
use crate::protocol::Offer;
use crate::runtime::FleetFrom;

/// `GET {path}/fleet/stream`: the principal's view of the fleet; replay after
/// `Last-Event-ID` (or `?lastEventId=`), else after `?since=<RFC 3339>`, then the snapshot,
/// then live changes.
pub(super) fn stream(
    app: &App,
    principal: &Principal,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    check_accept(headers, Offer::EventStream)?;
    let from = match (last_event_id(headers, query), query_param(query, "since")) {
        (Some(id), _) => FleetFrom::After(id),
        (None, Some(since)) => {
            let time = humantime::parse_rfc3339_weak(since.trim()).map_err(|_| {
                ApiError::invalid_input(
                    "since must be an RFC 3339 time, e.g. 2026-12-01T12:00:00Z",
                    Some("since".to_owned()),
                )
            })?;
            let ms = time
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            FleetFrom::Since(ms)
        }
        (None, None) => FleetFrom::Now,
    };
    let stream = app
        .runtime
        .fleet_stream(principal, from)
        .map_err(ApiError::fleet_full)?;
    let resume = if stream.is_exact() { "exact" } else { "resync" };
    let mut response = Response::new(fleet_stream(stream));
    sse_headers(response.headers_mut());
    response
        .headers_mut()
        .insert("agui-resume", HeaderValue::from_static(resume));
    Ok(response)
}
