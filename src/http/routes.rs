//! Routing and handlers. Every request passes, in order: route match (404) -> method (405)
//! -> origin (403) -> token (401, or 500 when misconfigured) -> the principal's access to
//! the route (403: an operator route, a capability its token lacks) -> the handler's own
//! checks (content type 415, `Accept` 406, body size 413, body shape 400, agent 404,
//! admission 429/503, conflict 409).
//!
//! Thread and run ids are resolved in the principal's namespace (see [`crate::access`]):
//! another principal's thread is not there (404). Each authenticated request ends with one
//! audit line (target `audit`): principal, action, thread, run, outcome; never a token.

use std::time::Instant;

use super::body::RequestBody;
use super::forward::{FORWARDED_BY, NODE_HEADER};
use bytes::Bytes;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST, VARY};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use percent_encoding::percent_decode_str;
use serde_json::json;

use super::body::{Body, empty, event_stream, full, read_body};
use super::error::ApiError;
use super::policy::{self, OriginCheck};
use super::workspace::WorkspaceRoute;
use super::{App, ConnInfo, copilotkit};
use crate::access::{Capability, Principal, check_principal_name};
use crate::protocol::input::check_id;
use crate::protocol::{InputError, decode_run_input, negotiate};
use crate::runtime::{Attachment, CancelReason, LoadError};
use crate::store;

pub use super::body::MAX_BODY_BYTES;

/// A matched route (method not yet checked).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Run(String),
    Info,
    Agents,
    Healthz,
    Readyz,
    Threads,
    Thread(String),
    ThreadMessages(String),
    ThreadStream(String),
    Cancel(String),
    /// CopilotKit's runtime protocol (see `copilotkit`).
    Envelope,
    AgentRun(String),
    AgentConnect(String),
    AgentStop(String, String),
    Metrics,
    Tokens,
    /// An agent's own sessions (`session/list`).
    AgentSessions(String),
    /// Import one of them as a thread: agent, session id.
    ImportSession(String, String),
    /// Fork a thread into a new one.
    ForkThread(String),
    /// A thread's workspace: a listing, a file, or what changed.
    Workspace(String, WorkspaceRoute),
    /// The ambient plane: the fleet document and its changes.
    FleetStream,
    /// The operator console's page (`None`) or one of its files.
    Console(Option<String>),
}

/// What a route asks of the principal beyond a valid token.
enum Need {
    /// Nothing more (the runtime decides what a run request needs).
    Nothing,
    /// The master token.
    Operator,
    Capability(Capability),
}

/// What the audit line of a request says besides its principal, action and outcome.
#[derive(Debug, Default)]
pub(super) struct Audit {
    /// `operator` for the master token, else the principal's name.
    pub(super) principal: Option<String>,
    /// How the request authenticated (`none` until it has).
    pub(super) auth: Option<&'static str>,
    /// The namespace acted in (`""`: the operator's own).
    pub(super) owner: String,
    pub(super) thread: Option<String>,
    pub(super) run: Option<String>,
}

