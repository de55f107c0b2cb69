//! The built-in `demo` agent: deterministic, no network, made to exercise the protocol.
//!
//! It reads the last user message:
//!
//! | message | behaviour |
//! |---|---|
//! | anything else | streams `You said: <text>` as several text deltas |
//! | `/slow N [MS]` | N numbered chunks, one every MS milliseconds (default 100) |
//! | `/think TEXT` | a reasoning block, then the reply |
//! | `/todo A; B; C` | sets the todos in shared state, then replies |
//! | `/tool NAME JSON` | calls frontend tool NAME; replies `Tool NAME returned: <content>` |
//! | `/approve ACTION` | asks permission; replies `Approved: ACTION` or `Denied: ACTION` |
//! | `/fail TEXT` | fails the turn with TEXT |
//! | `/usage` | reports token usage in shared state |
//!
//! What budgets count: one token per 4 bytes of output (rounded up), reported per chunk by
//! a paced `/slow`, at the end of every other reply; a tool call it makes counts as one.

use std::time::Duration;

use tokio::time::sleep;
use uuid::Uuid;

use serde_json::{Value, json};

use super::{
    Agent, AgentError, AgentEvent, BoxFuture, ClientToolCall, EventSink, PermissionOption,
    PermissionRequest, SinkClosed, ToolAnswer, Turn, TurnEnd,
};
use crate::protocol::input::{Message, Tool};

/// Upper bound on `/slow N` so a typo cannot pin a run for hours.
const MAX_SLOW_CHUNKS: u64 = 100_000;
/// Upper bound on `/slow N MS`.
const MAX_SLOW_INTERVAL_MS: u64 = 60_000;

/// The demo agent. Stateless: every turn reads only its input.
#[derive(Debug, Default, Clone)]
pub struct DemoAgent;

/// What the last user message asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Echo(String),
    Slow {
        chunks: u64,
        interval: Duration,
    },
    Think(String),
    Todo(Vec<String>),
    Tool {
        name: String,
        arguments: String,
    },
    Approve(String),
    Usage,
    Fail(String),
    /// Show a component: its name and props (JSON text).
    Ui {
        component: String,
        props: String,
    },
}

impl Command {
    fn parse(text: &str) -> Command {
        let trimmed = text.trim();
        let (head, rest) = match trimmed.split_once(char::is_whitespace) {
            Some((head, rest)) => (head, rest.trim()),
            None => (trimmed, ""),
        };
        match head {
            "/slow" => {
                let mut words = rest.split_whitespace();
                let chunks = words.next().and_then(|w| w.parse::<u64>().ok());
                let interval = words.next().map(|w| w.parse::<u64>().ok());
                match (chunks, interval) {
                    (Some(chunks), None) => Command::Slow {
                        chunks: chunks.min(MAX_SLOW_CHUNKS),
                        interval: Duration::from_millis(100),
                    },
                    (Some(chunks), Some(Some(ms))) => Command::Slow {
                        chunks: chunks.min(MAX_SLOW_CHUNKS),
                        interval: Duration::from_millis(ms.min(MAX_SLOW_INTERVAL_MS)),
                    },
                    _ => Command::Echo(trimmed.to_owned()),
                }
            }
            "/think" => Command::Think(rest.to_owned()),
            "/todo" => Command::Todo(
                rest.split(';')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
            "/tool" => {
                let (name, arguments) = match rest.split_once(char::is_whitespace) {
                    Some((name, json)) => (name, json.trim()),
                    None => (rest, "{}"),
                };
                if name.is_empty() {
                    Command::Echo(trimmed.to_owned())
                } else {
                    Command::Tool {
                        name: name.to_owned(),
                        arguments: if arguments.is_empty() {
                            "{}"
                        } else {
                            arguments
                        }
                        .to_owned(),
                    }
                }
            }
            "/approve" => Command::Approve(if rest.is_empty() {
                "the demo action".to_owned()
            } else {
                rest.to_owned()
            }),
            "/usage" => Command::Usage,
            "/ui" => match rest.split_once(char::is_whitespace) {
                Some((component, props)) => Command::Ui {
                    component: component.to_owned(),
                    props: props.trim().to_owned(),
                },
                None if !rest.is_empty() => Command::Ui {
                    component: rest.to_owned(),
                    props: "{}".to_owned(),
                },
                None => Command::Echo(trimmed.to_owned()),
            },
            "/fail" => Command::Fail(if rest.is_empty() {
                "demo failure".to_owned()
            } else {
                rest.to_owned()
            }),
            _ => Command::Echo(trimmed.to_owned()),
        }
    }
}

impl Agent for DemoAgent {
    fn features(&self) -> super::Features {
        super::Features {
            kind: "demo",
            input: Some(super::InputKinds::default()),
            reasoning: Some(true),
            runs_code: Some(false),
            subagents: Some(false),
            ..super::Features::default()
        }
    }

    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        let text = last_user_text(&turn.messages).unwrap_or_default();
        let cancel = turn.cancel.clone();
        // Each command's own future, boxed, holding only what it uses: a run that waits
        // (`/slow`) keeps neither the turn nor room for the largest command.
        let work: BoxFuture<Result<(), SinkClosed>> = match Command::parse(&text) {
            Command::Echo(text) => {
                Box::pin(async move { reply(&sink, &format!("You said: {text}")).await })
            }
            Command::Slow { chunks, interval } => {
                Box::pin(async move { slow(&sink, chunks, interval).await })
            }
            Command::Think(text) => Box::pin(async move { think(&sink, &text).await }),
            Command::Todo(items) => Box::pin(async move { todo(&sink, &items).await }),
            Command::Tool { name, arguments } => {
                let tools = turn.tools;
                Box::pin(async move { tool(&sink, &tools, &name, &arguments).await })
            }
            Command::Approve(action) => Box::pin(async move { approve(&sink, &action).await }),
            Command::Usage => {
                let messages = turn.messages;
                Box::pin(async move { usage(&sink, &messages).await })
            }
            Command::Ui { component, props } => {
                Box::pin(async move { ui(&sink, &component, &props).await })
            }
            Command::Fail(message) => {
                return Box::pin(async move {
                    Err(AgentError::Failed {
                        code: "AGENT_ERROR".to_owned(),
                        message,
                    })
                });
            }
        };
        Box::pin(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => Ok(TurnEnd::Cancelled),
                done = work => match done {
                    Ok(()) => Ok(TurnEnd::Finished {
                        result: None,
                        usage: Vec::new(),
                    }),
                    // The pump stopped listening: the run is over either way.
                    Err(SinkClosed) => Ok(TurnEnd::Cancelled),
                },
            }
        })
    }
}

