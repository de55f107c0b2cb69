//! What the translator reads out of an update's JSON: a tool call's name, details, text,
//! diffs and command output, a plan's entries, usage. Pure functions of the update.

use serde_json::{Value, json};

use crate::agent::{EventSink, SinkClosed};

/// The piece of command output an update carries: `_meta.terminal_output.data` (or
/// `_meta.terminal_output_delta.data`, the name agents use when the client did not ask).
pub(super) fn terminal_output(update: &Value) -> Option<&str> {
    let meta = &update["_meta"];
    ["terminal_output", "terminal_output_delta"]
        .iter()
        .find_map(|key| meta[*key]["data"].as_str())
}

/// The AG-UI name of an ACP tool call: its `name` if it has one, its `title` when that
/// looks like a name (one identifier-like token: `get_weather`, `mcp__github__search`),
/// else its `kind` (`read`, `execute`, ...), else `tool`.
pub(super) fn tool_name(update: &Value) -> String {
    let field = |k: &str| update[k].as_str().filter(|s| !s.is_empty());
    field("name")
        .or_else(|| field("title").filter(|t| looks_like_a_name(t)))
        .or_else(|| field("kind"))
        .unwrap_or("tool")
        .to_owned()
}

pub(super) fn looks_like_a_name(title: &str) -> bool {
    title.len() <= 64
        && title
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && title
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'))
}

/// What the UI may show about a tool call beyond its name (`CUSTOM acp.tool_call`, sent
/// just before its `TOOL_CALL_START`): its id, and the ACP `title`, `kind` and `locations`
/// when present.
pub(super) fn tool_call_details(id: &str, update: &Value) -> Value {
    let mut details = json!({"toolCallId": id});
    for key in ["title", "kind", "locations"] {
        if let Some(value) = update.get(key).filter(|v| !v.is_null()) {
            details[key] = value.clone();
        }
    }
    details
}

/// The text of an ACP content block (a resource link as `[uri]`).
pub(in crate::agent::acp) fn text_of(content: &Value) -> Option<String> {
    match content["type"].as_str() {
        Some("text") => content["text"]
            .as_str()
            .map(str::to_owned)
            .filter(|t| !t.is_empty()),
        Some("resource_link") => content["uri"].as_str().map(|u| format!("[{u}]")),
        _ => None,
    }
}

/// The text of a tool call's `content` list (its text blocks).
pub(super) fn contents_text(content: &Value) -> String {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "content")
        .filter_map(|item| text_of(&item["content"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The diffs of a tool call's `content` list: `{"path","oldText","newText"}` each
/// (`oldText` null for a new file).
pub(super) fn diffs(content: &Value) -> Vec<Value> {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "diff" && item["path"].is_string())
        .map(|item| {
            json!({
                "path": item["path"],
                "oldText": item.get("oldText").cloned().unwrap_or(Value::Null),
                "newText": item.get("newText").cloned().unwrap_or(json!("")),
            })
        })
        .collect()
}

/// A unified diff of one file, as a tool result's text. Both sides without a last newline
/// are snippets of the file (an edit's old and new strings), not its end: no "No newline
/// at end of file" marker is shown for them.
pub(super) fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let snippets = !old.ends_with('\n') && !new.ends_with('\n');
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .missing_newline_hint(!snippets)
        .header(path, path)
        .to_string()
}

/// A `plan`'s entries as the state's `/todos`.
pub(super) fn todos(update: &Value) -> Value {
    let todos: Vec<Value> = update["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    json!({
                        "content": e["content"].as_str().unwrap_or_default(),
                        "status": e["status"].as_str().unwrap_or("pending"),
                        "priority": e["priority"].as_str().unwrap_or("medium"),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Value::Array(todos)
}

/// A `usage_update` in the state, key by key: `/usage` also holds the turns' token counts
/// (`turn`, `total`).
pub(super) async fn usage(update: &Value, sink: &EventSink) -> Result<(), SinkClosed> {
    sink.set_state("/usage/used", update["used"].clone())
        .await?;
    sink.set_state("/usage/size", update["size"].clone())
        .await?;
    if let Some(cost) = update.get("cost").filter(|c| !c.is_null()) {
        sink.set_state("/usage/cost", cost.clone()).await?;
    }
    Ok(())
}

pub(super) fn without_tag(update: &Value) -> Value {
    let mut value = update.clone();
    if let Some(map) = value.as_object_mut() {
        map.remove("sessionUpdate");
    }
    value
}
