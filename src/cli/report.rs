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
