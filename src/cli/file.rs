//! The TOML config file as serde reads it (`deny_unknown_fields`), and its errors, which name
//! the key and its line.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{ConfigError, FrontendMcp, Hitl, LogFormat, Permissions};

/// The config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) server: FileServer,
    #[serde(default)]
    pub(super) agents: Vec<FileAgent>,
    #[serde(default)]
    pub(super) auth: FileAuth,
    #[serde(default)]
    pub(super) ui: FileUi,
    #[serde(default)]
    pub(super) uploads: FileUploads,
    #[serde(default)]
    pub(super) budgets: FileBudgets,
    #[serde(default)]
    pub(super) webhooks: Vec<FileWebhook>,
}

/// `[budgets]`: per run (its own keys), per thread, per principal per day, and the hard
/// per-run ceiling.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileBudgets {
    pub(super) tokens: Option<u64>,
    pub(super) wall_time: Option<String>,
    pub(super) tool_calls: Option<u64>,
    pub(super) thread: Option<FileLimits>,
    pub(super) principal: Option<FileLimits>,
    pub(super) hard: Option<FileLimits>,
}

/// A budget's ceilings: `{tokens, wall_time, tool_calls}` (`wall_time` a duration, `"30m"`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLimits {
    pub(super) tokens: Option<u64>,
    pub(super) wall_time: Option<String>,
    pub(super) tool_calls: Option<u64>,
}

impl FileLimits {
    /// One budget's ceilings; errors name `key`.
    pub(super) fn resolve(&self, key: &str) -> Result<crate::budget::Limits, ConfigError> {
        let wall_time = match &self.wall_time {
            Some(text) => {
                let duration = humantime::parse_duration(text)
                    .map_err(|e| ConfigError::new(format!("{key}.wall_time: {e}")))?;
                if duration.as_secs() == 0 {
                    return Err(ConfigError::new(format!(
                        "{key}.wall_time: must be at least one second"
                    )));
                }
                Some(duration.as_secs())
            }
            None => None,
        };
        for (name, value) in [("tokens", self.tokens), ("tool_calls", self.tool_calls)] {
            if value == Some(0) {
                return Err(ConfigError::new(format!(
                    "{key}.{name}: must be at least 1 (leave it out for no limit)"
                )));
            }
        }
        Ok(crate::budget::Limits {
            tokens: self.tokens,
            wall_time,
            tool_calls: self.tool_calls,
        })
    }
}

/// `[[webhooks]]`: one endpoint events are POSTed to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWebhook {
    /// Its name in metrics, logs and the outbox (default: from the URL).
    pub(super) name: Option<String>,
    pub(super) url: String,
    /// The signing secret's file.
    pub(super) secret_file: PathBuf,
    /// Event names, or `"*"` (default: all).
    pub(super) events: Option<Vec<String>>,
    /// One attempt's bound (`10s`).
    pub(super) timeout: Option<String>,
    /// The longest wait between two attempts (`5m`).
    pub(super) max_backoff: Option<String>,
}

/// `[uploads]`: what `POST {path}/uploads` accepts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUploads {
    /// Largest file (`20MiB`).
    pub(super) max_size: Option<String>,
    /// Bytes one principal may keep in all (`512MiB`).
    pub(super) quota: Option<String>,
    /// Content types accepted: `type/subtype` or `type/*`.
    pub(super) types: Option<Vec<String>>,
    /// How long an upload no run has used is kept (`24h`).
    pub(super) unused_ttl: Option<String>,
    /// How long a link showing an upload without a token lasts (`15m`).
    pub(super) preview_ttl: Option<String>,
}

/// `[ui]`: the components agents may show.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUi {
    pub(super) max_props: Option<String>,
    /// When given, exactly these (a default by name, or any with `schema_file`).
    pub(super) components: Option<Vec<FileUiComponent>>,
}

/// `[[ui.components]]`: one component.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUiComponent {
    pub(super) name: String,
    pub(super) schema_file: Option<PathBuf>,
}

