//! The agents: `[[agents]]` in the file and `--acp` flags become [`AgentConfig`]s, each name
//! once, with the built-in `demo` agent when none is configured.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::config::{
    AcpConfig, AgentConfig, AgentKind, ConfigError, FrontendMcp, Hitl, Permissions,
    RESERVED_AGENT_NAMES, Warm, parse_duration, parse_size, valid_agent_name,
};
use crate::workspace::{Source, Unit, WorkspaceConfig};

use super::file::{FileAgent, FileWorkspace};

/// The file's agents, then the flags' (`NAME=COMMAND`); the demo agent when there are none.
/// A name given twice is an error.
pub(super) fn resolve_agents(
    file: Vec<FileAgent>,
    flags: &[String],
    data_dir: &Path,
) -> Result<Vec<AgentConfig>, ConfigError> {
    let mut agents = Vec::new();
    for agent in file {
        agents.push(agent_from_file(agent, data_dir)?);
    }
    for spec in flags {
        agents.push(agent_from_flag(spec, data_dir)?);
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
    Ok(agents)
}

/// A confined agent may not be allowed the daemon's own ports.
pub(super) fn check_agent_ports(
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

/// One `[[agents]]` entry.
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
        "acp" => AgentKind::Acp(acp_config(&agent, data_dir)?),
        other => {
            return Err(ConfigError::new(format!(
                "agent {:?}: unknown kind {other:?} (expected \"demo\" or \"acp\")",
                agent.name
            )));
        }
    };
    let budget = match &agent.budget {
        Some(limits) => Some(limits.resolve(&format!("agent {:?}: budget", agent.name))?),
        None => None,
    };
    Ok(AgentConfig {
        description: agent.description.unwrap_or_else(|| match kind {
            AgentKind::Demo => AgentConfig::demo().description,
            AgentKind::Acp(_) => format!("ACP agent {}", agent.name),
        }),
        name: agent.name,
        hitl,
        multitask: agent.multitask.unwrap_or_default(),
        history: agent.history.unwrap_or_default(),
        budget,
        kind,
    })
}

/// An ACP agent's settings: its command, and a default for each setting it leaves out.
fn acp_config(agent: &FileAgent, data_dir: &Path) -> Result<AcpConfig, ConfigError> {
    if agent.command.is_empty() {
        return Err(ConfigError::new(format!(
            "agent {:?}: kind \"acp\" needs a command",
            agent.name
        )));
    }
    let idle_ttl = match &agent.idle_ttl {
        Some(text) => parse_duration(text)
            .map_err(|e| ConfigError::new(format!("agent {:?}: idle_ttl: {e}", agent.name)))?,
        None => Duration::from_secs(600),
    };
    let pool_size = agent.pool_size.unwrap_or(1);
    if pool_size == 0 {
        return Err(ConfigError::new(format!(
            "agent {:?}: pool_size must be at least 1",
            agent.name
        )));
    }
    let session_ttl = match &agent.session_ttl {
        Some(text) => parse_duration(text)
            .map_err(|e| ConfigError::new(format!("agent {:?}: session_ttl: {e}", agent.name)))?,
        None => Duration::from_secs(600),
    };
    let workspace = acp_workspace(agent, data_dir)?;
    let mut session_defaults = serde_json::json!({});
    if let Some(mode) = &agent.mode {
        session_defaults["mode"] = serde_json::json!(mode);
    }
    if let Some(options) = &agent.config_options {
        session_defaults["configOptions"] = serde_json::Value::Object(options.clone());
    }
    crate::agent::acp::check_session_defaults(&session_defaults)
        .map_err(|e| ConfigError::new(format!("agent {:?}: {e}", agent.name)))?;
    let warm = warm_config(agent)?;
    let (relays, egress) = ways_out(agent)?;
    Ok(AcpConfig {
        command: agent.command.clone(),
        cwd: agent.cwd.clone(),
        env: agent.env.clone(),
        pool_size,
        idle_ttl,
        permissions: agent.permissions.unwrap_or(Permissions::Ask),
        frontend_mcp: agent.mcp_frontend_tools.unwrap_or(FrontendMcp::Auto),
        workspace,
        confinement: agent.confinement,
        sandbox: agent.sandbox.clone().unwrap_or_default(),
        relays,
        egress,
        session_ttl,
        session_defaults,
        warm,
    })
}

