//! The OTLP exporter's HTTP client, and the request side of traces: the W3C `traceparent`
//! a client sends.
//!
//! The OpenTelemetry SDK exports from its own thread, where no tokio reactor runs; hyper's
//! client needs one. [`OtlpClient`] hands each export to the daemon's runtime and waits for
//! it there, so the exporter needs no second runtime and no other HTTP stack. It speaks
//! plain HTTP, or HTTPS with the rustls the daemon serves with, trusting the system's root
//! certificates (`SSL_CERT_FILE` / `SSL_CERT_DIR` override them); export failures are
//! logged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// Sends the exporter's requests with hyper, on the daemon's tokio runtime.
#[derive(Debug, Clone)]
pub struct OtlpClient {
    client: HyperClient<HttpsConnector<HttpConnector>>,
    runtime: tokio::runtime::Handle,
}

impl OtlpClient {
    /// A client on the current tokio runtime; each request is bounded by `timeout`. With
    /// `https`, the system's root certificates are loaded (none found is an error).
    pub fn new(timeout: Duration, https: bool) -> std::io::Result<OtlpClient> {
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = HttpsConnectorBuilder::new();
        let builder = if https {
            builder.with_provider_and_native_roots(provider)?
        } else {
            // Plain HTTP: the TLS side is never used.
            builder.with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(std::io::Error::other)?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        };
        let connector = builder.https_or_http().enable_http1().build();
        Ok(OtlpClient {
            client: HyperClient::new(connector, timeout, None),
            runtime,
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
