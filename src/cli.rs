//! Command line and config file: clap and TOML types stop here and become a validated
//! [`Config`].
//!
//! Precedence for every setting: flag > config file > environment > default. For the token:
//! `--token` > `--token-file` > `server.token_file` in the file > `AGUI_TOKEN` > generated. An
//! explicitly given but empty source is an error, never a fall-through.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use serde::Deserialize;

use crate::cluster::ClusterConfig;
use crate::config::{
    AccessConfig, AcpConfig, AgentConfig, AgentKind, Auth, BearerToken, Config, ConfigError,
    FrontendMcp, Hitl, LogFormat, OtlpEndpoint, Permissions, RESERVED_AGENT_NAMES, TlsMode,
    TokenSource, default_data_dir, normalize_path, parse_duration, parse_size, valid_agent_name,
};

/// Serve agent runtimes over the AG-UI protocol.
#[derive(Debug, Parser)]
#[command(name = "agui-serve", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub args: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the configuration and print it resolved, secrets redacted.
    CheckConfig,
}

#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file; flags override it [default: none]
    #[arg(long, env = "AGUI_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Bind address [default: 127.0.0.1]
    #[arg(long, global = true)]
    pub host: Option<IpAddr>,
    /// Port; 0 picks a free one [default: 8443]
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// Route namespace [default: /agui]
    #[arg(long, global = true)]
    pub path: Option<String>,
    /// Bearer token (prefer --token-file: flags are visible in the process list) [default:
    /// --token-file, else AGUI_TOKEN, else one is generated and printed]
    #[arg(long, global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (trailing newline trimmed).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Allowed browser origin; repeatable; exact, case-insensitive, or `*` [default: none]
    #[arg(long = "allowed-origin", global = true, value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Serve plain HTTP [default: TLS with a self-signed certificate]
    #[arg(long, global = true)]
    pub no_tls: bool,
    /// PEM certificate chain (with --tls-key).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (with --tls-cert).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// SQLite database and generated certificate [default: $STATE_DIRECTORY, else
    /// $XDG_STATE_HOME/agui-serve, else ~/.local/state/agui-serve]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Admission cap; a suspended run still holds its slot [default: 64]
    #[arg(long, global = true, value_name = "N")]
    pub max_concurrent_runs: Option<usize>,
    /// How long a run with no attached stream lives on [default: 30s]
    #[arg(long, global = true, value_name = "DUR")]
    pub disconnect_grace: Option<String>,
    /// How long shutdown waits for running runs [default: 10s]
    #[arg(long, global = true, value_name = "DUR")]
    pub shutdown_grace: Option<String>,
    /// SSE keep-alive comment after this much silence [default: 15s]
    #[arg(long, global = true, value_name = "DUR")]
    pub keep_alive: Option<String>,
    /// How long a run waits on the client before failing closed [default: 15m]
    #[arg(long, global = true, value_name = "DUR")]
    pub suspend_timeout: Option<String>,
    /// Bytes of finished runs' frames and idle threads kept in memory [default: 256MiB]
    #[arg(long, global = true, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// Connections served at once (each open event stream holds one) [default: 4096,
    /// lowered to fit the process's open-file limit]
    #[arg(long, global = true, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Also serve `GET /metrics` without a token, over plain HTTP, on this address (keep it
    /// on loopback) [default: none; `{path}/metrics` with the token is always there]
    #[arg(long, global = true, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Export traces (spans per request, run, turn and tool call) over OTLP/HTTP to this
    /// collector, e.g. http://127.0.0.1:4318 or https://... [default: none, no traces]
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// An ACP agent: NAME=COMMAND (shell-style words); repeatable [default: the built-in
    /// `demo` agent when no agent is configured]
    #[arg(long = "acp", global = true, value_name = "NAME=COMMAND")]
    pub acp: Vec<String>,
    /// Log format (levels from RUST_LOG) [default: text]
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormatArg>,
    /// HMAC (HS256) secret file that verifies scoped tokens, and signs minted ones;
    /// repeatable (rotation) [default: only the daemon's own key in the data directory]
    #[arg(long, global = true, value_name = "FILE")]
    pub jwt_secret_file: Vec<PathBuf>,
    /// JWKS file whose keys verify scoped tokens (each key's `alg` pinned); repeatable
    #[arg(long, global = true, value_name = "FILE")]
    pub jwt_jwks_file: Vec<PathBuf>,
    /// Scoped tokens must carry this `aud` [default: none checked]
    #[arg(long, global = true, value_name = "AUD")]
    pub jwt_audience: Option<String>,
    /// With the master token, this header names the principal to act for (a signing-in
    /// proxy) [default: none]
    #[arg(long, global = true, value_name = "NAME")]
    pub trusted_principal_header: Option<String>,
    /// Concurrent runs one principal may hold; the operator is not capped [default: 8]
    #[arg(long, global = true, value_name = "N")]
    pub max_runs_per_principal: Option<usize>,
    /// Fleet streams open at once, in all [default: 1024]
    #[arg(long, global = true, value_name = "N")]
    pub max_fleet_streams: Option<usize>,
    /// Fleet streams one principal may hold open (the operator's namespace counts as one)
    /// [default: 64]
    #[arg(long, global = true, value_name = "N")]
    pub max_fleet_streams_per_principal: Option<usize>,
    /// Where threads, transcripts and runs live: `sqlite` (in the data directory), or a
    /// PostgreSQL connection string (`postgres://...` or `host=... dbname=...`) shared by
    /// the nodes of a cluster [default: sqlite]
    #[arg(
        long,
        global = true,
        value_name = "STORE",
        env = "AGUI_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,
    /// This node's name in a cluster [default: node]
    #[arg(long, global = true, value_name = "NAME")]
    pub node_id: Option<String>,
    /// How the other nodes of a cluster reach this one, e.g. http://10.0.0.5:8443
    /// [default: this listener's scheme, host and port, when the host is not a wildcard]
    #[arg(long, global = true, value_name = "URL")]
    pub advertise_url: Option<String>,
    /// How long a node's hold on a thread lasts without renewal; a dead node's threads
    /// move to another node after it [default: 10s]
    #[arg(long, global = true, value_name = "DUR")]
    pub lease_ttl: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    server: FileServer,
    #[serde(default)]
    agents: Vec<FileAgent>,
    #[serde(default)]
    auth: FileAuth,
    #[serde(default)]
    ui: FileUi,
}

