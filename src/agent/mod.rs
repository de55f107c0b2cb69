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

pub mod acp;
pub mod demo;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::protocol::InputError;
use crate::protocol::events::TokenUsage;
use crate::protocol::input::{Context, Message, RunAgentInput, Tool};

/// A boxed, sendable future: what [`Agent::run`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One agent backend.
pub trait Agent: Send + Sync + 'static {
    /// Runs one turn to completion, reporting through `sink`.
    ///
    /// The future must end promptly once `turn.cancel` fires. An `Err` becomes a
    /// `RUN_ERROR` whose message is sanitized before it reaches the client.
    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>>;

    /// Checks what only this backend reads in a run request (`forwardedProps` settings),
    /// before any stream starts: an error is a 400 naming the field.
    fn check_input(&self, input: &RunAgentInput) -> Result<(), InputError> {
        let _ = input;
        Ok(())
    }

    /// Checks the messages a new turn brings (`new`: those the thread has not seen, each
    /// with its index in the request's `messages`) for what this backend cannot pass on,
    /// before any stream starts: an error is a 400 naming the field
    /// (`messages[2].content[1]`). What it cannot know yet here, the turn refuses itself.
    fn check_new_messages(&self, new: &[(usize, &Message)]) -> Result<(), InputError> {
        let _ = new;
        Ok(())
    }

    /// What the agent can take and do, as far as the backend knows now (`/info`).
    fn features(&self) -> Features {
        Features::default()
    }

    /// What a confined agent may reach beyond its sandbox, by name (`/info`): its model
    /// relays' hosts, its egress rules, the host's loopback ports. Never a secret.
    fn reach(&self) -> Option<serde_json::Value> {
        None
    }

    /// Whether the backend can serve runs as far as it knows (`/readyz`).
    fn ready(&self) -> bool {
        true
    }

    /// What the backend last learned about its agent (`GET {path}/agents`).
    fn status(&self) -> AgentStatus {
        if self.ready() {
            AgentStatus::ready()
        } else {
            AgentStatus::new(AgentState::Unavailable, "the agent cannot be started")
        }
    }

    /// The thread was deleted: release what the backend holds for it (an agent session).
    fn forget_thread(&self, thread_id: &str) -> BoxFuture<()> {
        let _ = thread_id;
        Box::pin(async {})
    }

    /// New input for thread `thread_key`'s running turn, now (steering): `Ok` when the
    /// agent took it into that turn, else why not (the runtime then falls back to the
    /// agent's `enqueue` or `interrupt` strategy).
    fn steer(&self, thread_key: &str, messages: Vec<Message>) -> BoxFuture<Result<(), String>> {
        let _ = (thread_key, messages);
        Box::pin(async { Err("the agent takes no input while a turn runs".to_owned()) })
    }

    /// Thread `thread_key` was rewound: the agent's session no longer matches its
    /// transcript. The backend lets the session go; the thread's next turn starts a new one
    /// (given the kept transcript as [`Turn::messages`]).
    fn let_session_go(&self, thread_key: &str) -> BoxFuture<()> {
        let _ = thread_key;
        Box::pin(async {})
    }

    /// The workspace of thread `thread_key` (its directory, whether made yet or not) and
    /// the agent's workspace settings; `None` for an agent without workspaces.
    fn workspace(
        &self,
        thread_key: &str,
    ) -> Option<(std::path::PathBuf, crate::workspace::Workspaces)> {
        let _ = thread_key;
        None
    }

    /// A run on thread `thread_key`, whose agent session `session_id` is stored, was just
    /// admitted: a backend that must restore that session (after a restart) may start now,
    /// while the run is set up. Returns at once.
    fn prepare(&self, thread_key: &str, session_id: &str) {
        let _ = (thread_key, session_id);
    }

    /// How many of the agent's most recently active threads (active within the duration)
    /// the backend wants to [`warm_up`](Agent::warm_up) at start-up; `None`: none.
    fn warm_threads(&self) -> Option<(usize, std::time::Duration)> {
        None
    }

    /// Called once at start-up, in the daemon's runtime: the backend makes ahead what it
    /// keeps warm. `recent`: its most recently active threads, newest first, as
    /// [`warm_threads`](Agent::warm_threads) asked, each `(thread key, session id)`.
    fn warm_up(&self, recent: Vec<(String, String)>) {
        let _ = recent;
    }

    /// Stops whatever the backend runs (end of shutdown, after every run has ended).
    fn shutdown(&self) -> BoxFuture<()> {
        Box::pin(async {})
    }

    /// The processes the backend runs, for the metrics; `None` when it runs none (the
    /// demo agent runs in the daemon).
    fn processes(&self) -> Option<Processes> {
        None
    }

    /// The agent's own sessions, a page at a time (`GET {path}/agents/{agent}/sessions`).
    fn list_sessions(
        &self,
        cursor: Option<String>,
    ) -> BoxFuture<Result<SessionPage, SessionError>> {
        let _ = cursor;
        Box::pin(async { Err(SessionError::unsupported("keeps no sessions to list")) })
    }

    /// Opens one of the agent's sessions for the new thread `thread_id` and returns its
    /// history as messages (the thread's transcript).
    fn import_session(
        &self,
        thread_id: &str,
        session_id: &str,
    ) -> BoxFuture<Result<Vec<Message>, SessionError>> {
        let _ = (thread_id, session_id);
        Box::pin(async { Err(SessionError::unsupported("keeps no sessions to import")) })
    }

    /// Forks the session of thread `thread_id` (`session_id`, as stored) for the new thread
    /// `new_thread_id`; returns the new session's id.
    fn fork_session(
        &self,
        thread_id: &str,
        session_id: Option<&str>,
        new_thread_id: &str,
    ) -> BoxFuture<Result<String, SessionError>> {
        let _ = (thread_id, session_id, new_thread_id);
        Box::pin(async { Err(SessionError::unsupported("cannot fork sessions")) })
    }
}

