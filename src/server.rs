//! Ties configuration, runtime and HTTP together: bind, serve until the shutdown future
//! resolves, then the one shutdown sequence:
//!
//! 1. stop accepting connections;
//! 2. drain: new runs get `503 DRAINING`, schedules stop firing;
//! 3. wait for running runs until `shutdown_grace` minus a flush margin;
//! 4. cancel the rest: each attached stream gets its terminal event (`RUN_ERROR` with code
//!    `SHUTDOWN`);
//! 5. end every stream, stop the agent processes (stdin EOF, SIGTERM, SIGKILL), flush the
//!    store, export the spans still batched (`--otlp-endpoint`), stop the webhook delivery
//!    (what is undelivered stays in the outbox), and let connections finish, bounded by
//!    what is left of the grace.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::Agent;
use crate::agent::acp::{AcpBackend, AgentHost};
use crate::agent::demo::DemoAgent;
use crate::cluster::{Cluster, ClusterError};
use crate::config::{AgentKind, Auth, Config, TlsMode};
use crate::http::forward::Forwarder;
use crate::http::metrics_endpoint::MetricsEndpoint;
use crate::http::tls::{self, TlsError};
use crate::http::{self as web, App, Limits};
use crate::metrics::Metrics;
use crate::runtime::{CancelReason, Runtime, RuntimeOptions};
use crate::store::{DataDirLock, Fence, Store, StoreError};
use crate::traces::{Exporter, TraceError, Tracer};
use crate::webhooks::{Delivery, Outbox};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("scoped tokens: {0}")]
    Access(String),
    #[error("{0}")]
    Ui(String),
    #[error(transparent)]
    Traces(#[from] TraceError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("webhooks: {0}")]
    Webhooks(std::io::Error),
    #[error("the agents' egress gateway: {0}")]
    Egress(std::io::Error),
}

/// A bound, ready-to-run server.
pub struct Server {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    runtime: Runtime,
    limits: Limits,
    shutdown_grace: Duration,
    local_addr: SocketAddr,
    path: String,
    /// The metrics listener (`--metrics-listen`) and what it serves.
    metrics: Option<(TcpListener, Arc<MetricsEndpoint>)>,
    /// The span exporter (`--otlp-endpoint`), flushed at the end of the shutdown.
    traces: Option<Exporter>,
    /// The webhooks' delivery (`[[webhooks]]`), started with the server.
    webhooks: Option<Delivery>,
    /// The data directory's lock (embedded store only).
    _data_lock: Option<DataDirLock>,
}

impl Server {
    /// Binds the configured address and prepares TLS and the agents.
    pub async fn bind(config: Config) -> Result<Server, ServeError> {
        let listener = TcpListener::bind(config.socket_addr())
            .await
            .map_err(|source| ServeError::Bind {
                addr: config.socket_addr(),
                source,
            })?;
        Server::from_listener(listener, config).await
    }