/// An ACP agent's model relays (each key read now) and egress rules; both need the
/// agent confined (its own network is what makes them the only ways out).
#[allow(clippy::type_complexity)]
fn ways_out(
    agent: &FileAgent,
) -> Result<
    (
        Vec<std::sync::Arc<crate::egress::Relay>>,
        std::sync::Arc<crate::egress::Egress>,
    ),
    ConfigError,
> {
    let fail = |e: String| ConfigError::new(format!("agent {:?}: {e}", agent.name));
    let relays = agent
        .relay
        .iter()
        .map(|r| crate::egress::Relay::new(r).map(std::sync::Arc::new))
        .collect::<Result<Vec<_>, String>>()
        .map_err(fail)?;
    let egress =
        crate::egress::Egress::new(&agent.egress.clone().unwrap_or_default()).map_err(fail)?;
    let unconfined = agent.confinement == Some(crate::confine::Confinement::None);
    if unconfined && (!relays.is_empty() || agent.egress.is_some()) {
        return Err(fail(
            "relay and egress need a confined agent (confinement \"landlock\" or \"bwrap\"): unconfined, it shares the daemon's network".to_owned(),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for relay in &relays {
        for name in std::iter::once(&relay.base_url_env).chain(&relay.placeholder_env) {
            if !names.insert(name.clone()) {
                return Err(fail(format!("relay: {name} is set by two relays")));
            }
        }
    }
    Ok((relays, std::sync::Arc::new(egress)))
}

/// An ACP agent's warm starts: `spares`, `spare_ttl`, `spare_session`, `spare_principals`,
/// `preload_sessions`.
fn warm_config(agent: &FileAgent) -> Result<Warm, ConfigError> {
    let defaults = Warm::default();
    let spare_ttl = match &agent.spare_ttl {
        Some(text) => parse_duration(text)
            .map_err(|e| ConfigError::new(format!("agent {:?}: spare_ttl: {e}", agent.name)))?,
        None => defaults.spare_ttl,
    };
    if spare_ttl.is_zero() {
        return Err(ConfigError::new(format!(
            "agent {:?}: spare_ttl must be more than zero",
            agent.name
        )));
    }
    Ok(Warm {
        spares: agent.spares.unwrap_or(defaults.spares),
        spare_ttl,
        spare_session: agent.spare_session.unwrap_or(defaults.spare_session),
        spare_principals: agent.spare_principals.unwrap_or(defaults.spare_principals),
        preload_sessions: agent.preload_sessions.unwrap_or(defaults.preload_sessions),
    })
}

/// An ACP agent's workspaces: none with `cwd` (one directory every thread shares), else
/// `[agents.workspace]` or its defaults.
fn acp_workspace(
    agent: &FileAgent,
    data_dir: &Path,
) -> Result<Option<WorkspaceConfig>, ConfigError> {
    match (&agent.cwd, &agent.workspace) {
        (Some(_), Some(_)) => Err(ConfigError::new(format!(
            "agent {:?}: give `cwd` (one directory every thread shares) or `[agents.workspace]`, not both",
            agent.name
        ))),
        (Some(_), None) => Ok(None),
        (None, Some(workspace)) => workspace_config(&agent.name, workspace, data_dir).map(Some),
        (None, None) => {
            workspace_config(&agent.name, &FileWorkspace::default(), data_dir).map(Some)
        }
    }
}

/// An agent's workspaces: by default an empty directory per thread under
/// `<data dir>/workspaces`.
fn workspace_config(
    agent: &str,
    file: &FileWorkspace,
    data_dir: &Path,
) -> Result<WorkspaceConfig, ConfigError> {
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
    let root = match &file.root {
        Some(root) if root.is_relative() => {
            return Err(at("root", "must be an absolute path".to_owned()));
        }
        Some(root) => root.clone(),
        None => data_dir.join("workspaces"),
    };
    Ok(WorkspaceConfig {
        source,
        root,
        quota,
        unit: file.unit.unwrap_or(Unit::Thread),
        checkpoints: file
            .checkpoints
            .unwrap_or(crate::workspace::DEFAULT_CHECKPOINTS),
    })
}

/// One `--acp NAME=COMMAND` flag: an ACP agent with the command split into shell words.
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
            multitask: None,
            history: None,
            budget: None,
            mcp_frontend_tools: None,
            workspace: None,
            confinement: None,
            sandbox: None,
            relay: Vec::new(),
            egress: None,
            session_ttl: None,
            mode: None,
            config_options: None,
            spares: None,
            spare_ttl: None,
            spare_session: None,
            spare_principals: None,
            preload_sessions: None,
        },
        data_dir,
    )
}
