//! What a client sets on an ACP session before a turn (`forwardedProps.acp`: the mode and
//! config options), and how a session's modes and options are shown in the shared state.

use agent_client_protocol::v1::schema::{
    SessionConfigOption, SessionConfigOptionValue, SessionModeState, SetSessionConfigOptionRequest,
    SetSessionModeRequest,
};
use serde_json::{Value, json};

use super::forwarded::Settings;
use super::process::AcpProcess;
use super::{Inner, Stop};
use crate::agent::{AgentError, EventSink, SinkClosed, Turn};

impl Inner {
    /// Applies what the client asked of the session before this turn's prompt
    /// (`forwardedProps.acp`): `mode` -> `session/set_mode`, `configOptions` (an object of
    /// option id -> value id or boolean) -> `session/set_config_option`, each reflected in
    /// the shared state. A malformed setting or one the agent refuses fails the run.
    pub(super) async fn apply_settings(
        &self,
        turn: &Turn,
        process: &AcpProcess,
        session: &str,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        // Checked before the stream too (`check_input`); this is the request as it came.
        let settings =
            Settings::from_forwarded_props(turn.forwarded_props.as_ref()).map_err(|e| {
                AgentError::Failed {
                    code: "INVALID_INPUT".to_owned(),
                    message: e.message,
                }
            })?;
        // The mode the daemon set on this session last (a configured default set when the
        // session was made, which the turn's document does not show yet), else the
        // document's.
        let known = crate::sync::lock(&process.modes).get(session).cloned();
        let current = Current {
            mode: known.as_deref().or(turn.document["mode"].as_str()),
            config: &turn.document["config"],
        };
        let mut changes = Vec::new();
        let set = self
            .set(settings, current, process, session, &mut changes)
            .await;
        show_changes(changes, sink).await?;
        set
    }

    /// Applies the agent's configured session defaults (`mode`, `config_options`) to a
    /// session just made, as it was made (`created`).
    pub(super) async fn apply_defaults(
        &self,
        created: &SessionSettings,
        process: &AcpProcess,
        session: &str,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        let mut changes = Vec::new();
        let set = self
            .set_defaults(created, process, session, &mut changes)
            .await;
        show_changes(changes, sink).await?;
        set
    }

    /// [`Inner::apply_defaults`] with no run to show it to: what it changed in the
    /// session's state goes to `changes` (a session made ahead shows them to its thread's
    /// first turn).
    pub(super) async fn set_defaults(
        &self,
        created: &SessionSettings,
        process: &AcpProcess,
        session: &str,
        changes: &mut Vec<StateChange>,
    ) -> Result<(), Stop> {
        let Ok(defaults) = Settings::from_defaults(&self.config.session_defaults) else {
            // Checked when the configuration is read.
            return Ok(());
        };
        if defaults == Settings::default() {
            return Ok(());
        }
        let (mode, config) = created.current();
        let current = Current {
            mode: mode.as_deref(),
            config: &config,
        };
        self.set(defaults, current, process, session, changes).await
    }

