//! Typed, validated configuration: parse (TOML file, flags, environment) -> validate -> typed.
//!
//! Nothing downstream of this module sees clap or TOML types. The bearer token lives in a
//! [`BearerToken`] whose `Debug` is redacted, so a `{config:?}` can never leak it.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

pub use crate::access::BearerToken;
pub use crate::agent::Hitl;
pub use crate::agent::acp::{AcpConfig, FrontendMcp, Permissions, Warm};
pub use crate::http::Auth;
pub use crate::logging::LogFormat;
pub use crate::runtime::DEFAULT_MAX_RUNS_PER_PRINCIPAL;
pub use crate::traces::OtlpEndpoint;
pub use crate::webhooks::EndpointConfig as WebhookConfig;

/// Everything the daemon needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    /// Route namespace, normalized: starts with `/`, no trailing `/` (`""` for the root).
    pub path: String,
    pub auth: Auth,
    pub allowed_origins: Vec<String>,
    pub tls: TlsMode,
    pub data_dir: PathBuf,
    pub max_concurrent_runs: usize,
    pub disconnect_grace: Duration,
    pub shutdown_grace: Duration,
    pub keep_alive: Duration,
    pub suspend_timeout: Duration,
    /// A stream whose client takes nothing for this long is cut (it can reattach).
    pub stall_timeout: Duration,
    /// Fleet document changes kept for replay (`GET {path}/fleet/stream`).
    pub fleet_history: usize,
    /// Bytes of finished runs' frames and threads' transcripts and state kept in memory.
    pub memory_budget: usize,
    /// Connections the public listener serves at once.
    pub max_connections: usize,
    /// Where to serve `GET /metrics` without a token (plain HTTP), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where spans are exported (OTLP/HTTP), if anywhere; off by default.
    pub otlp_endpoint: Option<OtlpEndpoint>,
    pub log_format: LogFormat,
    pub agents: Vec<AgentConfig>,
    /// Scoped tokens, the trusted principal header and the per-principal run cap.
    pub access: AccessConfig,
    /// The components agents may show (generative UI).
    pub ui: UiConfig,
    /// A PostgreSQL store shared with other nodes (`None`: the embedded SQLite store).
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// Files the configuration was read from that hold or lead to secrets (the config
    /// file, the token file, key files): no agent may read them.
    pub private_files: Vec<PathBuf>,
    /// The executable that confines and starts agents (`None`: this one). Set when the
    /// library runs in another program.
    pub launcher: Option<PathBuf>,
    /// What `POST {path}/uploads` accepts (`[uploads]`).
    pub uploads: crate::uploads::UploadLimits,
    /// What runs, threads and principals may spend (`[budgets]`).
    pub budgets: crate::budget::Budgets,
    /// The endpoints webhook events are POSTed to (`[[webhooks]]`).
    pub webhooks: Vec<WebhookConfig>,
}

/// The generative-UI catalog: component names with their props' JSON Schemas.
#[derive(Debug, Clone)]
pub struct UiConfig {
    pub components: Vec<(String, serde_json::Value)>,
    /// Largest props of one component (bytes of compact JSON).
    pub max_props: usize,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig {
            components: crate::runtime::ui::default_components(),
            max_props: crate::runtime::ui::DEFAULT_MAX_PROPS,
        }
    }
}

/// Who besides the operator may call, and how much each may run.
#[derive(Debug, Clone)]
pub struct AccessConfig {
    /// Keys that verify scoped tokens (the daemon's own signing key is always added).
    pub keys: Vec<crate::access::jwt::KeyConfig>,
    /// When set, a scoped token must carry this `aud`; minted tokens carry it.
    pub audience: Option<String>,
    /// When set, a scoped token must carry this `iss`.
    pub issuer: Option<String>,
    /// Clock-skew leeway for `exp` and `nbf`.
    pub leeway: Duration,
    /// With the master token, this request header names the principal to act for.
    pub trusted_principal_header: Option<http::HeaderName>,
    /// Concurrent runs one principal may hold (the operator is not capped).
    pub max_runs_per_principal: usize,
    /// Fleet streams open at once, in all and per principal.
    pub fleet_streams: crate::runtime::FleetLimits,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            keys: Vec::new(),
            audience: None,
            issuer: None,
            leeway: Duration::from_secs(30),
            trusted_principal_header: None,
            max_runs_per_principal: DEFAULT_MAX_RUNS_PER_PRINCIPAL,
            fleet_streams: crate::runtime::FleetLimits::default(),
        }
    }
}

