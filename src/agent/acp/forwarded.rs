//! What a client may set on an ACP session before a turn (`forwardedProps.acp`: a mode and
//! config options), and an agent's configured session defaults in the same shape: read and
//! checked, nothing sent. `settings.rs` applies them to a session; `config.rs` checks the
//! defaults when the configuration is read.

use agent_client_protocol::v1::schema::SessionConfigOptionValue;
use serde_json::{Value, json};

use crate::protocol::InputError;

/// What a client may set on a session before a turn: `forwardedProps.acp`.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Settings {
    pub(super) mode: Option<String>,
    pub(super) config_options: Vec<(String, SessionConfigOptionValue)>,
}

impl Settings {
    /// Reads an agent's configured session defaults: `{"mode"?, "configOptions"?}`, as
    /// `forwardedProps.acp` would give them.
    pub(super) fn from_defaults(defaults: &Value) -> Result<Settings, InputError> {
        Settings::from_forwarded_props(Some(&json!({ "acp": defaults })))
    }

    /// Reads `forwardedProps.acp.mode` (a mode id) and `forwardedProps.acp.configOptions`
    /// (`{"<option id>": "<value id>" | true | false}`); anything else there is an error
    /// naming the field.
    pub(super) fn from_forwarded_props(props: Option<&Value>) -> Result<Settings, InputError> {
        let invalid = |field: String, what: &str| InputError {
            message: format!("{field} {what}"),
            field: Some(field),
        };
        let Some(acp) = props.and_then(|p| p.get("acp")).filter(|a| !a.is_null()) else {
            return Ok(Settings::default());
        };
        let Value::Object(acp) = acp else {
            return Err(invalid(
                "forwardedProps.acp".to_owned(),
                "must be an object",
            ));
        };
        let mode = match acp.get("mode") {
            None | Some(Value::Null) => None,
            Some(Value::String(mode)) if !mode.is_empty() => Some(mode.clone()),
            Some(_) => {
                return Err(invalid(
                    "forwardedProps.acp.mode".to_owned(),
                    "must be a mode id (a non-empty string)",
                ));
            }
        };
        let mut config_options = Vec::new();
        match acp.get("configOptions") {
            None | Some(Value::Null) => {}
            Some(Value::Object(options)) => {
                for (id, value) in options {
                    let value = match value {
                        Value::String(v) if !v.is_empty() => {
                            SessionConfigOptionValue::from(v.as_str())
                        }
                        Value::Bool(b) => SessionConfigOptionValue::boolean(*b),
                        _ => {
                            return Err(invalid(
                                format!("forwardedProps.acp.configOptions.{id}"),
                                "must be a value id (a non-empty string) or a boolean",
                            ));
                        }
                    };
                    config_options.push((id.clone(), value));
                }
            }
            Some(_) => {
                return Err(invalid(
                    "forwardedProps.acp.configOptions".to_owned(),
                    "must be an object",
                ));
            }
        }
        Ok(Settings {
            mode,
            config_options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_props_settings_are_read_or_refused_by_field() {
        let read = |props: Value| Settings::from_forwarded_props(Some(&props));
        assert_eq!(read(json!({})), Ok(Settings::default()));
        assert_eq!(read(json!({"acp": null})), Ok(Settings::default()));
        let settings = read(json!({"acp": {"mode": "plan",
            "configOptions": {"model": "smart", "fast": false}}}))
        .expect("settings");
        assert_eq!(settings.mode.as_deref(), Some("plan"));
        assert_eq!(
            settings.config_options,
            vec![
                ("model".to_owned(), SessionConfigOptionValue::from("smart")),
                ("fast".to_owned(), SessionConfigOptionValue::boolean(false)),
            ],
            "in the client's order"
        );
        for (bad, field) in [
            (json!({"acp": "plan"}), "forwardedProps.acp"),
            (json!({"acp": {"mode": 3}}), "forwardedProps.acp.mode"),
            (json!({"acp": {"mode": ""}}), "forwardedProps.acp.mode"),
            (
                json!({"acp": {"configOptions": []}}),
                "forwardedProps.acp.configOptions",
            ),
            (
                json!({"acp": {"configOptions": {"model": 1}}}),
                "forwardedProps.acp.configOptions.model",
            ),
        ] {
            match read(bad.clone()) {
                Err(InputError {
                    field: Some(named),
                    message,
                }) => {
                    assert_eq!(named, field);
                    assert!(message.starts_with(field), "{bad}: {message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