impl Route {
    fn parse(namespace: &str, path: &str) -> Option<Route> {
        let rest = path.strip_prefix(namespace)?;
        if rest.is_empty() || rest == "/" {
            return Some(Route::Envelope);
        }
        let rest = rest.strip_prefix('/')?;
        let segments: Vec<String> = rest
            .split('/')
            .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
            .collect();
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let route = match segs.as_slice() {
            ["info"] => Route::Info,
            ["agents"] => Route::Agents,
            ["healthz"] => Route::Healthz,
            ["readyz"] => Route::Readyz,
            ["metrics"] => Route::Metrics,
            ["tokens"] => Route::Tokens,
            ["fleet", "stream"] => Route::FleetStream,
            ["console"] => Route::Console(None),
            ["console", file] if !file.is_empty() => Route::Console(Some((*file).to_owned())),
            ["threads"] => Route::Threads,
            ["threads", id] if !id.is_empty() => Route::Thread((*id).to_owned()),
            ["threads", id, "messages"] if !id.is_empty() => {
                Route::ThreadMessages((*id).to_owned())
            }
            ["threads", id, "stream"] if !id.is_empty() => Route::ThreadStream((*id).to_owned()),
            ["threads", id, "fork"] if !id.is_empty() => Route::ForkThread((*id).to_owned()),
            ["threads", id, "workspace"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::List)
            }
            ["threads", id, "workspace", "file"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::File)
            }
            ["threads", id, "workspace", "changes"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::Changes)
            }
            ["agents", agent, "sessions"] if !agent.is_empty() => {
                Route::AgentSessions((*agent).to_owned())
            }
            ["agents", agent, "sessions", session, "import"]
                if !agent.is_empty() && !session.is_empty() =>
            {
                Route::ImportSession((*agent).to_owned(), (*session).to_owned())
            }
            ["runs", id, "cancel"] if !id.is_empty() => Route::Cancel((*id).to_owned()),
            ["agent", agent, "run"] if !agent.is_empty() => Route::AgentRun((*agent).to_owned()),
            ["agent", agent, "connect"] if !agent.is_empty() => {
                Route::AgentConnect((*agent).to_owned())
            }
            ["agent", agent, "stop", thread] if !agent.is_empty() && !thread.is_empty() => {
                Route::AgentStop((*agent).to_owned(), (*thread).to_owned())
            }
            [agent] if !agent.is_empty() => Route::Run((*agent).to_owned()),
            _ => return None,
        };
        Some(route)
    }

    /// The methods this route answers (besides the CORS preflight).
    /// Whether the route may concern a thread another cluster node owns (its request is
    /// then read whole first, so it can be sent there).
    fn forwardable(&self) -> bool {
        matches!(
            self,
            Route::Run(_)
                | Route::AgentRun(_)
                | Route::AgentConnect(_)
                | Route::AgentStop(..)
                | Route::Envelope
                | Route::Thread(_)
                | Route::ThreadStream(_)
                | Route::Cancel(_)
                | Route::ForkThread(_)
                | Route::Workspace(..)
        )
    }

    fn allow(&self) -> &'static str {
        match self {
            Route::Run(_)
            | Route::Cancel(_)
            | Route::Envelope
            | Route::AgentRun(_)
            | Route::AgentConnect(_)
            | Route::AgentStop(..)
            | Route::Tokens
            | Route::ImportSession(..)
            | Route::ForkThread(_) => "POST, OPTIONS",
            Route::Thread(_) => "GET, DELETE, OPTIONS",
            Route::Healthz | Route::Readyz | Route::Console(_) => "GET, HEAD, OPTIONS",
            _ => "GET, OPTIONS",
        }
    }

    /// Whether this route answers `method` (the preflight, `OPTIONS`, is answered first).
    fn allows(&self, method: &Method) -> bool {
        self.allow()
            .split(", ")
            .any(|allowed| allowed == method.as_str() && allowed != "OPTIONS")
    }

    /// Ids in the path obey the same rules as ids in a body.
    fn check_ids(&self) -> Result<(), InputError> {
        match self {
            Route::Thread(id)
            | Route::ThreadMessages(id)
            | Route::ThreadStream(id)
            | Route::ForkThread(id)
            | Route::Workspace(id, _) => check_id(id, "threadId"),
            Route::ImportSession(_, session) => check_id(session, "sessionId"),
            Route::Cancel(id) => check_id(id, "runId"),
            Route::AgentStop(_, thread) => check_id(thread, "threadId"),
            _ => Ok(()),
        }
    }

    fn authenticated(&self) -> bool {
        // The console's files hold nothing secret; its API calls carry the token.
        !matches!(self, Route::Healthz | Route::Readyz | Route::Console(_))
    }

    /// The route's path under the namespace, parameters named.
    fn template(&self) -> &'static str {
        match self {
            Route::Run(_) => "/{agent}",
            Route::Info => "/info",
            Route::Agents => "/agents",
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Threads => "/threads",
            Route::Thread(_) => "/threads/{id}",
            Route::ThreadMessages(_) => "/threads/{id}/messages",
            Route::ThreadStream(_) => "/threads/{id}/stream",
            Route::Cancel(_) => "/runs/{runId}/cancel",
            Route::Envelope => "",
            Route::AgentRun(_) => "/agent/{agent}/run",
            Route::AgentConnect(_) => "/agent/{agent}/connect",
            Route::AgentStop(..) => "/agent/{agent}/stop/{threadId}",
            Route::Metrics => "/metrics",
            Route::Tokens => "/tokens",
            Route::AgentSessions(_) => "/agents/{agent}/sessions",
            Route::ImportSession(..) => "/agents/{agent}/sessions/{sessionId}/import",
            Route::ForkThread(_) => "/threads/{id}/fork",
            Route::Workspace(_, WorkspaceRoute::List) => "/threads/{id}/workspace",
            Route::Workspace(_, WorkspaceRoute::File) => "/threads/{id}/workspace/file",
            Route::Workspace(_, WorkspaceRoute::Changes) => "/threads/{id}/workspace/changes",
            Route::FleetStream => "/fleet/stream",
            Route::Console(None) => "/console",
            Route::Console(Some(_)) => "/console/{file}",
        }
    }

    /// What the principal needs for this route with `method`.
    fn needs(&self, method: &Method) -> Need {
        match self {
            // An agent's sessions belong to no principal: listing or importing them is the
            // operator's (who imports into a principal's namespace with `?owner=`).
            Route::Metrics | Route::Tokens | Route::AgentSessions(_) | Route::ImportSession(..) => {
                Need::Operator
            }
            Route::ForkThread(_) => Need::Capability(Capability::Run),
            Route::Thread(_) if method == Method::DELETE => Need::Capability(Capability::Run),
            Route::Cancel(_) | Route::AgentStop(..) => Need::Capability(Capability::Run),
            Route::Threads
            | Route::Thread(_)
            | Route::ThreadMessages(_)
            | Route::ThreadStream(_)
            | Route::Workspace(..)
            | Route::AgentConnect(_)
            | Route::FleetStream => Need::Capability(Capability::Read),
            Route::Run(_)
            | Route::AgentRun(_)
            | Route::Envelope
            | Route::Info
            | Route::Agents
            | Route::Healthz
            | Route::Readyz
            | Route::Console(_) => Need::Nothing,
        }
    }

    /// The thread or run the path names, for the audit line.
    fn audit(&self, audit: &mut Audit) {
        match self {
            Route::Thread(id)
            | Route::ThreadMessages(id)
            | Route::ThreadStream(id)
            | Route::AgentStop(_, id)
            | Route::ForkThread(id)
            | Route::Workspace(id, _) => audit.thread = Some(id.clone()),
            Route::Cancel(id) => audit.run = Some(id.clone()),
            _ => {}
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Route::Run(_) => "run",
            Route::Info => "info",
            Route::Agents => "agents",
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Threads => "threads",
            Route::Thread(_) => "thread",
            Route::ThreadMessages(_) => "thread_messages",
            Route::ThreadStream(_) => "thread_stream",
            Route::Cancel(_) => "cancel",
            Route::Envelope => "copilotkit_envelope",
            Route::AgentRun(_) => "copilotkit_run",
            Route::AgentConnect(_) => "copilotkit_connect",
            Route::AgentStop(..) => "copilotkit_stop",
            Route::Metrics => "metrics",
            Route::Tokens => "tokens",
            Route::FleetStream => "fleet_stream",
            Route::Console(_) => "console",
            Route::AgentSessions(_) => "agent_sessions",
            Route::ImportSession(..) => "import_session",
            Route::ForkThread(_) => "fork_thread",
            Route::Workspace(_, WorkspaceRoute::List) => "workspace",
            Route::Workspace(_, WorkspaceRoute::File) => "workspace_file",
            Route::Workspace(_, WorkspaceRoute::Changes) => "workspace_changes",
        }
    }
}

