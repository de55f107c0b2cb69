//! The OTLP exporter's HTTP client, and the request side of traces: the W3C `traceparent`
//! a client sends.
//!
//! The OpenTelemetry SDK exports from its own thread, where no tokio reactor runs; hyper's
//! client needs one. [`OtlpClient`] hands each export to the daemon's runtime and waits for
//! it there, so the exporter needs no second runtime and no other HTTP stack. It speaks
//! plain HTTP (a collector on loopback or the local network); export failures are logged.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// Sends the exporter's requests with hyper, on the daemon's tokio runtime.
#[derive(Debug, Clone)]
pub struct OtlpClient {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
}

impl OtlpClient {
    /// A client on the current tokio runtime; each request is bounded by `timeout`.
    pub fn new(timeout: Duration) -> Result<OtlpClient, tokio::runtime::TryCurrentError> {
        Ok(OtlpClient {
            client: HyperClient::with_default_connector(timeout, None),
            runtime: tokio::runtime::Handle::try_current()?,
        })
    }
}

type Sent<'a> = Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'a>>;

// The trait is declared with `async_trait`; this is its expanded signature.
impl HttpClient for OtlpClient {
    fn send_bytes<'life0, 'async_trait>(&'life0 self, request: Request<Bytes>) -> Sent<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let client = self.client.clone();
        let task = self
            .runtime
            .spawn(async move { client.send_bytes(request).await });
        Box::pin(async move {
            let result = match task.await {
                Ok(result) => result,
                Err(error) => Err(Box::new(error) as HttpError),
            };
            match &result {
                Ok(response) if !response.status().is_success() => {
                    tracing::warn!(
                        status = response.status().as_u16(),
                        "trace export refused by the collector"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "trace export failed"),
            }
            result
        })
    }
}

/// The parent a client's `traceparent` (and `tracestate`) header names, or an empty
/// context.
pub(crate) fn remote_parent(headers: &http::HeaderMap) -> Context {
    if !headers.contains_key("traceparent") {
        return Context::new();
    }
    TraceContextPropagator::new().extract_with_context(
        &Context::new(),
        &opentelemetry_http::HeaderExtractor(headers),
    )
}
