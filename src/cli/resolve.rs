//! Flags, the config file and the environment become one validated [`Config`]: the
//! `[server]` settings here, each with its precedence (flag > file > environment > default)
//! and its check; the token, agents, access, cluster and UI in their own files.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{
    AccessConfig, Auth, Config, ConfigError, LogFormat, OtlpEndpoint, TlsMode, TokenSource,
    default_data_dir, normalize_path, parse_duration, parse_size,
};

use super::agents::{check_agent_ports, resolve_agents};
use super::file::{FileConfig, FileServer, read_file_config};
use super::flags::{LogFormatArg, ServeArgs};
use super::ui::resolve_ui;
use super::webhooks::resolve_webhooks;
use crate::uploads::UploadLimits;

/// The result of resolving a command line: the configuration and where the token came from.
#[derive(Debug)]
pub struct Resolved {
    pub config: Config,
    pub token_source: TokenSource,
}

/// The `[server]` durations.
struct Timeouts {
    disconnect_grace: Duration,
    shutdown_grace: Duration,
    keep_alive: Duration,
    suspend_timeout: Duration,
    stall_timeout: Duration,
}

/// The smallest memory budget: 1MiB.
const MIN_MEMORY_BUDGET: usize = 1 << 20;

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
        let path = self.route_path(server)?;
        let (token, token_source) = self.resolve_token(server, env)?;
        let allowed_origins = self.allowed_origins(server)?;
        let tls = self.tls(server)?;
        let data_dir = self
            .data_dir
            .clone()
            .or_else(|| server.data_dir.clone())
            .unwrap_or_else(|| default_data_dir(env));
        // Absolute from here on: the workspaces under it are agents' `cwd`, which ACP wants
        // absolute, and a relative one would move with the agent's own directory.
        let data_dir = std::path::absolute(&data_dir)
            .map_err(|e| ConfigError::new(format!("data directory {}: {e}", data_dir.display())))?;
        let max_concurrent_runs = self.max_concurrent_runs(server)?;
        let timeouts = self.timeouts(server)?;
        let memory_budget = self.memory_budget(server)?;
        let max_connections = self.max_connections(server)?;
        let otlp_endpoint = self.otlp_endpoint(server)?;
        let log_format = self.log_format(server);
        let agents = resolve_agents(file.agents, &self.acp, &data_dir)?;
        let metrics_listen = self.metrics_listen.or(server.metrics_listen);
        check_agent_ports(&agents, port, metrics_listen.map(|a| a.port()))?;
        let cluster = self.resolve_cluster(server, host, port, &tls)?;
        let access = self.resolve_access(&file.auth, max_concurrent_runs)?;
        let ui = resolve_ui(&file.ui)?;
        let webhooks = resolve_webhooks(&file.webhooks)?;
        let mut private_files = self.private_files(server, &access);
        private_files.extend(webhooks.iter().map(|w| w.secret_file.clone()));
        // The model keys the relays add: never readable by an agent, whoever's.
        for agent in &agents {
            if let crate::config::AgentKind::Acp(acp) = &agent.kind {
                private_files.extend(acp.relays.iter().map(|r| r.secret_file.clone()));
            }
        }
        let fleet_history = fleet_history(server)?;
        let uploads = resolve_uploads(&file.uploads)?;
        let budgets = resolve_budgets(&file.budgets)?;
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
                disconnect_grace: timeouts.disconnect_grace,
                shutdown_grace: timeouts.shutdown_grace,
                keep_alive: timeouts.keep_alive,
                suspend_timeout: timeouts.suspend_timeout,
                stall_timeout: timeouts.stall_timeout,
                fleet_history,
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
                uploads,
                budgets,
                webhooks,
                launcher: None,
            },
            token_source,
        })
    }

    /// The route namespace, normalized [default: /agui].
    fn route_path(&self, server: &FileServer) -> Result<String, ConfigError> {
        normalize_path(
            self.path
                .as_deref()
                .or(server.path.as_deref())
                .unwrap_or("/agui"),
        )
    }

    /// The allowed browser origins, trimmed of spaces and a trailing `/`; none may be empty.
    fn allowed_origins(&self, server: &FileServer) -> Result<Vec<String>, ConfigError> {
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
        Ok(allowed_origins)
    }

    /// Plain HTTP, a certificate and key given together, or a self-signed certificate.
    fn tls(&self, server: &FileServer) -> Result<TlsMode, ConfigError> {
        let no_tls = self.no_tls || server.no_tls.unwrap_or(false);
        let cert = self.tls_cert.clone().or_else(|| server.tls_cert.clone());
        let key = self.tls_key.clone().or_else(|| server.tls_key.clone());
        match (no_tls, cert, key) {
            (true, None, None) => Ok(TlsMode::Off),
            (true, _, _) => Err(ConfigError::new(
                "--no-tls cannot be combined with --tls-cert/--tls-key",
            )),
            (false, None, None) => Ok(TlsMode::SelfSigned),
            (false, Some(cert), Some(key)) => Ok(TlsMode::Files { cert, key }),
            (false, _, _) => Err(ConfigError::new(
                "--tls-cert and --tls-key must be given together",
            )),
        }
    }

    /// The admission cap: at least 1 [default: 64].
    fn max_concurrent_runs(&self, server: &FileServer) -> Result<usize, ConfigError> {
        let max_concurrent_runs = self
            .max_concurrent_runs
            .or(server.max_concurrent_runs)
            .unwrap_or(64);
        if max_concurrent_runs == 0 {
            return Err(ConfigError::new("max_concurrent_runs must be at least 1"));
        }
        Ok(max_concurrent_runs)
    }

    /// The durations; the keep-alive and the stall timeout must be greater than zero.
    fn timeouts(&self, server: &FileServer) -> Result<Timeouts, ConfigError> {
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
        Ok(Timeouts {
            disconnect_grace,
            shutdown_grace,
            keep_alive,
            suspend_timeout,
            stall_timeout,
        })
    }

    /// The memory budget: at least 1MiB.
    fn memory_budget(&self, server: &FileServer) -> Result<usize, ConfigError> {
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
        Ok(memory_budget)
    }

    /// The connections served at once: at least 1.
    fn max_connections(&self, server: &FileServer) -> Result<usize, ConfigError> {
        let max_connections = self
            .max_connections
            .or(server.max_connections)
            .unwrap_or(crate::http::DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(ConfigError::new("max_connections must be at least 1"));
        }
        Ok(max_connections)
    }

    /// The OTLP collector traces go to, if any; an error names the flag or the key.
    fn otlp_endpoint(&self, server: &FileServer) -> Result<Option<OtlpEndpoint>, ConfigError> {
        match (&self.otlp_endpoint, &server.otlp_endpoint) {
            (Some(flag), _) => {
                Ok(Some(OtlpEndpoint::parse(flag).map_err(|e| {
                    ConfigError::new(format!("--otlp-endpoint: {e}"))
                })?))
            }
            (None, Some(key)) => {
                Ok(Some(OtlpEndpoint::parse(key).map_err(|e| {
                    ConfigError::new(format!("server.otlp_endpoint: {e}"))
                })?))
            }
            (None, None) => Ok(None),
        }
    }

    /// The log format [default: text].
    fn log_format(&self, server: &FileServer) -> LogFormat {
        match self.log_format {
            Some(LogFormatArg::Text) => LogFormat::Text,
            Some(LogFormatArg::Json) => LogFormat::Json,
            None => server.log_format.unwrap_or(LogFormat::Text),
        }
    }

    /// The files holding secrets: the config file, the token file, key files (and the
    /// webhooks' secret files, added by the caller).
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
}

