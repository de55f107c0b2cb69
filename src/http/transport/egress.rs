//! The HTTP of an agent's ways out ([`crate::egress::Gateway`]): the egress proxy (HTTP
//! `CONNECT` tunnels and plain HTTP in absolute form) and the model relays, each served on
//! one connection an agent's forwarder handed to the daemon.
//!
//! The proxy decides by name before it resolves anything (`Egress::decide`), resolves and
//! checks the addresses itself (`Egress::addresses`) and connects only to those: a refusal
//! is a 403 whose body names the rule. A relay takes requests in origin form only, sends
//! them to its upstream with the agent's credential headers replaced by the operator's,
//! and streams the answer back as it comes, reading the model's usage on the way.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::forward::hop_by_hop;
use crate::egress::{Conn, Decision, Egress, Exits, Gateway, Relay, Serving, UsageTap, Verdict};

/// How long the way out may take to connect to a host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's headers may take to arrive on a handed-over connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

type Error = Box<dyn std::error::Error + Send + Sync>;
type Out = BoxBody<Bytes, Error>;
type RelayClient = Client<HttpsConnector<HttpConnector>, Incoming>;

/// The gateway: a client for the relays' upstreams (HTTPS verified against the system's
/// roots), shared by every agent.
#[derive(Debug, Clone)]
pub struct EgressGateway {
    client: RelayClient,
}

impl EgressGateway {
    pub fn new() -> std::io::Result<EgressGateway> {
        let connector = super::system_roots_connector(CONNECT_TIMEOUT, "model relays")?;
        Ok(EgressGateway {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

impl Gateway for EgressGateway {
    fn proxy(&self, conn: Conn, rules: Arc<Egress>, exits: Arc<dyn Exits>) -> Serving {
        Box::pin(async move {
            let service = service_fn(move |request| {
                let (rules, exits) = (rules.clone(), exits.clone());
                async move { Ok::<_, Infallible>(proxy(request, &rules, exits).await) }
            });
            serve(conn, service).await;
        })
    }

    fn relay(&self, conn: Conn, relay: Arc<Relay>, exits: Arc<dyn Exits>) -> Serving {
        let client = self.client.clone();
        Box::pin(async move {
            let service = service_fn(move |request| {
                let (client, relay, exits) = (client.clone(), relay.clone(), exits.clone());
                async move { Ok::<_, Infallible>(relay_one(request, &client, &relay, exits).await) }
            });
            serve(conn, service).await;
        })
    }
}

/// Serves HTTP/1.1 (with upgrades, for `CONNECT`) on a handed-over connection.
async fn serve<S>(conn: Conn, service: S)
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Out>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let _ = builder
        .serve_connection(TokioIo::new(conn), service)
        .with_upgrades()
        .await;
}

/// A short plain-text answer (a refusal names its rule).
fn answer(status: StatusCode, text: &str) -> Response<Out> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("agui-serve: {text}\n")))
            .map_err(|e| match e {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The host (lower case, brackets off) and port a request is for.
fn target(uri: &Uri, default_port: u16) -> Option<(String, u16)> {
    let authority = uri.authority()?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    Some((
        host.to_owned(),
        authority.port_u16().unwrap_or(default_port),
    ))
}

/// One request to the proxy.
async fn proxy(request: Request<Incoming>, rules: &Egress, exits: Arc<dyn Exits>) -> Response<Out> {
    let is_connect = request.method() == Method::CONNECT;
    let target = match (is_connect, request.uri().scheme_str()) {
        (true, _) => target(request.uri(), 443),
        (false, Some("http")) => target(request.uri(), 80),
        _ => None,
    };
    let Some((host, port)) = target else {
        return answer(
            StatusCode::BAD_REQUEST,
            "this is an HTTP proxy: send CONNECT host:port, or a request for an absolute http:// URL",
        );
    };
    let host = match crate::egress::canonical_host(&host) {
        Ok(host) => host,
        Err(why) => return refused(&*exits, host, port, why),
    };
    let rule = match rules.decide(&host, port) {
        Verdict::Allowed(rule) => rule,
        Verdict::Denied(rule) => return refused(&*exits, host, port, rule),
    };
    let addresses = match rules.addresses(&host, port).await {
        Ok(addresses) => addresses,
        Err(why) => return refused(&*exits, host, port, why),
    };
    let upstream = match connect(&addresses, &host, port).await {
        Ok(upstream) => upstream,
        Err(answered) => return answered,
    };
    let decided = Decided {
        exits,
        decision: Decision {
            host: host.clone(),
            port,
            allowed: true,
            rule,
            bytes: 0,
        },
        bytes: Arc::default(),
    };
    if is_connect {
        tunnel(request, upstream, decided);
        return Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    }
    forward_plain(request, upstream, &host, port, decided).await
}

/// A refusal of `host:port` by `rule`: counted and logged, and answered with a 403 that
/// names it.
fn refused(exits: &dyn Exits, host: String, port: u16, rule: String) -> Response<Out> {
    let answered = answer(
        StatusCode::FORBIDDEN,
        &format!("egress to {host}:{port} refused: {rule}"),
    );
    exits.decided(Decision {
        host,
        port,
        allowed: false,
        rule,
        bytes: 0,
    });
    answered
}

/// A connection to the first of `addresses` that answers, within [`CONNECT_TIMEOUT`];
/// else the answer that says why.
async fn connect(
    addresses: &[std::net::SocketAddr],
    host: &str,
    port: u16,
) -> Result<TcpStream, Response<Out>> {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addresses)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(error)) => Err(answer(
            StatusCode::BAD_GATEWAY,
            &format!("cannot reach {host}:{port}: {error}"),
        )),
        Err(_) => Err(answer(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("{host}:{port} did not answer"),
        )),
    }
}

