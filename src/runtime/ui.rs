//! Generative UI from agents, allow-listed: an agent may show a component only if it is in
//! the catalog, with props that are JSON (never HTML or script), within the size cap, and
//! valid against the component's JSON Schema. An accepted intent becomes an AG-UI
//! `ACTIVITY_SNAPSHOT` (the component as `activityType`, the props as `content`) and an
//! activity message in the transcript; a refused one puts nothing on the stream and the
//! agent is told why.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The default cap on one component's props (bytes of compact JSON).
pub const DEFAULT_MAX_PROPS: usize = 8 * 1024;

/// Why a component was refused; said to the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UiRefusal {
    #[error("unknown component {0:?}; allowed: {1}")]
    Unknown(String, String),
    #[error("props of {0:?} are {1} bytes; at most {2} are allowed")]
    TooLarge(String, usize, usize),
    #[error("props of {0:?} do not match its schema: {1}")]
    Invalid(String, String),
}

struct Component {
    validator: jsonschema::Validator,
}

/// The components agents may show, with their props' schemas.
pub struct UiCatalog {
    components: BTreeMap<String, Component>,
    max_props: usize,
}

impl std::fmt::Debug for UiCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UiCatalog")
            .field("components", &self.components.keys().collect::<Vec<_>>())
            .field("max_props", &self.max_props)
            .finish()
    }
}

impl UiCatalog {
    /// A catalog of `components` (name, props schema); an invalid schema is an error
    /// naming the component.
    pub fn new(components: Vec<(String, Value)>, max_props: usize) -> Result<UiCatalog, String> {
        let mut compiled = BTreeMap::new();
        for (name, schema) in components {
            let validator = jsonschema::validator_for(&schema)
                .map_err(|e| format!("ui component {name:?}: its schema is invalid: {e}"))?;
            compiled.insert(name, Component { validator });
        }
        Ok(UiCatalog {
            components: compiled,
            max_props,
        })
    }

    /// The six default components and the default cap.
    pub fn defaults() -> UiCatalog {
        UiCatalog::new(default_components(), DEFAULT_MAX_PROPS)
            .unwrap_or_else(|e| unreachable!("the default schemas compile: {e}"))
    }

    /// No component at all.
    pub fn empty() -> UiCatalog {
        UiCatalog {
            components: BTreeMap::new(),
            max_props: DEFAULT_MAX_PROPS,
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.components.keys().map(String::as_str).collect()
    }

    /// Whether `name` may be shown with `props`.
    pub fn check(&self, name: &str, props: &Value) -> Result<(), UiRefusal> {
        let Some(component) = self.components.get(name) else {
            let allowed = if self.components.is_empty() {
                "none".to_owned()
            } else {
                self.names().join(", ")
            };
            return Err(UiRefusal::Unknown(name.to_owned(), allowed));
        };
        let size = serde_json::to_vec(props).map_or(usize::MAX, |b| b.len());
        if size > self.max_props {
            return Err(UiRefusal::TooLarge(name.to_owned(), size, self.max_props));
        }
        component
            .validator
            .validate(props)
            .map_err(|e| UiRefusal::Invalid(name.to_owned(), e.to_string()))
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// `approval_card`, `choice_prompt`, `diff_summary`, `progress`, `metric`, `agent_card`.
// Over 80 lines: a flat table, one JSON Schema per component of the default catalog.
pub fn default_components() -> Vec<(String, Value)> {
    let text = |max: u32| json!({"type": "string", "maxLength": max});
    let choice = object(
        json!({"id": text(128), "label": text(256)}),
        &["id", "label"],
    );
    vec![
        (
            "approval_card".to_owned(),
            object(
                json!({
                    "title": text(256),
                    "description": text(2048),
                    "risk": {"enum": ["low", "medium", "high"]},
                    "actions": {"type": "array", "items": choice, "maxItems": 8},
                }),
                &["title"],
            ),
        ),
        (
            "choice_prompt".to_owned(),
            object(
                json!({
                    "question": text(512),
                    "options": {"type": "array", "items": choice, "minItems": 1, "maxItems": 20},
                    "multiple": {"type": "boolean"},
                }),
                &["question", "options"],
            ),
        ),
        (
            "diff_summary".to_owned(),
            object(
                json!({
                    "summary": text(1024),
                    "files": {"type": "array", "maxItems": 100, "items": object(
                        json!({
                            "path": text(1024),
                            "added": {"type": "integer", "minimum": 0},
                            "removed": {"type": "integer", "minimum": 0},
                        }),
                        &["path"],
                    )},
                }),
                &["files"],
            ),
        ),
        (
            "progress".to_owned(),
            object(
                json!({
                    "label": text(256),
                    "percent": {"type": "number", "minimum": 0, "maximum": 100},
                    "detail": text(1024),
                }),
                &["label", "percent"],
            ),
        ),
        (
            "metric".to_owned(),
            object(
                json!({
                    "label": text(256),
                    "value": {"type": ["number", "string"], "maxLength": 64},
                    "unit": text(32),
                    "trend": {"enum": ["up", "down", "flat"]},
                }),
                &["label", "value"],
            ),
        ),
        (
            "agent_card".to_owned(),
            object(
                json!({
                    "name": text(128),
                    "status": {"enum": ["idle", "working", "waiting", "done", "failed"]},
                    "description": text(1024),
                }),
                &["name", "status"],
            ),
        ),
    ]
}

/// An example of valid props for each default component (docs and tests).
pub fn default_examples() -> Vec<(&'static str, Value)> {
    vec![
        (
            "approval_card",
            json!({"title": "Deploy to production?", "risk": "high",
                "actions": [{"id": "ok", "label": "Deploy"}, {"id": "no", "label": "Cancel"}]}),
        ),
        (
            "choice_prompt",
            json!({"question": "Which region?", "options": [{"id": "eu", "label": "Europe"},
                {"id": "us", "label": "United States"}]}),
        ),
        (
            "diff_summary",
            json!({"summary": "2 files", "files": [{"path": "src/a.rs", "added": 3, "removed": 1},
                {"path": "README.md", "added": 10, "removed": 0}]}),
        ),
        ("progress", json!({"label": "Indexing", "percent": 42})),
        (
            "metric",
            json!({"label": "Latency p99", "value": 12.5, "unit": "ms", "trend": "down"}),
        ),
        (
            "agent_card",
            json!({"name": "reviewer", "status": "working"}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_accept_their_examples_and_refuse_the_rest() {
        let catalog = UiCatalog::defaults();
        assert_eq!(catalog.names().len(), 6);
        for (name, props) in default_examples() {
            assert_eq!(catalog.check(name, &props), Ok(()), "{name}");
        }
        assert!(matches!(
            catalog.check("script_runner", &json!({})),
            Err(UiRefusal::Unknown(..))
        ));
        assert!(matches!(
            catalog.check("progress", &json!({"label": "x", "percent": 140})),
            Err(UiRefusal::Invalid(..))
        ));
        assert!(matches!(
            catalog.check(
                "progress",
                &json!({"label": "x", "percent": 1, "html": "<b>"})
            ),
            Err(UiRefusal::Invalid(..))
        ));
        let big = json!({"label": "x".repeat(200), "percent": 1, "detail": "y".repeat(1000)});
        let small = UiCatalog::new(default_components(), 512).expect("catalog");
        assert!(matches!(
            small.check("progress", &big),
            Err(UiRefusal::TooLarge(..))
        ));
        assert!(UiCatalog::new(vec![("bad".into(), json!({"type": 7}))], 10).is_err());
    }
}
