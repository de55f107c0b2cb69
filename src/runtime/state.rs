//! The per-thread shared state document and its RFC 6902 deltas.
//!
//! Shape: `{"agent","session"?,"model"?,"todos":[...],"usage":{...},"files":[...],
//! "client"?}`. Agents change it by JSON pointer; the client receives `STATE_SNAPSHOT` after
//! every `RUN_STARTED` and `STATE_DELTA`s computed by the json-patch crate. A diff only ever
//! uses `add` for members the client does not have yet, so every delta applies to the
//! snapshot the client holds.

use serde_json::{Map, Value, json};

/// Members of the document the server owns; a client's echoed state is stripped of them.
const OWNED: &[&str] = &[
    "agent", "session", "model", "todos", "usage", "files", "client",
];

/// The document of a fresh thread.
pub fn initial(agent: &str) -> Value {
    json!({"agent": agent, "todos": [], "usage": {}, "files": []})
}

/// A thread's document, held only once it differs from a fresh thread's ([`initial`]):
/// most threads' never does, and a fresh one would be a map of its own in every thread.
#[derive(Debug, Default)]
pub struct Document(Option<Value>);

impl Document {
    /// A document as a thread's last run left it (`None`: a fresh one).
    pub fn stored(stored: Option<Value>) -> Document {
        Document(stored)
    }

    /// The document, if it differs from a fresh thread's.
    pub fn changed(&self) -> Option<&Value> {
        self.0.as_ref()
    }

    /// The document as it is (a fresh one for `agent` until it was changed).
    pub fn value(&self, agent: &str) -> Value {
        self.0.clone().unwrap_or_else(|| initial(agent))
    }

    /// The document, to change.
    pub fn make_mut(&mut self, agent: &str) -> &mut Value {
        self.0.get_or_insert_with(|| initial(agent))
    }

    /// Its encoded length.
    pub fn size(&self, agent: &str) -> usize {
        match &self.0 {
            Some(value) => super::memory::json_size(value),
            None => super::memory::json_size(&initial(agent)),
        }
    }
}

