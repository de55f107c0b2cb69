//! The accept loop every listener shares (the public API and the loopback MCP endpoint):
//! TLS handshake, the connection cap, the header-read watchdog, socket tuning, hyper's
//! per-protocol limits, and shutdown.
//!
//! A listener serves at most [`Limits::max_connections`] connections at a time. A
//! connection over the cap is not served: it gets one `503 OVER_CAPACITY` answer if its
//! request arrives within [`REFUSAL_WINDOW`] and is then closed; while too many such
//! refusals are already pending it is closed at once. Either way it holds its descriptor
//! for a bounded time.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::parse_errors::JsonErrors;
use super::{Limits, MAX_HEADER_BYTES, MAX_HEADER_FIELDS, MAX_URI_BYTES};
use crate::http::body::Body;
use crate::http::error::ApiError;

/// How long a connection over the cap may take to send the request it is refused.
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(1);

/// What answers the requests of a listener.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request; errors are responses too.
    fn handle(
        &self,
        req: Request<Incoming>,
        conn: ConnInfo,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// What a handler knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    /// The connection is TLS.
    pub tls: bool,
    /// The listener's limits (the body-read timeout applies per request).
    pub limits: Limits,
}

/// The connections of a listener that has stopped accepting.
pub struct Serving {
    graceful: GracefulShutdown,
    abort: CancellationToken,
}

impl Serving {
    /// Lets open connections finish their responses (HTTP/1.1 closes after the current
    /// one, HTTP/2 sends GOAWAY) until `deadline`, then closes whatever is still open.
    /// Returns whether everything finished in time.
    pub async fn finish(self, deadline: tokio::time::Instant) -> bool {
        let finished = tokio::time::timeout_at(deadline, self.graceful.shutdown())
            .await
            .is_ok();
        self.abort.cancel();
        finished
    }
}

/// Accepts connections until `shutdown` fires and serves them with `handler`; returns the
/// open connections, to be finished with [`Serving::finish`].
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: Arc<H>,
    limits: Limits,
    shutdown: CancellationToken,
) -> Serving {
    let graceful = GracefulShutdown::new();
    let abort = CancellationToken::new();
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new((limits.max_connections / 8).max(1)));
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (admission, permit) = match open.clone().try_acquire_owned() {
            Ok(permit) => (Admission::Serve, permit),
            Err(_) => match refusals.clone().try_acquire_owned() {
                Ok(permit) => (Admission::Refuse, permit),
                Err(_) => {
                    tracing::debug!(peer = %peer, "connection cap reached; closed at once");
                    continue;
                }
            },
        };
        if admission == Admission::Refuse {
            tracing::warn!(
                peer = %peer,
                max_connections = limits.max_connections,
                "connection cap reached; refusing"
            );
        }
        if let Err(error) = tune_socket(&stream, limits) {
            tracing::debug!(%error, "socket options not applied");
        }
        let conn = Connection {
            handler: handler.clone(),
            limits,
            peer,
            admission,
            abort: abort.clone(),
            shutdown: shutdown.clone(),
            _permit: permit,
        };
        let watcher = graceful.watcher();
        let span = tracing::debug_span!("conn", peer = %peer);
        tokio::spawn(conn.start(stream, tls.clone(), watcher).instrument(span));
    }
    Serving { graceful, abort }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Serve,
    /// Over the cap: answer 503 to whatever comes within the refusal window, then close.
    Refuse,
}

struct Connection<H> {
    handler: Arc<H>,
    limits: Limits,
    peer: SocketAddr,
    admission: Admission,
    abort: CancellationToken,
    /// The listener's: fires when it stops accepting. A connection that has not sent its
    /// first bytes (or finished its TLS handshake) by then is closed, as hyper closes an
    /// idle one, so it does not hold the shutdown for its header timeout.
    shutdown: CancellationToken,
    /// Held for the connection's whole life.
    _permit: OwnedSemaphorePermit,
}

impl<H: Handler> Connection<H> {
    /// How long this connection has to produce its first complete request (a refused one:
    /// its whole life).
    fn first_request_bound(&self) -> Duration {
        match self.admission {
            Admission::Serve => self.limits.header_read_timeout,
            Admission::Refuse => REFUSAL_WINDOW.min(self.limits.header_read_timeout),
        }
    }