    /// Puts a session loaded or resumed after a restart back as the thread had it: the
    /// mode and config options the thread's state holds (an agent may start a loaded
    /// session in its own default mode), else the configured defaults.
    pub(super) async fn restore_settings(
        &self,
        turn: &Turn,
        loaded: &SessionSettings,
        process: &AcpProcess,
        session: &str,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        let Ok(mut wanted) = Settings::from_defaults(&self.config.session_defaults) else {
            return Ok(());
        };
        if let Some(mode) = turn.document["mode"].as_str() {
            wanted.mode = Some(mode.to_owned());
        }
        for option in turn.document["config"]["configOptions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let (Some(id), Some(value)) = (option["id"].as_str(), option.get("currentValue"))
            else {
                continue;
            };
            let value = match value {
                Value::String(v) => SessionConfigOptionValue::from(v.as_str()),
                Value::Bool(b) => SessionConfigOptionValue::boolean(*b),
                _ => continue,
            };
            wanted.config_options.retain(|(known, _)| known != id);
            wanted.config_options.push((id.to_owned(), value));
        }
        let (mode, config) = loaded.current();
        let offered: Vec<String> = config["configOptions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["id"].as_str().map(str::to_owned))
            .collect();
        // Only what the loaded session still offers.
        wanted.config_options.retain(|(id, _)| offered.contains(id));
        if mode.is_none() {
            wanted.mode = None;
        }
        let current = Current {
            mode: mode.as_deref(),
            config: &config,
        };
        let mut changes = Vec::new();
        let set = self
            .set(wanted, current, process, session, &mut changes)
            .await;
        show_changes(changes, sink).await?;
        set
    }

    /// Sets on the session what `settings` asks and `current` does not already have; what
    /// the agent took goes to `changes` for the state, in order, also when a later setting
    /// is refused.
    async fn set(
        &self,
        settings: Settings,
        current: Current<'_>,
        process: &AcpProcess,
        session: &str,
        changes: &mut Vec<StateChange>,
    ) -> Result<(), Stop> {
        let refused = |what: &str, error: agent_client_protocol::Error| {
            Stop::Failed(AgentError::Failed {
                code: "AGENT_ERROR".to_owned(),
                message: format!("the agent refused {what}: {}", error.message),
            })
        };
        if let Some(mode) = settings.mode
            && current.mode != Some(mode.as_str())
        {
            process
                .connection
                .send_request(SetSessionModeRequest::new(session.to_owned(), mode.clone()))
                .block_task()
                .await
                .map_err(|e| refused(&format!("mode {mode:?}"), e))?;
            crate::sync::lock(&process.modes).insert(session.to_owned(), mode.clone());
            changes.push(("/mode", json!(mode)));
        }
        for (id, value) in settings.config_options {
            let now = current.config["configOptions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|o| o["id"] == id.as_str())
                .map(|o| &o["currentValue"]);
            let wanted = value
                .as_value_id()
                .map(|id| json!(id.to_string()))
                .or_else(|| value.as_bool().map(|b| json!(b)));
            if now.is_some() && now.cloned() == wanted {
                continue;
            }
            let request = SetSessionConfigOptionRequest::new(session.to_owned(), id.clone(), value);
            let answer = process
                .connection
                .send_request(request)
                .block_task()
                .await
                .map_err(|e| refused(&format!("config option {id:?}"), e))?;
            let options = serde_json::to_value(&answer.config_options)
                .map_err(|e| AgentError::Backend(format!("ACP config options: {e}")))?;
            changes.push(("/config", json!({ "configOptions": options })));
        }
        Ok(())
    }
}

/// A change of a session's shared state: a JSON pointer and its new value.
pub(super) type StateChange = (&'static str, Value);

/// Shows `changes` in the run's shared state, in order.
pub(super) async fn show_changes(
    changes: Vec<StateChange>,
    sink: &EventSink,
) -> Result<(), SinkClosed> {
    for (pointer, value) in changes {
        sink.set_state(pointer, value).await?;
    }
    Ok(())
}

/// A session's modes and config options, as the agent's answer to `session/new`,
/// `session/load` or `session/resume` reports them.
pub(super) struct SessionSettings {
    pub(super) modes: Option<SessionModeState>,
    pub(super) config_options: Option<Vec<SessionConfigOption>>,
}

impl SessionSettings {
    /// The current mode, and the options as the state shows them
    /// (`{"configOptions":[...]}`, or null).
    fn current(&self) -> (Option<String>, Value) {
        let mode = self.modes.as_ref().map(|m| m.current_mode_id.to_string());
        let config = self
            .config_options
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
            .map(|options| json!({ "configOptions": options }))
            .unwrap_or(Value::Null);
        (mode, config)
    }
}

/// A session's mode and config options as they are before settings are applied.
struct Current<'a> {
    mode: Option<&'a str>,
    /// `{"configOptions":[...]}`, or null.
    config: &'a Value,
}

/// Shows a session's modes and config options (made, loaded or resumed) in the shared
/// state (`/mode`, `/modes`, `/config`), as later updates would.
pub(super) async fn show_session_settings(
    created: &SessionSettings,
    sink: &EventSink,
) -> Result<(), SinkClosed> {
    if let Some(modes) = &created.modes {
        let available: Vec<Value> = modes
            .available_modes
            .iter()
            .map(|m| {
                let mut mode = json!({"id": m.id.to_string(), "name": m.name});
                if let Some(description) = &m.description {
                    mode["description"] = json!(description);
                }
                mode
            })
            .collect();
        sink.set_state("/modes", Value::Array(available)).await?;
        sink.set_state("/mode", json!(modes.current_mode_id.to_string()))
            .await?;
    }
    if let Some(options) = &created.config_options
        && let Ok(options) = serde_json::to_value(options)
    {
        sink.set_state("/config", json!({ "configOptions": options }))
            .await?;
    }
    Ok(())
}