/// `[ui]`: the components agents may show.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUi {
    max_props: Option<String>,
    /// When given, exactly these (a default by name, or any with `schema_file`).
    components: Option<Vec<FileUiComponent>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUiComponent {
    name: String,
    schema_file: Option<PathBuf>,
}

/// `[auth]`: scoped tokens and principals.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAuth {
    #[serde(default)]
    keys: Vec<FileKey>,
    audience: Option<String>,
    issuer: Option<String>,
    leeway: Option<String>,
    trusted_principal_header: Option<String>,
    max_runs_per_principal: Option<usize>,
    max_fleet_streams: Option<usize>,
    max_fleet_streams_per_principal: Option<usize>,
}

/// `[[auth.keys]]`: one verification key; exactly one source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    kid: Option<String>,
    alg: Option<String>,
    secret_file: Option<PathBuf>,
    public_key_file: Option<PathBuf>,
    jwks_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileServer {
    host: Option<IpAddr>,
    port: Option<u16>,
    path: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    no_tls: Option<bool>,
    data_dir: Option<PathBuf>,
    max_concurrent_runs: Option<usize>,
    disconnect_grace: Option<String>,
    shutdown_grace: Option<String>,
    keep_alive: Option<String>,
    suspend_timeout: Option<String>,
    stall_timeout: Option<String>,
    fleet_history: Option<usize>,
    memory_budget: Option<String>,
    max_connections: Option<usize>,
    metrics_listen: Option<SocketAddr>,
    otlp_endpoint: Option<String>,
    log_format: Option<LogFormat>,
    store: Option<String>,
    node_id: Option<String>,
    advertise_url: Option<String>,
    lease_ttl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAgent {
    name: String,
    kind: String,
    #[serde(default)]
    command: Vec<String>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    description: Option<String>,
    pool_size: Option<usize>,
    idle_ttl: Option<String>,
    permissions: Option<Permissions>,
    hitl: Option<Hitl>,
    mcp_frontend_tools: Option<FrontendMcp>,
    workspace: Option<FileWorkspace>,
    confinement: Option<crate::confine::Confinement>,
    sandbox: Option<crate::confine::Sandbox>,
    session_ttl: Option<String>,
}

/// `[agents.workspace]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWorkspace {
    source: Option<String>,
    root: Option<PathBuf>,
    quota: Option<String>,
    unit: Option<crate::workspace::Unit>,
}

/// The result of resolving a command line: the configuration and where the token came from.
#[derive(Debug)]
pub struct Resolved {
    pub config: Config,
    pub token_source: TokenSource,
}

impl Resolved {
    /// What `check-config` prints: the configuration with secrets redacted (a token that
    /// will be generated is said to be), and warnings about what would keep it from
    /// working (an agent command that cannot be found), also listed under `warnings`.
    pub fn report(&self) -> (serde_json::Value, Vec<String>) {
        let mut value = self.config.redacted_json();
        if self.token_source == TokenSource::Generated {
            value["server"]["token"] =
                serde_json::json!("<none configured: one is generated and printed at start>");
        }
        let mut warnings = Vec::new();
        for agent in &self.config.agents {
            if let AgentKind::Acp(acp) = &agent.kind
                && !crate::agent::acp::command_found(&acp.command)
            {
                warnings.push(format!(
                    "agent {:?}: command {:?} cannot be found or is not executable",
                    agent.name,
                    acp.command.first().map_or("", String::as_str)
                ));
            }
            if let AgentKind::Acp(acp) = &agent.kind {
                match crate::confine::in_force(acp.confinement) {
                    Ok(crate::confine::Confinement::None) => warnings.push(format!(
                        "agent {:?}: confinement = \"none\": the agent can read the daemon's data directory and keys",
                        agent.name
                    )),
                    Ok(_) => {}
                    Err(why) => warnings.push(format!(
                        "agent {:?}: will not start: {why}",
                        agent.name
                    )),
                }
            }
        }
        value["warnings"] = serde_json::json!(warnings);
        (value, warnings)
    }
}

