//! The ACP backend: any Agent Client Protocol agent (Claude Code, Codex, Gemini CLI, ...)
//! served through the [`Agent`] seam.
//!
//! Per configured agent: a pool of up to `pool_size` processes (`process.rs`), each hosting
//! many sessions; idle processes are stopped after `idle_ttl`. A thread maps to one ACP
//! session; after a restart (or on another process) the stored session is loaded with
//! `session/load` when the agent offers it, its replay swallowed (the transcript is already
//! in our store), else a new session starts and the thread's state says so.
//!
//! One turn = one `session/prompt`. Updates are translated as they arrive (`translate.rs`).
//! A permission request is answered at once (`permissions = "allow"|"deny"`, by option
//! kind) or becomes human in the loop (`"ask"`): the AG-UI segment ends while the ACP turn
//! stays blocked in `session/prompt`, and the answer from a later request is sent back as
//! the chosen `optionId`. Cancel sends `session/cancel`; a pending permission is answered
//! `cancelled`.
//!
//! A form the agent asks for (`elicitation/create`) waits on the client the same way, as
//! an `input_required` interrupt or an `agui_input_request` tool call. Before the prompt,
//! `forwardedProps.acp` may set the session's mode and config options; after it, the
//! turn's token usage (when the agent reports it) goes to `RUN_FINISHED.usage` and state.
//! Outside turns, the agent's own sessions can be listed, imported as threads
//! (`session/load`, the replay as transcript) and threads forked (`session/fork`).
//!
//! Input that never reached the agent (no session could be had, or the prompt was refused
//! with `AUTH_REQUIRED`) is kept per thread and sent first with the thread's next prompt,
//! so a message typed before the credentials were in place is not lost. A thread that has
//! never had a session has delivered nothing, so its first prompt carries the user
//! messages of the client's transcript: that also holds across a restart.

