//! Frontend tools over MCP: the browser's tools (`RunAgentInput.tools`) served to ACP agents
//! as an MCP server (streamable HTTP, the rmcp crate) on a loopback MCP listener, one per
//! agent, that the server lends the backend as an [`McpHost`] (the HTTP layer serves it
//! like the public API; this backend knows no HTTP stack).
//!
//! Each ACP session that the agent can give MCP servers gets its own URL
//! (`http://127.0.0.1:PORT/mcp/<id>`) and bearer secret, passed in
//! `session/new.mcpServers` as the server `frontend`. `tools/list` answers the tools of the
//! session's current run; a `tools/call` goes to the session's turn, which calls the
//! frontend tool (the AG-UI segment ends, the run waits) and answers the MCP request with
//! the browser's result.
//!
//! Every endpoint also offers [`EMIT_UI`]: the agent shows a component from the daemon's
//! allow-listed catalog (generative UI, see `runtime::ui`); an accepted one reaches the
//! client as an `ACTIVITY_SNAPSHOT`, a refused one is a tool error with the reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{HttpHeader, McpServer as AcpMcpServer, McpServerHttp};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    ListToolsResult, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::router::{Router, SessionEvent};
use crate::access::BearerToken;
use crate::agent::{BoxFuture, ToolAnswer};
use crate::protocol::input::Tool;
use crate::sync::lock;

/// Starts loopback MCP listeners: lent to the ACP backend by the server.
pub trait McpHost: std::fmt::Debug + Send + Sync + 'static {
    /// Binds `127.0.0.1:0` and serves until `stop` fires; then open connections get a
    /// short grace and are closed.
    fn listen(&self, stop: CancellationToken) -> BoxFuture<std::io::Result<Box<dyn McpListener>>>;
}

/// One loopback listener's endpoints, each serving the frontend tools of one session.
pub trait McpListener: Send + Sync {
    /// The bound port.
    fn port(&self) -> u16;
    /// A new endpoint whose MCP sessions are served by clones of `tools`.
    fn add(&self, tools: FrontendTools) -> McpEndpoint;
    /// Removes an endpoint: later requests get 404, its open streams end.
    fn remove(&self, id: &str);
    /// Resolves once the listener has stopped and its connections are closed.
    fn closed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

/// Where an MCP client reaches one endpoint.
pub struct McpEndpoint {
    /// Names the endpoint for [`McpListener::remove`].
    pub id: String,
    /// `http://127.0.0.1:PORT/mcp/<id>`.
    pub url: String,
    /// The endpoint's bearer secret.
    pub secret: BearerToken,
}

/// The daemon's own tool on every endpoint: show a UI component.
pub(super) const EMIT_UI: &str = "emit_ui";

/// The loopback MCP listener shared by every session of an agent.
pub(super) struct McpBridge {
    server: Box<dyn McpListener>,
    /// Endpoint id -> what the endpoint serves.
    bindings: Mutex<HashMap<String, Binding>>,
}

struct Binding {
    /// The ACP session id (known once `session/new` has answered).
    session: Arc<Mutex<String>>,
    tools: Arc<Mutex<Vec<Tool>>>,
}

/// Names the session an endpoint belongs to, once the agent has said it.
pub(super) struct McpHandle {
    /// The endpoint's id.
    id: String,
    session: Arc<Mutex<String>>,
}

impl McpHandle {
    pub(super) fn set_session(&self, session: &str) {
        *lock(&self.session) = session.to_owned();
    }
}

impl McpBridge {
    /// A listener from `host`, serving until `stop` fires.
    pub(super) async fn start(
        host: &dyn McpHost,
        stop: CancellationToken,
    ) -> std::io::Result<McpBridge> {
        Ok(McpBridge {
            server: host.listen(stop).await?,
            bindings: Mutex::default(),
        })
    }

    /// The loopback port the endpoints are served on.
    pub(super) fn port(&self) -> u16 {
        self.server.port()
    }

    /// Gives `session` an MCP endpoint whose calls go to the session's turn through
    /// `router`; returns the `mcpServers` entry for `session/new` / `session/load`.
    pub(super) fn bind(&self, router: &Arc<Router>) -> (AcpMcpServer, McpHandle) {
        let tools: Arc<Mutex<Vec<Tool>>> = Arc::default();
        let session: Arc<Mutex<String>> = Arc::default();
        let endpoint = self.server.add(FrontendTools {
            router: Arc::downgrade(router),
            session: session.clone(),
            tools: tools.clone(),
        });
        lock(&self.bindings).insert(
            endpoint.id.clone(),
            Binding {
                session: session.clone(),
                tools,
            },
        );
        let secret = endpoint.secret.expose();
        // The secret also rides in the URL for agents that send no headers.
        let entry = AcpMcpServer::Http(
            McpServerHttp::new("frontend", format!("{}?token={secret}", endpoint.url)).headers(
                vec![HttpHeader::new("Authorization", format!("Bearer {secret}"))],
            ),
        );
        (
            entry,
            McpHandle {
                id: endpoint.id,
                session,
            },
        )
    }

