//! The only code that knows hyper: the accept loop, TLS, per-connection limits, routes,
//! policy, and the mapping of errors to status codes (`error.rs`).
//!
//! Connection limits: a client has [`Limits::header_read_timeout`] from accept to finish
//! its TLS handshake and its first request's headers (a watchdog closes it otherwise; hyper
//! enforces the same bound on later HTTP/1.1 requests with its own timer). Stream
//! connections get a bounded kernel send buffer, so a reader that stops draining stalls
//! only itself.

pub mod body;
pub mod error;
pub mod policy;
pub mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Auth;
use crate::runtime::Runtime;
use policy::OriginPolicy;

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time allowed from accept to the end of the first request's headers (TLS handshake
    /// included), and for each later HTTP/1.1 request's headers.
    pub header_read_timeout: Duration,
    /// Kernel send buffer per connection (bytes).
    pub send_buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            send_buffer: 256 * 1024,
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
}

impl App {
    pub fn new(
        runtime: Runtime,
        path: String,
        auth: Auth,
        allowed_origins: &[String],
        agents: Vec<(String, String)>,
    ) -> App {
        App {
            runtime,
            path,
            auth,
            origins: OriginPolicy::new(allowed_origins),
            agents,
        }
    }
}

/// Accepts connections until `shutdown` fires, then stops accepting and returns a handle
/// that finishes the open connections gracefully.
pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    limits: Limits,
    shutdown: CancellationToken,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
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
        if let Err(error) = tune_socket(&stream, limits) {
            tracing::debug!(%error, "socket options not applied");
        }
        let span = tracing::debug_span!("conn", peer = %peer);
        let conn = Connection {
            app: app.clone(),
            limits,
            peer,
        };
        let watcher = graceful.watcher();
        match tls.clone() {
            Some(acceptor) => {
                tokio::spawn(
                    async move {
                        let handshake = tokio::time::timeout(
                            limits.header_read_timeout,
                            acceptor.accept(stream),
                        );
                        match handshake.await {
                            Ok(Ok(stream)) => conn.serve(stream, true, watcher).await,
                            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        }
                    }
                    .instrument(span),
                );
            }
            None => {
                tokio::spawn(conn.serve(stream, false, watcher).instrument(span));
            }
        }
    }
    graceful
}

struct Connection {
    app: Arc<App>,
    limits: Limits,
    peer: SocketAddr,
}

impl Connection {
    async fn serve<IO>(self, io: IO, tls: bool, graceful: hyper_util::server::graceful::Watcher)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let first_request = Arc::new(AtomicBool::new(false));
        let seen = first_request.clone();
        let app = self.app.clone();
        let service = service_fn(move |req| {
            seen.store(true, Ordering::Relaxed);
            let app = app.clone();
            async move { Ok::<_, std::convert::Infallible>(routes::handle(&app, req, tls).await) }
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)));
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::pin!(conn);
        // The watchdog: a connection that has not produced a complete request by the
        // header timeout is closed (hyper does not time the wait for the first bytes).
        let deadline = tokio::time::sleep(self.limits.header_read_timeout);
        tokio::pin!(deadline);
        let mut armed = true;
        loop {
            tokio::select! {
                result = &mut conn => {
                    if let Err(error) = result {
                        tracing::debug!(peer = %self.peer, %error, "connection ended with an error");
                    }
                    return;
                }
                () = &mut deadline, if armed => {
                    if first_request.load(Ordering::Relaxed) {
                        armed = false;
                    } else {
                        tracing::debug!(peer = %self.peer, "no complete request within the header timeout; closing");
                        return;
                    }
                }
            }
        }
    }
}

fn tune_socket(stream: &TcpStream, limits: Limits) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = socket2::SockRef::from(stream);
    sock.set_send_buffer_size(limits.send_buffer)?;
    Ok(())
}
