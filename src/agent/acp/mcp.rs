//! Frontend tools over MCP: the browser's tools (`RunAgentInput.tools`) served to ACP agents
//! as an MCP server (streamable HTTP, the rmcp crate) on a loopback listener of its own.
//!
//! Each ACP session that the agent can give MCP servers gets its own URL
//! (`http://127.0.0.1:PORT/mcp/<token>`) and bearer secret, passed in
//! `session/new.mcpServers` as the server `frontend`. `tools/list` answers the tools of the
//! session's current run; a `tools/call` goes to the session's turn, which calls the
//! frontend tool (the AG-UI segment ends, the run waits) and answers the MCP request with
//! the browser's result.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    ListToolsResult, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tower_service::Service;

use super::process::{Router, SessionEvent};
use crate::agent::ToolAnswer;
use crate::protocol::input::Tool;

type McpService = StreamableHttpService<FrontendTools, LocalSessionManager>;
type McpBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// The loopback MCP listener shared by every session of an agent.
pub(super) struct McpBridge {
    addr: SocketAddr,
    bindings: Arc<Mutex<HashMap<String, Binding>>>,
}

#[derive(Clone)]
struct Binding {
    secret: String,
    /// The ACP session id (known once `session/new` has answered).
    session: Arc<Mutex<String>>,
    tools: Arc<Mutex<Vec<Tool>>>,
    service: McpService,
}

/// Names the session an endpoint belongs to, once the agent has said it.
pub(super) struct McpHandle {
    session: Arc<Mutex<String>>,
}

impl McpHandle {
    pub(super) fn set_session(&self, session: &str) {
        *lock(&self.session) = session.to_owned();
    }
}

