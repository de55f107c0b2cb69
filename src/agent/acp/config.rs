//! An ACP agent's configuration: how it is started, pooled, confined and asked.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::confine::{Confinement, Sandbox};
use crate::workspace::WorkspaceConfig;

#[derive(Clone)]
pub struct AcpConfig {
    pub command: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub pool_size: usize,
    pub idle_ttl: Duration,
    pub permissions: Permissions,
    /// When to serve the browser's tools to the agent as an MCP server.
    pub frontend_mcp: FrontendMcp,
    /// Each thread's own working directory (`None`: every session works in `cwd`, or the
    /// daemon's working directory).
    pub workspace: Option<WorkspaceConfig>,
    /// How the agent's processes are confined (`None`: bwrap where it works, else
    /// Landlock, where the kernel has it; without it the agent is not started).
    pub confinement: Option<Confinement>,
    /// What a confined agent may reach besides its workspace and home.
    pub sandbox: Sandbox,
    /// Model APIs reached through the daemon with the operator's key (`[[agents.relay]]`).
    pub relays: Vec<Arc<crate::egress::Relay>>,
    /// Other hosts a confined agent may reach by name, through the egress proxy
    /// (`[agents.egress]`).
    pub egress: Arc<crate::egress::Egress>,
    /// How long a thread's session stays open with no turn (then `session/close`, and the
    /// next turn loads it again).
    pub session_ttl: Duration,
    /// What a new session is set to before its first prompt: `{"mode"?: "<mode id>",
    /// "configOptions"?: {"<option id>": "<value id>" | bool}}` (null: as the agent starts
    /// it). Checked by [`check_session_defaults`].
    pub session_defaults: serde_json::Value,
    /// Warm starts: spares kept ready per principal, and the sessions loaded at start-up.
    pub warm: Warm,
}

/// An agent's warm starts (see `spares.rs` and `prepare.rs`): what is made ahead so a new
/// thread's first prompt, or the first turn after a restart, does not wait for the agent's
/// start-up. All zero (the default) costs nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warm {
    /// Spares kept ready per principal (`spares`): each a process already initialized and,
    /// with `spare_session`, a session already made in the workspace its thread will keep.
    pub spares: usize,
    /// How long a principal's spares are kept after its last turn (`spare_ttl`); then they
    /// are stopped, and made again at its next turn.
    pub spare_ttl: Duration,
    /// Whether a spare holds a session made ahead (`spare_session`, default true), or only
    /// its process.
    pub spare_session: bool,
    /// For how many principals at most spares are kept (`spare_principals`): the most
    /// recently seen ones.
    pub spare_principals: usize,
    /// At start-up, the sessions of this many of the agent's most recently active threads
    /// (active within `session_ttl`) are loaded ahead (`preload_sessions`).
    pub preload_sessions: usize,
}

impl Default for Warm {
    fn default() -> Warm {
        Warm {
            spares: 0,
            spare_ttl: Duration::from_secs(600),
            spare_session: true,
            spare_principals: 16,
            preload_sessions: 0,
        }
    }
}

/// Checks an agent's session defaults (see [`AcpConfig::session_defaults`]); the error
/// names the key.
pub fn check_session_defaults(defaults: &serde_json::Value) -> Result<(), String> {
    super::forwarded::Settings::from_defaults(defaults)
        .map(|_| ())
        .map_err(|e| {
            e.message
                .replacen("forwardedProps.acp.configOptions", "config_options", 1)
                .replacen("forwardedProps.acp.mode", "mode", 1)
        })
}

impl AcpConfig {
    /// An agent started by `command` with every other setting at its default: no
    /// workspaces (sessions in the daemon's working directory), default confinement.
    pub fn new(command: Vec<String>) -> AcpConfig {
        AcpConfig {
            command,
            cwd: None,
            env: BTreeMap::new(),
            pool_size: 1,
            idle_ttl: Duration::from_secs(600),
            permissions: Permissions::Ask,
            frontend_mcp: FrontendMcp::Auto,
            workspace: None,
            confinement: None,
            sandbox: Sandbox::default(),
            relays: Vec::new(),
            egress: Arc::default(),
            session_ttl: Duration::from_secs(600),
            session_defaults: serde_json::Value::Null,
            warm: Warm::default(),
        }
    }
}

/// When an ACP agent gets the frontend-tools MCP server (`mcp_frontend_tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontendMcp {
    /// When the agent advertises `mcpCapabilities.http`.
    Auto,
    /// Always (for agents that take HTTP MCP servers without advertising it).
    Always,
    Never,
}

impl fmt::Debug for AcpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment values are usually credentials: show only the names.
        f.debug_struct("AcpConfig")
            .field("command", &self.command)
            .field("cwd", &self.cwd)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("pool_size", &self.pool_size)
            .field("idle_ttl", &self.idle_ttl)
            .field("permissions", &self.permissions)
            .field("frontend_mcp", &self.frontend_mcp)
            .field("workspace", &self.workspace)
            .field("confinement", &self.confinement)
            .field("sandbox", &self.sandbox)
            .field("relays", &self.relays)
            .field("egress", &self.egress)
            .field("session_ttl", &self.session_ttl)
            .field("session_defaults", &self.session_defaults)
            .field("warm", &self.warm)
            .finish()
    }
}

/// How an agent's permission requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permissions {
    Ask,
    Allow,
    Deny,
}