/// Where the token came from; only a generated token is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    Flag,
    File,
    Environment,
    Generated,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain HTTP (for loopback behind a TLS-terminating proxy).
    Off,
    /// A self-signed certificate generated into the data directory on first start.
    SelfSigned,
    /// The operator's own PEM certificate chain and key.
    Files { cert: PathBuf, key: PathBuf },
}

/// One configured agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: String,
    pub description: String,
    pub hitl: Hitl,
    /// What new input does while a run is live (`multitask`; a request may choose its own).
    pub multitask: crate::agent::Multitask,
    /// Whose history its runs follow when a request does not say (`history`).
    pub history: crate::agent::History,
    /// Its per-run budget, over `[budgets]`'s.
    pub budget: Option<crate::budget::Limits>,
    pub kind: AgentKind,
}

// A configuration value, made once per agent at start: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AgentKind {
    /// The built-in deterministic agent.
    Demo,
    /// An Agent Client Protocol agent started as a child process.
    Acp(AcpConfig),
}

/// A configuration problem: exit code 2 with a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError(message.into())
    }
}

/// Parses a duration with humantime: `500ms`, `30s`, `10m`, `1h`, sums like `1h30m`, or
/// `0`.
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        ConfigError::new(format!(
            "invalid duration {text:?} ({e}): expected e.g. 500ms, 30s, 10m, 1h"
        ))
    })
}

/// Parses a byte size: `268435456`, `512KiB`, `256MiB`, `2GiB` (`K`, `M`, `G` are the same
/// binary units; `KB`, `MB`, `GB` are decimal).
pub fn parse_size(text: &str) -> Result<usize, ConfigError> {
    let bad = || {
        ConfigError::new(format!(
            "invalid size {text:?}: expected bytes or e.g. 512KiB, 256MiB, 2GiB"
        ))
    };
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return Err(bad());
    }
    let value: usize = text[..digits].parse().map_err(|_| bad())?;
    let unit: usize = match text[digits..].trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(bad()),
    };
    value.checked_mul(unit).ok_or_else(bad)
}

