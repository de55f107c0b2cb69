//! The loopback MCP listener: MCP servers (streamable HTTP, rmcp's `StreamableHttpService`)
//! served on `127.0.0.1` through the same accept loop as the public API, so the same
//! header-read and body timeouts, connection cap, bearer check, error format and shutdown
//! apply.
//!
//! Each endpoint is `/mcp/<id>` with a bearer secret of its own (`Authorization: Bearer`,
//! or `?token=` for MCP clients that send no headers). What the MCP server does is the
//! caller's: the ACP backend serves the browser's frontend tools here
//! (`agent/acp/mcp.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rmcp::ServerHandler;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::policy;
use crate::access::BearerToken;
use crate::agent::BoxFuture;
use crate::agent::acp::{FrontendTools, McpEndpoint, McpHost, McpListener};
use crate::http::body::{Body, MAX_BODY_BYTES, read_body};
use crate::http::error::ApiError;
use crate::http::transport::{ConnInfo, Handler, Limits, accept_loop};
use crate::logging;
use crate::sync::lock;

/// How long open MCP connections get to finish once the listener stops.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The limits of an MCP listener: the public listener's, with fewer connections (the
/// clients are local agent processes).
pub fn default_limits() -> Limits {
    Limits {
        max_connections: 64,
        ..Limits::default()
    }
}

/// The [`McpHost`] the server lends the ACP backend: listeners with `limits`.
#[derive(Debug, Clone)]
pub struct LoopbackMcp {
    limits: Limits,
}

impl LoopbackMcp {
    pub fn new(limits: Limits) -> LoopbackMcp {
        LoopbackMcp { limits }
    }
}

impl Default for LoopbackMcp {
    fn default() -> LoopbackMcp {
        LoopbackMcp::new(default_limits())
    }
}

impl McpHost for LoopbackMcp {
    fn listen(&self, stop: CancellationToken) -> BoxFuture<std::io::Result<Box<dyn McpListener>>> {
        let limits = self.limits;
        Box::pin(async move {
            let server = McpServer::<FrontendTools>::start(limits, stop).await?;
            Ok(Box::new(server) as Box<dyn McpListener>)
        })
    }
}

impl McpListener for McpServer<FrontendTools> {
    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn add(&self, tools: FrontendTools) -> McpEndpoint {
        McpServer::add(self, tools)
    }

    fn remove(&self, id: &str) {
        McpServer::remove(self, id)
    }

    fn closed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(McpServer::closed(self))
    }
}

/// A loopback listener serving MCP endpoints whose servers are `S`.
pub struct McpServer<S: ServerHandler + Clone> {
    addr: SocketAddr,
    endpoints: Arc<Endpoints<S>>,
    stop: CancellationToken,
    closed: CancellationToken,
}

struct Endpoints<S: ServerHandler + Clone> {
    map: Mutex<HashMap<String, Endpoint<S>>>,
}

struct Endpoint<S: ServerHandler + Clone> {
    secret: BearerToken,
    service: StreamableHttpService<S, LocalSessionManager>,
    /// Ends the endpoint's open MCP streams when it is removed.
    ended: CancellationToken,
    /// The secret is scrubbed from log lines while the endpoint exists.
    _logged: Arc<logging::SecretGuard>,
}

impl<S: ServerHandler + Clone> Clone for Endpoint<S> {
    fn clone(&self) -> Self {
        Endpoint {
            secret: self.secret.clone(),
            service: self.service.clone(),
            ended: self.ended.clone(),
            _logged: self._logged.clone(),
        }
    }
}

impl<S> McpServer<S>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    /// Binds `127.0.0.1:0` and serves until `stop` fires; then open connections get
    /// [`CLOSE_GRACE`] to finish and are closed.
    pub async fn start(limits: Limits, stop: CancellationToken) -> std::io::Result<McpServer<S>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let endpoints = Arc::new(Endpoints {
            map: Mutex::new(HashMap::new()),
        });
        let closed = CancellationToken::new();
        let serving = accept_loop(listener, None, endpoints.clone(), limits, stop.clone());
        let done = closed.clone();
        tokio::spawn(async move {
            let serving = serving.await;
            serving
                .finish(tokio::time::Instant::now() + CLOSE_GRACE)
                .await;
            done.cancel();
        });
        Ok(McpServer {
            addr,
            endpoints,
            stop,
            closed,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A new endpoint whose MCP sessions are served by clones of `server`.
    pub fn add(&self, server: S) -> McpEndpoint {
        let id = BearerToken::generate().expose()[..32].to_owned();
        let secret = BearerToken::generate();
        let ended = self.stop.child_token();
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_cancellation_token(ended.clone()),
        );
        lock(&self.endpoints.map).insert(
            id.clone(),
            Endpoint {
                secret: secret.clone(),
                service,
                ended,
                _logged: Arc::new(logging::register(secret.expose())),
            },
        );
        McpEndpoint {
            url: format!("http://{}/mcp/{id}", self.addr),
            id,
            secret,
        }
    }

    /// Removes an endpoint: later requests get 404, its open streams end.
    pub fn remove(&self, id: &str) {
        if let Some(endpoint) = lock(&self.endpoints.map).remove(id) {
            endpoint.ended.cancel();
        }
    }

    /// Resolves once the listener has stopped and its connections are closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }
}

impl<S: ServerHandler + Clone> Drop for McpServer<S> {
    /// A listener nobody can add endpoints to any more stops, like one told to.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<S> Handler for Endpoints<S>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    async fn handle(&self, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let method = req.method().clone();
        let response = match self.answer(req, conn).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        };
        tracing::debug!(method = %method, status = response.status().as_u16(), "MCP request");
        response
    }
}

impl<S> Endpoints<S>
where
    S: ServerHandler + Clone + Send + Sync + 'static,
{
    async fn answer(
        &self,
        req: Request<Incoming>,
        conn: ConnInfo,
    ) -> Result<Response<Body>, ApiError> {
        let id = req
            .uri()
            .path()
            .strip_prefix("/mcp/")
            .map(|id| id.trim_end_matches('/'));
        let endpoint = id.and_then(|id| lock(&self.map).get(id).cloned());
        let Some(endpoint) = endpoint else {
            return Err(ApiError::not_found("MCP endpoint"));
        };
        if !policy::presents_bearer(&endpoint.secret, req.headers(), req.uri().query()) {
            return Err(ApiError::unauthorized());
        }
        let (parts, body) = req.into_parts();
        let timeout = conn.limits.body_read_timeout;
        let body = read_body(body, &parts.headers, MAX_BODY_BYTES, timeout).await?;
        let request = Request::from_parts(parts, Full::new(body));
        let mut service = endpoint.service;
        match service.call(request).await {
            Ok(response) => Ok(response.map(BodyExt::boxed_unsync)),
            Err(never) => match never {},
        }
    }
}