    /// An async block, not an async fn: an async fn's task keeps room for its arguments
    /// twice, and this is the connection's task for its whole life.
    #[allow(clippy::manual_async_fn)]
    fn start(
        self,
        stream: TcpStream,
        tls: Option<TlsAcceptor>,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let deadline = tokio::time::Instant::now() + self.first_request_bound();
            match tls {
                None => {
                    let sniffed = tokio::select! {
                        sniffed = tokio::time::timeout_at(deadline, cleartext_protocol(&stream)) => sniffed,
                        () = self.shutdown.cancelled() => {
                            tracing::debug!(peer = %self.peer, "closed before its first bytes: shutting down");
                            return;
                        }
                    };
                    match sniffed {
                        Ok(Ok(protocol)) => {
                            self.serve(stream, false, protocol, deadline, watcher).await
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "connection failed before a request")
                        }
                        Err(_) => tracing::debug!("no request within the header timeout; closing"),
                    }
                }
                // Boxed: a cleartext connection's task does not carry a TLS session's room.
                Some(acceptor) => {
                    Box::pin(self.start_tls(stream, acceptor, deadline, watcher)).await
                }
            }
        }
    }

    async fn start_tls(
        self,
        stream: TcpStream,
        acceptor: TlsAcceptor,
        deadline: tokio::time::Instant,
        watcher: Watcher,
    ) {
        let handshake = tokio::select! {
            handshake = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => handshake,
            () = self.shutdown.cancelled() => {
                tracing::debug!(peer = %self.peer, "closed during its TLS handshake: shutting down");
                return;
            }
        };
        match handshake {
            Ok(Ok(stream)) => {
                // The protocol the handshake agreed on (ALPN). Without ALPN it is HTTP/1.1:
                // HTTP/2 over TLS is only ever negotiated (RFC 9113, section 3.2).
                let protocol = match stream.get_ref().1.alpn_protocol() {
                    Some(b"h2") => Protocol::Http2,
                    _ => Protocol::Http1,
                };
                // The handshake took from the header timeout: the request gets a whole one.
                let deadline = tokio::time::Instant::now() + self.first_request_bound();
                self.serve(stream, true, protocol, deadline, watcher).await
            }
            Ok(Err(error)) if refused_certificate(&error) => {
                // A browser that does not trust the certificate shows its page only
                // "Failed to fetch": say it here (at most every 10 s: a browser retries).
                if due(&LAST_REFUSAL) {
                    tracing::info!(
                        peer = %self.peer,
                        %error,
                        "a client refused this daemon's TLS certificate: a browser that does not trust it says only \"Failed to fetch\"; open the daemon's URL in it once to accept the certificate, or serve one it trusts (--tls-cert and --tls-key; the generated one is tls/cert.pem in the data directory)"
                    );
                }
            }
            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    }

    async fn serve<IO>(
        &self,
        io: IO,
        tls: bool,
        protocol: Protocol,
        deadline: tokio::time::Instant,
        watcher: Watcher,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let info = ConnInfo {
            tls,
            limits: self.limits,
        };
        let first_request = Arc::new(AtomicBool::new(false));
        let seen = first_request.clone();
        let handler = self.handler.clone();
        let admission = self.admission;
        let service = service_fn(move |req| {
            seen.store(true, Ordering::Relaxed);
            let handler = handler.clone();
            // Boxed: hyper keeps room for a connection's request future as long as the
            // connection is open; this way the room is a pointer, and the request's own
            // future is freed as soon as its response is made (an idle stream keeps
            // nothing of it).
            Box::pin(async move {
                let response = match admission {
                    Admission::Refuse => ApiError::too_many_connections().into_response(),
                    Admission::Serve if uri_len(&req) > MAX_URI_BYTES => {
                        ApiError::uri_too_long().into_response()
                    }
                    Admission::Serve => handler.handle(req, info).await,
                };
                Ok::<_, std::convert::Infallible>(response)
            })
        });
        let io = TokioIo::new(JsonErrors::new(io));
        let keep_alive = admission == Admission::Serve;
        let limits = self.limits;
        // Each protocol's own connection, chosen before hyper reads a byte: a connection
        // that detected its protocol itself would replay the bytes it read through a
        // wrapper (which makes HTTP/1.1's read buffer grow a second time) and carry both
        // protocols' state. HTTP/2 is boxed: one connection carries many streams, and an
        // HTTP/1.1 connection's task does not carry HTTP/2's room.
        match protocol {
            Protocol::Http1 => {
                // The builder goes before the await: the task would keep it otherwise.
                let conn = {
                    let mut builder = http1::Builder::new();
                    builder
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_header_size(MAX_HEADER_BYTES)
                        .max_buf_size(MAX_HEADER_BYTES)
                        .max_headers(MAX_HEADER_FIELDS)
                        .keep_alive(keep_alive);
                    watcher.watch(builder.serve_connection(io, service))
                };
                tokio::pin!(conn);
                self.watch(conn, deadline, &first_request).await
            }
            Protocol::Http2 => {
                let mut builder = http2::Builder::new(TokioExecutor::new());
                builder
                    .timer(TokioTimer::new())
                    .max_header_list_size(MAX_HEADER_BYTES as u32)
                    .max_concurrent_streams(limits.max_h2_streams)
                    .keep_alive_interval(Some(Duration::from_secs(30)));
                let mut conn = Box::pin(watcher.watch(builder.serve_connection(io, service)));
                self.watch(conn.as_mut(), deadline, &first_request).await
            }
        }
    }

    /// Runs `conn` to its end under the watchdog: a connection that has not produced a
    /// complete request by `deadline` is closed (hyper does not time the wait for the
    /// first bytes); a refused one lives until `deadline` at most. The end of the shutdown
    /// grace closes it too.
    ///
    /// Everything is borrowed: an async fn's task keeps room for its arguments twice.
    async fn watch<C, E>(
        &self,
        mut conn: Pin<&mut C>,
        deadline: tokio::time::Instant,
        first_request: &AtomicBool,
    ) where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let whole_life = self.admission == Admission::Refuse;
        let deadline = tokio::time::sleep_until(deadline);
        tokio::pin!(deadline);
        let mut armed = true;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(peer = %self.peer, %error, "connection ended with an error");
                    }
                    return;
                }
                () = &mut deadline, if armed => {
                    if first_request.load(Ordering::Relaxed) && !whole_life {
                        armed = false;
                    } else {
                        tracing::debug!(peer = %self.peer, "no complete request within the header timeout; closing");
                        return;
                    }
                }
                () = self.abort.cancelled() => {
                    tracing::debug!(peer = %self.peer, "closed at the end of the shutdown grace");
                    return;
                }
            }
        }
    }
}

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// HTTP/2's connection preface (RFC 9113, section 3.4): a client with prior knowledge
/// opens a cleartext connection with it.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long to wait before looking again at a connection that has sent part of the
/// preface and nothing more (peeking does not consume, so it would return at once).
const PREFACE_POLL: Duration = Duration::from_millis(2);