impl ServeArgs {
    /// Resolves flags, the config file and the environment into a validated [`Config`].
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file_config(path)?,
            None => FileConfig::default(),
        };
        let server = &file.server;

        let host = self
            .host
            .or(server.host)
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let port = self.port.or(server.port).unwrap_or(8443);
        let path = normalize_path(
            self.path
                .as_deref()
                .or(server.path.as_deref())
                .unwrap_or("/agui"),
        )?;

        let (token, token_source) = self.resolve_token(server, env)?;

        let mut allowed_origins = if self.allowed_origins.is_empty() {
            server.allowed_origins.clone()
        } else {
            self.allowed_origins.clone()
        };
        for origin in &mut allowed_origins {
            let trimmed = origin.trim().trim_end_matches('/').to_owned();
            if trimmed.is_empty() {
                return Err(ConfigError::new("allowed origin is empty"));
            }
            *origin = trimmed;
        }

        let no_tls = self.no_tls || server.no_tls.unwrap_or(false);
        let cert = self.tls_cert.clone().or_else(|| server.tls_cert.clone());
        let key = self.tls_key.clone().or_else(|| server.tls_key.clone());
        let tls = match (no_tls, cert, key) {
            (true, None, None) => TlsMode::Off,
            (true, _, _) => {
                return Err(ConfigError::new(
                    "--no-tls cannot be combined with --tls-cert/--tls-key",
                ));
            }
            (false, None, None) => TlsMode::SelfSigned,
            (false, Some(cert), Some(key)) => TlsMode::Files { cert, key },
            (false, _, _) => {
                return Err(ConfigError::new(
                    "--tls-cert and --tls-key must be given together",
                ));
            }
        };

        let data_dir = self
            .data_dir
            .clone()
            .or_else(|| server.data_dir.clone())
            .unwrap_or_else(|| default_data_dir(env));

        let max_concurrent_runs = self
            .max_concurrent_runs
            .or(server.max_concurrent_runs)
            .unwrap_or(64);
        if max_concurrent_runs == 0 {
            return Err(ConfigError::new("max_concurrent_runs must be at least 1"));
        }

        let duration = |flag: &Option<String>, key: &Option<String>, default: &str, name: &str| {
            let text = flag.as_deref().or(key.as_deref()).unwrap_or(default);
            parse_duration(text).map_err(|e| ConfigError::new(format!("{name}: {e}")))
        };
        let disconnect_grace = duration(
            &self.disconnect_grace,
            &server.disconnect_grace,
            "30s",
            "disconnect_grace",
        )?;
        let shutdown_grace = duration(
            &self.shutdown_grace,
            &server.shutdown_grace,
            "10s",
            "shutdown_grace",
        )?;
        let keep_alive = duration(&self.keep_alive, &server.keep_alive, "15s", "keep_alive")?;
        if keep_alive.is_zero() {
            return Err(ConfigError::new("keep_alive must be greater than zero"));
        }
        let suspend_timeout = duration(
            &self.suspend_timeout,
            &server.suspend_timeout,
            "15m",
            "suspend_timeout",
        )?;

        let stall_timeout = duration(&None, &server.stall_timeout, "30s", "stall_timeout")?;
        if stall_timeout.is_zero() {
            return Err(ConfigError::new("stall_timeout must be greater than zero"));
        }

        const MIN_MEMORY_BUDGET: usize = 1 << 20;
        let memory_budget = match self
            .memory_budget
            .as_ref()
            .or(server.memory_budget.as_ref())
        {
            Some(text) => {
                parse_size(text).map_err(|e| ConfigError::new(format!("memory_budget: {e}")))?
            }
            None => crate::runtime::DEFAULT_MEMORY_BUDGET,
        };
        if memory_budget < MIN_MEMORY_BUDGET {
            return Err(ConfigError::new("memory_budget must be at least 1MiB"));
        }

        let max_connections = self
            .max_connections
            .or(server.max_connections)
            .unwrap_or(crate::http::DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(ConfigError::new("max_connections must be at least 1"));
        }

        let otlp_endpoint = match (&self.otlp_endpoint, &server.otlp_endpoint) {
            (Some(flag), _) => Some(
                OtlpEndpoint::parse(flag)
                    .map_err(|e| ConfigError::new(format!("--otlp-endpoint: {e}")))?,
            ),
            (None, Some(key)) => Some(
                OtlpEndpoint::parse(key)
                    .map_err(|e| ConfigError::new(format!("server.otlp_endpoint: {e}")))?,
            ),
            (None, None) => None,
        };
        let log_format = match self.log_format {
            Some(LogFormatArg::Text) => LogFormat::Text,
            Some(LogFormatArg::Json) => LogFormat::Json,
            None => server.log_format.unwrap_or(LogFormat::Text),
        };

        let mut agents = Vec::new();
        for agent in file.agents {
            agents.push(agent_from_file(agent, &data_dir)?);
        }
        for spec in &self.acp {
            agents.push(agent_from_flag(spec, &data_dir)?);
        }
        if agents.is_empty() {
            agents.push(AgentConfig::demo());
        }
        for (i, agent) in agents.iter().enumerate() {
            if agents[..i].iter().any(|a| a.name == agent.name) {
                return Err(ConfigError::new(format!(
                    "agent {:?} is configured twice",
                    agent.name
                )));
            }
        }

        let metrics_listen = self.metrics_listen.or(server.metrics_listen);
        check_agent_ports(&agents, port, metrics_listen.map(|a| a.port()))?;
        let cluster = self.resolve_cluster(server, host, port, &tls)?;
        let access = self.resolve_access(&file.auth, max_concurrent_runs)?;
        let ui = resolve_ui(&file.ui)?;
        let private_files = self.private_files(server, &access);

        Ok(Resolved {
            config: Config {
                host,
                port,
                path,
                auth: Auth::Token(token),
                allowed_origins,
                tls,
                data_dir,
                max_concurrent_runs,
                disconnect_grace,
                shutdown_grace,
                keep_alive,
                suspend_timeout,
                stall_timeout,
                fleet_history: match server.fleet_history {
                    Some(0) => return Err(ConfigError::new("fleet_history must be at least 1")),
                    Some(n) => n,
                    None => crate::runtime::fleet::DEFAULT_FLEET_HISTORY,
                },
                memory_budget,
                max_connections,
                metrics_listen,
                otlp_endpoint,
                log_format,
                agents,
                access,
                ui,
                cluster,
                private_files,
                launcher: None,
            },
            token_source,
        })
    }

    /// The files holding secrets: the config file, the token file, key files.
    fn private_files(&self, server: &FileServer, access: &AccessConfig) -> Vec<PathBuf> {
        use crate::access::jwt::KeySource;
        let mut files: Vec<PathBuf> = self.config.iter().cloned().collect();
        files.extend(
            self.token_file
                .clone()
                .or_else(|| server.token_file.clone()),
        );
        for key in &access.keys {
            files.push(match &key.source {
                KeySource::Secret(p) | KeySource::PublicKey(p) | KeySource::Jwks(p) => p.clone(),
            });
        }
        files
    }

    /// The cluster settings when the store is PostgreSQL (`None`: the embedded SQLite).
    fn resolve_cluster(
        &self,
        server: &FileServer,
        host: std::net::IpAddr,
        port: u16,
        tls: &TlsMode,
    ) -> Result<Option<ClusterConfig>, ConfigError> {
        let store = self.store.clone().or_else(|| server.store.clone());
        let url = match store.as_deref().map(str::trim) {
            None | Some("sqlite") | Some("") => {
                if self.advertise_url.is_some() || server.advertise_url.is_some() {
                    return Err(ConfigError::new(
                        "advertise_url needs a PostgreSQL store (--store postgres://...)",
                    ));
                }
                return Ok(None);
            }
            Some(url)
                if url.starts_with("postgres://")
                    || url.starts_with("postgresql://")
                    || url.contains("host=")
                    || url.contains("dbname=") =>
            {
                url.to_owned()
            }
            Some(_) => {
                return Err(ConfigError::new(
                    "store must be `sqlite` or a PostgreSQL connection string \
                     (postgres://... or host=... dbname=...)",
                ));
            }
        };
        let node_name = self
            .node_id
            .clone()
            .or_else(|| server.node_id.clone())
            .unwrap_or_else(|| "node".to_owned());
        if node_name.is_empty()
            || node_name.len() > 64
            || !node_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ConfigError::new(
                "node_id must be 1 to 64 ASCII letters, digits, `-`, `_` or `.`",
            ));
        }
        let advertise = match self
            .advertise_url
            .clone()
            .or_else(|| server.advertise_url.clone())
        {
            Some(url) => {
                let parsed: http::Uri = url
                    .parse()
                    .map_err(|_| ConfigError::new(format!("advertise_url {url:?} is not a URL")))?;
                if !matches!(parsed.scheme_str(), Some("http" | "https"))
                    || parsed.host().is_none()
                    || parsed.path().len() > 1
                {
                    return Err(ConfigError::new(
                        "advertise_url must be http(s)://HOST[:PORT], with no path",
                    ));
                }
                url.trim_end_matches('/').to_owned()
            }
            None if host.is_unspecified() => {
                return Err(ConfigError::new(
                    "a cluster node listening on a wildcard address needs --advertise-url \
                     (how the other nodes reach it)",
                ));
            }
            None => {
                let scheme = if matches!(tls, TlsMode::Off) {
                    "http"
                } else {
                    "https"
                };
                format!("{scheme}://{}", std::net::SocketAddr::new(host, port))
            }
        };
        let lease_ttl = match self.lease_ttl.as_deref().or(server.lease_ttl.as_deref()) {
            Some(text) => {
                parse_duration(text).map_err(|e| ConfigError::new(format!("lease_ttl: {e}")))?
            }
            None => std::time::Duration::from_secs(10),
        };
        if lease_ttl < std::time::Duration::from_secs(1)
            || lease_ttl > std::time::Duration::from_secs(600)
        {
            return Err(ConfigError::new("lease_ttl must be between 1s and 10m"));
        }
        Ok(Some(ClusterConfig {
            url,
            node_name,
            advertise,
            lease_ttl,
            cert: None,
        }))
    }

    fn resolve_access(
        &self,
        file: &FileAuth,
        max_concurrent_runs: usize,
    ) -> Result<AccessConfig, ConfigError> {
        use crate::access::jwt::{KeyConfig, KeySource, Verifier, parse_algorithm};
        let mut keys = Vec::new();
        for (i, key) in file.keys.iter().enumerate() {
            let at = |e: String| ConfigError::new(format!("auth.keys[{i}]: {e}"));
            let alg = key
                .alg
                .as_deref()
                .map(parse_algorithm)
                .transpose()
                .map_err(at)?;
            let source = match (&key.secret_file, &key.public_key_file, &key.jwks_file) {
                (Some(p), None, None) => KeySource::Secret(p.clone()),
                (None, Some(p), None) => KeySource::PublicKey(p.clone()),
                (None, None, Some(p)) => KeySource::Jwks(p.clone()),
                _ => {
                    return Err(at(
                        "give exactly one of secret_file, public_key_file, jwks_file".into(),
                    ));
                }
            };
            if alg.is_none() && !matches!(source, KeySource::Jwks(_)) {
                return Err(at(
                    "`alg` is required (each key's algorithm is pinned)".into()
                ));
            }
            keys.push(KeyConfig {
                kid: key.kid.clone(),
                alg,
                source,
            });
        }
        for path in &self.jwt_secret_file {
            keys.push(KeyConfig {
                kid: None,
                alg: Some(jsonwebtoken::Algorithm::HS256),
                source: KeySource::Secret(path.clone()),
            });
        }
        for path in &self.jwt_jwks_file {
            keys.push(KeyConfig {
                kid: None,
                alg: None,
                source: KeySource::Jwks(path.clone()),
            });
        }
        let leeway = match &file.leeway {
            Some(text) => {
                parse_duration(text).map_err(|e| ConfigError::new(format!("auth.leeway: {e}")))?
            }
            None => std::time::Duration::from_secs(30),
        };
        if leeway > std::time::Duration::from_secs(3600) {
            return Err(ConfigError::new("auth.leeway must be at most 1h"));
        }
        let audience = self.jwt_audience.clone().or_else(|| file.audience.clone());
        // Every key file is read once here, so a bad one is a startup error.
        Verifier::load(&keys, audience.clone(), file.issuer.clone(), leeway)
            .map_err(|e| ConfigError::new(format!("auth key: {e}")))?;
        let trusted_principal_header = match self
            .trusted_principal_header
            .as_ref()
            .or(file.trusted_principal_header.as_ref())
        {
            Some(name) => Some(
                http::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                    ConfigError::new(format!(
                        "trusted_principal_header: {name:?} is not a header name"
                    ))
                })?,
            ),
            None => None,
        };
        let max_runs_per_principal = self
            .max_runs_per_principal
            .or(file.max_runs_per_principal)
            .unwrap_or(crate::config::DEFAULT_MAX_RUNS_PER_PRINCIPAL.min(max_concurrent_runs));
        if max_runs_per_principal == 0 {
            return Err(ConfigError::new(
                "max_runs_per_principal must be at least 1",
            ));
        }
        let defaults = crate::runtime::FleetLimits::default();
        let fleet_streams = crate::runtime::FleetLimits {
            total: self
                .max_fleet_streams
                .or(file.max_fleet_streams)
                .unwrap_or(defaults.total),
            per_principal: self
                .max_fleet_streams_per_principal
                .or(file.max_fleet_streams_per_principal)
                .unwrap_or(defaults.per_principal),
        };
        if fleet_streams.total == 0 || fleet_streams.per_principal == 0 {
            return Err(ConfigError::new(
                "max_fleet_streams and max_fleet_streams_per_principal must be at least 1",
            ));
        }
        Ok(AccessConfig {
            keys,
            audience,
            issuer: file.issuer.clone(),
            leeway,
            trusted_principal_header,
            max_runs_per_principal,
            fleet_streams,
        })
    }

    fn resolve_token(
        &self,
        server: &FileServer,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(BearerToken, TokenSource), ConfigError> {
        if let Some(token) = &self.token {
            let token = BearerToken::new(token.clone())
                .map_err(|e| ConfigError::new(format!("--token: {e}")))?;
            return Ok((token, TokenSource::Flag));
        }
        if let Some(path) = self.token_file.as_ref().or(server.token_file.as_ref()) {
            return Ok((read_token_file(path)?, TokenSource::File));
        }
        if let Some(value) = env("AGUI_TOKEN") {
            let token = BearerToken::new(value.trim_end_matches(['\n', '\r']))
                .map_err(|e| ConfigError::new(format!("AGUI_TOKEN: {e}")))?;
            return Ok((token, TokenSource::Environment));
        }
        Ok((BearerToken::generate(), TokenSource::Generated))
    }
}

