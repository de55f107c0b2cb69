//! Routing and handlers. Every request passes, in order: route match (404) -> method (405)
//! -> origin (403) -> token (401, or 500 when misconfigured) -> the principal's access to
//! the route (403: an operator route, a capability its token lacks) -> the handler's own
//! checks (content type 415, `Accept` 406, body size 413, body shape 400, agent 404,
//! admission 429/503, conflict 409).
//!
//! Thread and run ids are resolved in the principal's namespace (see [`crate::access`]):
//! another principal's thread is not there (404). Each authenticated request ends with one
//! audit line (target `audit`): principal, action, thread, run, outcome; never a token.

//!
//! Rooms: the route table (`route.rs`), this file's middleware (origin, token, principal,
//! audit line, CORS, `HEAD`), forwarding to a thread's owner as a layer (`forwarding.rs`),
//! and the handlers by resource (`runs`, `threads`, `sessions`, `fleet`, `tokens`, `info`,
//! `copilotkit`, `workspace`, `console`, `webhooks`), which share `common.rs`.

mod common;
mod console;
mod copilotkit;
mod fleet;
mod forwarding;
mod info;
pub mod mcp;
pub mod metrics_endpoint;
pub mod policy;
mod queue;
mod rewind;
mod route;
mod runs;
mod schedules;
mod sessions;
mod threads;
mod tokens;
mod uploads;
mod webhooks;
mod workspace;

use std::sync::Arc;
use std::time::Instant;

use http::header::CONTENT_LENGTH;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use opentelemetry::context::FutureExt as _;

use crate::access::{Principal, check_principal_name};
use crate::http::body::{Body, RequestBody, empty};
use crate::http::error::ApiError;
use crate::http::transport::forward::{FORWARDED_BY, Forwarder, NODE_HEADER};
use crate::http::transport::otlp::remote_parent;
use crate::http::transport::{ConnInfo, Handler};
use crate::metrics::Metrics;
use crate::runtime::Runtime;
use crate::traces::{RequestInfo, Tracer};
use common::{Audit, json_response, query_param, read_json, read_optional_json, require};
use policy::{Auth, OriginCheck, OriginPolicy};
use route::{Need, Route};

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
    pub(crate) forwarder: Option<Forwarder>,
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
    pub fn with_forwarder(mut self, forwarder: Forwarder) -> App {
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
            None => Box::pin(handle(self, req, conn)).await,
            Some(tracer) => Box::pin(traced(self, tracer, req, conn)).await,
        }
    }
}

/// [`handle`] inside the request's span.
async fn traced(
    app: &App,
    tracer: &Tracer,
    req: Request<Incoming>,
    conn: ConnInfo,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let span = tracer.request(
        &remote_parent(req.headers()),
        RequestInfo {
            method: method.as_str(),
            route: route::template(&app.path, &path),
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
    let response = handle(app, req, conn).with_context(span.context()).await;
    span.end(response.status().as_u16());
    response
}

/// Handles one request; never fails (errors become responses).
async fn handle(app: &App, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
    let started = Instant::now();
    let req = crate::http::body::Draining::request(req);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(policy::scrub_query);
    let origin = app
        .origins
        .check(req.headers(), req.uri().authority().map(|a| a.as_str()));
    // A refused origin's page may read why it was refused (and nothing else).
    let refused_origin = (origin == OriginCheck::Forbidden)
        .then(|| req.headers().get(http::header::ORIGIN).cloned())
        .flatten();
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
    if let Some(refused) = refused_origin {
        policy::refusal_cors_headers(&mut response, refused);
    }
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
    let checked = |audit: &mut Audit| {
        if *origin == OriginCheck::Forbidden {
            return Err(policy::refuse_origin(
                req.headers(),
                req.method(),
                req.uri().path(),
            ));
        }
        route.audit(audit);
        Ok(())
    };
    if let Some((id, query)) = upload_link(&route, &req) {
        // A link that shows an upload: the link, not a token, is what it checks.
        checked(audit)?;
        audit.principal = Some("(link)".to_owned());
        return uploads::preview(app, id, query).await;
    }
    let principal = if route.authenticated() {
        checked(audit)?;
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
            forwarding::forwarding(app, forwarder, route, req, conn, principal, audit).await
        }
        _ => serve(app, route, req, conn, principal, audit).await,
    }
}

/// The upload and the query of a request that reads an upload by a signed link (a `GET`
/// whose query has a `signature`; a token beside it changes nothing).
fn upload_link<'r>(route: &'r Route, req: &'r Request<RequestBody>) -> Option<(&'r str, &'r str)> {
    let Route::Upload(id) = route else {
        return None;
    };
    let query = req.uri().query()?;
    let signed = form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "signature");
    (signed && req.method() == Method::GET).then_some((id.as_str(), query))
}