/// Formats a byte size the way [`parse_size`] reads it.
pub fn format_size(bytes: usize) -> String {
    for (unit, name) in [(1usize << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Formats a duration the way [`parse_duration`] reads it (`30s`, `1h 30m`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0".to_owned();
    }
    humantime::format_duration(d).to_string()
}

/// Normalizes a route namespace: `/agui/` -> `/agui`, `agui` -> `/agui`, `/` -> ``.
pub fn normalize_path(path: &str) -> Result<String, ConfigError> {
    let trimmed = path.trim().trim_end_matches('/');
    if trimmed.contains(['?', '#', ' ']) {
        return Err(ConfigError::new(format!("invalid path {path:?}")));
    }
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    if trimmed.starts_with('/') {
        Ok(trimmed.to_owned())
    } else {
        Ok(format!("/{trimmed}"))
    }
}

/// The default data directory: `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/agui-serve`, else
/// `~/.local/state/agui-serve`.
pub fn default_data_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = env("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may pass several colon-separated directories; the first is ours.
        let first = dir.split(':').next().unwrap_or(&dir).to_owned();
        return PathBuf::from(first);
    }
    if let Some(xdg) = env("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Path::new(&xdg).join("agui-serve");
    }
    let home = env("HOME").unwrap_or_else(|| ".".to_owned());
    Path::new(&home).join(".local/state/agui-serve")
}

impl Config {
    /// A configuration for tests and embedders: loopback, port 0, no TLS, the demo agent,
    /// the given token, short graces.
    pub fn for_tests(token: &str, data_dir: PathBuf) -> Config {
        Config {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            path: "/agui".to_owned(),
            auth: match BearerToken::new(token) {
                Ok(token) => Auth::Token(token),
                Err(_) => Auth::Misconfigured,
            },
            allowed_origins: Vec::new(),
            tls: TlsMode::Off,
            data_dir,
            max_concurrent_runs: 64,
            disconnect_grace: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            keep_alive: Duration::from_secs(15),
            suspend_timeout: Duration::from_secs(15 * 60),
            stall_timeout: Duration::from_secs(30),
            fleet_history: crate::runtime::fleet::DEFAULT_FLEET_HISTORY,
            memory_budget: crate::runtime::DEFAULT_MEMORY_BUDGET,
            max_connections: crate::http::DEFAULT_MAX_CONNECTIONS,
            metrics_listen: None,
            otlp_endpoint: None,
            log_format: LogFormat::Text,
            agents: vec![AgentConfig::demo()],
            access: AccessConfig::default(),
            ui: UiConfig::default(),
            cluster: None,
            private_files: Vec::new(),
            launcher: None,
            uploads: crate::uploads::UploadLimits::default(),
            budgets: crate::budget::Budgets::default(),
            webhooks: Vec::new(),
        }
    }

    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.port)
    }

    /// Every secret file or directory the daemon holds (no agent may read them).
    pub fn secret_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.data_dir.clone()];
        paths.extend(self.private_files.iter().cloned());
        if let TlsMode::Files { cert, key } = &self.tls {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    /// The resolved configuration as JSON with secrets redacted (`check-config`).
    pub fn redacted_json(&self) -> serde_json::Value {
        json!({
            "server": self.server_json(),
            "agents": self.agents.iter().map(AgentConfig::redacted_json).collect::<Vec<_>>(),
            "auth": self.access.redacted_json(),
            "ui": {
                "components": self.ui.components.iter().map(|(name, _)| name).collect::<Vec<_>>(),
                "max_props": format_size(self.ui.max_props),
            },
            "budgets": {
                "run": self.budgets.run,
                "thread": self.budgets.thread,
                "principal": self.budgets.principal,
                "hard": self.budgets.hard,
            },
            "webhooks": self.webhooks.iter().map(WebhookConfig::redacted_json).collect::<Vec<_>>(),
        })
    }

    /// The `server` part of [`Config::redacted_json`]: no token, no connection string.
    fn server_json(&self) -> serde_json::Value {
        let tls = match &self.tls {
            TlsMode::Off => json!("off"),
            TlsMode::SelfSigned => json!("self-signed"),
            TlsMode::Files { cert, key } => json!({"cert": cert, "key": key}),
        };
        json!({
            "host": self.host.to_string(),
            "port": self.port,
            "path": self.path,
            "token": match self.auth { Auth::Token(_) => "<redacted>", Auth::Misconfigured => "<missing>" },
            "allowed_origins": self.allowed_origins,
            "tls": tls,
            "data_dir": self.data_dir,
            "max_concurrent_runs": self.max_concurrent_runs,
            "disconnect_grace": format_duration(self.disconnect_grace),
            "shutdown_grace": format_duration(self.shutdown_grace),
            "keep_alive": format_duration(self.keep_alive),
            "suspend_timeout": format_duration(self.suspend_timeout),
            "stall_timeout": format_duration(self.stall_timeout),
            "fleet_history": self.fleet_history,
            "memory_budget": format_size(self.memory_budget),
            "max_connections": self.max_connections,
            "metrics_listen": self.metrics_listen.map(|a| a.to_string()),
            "otlp_endpoint": self.otlp_endpoint.as_ref().map(OtlpEndpoint::traces_url),
            "log_format": format!("{:?}", self.log_format).to_lowercase(),
            // The connection string may hold a password: only its kind is shown.
            "store": if self.cluster.is_some() { "postgres" } else { "sqlite" },
            "node_id": self.cluster.as_ref().map(|c| c.node_name.clone()),
            "advertise_url": self.cluster.as_ref().map(|c| c.advertise.clone()),
            "lease_ttl": self.cluster.as_ref().map(|c| format_duration(c.lease_ttl)),
        })
    }
}

impl AccessConfig {
    /// Key sources and settings; never key material.
    fn redacted_json(&self) -> serde_json::Value {
        use crate::access::jwt::KeySource;
        let keys: Vec<_> = self
            .keys
            .iter()
            .map(|key| {
                let (kind, path) = match &key.source {
                    KeySource::Secret(p) => ("secret_file", p),
                    KeySource::PublicKey(p) => ("public_key_file", p),
                    KeySource::Jwks(p) => ("jwks_file", p),
                };
                json!({"kid": key.kid, "alg": key.alg.map(|a| format!("{a:?}")), kind: path})
            })
            .collect();
        json!({
            "keys": keys,
            "audience": self.audience,
            "issuer": self.issuer,
            "leeway": format_duration(self.leeway),
            "trusted_principal_header": self.trusted_principal_header.as_ref().map(|h| h.as_str()),
            "max_runs_per_principal": self.max_runs_per_principal,
            "max_fleet_streams": self.fleet_streams.total,
            "max_fleet_streams_per_principal": self.fleet_streams.per_principal,
        })
    }
}