    /// Drops the endpoint of `handle` (its session was never made, or is gone).
    pub(super) fn release(&self, handle: &McpHandle) {
        if lock(&self.bindings).remove(&handle.id).is_some() {
            self.server.remove(&handle.id);
        }
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
        let mut bindings = lock(&self.bindings);
        let gone: Vec<String> = bindings
            .iter()
            .filter(|(_, b)| *lock(&b.session) == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            bindings.remove(&id);
            self.server.remove(&id);
        }
    }

    /// Resolves once the listener has stopped (after `stop`) and its connections are closed.
    pub(super) async fn closed(&self) {
        self.server.closed().await;
    }
}

/// The MCP server of one session: the frontend tools of its current run.
#[derive(Clone)]
pub struct FrontendTools {
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
        let mut tools: Vec<Value> = lock(&self.tools)
            .iter()
            .filter(|tool| tool.name != EMIT_UI)
            .map(|tool| {
                let schema = match &tool.parameters {
                    Some(Value::Object(schema)) => Value::Object(schema.clone()),
                    _ => json!({"type": "object"}),
                };
                json!({"name": tool.name, "description": tool.description, "inputSchema": schema})
            })
            .collect();
        tools.push(json!({
            "name": EMIT_UI,
            "description": "Show a UI component in the user's chat: one of the components \
                the daemon allows (a refusal names them), with props matching its schema. \
                JSON props only; no HTML or script.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "component": {"type": "string", "description": "the component's name"},
                    "props": {"type": "object", "description": "the component's props"},
                },
                "required": ["component", "props"],
            },
        }));
        serde_json::from_value(json!({"tools": tools}))
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if name == EMIT_UI {
            return Ok(self
                .emit_ui(request.arguments.unwrap_or_default())
                .await
                .into());
        }
        if !lock(&self.tools).iter().any(|t| t.name == name) {
            return Ok(CallToolResult::error(vec![Content::text(format!(
                "the browser does not offer a tool named {name}"
            ))])
            .into());
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default()).to_string();
        let answer = self
            .ask(|reply| SessionEvent::FrontendCall {
                name,
                arguments,
                reply,
            })
            .await;
        Ok(match answer {
            Ok(ToolAnswer::Result(text)) => CallToolResult::success(vec![Content::text(text)]),
            Ok(ToolAnswer::Error(why)) => CallToolResult::error(vec![Content::text(why)]),
            Err(refused) => refused.unwrap_or_else(|| {
                CallToolResult::error(vec![Content::text(
                    "the run ended before the browser answered",
                )])
            }),
        }
        .into())
    }
}

impl FrontendTools {
    /// `emit_ui {component, props}`: shown on the session's turn, or refused with why.
    async fn emit_ui(&self, arguments: serde_json::Map<String, Value>) -> CallToolResult {
        let (Some(Value::String(component)), Some(props)) =
            (arguments.get("component"), arguments.get("props"))
        else {
            return CallToolResult::error(vec![Content::text(
                "emit_ui takes {\"component\": string, \"props\": object}",
            )]);
        };
        let answer = self
            .ask(|reply| SessionEvent::ShowUi {
                component: component.clone(),
                props: props.clone(),
                reply,
            })
            .await;
        match answer {
            Ok(Ok(())) => CallToolResult::success(vec![Content::text(format!(
                "{component} is shown to the user"
            ))]),
            Ok(Err(reason)) => CallToolResult::error(vec![Content::text(reason)]),
            Err(refused) => refused
                .unwrap_or_else(|| CallToolResult::error(vec![Content::text("the turn is over")])),
        }
    }