    /// Uses an already bound listener (tests bind port 0 and pass it in).
    pub async fn from_listener(
        listener: TcpListener,
        config: Config,
    ) -> Result<Server, ServeError> {
        let local_addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: config.socket_addr(),
            source,
        })?;
        let tls = tls_acceptor(&config)?;
        ensure_dir(&config.data_dir)?;
        let host = agent_host(&config)?;
        let agents = agents(&config, &host);
        // The embedded store's data directory, held while this server lives.
        let data_lock = (config.cluster.is_none())
            .then(|| Store::lock_data_dir(&config.data_dir))
            .transpose()?;
        let (store, cluster) = open_store(&config).await?;
        let local_key = signing_key(&config, cluster.as_deref()).await?;
        let mut options = runtime_options(&config)?;
        let (traces, tracer) = trace_exporter(&config)?;
        options.tracer = tracer.clone();
        options.cluster = cluster.clone();
        options.egress_metrics = host.egress_metrics.clone().unwrap_or_default();
        if let Some(uploads) = &options.uploads {
            // What no run used within its TTL, and what a crash left half-written.
            uploads.sweep().await;
        }
        let outbox = (!config.webhooks.is_empty()).then(|| Arc::new(Outbox::new(&config.webhooks)));
        options.webhooks = outbox.clone();
        let webhooks = match &outbox {
            Some(outbox) => Some(delivery(&config, store.clone(), outbox)?),
            None => None,
        };
        let runtime = Runtime::new(agents, options, store);
        let metrics = Arc::new(Metrics::new(Arc::new(runtime.clone())));
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some((
                bind_now(addr)?,
                Arc::new(MetricsEndpoint::new(metrics.clone())),
            )),
            None => None,
        };
        let access = access(&config, &local_key)?;
        let app = app(
            &config,
            runtime.clone(),
            metrics,
            access,
            tracer,
            cluster.as_deref(),
        )?;
        Ok(Server {
            listener,
            tls,
            app,
            runtime,
            limits: Limits {
                max_connections: fit_to_open_files(config.max_connections),
                ..Limits::default()
            },
            shutdown_grace: config.shutdown_grace,
            local_addr,
            path: config.path,
            metrics: metrics_listener,
            traces,
            webhooks,
            _data_lock: data_lock,
        })
    }

    /// Overrides the per-connection limits.
    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address of the metrics listener, when one is configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// The base URL of the route namespace, e.g. `https://127.0.0.1:8443/agui`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{}", self.local_addr, self.path)
    }

    /// Serves until `shutdown` resolves, then shuts down within the grace.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // Schedules fire while the server serves; the drain stops them.
        self.runtime.spawn_scheduler();
        let stop_accepting = CancellationToken::new();
        let accept = tokio::spawn(web::accept_loop(
            self.listener,
            self.tls,
            self.app,
            self.limits,
            stop_accepting.clone(),
        ));
        let metrics = self
            .metrics
            .map(|(listener, endpoint)| serve_metrics(listener, endpoint, &stop_accepting));
        // Input queued before the last stop runs now, in order.
        let queues = tokio::spawn({
            let runtime = self.runtime.clone();
            async move { runtime.resume_queues().await }
        });
        let (deliveries, stop_delivering) = (TaskTracker::new(), CancellationToken::new());
        if let Some(delivery) = self.webhooks {
            delivery.spawn(&deliveries, &stop_delivering);
        }
        deliveries.close();
        shutdown.await;
        queues.abort();
        let begun = Instant::now();
        let deadline = begun + self.shutdown_grace;
        // Leave part of the grace for terminal events to reach the clients.
        let margin = (self.shutdown_grace / 4).min(Duration::from_secs(2));
        tracing::info!(
            grace_ms = self.shutdown_grace.as_millis() as u64,
            "shutting down: no new connections, draining runs"
        );
        stop_accepting.cancel();
        self.runtime.drain();
        let graceful = match accept.await {
            Ok(graceful) => Some(graceful),
            Err(error) => {
                tracing::error!(%error, "accept loop failed");
                None
            }
        };
        end_runs(&self.runtime, deadline, margin).await;
        // What was not delivered (the runs' last events among it) stays in the outbox for
        // the next start; an attempt cut here is made again then.
        stop_delivering.cancel();
        deliveries.wait().await;
        if let Some(traces) = self.traces {
            // Every run has ended: its spans go out now, within what is left of the grace.
            let left = deadline.saturating_duration_since(Instant::now());
            traces.shutdown(left.max(Duration::from_millis(100))).await;
        }
        if let Some(metrics) = metrics
            && let Ok(serving) = metrics.await
        {
            serving.finish(deadline.into()).await;
        }
        if let Some(graceful) = graceful
            && !graceful.finish(deadline.into()).await
        {
            tracing::info!("connections still open at the end of the grace; closing them");
        }
        tracing::info!(
            elapsed_ms = begun.elapsed().as_millis() as u64,
            "shutdown complete"
        );
    }
}

/// Binds and serves `config` until `shutdown` resolves.
pub async fn serve(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let server = Server::bind(config).await?;
    server.run(shutdown).await;
    Ok(())
}

/// The metrics listener's limits: a scraper or two, short requests.
const METRICS_LIMITS: Limits = Limits {
    header_read_timeout: Duration::from_secs(10),
    body_read_timeout: Duration::from_secs(10),
    send_buffer: 256 * 1024,
    max_connections: 16,
    max_h2_streams: 16,
};