mod config;
mod elicit;
mod health;
mod launch;
mod mcp;
mod pool;
mod process;
mod sessions;
mod settings;
mod translate;
mod usage;
mod workdir;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::{
    CancelNotification, CloseSessionRequest, ContentBlock, CreateElicitationResponse,
    ElicitationAction, ImageContent, LoadSessionRequest, McpServer, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, ResumeSessionRequest, SelectedPermissionOutcome, StopReason,
    TextContent,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{
    Agent, AgentError, AgentEvent, AgentState, AgentStatus, AuthMethod, BoxFuture, ClientToolCall,
    EventSink, PermissionOption, PermissionOutcome, PermissionRequest, Processes, SessionError,
    SessionPage, SinkClosed, ToolAnswer, Turn, TurnEnd,
};
use crate::confine::Confinement;
use crate::protocol::InputError;
use crate::protocol::input::{
    BinaryPart, ContentPart, DataSource, MediaSource, Message, RunAgentInput,
};
use crate::sync::lock;
use crate::workspace::Workspaces;
pub use config::{AcpConfig, FrontendMcp, Permissions};
use elicit::elicitation;
pub use launch::AgentHost;
use launch::PoolKey;
pub use mcp::{FrontendTools, McpEndpoint, McpHost, McpListener};
use pool::Bound;
use process::{AcpProcess, Busy, PermissionResponder, SessionEvent};
use settings::{Settings, show_session_settings};
use translate::UpdateTranslator;
use usage::note_usage;

/// How long a cancelled prompt may take to answer before the turn gives up on it.
const CANCEL_WAIT: Duration = Duration::from_millis(1000);
/// How long `session/new`, `session/load` or `session/resume` may take (a real agent's
/// start of a session takes seconds; one that hangs must not hold the run).
const SESSION_WAIT: Duration = Duration::from_secs(120);

/// The answer to a session request of a turn, unless the turn is cancelled first (the run
/// ends as cancelled) or the agent takes longer than [`SESSION_WAIT`].
async fn session_answer<T>(
    cancel: &CancellationToken,
    method: &str,
    request: impl std::future::Future<Output = Result<T, agent_client_protocol::Error>>,
) -> Result<Result<T, agent_client_protocol::Error>, Stop> {
    tokio::select! {
        answer = tokio::time::timeout(SESSION_WAIT, request) => answer.map_err(|_| {
            Stop::Failed(AgentError::Failed {
                code: "AGENT_TIMEOUT".to_owned(),
                message: format!("{method} did not answer in {} s", SESSION_WAIT.as_secs()),
            })
        }),
        () = cancel.cancelled() => Err(Stop::Closed),
    }
}

/// Whether an agent command names a program that can be started (an executable path, or a
/// program on `PATH`).
pub fn command_found(command: &[String]) -> bool {
    launch::startable(command)
}

/// Runs `updates` (ACP `session/update` payloads) through the update translator as one
/// turn that offers `frontend_tools`, and closes it as a turn does; returns the agent events
/// it reported. The translation with no agent process: for the fuzz target `acp_update`.
#[doc(hidden)]
pub async fn translate_updates(updates: &[Value], frontend_tools: Vec<String>) -> Vec<AgentEvent> {
    let (sink, mut items) = EventSink::channel(64);
    let produce = async move {
        let mut translator = UpdateTranslator::default().with_frontend_tools(frontend_tools);
        for update in updates {
            if translator.apply(None, update, &sink).await.is_err() {
                return;
            }
        }
        let _ = translator.close(&sink).await;
    };
    let collect = async {
        let mut events = Vec::new();
        while let Some(item) = items.recv().await {
            if let crate::agent::SinkItem::Event(event) = *item {
                events.push(event);
            }
        }
        events
    };
    tokio::join!(produce, collect).1
}

/// One configured ACP agent.
pub struct AcpBackend {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    config: AcpConfig,
    host: AgentHost,
    /// Each thread's working directory, when the agent has workspaces.
    workspaces: Option<Workspaces>,
    /// The confinement in force, or why the agent cannot be started.
    confinement: Result<Confinement, String>,
    processes: Mutex<Vec<Arc<AcpProcess>>>,
    /// thread key -> its live session.
    sessions: Mutex<HashMap<String, Bound>>,
    /// thread id -> messages the agent has not received (their turn failed before it
    /// accepted the prompt).
    undelivered: Mutex<HashMap<String, Vec<Message>>>,
    /// thread id -> how its session came (`imported`, `forked`), for threads whose session
    /// was bound outside a turn: the thread's first turn shows it in the state.
    bound_outside: Mutex<HashMap<String, &'static str>>,
    spawning: tokio::sync::Mutex<()>,
    health: health::Health,
    reaper: AtomicBool,
    stopped: CancellationToken,
    /// The loopback MCP listener for frontend tools (started on first need).
    mcp: tokio::sync::OnceCell<Option<Arc<mcp::McpBridge>>>,
}

impl AcpBackend {
    pub fn new(name: &str, config: AcpConfig, host: AgentHost) -> AcpBackend {
        let confinement = crate::confine::in_force(config.confinement);
        match &confinement {
            Ok(Confinement::None) => tracing::warn!(
                agent = name,
                "confinement = \"none\": the agent can read the daemon's data directory and keys"
            ),
            Ok(confinement) => tracing::info!(
                agent = name,
                confinement = confinement.as_str(),
                "agent confined"
            ),
            Err(why) => tracing::error!(agent = name, %why, "the agent will not be started"),
        }
        AcpBackend {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                workspaces: config.workspace.clone().map(|w| Workspaces::new(name, w)),
                confinement,
                host,
                config,
                processes: Mutex::new(Vec::new()),
                sessions: Mutex::new(HashMap::new()),
                undelivered: Mutex::new(HashMap::new()),
                bound_outside: Mutex::new(HashMap::new()),
                spawning: tokio::sync::Mutex::new(()),
                health: health::Health::default(),
                reaper: AtomicBool::new(false),
                stopped: CancellationToken::new(),
                mcp: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// Number of running agent processes.
    pub fn process_count(&self) -> usize {
        let mut processes = lock(&self.inner.processes);
        processes.retain(|p| p.is_alive());
        processes.len()
    }
}

impl Agent for AcpBackend {
    fn processes(&self) -> Option<Processes> {
        let processes = lock(&self.inner.processes);
        let mut counts = Processes::default();
        for process in processes.iter().filter(|p| p.is_alive()) {
            if process.active.load(Ordering::Relaxed) > 0 {
                counts.busy += 1;
            } else {
                counts.idle += 1;
            }
        }
        Some(counts)
    }

    fn run(&self, turn: Turn, sink: EventSink) -> BoxFuture<Result<TurnEnd, AgentError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            match inner.turn(turn, &sink).await {
                Ok(end) => Ok(end),
                Err(Stop::Closed) => Ok(TurnEnd::Cancelled),
                Err(Stop::Failed(error)) => Err(error),
            }
        })
    }