/// `[auth]`: scoped tokens and principals.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAuth {
    #[serde(default)]
    pub(super) keys: Vec<FileKey>,
    pub(super) audience: Option<String>,
    pub(super) issuer: Option<String>,
    pub(super) leeway: Option<String>,
    pub(super) trusted_principal_header: Option<String>,
    pub(super) max_runs_per_principal: Option<usize>,
    pub(super) max_fleet_streams: Option<usize>,
    pub(super) max_fleet_streams_per_principal: Option<usize>,
}

/// `[[auth.keys]]`: one verification key; exactly one source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileKey {
    pub(super) kid: Option<String>,
    pub(super) alg: Option<String>,
    pub(super) secret_file: Option<PathBuf>,
    pub(super) public_key_file: Option<PathBuf>,
    pub(super) jwks_file: Option<PathBuf>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileServer {
    pub(super) host: Option<IpAddr>,
    pub(super) port: Option<u16>,
    pub(super) path: Option<String>,
    pub(super) token_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) allowed_origins: Vec<String>,
    pub(super) tls_cert: Option<PathBuf>,
    pub(super) tls_key: Option<PathBuf>,
    pub(super) no_tls: Option<bool>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) max_concurrent_runs: Option<usize>,
    pub(super) disconnect_grace: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) keep_alive: Option<String>,
    pub(super) suspend_timeout: Option<String>,
    pub(super) stall_timeout: Option<String>,
    pub(super) fleet_history: Option<usize>,
    pub(super) memory_budget: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) metrics_listen: Option<SocketAddr>,
    pub(super) otlp_endpoint: Option<String>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) store: Option<String>,
    pub(super) node_id: Option<String>,
    pub(super) advertise_url: Option<String>,
    pub(super) lease_ttl: Option<String>,
}

/// `[[agents]]`: one agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAgent {
    pub(super) name: String,
    pub(super) kind: String,
    #[serde(default)]
    pub(super) command: Vec<String>,
    pub(super) cwd: Option<PathBuf>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    pub(super) description: Option<String>,
    pub(super) pool_size: Option<usize>,
    pub(super) idle_ttl: Option<String>,
    pub(super) permissions: Option<Permissions>,
    pub(super) hitl: Option<Hitl>,
    /// What new input does while a run is live: `reject` (default), `interrupt` or
    /// `enqueue`.
    pub(super) multitask: Option<crate::agent::Multitask>,
    /// Whose history a run follows when the request does not say: `server` (default) or
    /// `client`.
    pub(super) history: Option<crate::agent::History>,
    /// The agent's per-run budget, over `[budgets]`'s.
    pub(super) budget: Option<FileLimits>,
    pub(super) mcp_frontend_tools: Option<FrontendMcp>,
    pub(super) workspace: Option<FileWorkspace>,
    pub(super) confinement: Option<crate::confine::Confinement>,
    pub(super) sandbox: Option<crate::confine::Sandbox>,
    /// Model relays: the operator's key added outside the sandbox.
    #[serde(default)]
    pub(super) relay: Vec<crate::egress::RelayConfig>,
    /// Hosts reached by name through the egress proxy.
    pub(super) egress: Option<crate::egress::EgressConfig>,
    pub(super) session_ttl: Option<String>,
    /// The mode a new session is set to (`session/set_mode`).
    pub(super) mode: Option<String>,
    /// Config options a new session is set to: option id -> value id or boolean.
    pub(super) config_options: Option<serde_json::Map<String, serde_json::Value>>,
    /// Spares kept ready per principal (warm starts).
    pub(super) spares: Option<usize>,
    pub(super) spare_ttl: Option<String>,
    pub(super) spare_session: Option<bool>,
    pub(super) spare_principals: Option<usize>,
    /// Sessions of recently active threads loaded at start-up.
    pub(super) preload_sessions: Option<usize>,
}

/// `[agents.workspace]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWorkspace {
    pub(super) source: Option<String>,
    pub(super) root: Option<PathBuf>,
    pub(super) quota: Option<String>,
    pub(super) unit: Option<crate::workspace::Unit>,
    /// How many turns' checkpoints each thread keeps (0: none).
    pub(super) checkpoints: Option<usize>,
}

/// Reads and parses the config file.
pub(super) fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
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