/// The template of the route `path` matches under `namespace` (`/agui/threads/{id}`), for
/// a request's span.
pub(super) fn template(namespace: &str, path: &str) -> Option<String> {
    let route = Route::parse(namespace, path)?;
    let template = format!("{namespace}{}", route.template());
    Some(if template.is_empty() {
        "/".to_owned()
    } else {
        template
    })
}

/// Handles one request; never fails (errors become responses).
pub(super) async fn handle(app: &App, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(policy::scrub_query);
    let origin = app
        .origins
        .check(req.headers(), req.uri().authority().map(|a| a.as_str()));
    let route = Route::parse(&app.path, &path);
    let route_name = route.as_ref().map_or("none", Route::name);

    let mut audit = Audit::default();
    let mut response = match route {
        None => ApiError::not_found("route").into_response(),
        Some(route) => match dispatch(
            app,
            route,
            req.map(RequestBody::Left),
            conn,
            &origin,
            &mut audit,
        )
        .await
        {
            Ok(response) => response,
            Err(error) => {
                if error.status.is_server_error() {
                    tracing::warn!(code = error.code, "request failed");
                }
                error.into_response()
            }
        },
    };
    policy::cors_headers(response.headers_mut(), &origin);
    if let Some(forwarder) = &app.forwarder {
        // Which node served it (a response sent on from the owner keeps the owner's).
        let headers = response.headers_mut();
        if !headers.contains_key(NODE_HEADER) {
            headers.insert(NODE_HEADER, forwarder.node().clone());
        }
    }
    if method == Method::HEAD {
        strip_body(&mut response);
    }
    let status = response.status().as_u16();
    if let Some(principal) = &audit.principal {
        tracing::info!(
            target: "audit",
            principal = %principal,
            auth = audit.auth.unwrap_or("none"),
            owner = %audit.owner,
            action = route_name,
            thread = audit.thread.as_deref().unwrap_or(""),
            run = audit.run.as_deref().unwrap_or(""),
            outcome = outcome(status),
            status,
            "access"
        );
    }
    app.metrics
        .http()
        .request(route_name, status, started.elapsed());
    tracing::info!(
        method = %method,
        path = %path,
        query = query.as_deref().unwrap_or(""),
        route = route_name,
        status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}

/// A response to `HEAD`: the headers of the `GET`, no body on any protocol (HTTP/2 treats
/// DATA on a HEAD stream as a protocol error). `Content-Length` says what `GET` would send.
fn strip_body(response: &mut Response<Body>) {
    use http_body::Body as _;
    if let Some(length) = response.body().size_hint().exact() {
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
    *response.body_mut() = empty();
}

/// How an audit line sums up a status.
fn outcome(status: u16) -> &'static str {
    match status {
        200..=399 => "allowed",
        401 | 403 => "denied",
        404 => "not_found",
        409 | 429 | 503 => "refused",
        400..=499 => "invalid",
        _ => "failed",
    }
}

/// The principal a request acts for: the operator may name another principal's namespace
/// with `?owner=` (to read, cancel or delete its threads, or run in it); anyone else's
/// `owner` is ignored (it only ever sees its own).
fn acting_as(principal: Principal, query: Option<&str>) -> Result<Principal, ApiError> {
    match query_param(query, "owner") {
        Some(owner) if principal.is_operator() && principal.sees_everyone() => {
            if owner.is_empty() {
                return Ok(Principal::operator_as(""));
            }
            check_principal_name(&owner).map_err(|problem| {
                ApiError::invalid_input(format!("owner {problem}"), Some("owner".to_owned()))
            })?;
            Ok(Principal::operator_as(&owner))
        }
        _ => Ok(principal),
    }
}

async fn dispatch(
    app: &App,
    route: Route,
    req: Request<RequestBody>,
    conn: ConnInfo,
    origin: &OriginCheck,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    if req.method() == Method::OPTIONS {
        return preflight(origin, &req);
    }
    if !route.allows(req.method()) {
        return Err(ApiError::method_not_allowed(route.allow()));
    }
    let principal = if route.authenticated() {
        if *origin == OriginCheck::Forbidden {
            return Err(policy::refuse_origin(
                req.headers(),
                req.method(),
                req.uri().path(),
            ));
        }
        route.audit(audit);
        audit.principal = Some("(unauthenticated)".to_owned());
        let principal =
            policy::authenticate(&app.auth, &app.access, req.headers(), req.uri().query())?;
        let principal = acting_as(principal, req.uri().query())?;
        audit.principal = Some(principal.label().to_owned());
        audit.auth = Some(principal.authenticated().name());
        audit.owner = principal.owner().to_owned();
        match route.needs(req.method()) {
            Need::Nothing => {}
            Need::Operator if principal.is_operator() => {}
            Need::Operator => {
                return Err(ApiError::forbidden("this route needs the operator token"));
            }
            Need::Capability(capability) => require(&principal, capability)?,
        }
        principal
    } else {
        // Only the health routes: they act for nobody.
        Principal::scoped("-", Some(Vec::new()), crate::access::Caps::NONE)
            .via(crate::access::Via::Nothing)
    };
    route.check_ids()?;
    match &app.forwarder {
        Some(forwarder) if route.forwardable() && !req.headers().contains_key(FORWARDED_BY) => {
            forwarding(app, forwarder, route, req, conn, principal, audit).await
        }
        _ => serve(app, route, req, conn, principal, audit).await,
    }
}

/// A request that may concern a thread another node owns (cluster): read whole first, then
/// served here, or sent to the owner when the runtime says the thread is the owner's. An
/// owner that cannot be reached has died or is cut off: its lease lapses within its
/// lifetime, and the request is tried again once it has (this node then takes the thread
/// over), a few times at most.
async fn forwarding(
    app: &App,
    forwarder: &super::forward::Forwarder,
    route: Route,
    req: Request<RequestBody>,
    conn: ConnInfo,
    principal: Principal,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, &conn).await?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let req = Request::from_parts(
            parts.clone(),
            RequestBody::Right(http_body_util::Full::new(body.clone())),
        );
        let error = match serve(app, route.clone(), req, conn, principal.clone(), audit).await {
            Err(error) if error.forward.is_some() => error,
            Err(error)
                if matches!(route, Route::Cancel(_)) && error.status == StatusCode::NOT_FOUND =>
            {
                // A run is found by its id only where it runs: ask the other nodes, all at
                // once (each within the hop's bound).
                let peers = app.runtime.peers().await;
                let asked = peers.iter().map(|(address, cert)| {
                    forwarder.send(address, cert.as_deref(), &parts, body.clone())
                });
                for answer in futures_util::future::join_all(asked).await {
                    match answer {
                        Ok(response) if response.status() == StatusCode::ACCEPTED => {
                            return Ok(response);
                        }
                        Ok(_) => {}
                        Err(failure) => {
                            tracing::warn!(error = %failure, "cancel could not reach a node");
                        }
                    }
                }
                return Err(error);
            }
            answer => return answer,
        };
        let Some(owner) = error.forward.clone() else {
            return Err(error);
        };
        match forwarder
            .send(&owner.address, owner.cert.as_deref(), &parts, body.clone())
            .await
        {
            Ok(response) => {
                tracing::debug!(owner = %owner.node, "request sent to the thread's owner");
                return Ok(response);
            }
            Err(failure) if attempts < 3 => {
                tracing::warn!(owner = %owner.node, error = %failure, "thread owner unreachable; waiting for its lease to lapse");
                tokio::time::sleep(owner.expires_in + std::time::Duration::from_millis(100)).await;
            }
            Err(failure) => {
                tracing::warn!(owner = %owner.node, error = %failure, "thread owner unreachable");
                return Err(error);
            }
        }
    }
}

