//! The only code that knows hyper: the accept loop shared by every listener
//! (`listener.rs`), TLS, per-connection limits, the public routes, the loopback MCP
//! endpoint (`mcp.rs`), the OTLP exporter's client (`otlp.rs`), policy, and the mapping of errors to status codes (`error.rs`).
//!
//! Connection limits: a client has [`Limits::header_read_timeout`] from accept to finish
//! its TLS handshake and its first request's headers (a watchdog closes it otherwise; hyper
//! enforces the same bound on later HTTP/1.1 requests with its own timer). A listener
//! serves at most [`Limits::max_connections`] connections. Stream connections get a
//! bounded kernel send buffer, so a reader that stops draining stalls only itself.

pub mod body;
mod console;
mod copilotkit;
pub mod error;
pub mod forward;
pub mod listener;
pub mod mcp;
pub mod metrics_endpoint;
pub mod otlp;
mod parse_errors;
pub mod policy;
pub mod routes;
pub mod tls;
mod workspace;

use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;

use std::sync::Arc;

use crate::config::Auth;
use crate::metrics::Metrics;
use crate::runtime::Runtime;
use crate::traces::{RequestInfo, Tracer};
use body::Body;
pub use listener::{ConnInfo, Handler, Serving, accept_loop};
use opentelemetry::context::FutureExt as _;
use policy::OriginPolicy;

/// Largest request head (request line and headers) accepted, in all: over it, 431
/// `HEADERS_TOO_LARGE` (HTTP/2: the header list, answered 431 by the HTTP/2 layer).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Longest request target (path and query) accepted: over it, 414 `URI_TOO_LONG`.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most header fields in an HTTP/1.1 request: over it, 431 `HEADERS_TOO_LARGE`.
pub const MAX_HEADER_FIELDS: usize = 100;

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

/// What every request handler can see.
pub struct App {
    pub(crate) runtime: Runtime,
    pub(crate) path: String,
    pub(crate) auth: Auth,
    pub(crate) origins: OriginPolicy,
    /// `(name, description)` of each agent, in configuration order.
    pub(crate) agents: Vec<(String, String)>,
    pub(crate) metrics: Arc<Metrics>,
    /// Scoped tokens and the trusted principal header.
    pub(crate) access: policy::Access,
    /// Spans per request (and the parent of the runs they start), when traces are
    /// exported.
    pub(crate) tracer: Option<Tracer>,
    /// The hop to other nodes, in a cluster.
    pub(crate) forwarder: Option<forward::Forwarder>,
}

impl App {
    pub fn new(
        runtime: Runtime,
        path: String,
        auth: Auth,
        allowed_origins: &[String],
        agents: Vec<(String, String)>,
        metrics: Arc<Metrics>,
    ) -> App {
        App {
            runtime,
            path,
            auth,
            origins: OriginPolicy::new(allowed_origins),
            agents,
            metrics,
            access: policy::Access::default(),
            tracer: None,
            forwarder: None,
        }
    }

    /// Sends requests for threads another node owns to that node (cluster).
    pub fn with_forwarder(mut self, forwarder: forward::Forwarder) -> App {
        self.forwarder = Some(forwarder);
        self
    }

    /// Recognizes principals besides the operator (scoped tokens, the trusted header).
    pub fn with_access(mut self, access: policy::Access) -> App {
        self.access = access;
        self
    }
}

impl Handler for App {
    async fn handle(&self, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        // Boxed: hyper keeps one slot of the service future's size for the whole life of
        // an HTTP/1.1 connection (an open event stream included); boxed, the slot holds a
        // pointer and the request's own state is freed as soon as the response is ready.
        match &self.tracer {
            None => Box::pin(routes::handle(self, req, conn)).await,
            Some(tracer) => Box::pin(traced(self, tracer, req, conn)).await,
        }
    }
}

/// [`routes::handle`] inside the request's span.
async fn traced(
    app: &App,
    tracer: &Tracer,
    req: Request<Incoming>,
    conn: ConnInfo,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let span = tracer.request(
        &otlp::remote_parent(req.headers()),
        RequestInfo {
            method: method.as_str(),
            route: routes::template(&app.path, &path),
            path: &path,
            scheme: if conn.tls { "https" } else { "http" },
            protocol_version: if req.version() == http::Version::HTTP_2 {
                "2"
            } else {
                "1.1"
            },
        },
    );
    // The handler runs in the request's context: a run it starts is the span's child.
    let response = routes::handle(app, req, conn)
        .with_context(span.context())
        .await;
    span.end(response.status().as_u16());
    response
}