    fn check_input(&self, input: &RunAgentInput) -> Result<(), InputError> {
        Settings::from_forwarded_props(input.forwarded_props.as_ref()).map(|_| ())
    }

    fn ready(&self) -> bool {
        let found = self.inner.startable();
        if self.inner.health.probe_due(found)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(self.inner.clone().probe());
        }
        self.inner.health.status(found).state == AgentState::Ready
    }

    fn status(&self) -> AgentStatus {
        let found = self.inner.startable();
        self.inner.health.status(found)
    }

    fn forget_thread(&self, thread_id: &str) -> BoxFuture<()> {
        let inner = self.inner.clone();
        let thread_id = thread_id.to_owned();
        Box::pin(async move {
            lock(&inner.undelivered).remove(&thread_id);
            lock(&inner.bound_outside).remove(&thread_id);
            let bound = lock(&inner.sessions).remove(&thread_id);
            if let Some(bound) = bound {
                inner.close_session(bound, true).await;
            }
            inner.remove_workspace(&thread_id).await;
        })
    }

    fn workspace(&self, thread_key: &str) -> Option<(PathBuf, Workspaces)> {
        let workspaces = self.inner.workspaces.as_ref()?;
        let (principal, thread) = crate::access::split_key(thread_key);
        Some((workspaces.dir_for(principal, thread), workspaces.clone()))
    }

    fn list_sessions(
        &self,
        cursor: Option<String>,
    ) -> BoxFuture<Result<SessionPage, SessionError>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.list_sessions(cursor).await })
    }

    fn import_session(
        &self,
        thread_id: &str,
        session_id: &str,
    ) -> BoxFuture<Result<Vec<Message>, SessionError>> {
        let inner = self.inner.clone();
        let (thread_id, session_id) = (thread_id.to_owned(), session_id.to_owned());
        Box::pin(async move { inner.import_session(&thread_id, &session_id).await })
    }

    fn fork_session(
        &self,
        thread_id: &str,
        session_id: Option<&str>,
        new_thread_id: &str,
    ) -> BoxFuture<Result<String, SessionError>> {
        let inner = self.inner.clone();
        let (thread_id, new_thread_id) = (thread_id.to_owned(), new_thread_id.to_owned());
        let session_id = session_id.map(str::to_owned);
        Box::pin(async move {
            inner
                .fork_session(&thread_id, session_id.as_deref(), &new_thread_id)
                .await
        })
    }

    fn shutdown(&self) -> BoxFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.stopped.cancel();
            let processes: Vec<_> = lock(&inner.processes).drain(..).collect();
            lock(&inner.sessions).clear();
            // Concurrently: the whole stop sequence stays bounded whatever the pool size.
            futures_util::future::join_all(processes.iter().map(|p| p.stop())).await;
            if let Some(bridge) = inner.mcp.get().cloned().flatten() {
                bridge.closed().await;
            }
        })
    }
}

/// Why a turn stopped early.
enum Stop {
    /// The run is over on our side (the sink closed).
    Closed,
    Failed(AgentError),
}

impl From<SinkClosed> for Stop {
    fn from(_: SinkClosed) -> Stop {
        Stop::Closed
    }
}

impl From<AgentError> for Stop {
    fn from(error: AgentError) -> Stop {
        Stop::Failed(error)
    }
}

impl Inner {
    /// Whether a process can be started: its program exists, and its confinement can be
    /// had on this machine.
    fn startable(&self) -> bool {
        self.confinement.is_ok() && launch::startable(&self.config.command)
    }