/// Binds `addr` from a synchronous context (inside the tokio runtime).
fn bind_now(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let bind = |addr| {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        TcpListener::from_std(listener)
    };
    bind(addr).map_err(|source| ServeError::Bind { addr, source })
}

/// Creates the data directory (and missing parents) readable by this user only, whatever
/// the umask: it holds every transcript. An existing directory is left as it is (the
/// database files in it are made private by the store).
fn ensure_dir(path: &std::path::Path) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| ServeError::DataDir {
            path: path.to_owned(),
            source,
        })
}

/// Descriptors kept for everything but client connections: the store, agent processes and
/// their pipes, the MCP listener and its connections, logs.
const RESERVED_FILES: u64 = 256;

/// Raises the process's soft open-file limit to its hard limit (as much room as the system
/// allows), and lowers `wanted` connections to what then fits beside the reserve, so the
/// listener refuses connections with a 503 before accept() starts failing.
fn fit_to_open_files(wanted: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let room = limit.saturating_sub(RESERVED_FILES).max(1);
    if (wanted as u64) <= room {
        return wanted;
    }
    let fitted = usize::try_from(room).unwrap_or(wanted);
    tracing::warn!(
        wanted,
        fitted,
        open_file_limit = limit,
        "max_connections lowered to fit the open-file limit (raise LimitNOFILE to serve more)"
    );
    fitted
}

/// Scoped-token verification and minting: the configured keys plus the daemon's own key in
/// the data directory; minted tokens are signed with the first configured HMAC key, else
/// with the daemon's own.
fn access(config: &Config, local: &[u8]) -> Result<web::policy::Access, ServeError> {
    use crate::access::jwt::{self, Signer, Verifier};
    let settings = &config.access;
    let verifier = Verifier::load(
        &settings.keys,
        settings.audience.clone(),
        settings.issuer.clone(),
        settings.leeway,
    )
    .map_err(ServeError::Access)?
    .with_local_key(local);
    let signer = match Signer::from_config(&settings.keys).map_err(ServeError::Access)? {
        Some(signer) => signer,
        None => Signer::hmac(
            Some(jwt::LOCAL_KID.to_owned()),
            jsonwebtoken::Algorithm::HS256,
            local,
        ),
    }
    .claiming(settings.audience.clone(), settings.issuer.clone());
    Ok(web::policy::Access {
        verifier,
        signer: Some(signer),
        trusted_header: settings.trusted_principal_header.clone(),
    })
}

/// The TLS acceptor: none for plain HTTP, else the configured certificate or the
/// self-signed one in the data directory.
fn tls_acceptor(config: &Config) -> Result<Option<TlsAcceptor>, ServeError> {
    Ok(match &config.tls {
        TlsMode::Off => None,
        TlsMode::SelfSigned => {
            ensure_dir(&config.data_dir)?;
            Some(tls::self_signed_acceptor(&config.data_dir)?)
        }
        TlsMode::Files { cert, key } => Some(tls::acceptor_from_files(cert, key)?),
    })
}

/// What the agent processes share: the launcher, the loopback MCP server, and the paths no
/// agent may read (the daemon's secrets, `$HOME`, every workspace root). Each workspace
/// root is made here, before any agent starts, so every launch carves it out by name.
fn agent_host(config: &Config) -> Result<AgentHost, ServeError> {
    let mut host = AgentHost::new(&config.data_dir);
    host.mcp = Some(Arc::new(crate::http::mcp::LoopbackMcp::default()));
    let gateway =
        crate::http::transport::egress::EgressGateway::new().map_err(ServeError::Egress)?;
    host.gateway = Some(Arc::new(gateway));
    host.egress_metrics = Some(crate::metrics::EgressMetrics::default());
    host.secrets = config.secret_paths();
    host.secrets.extend(crate::confine::host_secrets());
    host.secrets
        .extend(std::env::var_os("HOME").map(std::path::PathBuf::from));
    // Every workspace root: a process is granted its own directory in it, never a
    // read path that holds the others.
    for agent in &config.agents {
        if let AgentKind::Acp(acp) = &agent.kind
            && let Some(workspace) = &acp.workspace
        {
            ensure_dir(&workspace.root)?;
            host.secrets.push(workspace.root.clone());
        }
    }
    if let Some(launcher) = &config.launcher {
        host.launcher = launcher.clone();
    }
    Ok(host)
}