/// Which protocol a cleartext connection speaks, from its first bytes, left unread: HTTP/2
/// when they are the preface, HTTP/1.1 as soon as they differ from it (the first two bytes
/// of any HTTP/1.1 method do) or the peer closes.
async fn cleartext_protocol(stream: &TcpStream) -> std::io::Result<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut first).await?;
        if n == 0 || first[..n] != H2_PREFACE[..n] {
            return Ok(Protocol::Http1);
        }
        if n == H2_PREFACE.len() {
            return Ok(Protocol::Http2);
        }
        tokio::time::sleep(PREFACE_POLL).await;
    }
}

/// The length of a request's target as sent (path and query).
fn uri_len<B>(req: &Request<B>) -> usize {
    req.uri().path_and_query().map_or(0, |pq| pq.as_str().len())
}

fn tune_socket(stream: &TcpStream, limits: Limits) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = socket2::SockRef::from(stream);
    sock.set_send_buffer_size(limits.send_buffer)?;
    Ok(())
}

/// When a refused certificate was last logged (ms since the epoch).
static LAST_REFUSAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a line rate-limited by `last` may be logged now (at most every 10 s); if so,
/// it is taken.
fn due(last: &std::sync::atomic::AtomicU64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let before = last.load(std::sync::atomic::Ordering::Relaxed);
    now.saturating_sub(before) >= 10_000
        && last
            .compare_exchange(
                before,
                now,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
}

/// Whether a failed handshake is the client refusing the certificate (its alert).
fn refused_certificate(error: &std::io::Error) -> bool {
    use rustls::AlertDescription::{BadCertificate, CertificateUnknown, UnknownCA};
    matches!(
        error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::AlertReceived(
            BadCertificate | CertificateUnknown | UnknownCA
        ))
    )
}