fn resolve_ui(file: &FileUi) -> Result<crate::config::UiConfig, ConfigError> {
    let mut ui = crate::config::UiConfig::default();
    if let Some(text) = &file.max_props {
        ui.max_props =
            parse_size(text).map_err(|e| ConfigError::new(format!("ui.max_props: {e}")))?;
    }
    if let Some(components) = &file.components {
        let defaults = crate::runtime::ui::default_components();
        let mut chosen = Vec::new();
        for (i, component) in components.iter().enumerate() {
            let schema = match &component.schema_file {
                Some(path) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        ConfigError::new(format!("ui.components[{i}]: cannot read {}: {e}", path.display()))
                    })?;
                    serde_json::from_str(&text).map_err(|e| {
                        ConfigError::new(format!("ui.components[{i}]: {} is not JSON: {e}", path.display()))
                    })?
                }
                None => defaults
                    .iter()
                    .find(|(name, _)| *name == component.name)
                    .map(|(_, schema)| schema.clone())
                    .ok_or_else(|| {
                        ConfigError::new(format!(
                            "ui.components[{i}]: {:?} is not a default component; give its schema_file",
                            component.name
                        ))
                    })?,
            };
            chosen.push((component.name.clone(), schema));
        }
        ui.components = chosen;
    }
    // Every schema compiles now, so a bad one is a startup error.
    crate::runtime::ui::UiCatalog::new(ui.components.clone(), ui.max_props)
        .map_err(ConfigError::new)?;
    Ok(ui)
}

fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(format!("cannot read config file {}: {e}", path.display()))
    })?;
    let fail = |key: Option<String>, error: &toml::de::Error| {
        ConfigError::new(format!(
            "config file {}: {}",
            path.display(),
            located(&text, key, error)
        ))
    };
    let document = toml::Deserializer::parse(&text).map_err(|e| fail(None, &e))?;
    serde_path_to_error::deserialize(document).map_err(|e| {
        let key = e.path().to_string();
        fail((key != ".").then_some(key), e.inner())
    })
}

/// A TOML error with the key it is about and its line: ``server.port` (line 3): expected
/// u16, found string "x"`.
fn located(text: &str, key: Option<String>, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    // serde names a missing key in its message, not in the path.
    let named = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    let key = match (key, named) {
        (Some(key), Some(name)) => Some(format!("{key}.{name}")),
        (None, Some(name)) => Some(name.to_owned()),
        (key, None) => key,
    };
    let message = match message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    {
        Some((found, expected)) => format!("expected {expected}, found {found}"),
        None => message.to_owned(),
    };
    let line = error
        .span()
        .and_then(|span| text.get(..span.start))
        .map(|before| before.matches('\n').count() + 1);
    match (key, line) {
        (Some(key), Some(line)) => format!("`{key}` (line {line}): {message}"),
        (Some(key), None) => format!("`{key}`: {message}"),
        (None, Some(line)) => format!("line {line}: {message}"),
        (None, None) => message,
    }
}