/// Serves `route` on this node.
async fn serve(
    app: &App,
    route: Route,
    req: Request<RequestBody>,
    conn: ConnInfo,
    principal: Principal,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    match route {
        Route::Run(agent) | Route::AgentRun(agent) => {
            run(app, &principal, &agent, req, conn, audit).await
        }
        Route::AgentConnect(agent) => {
            check_stream_request(req.headers())?;
            let (parts, body) = req.into_parts();
            let body = read_json(body, &parts.headers, &conn).await?;
            copilotkit::connect(app, &principal, &agent, &body, audit).await
        }
        Route::AgentStop(agent, thread) => {
            let (parts, body) = req.into_parts();
            let body = read_request_body(body, &parts.headers, &conn).await?;
            let body = if body.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                Some(parse_json(&body)?)
            };
            copilotkit::stop(app, &principal, &agent, &thread, body.as_ref()).await
        }
        Route::Envelope => {
            if !is_json(req.headers()) {
                return Err(ApiError::unsupported_media_type());
            }
            let info_of = (req.headers().clone(), req.uri().clone());
            let (parts, body) = req.into_parts();
            let envelope = read_json(body, &parts.headers, &conn).await?;
            copilotkit::envelope(app, &principal, &parts.headers, &envelope, audit, || {
                info(app, &principal, &info_of.0, &info_of.1, conn.tls)
            })
            .await
        }
        Route::Info => Ok(json_response(
            StatusCode::OK,
            info(app, &principal, req.headers(), req.uri(), conn.tls),
        )),
        Route::Agents => Ok(json_response(StatusCode::OK, agents(app, &principal))),
        Route::Healthz => Ok(healthz(app)),
        Route::Console(file) => {
            super::console::asset(file.as_deref()).ok_or_else(|| ApiError::not_found("route"))
        }
        Route::Readyz => Ok(readyz(app)),
        Route::Metrics => Ok(super::metrics_endpoint::response(&app.metrics)),
        Route::Tokens => {
            let (parts, body) = req.into_parts();
            let body = read_json(body, &parts.headers, &conn).await?;
            mint(app, &body)
        }
        Route::Cancel(run_id) => {
            if app
                .runtime
                .cancel_run_as(&principal, &run_id, CancelReason::Requested)
            {
                Ok(json_response(
                    StatusCode::ACCEPTED,
                    json!({"runId": run_id, "status": "cancelling"}),
                ))
            } else {
                Err(ApiError::not_found("live run"))
            }
        }
        Route::Threads => list_threads(app, &principal, req.uri().query()).await,
        Route::FleetStream => fleet(app, &principal, req.headers(), req.uri().query()),
        Route::AgentSessions(agent) => {
            let cursor = query_param(req.uri().query(), "cursor");
            let page = app.runtime.agent_sessions(&agent, cursor).await?;
            let mut body = json!({"agent": agent, "sessions": page.sessions});
            if let Some(cursor) = page.next_cursor {
                body["nextCursor"] = json!(cursor);
            }
            Ok(json_response(StatusCode::OK, body))
        }
        Route::ImportSession(agent, session) => {
            let thread_id = requested_thread_id(req, &conn).await?;
            let new = app
                .runtime
                .import_session(&principal, &agent, &session, thread_id)
                .await?;
            Ok(json_response(
                StatusCode::CREATED,
                json!({"threadId": new.thread_id, "agent": agent, "sessionId": new.session_id,
                    "messageCount": new.message_count}),
            ))
        }
        Route::Workspace(id, route) => {
            super::workspace::serve(app, &principal, &id, route, req.uri().query()).await
        }
        Route::ForkThread(source) => {
            let thread_id = requested_thread_id(req, &conn).await?;
            let new = app
                .runtime
                .fork_thread(&principal, &source, thread_id)
                .await?;
            Ok(json_response(
                StatusCode::CREATED,
                json!({"threadId": new.thread_id, "forkedFrom": source,
                    "sessionId": new.session_id, "messageCount": new.message_count}),
            ))
        }
        Route::Thread(id) if req.method() == Method::DELETE => {
            match app.runtime.delete_thread_as(&principal, &id).await {
                Ok(true) => {
                    let mut response = Response::new(empty());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    Ok(response)
                }
                Ok(false) => Err(ApiError::not_found("thread")),
                Err(LoadError::Elsewhere(owner)) => Err(ApiError::elsewhere(owner)),
                Err(LoadError::Store) => Err(ApiError::store_unavailable()),
            }
        }
        Route::Thread(id) => {
            let row = visible_thread(app, &principal, &id).await?;
            Ok(json_response(StatusCode::OK, thread_json(app, &row, true)))
        }
        Route::ThreadMessages(id) => {
            let limit = query_usize(req.uri().query(), "limit", 1000, 10_000)?;
            let row = visible_thread(app, &principal, &id).await?;
            match app.runtime.store().messages(&row.key, limit).await {
                Ok(Some((messages, truncated))) => Ok(json_response(
                    StatusCode::OK,
                    json!({"threadId": id, "messages": messages, "truncated": truncated}),
                )),
                Ok(None) => Err(ApiError::not_found("thread")),
                Err(error) => {
                    tracing::error!(%error, "messages read failed");
                    Err(ApiError::store_unavailable())
                }
            }
        }
        Route::ThreadStream(id) => {
            let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            if negotiate(accept).is_none() {
                return Err(ApiError::not_acceptable());
            }
            // A header that is not text is a malformed id (resync), not an absent one.
            let last_event_id = req
                .headers()
                .get("last-event-id")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .or_else(|| query_param(req.uri().query(), "lastEventId"));
            let attachment = app
                .runtime
                .reattach_as(&principal, &id, last_event_id.as_deref())
                .await?;
            Ok(stream_response(attachment))
        }
    }
}