/// What an agent can take and do, as its backend knows it (`GET {path}/info` shows it in
/// the AG-UI SDK's capability shape). `None`: not known (yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// What runs it: `demo`, `acp`.
    pub kind: &'static str,
    /// Who made it and its version, as it says (an ACP agent's `agentInfo`).
    pub made_by: Option<(String, Option<String>)>,
    /// The kinds of input besides text it takes.
    pub input: Option<InputKinds>,
    /// Whether it shows its reasoning.
    pub reasoning: Option<bool>,
    /// Whether it runs code (commands, scripts) itself.
    pub runs_code: Option<bool>,
    /// Whether it runs sub-agents.
    pub subagents: Option<bool>,
}

/// The kinds of input besides text an agent takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputKinds {
    pub image: bool,
    pub audio: bool,
    /// Documents and other files (as embedded resources).
    pub file: bool,
}

/// One of an agent's own sessions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    pub session_id: String,
    pub cwd: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// RFC 3339, as the agent reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// A page of an agent's sessions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    pub sessions: Vec<SessionSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Why a session operation (list, import, fork) did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The agent does not offer it.
    #[error("the agent {0}")]
    Unsupported(String),
    /// The agent has no such session.
    #[error("{0}")]
    NotFound(String),
    /// The session is already a live thread's.
    #[error("{0}")]
    InUse(String),
    /// The agent failed (cannot start, or answered with an error); the message is shown to
    /// the client after sanitizing.
    #[error("{0}")]
    Failed(String),
}

impl SessionError {
    pub fn unsupported(what: &str) -> SessionError {
        SessionError::Unsupported(what.to_owned())
    }
}

/// A backend's processes by state (see [`Agent::processes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Processes {
    /// Serving at least one turn.
    pub busy: usize,
    /// Alive and serving none.
    pub idle: usize,
}

/// An agent's last known state, as `GET {path}/agents` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub state: AgentState,
    /// What is wrong and what to do, in our own words (never the agent's error text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For [`AgentState::AuthRequired`]: the ways the agent offers to authenticate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auth_methods: Vec<AuthMethod>,
    /// Spares ready for new threads, every principal's (an agent that keeps spares).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spares: Option<usize>,
    /// The limits its processes hit since the daemon started (none: left out).
    #[serde(skip_serializing_if = "Breaches::is_none")]
    pub breaches: Breaches,
    /// Its egress proxies' decisions since the daemon started, and the last refusal (none:
    /// left out).
    #[serde(skip_serializing_if = "crate::egress::EgressCount::is_none")]
    pub egress: crate::egress::EgressCount,
}

/// How often an agent's processes hit each of their limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Breaches {
    /// Killed at their memory limit.
    pub memory: u64,
    /// Turns in which a fork was refused at the process limit.
    pub processes: u64,
    /// Turns ended, or processes stopped, at the workspace quota.
    pub quota: u64,
}