fn last_user_text(messages: &[Message]) -> Option<String> {
    messages.iter().rev().find_map(|m| match m {
        Message::User(user) => Some(user.content.text()),
        _ => None,
    })
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4())
}

/// Streams `text` as one assistant message, a word per delta.
async fn reply(sink: &EventSink, text: &str) -> Result<(), SinkClosed> {
    let message_id = new_id("msg");
    sink.send(AgentEvent::TextStart {
        message_id: message_id.clone(),
    })
    .await?;
    for delta in text.split_inclusive(' ') {
        sink.send(AgentEvent::TextDelta {
            message_id: message_id.clone(),
            delta: delta.to_owned(),
        })
        .await?;
    }
    sink.send(AgentEvent::TextEnd { message_id }).await?;
    sink.report_usage(tokens(text)).await
}

/// The tokens the demo agent counts for `text`: one per 4 bytes, rounded up.
fn tokens(text: &str) -> u64 {
    text.len().div_ceil(4) as u64
}

async fn slow(sink: &EventSink, chunks: u64, interval: Duration) -> Result<(), SinkClosed> {
    let message_id = new_id("msg");
    sink.send(AgentEvent::TextStart {
        message_id: message_id.clone(),
    })
    .await?;
    // Paced chunks report their tokens as they go; unpaced ones once, at the end.
    let mut unreported = 0;
    for i in 1..=chunks {
        if i > 1 {
            if interval.is_zero() {
                // Unpaced: let others run, without waiting for the timer's next tick.
                tokio::task::yield_now().await;
            } else {
                sleep(interval).await;
            }
        }
        let delta = format!("chunk {i}/{chunks}\n");
        unreported += tokens(&delta);
        sink.send(AgentEvent::TextDelta {
            message_id: message_id.clone(),
            delta,
        })
        .await?;
        if !interval.is_zero() {
            sink.report_usage(std::mem::take(&mut unreported)).await?;
        }
    }
    sink.send(AgentEvent::TextEnd { message_id }).await?;
    sink.report_usage(unreported).await
}

async fn think(sink: &EventSink, text: &str) -> Result<(), SinkClosed> {
    let reasoning_id = new_id("reasoning");
    sink.send(AgentEvent::ReasoningStart {
        message_id: reasoning_id.clone(),
    })
    .await?;
    for delta in ["Thinking about: ", text] {
        sink.send(AgentEvent::ReasoningDelta {
            message_id: reasoning_id.clone(),
            delta: delta.to_owned(),
        })
        .await?;
    }
    sink.send(AgentEvent::ReasoningEnd {
        message_id: reasoning_id,
    })
    .await?;
    reply(sink, &format!("I thought about: {text}")).await
}