/// `GET {path}/fleet/stream`: the principal's view of the fleet; replay after
/// `Last-Event-ID` (or `?lastEventId=`), else after `?since=<RFC 3339>`, then the snapshot,
/// then live changes.
fn fleet(
    app: &App,
    principal: &Principal,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    if negotiate(accept).is_none() {
        return Err(ApiError::not_acceptable());
    }
    let last_event_id = headers
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| query_param(query, "lastEventId"));
    let from = match (last_event_id, query_param(query, "since")) {
        (Some(id), _) => crate::runtime::FleetFrom::After(id),
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
            crate::runtime::FleetFrom::Since(ms)
        }
        (None, None) => crate::runtime::FleetFrom::Now,
    };
    let stream = app
        .runtime
        .fleet_stream(principal, from)
        .map_err(ApiError::fleet_full)?;
    let resume = if stream.is_exact() { "exact" } else { "resync" };
    let mut response = Response::new(super::body::fleet_stream(stream));
    sse_headers(response.headers_mut());
    response
        .headers_mut()
        .insert("agui-resume", HeaderValue::from_static(resume));
    Ok(response)
}

/// An error unless `principal` has `capability`.
pub(super) fn require(principal: &Principal, capability: Capability) -> Result<(), ApiError> {
    if principal.can(capability) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "this token lacks the `{}` capability",
            capability.name()
        )))
    }
}

