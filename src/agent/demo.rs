//! The built-in `demo` agent: deterministic, no network, made to exercise the protocol.
//!
//! It reads the last user message:
//!
//! | message | behaviour |
//! |---|---|
//! | anything else | streams `You said: <text>` as several text deltas |
//! | `/slow N [MS]` | N numbered chunks, one every MS milliseconds (default 100) |
//! | `/think TEXT` | a reasoning block, then the reply |
//! | `/fail TEXT` | fails the turn with TEXT |

use std::time::Duration;

use tokio::time::sleep;
use uuid::Uuid;

use super::{Agent, AgentError, AgentEvent, BoxFuture, EventSink, SinkClosed, Turn, TurnEnd};
use crate::protocol::input::Message;

/// Upper bound on `/slow N` so a typo cannot pin a run for hours.
const MAX_SLOW_CHUNKS: u64 = 10_000;
/// Upper bound on `/slow N MS`.
const MAX_SLOW_INTERVAL_MS: u64 = 60_000;

/// The demo agent. Stateless: every turn reads only its input.
#[derive(Debug, Default, Clone)]
pub struct DemoAgent;

/// What the last user message asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Echo(String),
    Slow { chunks: u64, interval: Duration },
    Think(String),
    Fail(String),
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
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        Box::pin(async move {
            let text = last_user_text(&turn.messages).unwrap_or_default();
            let command = Command::parse(&text);
            let cancel = turn.cancel.clone();
            let work = async {
                match command {
                    Command::Echo(text) => reply(&sink, &format!("You said: {text}")).await,
                    Command::Slow { chunks, interval } => slow(&sink, chunks, interval).await,
                    Command::Think(text) => think(&sink, &text).await,
                    Command::Fail(message) => {
                        return Ok(Err(AgentError::Failed {
                            code: "AGENT_ERROR".to_owned(),
                            message,
                        }));
                    }
                }
                .map(|()| Ok(TurnEnd::Finished { result: None }))
            };
            tokio::select! {
                biased;
                () = cancel.cancelled() => Ok(TurnEnd::Cancelled),
                done = work => match done {
                    Ok(end) => end,
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
    sink.send(AgentEvent::TextEnd { message_id }).await
}

async fn slow(sink: &EventSink, chunks: u64, interval: Duration) -> Result<(), SinkClosed> {
    let message_id = new_id("msg");
    sink.send(AgentEvent::TextStart {
        message_id: message_id.clone(),
    })
    .await?;
    for i in 1..=chunks {
        if i > 1 {
            sleep(interval).await;
        }
        sink.send(AgentEvent::TextDelta {
            message_id: message_id.clone(),
            delta: format!("chunk {i}/{chunks}\n"),
        })
        .await?;
    }
    sink.send(AgentEvent::TextEnd { message_id }).await
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
