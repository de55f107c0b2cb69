//! Transport: the accept loop every listener shares (`listener.rs`), TLS, the answers to
//! malformed requests (`parse_errors.rs`), and the clients the daemon sends with (to
//! another node, `forward.rs`; to an OTLP collector, `otlp.rs`; to a webhook endpoint,
//! `webhook.rs`). Knows nothing of routes.
//!
//! Connection limits: a client has [`Limits::header_read_timeout`] from accept to finish
//! its TLS handshake and its first request's headers (a watchdog closes it otherwise; hyper
//! enforces the same bound on later HTTP/1.1 requests with its own timer). A listener
//! serves at most [`Limits::max_connections`] connections. Stream connections get a
//! bounded kernel send buffer, so a reader that stops draining stalls only itself.

pub mod egress;
pub mod forward;
pub mod listener;
pub mod otlp;
mod parse_errors;
pub mod tls;
pub mod webhook;

use std::time::Duration;

pub use crate::http::body::{MAX_HEADER_BYTES, MAX_HEADER_FIELDS, MAX_URI_BYTES};
pub use listener::{ConnInfo, Handler, Serving, accept_loop};

/// The default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Per-listener and per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time allowed from accept to the end of the first request's headers (TLS handshake
    /// included), and for each later HTTP/1.1 request's headers.
    pub header_read_timeout: Duration,
    /// Time allowed to receive a request's whole body, from the end of its headers.
    pub body_read_timeout: Duration,
    /// Kernel send buffer per connection (bytes).
    pub send_buffer: usize,
    /// Connections served at once by one listener.
    pub max_connections: usize,
    /// Requests in flight at once on one HTTP/2 connection (`SETTINGS_MAX_CONCURRENT_STREAMS`;
    /// a client that opens more gets `REFUSED_STREAM`, which it may retry).
    pub max_h2_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            send_buffer: 256 * 1024,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_h2_streams: 100,
        }
    }
}

/// An HTTP client connector for `https` and `http` URLs, HTTPS verified against the
/// system's roots (without any, only plain HTTP works: said once, for `what`), connecting
/// within `connect_timeout`, no Nagle, HTTP/1.1.
pub(crate) fn system_roots_connector(
    connect_timeout: Duration,
    what: &str,
) -> std::io::Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>>
{
    use hyper_rustls::HttpsConnectorBuilder;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        match HttpsConnectorBuilder::new().with_provider_and_native_roots(provider.clone()) {
            Ok(builder) => builder,
            Err(error) => {
                tracing::warn!(%error, "no system root certificates: https {what} will fail");
                HttpsConnectorBuilder::new().with_tls_config(
                    rustls::ClientConfig::builder_with_provider(provider)
                        .with_safe_default_protocol_versions()
                        .map_err(std::io::Error::other)?
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
            }
        };
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    Ok(builder.https_or_http().enable_http1().wrap_connector(http))
}