/// Thread `id` of `principal`'s namespace, when it is one of an agent it may use; else
/// 404, as for a thread that does not exist.
pub(super) async fn visible_thread(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<store::ThreadRow, ApiError> {
    match app.runtime.store().thread(&principal.key(id)).await {
        Ok(Some(row)) if principal.may_use(&row.agent) => Ok(row),
        Ok(_) => Err(ApiError::not_found("thread")),
        Err(error) => {
            tracing::error!(%error, "thread read failed");
            Err(ApiError::store_unavailable())
        }
    }
}

/// Longest lifetime of a minted token.
const MAX_MINTED_TTL_SECONDS: u64 = 24 * 3600;

/// `POST {path}/tokens` (operator only): a scoped token for a principal.
fn mint(app: &App, body: &serde_json::Value) -> Result<Response<Body>, ApiError> {
    let Some(signer) = &app.access.signer else {
        return Err(ApiError::not_found("token signing key"));
    };
    let sub = match body.get("sub") {
        Some(serde_json::Value::String(sub)) => sub.clone(),
        _ => {
            return Err(ApiError::invalid_input(
                "sub must be a string naming the principal",
                Some("sub".to_owned()),
            ));
        }
    };
    check_principal_name(&sub).map_err(|problem| {
        ApiError::invalid_input(format!("sub {problem}"), Some("sub".to_owned()))
    })?;
    let ttl = match body.get("ttlSeconds") {
        None | Some(serde_json::Value::Null) => 900,
        Some(value) => value
            .as_u64()
            .filter(|ttl| (1..=MAX_MINTED_TTL_SECONDS).contains(ttl))
            .ok_or_else(|| {
                ApiError::invalid_input(
                    format!("ttlSeconds must be an integer from 1 to {MAX_MINTED_TTL_SECONDS}"),
                    Some("ttlSeconds".to_owned()),
                )
            })?,
    };
    let names = |field: &str| -> Result<Option<Vec<String>>, ApiError> {
        match body.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid_input(
                        format!("{field} must be an array of strings"),
                        Some(field.to_owned()),
                    )
                }),
            Some(_) => Err(ApiError::invalid_input(
                format!("{field} must be an array of strings"),
                Some(field.to_owned()),
            )),
        }
    };
    let agents = names("agents")?;
    if let Some(unknown) = agents
        .iter()
        .flatten()
        .find(|name| !app.agents.iter().any(|(a, _)| a == *name))
    {
        return Err(ApiError::invalid_input(
            format!("no agent named {unknown:?}"),
            Some("agents".to_owned()),
        ));
    }
    let capabilities = names("capabilities")?;
    if let Some(unknown) = capabilities
        .iter()
        .flatten()
        .find(|name| Capability::from_name(name).is_none())
    {
        return Err(ApiError::invalid_input(
            format!("unknown capability {unknown:?}: expected run, read or approve"),
            Some("capabilities".to_owned()),
        ));
    }
    let (token, exp) = signer
        .mint(
            &sub,
            std::time::Duration::from_secs(ttl),
            agents,
            capabilities,
        )
        .map_err(|error| {
            tracing::error!(%error, "token signing failed");
            ApiError::internal()
        })?;
    tracing::info!(
        target: "audit",
        principal = "operator",
        auth = "master-token",
        minted_for = %sub,
        ttl_seconds = ttl,
        "token minted"
    );
    Ok(json_response(
        StatusCode::OK,
        json!({"token": token, "expiresAt": rfc3339(exp as i64 * 1000)}),
    ))
}

/// The `threadId` an import or fork body may name (`{"threadId": "..."}`; an empty body
/// names none).
async fn requested_thread_id(
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Option<String>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, conn).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if !is_json(&parts.headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let body = parse_json(&body)?;
    let field = || Some("threadId".to_owned());
    match body.get("threadId") {
        _ if !body.is_object() => Err(ApiError::invalid_input(
            "the body must be a JSON object",
            None,
        )),
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(id)) => {
            check_id(id, "threadId")?;
            Ok(Some(id.clone()))
        }
        Some(_) => Err(ApiError::invalid_input(
            "threadId must be a string",
            field(),
        )),
    }
}

