//! What `check-config` prints: the resolved configuration, secrets redacted, and the
//! warnings about what would keep it from working.

use crate::config::{AgentKind, TokenSource};

use super::resolve::Resolved;

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
                    Ok(_) => {
                        if !crate::confine::network_namespaces() {
                            warnings.push(format!(
                                "agent {:?}: will not start: its network namespace needs a root daemon or unprivileged user namespaces",
                                agent.name
                            ));
                        }
                        if let Err(why) = crate::confine::cgroup::status() {
                            warnings.push(format!(
                                "agent {:?}: no memory, process or CPU limits: {why}",
                                agent.name
                            ));
                        }
                    }
                    Err(why) => warnings.push(format!(
                        "agent {:?}: will not start: {why}",
                        agent.name
                    )),
                }
                if let Some(warning) = claude_mode_warning(&agent.name, acp) {
                    warnings.push(warning);
                }
                let confined = !matches!(
                    crate::confine::in_force(acp.confinement),
                    Ok(crate::confine::Confinement::None)
                );
                if let Some(warning) = codex_sandbox_warning(&agent.name, acp, confined) {
                    warnings.push(warning);
                }
                if confined {
                    warnings.extend(hidden_paths(&agent.name, acp, &self.config));
                }
                warnings.extend(keys_in_env(&agent.name, acp));
            }
        }
        for webhook in &self.config.webhooks {
            if webhook.secret.expose().len() < 32 {
                warnings.push(format!(
                    "webhook {:?}: its secret is shorter than 32 bytes",
                    webhook.name
                ));
            }
        }
        value["warnings"] = serde_json::json!(warnings);
        (value, warnings)
    }
}

/// A confined agent's program or sandbox paths inside what the sandbox keeps from every
/// agent (the data directory, the daemon's `$HOME`, its secret files): dropped from the
/// agent's view, so the agent cannot start or cannot reach them.
fn hidden_paths(
    name: &str,
    acp: &crate::agent::acp::AcpConfig,
    config: &crate::config::Config,
) -> Vec<String> {
    let mut hidden = config.secret_paths();
    hidden.extend(std::env::var_os("HOME").map(std::path::PathBuf::from));
    let program = acp
        .command
        .first()
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute());
    let wanted = program.iter().map(|p| ("command", p)).chain(
        acp.sandbox
            .read
            .iter()
            .map(|p| ("sandbox.read", p))
            .chain(acp.sandbox.write.iter().map(|p| ("sandbox.write", p))),
    );
    let mut out = Vec::new();
    for (what, path) in wanted {
        if let Some(inside) = hidden.iter().find(|h| path.starts_with(h)) {
            out.push(format!(
                "agent {name:?}: {what} {} lies in {}, which the sandbox keeps from every agent: \
                 move it elsewhere (e.g. under /opt)",
                path.display(),
                inside.display()
            ));
        }
    }
    out
}

/// Claude Code's adapter starts sessions in mode `auto`, which asks nobody: with
/// `permissions = "ask"` and no `mode`, nothing is ever asked.
fn claude_mode_warning(name: &str, acp: &crate::agent::acp::AcpConfig) -> Option<String> {
    let claude = acp
        .command
        .iter()
        .any(|word| word.contains("claude-agent-acp"));
    let asks = acp.permissions == crate::agent::acp::Permissions::Ask;
    let mode_set = acp.session_defaults.get("mode").is_some();
    (claude && asks && !mode_set).then(|| {
        format!(
            "agent {name:?}: Claude Code's adapter starts sessions in mode \"auto\", which asks \
             nobody: set mode = \"default\" for permissions = \"ask\" to ask"
        )
    })
}

/// Codex's own command sandbox (bubblewrap, or Landlock) cannot start inside the daemon's:
/// confined, in any mode but `agent-full-access`, each of its commands fails or must be
/// approved to run outside it (where it runs in the daemon's sandbox all the same).
fn codex_sandbox_warning(
    name: &str,
    acp: &crate::agent::acp::AcpConfig,
    confined: bool,
) -> Option<String> {
    let codex = acp.command.iter().any(|word| word.contains("codex-acp"));
    let full = acp.env.get("INITIAL_AGENT_MODE").map(String::as_str) == Some("agent-full-access");
    (codex && confined && !full).then(|| {
        format!(
            "agent {name:?}: Codex's own command sandbox cannot start inside the daemon's, so each \
             command must be approved to run outside it; set INITIAL_AGENT_MODE = \
             \"agent-full-access\" in env to run its commands in the daemon's sandbox without asking"
        )
    })
}

/// Variables of an agent's `env` named like a credential: the agent (and so any user who
/// asks it) can print them; a relay keeps a model key out of its reach.
fn keys_in_env(name: &str, acp: &crate::agent::acp::AcpConfig) -> Vec<String> {
    acp.env
        .keys()
        .filter(|var| {
            let upper = var.to_ascii_uppercase();
            ["KEY", "TOKEN", "SECRET", "PASSWORD"]
                .iter()
                .any(|word| upper.contains(word))
        })
        .map(|var| {
            format!(
                "agent {name:?}: env {var} looks like a credential, which the agent (and any user who asks it) can print: give a model key to a [[agents.relay]] instead"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::acp::{AcpConfig, Permissions};

    #[test]
    fn claude_asking_with_no_mode_is_warned_about() {
        let mut acp = AcpConfig::new(vec![
            "npx".to_owned(),
            "-y".to_owned(),
            "@agentclientprotocol/claude-agent-acp".to_owned(),
        ]);
        assert!(claude_mode_warning("claude", &acp).is_some());
        acp.session_defaults = serde_json::json!({"mode": "default"});
        assert!(claude_mode_warning("claude", &acp).is_none());
        acp.session_defaults = serde_json::Value::Null;
        acp.permissions = Permissions::Allow;
        assert!(claude_mode_warning("claude", &acp).is_none());
        let other = AcpConfig::new(vec!["gemini".to_owned(), "--acp".to_owned()]);
        assert!(claude_mode_warning("gemini", &other).is_none());
    }

    #[test]
    fn a_confined_codex_not_in_full_access_is_warned_about() {
        let mut acp = AcpConfig::new(vec![
            "npx".to_owned(),
            "@agentclientprotocol/codex-acp".to_owned(),
        ]);
        assert!(codex_sandbox_warning("codex", &acp, true).is_some());
        assert!(codex_sandbox_warning("codex", &acp, false).is_none());
        acp.env.insert(
            "INITIAL_AGENT_MODE".to_owned(),
            "agent-full-access".to_owned(),
        );
        assert!(codex_sandbox_warning("codex", &acp, true).is_none());
    }

    #[test]
    fn a_key_given_in_env_is_warned_about_by_name() {
        let mut acp = AcpConfig::new(vec!["agent".to_owned()]);
        acp.env
            .insert("ANTHROPIC_API_KEY".to_owned(), "sk-secret".to_owned());
        acp.env.insert("GH_TOKEN".to_owned(), "ghp".to_owned());
        acp.env.insert("IS_SANDBOX".to_owned(), "1".to_owned());
        let warnings = keys_in_env("a", &acp);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("ANTHROPIC_API_KEY"));
        assert!(warnings.iter().all(|w| !w.contains("sk-secret")));
    }
}