impl Breaches {
    pub fn is_none(&self) -> bool {
        *self == Breaches::default()
    }
}

impl AgentStatus {
    pub fn ready() -> AgentStatus {
        AgentStatus {
            state: AgentState::Ready,
            detail: None,
            auth_methods: Vec::new(),
            spares: None,
            breaches: Breaches::default(),
            egress: crate::egress::EgressCount::default(),
        }
    }

    pub fn new(state: AgentState, detail: &str) -> AgentStatus {
        AgentStatus {
            state,
            detail: Some(detail.to_owned()),
            auth_methods: Vec::new(),
            spares: None,
            breaches: Breaches::default(),
            egress: crate::egress::EgressCount::default(),
        }
    }
}

/// An agent's state: only `Ready` counts as ready for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Ready,
    /// Its command is missing, or its process does not start or initialize.
    Unavailable,
    /// It refuses sessions or prompts until it has credentials.
    AuthRequired,
    /// Its processes keep exiting in the middle of turns.
    CrashLoop,
}

/// One way an agent offers to authenticate (from its `initialize` answer).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthMethod {
    pub id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What the client sent for one run, decoded.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The thread's key: unique across every principal's namespace (see
    /// [`crate::access::scoped_key`]), so a backend may key its sessions by it.
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
    /// `RunAgentInput.forwardedProps`, if any (settings a backend documents, such as an
    /// ACP agent's mode).
    pub forwarded_props: Option<Value>,
    /// The agent session this thread was last bound to (from the store), if any.
    pub session_id: Option<String>,
    /// The thread's shared state document when the turn started.
    pub document: Value,
    /// Every tool-call id the thread's transcript already holds. A backend whose agent
    /// reuses ids across turns renames a colliding call, so ids stay unique per thread.
    pub tool_call_ids: HashSet<String>,
    pub cancel: CancellationToken,
}

/// How a turn ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// The agent is done; `result` is passed on as `RUN_FINISHED.result`, `usage` (the
    /// turn's token counts, when the agent reported them) as `RUN_FINISHED.usage`.
    Finished {
        result: Option<Value>,
        usage: Vec<TokenUsage>,
    },
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
/// and guarantees the AG-UI lifecycle around them.
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
    /// A text message of a subagent (started with [`AgentEvent::SubagentStarted`]); its
    /// deltas and end are [`AgentEvent::TextDelta`] / [`AgentEvent::TextEnd`].
    SubagentTextStart {
        subagent_run_id: String,
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
    /// A component to show, already allowed by the catalog (the runtime makes these from
    /// [`EventSink::show_ui`]; agents do not send them themselves).
    Activity {
        message_id: String,
        activity_type: String,
        content: Value,
    },
    /// An activity shown while it changes, not kept in the transcript (a running
    /// command's output): its first state. Its last state is sent as an
    /// [`AgentEvent::Activity`] with the same id, which is kept.
    ActivityLive {
        message_id: String,
        activity_type: String,
        content: Value,
    },
    /// A change (RFC 6902 operations) to an [`AgentEvent::ActivityLive`].
    ActivityDelta {
        message_id: String,
        activity_type: String,
        patch: Value,
    },
    /// A subagent (a child agent run inside this one) started; `subagent_run_id` names it
    /// until it finishes.
    SubagentStarted {
        subagent_run_id: String,
        name: String,
        description: Option<String>,
    },
    SubagentFinished {
        subagent_run_id: String,
    },
    SubagentError {
        subagent_run_id: String,
        message: String,
    },
}

/// A call of a tool that runs in the browser (`RunAgentInput.tools`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientToolCall {
    pub tool_call_id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// What the browser answered to a frontend tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolAnswer {
    /// The tool message's content (text).
    Result(String),
    /// No usable answer: the wait failed closed (timeout, cancel, new input instead, or
    /// the client marked it an error). The message says why.
    Error(String),
}

/// One option of a permission request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    pub option_id: String,
    pub name: String,
    /// `allow_once`, `allow_always`, `reject_once` or `reject_always`.
    pub kind: String,
}

/// An agent asking a person before it acts.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionRequest {
    pub title: String,
    /// The agent's own tool call this permission is about (already opened on the stream).
    pub tool_call_id: Option<String>,
    /// What that call is about, for the person to judge: `{"name","kind"?,"input"?,
    /// "diff"?:[{"path","oldText","newText"}]}`.
    pub tool_call: Option<Value>,
    pub options: Vec<PermissionOption>,
}