async fn list_threads(
    app: &App,
    principal: &Principal,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let limit = query_usize(query, "limit", 50, 200)?;
    let cursor =
        match query_param(query, "cursor") {
            Some(cursor) => Some(store::decode_cursor(&cursor).ok_or_else(|| {
                ApiError::invalid_input("invalid cursor", Some("cursor".to_owned()))
            })?),
            None => None,
        };
    // `agentId` is CopilotKit's name for the same filter.
    let agent = query_param(query, "agent").or_else(|| query_param(query, "agentId"));
    let scope = store::ListScope {
        owner: (!principal.sees_everyone()).then(|| principal.owner().to_owned()),
        agents: principal.agents().map(<[String]>::to_vec),
    };
    let page = app
        .runtime
        .store()
        .list_threads(limit, cursor, agent, scope)
        .await
        .map_err(|error| {
            tracing::error!(%error, "thread listing failed");
            ApiError::store_unavailable()
        })?;
    let threads: Vec<_> = page
        .threads
        .iter()
        .map(|row| thread_json(app, row, false))
        .collect();
    let mut body = json!({"threads": threads});
    if let Some(next) = page.next_cursor {
        body["nextCursor"] = json!(next);
    }
    Ok(json_response(StatusCode::OK, body))
}

/// A thread as the API shows it; `detail` adds the last run and the session.
fn thread_json(app: &App, row: &store::ThreadRow, detail: bool) -> serde_json::Value {
    let status = app
        .runtime
        .live_status(&row.key)
        .unwrap_or(row.status.as_str());
    let mut value = json!({
        "threadId": row.id,
        "agent": row.agent,
        "createdAt": rfc3339(row.created_at),
        "updatedAt": rfc3339(row.updated_at),
        "messageCount": row.message_count,
        "status": status,
        // CopilotKit's thread record (`ThreadRecord` of @copilotkit/core 1.74), so its
        // thread list reads this route as it is.
        "id": row.id,
        "agentId": row.agent,
        "name": row.title,
        "archived": false,
    });
    if let Some(title) = &row.title {
        value["title"] = json!(title);
    }
    if !row.owner.is_empty() {
        value["owner"] = json!(row.owner);
    }
    if detail {
        if let Some(session) = &row.session_id {
            value["sessionId"] = json!(session);
        }
        if let Some(metadata) = &row.metadata {
            value["metadata"] = metadata.clone();
        }
        if let Some(run) = &row.last_run {
            let mut last = json!({
                "runId": run.id,
                "startedAt": rfc3339(run.started_at),
                "segments": run.segments,
                "outcome": run.outcome.as_deref().unwrap_or("running"),
            });
            if let Some(ended) = run.ended_at {
                last["endedAt"] = json!(rfc3339(ended));
            }
            value["lastRun"] = last;
        }
    }
    value
}

fn rfc3339(ms: i64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

pub(super) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// A positive integer query parameter, defaulted and capped.
fn query_usize(
    query: Option<&str>,
    key: &str,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match query_param(query, key) {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n.min(max)),
            _ => Err(ApiError::invalid_input(
                format!("{key} must be a positive integer"),
                Some(key.to_owned()),
            )),
        },
    }
}

fn preflight<B>(origin: &OriginCheck, req: &Request<B>) -> Result<Response<Body>, ApiError> {
    match origin {
        OriginCheck::Forbidden => Err(policy::refuse_origin(
            req.headers(),
            req.method(),
            req.uri().path(),
        )),
        OriginCheck::Absent | OriginCheck::Allowed(_) => {
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            policy::preflight_headers(response.headers_mut());
            Ok(response)
        }
    }
}

async fn run(
    app: &App,
    principal: &Principal,
    agent: &str,
    req: Request<RequestBody>,
    conn: ConnInfo,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    check_stream_request(req.headers())?;
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, &conn).await?;
    start_run(app, principal, agent, &parts.headers, &body, audit).await
}

/// A request answered with an event stream: a JSON body, and an `Accept` that allows SSE.
fn check_stream_request(headers: &HeaderMap) -> Result<(), ApiError> {
    if !is_json(headers) {
        return Err(ApiError::unsupported_media_type());
    }
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    if negotiate(accept).is_none() {
        return Err(ApiError::not_acceptable());
    }
    Ok(())
}

/// Starts a run of `agent` from a `RunAgentInput` body; the stream of its current segment.
pub(super) async fn start_run(
    app: &App,
    principal: &Principal,
    agent: &str,
    headers: &HeaderMap,
    body: &[u8],
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    if negotiate(accept).is_none() {
        return Err(ApiError::not_acceptable());
    }
    let input = decode_run_input(body)?;
    audit.thread = Some(input.thread_id.clone());
    audit.run = Some(input.run_id.clone());
    if !app.runtime.has_agent(agent) || !principal.may_use(agent) {
        return Err(ApiError::unknown_agent(agent));
    }
    app.runtime.check_input(agent, &input)?;
    let attachment = app.runtime.start_run_as(principal, agent, input).await?;
    Ok(stream_response(attachment))
}

/// Reads a JSON request body (within the body limits).
async fn read_json(
    body: RequestBody,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Result<serde_json::Value, ApiError> {
    let bytes = read_request_body(body, headers, conn).await?;
    parse_json(&bytes)
}

/// Reads a request body whole, within the body limits.
async fn read_request_body(
    body: RequestBody,
    headers: &HeaderMap,
    conn: &ConnInfo,
) -> Result<bytes::Bytes, ApiError> {
    read_body(body, headers, MAX_BODY_BYTES, conn.limits.body_read_timeout).await
}

fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| {
        ApiError::invalid_input(format!("the body is not valid JSON: {error}"), None)
    })
}