/// Sets `client` from `RunAgentInput.state`. A client that sends back the document it was
/// given (CopilotKit does) would nest it deeper every turn, so the server's own members are
/// stripped first; what is left is the client's own state.
pub fn set_client(document: &mut Value, state: &Value) {
    let client = match state {
        Value::Object(map) => {
            let own: Map<String, Value> = map
                .iter()
                .filter(|(k, _)| !OWNED.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            match map.get("client") {
                // Our document echoed back: keep what it carried for the client.
                Some(inner) if own.is_empty() => inner.clone(),
                _ => Value::Object(own),
            }
        }
        Value::Null => return,
        other => other.clone(),
    };
    if let Value::Object(doc) = document {
        doc.insert("client".to_owned(), client);
    }
}

/// Sets the value at an RFC 6901 pointer, creating intermediate objects. Returns the
/// RFC 6902 operations that take the old document to the new one (empty when unchanged),
/// or an error for a pointer that cannot be set.
pub fn set(document: &mut Value, pointer: &str, value: Value) -> Result<Value, String> {
    let before = document.clone();
    set_pointer(document, pointer, value)?;
    let patch = json_patch::diff(&before, document);
    serde_json::to_value(patch).map_err(|e| e.to_string())
}

fn set_pointer(document: &mut Value, pointer: &str, value: Value) -> Result<(), String> {
    if pointer.is_empty() {
        return Err("the whole document cannot be replaced".to_owned());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer {pointer:?}"));
    };
    let tokens: Vec<String> = rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let (last, parents) = tokens.split_last().ok_or("empty pointer")?;
    let mut node = document;
    for token in parents {
        node = match node {
            Value::Object(map) => map
                .entry(token.clone())
                .or_insert_with(|| Value::Object(Map::new())),
            Value::Array(items) => {
                let index: usize = token
                    .parse()
                    .map_err(|_| format!("invalid array index {token:?}"))?;
                items
                    .get_mut(index)
                    .ok_or_else(|| format!("array index {index} out of range"))?
            }
            _ => return Err(format!("cannot descend into a scalar at {token:?}")),
        };
    }
    match node {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) if last == "-" => {
            items.push(value);
            Ok(())
        }
        Value::Array(items) => {
            let index: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            match index.cmp(&items.len()) {
                std::cmp::Ordering::Less => items[index] = value,
                std::cmp::Ordering::Equal => items.push(value),
                std::cmp::Ordering::Greater => {
                    return Err(format!("array index {index} out of range"));
                }
            }
            Ok(())
        }
        _ => Err(format!("cannot set a member of a scalar at {last:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_is_a_fresh_ones_until_changed() {
        let mut doc = Document::default();
        assert_eq!(doc.value("demo"), initial("demo"));
        assert_eq!(
            doc.size("demo"),
            serde_json::to_vec(&initial("demo")).expect("json").len()
        );
        set(doc.make_mut("demo"), "/model", json!("m1")).expect("set");
        let mut expected = initial("demo");
        expected["model"] = json!("m1");
        assert_eq!(doc.value("demo"), expected);
        assert_eq!(
            doc.size("demo"),
            serde_json::to_vec(&expected).expect("json").len()
        );
    }

    fn apply(doc: &Value, delta: &Value) -> Value {
        let patch: json_patch::Patch = serde_json::from_value(delta.clone()).expect("patch");
        let mut out = doc.clone();
        json_patch::patch(&mut out, &patch).expect("delta applies");
        out
    }

    #[test]
    fn deltas_apply_to_the_previous_document() {
        let mut doc = initial("demo");
        let steps = [
            (
                "/todos",
                json!([{"content": "a", "status": "pending", "priority": "medium"}]),
            ),
            (
                "/todos",
                json!([{"content": "a", "status": "completed", "priority": "medium"}, {"content": "b", "status": "pending", "priority": "low"}]),
            ),
            ("/usage", json!({"inputTokens": 3})),
            ("/usage/outputTokens", json!(4)),
            ("/files/-", json!({"path": "x.rs", "action": "edit"})),
            ("/model", json!("m1")),
            ("/todos", json!([])),
        ];
        for (pointer, value) in steps {
            let before = doc.clone();
            let delta = set(&mut doc, pointer, value).expect("set");
            assert_eq!(apply(&before, &delta), doc, "{pointer}");
            // New members are added, never replaced into existence.
            for op in delta.as_array().expect("ops") {
                if op["op"] == "replace" {
                    let path = op["path"].as_str().expect("path");
                    assert!(before.pointer(path).is_some(), "replace on missing {path}");
                }
            }
        }
    }

    #[test]
    fn unchanged_value_gives_an_empty_delta() {
        let mut doc = initial("demo");
        let delta = set(&mut doc, "/todos", json!([])).expect("set");
        assert_eq!(delta, json!([]));
    }

    #[test]
    fn bad_pointers_are_refused() {
        let mut doc = initial("demo");
        assert!(set(&mut doc, "", json!(1)).is_err());
        assert!(set(&mut doc, "todos", json!(1)).is_err());
        assert!(set(&mut doc, "/agent/x", json!(1)).is_err());
        assert!(set(&mut doc, "/todos/5", json!(1)).is_err());
    }

    #[test]
    fn echoed_documents_do_not_nest() {
        let mut doc = initial("demo");
        set_client(&mut doc, &json!({"theme": "dark"}));
        assert_eq!(doc["client"], json!({"theme": "dark"}));
        let echoed = doc.clone();
        set_client(&mut doc, &echoed);
        assert_eq!(doc["client"], json!({"theme": "dark"}));
        set_client(
            &mut doc,
            &json!({"agent": "demo", "todos": [], "theme": "light"}),
        );
        assert_eq!(doc["client"], json!({"theme": "light"}));
    }
}