/// A person's answer to a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionOutcome {
    /// An option was chosen.
    Selected { option_id: String },
    /// Nobody chose: fail closed (timeout, cancel, new input instead, malformed answer).
    Denied { reason: String },
}

impl PermissionOutcome {
    /// Whether the chosen option allows the action (its kind starts with `allow`).
    pub fn allows(&self, options: &[PermissionOption]) -> bool {
        match self {
            PermissionOutcome::Selected { option_id } => options
                .iter()
                .any(|o| &o.option_id == option_id && o.kind.starts_with("allow")),
            PermissionOutcome::Denied { .. } => false,
        }
    }
}

/// An agent asking a person to fill in a form (ACP form elicitation).
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest {
    /// What the agent asks, for the person.
    pub message: String,
    /// The form: a JSON Schema object whose properties are strings, numbers, integers,
    /// booleans or arrays of strings.
    pub schema: Value,
    /// The agent's own tool call this question is about (already on the stream), if any.
    pub tool_call_id: Option<String>,
}

/// A person's answer to an [`InputRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum InputAnswer {
    /// The form's values, checked against its schema.
    Accepted(serde_json::Map<String, Value>),
    /// The person said no.
    Declined,
    /// No usable answer: fail closed (timeout, cancel, new input instead, malformed).
    Cancelled { reason: String },
}

/// What the pump receives from an agent: events, state changes, and waits on the client.
#[derive(Debug)]
pub(crate) enum SinkItem {
    Event(AgentEvent),
    /// Sets the value at a JSON pointer of the thread's shared state document.
    State {
        pointer: String,
        value: Value,
    },
    /// The agent session now bound to the thread, and how it was obtained.
    Session {
        id: String,
        how: String,
    },
    /// A title for the thread (shown by the thread API).
    Title(String),
    /// Tokens the agent says it has spent since its last report (what budgets count).
    Usage {
        tokens: u64,
    },
    Tool {
        call: ClientToolCall,
        reply: oneshot::Sender<ToolAnswer>,
    },
    Permission {
        request: PermissionRequest,
        reply: oneshot::Sender<PermissionOutcome>,
    },
    Input {
        request: InputRequest,
        reply: oneshot::Sender<InputAnswer>,
    },
    /// A component to show (generative UI); the reply says whether the catalog took it.
    Ui {
        component: String,
        props: Value,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// Where an agent reports its events. Cheap to clone.
///
/// The channel carries boxed items: a bounded channel allocates its first block of slots
/// up front, and a block of pointers is a sixteenth of a block of items (a run that sits
/// idle holds one).
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Box<SinkItem>>,
}

/// The run this sink fed has ended; nobody is listening any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the run has ended")]
pub struct SinkClosed;

impl EventSink {
    /// A sink and the receiving end the runtime's pump reads.
    pub(crate) fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<Box<SinkItem>>) {
        let (tx, rx) = mpsc::channel(capacity);
        (EventSink { tx }, rx)
    }

    /// Hands `item` to the pump, waiting while it is behind.
    async fn put(&self, item: SinkItem) -> Result<(), SinkClosed> {
        self.tx.send(Box::new(item)).await.map_err(|_| SinkClosed)
    }

    /// Reports one event, waiting while the pump is behind (backpressure).
    pub async fn send(&self, event: AgentEvent) -> Result<(), SinkClosed> {
        self.put(SinkItem::Event(event)).await
    }

    /// Shows `component` with `props` (generative UI): `Ok(Err(reason))` when the
    /// daemon's catalog refuses it (unknown component, props too large or not matching the
    /// component's schema); then nothing reached the client.
    pub async fn show_ui(
        &self,
        component: &str,
        props: Value,
    ) -> Result<Result<(), String>, SinkClosed> {
        let (reply, answer) = oneshot::channel();
        self.put(SinkItem::Ui {
            component: component.to_owned(),
            props,
            reply,
        })
        .await?;
        answer.await.map_err(|_| SinkClosed)
    }

    /// Sets the value at `pointer` (RFC 6901) of the thread's shared state; the client gets
    /// it as a `STATE_DELTA`.
    pub async fn set_state(&self, pointer: &str, value: Value) -> Result<(), SinkClosed> {
        self.put(SinkItem::State {
            pointer: pointer.to_owned(),
            value,
        })
        .await
    }

