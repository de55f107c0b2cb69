//! The only code that knows hyper, in two layers over a shared ground:
//! - `body.rs` and `error.rs`: request and response bodies, and the one place that picks
//!   error statuses;
//! - [`transport`]: listeners, TLS, limits, and the HTTP clients (forwarding, OTLP,
//!   webhooks);
//! - [`api`]: the route table, the middleware (origin, token, principal, audit, CORS), the
//!   handlers by resource, forwarding to a thread's owner, and the loopback MCP and metrics
//!   listeners.
//!
//! A file of a lower layer never imports one of a higher (`tests/layers.rs`).

pub mod api;
pub mod body;
pub mod error;
pub mod transport;

pub use api::policy::Auth;
pub use api::{App, mcp, metrics_endpoint, policy};
pub use transport::{
    ConnInfo, DEFAULT_MAX_CONNECTIONS, Handler, Limits, MAX_HEADER_BYTES, MAX_HEADER_FIELDS,
    MAX_URI_BYTES, Serving, accept_loop, forward, otlp, tls, webhook,
};