    async fn turn(self: &Arc<Self>, turn: Turn, sink: &EventSink) -> Result<TurnEnd, Stop> {
        let input = self.input_for(&turn);
        let (process, session) = match self.session_for(&turn, sink).await {
            Ok(bound) => bound,
            Err(stop) => {
                if let Stop::Failed(_) = stop {
                    self.keep_undelivered(&turn.thread_id, input);
                }
                return Err(stop);
            }
        };
        let _busy = Busy::new(process.clone());
        if let Some(bridge) = self.mcp.get().cloned().flatten() {
            bridge.set_tools(&session, &turn.tools);
        }
        let workspace = self.turn_workspace(&turn.thread_id).await;
        let over_quota = workspace
            .as_ref()
            .map_or_else(CancellationToken::new, |w| w.over_quota.clone());
        let mut events = process.router.register(&session);
        if let Err(stop) = self.apply_settings(&turn, &process, &session, sink).await {
            process.router.unregister(&session);
            if let Stop::Failed(_) = stop {
                self.keep_undelivered(&turn.thread_id, input);
            }
            return Err(stop);
        }
        let blocks = prompt_blocks(&turn, &input, &process);
        if blocks.is_empty() {
            process.router.unregister(&session);
            return Ok(TurnEnd::Finished {
                result: None,
                usage: Vec::new(),
            });
        }
        let prompt = PromptRequest::new(session.clone(), blocks);
        let connection = process.connection.clone();
        let (done_tx, mut done) = oneshot::channel();
        tokio::spawn(async move {
            let _ = done_tx.send(connection.send_request(prompt).block_task().await);
        });
        let files = turn.document["files"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let frontend: Vec<String> = turn.tools.iter().map(|t| t.name.clone()).collect();
        let mut translator = UpdateTranslator::default()
            .with_files(files)
            .with_frontend_tools(frontend)
            .with_used_ids(turn.tool_call_ids.clone());
        let mut cancel_sent = false;
        let cancel_wait = tokio::time::sleep(Duration::from_secs(u64::MAX / 4));
        tokio::pin!(cancel_wait);
        let result = loop {
            tokio::select! {
                biased;
                Some(event) = events.recv() => match event {
                    SessionEvent::Update { subagent, update } => {
                        translator.apply(subagent.as_deref(), &update, sink).await?;
                    }
                    SessionEvent::Permission(request, responder) => {
                        self.permission(*request, responder, &mut translator, sink).await?;
                    }
                    SessionEvent::Elicitation(request, responder) => {
                        elicitation(*request, responder, &mut translator, sink).await?;
                    }
                    SessionEvent::FrontendCall { name, arguments, reply } => {
                        // The agent's own tool_call for this MCP call (if it sent one) is
                        // held back: the call appears once, under that id.
                        let tool_call_id = translator
                            .claim_frontend(&name)
                            .unwrap_or_else(|| format!("mcp-{}", uuid::Uuid::new_v4()));
                        translator.close(sink).await?;
                        let answer = sink
                            .call_client_tool(ClientToolCall { tool_call_id, name, arguments })
                            .await?;
                        let _ = reply.send(answer);
                    }
                    SessionEvent::ShowUi { component, props, reply } => {
                        let verdict = sink.show_ui(&component, props).await?;
                        let _ = reply.send(verdict);
                    }
                },
                () = turn.cancel.cancelled(), if !cancel_sent => {
                    cancel_sent = true;
                    let cancel = CancelNotification::new(session.clone());
                    if let Err(error) = process.connection.send_notification(cancel) {
                        tracing::debug!(%error, "session/cancel not sent");
                    }
                    cancel_wait.as_mut().reset(tokio::time::Instant::now() + CANCEL_WAIT);
                }
                answer = &mut done => {
                    while let Ok(event) = events.try_recv() {
                        match event {
                            SessionEvent::Update { subagent, update } => {
                                translator.apply(subagent.as_deref(), &update, sink).await?;
                            }
                            SessionEvent::Permission(_, responder) => {
                                let _ = responder.respond(process::cancelled());
                            }
                            SessionEvent::Elicitation(_, responder) => {
                                let _ = responder.respond(CreateElicitationResponse::new(
                                    ElicitationAction::Cancel,
                                ));
                            }
                            SessionEvent::FrontendCall { reply, .. } => {
                                let _ = reply.send(ToolAnswer::Error("the turn is over".to_owned()));
                            }
                            SessionEvent::ShowUi { reply, .. } => {
                                let _ = reply.send(Err("the turn is over".to_owned()));
                            }
                        }
                    }
                    break answer;
                }
                () = &mut cancel_wait => {
                    process.router.unregister(&session);
                    translator.close(sink).await?;
                    return Ok(TurnEnd::Cancelled);
                }
                () = over_quota.cancelled() => {
                    let cancel = CancelNotification::new(session.clone());
                    if let Err(error) = process.connection.send_notification(cancel) {
                        tracing::debug!(%error, "session/cancel not sent");
                    }
                    process.router.unregister(&session);
                    translator.close(sink).await?;
                    let quota = self.workspaces.as_ref().and_then(|w| w.config().quota).unwrap_or(0);
                    return Err(Stop::Failed(workdir::quota_error(quota)));
                }
                () = process.exited.cancelled() => {
                    process.router.unregister(&session);
                    self.health.exited();
                    self.forget_process(&process);
                    translator.close(sink).await?;
                    return Err(Stop::Failed(AgentError::Failed {
                        code: "AGENT_EXITED".to_owned(),
                        message: process.exit_report(),
                    }));
                }
            }
        };
        process.router.unregister(&session);
        self.touch_session(&turn.thread_id);
        translator.close(sink).await?;
        if let Some(workspace) = workspace {
            workspace.finish(sink).await??;
        }
        match result {
            Ok(Ok(response)) => {
                self.health.turn_ok();
                let usage = note_usage(&response, &turn, sink).await?;
                match response.stop_reason {
                    StopReason::Cancelled => Ok(TurnEnd::Cancelled),
                    StopReason::Refusal => Err(Stop::Failed(AgentError::Failed {
                        code: "REFUSAL".to_owned(),
                        message: "the agent refused to continue".to_owned(),
                    })),
                    _ if cancel_sent => Ok(TurnEnd::Cancelled),
                    StopReason::EndTurn => Ok(TurnEnd::Finished {
                        result: None,
                        usage,
                    }),
                    reason => Ok(TurnEnd::Finished {
                        result: Some(json!({ "stopReason": reason })),
                        usage,
                    }),
                }
            }
            Ok(Err(error)) => {
                if error.code == ErrorCode::AUTH_REQUIRED {
                    // Refused before the agent took it: the input goes with the next prompt.
                    self.keep_undelivered(&turn.thread_id, input);
                    Err(Stop::Failed(self.auth_required(&process, &error.message)))
                } else if exited_meanwhile(&process).await {
                    self.health.exited();
                    self.forget_process(&process);
                    Err(Stop::Failed(AgentError::Failed {
                        code: "AGENT_EXITED".to_owned(),
                        message: process.exit_report(),
                    }))
                } else {
                    Err(Stop::Failed(AgentError::Failed {
                        code: "AGENT_ERROR".to_owned(),
                        message: error.message,
                    }))
                }
            }
            Err(_) => Err(Stop::Failed(AgentError::Failed {
                code: "AGENT_EXITED".to_owned(),
                message: {
                    if exited_meanwhile(&process).await {
                        self.health.exited();
                    }
                    process.exit_report()
                },
            })),
        }
    }

    /// What this turn prompts: the thread's undelivered input, then the turn's new
    /// messages (each once). On a thread that never had a session, nothing was delivered:
    /// every user message of the client's transcript.
    fn input_for(&self, turn: &Turn) -> Vec<Message> {
        let mut input = lock(&self.undelivered)
            .remove(&turn.thread_id)
            .unwrap_or_default();
        let sessionless =
            turn.session_id.is_none() && !lock(&self.sessions).contains_key(&turn.thread_id);
        let earlier = turn
            .messages
            .iter()
            .filter(|m| sessionless && matches!(m, Message::User(_)));
        for message in earlier.chain(&turn.new_messages) {
            if !input.iter().any(|m| m.id() == message.id()) {
                input.push(message.clone());
            }
        }
        input
    }

    /// Keeps input the agent did not receive for the thread's next prompt.
    fn keep_undelivered(&self, thread_id: &str, input: Vec<Message>) {
        if input.iter().any(|m| matches!(m, Message::User(_))) {
            tracing::info!(
                messages = input.len(),
                "the agent did not receive the prompt; it goes with the next one"
            );
            lock(&self.undelivered).insert(thread_id.to_owned(), input);
        }
    }

    /// Answers a permission request: at once by kind, or through the client.
    async fn permission(
        &self,
        request: RequestPermissionRequest,
        responder: Box<PermissionResponder>,
        translator: &mut UpdateTranslator,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        let options: Vec<PermissionOption> = request
            .options
            .iter()
            .map(|o| PermissionOption {
                option_id: o.option_id.to_string(),
                name: o.name.clone(),
                kind: kind_name(o.kind).to_owned(),
            })
            .collect();
        let by_kind = |kinds: &[PermissionOptionKind]| {
            kinds.iter().find_map(|kind| {
                request
                    .options
                    .iter()
                    .find(|o| o.kind == *kind)
                    .map(|o| o.option_id.to_string())
            })
        };
        let chosen = match self.config.permissions {
            Permissions::Allow => by_kind(&[
                PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways,
            ]),
            Permissions::Deny => by_kind(&[
                PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways,
            ]),
            Permissions::Ask => {
                let tool_call = &request.tool_call;
                let acp_id = Some(tool_call.tool_call_id.to_string()).filter(|id| !id.is_empty());
                if let Some(id) = &acp_id
                    && !translator.is_open(id)
                {
                    // The call the permission is about was never reported: open it from
                    // the request's own description of it. (Through JSON: the translator
                    // reads every update that way, see `translate.rs`.)
                    let mut opening = serde_json::to_value(tool_call)
                        .map_err(|e| AgentError::Backend(format!("ACP tool call: {e}")))?;
                    opening["sessionUpdate"] = json!("tool_call_update");
                    if let Some(map) = opening.as_object_mut() {
                        map.remove("status");
                    }
                    translator.apply(None, &opening, sink).await?;
                }
                translator.close(sink).await?;
                let tool_call_id = acp_id.map(|id| translator.wire_id(&id));
                let title = tool_call
                    .fields
                    .title
                    .clone()
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| format!("{} asks for permission", self.name));
                let outcome = sink
                    .request_permission(PermissionRequest {
                        title,
                        tool_call_id,
                        options: options.clone(),
                    })
                    .await?;
                match outcome {
                    // The client names an option by id, or (a generic UI) by its kind.
                    PermissionOutcome::Selected { option_id } => options
                        .iter()
                        .find(|o| o.option_id == option_id)
                        .or_else(|| options.iter().find(|o| o.kind == option_id))
                        .map(|o| o.option_id.clone()),
                    PermissionOutcome::Denied { .. } => None,
                }
            }
        };
        let response = match chosen {
            Some(option_id) => RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
                SelectedPermissionOutcome::new(option_id),
            )),
            None => process::cancelled(),
        };
        if let Err(error) = responder.respond(response) {
            tracing::debug!(%error, "permission answer not delivered");
        }
        Ok(())
    }

    /// The thread's session: live, loaded from an earlier process, or new.
    async fn session_for(
        self: &Arc<Self>,
        turn: &Turn,
        sink: &EventSink,
    ) -> Result<(Arc<AcpProcess>, String), Stop> {
        // Looked up and marked used at once, so the reaper cannot take it in between.
        let live = lock(&self.sessions).get_mut(&turn.thread_id).map(|bound| {
            bound.used = tokio::time::Instant::now();
            bound.clone()
        });
        if let Some(Bound {
            process, session, ..
        }) = live
            && process.is_alive()
        {
            let outside = lock(&self.bound_outside).remove(&turn.thread_id);
            if let Some(how) = outside {
                sink.set_session(&session, how).await?;
            }
            return Ok((process, session));
        }
        let cwd = self.workdir(&turn.thread_id).await?;
        let process = self.acquire(&self.key_for(&turn.thread_id)).await?;
        let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
        let capabilities = process.capabilities();
        if let Some(stored) = &turn.session_id {
            if capabilities.load_session {
                // The replay is history we already hold: swallow it.
                let replay = process.router.register(stored);
                if let Some(handle) = &mcp_handle {
                    handle.set_session(stored);
                }
                let load =
                    LoadSessionRequest::new(stored.clone(), &cwd).mcp_servers(mcp_servers.clone());
                let request = process.connection.send_request(load).block_task();
                let loaded = session_answer(&turn.cancel, "session/load", request).await;
                let loaded = match loaded {
                    Ok(loaded) => loaded,
                    Err(stop) => {
                        process.router.unregister(stored);
                        return Err(stop);
                    }
                };
                process.router.unregister(stored);
                drop(replay);
                match loaded {
                    Ok(_) => {
                        self.health.session_ok();
                        tracing::info!(session = %stored, "ACP session loaded");
                        sink.set_session(stored, "loaded").await?;
                        self.remember(&turn.thread_id, &process, stored);
                        return Ok((process, stored.clone()));
                    }
                    Err(error) => {
                        tracing::warn!(session = %stored, error = %error.message, "session/load failed; starting a new session");
                    }
                }
            } else if capabilities.session_capabilities.resume.is_some() {
                if let Some(handle) = &mcp_handle {
                    handle.set_session(stored);
                }
                let resume = ResumeSessionRequest::new(stored.clone(), &cwd)
                    .mcp_servers(mcp_servers.clone());
                let request = process.connection.send_request(resume).block_task();
                match session_answer(&turn.cancel, "session/resume", request).await? {
                    Ok(_) => {
                        self.health.session_ok();
                        tracing::info!(session = %stored, "ACP session resumed");
                        sink.set_session(stored, "resumed").await?;
                        self.remember(&turn.thread_id, &process, stored);
                        return Ok((process, stored.clone()));
                    }
                    Err(error) => {
                        tracing::warn!(session = %stored, error = %error.message, "session/resume failed; starting a new session");
                    }
                }
            } else {
                tracing::info!(
                    "the agent can neither load nor resume sessions; starting a new one"
                );
            }
        }
        let new = NewSessionRequest::new(&cwd).mcp_servers(mcp_servers);
        let request = process.connection.send_request(new).block_task();
        let created = session_answer(&turn.cancel, "session/new", request)
            .await?
            .map_err(|error| {
                if error.code == ErrorCode::AUTH_REQUIRED {
                    self.auth_required(&process, &error.message)
                } else {
                    AgentError::Failed {
                        code: "AGENT_ERROR".to_owned(),
                        message: format!("session/new failed: {}", error.message),
                    }
                }
            })?;
        self.health.session_ok();
        let session = created.session_id.to_string();
        if let Some(handle) = &mcp_handle {
            handle.set_session(&session);
        }
        let how = if turn.session_id.is_some() {
            "new (earlier session could not be restored)"
        } else {
            "new"
        };
        sink.set_session(&session, how).await?;
        show_session_settings(&created, sink).await?;
        self.remember(&turn.thread_id, &process, &session);
        Ok((process, session))
    }

    /// The `mcpServers` to give a session: the frontend-tools endpoint when the agent takes
    /// MCP servers over HTTP.
    async fn mcp_servers(
        &self,
        process: &Arc<AcpProcess>,
    ) -> (Vec<McpServer>, Option<mcp::McpHandle>) {
        let wanted = match self.config.frontend_mcp {
            FrontendMcp::Auto => process.capabilities().mcp_capabilities.http,
            FrontendMcp::Always => true,
            FrontendMcp::Never => false,
        };
        if !wanted {
            return (Vec::new(), None);
        }
        match self.bridge().await {
            Some(bridge) => {
                let (entry, handle) = bridge.bind(&process.router);
                (vec![entry], Some(handle))
            }
            None => (Vec::new(), None),
        }
    }

    /// The frontend-tools MCP endpoint's listener, started on first need (`None`: it
    /// cannot be started, or the agent never gets it).
    async fn bridge(&self) -> Option<Arc<mcp::McpBridge>> {
        if self.config.frontend_mcp == FrontendMcp::Never {
            return None;
        }
        self.mcp
            .get_or_init(|| async {
                let Some(host) = &self.host.mcp else {
                    return None;
                };
                match mcp::McpBridge::start(host.as_ref(), self.stopped.child_token()).await {
                    Ok(bridge) => Some(Arc::new(bridge)),
                    Err(error) => {
                        tracing::warn!(%error, "cannot start the frontend-tools MCP endpoint");
                        None
                    }
                }
            })
            .await
            .clone()
    }

    /// Notes `AUTH_REQUIRED` from `process` and says what to do about it.
    fn auth_required(&self, process: &AcpProcess, agent_message: &str) -> AgentError {
        let methods = auth_methods(process);
        let advice = health::auth_advice(&methods);
        self.health.auth_required(methods);
        AgentError::Failed {
            code: "AUTH_REQUIRED".to_owned(),
            message: format!(
                "agent {} needs authentication ({agent_message}): {advice}",
                self.name
            ),
        }
    }

    /// Finds out whether the agent works now: a process, a session, closed again. Started
    /// by `/readyz` while the agent is not ready; what it learns updates `health`.
    async fn probe(self: Arc<Self>) {
        let operator = PoolKey {
            principal: String::new(),
            thread: None,
        };
        let Ok(process) = self.acquire(&operator).await else {
            return;
        };
        let _busy = Busy::new(process.clone());
        let new = NewSessionRequest::new(self.shared_dir());
        match process.connection.send_request(new).block_task().await {
            Ok(created) => {
                self.health.session_ok();
                tracing::info!(agent = %self.name, "readiness probe: the agent takes sessions again");
                if process.capabilities().session_capabilities.close.is_some() {
                    let close = CloseSessionRequest::new(created.session_id);
                    let _ = process.connection.send_request(close).block_task().await;
                }
            }
            Err(error) if error.code == ErrorCode::AUTH_REQUIRED => {
                self.health.auth_required(auth_methods(&process));
            }
            Err(error) => {
                tracing::debug!(agent = %self.name, error = %error.message, "readiness probe: session/new failed");
            }
        }
    }
}