/// An allowed connection's decision, recorded when it ends with the bytes it carried.
struct Decided {
    exits: Arc<dyn Exits>,
    decision: Decision,
    bytes: Arc<AtomicU64>,
}

impl Drop for Decided {
    fn drop(&mut self) {
        let mut decision = std::mem::replace(
            &mut self.decision,
            Decision {
                host: String::new(),
                port: 0,
                allowed: true,
                rule: String::new(),
                bytes: 0,
            },
        );
        decision.bytes = self.bytes.load(Ordering::Relaxed);
        self.exits.decided(decision);
    }
}

/// After the `200` to a `CONNECT`: bytes both ways until either side is done.
fn tunnel(request: Request<Incoming>, mut upstream: TcpStream, decided: Decided) {
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(request).await else {
            return;
        };
        let mut agent = TokioIo::new(upgraded);
        if let Ok((up, down)) = tokio::io::copy_bidirectional(&mut agent, &mut upstream).await {
            decided.bytes.store(up + down, Ordering::Relaxed);
        }
        drop(decided);
    });
}

/// A plain-HTTP request (absolute form) sent on to the address the proxy chose, in origin
/// form, its answer streamed back.
async fn forward_plain(
    request: Request<Incoming>,
    upstream: TcpStream,
    host: &str,
    port: u16,
    decided: Decided,
) -> Response<Out> {
    let (mut parts, body) = request.into_parts();
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await
    else {
        return answer(
            StatusCode::BAD_GATEWAY,
            &format!("cannot talk to {host}:{port}"),
        );
    };
    tokio::spawn(connection);
    let origin_form = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
        .to_owned();
    parts.uri = origin_form
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"));
    strip_hop_by_hop(&mut parts.headers);
    let authority = if port == 80 {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    };
    if let Ok(value) = HeaderValue::from_str(&authority) {
        parts.headers.insert(HOST, value);
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let counted = Tapped {
                inner: body,
                tap: None,
                exits: None,
                bytes: decided.bytes.clone(),
                _decided: Some(decided),
            };
            Response::from_parts(parts, counted.boxed())
        }
        Err(error) => answer(StatusCode::BAD_GATEWAY, &format!("{host}:{port}: {error}")),
    }
}

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| hop_by_hop(n)).cloned().collect();
    for name in names {
        headers.remove(&name);
    }
}