fn read_token_file(path: &Path) -> Result<BearerToken, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read token file {}: {e}", path.display())))?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    BearerToken::new(value)
        .map_err(|e| ConfigError::new(format!("token file {}: {e}", path.display())))
}

fn agent_from_file(agent: FileAgent, data_dir: &Path) -> Result<AgentConfig, ConfigError> {
    if !valid_agent_name(&agent.name) {
        return Err(ConfigError::new(format!(
            "invalid agent name {:?}: use letters, digits, '-', '_' or '.', and none of the route words {}",
            agent.name,
            RESERVED_AGENT_NAMES[..RESERVED_AGENT_NAMES.len() - 2].join(", ")
        )));
    }
    let hitl = agent.hitl.unwrap_or(Hitl::Tool);
    let kind = match agent.kind.as_str() {
        "demo" => {
            if !agent.command.is_empty() || agent.pool_size.is_some() || agent.idle_ttl.is_some() {
                return Err(ConfigError::new(format!(
                    "agent {:?}: kind \"demo\" takes no command, pool_size or idle_ttl",
                    agent.name
                )));
            }
            AgentKind::Demo
        }
        "acp" => {
            if agent.command.is_empty() {
                return Err(ConfigError::new(format!(
                    "agent {:?}: kind \"acp\" needs a command",
                    agent.name
                )));
            }
            let idle_ttl = match &agent.idle_ttl {
                Some(text) => parse_duration(text).map_err(|e| {
                    ConfigError::new(format!("agent {:?}: idle_ttl: {e}", agent.name))
                })?,
                None => std::time::Duration::from_secs(600),
            };
            let pool_size = agent.pool_size.unwrap_or(1);
            if pool_size == 0 {
                return Err(ConfigError::new(format!(
                    "agent {:?}: pool_size must be at least 1",
                    agent.name
                )));
            }
            let session_ttl = match &agent.session_ttl {
                Some(text) => parse_duration(text).map_err(|e| {
                    ConfigError::new(format!("agent {:?}: session_ttl: {e}", agent.name))
                })?,
                None => std::time::Duration::from_secs(600),
            };
            let workspace = match (&agent.cwd, agent.workspace) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::new(format!(
                        "agent {:?}: give `cwd` (one directory every thread shares) or `[agents.workspace]`, not both",
                        agent.name
                    )));
                }
                (Some(_), None) => None,
                (None, workspace) => Some(workspace_config(
                    &agent.name,
                    workspace.unwrap_or_default(),
                    data_dir,
                )?),
            };
            AgentKind::Acp(AcpConfig {
                command: agent.command,
                cwd: agent.cwd,
                env: agent.env,
                pool_size,
                idle_ttl,
                permissions: agent.permissions.unwrap_or(Permissions::Ask),
                frontend_mcp: agent.mcp_frontend_tools.unwrap_or(FrontendMcp::Auto),
                workspace,
                confinement: agent.confinement,
                sandbox: agent.sandbox.unwrap_or_default(),
                session_ttl,
            })
        }
        other => {
            return Err(ConfigError::new(format!(
                "agent {:?}: unknown kind {other:?} (expected \"demo\" or \"acp\")",
                agent.name
            )));
        }
    };
    Ok(AgentConfig {
        description: agent.description.unwrap_or_else(|| match kind {
            AgentKind::Demo => AgentConfig::demo().description,
            AgentKind::Acp(_) => format!("ACP agent {}", agent.name),
        }),
        name: agent.name,
        hitl,
        kind,
    })
}

/// A confined agent may not be allowed the daemon's own ports.
fn check_agent_ports(
    agents: &[AgentConfig],
    port: u16,
    metrics: Option<u16>,
) -> Result<(), ConfigError> {
    let own: Vec<u16> = std::iter::once(port)
        .chain(metrics)
        .filter(|p| *p != 0)
        .collect();
    for agent in agents {
        if let AgentKind::Acp(acp) = &agent.kind
            && let Some(p) = acp
                .sandbox
                .connect
                .iter()
                .chain(&acp.sandbox.bind)
                .find(|p| own.contains(p))
        {
            return Err(ConfigError::new(format!(
                "agent {:?}: sandbox port {p} is one of the daemon's own: a confined agent may not reach it",
                agent.name
            )));
        }
    }
    Ok(())
}

