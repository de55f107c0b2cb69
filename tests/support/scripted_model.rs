//! A scripted model API on loopback for the real agents: the Anthropic Messages API
//! (streamed, as Claude Code asks for it) and the OpenAI Responses API (as Codex asks).
//!
//! A test registers a script under a marker word; a request whose newest user message
//! holding any marker holds this one is answered with the script's next step, counted from
//! the number of assistant turns after that message (so a script needs no state of its
//! own and threads run at once).
//! Tool inputs are streamed in small pieces, as real models stream them. Any other request
//! (a title, a summary, a quota check) gets a short text. Every request is recorded.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// One step of a script: the model's whole answer to one request.
#[derive(Debug, Clone)]
pub enum Step {
    /// Text, and the turn ends.
    Say(String),
    /// One tool call (`name`, `input`; `{cwd}` in a string is the session's directory).
    Tool(String, Value),
    /// Waits this long before answering (a slow model), then the next step's answer.
    Slow(Duration, Box<Step>),
}

/// One recorded request: its path, body and credential (`x-api-key`, else
/// `authorization`).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub body: Value,
    pub credential: Option<String>,
}

#[derive(Default)]
struct Shared {
    scripts: HashMap<String, Vec<Step>>,
    requests: Vec<Recorded>,
}

/// The server; stops when dropped.
pub struct ScriptedModel {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedModel {
    pub async fn start() -> ScriptedModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let shared = Arc::new(Mutex::new(Shared::default()));
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| answer(shared.clone(), request));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        ScriptedModel { url, shared, task }
    }

    /// Answers requests whose newest user text contains `marker` with `steps`, in order.
    pub fn script(&self, marker: &str, steps: Vec<Step>) {
        let mut shared = self.shared.lock().expect("lock");
        shared.scripts.insert(marker.to_owned(), steps);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().expect("lock").requests.clone()
    }

    /// The requests answered from the script of `marker`.
    pub fn scripted_requests(&self, marker: &str) -> Vec<Value> {
        let markers: Vec<String> = self
            .shared
            .lock()
            .expect("lock")
            .scripts
            .keys()
            .cloned()
            .collect();
        let markers: Vec<&String> = markers.iter().collect();
        self.requests()
            .into_iter()
            .filter(|r| has_tools(&r.body))
            .filter(|r| scripted_turn(&r.body, &markers).is_some_and(|(m, _)| m == marker))
            .map(|r| r.body)
            .collect()
    }
}

type Body = BoxBody<Bytes, Infallible>;

async fn answer(
    shared: Arc<Mutex<Shared>>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_owned();
    let credential = ["x-api-key", "authorization"]
        .iter()
        .find_map(|name| request.headers().get(*name))
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let step = {
        let mut shared = shared.lock().expect("lock");
        shared.requests.push(Recorded {
            path: path.clone(),
            body: body.clone(),
            credential,
        });
        next_step(&shared.scripts, &body)
    };
    let cwd = working_directory(&body).unwrap_or_default();
    let step = step.unwrap_or_else(|| Step::Say("Scripted reply.".to_owned()));
    if path.ends_with("/messages") && body["stream"] == Value::Bool(false) {
        // A whole answer, its length given.
        Ok(json_response(
            200,
            json!({"type": "message", "role": "assistant",
                   "content": [{"type": "text", "text": "Scripted reply."}],
                   "usage": {"input_tokens": 100, "output_tokens": 20}}),
        ))
    } else if path.ends_with("/messages") {
        Ok(stream(anthropic_events(step, &cwd)))
    } else if path.ends_with("/responses") {
        Ok(stream(openai_events(step, &cwd)))
    } else if path.ends_with("/count_tokens") {
        Ok(json_response(200, json!({"input_tokens": 10})))
    } else {
        Ok(json_response(
            404,
            json!({"type": "error", "error": {"type": "not_found_error", "message": path}}),
        ))
    }
}

fn json_response(status: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("response")
}

/// A pause, then SSE events (`event`, `data`), sent one at a time.
struct Events {
    pause: Duration,
    events: Vec<(String, Value)>,
}

fn stream(events: Events) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        tokio::time::sleep(events.pause).await;
        for (name, data) in events.events {
            let frame = format!("event: {name}\ndata: {data}\n\n");
            if tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    let body = StreamBody::new(frames);
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(BodyExt::boxed(body))
        .expect("response")
}

/// The script step answering `body`: the script whose marker the newest user message
/// that holds any marker holds, at the index of the assistant turns after that message.
fn next_step(scripts: &HashMap<String, Vec<Step>>, body: &Value) -> Option<Step> {
    if !has_tools(body) {
        return None;
    }
    let markers: Vec<&String> = scripts.keys().collect();
    let (marker, index) = scripted_turn(body, &markers)?;
    scripts[&marker].get(index).cloned()
}