/// One request to a relay: to its upstream, with the operator's credential.
async fn relay_one(
    request: Request<Incoming>,
    client: &RelayClient,
    relay: &Relay,
    exits: Arc<dyn Exits>,
) -> Response<Out> {
    if request.method() == Method::CONNECT || request.uri().authority().is_some() {
        return answer(
            StatusCode::FORBIDDEN,
            &format!("this relay reaches only {}", relay.host),
        );
    }
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    if !plain_path(parts.uri.path()) {
        return answer(
            StatusCode::BAD_REQUEST,
            "a relay takes a plain path: /..., without dot segments",
        );
    }
    let base = relay.upstream.to_string();
    let Ok(uri) = format!("{}{path}", base.trim_end_matches('/')).parse::<Uri>() else {
        return answer(
            StatusCode::BAD_REQUEST,
            "the request's path is not one a URL can carry",
        );
    };
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    for name in [HOST, AUTHORIZATION, HeaderName::from_static("x-api-key")] {
        parts.headers.remove(name);
    }
    parts
        .headers
        .insert(relay.header.clone(), relay.value.clone());
    // The usage is read from the answer: uncompressed.
    parts
        .headers
        .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let content_type = parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let tapped = Tapped {
                inner: body,
                tap: Some(UsageTap::new(content_type.as_deref())),
                exits: Some(exits),
                bytes: Arc::default(),
                _decided: None,
            };
            Response::from_parts(parts, tapped.boxed())
        }
        Err(error) => {
            // Never the request itself (it holds the key now): only what failed.
            tracing::warn!(upstream = %relay.host, %error, "a model relay could not reach its upstream");
            answer(
                StatusCode::BAD_GATEWAY,
                &format!("the relay could not reach {}", relay.host),
            )
        }
    }
}

/// Whether `path` is one the relay may put after its upstream's: it starts with `/` and
/// has no dot segment, spelled out or percent-encoded (so it cannot climb out of the
/// upstream's path prefix).
fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    path.starts_with('/')
        && !lower.contains("%2e")
        && !lower.contains("%2f")
        && !lower.contains("%5c")
        && !path.contains('\\')
        && path
            .split('/')
            .all(|segment| segment != "." && segment != "..")
}

/// An answer's body as it passes: bytes counted, usage read.
struct Tapped {
    inner: Incoming,
    tap: Option<UsageTap>,
    exits: Option<Arc<dyn Exits>>,
    bytes: Arc<AtomicU64>,
    /// Recorded when the body is done with.
    _decided: Option<Decided>,
}

impl Tapped {
    fn report(&self, usage: Option<crate::egress::ModelUsage>) {
        if let (Some(usage), Some(exits)) = (usage, &self.exits) {
            exits.used(usage);
        }
    }
}

impl HttpBody for Tapped {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    let usage = self.tap.as_mut().and_then(|t| t.feed(data));
                    self.report(usage);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                let usage = self.tap.take().and_then(|mut tap| tap.finish());
                self.report(usage);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Box::new(error)))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Not until the tap has read the end (`Ready(None)`): a server that saw a body of
    /// known length end would otherwise never poll it again, and a whole answer's usage
    /// (read at the end) would go unbilled.
    fn is_end_stream(&self) -> bool {
        self.tap.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tapped {
    /// An answer dropped before its end (the agent hung up) is billed for what it read,
    /// output estimated where the model had not yet said it.
    fn drop(&mut self) {
        let usage = self.tap.take().and_then(|mut tap| tap.finish());
        self.report(usage);
    }
}