/// An agent's workspaces: by default an empty directory per thread under
/// `<data dir>/workspaces`.
fn workspace_config(
    agent: &str,
    file: FileWorkspace,
    data_dir: &Path,
) -> Result<crate::workspace::WorkspaceConfig, ConfigError> {
    use crate::workspace::{Source, Unit, WorkspaceConfig};
    let at =
        |key: &str, e: String| ConfigError::new(format!("agent {agent:?}: workspace.{key}: {e}"));
    let source = match &file.source {
        Some(text) => Source::parse(text).map_err(|e| at("source", e))?,
        None => Source::Empty,
    };
    let quota = match &file.quota {
        Some(text) => Some(parse_size(text).map_err(|e| at("quota", e.to_string()))? as u64),
        None => None,
    };
    let root = match file.root {
        Some(root) if root.is_relative() => {
            return Err(at("root", "must be an absolute path".to_owned()));
        }
        Some(root) => root,
        None => data_dir.join("workspaces"),
    };
    Ok(WorkspaceConfig {
        source,
        root,
        quota,
        unit: file.unit.unwrap_or(Unit::Thread),
    })
}

fn agent_from_flag(spec: &str, data_dir: &Path) -> Result<AgentConfig, ConfigError> {
    let (name, command) = spec
        .split_once('=')
        .ok_or_else(|| ConfigError::new(format!("--acp {spec:?}: expected NAME=COMMAND")))?;
    let words = shlex::split(command)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| ConfigError::new(format!("--acp {name}: cannot split the command")))?;
    agent_from_file(
        FileAgent {
            name: name.to_owned(),
            kind: "acp".to_owned(),
            command: words,
            cwd: None,
            env: BTreeMap::new(),
            description: None,
            pool_size: None,
            idle_ttl: None,
            permissions: None,
            hitl: None,
            mcp_frontend_tools: None,
            workspace: None,
            confinement: None,
            sandbox: None,
            session_ttl: None,
        },
        data_dir,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("agui-serve").chain(args.iter().copied()))
            .expect("parses")
    }

    #[test]
    fn defaults_match_the_contract() {
        let resolved = parse(&[]).args.resolve(&no_env).expect("valid");
        let config = resolved.config;
        assert_eq!(config.socket_addr().to_string(), "127.0.0.1:8443");
        assert_eq!(config.path, "/agui");
        assert_eq!(config.tls, TlsMode::SelfSigned);
        assert_eq!(config.max_concurrent_runs, 64);
        assert_eq!(resolved.token_source, TokenSource::Generated);
        assert_eq!(config.agents.len(), 1);
        assert_eq!(config.agents[0].name, "demo");
    }

    #[test]
    fn help_shows_the_defaults_that_apply() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        // A flag's entry: its line, and the help under it when clap puts it there.
        let line = |flag: &str| {
            let lines: Vec<&str> = help.lines().collect();
            let start = lines
                .iter()
                .position(|l| l.split_whitespace().next() == Some(flag))
                .unwrap_or_else(|| panic!("{flag} in {help}"));
            let end = lines[start + 1..]
                .iter()
                .position(|l| l.trim_start().starts_with('-') || l.trim().is_empty())
                .map_or(lines.len(), |n| start + 1 + n);
            lines[start..end].join(" ")
        };
        let config = parse(&[]).args.resolve(&no_env).expect("valid").config;
        let duration = crate::config::format_duration;
        for (flag, default) in [
            ("--host", config.host.to_string()),
            ("--port", config.port.to_string()),
            ("--path", config.path.clone()),
            (
                "--max-concurrent-runs",
                config.max_concurrent_runs.to_string(),
            ),
            ("--disconnect-grace", duration(config.disconnect_grace)),
            ("--shutdown-grace", duration(config.shutdown_grace)),
            ("--keep-alive", duration(config.keep_alive)),
            ("--suspend-timeout", duration(config.suspend_timeout)),
            ("--log-format", "text".to_owned()),
        ] {
            let line = line(flag);
            assert!(line.contains(&format!("[default: {default}]")), "{line}");
        }
        for flag in [
            "--config",
            "--token",
            "--data-dir",
            "--no-tls",
            "--acp",
            "--allowed-origin",
        ] {
            let line = line(flag);
            assert!(line.contains("[default:"), "{line}");
        }
    }

    #[test]
    fn token_precedence() {
        let dir = std::env::temp_dir().join(format!("agui-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("t");
        std::fs::write(&file, "from-file-0123456789\n").expect("write");
        let env = |k: &str| (k == "AGUI_TOKEN").then(|| "from-env-0123456789".to_owned());
        let file_arg = file.to_str().expect("utf8");

        let r = parse(&["--token", "from-flag-0123456789", "--token-file", file_arg])
            .args
            .resolve(&env)
            .expect("valid");
        assert_eq!(r.token_source, TokenSource::Flag);
        let r = parse(&["--token-file", file_arg])
            .args
            .resolve(&env)
            .expect("valid");
        assert_eq!(r.token_source, TokenSource::File);
        match r.config.auth {
            Auth::Token(t) => assert_eq!(t.expose(), "from-file-0123456789"),
            Auth::Misconfigured => panic!("token expected"),
        }
        let r = parse(&[]).args.resolve(&env).expect("valid");
        assert_eq!(r.token_source, TokenSource::Environment);
    }

    #[test]
    fn empty_token_sources_are_errors_not_fall_through() {
        let dir = std::env::temp_dir().join(format!("agui-cli-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("empty");
        std::fs::write(&file, "\n").expect("write");
        let env_empty = |k: &str| (k == "AGUI_TOKEN").then(String::new);
        assert!(parse(&["--token", ""]).args.resolve(&no_env).is_err());
        assert!(
            parse(&["--token-file", file.to_str().expect("utf8")])
                .args
                .resolve(&no_env)
                .is_err()
        );
        assert!(parse(&[]).args.resolve(&env_empty).is_err());
    }

    #[test]
    fn tls_flags_must_pair() {
        assert!(parse(&["--tls-cert", "c"]).args.resolve(&no_env).is_err());
        assert!(
            parse(&["--no-tls", "--tls-cert", "c", "--tls-key", "k"])
                .args
                .resolve(&no_env)
                .is_err()
        );
    }

    #[test]
    fn config_file_unknown_keys_are_errors() {
        let dir = std::env::temp_dir().join(format!("agui-cli-toml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.toml");
        std::fs::write(&file, "[server]\nprot = 1\n").expect("write");
        let err = parse(&["--config", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
            .expect_err("unknown key");
        assert!(err.to_string().contains("prot"), "{err}");
    }

    #[test]
    fn config_file_errors_name_the_key_and_its_line() {
        let dir = std::env::temp_dir().join(format!("agui-cli-types-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.toml");
        for (text, says) in [
            (
                "[server]\nhost = \"127.0.0.1\"\nport = \"eighty\"\n",
                "`server.port` (line 3): expected u16, found string \"eighty\"",
            ),
            (
                "[server]\nport = 1\n\n[[agents]]\nname = \"a\"\nkind = \"acp\"\npool_size = -1\n",
                "`agents[0].pool_size` (line 7):",
            ),
            (
                "[server]\nprot = 1\n",
                "`server.prot` (line 2): unknown field `prot`",
            ),
            ("[[agents]]\nkind = \"demo\"\n", "`agents[0].name`"),
            ("[server\nport = 1\n", "line 1:"),
        ] {
            std::fs::write(&file, text).expect("write");
            let err = parse(&["--config", file.to_str().expect("utf8")])
                .args
                .resolve(&no_env)
                .expect_err("invalid");
            assert!(err.to_string().contains(says), "{text}: {err}");
            assert!(!err.to_string().contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn agents_take_workspaces_by_default_and_never_the_daemons_ports() {
        let dir = std::env::temp_dir().join(format!("agui-cli-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let resolve = |text: &str| {
            let file = dir.join("c.toml");
            std::fs::write(&file, text).expect("write");
            parse(&[
                "--config",
                file.to_str().expect("utf8"),
                "--data-dir",
                "/var/lib/a",
            ])
            .args
            .resolve(&no_env)
        };
        let agent = "[[agents]]\nname = \"a\"\nkind = \"acp\"\ncommand = [\"x\"]\n";
        let config = resolve(agent).expect("valid").config;
        let AgentKind::Acp(acp) = &config.agents[0].kind else {
            panic!("an ACP agent");
        };
        let workspace = acp.workspace.as_ref().expect("a workspace by default");
        assert_eq!(workspace.root, Path::new("/var/lib/a/workspaces"));
        assert_eq!(acp.sandbox.connect, [443]);
        let own = format!("[server]\nport = 8443\n\n{agent}sandbox = {{ connect = [8443] }}\n");
        let err = resolve(&own).expect_err("the daemon's port");
        assert!(err.to_string().contains("port 8443"), "{err}");
        let both = format!("{agent}cwd = \"/srv\"\n[agents.workspace]\nsource = \"empty\"\n");
        let err = resolve(&both).expect_err("cwd and a workspace");
        assert!(err.to_string().contains("not both"), "{err}");
        let relative = format!("{agent}[agents.workspace]\nroot = \"rel\"\n");
        assert!(resolve(&relative).is_err());
    }

    #[test]
    fn config_file_and_flags_merge() {
        let dir = std::env::temp_dir().join(format!("agui-cli-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            r#"
[server]
port = 9000
path = "/x/"
disconnect_grace = "5s"
allowed_origins = ["https://a.example"]

[[agents]]
name = "echo"
kind = "demo"
hitl = "interrupt"

[[agents]]
name = "claude"
kind = "acp"
command = ["npx", "-y", "pkg"]
env = { KEY = "secret" }
pool_size = 2
idle_ttl = "10m"
permissions = "allow"
"#,
        )
        .expect("write");
        let r = parse(&["--config", file.to_str().expect("utf8"), "--port", "9001"])
            .args
            .resolve(&no_env)
            .expect("valid");
        let c = r.config;
        assert_eq!(c.port, 9001);
        assert_eq!(c.path, "/x");
        assert_eq!(c.disconnect_grace.as_secs(), 5);
        assert_eq!(c.agents.len(), 2);
        assert_eq!(c.agents[0].hitl, Hitl::Interrupt);
        assert!(!format!("{c:?}").contains("secret"));
        assert!(!c.redacted_json().to_string().contains("secret"));
    }

    #[test]
    fn acp_flag_splits_shell_words() {
        let r = parse(&["--acp", "claude=npx -y '@scope/pkg' --flag"])
            .args
            .resolve(&no_env)
            .expect("valid");
        match &r.config.agents[0].kind {
            AgentKind::Acp(acp) => assert_eq!(acp.command, ["npx", "-y", "@scope/pkg", "--flag"]),
            AgentKind::Demo => panic!("acp expected"),
        }
        assert!(parse(&["--acp", "noequals"]).args.resolve(&no_env).is_err());
    }
}