/// A duration from its flag, else its key, else its default; an error names the setting.
fn duration(
    flag: &Option<String>,
    key: &Option<String>,
    default: &str,
    name: &str,
) -> Result<Duration, ConfigError> {
    let text = flag.as_deref().or(key.as_deref()).unwrap_or(default);
    parse_duration(text).map_err(|e| ConfigError::new(format!("{name}: {e}")))
}

/// The `[budgets]` table.
fn resolve_budgets(file: &super::file::FileBudgets) -> Result<crate::budget::Budgets, ConfigError> {
    let run = super::file::FileLimits {
        tokens: file.tokens,
        wall_time: file.wall_time.clone(),
        tool_calls: file.tool_calls,
    };
    let table = |limits: &Option<super::file::FileLimits>, key: &str| match limits {
        Some(limits) => limits.resolve(&format!("budgets.{key}")),
        None => Ok(crate::budget::Limits::default()),
    };
    Ok(crate::budget::Budgets {
        run: run.resolve("budgets")?,
        thread: table(&file.thread, "thread")?,
        principal: table(&file.principal, "principal")?,
        hard: table(&file.hard, "hard")?,
    })
}

/// The `[uploads]` table over the defaults.
fn resolve_uploads(file: &super::file::FileUploads) -> Result<UploadLimits, ConfigError> {
    let mut limits = UploadLimits::default();
    let size = |key: &str, text: &str| {
        parse_size(text)
            .map(|n| n as u64)
            .map_err(|e| ConfigError::new(format!("uploads.{key}: {e}")))
    };
    if let Some(text) = &file.max_size {
        limits.max_bytes = size("max_size", text)?;
    }
    if let Some(text) = &file.quota {
        limits.quota = size("quota", text)?;
    }
    if let Some(text) = &file.unused_ttl {
        limits.unused_ttl = parse_duration(text)
            .map_err(|e| ConfigError::new(format!("uploads.unused_ttl: {e}")))?;
    }
    if let Some(text) = &file.preview_ttl {
        limits.preview_ttl = parse_duration(text)
            .ok()
            .filter(|ttl| (60..=24 * 60 * 60).contains(&ttl.as_secs()))
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "uploads.preview_ttl: {text:?} must be a duration from 1m to 24h"
                ))
            })?;
    }
    if let Some(types) = &file.types {
        for t in types {
            let (major, minor) = t.split_once('/').unwrap_or(("", ""));
            let token = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
            };
            if !token(major) || !(minor == "*" || token(minor)) {
                return Err(ConfigError::new(format!(
                    "uploads.types: {t:?} is not a content type (`type/subtype` or `type/*`)"
                )));
            }
        }
        limits.types = types.iter().map(|t| t.to_ascii_lowercase()).collect();
    }
    Ok(limits)
}

/// How many fleet document changes are kept for replay: at least 1.
fn fleet_history(server: &FileServer) -> Result<usize, ConfigError> {
    match server.fleet_history {
        Some(0) => Err(ConfigError::new("fleet_history must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(crate::runtime::fleet::DEFAULT_FLEET_HISTORY),
    }
}
