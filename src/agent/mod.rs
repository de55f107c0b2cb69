//! The backend seam: what an agent runtime must do to be served over AG-UI.
//!
//! An [`Agent`] receives a [`Turn`] (what the client sent, already decoded) and reports what
//! happens through an [`EventSink`] as domain [`AgentEvent`]s. It knows nothing of AG-UI's
//! lifecycle rules, SSE or HTTP: the runtime's translator turns these events into a valid
//! AG-UI stream (opening, closing and de-duplicating as needed), so a backend cannot produce
//! a stream the official clients reject.
//!
//! Implementations: [`demo::DemoAgent`] (built in, deterministic). The ACP backend implements
//! the same trait.

pub mod demo;

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::protocol::input::{Context, Message, Tool};

/// A boxed, sendable future: what [`Agent::run`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One agent backend.
pub trait Agent: Send + Sync + 'static {
    /// Runs one turn to completion, reporting through `sink`.
    ///
    /// The future must end promptly once `turn.cancel` fires. An `Err` becomes a
    /// `RUN_ERROR` whose message is sanitized before it reaches the client.
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>>;
}

/// What the client sent for one run, decoded.
#[derive(Debug, Clone)]
pub struct Turn {
    pub thread_id: String,
    pub run_id: String,
    /// The whole transcript as the client sent it.
    pub messages: Vec<Message>,
    /// Only the messages this agent has not seen before (what to forward to an agent that
    /// keeps its own history).
    pub new_messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub context: Vec<Context>,
    /// `RunAgentInput.state`, if any.
    pub client_state: Option<Value>,
    pub cancel: CancellationToken,
}

/// How a turn ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// The agent is done; `result` is passed on as `RUN_FINISHED.result`.
    Finished { result: Option<Value> },
    /// The agent stopped because it was cancelled.
    Cancelled,
}

/// A failed turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The agent reported a failure; the message is shown to the client (sanitized).
    #[error("{message}")]
    Failed { code: String, message: String },
    /// The backend itself broke (process died, protocol error).
    #[error("agent backend error: {0}")]
    Backend(String),
}

/// Something the agent did, in domain terms. Ids are the agent's; the translator keeps them
/// when they are valid AG-UI ids and guarantees the AG-UI lifecycle around them.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    TextStart {
        message_id: String,
    },
    TextDelta {
        message_id: String,
        delta: String,
    },
    TextEnd {
        message_id: String,
    },
    ReasoningStart {
        message_id: String,
    },
    ReasoningDelta {
        message_id: String,
        delta: String,
    },
    ReasoningEnd {
        message_id: String,
    },
    ToolCallStart {
        tool_call_id: String,
        name: String,
        parent_message_id: Option<String>,
    },
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    ToolCallResult {
        tool_call_id: String,
        message_id: String,
        content: String,
    },
    StepStarted {
        name: String,
    },
    StepFinished {
        name: String,
    },
    Custom {
        name: String,
        value: Value,
    },
}

/// Where an agent reports its events. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<AgentEvent>,
}

/// The run this sink fed has ended; nobody is listening any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the run has ended")]
pub struct SinkClosed;

impl EventSink {
    /// A sink and the receiving end the runtime's pump reads.
    pub fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<AgentEvent>) {
        let (tx, rx) = mpsc::channel(capacity);
        (EventSink { tx }, rx)
    }

    /// Reports one event, waiting while the pump is behind (backpressure).
    pub async fn send(&self, event: AgentEvent) -> Result<(), SinkClosed> {
        self.tx.send(event).await.map_err(|_| SinkClosed)
    }
}