/// The configured agents by name.
fn agents(config: &Config, host: &AgentHost) -> BTreeMap<String, Arc<dyn Agent>> {
    let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
    for agent in &config.agents {
        match &agent.kind {
            AgentKind::Demo => {
                agents.insert(agent.name.clone(), Arc::new(DemoAgent));
            }
            AgentKind::Acp(acp) => {
                agents.insert(
                    agent.name.clone(),
                    Arc::new(AcpBackend::new(&agent.name, acp.clone(), host.clone())),
                );
            }
        }
    }
    agents
}

/// The store: embedded SQLite in the data directory, or PostgreSQL shared by the nodes of
/// a cluster, which this node joins.
async fn open_store(config: &Config) -> Result<(Store, Option<Arc<Cluster>>), ServeError> {
    match &config.cluster {
        None => Ok((Store::open(&config.data_dir)?, None)),
        Some(settings) => {
            let fence = Fence::new(&Cluster::process_id(&settings.node_name));
            let store = Store::connect_postgres(&settings.url, fence.clone()).await?;
            // The certificate this node serves, published for the others to pin.
            let mut settings = settings.clone();
            settings.cert = match &config.tls {
                TlsMode::Off => None,
                TlsMode::SelfSigned => Some(tls::leaf_certificate(
                    &tls::self_signed_paths(&config.data_dir).0,
                )?),
                TlsMode::Files { cert, .. } => Some(tls::leaf_certificate(cert)?),
            };
            let cluster = Cluster::join(settings, fence).await?;
            Ok((store, Some(Arc::new(cluster))))
        }
    }
}

/// The key that signs minted tokens: every node of a cluster shares one.
async fn signing_key(config: &Config, cluster: Option<&Cluster>) -> Result<Vec<u8>, ServeError> {
    Ok(match cluster {
        None => crate::access::jwt::local_secret(&config.data_dir).map_err(ServeError::Access)?,
        Some(cluster) => cluster
            .shared_secret("token-signing", 32)
            .await
            .map(|bytes| crate::hex::encode(&bytes).into_bytes())?,
    })
}

/// The runtime's settings from the configuration (the tracer and the cluster are added
/// once they exist).
fn runtime_options(config: &Config) -> Result<RuntimeOptions, ServeError> {
    let mut options = RuntimeOptions::new(config.max_concurrent_runs);
    options.disconnect_grace = config.disconnect_grace;
    options.keep_alive = config.keep_alive;
    options.suspend_timeout = config.suspend_timeout;
    options.stall_timeout = config.stall_timeout;
    options.fleet_history = config.fleet_history;
    options.ui = Arc::new(
        crate::runtime::ui::UiCatalog::new(config.ui.components.clone(), config.ui.max_props)
            .map_err(ServeError::Ui)?,
    );
    options.memory_budget = config.memory_budget;
    // The budget bounds the whole process: what it holds now and its reserve come off
    // what retained data may hold.
    let resident = crate::runtime::memory::resident_bytes().unwrap_or(0);
    options.memory_reserved =
        crate::runtime::memory::process_reserve(config.memory_budget, resident);
    options.secrets = match &config.auth {
        Auth::Token(token) => vec![token.expose().to_owned()],
        Auth::Misconfigured => Vec::new(),
    };
    options.max_runs_per_principal = config.access.max_runs_per_principal;
    options.fleet_limits = config.access.fleet_streams;
    options.hitl = config
        .agents
        .iter()
        .map(|a| (a.name.clone(), a.hitl))
        .collect();
    options.multitask = config
        .agents
        .iter()
        .map(|a| (a.name.clone(), a.multitask))
        .collect();
    options.client_history = config
        .agents
        .iter()
        .filter(|a| a.history == crate::agent::History::Client)
        .map(|a| a.name.clone())
        .collect();
    options.budgets = config.budgets.clone();
    options.agent_budgets = config
        .agents
        .iter()
        .filter_map(|a| a.budget.map(|budget| (a.name.clone(), budget)))
        .collect();
    options.uploads = Some(Arc::new(crate::uploads::Uploads::new(
        config.data_dir.join("uploads"),
        &config.path,
        config.uploads.clone(),
    )));
    Ok(options)
}