/// The 200 event-stream response for an attachment.
pub(super) fn stream_response(attachment: Attachment) -> Response<Body> {
    let resume = attachment.resume();
    let mut response = Response::new(event_stream(attachment));
    let headers = response.headers_mut();
    sse_headers(headers);
    headers.insert("agui-resume", HeaderValue::from_static(resume.as_str()));
    response
}

/// The headers of every event stream.
pub(super) fn sse_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(VARY, HeaderValue::from_static("accept"));
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

fn info(
    app: &App,
    principal: &Principal,
    headers: &HeaderMap,
    uri: &http::Uri,
    tls: bool,
) -> serde_json::Value {
    let scheme = if tls {
        "https"
    } else {
        match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("https") => "https",
            _ => "http",
        }
    };
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
        .filter(|h| valid_host(h));
    // Keyed by name: CopilotKit reads `agents` with `Object.entries`.
    let agents: serde_json::Map<String, serde_json::Value> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let mut agent = json!({
                "name": name,
                "description": description,
                "className": "HttpAgent",
            });
            if let Some(host) = &host {
                let encoded =
                    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
                agent["url"] = json!(format!("{scheme}://{host}{}/{encoded}", app.path));
            }
            (name.clone(), agent)
        })
        .collect();
    // The CopilotKit runtime-info shape (`RuntimeInfo` of @copilotkit/shared 1.74), then our
    // own fields. Of CopilotKit's thread endpoints the list is served (`{path}/threads`);
    // its inspect and mutation routes, suggestions, transcription and generative UI are
    // not, so they are advertised as off.
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "agents": agents,
        "mode": "sse",
        "threadEndpoints": {
            "list": true,
            "inspect": false,
            "mutations": false,
            "realtimeMetadata": false,
        },
        "suggestions": false,
        "audioFileTranscriptionEnabled": false,
        "a2uiEnabled": false,
        "openGenerativeUIEnabled": false,
        "telemetryDisabled": true,
        "protocol": "ag-ui",
        "protocolVersion": crate::protocol::PROTOCOL_VERSION,
        "path": app.path,
        "capabilities": {
            "frontendTools": true,
            "humanInTheLoop": true,
            "sharedState": true,
            "interrupts": true,
            "reattach": true,
        },
    })
}

/// A `Host` value we are willing to echo into URLs.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'))
}

/// Each agent's last known state; for `auth_required`, the auth methods it offers.
fn agents(app: &App, principal: &Principal) -> serde_json::Value {
    let statuses = app.runtime.agent_statuses();
    let agents: Vec<_> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let mut agent = json!({"name": name, "description": description});
            if let Some((_, status)) = statuses.iter().find(|(n, _)| n == name)
                && let (Some(agent), Ok(serde_json::Value::Object(status))) =
                    (agent.as_object_mut(), serde_json::to_value(status))
            {
                agent.extend(status);
            }
            agent
        })
        .collect();
    json!({"agents": agents})
}

fn healthz(app: &App) -> Response<Body> {
    let gauge = app.runtime.gauge();
    let draining = app.runtime.is_draining();
    json_response(
        StatusCode::OK,
        json!({
            "status": if draining { "draining" } else { "ok" },
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSeconds": app.runtime.uptime().as_secs(),
            "runs": {"active": gauge.active, "capacity": gauge.capacity},
            "draining": draining,
        }),
    )
}

fn readyz(app: &App) -> Response<Body> {
    if app.runtime.is_draining() || !app.runtime.agents_ready() {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable"}),
        );
    }
    json_response(StatusCode::OK, json!({"status": "ready"}))
}

pub(super) fn json_response(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_methods_follow_the_allow_header() {
        let run = Route::Run("demo".into());
        assert!(run.allows(&Method::POST) && !run.allows(&Method::GET));
        let thread = Route::Thread("t".into());
        assert!(thread.allows(&Method::GET) && thread.allows(&Method::DELETE));
        assert!(!thread.allows(&Method::POST));
        assert!(Route::Healthz.allows(&Method::HEAD) && Route::Console(None).allows(&Method::HEAD));
        assert!(!Route::Info.allows(&Method::HEAD) && !Route::Info.allows(&Method::OPTIONS));
    }

    #[test]
    fn routes_parse() {
        assert_eq!(
            Route::parse("/agui", "/agui/demo"),
            Some(Route::Run("demo".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui/info"), Some(Route::Info));
        assert_eq!(
            Route::parse("/agui", "/agui/threads/a%20b/stream"),
            Some(Route::ThreadStream("a b".into()))
        );
        assert_eq!(
            Route::parse("/agui", "/agui/runs/r1/cancel"),
            Some(Route::Cancel("r1".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui"), Some(Route::Envelope));
        assert_eq!(Route::parse("/agui", "/agui/"), Some(Route::Envelope));
        assert_eq!(Route::parse("", "/"), Some(Route::Envelope));
        assert_eq!(
            Route::parse("/agui", "/agui/agent/demo/stop/t%201"),
            Some(Route::AgentStop("demo".into(), "t 1".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui/agent/demo"), None);
        assert_eq!(Route::parse("/agui", "/aguix/demo"), None);
        assert_eq!(Route::parse("/agui", "/agui/demo/extra"), None);
        assert_eq!(Route::parse("", "/demo"), Some(Route::Run("demo".into())));
    }
}