    /// Reports `tokens` spent since the last report (the model's input and output), for
    /// budgets; nothing reaches the client.
    pub async fn report_usage(&self, tokens: u64) -> Result<(), SinkClosed> {
        if tokens == 0 {
            return Ok(());
        }
        self.put(SinkItem::Usage { tokens }).await
    }

    /// Binds the thread to an agent session (persisted; shown in state as `session`).
    pub async fn set_session(&self, id: &str, how: &str) -> Result<(), SinkClosed> {
        self.put(SinkItem::Session {
            id: id.to_owned(),
            how: how.to_owned(),
        })
        .await
    }

    /// Names the thread (the agent's own session title).
    pub async fn set_title(&self, title: &str) -> Result<(), SinkClosed> {
        self.put(SinkItem::Title(title.to_owned())).await
    }

    /// Calls a frontend tool and waits for the browser's answer. The stream carries the
    /// call, the segment ends, and the run waits (suspended) until a later request answers
    /// it, or fails closed with [`ToolAnswer::Error`].
    pub async fn call_client_tool(&self, call: ClientToolCall) -> Result<ToolAnswer, SinkClosed> {
        let (reply, answer) = oneshot::channel();
        self.put(SinkItem::Tool { call, reply }).await?;
        answer.await.map_err(|_| SinkClosed)
    }

    /// Asks a person for permission and waits, like [`EventSink::call_client_tool`]; fails
    /// closed with [`PermissionOutcome::Denied`].
    pub async fn request_permission(
        &self,
        request: PermissionRequest,
    ) -> Result<PermissionOutcome, SinkClosed> {
        let (reply, answer) = oneshot::channel();
        self.put(SinkItem::Permission { request, reply }).await?;
        answer.await.map_err(|_| SinkClosed)
    }

    /// Asks a person to fill in a form and waits, like [`EventSink::request_permission`];
    /// fails closed with [`InputAnswer::Cancelled`].
    pub async fn request_input(&self, request: InputRequest) -> Result<InputAnswer, SinkClosed> {
        let (reply, answer) = oneshot::channel();
        self.put(SinkItem::Input { request, reply }).await?;
        answer.await.map_err(|_| SinkClosed)
    }
}

/// What new input does to a thread whose run is live (and not waiting on the client).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Multitask {
    /// Refused: 409 `RUN_IN_PROGRESS` with the live run's id.
    #[default]
    Reject,
    /// The live run is cancelled and the new input starts a run of its own.
    Interrupt,
    /// The input waits in the thread's queue and runs, as a run of its own, once the runs
    /// before it have ended.
    Enqueue,
    /// The input goes to the running turn now, where the agent takes input mid-turn;
    /// else it falls back to `interrupt` (when that is the agent's strategy) or `enqueue`.
    Steer,
}

impl Multitask {
    pub fn name(self) -> &'static str {
        match self {
            Multitask::Reject => "reject",
            Multitask::Interrupt => "interrupt",
            Multitask::Enqueue => "enqueue",
            Multitask::Steer => "steer",
        }
    }

    /// What applies to a request: only new input may interrupt or wait its turn (a
    /// `resume[]` alone, with nothing waiting for it, is refused).
    pub fn when(self, new_input: bool) -> Multitask {
        if new_input { self } else { Multitask::Reject }
    }

    /// The strategy `name` stands for.
    pub fn from_name(name: &str) -> Result<Multitask, String> {
        match name {
            "reject" => Ok(Multitask::Reject),
            "interrupt" => Ok(Multitask::Interrupt),
            "enqueue" => Ok(Multitask::Enqueue),
            "steer" => Ok(Multitask::Steer),
            other => Err(format!(
                "{other:?} is not a multitask strategy (reject, interrupt, enqueue or steer)"
            )),
        }
    }
}

/// Whose history a run follows when the request does not say
/// (`forwardedProps.agui.history`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum History {
    /// The stored history wins; the client's messages only add to it.
    #[default]
    Server,
    /// The messages a client sends are the conversation: where they part from the stored
    /// ones, the thread is rewound first (edit, regenerate).
    Client,
}

/// How a human-in-the-loop question reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hitl {
    /// A call of the frontend tool `agui_permission_request`.
    Tool,
    /// `RUN_FINISHED{outcome:{type:"interrupt"}}` answered by `resume[]` (AG-UI 1.0).
    Interrupt,
}
