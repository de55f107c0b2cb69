//! Decoding JSON with errors a client can act on: the path of the offending field
//! (`messages[0].content[1].source.value`) and a sentence, not serde's internals.
//!
//! serde loses the path inside internally tagged and untagged enums (it buffers their
//! content before choosing a variant). The enums of `input.rs` therefore choose their
//! variant themselves ([`tagged`]) and decode it with [`nested`], which tracks the path
//! inside and hands it outwards in the error's text; [`InputError::from_json`] joins the
//! pieces and words the message.

use serde::de::{DeserializeOwned, Error as _};
use serde_json::Value;

/// Marks an error text that carries a path: `\u{1}PATH\u{1}MESSAGE`.
const MARK: char = '\u{1}';

/// Reads a JSON object and removes its `tag` member: the variant name and the rest.
pub(crate) fn tagged<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
    tag: &'static str,
) -> Result<(String, Value), D::Error> {
    let value = <Value as serde::Deserialize>::deserialize(deserializer)?;
    let Value::Object(mut object) = value else {
        return Err(D::Error::custom(format!(
            "expected an object, found {}",
            kind(&value)
        )));
    };
    match object.remove(tag) {
        Some(Value::String(name)) => Ok((name, Value::Object(object))),
        Some(other) => Err(at(
            tag,
            &format!("expected a string, found {}", kind(&other)),
        )),
        None => Err(D::Error::missing_field(tag)),
    }
}

/// Decodes `T` from `value`; an error carries the path inside `value`.
pub(crate) fn nested<T: DeserializeOwned, E: serde::de::Error>(value: Value) -> Result<T, E> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = path_text(error.path());
        let message = error.into_inner().to_string();
        E::custom(carry(&path, &message))
    })
}

/// An error at `field` of the value being decoded.
pub(crate) fn at<E: serde::de::Error>(field: &str, message: &str) -> E {
    E::custom(carry(field, message))
}

/// The unknown-tag error: `unknown role "wizard"; expected one of ...`.
pub(crate) fn unknown<E: serde::de::Error>(tag: &str, name: &str, expected: &[&str]) -> E {
    at(
        tag,
        &format!(
            "unknown value {name:?}; expected one of {}",
            expected
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// What a JSON value is, for messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Why a body is not a valid `RunAgentInput`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InputError {
    /// The JSON path of the offending field (`messages[0].content`), when there is one.
    pub field: Option<String>,
    pub message: String,
}

impl InputError {
    /// The error for a body that failed to decode as `what` (`RunAgentInput`).
    pub(crate) fn from_json(
        what: &str,
        error: serde_path_to_error::Error<serde_json::Error>,
    ) -> InputError {
        let outer = path_text(error.path());
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Eof => InputError {
                field: None,
                message: "the request body ends before its JSON is complete".to_owned(),
            },
            serde_json::error::Category::Syntax | serde_json::error::Category::Io => InputError {
                field: None,
                message: format!(
                    "the request body is not valid JSON (line {}, column {})",
                    inner.line(),
                    inner.column()
                ),
            },
            serde_json::error::Category::Data => {
                let (path, message) = uncarry(&outer, &strip_position(&inner.to_string()));
                let (field, message) = reword(path, &message);
                let message = match &field {
                    Some(field) => format!("invalid {what} at `{field}`: {message}"),
                    None => format!("invalid {what}: {message}"),
                };
                InputError { field, message }
            }
        }
    }
}

/// A path as text: `""` for the root.
fn path_text(path: &serde_path_to_error::Path) -> String {
    let text = path.to_string();
    if text == "." { String::new() } else { text }
}

fn carry(path: &str, message: &str) -> String {
    match message.strip_prefix(MARK) {
        // Already carrying an inner path: extend it.
        Some(rest) => {
            let (inner, message) = rest.split_once(MARK).unwrap_or(("", rest));
            format!("{MARK}{}{MARK}{message}", join(path, inner))
        }
        None => format!("{MARK}{path}{MARK}{message}"),
    }
}

/// The whole path and the message from an outer path and a message that may carry more.
fn uncarry(outer: &str, message: &str) -> (String, String) {
    match message.strip_prefix(MARK) {
        Some(rest) => {
            let (inner, message) = rest.split_once(MARK).unwrap_or(("", rest));
            (join(outer, inner), message.to_owned())
        }
        None => (outer.to_owned(), message.to_owned()),
    }
}

fn join(outer: &str, inner: &str) -> String {
    match (outer.is_empty(), inner.is_empty()) {
        (_, true) => outer.to_owned(),
        (true, false) => inner.to_owned(),
        (false, false) if inner.starts_with('[') => format!("{outer}{inner}"),
        (false, false) => format!("{outer}.{inner}"),
    }
}

/// serde's wording made plain: the field a "missing field" names joins the path.
fn reword(path: String, message: &str) -> (Option<String>, String) {
    if let Some(name) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        return (Some(join(&path, name)), "is required".to_owned());
    }
    let message = match message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    {
        Some((found, expected)) => {
            format!("expected {}, found {}", plain(expected), plain(found))
        }
        None => match message
            .strip_prefix("unknown variant `")
            .and_then(|rest| rest.split_once("`, expected "))
        {
            Some((name, expected)) => format!("unknown value {name:?}; expected {expected}"),
            None => message.to_owned(),
        },
    };
    ((!path.is_empty()).then_some(path), message)
}

/// serde's name for a kind of value, in JSON's words.
fn plain(term: &str) -> String {
    let term = term.strip_prefix("a ").unwrap_or(term);
    if let Some(number) = ["integer `", "floating point `"]
        .iter()
        .find_map(|prefix| term.strip_prefix(prefix))
    {
        return format!("the number {}", number.trim_end_matches('`'));
    }
    if let Some(value) = term.strip_prefix("boolean `") {
        return value.trim_end_matches('`').to_owned();
    }
    match term {
        "map" => "an object".to_owned(),
        "sequence" => "an array".to_owned(),
        "unit value" => "null".to_owned(),
        "string" => "a string".to_owned(),
        "boolean" => "a boolean".to_owned(),
        _ if term.starts_with("struct ") => "an object".to_owned(),
        _ if term.starts_with("string ") => term.to_owned(),
        _ => term.to_owned(),
    }
}

/// Drops serde_json's " at line L column C" suffix: positions mean nothing to a client that
/// built the body as an object (syntax errors say where they are in their own words).
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_paths_join_outwards() {
        let inner = carry("value", "expected a string, found a number");
        let middle = carry("source", &inner);
        let outer = carry("content[1]", &middle);
        assert_eq!(
            uncarry("messages[0]", &outer),
            (
                "messages[0].content[1].source.value".to_owned(),
                "expected a string, found a number".to_owned()
            )
        );
        assert_eq!(join("content", "[2].text"), "content[2].text");
        assert_eq!(uncarry("", "plain"), (String::new(), "plain".to_owned()));
    }
}
