//! The metrics scrape: the response of `GET {path}/metrics` (behind the bearer check, in
//! `api/mod.rs`) and the optional metrics listener (`--metrics-listen`), which serves
//! `GET /metrics` without a token on its own socket, meant for a scraper on loopback.
//!
//! The listener runs on the shared accept loop (`listener.rs`) with plain HTTP and answers
//! nothing but `/metrics`: every other path is a JSON 404, every other method a JSON 405.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response};
use hyper::body::Incoming;

use crate::http::body::{Body, full};
use crate::http::error::ApiError;
use crate::http::transport::{ConnInfo, Handler};
use crate::metrics::{self, Metrics};

/// The scrape: every metric, gauges sampled now.
pub(super) fn response(metrics: &Metrics) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(metrics.render())));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    response
}

/// The handler of the metrics listener.
pub struct MetricsEndpoint {
    metrics: Arc<Metrics>,
}

impl MetricsEndpoint {
    pub fn new(metrics: Arc<Metrics>) -> MetricsEndpoint {
        MetricsEndpoint { metrics }
    }
}

impl Handler for MetricsEndpoint {
    async fn handle(&self, req: Request<Incoming>, _conn: ConnInfo) -> Response<Body> {
        let started = Instant::now();
        let (route, response) = match (req.uri().path(), req.method()) {
            ("/metrics", &Method::GET) => ("metrics_listener", response(&self.metrics)),
            ("/metrics", _) => (
                "metrics_listener",
                ApiError::method_not_allowed("GET").into_response(),
            ),
            _ => ("none", ApiError::not_found("route").into_response()),
        };
        self.metrics
            .http()
            .request(route, response.status().as_u16(), started.elapsed());
        response
    }
}