/// Serves `route` on this node: each resource's handler.
// Over 80 lines: the route table, one arm per route, each a call to its handler.
async fn serve(
    app: &App,
    route: Route,
    req: Request<RequestBody>,
    conn: ConnInfo,
    principal: Principal,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let query = req.uri().query();
    match route {
        Route::Run(agent) | Route::AgentRun(agent) => {
            runs::run(app, &principal, &agent, req, conn, audit).await
        }
        Route::AgentConnect(agent) => {
            copilotkit::connect_request(app, &principal, &agent, req, &conn, audit).await
        }
        Route::AgentStop(agent, thread) => {
            let (parts, body) = req.into_parts();
            let body = read_optional_json(body, &parts.headers, &conn).await?;
            copilotkit::stop(app, &principal, &agent, &thread, body.as_ref()).await
        }
        Route::Envelope => copilotkit::envelope_request(app, &principal, req, conn, audit).await,
        Route::Info => Ok(json_response(
            StatusCode::OK,
            info::info(app, &principal, req.headers(), req.uri(), conn.tls),
        )),
        Route::Agents => Ok(json_response(StatusCode::OK, info::agents(app, &principal))),
        Route::Healthz => Ok(info::healthz(app)),
        Route::Readyz => Ok(info::readyz(app)),
        Route::Console(file) => {
            console::asset(file.as_deref()).ok_or_else(|| ApiError::not_found("route"))
        }
        Route::Metrics => Ok(metrics_endpoint::response(&app.metrics)),
        Route::Webhooks => webhooks::status(app).await,
        Route::WebhookDeliveries => webhooks::deliveries(app, query).await,
        Route::Tokens => {
            let (parts, body) = req.into_parts();
            tokens::mint(app, &read_json(body, &parts.headers, &conn).await?)
        }
        Route::Cancel(run_id) => runs::cancel(app, &principal, &run_id),
        Route::Threads => threads::list_threads(app, &principal, query).await,
        Route::FleetStream => fleet::stream(app, &principal, req.headers(), query),
        Route::AgentSessions(agent) => sessions::list(app, &agent, query).await,
        Route::ImportSession(agent, session) => {
            sessions::import(app, &principal, &agent, &session, req, &conn).await
        }
        Route::Workspace(id, route) => workspace::serve(app, &principal, &id, route, query).await,
        Route::ForkThread(source) => threads::fork(app, &principal, &source, req, &conn).await,
        Route::RewindThread(id) => rewind::rewind(app, &principal, &id, req, &conn).await,
        Route::Uploads => uploads::create(app, &principal, req, &conn).await,
        Route::Upload(id) if req.method() == Method::DELETE => {
            uploads::delete(app, &principal, &id).await
        }
        Route::Upload(id) => uploads::get(app, &principal, &id).await,
        Route::ArchiveThread(id) => threads::archive(app, &principal, &id, req, &conn).await,
        Route::ThreadQueue(id) => queue::list(app, &principal, &id).await,
        Route::QueueItem(id, item) if req.method() == Method::DELETE => {
            queue::cancel(app, &principal, &id, &item).await
        }
        Route::QueueItem(id, item) => queue::edit(app, &principal, &id, &item, req, &conn).await,
        Route::Schedules if req.method() == Method::POST => {
            schedules::create(app, &principal, req, &conn).await
        }
        Route::Schedules => schedules::list(app, &principal).await,
        Route::Schedule(id) if req.method() == Method::DELETE => {
            schedules::delete(app, &principal, &id).await
        }
        Route::Schedule(id) => schedules::get(app, &principal, &id).await,
        Route::ThreadRuns(id) => {
            runs::start_background(app, &principal, &id, req, &conn, audit).await
        }
        Route::Thread(id) if req.method() == Method::PATCH => {
            threads::update(app, &principal, &id, req, &conn).await
        }
        Route::Thread(id) if req.method() == Method::DELETE => {
            threads::delete(app, &principal, &id).await
        }
        Route::Thread(id) => threads::get(app, &principal, &id).await,
        Route::ThreadMessages(id) => threads::messages(app, &principal, &id, query).await,
        Route::ThreadStream(id) => {
            threads::stream(app, &principal, &id, req.headers(), query).await
        }
    }
}

/// A preflight is answered for any origin: a refused origin's request then gets the
/// refusal, which its page can read (see [`policy::refusal_cors_headers`]); the refusal
/// comes before anything is done.
fn preflight<B>(origin: &OriginCheck, _req: &Request<B>) -> Result<Response<Body>, ApiError> {
    match origin {
        OriginCheck::Forbidden | OriginCheck::Absent | OriginCheck::Allowed(_) => {
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            policy::preflight_headers(response.headers_mut());
            Ok(response)
        }
    }
}