    /// Hands the event `make` builds (around a reply channel) to the session's running
    /// turn and waits for the reply. `Err(Some(result))`: no turn could take it (the tool
    /// result to answer); `Err(None)`: the turn ended without replying.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> SessionEvent,
    ) -> Result<T, Option<CallToolResult>> {
        let Some(router) = self.router.upgrade() else {
            return Err(Some(CallToolResult::error(vec![Content::text(
                "the session has ended",
            )])));
        };
        let (reply, answer) = oneshot::channel();
        let session = lock(&self.session).clone();
        if !router.deliver(&session, make(reply)) {
            return Err(Some(CallToolResult::error(vec![Content::text(
                "no turn is running on this session",
            )])));
        }
        answer.await.map_err(|_| None)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http::Limits;
    use crate::http::mcp::LoopbackMcp;

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

    fn bridge_limits(header_read_timeout: Duration, max_connections: usize) -> Limits {
        Limits {
            header_read_timeout,
            max_connections,
            ..Limits::default()
        }
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

    async fn error_code(response: reqwest::Response) -> (u16, String) {
        let status = response.status().as_u16();
        assert_eq!(response.headers()["content-type"], "application/json");
        let body: Value = response.json().await.expect("JSON error");
        assert!(body["message"].is_string(), "{body}");
        (status, body["code"].as_str().expect("code").to_owned())
    }

    #[tokio::test]
    async fn endpoints_require_their_own_bearer_secret() {
        let stop = CancellationToken::new();
        let bridge = McpBridge::start(&LoopbackMcp::new(Limits::default()), stop.clone())
            .await
            .expect("bridge");
        let router = Arc::new(Router::default());
        let (entry, handle) = bridge.bind(&router);
        let entry = serde_json::to_value(&entry).expect("the MCP server entry serializes");
        assert_eq!(entry["type"], "http");
        assert_eq!(entry["name"], "frontend");
        handle.set_session("s1");
        let with_query = entry["url"].as_str().expect("url").to_owned();
        assert!(with_query.starts_with("http://127.0.0.1:"));
        let url = with_query.split('?').next().expect("path").to_owned();
        let auth = entry["headers"][0]["value"]
            .as_str()
            .expect("auth")
            .to_owned();
        let http = reqwest::Client::new();
        let post = |url: &str| {
            http.post(url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(INIT)
        };
        for bad in [None, Some("Bearer wrong"), Some("Basic x")] {
            let mut request = post(&url);
            if let Some(bad) = bad {
                request = request.header("authorization", bad);
            }
            let response = request.send().await.expect("request");
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
            assert_eq!(
                error_code(response).await,
                (401, "UNAUTHORIZED".to_owned()),
                "{bad:?}"
            );
        }
        let other = url.replace("/mcp/", "/mcp/x");
        let r = post(&other).header("authorization", &auth).send().await;
        assert_eq!(
            error_code(r.expect("request")).await,
            (404, "NOT_FOUND".to_owned())
        );
        let r = post(&url).header("authorization", &auth).send().await;
        assert_eq!(r.expect("request").status(), 200);
        // The scheme is case-insensitive, as on the public listener.
        let lower = auth.replacen("Bearer", "bearer", 1);
        let r = post(&url).header("authorization", lower).send().await;
        assert_eq!(r.expect("request").status(), 200);
        // The secret in the URL is accepted too (agents that send no headers).
        let r = post(&with_query).send().await;
        assert_eq!(r.expect("request").status(), 200);
        bridge.unbind("s1");
        let r = post(&url).header("authorization", &auth).send().await;
        assert_eq!(r.expect("request").status(), 404, "unbound");

        // The listener stops with the backend.
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), bridge.closed())
            .await
            .expect("the listener closes");
        let port = url.split(':').nth(2).and_then(|p| p.split('/').next());
        let addr = format!("127.0.0.1:{}", port.expect("port"));
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "closed"
        );
    }

    #[tokio::test]
    async fn a_dropped_bridge_stops_listening() {
        let bridge = McpBridge::start(
            &LoopbackMcp::new(Limits::default()),
            CancellationToken::new(),
        )
        .await
        .expect("bridge");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], bridge.port()));
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
        drop(bridge);
        let mut refused = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(refused, "the listener closed with its bridge");
    }

    async fn closed_within(stream: &mut tokio::net::TcpStream, bound: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    #[tokio::test]
    async fn idle_connections_are_capped_and_closed_after_the_header_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stop = CancellationToken::new();
        let bridge = McpBridge::start(
            &LoopbackMcp::new(bridge_limits(Duration::from_millis(300), 8)),
            stop.clone(),
        )
        .await
        .expect("bridge");
        let router = Arc::new(Router::default());
        let (entry, _handle) = bridge.bind(&router);
        let entry = serde_json::to_value(&entry).expect("the MCP server entry serializes");
        let url = entry["url"].as_str().expect("url").to_owned();
        let addr = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .expect("addr")
            .to_owned();
        // Many idle connections, no secret: every one is closed, none is kept.
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(
                tokio::net::TcpStream::connect(&addr)
                    .await
                    .expect("connect"),
            );
        }
        for stream in &mut idle {
            assert!(closed_within(stream, Duration::from_secs(3)).await);
        }
        drop(idle);
        // The cap is free again.
        let r = reqwest::Client::new()
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(INIT)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);

        // With a long header timeout, the cap holds: the connection after the eighth gets a
        // JSON 503 and is closed.
        let patient = McpBridge::start(
            &LoopbackMcp::new(bridge_limits(Duration::from_secs(30), 8)),
            stop.clone(),
        )
        .await
        .expect("bridge");
        let (entry, _handle) = patient.bind(&router);
        let entry = serde_json::to_value(&entry).expect("the MCP server entry serializes");
        let url = entry["url"].as_str().expect("url").to_owned();
        let addr = url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .expect("addr");
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let mut over = tokio::net::TcpStream::connect(addr).await.expect("connect");
        over.write_all(b"GET /mcp/x HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), over.read_to_end(&mut answer))
            .await
            .expect("closed after the answer")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("\"code\":\"OVER_CAPACITY\""), "{answer}");
        drop(held);
        stop.cancel();
    }
}