impl McpBridge {
    /// Binds 127.0.0.1:0 and serves until the process ends.
    pub(super) async fn start() -> std::io::Result<Arc<McpBridge>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let bindings: Arc<Mutex<HashMap<String, Binding>>> = Arc::default();
        let served = bindings.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let bindings = served.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let bindings = bindings.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&bindings, req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Err(error) = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(%error, "MCP connection ended");
                    }
                });
            }
        });
        Ok(Arc::new(McpBridge { addr, bindings }))
    }

    /// Gives `session` an MCP endpoint whose calls go to the session's turn through
    /// `router`; returns the `mcpServers` entry for `session/new` / `session/load`.
    pub(super) fn bind(&self, router: &Arc<Router>) -> (Value, McpHandle) {
        let token = hex(&rand::random::<[u8; 16]>());
        let secret = hex(&rand::random::<[u8; 32]>());
        let tools: Arc<Mutex<Vec<Tool>>> = Arc::default();
        let session: Arc<Mutex<String>> = Arc::default();
        let handler = FrontendTools {
            router: Arc::downgrade(router),
            session: session.clone(),
            tools: tools.clone(),
        };
        let service = StreamableHttpService::new(
            move || Ok(handler.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        lock(&self.bindings).insert(
            token.clone(),
            Binding {
                secret: secret.clone(),
                session: session.clone(),
                tools,
                service,
            },
        );
        let entry = json!({
            "type": "http",
            "name": "frontend",
            // The secret also rides in the URL for agents that send no headers.
            "url": format!("http://{}/mcp/{token}?token={secret}", self.addr),
            "headers": [{"name": "Authorization", "value": format!("Bearer {secret}")}],
        });
        (entry, McpHandle { session })
    }

    /// The tools a session's MCP endpoint offers from now on (the current run's).
    pub(super) fn set_tools(&self, session: &str, tools: &[Tool]) {
        for binding in lock(&self.bindings).values() {
            if *lock(&binding.session) == session {
                *lock(&binding.tools) = tools.to_vec();
            }
        }
    }

    /// Drops a session's endpoints.
    pub(super) fn unbind(&self, session: &str) {
        lock(&self.bindings).retain(|_, b| *lock(&b.session) != session);
    }
}

async fn handle(
    bindings: &Mutex<HashMap<String, Binding>>,
    req: Request<Incoming>,
) -> Response<McpBody> {
    let token = req
        .uri()
        .path()
        .strip_prefix("/mcp/")
        .map(|t| t.trim_end_matches('/').to_owned());
    let binding = token.and_then(|t| lock(bindings).get(&t).cloned());
    let Some(binding) = binding else {
        return plain(StatusCode::NOT_FOUND, "no such MCP endpoint");
    };
    let from_query = req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    });
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or(from_query)
        .unwrap_or_default();
    let expected = binding.secret.as_bytes();
    if presented.len() != expected.len() || !bool::from(presented.as_bytes().ct_eq(expected)) {
        return plain(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
    }
    let mut service = binding.service.clone();
    match service.call(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

fn plain(status: StatusCode, message: &str) -> Response<McpBody> {
    let mut response = Response::new(Full::new(Bytes::from(message.to_owned())).boxed());
    *response.status_mut() = status;
    response
}

/// The MCP server of one session: the frontend tools of its current run.
#[derive(Clone)]
struct FrontendTools {
    router: std::sync::Weak<Router>,
    session: Arc<Mutex<String>>,
    tools: Arc<Mutex<Vec<Tool>>>,
}

impl ServerHandler for FrontendTools {
    fn get_info(&self) -> ServerConfig {
        serde_json::from_value(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "agui-serve-frontend", "version": env!("CARGO_PKG_VERSION")},
            "instructions": "Tools that run in the user's browser.",
        }))
        .unwrap_or_default()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools: Vec<Value> = lock(&self.tools)
            .iter()
            .map(|tool| {
                let schema = match &tool.parameters {
                    Some(Value::Object(schema)) => Value::Object(schema.clone()),
                    _ => json!({"type": "object"}),
                };
                json!({"name": tool.name, "description": tool.description, "inputSchema": schema})
            })
            .collect();
        serde_json::from_value(json!({"tools": tools}))
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if !lock(&self.tools).iter().any(|t| t.name == name) {
            return Ok(CallToolResult::error(vec![Content::text(format!(
                "the browser does not offer a tool named {name}"
            ))])
            .into());
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default()).to_string();
        let Some(router) = self.router.upgrade() else {
            return Ok(CallToolResult::error(vec![Content::text("the session has ended")]).into());
        };
        let (reply, answer) = oneshot::channel();
        let session = lock(&self.session).clone();
        if !router.deliver(
            &session,
            SessionEvent::FrontendCall {
                name,
                arguments,
                reply,
            },
        ) {
            return Ok(CallToolResult::error(vec![Content::text(
                "no turn is running on this session",
            )])
            .into());
        }
        Ok(match answer.await {
            Ok(ToolAnswer::Result(text)) => CallToolResult::success(vec![Content::text(text)]),
            Ok(ToolAnswer::Error(why)) => CallToolResult::error(vec![Content::text(why)]),
            Err(_) => CallToolResult::error(vec![Content::text(
                "the run ended before the browser answered",
            )]),
        }
        .into())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_lists_convert() {
        let r: Result<ListToolsResult, _> = serde_json::from_value(json!({"tools": [
            {"name": "chart", "description": "draw", "inputSchema": {"type": "object"}}
        ]}));
        assert!(r.is_ok(), "{r:?}");
        let info: Result<ServerConfig, _> = serde_json::from_value(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "agui-serve-frontend", "version": "1"},
        }));
        assert!(info.is_ok(), "{info:?}");
    }

    #[tokio::test]
    async fn endpoints_require_their_own_bearer_secret() {
        let bridge = McpBridge::start().await.expect("bridge");
        let router = Arc::new(Router::default());
        let (entry, handle) = bridge.bind(&router);
        handle.set_session("s1");
        let with_query = entry["url"].as_str().expect("url").to_owned();
        assert!(with_query.starts_with("http://127.0.0.1:"));
        let url = with_query.split('?').next().expect("path").to_owned();
        let auth = entry["headers"][0]["value"]
            .as_str()
            .expect("auth")
            .to_owned();
        let http = reqwest::Client::new();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        for bad in [None, Some("Bearer wrong")] {
            let mut request = http
                .post(&url)
                .header("accept", "application/json, text/event-stream")
                .json(&init);
            if let Some(bad) = bad {
                request = request.header("authorization", bad);
            }
            assert_eq!(request.send().await.expect("request").status(), 401);
        }
        let other = url.replace("/mcp/", "/mcp/x");
        let r = http
            .post(&other)
            .header("authorization", &auth)
            .json(&init)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 404);
        let r = http
            .post(&url)
            .header("authorization", &auth)
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
        // The secret in the URL is accepted too (agents that send no headers).
        let r = http
            .post(&with_query)
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
        bridge.unbind("s1");
        let r = http
            .post(&url)
            .header("authorization", &auth)
            .json(&init)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 404, "unbound");
    }
}