impl AgentConfig {
    /// The built-in `demo` agent.
    pub fn demo() -> AgentConfig {
        AgentConfig {
            name: "demo".to_owned(),
            description: "Built-in deterministic demo agent".to_owned(),
            hitl: Hitl::Tool,
            multitask: crate::agent::Multitask::Reject,
            history: crate::agent::History::Server,
            budget: None,
            kind: AgentKind::Demo,
        }
    }

    /// The agent as [`Config::redacted_json`] shows it: its environment's names, never
    /// their values.
    fn redacted_json(&self) -> serde_json::Value {
        let mut value = json!({
            "name": self.name,
            "description": self.description,
            "hitl": format!("{:?}", self.hitl).to_lowercase(),
        });
        match &self.kind {
            AgentKind::Demo => value["kind"] = json!("demo"),
            AgentKind::Acp(acp) => {
                value["kind"] = json!("acp");
                add_acp_json(&mut value, acp);
            }
        }
        value
    }
}

/// An ACP agent's settings, added to its JSON after `kind`.
fn add_acp_json(value: &mut serde_json::Value, acp: &AcpConfig) {
    value["command"] = json!(acp.command);
    value["cwd"] = json!(acp.cwd);
    value["env"] = acp
        .env
        .keys()
        .map(|k| (k.clone(), json!("<redacted>")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    value["pool_size"] = json!(acp.pool_size);
    value["idle_ttl"] = json!(format_duration(acp.idle_ttl));
    value["permissions"] = json!(format!("{:?}", acp.permissions).to_lowercase());
    value["mcp_frontend_tools"] = json!(format!("{:?}", acp.frontend_mcp).to_lowercase());
    value["session_ttl"] = json!(format_duration(acp.session_ttl));
    value["spares"] = json!(acp.warm.spares);
    value["spare_ttl"] = json!(format_duration(acp.warm.spare_ttl));
    value["spare_session"] = json!(acp.warm.spare_session);
    value["spare_principals"] = json!(acp.warm.spare_principals);
    value["preload_sessions"] = json!(acp.warm.preload_sessions);
    for (key, name) in [("mode", "mode"), ("configOptions", "config_options")] {
        if let Some(set) = acp.session_defaults.get(key) {
            value[name] = set.clone();
        }
    }
    value["workspace"] = acp.workspace.as_ref().map_or(json!(null), |w| {
        json!({
            "source": w.source.to_string(),
            "root": w.root,
            "quota": w.quota.map(|q| format_size(q as usize)),
            "unit": format!("{:?}", w.unit).to_lowercase(),
            "checkpoints": w.checkpoints,
        })
    });
    value["confinement"] = json!(confinement_in_force(acp.confinement));
    // Names and addresses only: a relay's key is never shown.
    value["relays"] = acp
        .relays
        .iter()
        .map(|r| {
            json!({
                "upstream": r.upstream.to_string(),
                "header": r.header.as_str(),
                "base_url_env": r.base_url_env,
                "placeholder_env": r.placeholder_env,
            })
        })
        .collect();
    value["egress"] = json!({
        "allow": acp.egress.allow.iter().map(|r| r.text()).collect::<Vec<_>>(),
        "deny": acp.egress.deny.iter().map(|r| r.text()).collect::<Vec<_>>(),
        "resolve": acp.egress.resolve.iter().map(|(k, v)| (k.clone(), json!(v.to_string()))).collect::<serde_json::Map<_, _>>(),
    });
    value["sandbox"] = json!({
        "read": acp.sandbox.read,
        "write": acp.sandbox.write,
        "connect": acp.sandbox.connect,
        "bind": acp.sandbox.bind,
        "limits": {
            "memory_mib": acp.sandbox.limits.memory_mib,
            "pids": acp.sandbox.limits.pids,
            "cpu_percent": acp.sandbox.limits.cpu_percent,
            "in_force": match crate::confine::cgroup::status() {
                Ok(version) => version.to_owned(),
                Err(why) => format!("unavailable: {why}"),
            },
        },
    });
}

/// Whether `name` can be an agent name (a single URL path segment).
pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !RESERVED_AGENT_NAMES.contains(&name)
}

/// Names an agent cannot take: the words of the daemon's own routes under `{path}` (a
/// request to `{path}/<word>` must never be ambiguous), and the path dots.
pub const RESERVED_AGENT_NAMES: &[&str] = &[
    "info",
    "healthz",
    "readyz",
    "threads",
    "runs",
    "agent",
    "agents",
    "metrics",
    "tokens",
    "fleet",
    "console",
    "uploads",
    "webhooks",
    "schedules",
    ".",
    "..",
];

/// What `check-config` shows of an agent's confinement.
fn confinement_in_force(choice: Option<crate::confine::Confinement>) -> String {
    match crate::confine::in_force(choice) {
        Ok(confinement) => confinement.as_str().to_owned(),
        Err(why) => format!("unavailable: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_endpoints_get_the_traces_path_and_refuse_what_cannot_work() {
        let url = |text: &str| OtlpEndpoint::parse(text).map(|e| e.traces_url().to_owned());
        assert_eq!(
            url("http://127.0.0.1:4318").ok().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            url("http://collector:4318/otlp/").ok().as_deref(),
            Some("http://collector:4318/otlp/v1/traces")
        );
        assert_eq!(
            url("http://collector:4318/v1/traces").ok().as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            url("https://otlp.example.com").ok().as_deref(),
            Some("https://otlp.example.com/v1/traces")
        );
        for bad in [
            "ftp://collector:4318",
            "collector:4318",
            "http://user:secret@collector:4318",
            "http://collector:4318/?a=b",
            "",
        ] {
            assert!(url(bad).is_err(), "{bad:?} is refused");
        }
        let error = url("https://u:p@c:4318").expect_err("credentials");
        assert!(error.to_string().contains("credentials"), "{error}");
    }

    #[test]
    fn sizes_parse_and_format_back() {
        assert_eq!(parse_size("268435456").ok(), Some(256 << 20));
        assert_eq!(parse_size("256MiB").ok(), Some(256 << 20));
        assert_eq!(parse_size(" 2G ").ok(), Some(2 << 30));
        assert_eq!(parse_size("512KB").ok(), Some(512_000));
        for bad in ["", "MiB", "12 parsecs", "-1M", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        for n in [1usize, 1024, 3 << 20, 256 << 20, 5 << 30, 1_000_000] {
            assert_eq!(parse_size(&format_size(n)).ok(), Some(n));
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "10", "s", "10x", "-1s", "ms10"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_format_round_trip() {
        for text in ["500ms", "30s", "10m", "1h", "1h 30m", "0"] {
            let d = parse_duration(text).expect("valid");
            assert_eq!(format_duration(d), text);
        }
    }

    #[test]
    fn token_debug_is_redacted() {
        let token = BearerToken::new("s3cret-value-0123").expect("valid");
        assert!(!format!("{token:?}").contains("s3cret"));
        assert!(!format!("{token}").contains("s3cret"));
        let mut config = Config::for_tests("s3cret-value-0123", PathBuf::from("/tmp"));
        config.agents.push(AgentConfig::demo());
        assert!(!format!("{config:?}").contains("s3cret"));
        assert!(!config.redacted_json().to_string().contains("s3cret"));
    }

    #[test]
    fn generated_tokens_differ_and_are_long() {
        let a = BearerToken::generate();
        let b = BearerToken::generate();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 64);
    }

    #[test]
    fn paths_normalize() {
        assert_eq!(normalize_path("/agui/").as_deref(), Ok("/agui"));
        assert_eq!(normalize_path("agui").as_deref(), Ok("/agui"));
        assert_eq!(normalize_path("/").as_deref(), Ok(""));
        assert!(normalize_path("/a?b").is_err());
    }

    #[test]
    fn data_dir_precedence() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            default_data_dir(&env(&[("STATE_DIRECTORY", "/var/lib/a:/var/lib/b")])),
            PathBuf::from("/var/lib/a")
        );
        assert_eq!(
            default_data_dir(&env(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/agui-serve")
        );
        assert_eq!(
            default_data_dir(&env(&[("HOME", "/h")])),
            PathBuf::from("/h/.local/state/agui-serve")
        );
    }
}