async fn todo(sink: &EventSink, items: &[String]) -> Result<(), SinkClosed> {
    let todos: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({
                "content": content,
                "status": if i == 0 { "in_progress" } else { "pending" },
                "priority": "medium",
            })
        })
        .collect();
    sink.set_state("/todos", Value::Array(todos)).await?;
    reply(sink, &format!("Todo list set: {} items", items.len())).await
}

async fn tool(
    sink: &EventSink,
    tools: &[Tool],
    name: &str,
    arguments: &str,
) -> Result<(), SinkClosed> {
    if !tools.iter().any(|t| t.name == name) {
        return reply(
            sink,
            &format!("Tool {name} is not available in this client"),
        )
        .await;
    }
    if serde_json::from_str::<Value>(arguments).is_err() {
        return reply(sink, &format!("Tool {name} needs JSON arguments")).await;
    }
    let answer = sink
        .call_client_tool(ClientToolCall {
            tool_call_id: new_id("call"),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        })
        .await?;
    match answer {
        ToolAnswer::Result(content) => {
            reply(sink, &format!("Tool {name} returned: {content}")).await
        }
        ToolAnswer::Error(why) => reply(sink, &format!("Tool {name} failed: {why}")).await,
    }
}

async fn approve(sink: &EventSink, action: &str) -> Result<(), SinkClosed> {
    // The action is a server-side tool call the person is asked about.
    let tool_call_id = new_id("action");
    sink.send(AgentEvent::ToolCallStart {
        tool_call_id: tool_call_id.clone(),
        name: "demo_action".to_owned(),
        parent_message_id: None,
    })
    .await?;
    sink.send(AgentEvent::ToolCallArgs {
        tool_call_id: tool_call_id.clone(),
        delta: json!({"action": action}).to_string(),
    })
    .await?;
    sink.send(AgentEvent::ToolCallEnd {
        tool_call_id: tool_call_id.clone(),
    })
    .await?;
    let options = vec![
        PermissionOption {
            option_id: "allow".to_owned(),
            name: "Allow".to_owned(),
            kind: "allow_once".to_owned(),
        },
        PermissionOption {
            option_id: "deny".to_owned(),
            name: "Deny".to_owned(),
            kind: "reject_once".to_owned(),
        },
    ];
    let outcome = sink
        .request_permission(PermissionRequest {
            title: format!("Allow the demo agent to {action}?"),
            tool_call_id: Some(tool_call_id.clone()),
            tool_call: None,
            options: options.clone(),
        })
        .await?;
    let allowed = outcome.allows(&options);
    sink.send(AgentEvent::ToolCallResult {
        tool_call_id,
        message_id: new_id("result"),
        content: if allowed { "approved" } else { "denied" }.to_owned(),
    })
    .await?;
    let verdict = if allowed { "Approved" } else { "Denied" };
    reply(sink, &format!("{verdict}: {action}")).await
}

async fn usage(sink: &EventSink, messages: &[crate::protocol::Message]) -> Result<(), SinkClosed> {
    // Deterministic: a token is four bytes of transcript.
    let input: usize = messages
        .iter()
        .map(|m| serde_json::to_string(m).map(|s| s.len()).unwrap_or(0))
        .sum::<usize>()
        / 4;
    let output = 12;
    sink.set_state(
        "/usage",
        json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output}),
    )
    .await?;
    reply(
        sink,
        &format!("Usage: {input} input tokens, {output} output tokens"),
    )
    .await
}

/// `/ui COMPONENT JSON`: shows the component, or says why it was refused.
async fn ui(sink: &EventSink, component: &str, props: &str) -> Result<(), SinkClosed> {
    let props: Value = match serde_json::from_str(props) {
        Ok(props) => props,
        Err(error) => {
            return reply(
                sink,
                &format!("UI refused: the props are not JSON: {error}"),
            )
            .await;
        }
    };
    match sink.show_ui(component, props).await? {
        Ok(()) => reply(sink, &format!("Showed {component}")).await,
        Err(reason) => reply(sink, &format!("UI refused: {reason}")).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(Command::parse("hello"), Command::Echo("hello".into()));
        assert_eq!(
            Command::parse("/slow 3 50"),
            Command::Slow {
                chunks: 3,
                interval: Duration::from_millis(50)
            }
        );
        assert_eq!(
            Command::parse("/slow 20"),
            Command::Slow {
                chunks: 20,
                interval: Duration::from_millis(100)
            }
        );
        assert_eq!(Command::parse("/slow x"), Command::Echo("/slow x".into()));
        assert_eq!(Command::parse("/think why"), Command::Think("why".into()));
        assert_eq!(Command::parse("/fail boom"), Command::Fail("boom".into()));
        assert_eq!(
            Command::parse("/fail"),
            Command::Fail("demo failure".into())
        );
    }
}
