//! The scripted model API of the real-agent tests (`tests/support/scripted_model.rs`) as a
//! program, for the browser test: the Anthropic Messages and OpenAI Responses APIs on
//! loopback, answering from scripts read from a JSON file.
//!
//! Usage: `scripted_model SCRIPTS.json`, where the file maps a marker word to its steps:
//! `{"task-write": [{"tool": "Write", "input": {"file_path": "{cwd}/a.txt", ...}},
//! {"say": "Done."}], ...}` (`{"slow_ms": N, "then": STEP}` waits first). Prints
//! `scripted model listening on http://127.0.0.1:PORT` and serves until killed.

#[path = "../tests/support/scripted_model.rs"]
mod scripted_model;

use std::time::Duration;

use scripted_model::{ScriptedModel, Step};
use serde_json::Value;

fn step(value: &Value) -> Result<Step, String> {
    if let Some(text) = value["say"].as_str() {
        return Ok(Step::Say(text.to_owned()));
    }
    if let Some(name) = value["tool"].as_str() {
        return Ok(Step::Tool(name.to_owned(), value["input"].clone()));
    }
    if let Some(ms) = value["slow_ms"].as_u64() {
        return Ok(Step::Slow(
            Duration::from_millis(ms),
            Box::new(step(&value["then"])?),
        ));
    }
    Err(format!("not a step: {value}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: scripted_model SCRIPTS.json")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let scripts: serde_json::Map<String, Value> =
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let model = ScriptedModel::start().await;
    for (marker, steps) in &scripts {
        let steps = steps
            .as_array()
            .ok_or(format!("{marker}: a list of steps"))?
            .iter()
            .map(step)
            .collect::<Result<Vec<_>, _>>()?;
        model.script(marker, steps);
    }
    println!("scripted model listening on {}", model.url);
    std::future::pending::<()>().await;
    Ok(())
}