/// The webhooks' delivery from `store`'s outbox, with its HTTP client.
fn delivery(config: &Config, store: Store, outbox: &Outbox) -> Result<Delivery, ServeError> {
    let client = crate::http::webhook::WebhookClient::new().map_err(ServeError::Webhooks)?;
    tracing::info!(endpoints = config.webhooks.len(), "delivering webhooks");
    Ok(Delivery::new(
        store,
        config.webhooks.clone(),
        Arc::new(client),
        outbox,
    ))
}

/// Traces: an exporter only when an endpoint is configured.
fn trace_exporter(config: &Config) -> Result<(Option<Exporter>, Option<Tracer>), ServeError> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok((None, None));
    };
    let client =
        crate::http::otlp::OtlpClient::new(crate::traces::EXPORT_TIMEOUT, endpoint.is_https())
            .map_err(crate::traces::TraceError::from)?;
    let (exporter, tracer) = Exporter::start(endpoint, client)?;
    tracing::info!(
        endpoint = endpoint.traces_url(),
        "exporting traces over OTLP"
    );
    Ok((Some(exporter), Some(tracer)))
}

/// What every request handler sees: the runtime, the routes' settings, metrics, access,
/// the tracer, and in a cluster the hop to the other nodes.
fn app(
    config: &Config,
    runtime: Runtime,
    metrics: Arc<Metrics>,
    access: web::policy::Access,
    tracer: Option<Tracer>,
    cluster: Option<&Cluster>,
) -> Result<Arc<App>, ServeError> {
    let mut app = App::new(
        runtime,
        config.path.clone(),
        config.auth.clone(),
        &config.allowed_origins,
        config
            .agents
            .iter()
            .map(|a| (a.name.clone(), a.description.clone()))
            .collect(),
        metrics,
    )
    .with_access(access);
    app.tracer = tracer;
    if let Some(cluster) = cluster {
        app = app.with_forwarder(
            Forwarder::new(cluster.node(), cluster.lease_ttl())
                .map_err(|e| ServeError::Access(e.to_string()))?,
        );
    }
    Ok(Arc::new(app))
}

/// Serves `/metrics` without a token on its own listener (`--metrics-listen`) until
/// `stop_accepting` is cancelled.
fn serve_metrics(
    listener: TcpListener,
    endpoint: Arc<MetricsEndpoint>,
    stop_accepting: &CancellationToken,
) -> tokio::task::JoinHandle<web::Serving> {
    tracing::info!(
        addr = %listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        "serving /metrics without a token"
    );
    tokio::spawn(web::accept_loop(
        listener,
        None,
        endpoint,
        METRICS_LIMITS,
        stop_accepting.clone(),
    ))
}

/// Ends the runs within the grace: waits for them until `deadline` less `margin`, cancels
/// the rest, ends every stream, stops the agent processes, flushes the store and releases
/// the thread leases.
async fn end_runs(runtime: &Runtime, deadline: Instant, margin: Duration) {
    if !runtime.wait_runs(deadline - margin).await {
        let gauge = runtime.gauge();
        tracing::info!(
            remaining = gauge.active,
            "grace ending; cancelling remaining runs"
        );
        runtime.cancel_all(CancelReason::Shutdown);
        runtime.wait_runs(deadline).await;
    }
    runtime.stop_streams();
    // Agent processes get what is left of the grace; any still running when it ends are
    // killed with their process group as the backend is dropped.
    if tokio::time::timeout_at(deadline.into(), runtime.shutdown_agents())
        .await
        .is_err()
    {
        tracing::info!("agent processes still stopping at the end of the grace; killing them");
    }
    runtime.flush_store().await;
    // Every run has ended and is stored: the threads are free for the other nodes at
    // once, instead of after their leases lapse.
    runtime.release_leases().await;
}