/// Whether a failed prompt was the process dying: the connection fails the request as soon
/// as stdout closes, a moment before the exit status is collected, so give the exit a
/// moment to show (longer when the connection is known to be gone).
async fn exited_meanwhile(process: &AcpProcess) -> bool {
    let gone =
        process.connection.is_incoming_closed() || process.connection.termination().is_some();
    let wait = if gone {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(250)
    };
    tokio::time::timeout(wait, process.exited.cancelled())
        .await
        .is_ok()
}

/// The prompt for a turn: context first, then the user messages of `input` (text; images
/// when the agent accepts them).
fn prompt_blocks(turn: &Turn, input: &[Message], process: &AcpProcess) -> Vec<ContentBlock> {
    let text = |text: &str| ContentBlock::Text(TextContent::new(text));
    let image =
        |data: &str, mime_type: &str| ContentBlock::Image(ImageContent::new(data, mime_type));
    let mut blocks = Vec::new();
    if !turn.context.is_empty() {
        let lines: Vec<String> = turn
            .context
            .iter()
            .map(|c| format!("- {}: {}", c.description, c.value))
            .collect();
        blocks.push(text(&format!("Context:\n{}", lines.join("\n"))));
    }
    let images = process.capabilities().prompt_capabilities.image;
    for message in input {
        let Message::User(user) = message else {
            continue;
        };
        match &user.content {
            crate::protocol::input::Content::Text(content) => blocks.push(text(content)),
            crate::protocol::input::Content::Parts(parts) => {
                for part in parts {
                    match part {
                        ContentPart::Text(part) => blocks.push(text(&part.text)),
                        ContentPart::Image(media) if images => {
                            if let MediaSource::Data(DataSource { value, mime_type }) =
                                &media.source
                            {
                                blocks.push(image(value, mime_type));
                            }
                        }
                        ContentPart::Binary(BinaryPart {
                            mime_type,
                            data: Some(data),
                            ..
                        }) if images && mime_type.starts_with("image/") => {
                            blocks.push(image(data, mime_type));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    blocks
}

/// The auth methods the agent advertised in its `initialize` answer.
fn auth_methods(process: &AcpProcess) -> Vec<AuthMethod> {
    process
        .auth_methods()
        .iter()
        .map(|m| AuthMethod {
            id: m.id().to_string(),
            name: m.name().to_owned(),
            description: m.description().map(str::to_owned),
        })
        .collect()
}

/// The wire name of a permission option kind (`allow_once`, ...), as clients match it.
fn kind_name(kind: PermissionOptionKind) -> &'static str {
    match kind {
        PermissionOptionKind::AllowOnce => "allow_once",
        PermissionOptionKind::AllowAlways => "allow_always",
        PermissionOptionKind::RejectOnce => "reject_once",
        PermissionOptionKind::RejectAlways => "reject_always",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn updates_translate_without_an_agent_process() {
        let chunk = |id: &str, text: &str| {
            json!({"sessionUpdate": "agent_message_chunk", "messageId": id,
                "content": {"type": "text", "text": text}})
        };
        let events = translate_updates(&[chunk("m", "a"), chunk("m", "b")], Vec::new()).await;
        assert_eq!(
            events,
            vec![
                AgentEvent::TextStart {
                    message_id: "acp-m".into()
                },
                AgentEvent::TextDelta {
                    message_id: "acp-m".into(),
                    delta: "a".into()
                },
                AgentEvent::TextDelta {
                    message_id: "acp-m".into(),
                    delta: "b".into()
                },
                AgentEvent::TextEnd {
                    message_id: "acp-m".into()
                },
            ]
        );
    }
}