fn has_tools(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

/// The messages of an Anthropic (`messages`) or Responses (`input`) request.
fn messages(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .or_else(|| body["input"].as_array())
        .cloned()
        .unwrap_or_default()
}

/// The text a user message holds (beside any tool results it carries).
fn user_text(message: &Value) -> Option<String> {
    if message["role"] != "user" {
        return None;
    }
    match &message["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| matches!(p["type"].as_str(), Some("text" | "input_text")))
                .filter_map(|p| p["text"].as_str())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

/// The marker of the newest user message that holds one of `markers` (the last written,
/// of several), and how many
/// assistant turns came after that message.
fn scripted_turn(body: &Value, markers: &[&String]) -> Option<(String, usize)> {
    let all = messages(body);
    let (at, marker) = all.iter().enumerate().rev().find_map(|(i, m)| {
        let text = user_text(m)?;
        // Of several markers in one message (a recap of earlier turns before the new
        // text), the one written last.
        markers
            .iter()
            .filter_map(|marker| text.rfind(marker.as_str()).map(|at| (at, marker)))
            .max_by_key(|(at, _)| *at)
            .map(|(_, marker)| (i, (*marker).clone()))
    })?;
    let answers = all[at..]
        .iter()
        .filter(|m| {
            m["role"] == "assistant"
                || matches!(
                    m["type"].as_str(),
                    Some("function_call" | "custom_tool_call")
                )
        })
        .count();
    Some((marker, answers))
}

/// The session's directory as the agent tells the model (`Primary working directory: …`
/// in Claude's system prompt, `<cwd>…</cwd>` in Codex's context).
fn working_directory(body: &Value) -> Option<String> {
    let all = body.to_string();
    for (open, close) in [
        ("Primary working directory: ", "\\n"),
        ("Working directory: ", "\\n"),
        ("<cwd>", "</cwd>"),
    ] {
        if let Some(start) = all.find(open) {
            let rest = &all[start + open.len()..];
            let end = rest.find(close).unwrap_or(rest.len());
            return Some(rest[..end].trim().to_owned());
        }
    }
    None
}

fn with_cwd(value: &Value, cwd: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace("{cwd}", cwd)),
        Value::Array(items) => Value::Array(items.iter().map(|v| with_cwd(v, cwd)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), with_cwd(v, cwd)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `text` in pieces of at most `n` characters.
fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

fn anthropic_events(step: Step, cwd: &str) -> Events {
    let (pause, step) = match step {
        Step::Slow(pause, step) => (pause, *step),
        step => (Duration::ZERO, step),
    };
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let mut events = vec![(
        "message_start".to_owned(),
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": "scripted",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 1}}}),
    )];
    let stop = match step {
        Step::Say(text) => {
            events.push(block_start(json!({"type": "text", "text": ""})));
            for piece in pieces(&text, 8) {
                events.push(block_delta(json!({"type": "text_delta", "text": piece})));
            }
            "end_turn"
        }
        Step::Tool(name, input) => {
            let call = format!("toolu_{}", uuid::Uuid::new_v4().simple());
            events.push(block_start(
                json!({"type": "tool_use", "id": call, "name": name, "input": {}}),
            ));
            for piece in pieces(&with_cwd(&input, cwd).to_string(), 12) {
                events.push(block_delta(
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            "tool_use"
        }
        Step::Slow(..) => unreachable!("one pause per step"),
    };
    events.push((
        "content_block_stop".to_owned(),
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push((
        "message_delta".to_owned(),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 20}}),
    ));
    events.push(("message_stop".to_owned(), json!({"type": "message_stop"})));
    Events { pause, events }
}

fn block_start(block: Value) -> (String, Value) {
    (
        "content_block_start".to_owned(),
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
    )
}

fn block_delta(delta: Value) -> (String, Value) {
    (
        "content_block_delta".to_owned(),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    )
}

fn openai_events(step: Step, cwd: &str) -> Events {
    let (pause, step) = match step {
        Step::Slow(pause, step) => (pause, *step),
        step => (Duration::ZERO, step),
    };
    let response = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let shell = |kind: &str, body: Value| (kind.to_owned(), body);
    let mut events = vec![shell(
        "response.created",
        json!({"type": "response.created", "response": {"id": response}}),
    )];
    let item = match step {
        Step::Say(text) => {
            let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
            events.push(shell(
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": {
                    "type": "message", "id": id, "role": "assistant", "content": []}}),
            ));
            for piece in pieces(&text, 8) {
                events.push(shell(
                    "response.output_text.delta",
                    json!({"type": "response.output_text.delta", "item_id": id,
                           "output_index": 0, "content_index": 0, "delta": piece}),
                ));
            }
            json!({"type": "message", "id": id, "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
        Step::Tool(name, input) => {
            let call = format!("call_{}", uuid::Uuid::new_v4().simple());
            let arguments = with_cwd(&input, cwd).to_string();
            json!({"type": "function_call", "id": format!("fc_{call}"), "call_id": call,
                   "name": name, "arguments": arguments})
        }
        Step::Slow(..) => unreachable!("one pause per step"),
    };
    events.push(shell(
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    ));
    events.push(shell(
        "response.completed",
        json!({"type": "response.completed", "response": {"id": response,
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 120}}}),
    ));
    Events { pause, events }
}
