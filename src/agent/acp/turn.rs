//! One turn: one `session/prompt` on the thread's session, the agent's updates, requests
//! and frontend calls handled as they arrive, a cancel passed on, and how the turn ended.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, CreateElicitationResponse, ElicitationAction, PromptRequest,
    PromptResponse, StopReason,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::elicit::elicitation;
use super::process::AcpProcess;
use super::prompt::prompt_blocks;
use super::router::{self, SessionEvent};
use super::translate::UpdateTranslator;
use super::usage::note_usage;
use super::{Inner, Stop, workdir};
use crate::agent::{AgentError, ClientToolCall, EventSink, SinkClosed, ToolAnswer, Turn, TurnEnd};
use crate::protocol::events::TokenUsage;
use crate::protocol::input::Message;

/// How long a cancelled prompt may take to answer before the turn gives up on it.
const CANCEL_WAIT: Duration = Duration::from_millis(1000);

/// The agent's answer to a prompt.
type PromptResult = Result<PromptResponse, agent_client_protocol::Error>;

/// Tells the spares when a turn is over, however it ends (see `spares.rs`).
struct TurnEnded<'a>(&'a Inner, &'a str);

impl Drop for TurnEnded<'_> {
    fn drop(&mut self) {
        self.0.turn_ended(self.1);
    }
}

/// A turn's prompt in flight: where the agent's events about its session come from, and
/// where they go.
struct InFlight<'a> {
    turn: &'a Turn,
    process: &'a Arc<AcpProcess>,
    session: &'a str,
    sink: &'a EventSink,
    events: mpsc::UnboundedReceiver<SessionEvent>,
    translator: UpdateTranslator,
}

/// The prompt's answer, and whether the turn had been cancelled before it came.
struct Answered {
    /// An error when the task that sent the prompt is gone.
    answer: Result<PromptResult, oneshot::error::RecvError>,
    cancel_sent: bool,
}

impl Inner {
    /// Runs one turn: the thread's session and its settings, the prompt followed to its
    /// answer, the workspace's changes, and the end.
    pub(super) async fn turn(
        self: &Arc<Self>,
        turn: Turn,
        sink: &EventSink,
    ) -> Result<TurnEnd, Stop> {
        let _ended = TurnEnded(self, &turn.thread_id);
        let input = self.input_for(&turn);
        let (busy, session) = match self.session_for(&turn, sink).await {
            Ok(bound) => bound,
            Err(stop) => return Err(self.not_prompted(&turn, input, stop)),
        };
        let process = busy.0.clone();
        if let Some(bridge) = self.mcp.get().cloned().flatten() {
            bridge.set_tools(&session, &turn.tools);
        }
        let workspace = self.turn_workspace(&turn).await;
        let over_quota = workspace
            .as_ref()
            .map_or_else(CancellationToken::new, |w| w.over_quota.clone());
        let events = process.router.register_turn(&session);
        // What the model bills through the agent's relays counts against this run as it
        // streams (so a budget acts inside the turn) and is the turn's usage.
        let metered = match &process.exits {
            Some(exits) if !self.config.relays.is_empty() => Some(Metering::begin(exits, sink)),
            _ => None,
        };
        if let Err(stop) = self.apply_settings(&turn, &process, &session, sink).await {
            process.router.unregister(&session);
            return Err(self.not_prompted(&turn, input, stop));
        }
        let capabilities = &process.capabilities().prompt_capabilities;
        let blocks = match prompt_blocks(&turn, &input, capabilities) {
            Ok(blocks) => blocks,
            Err(refused) => {
                process.router.unregister(&session);
                return Err(self.refuse_input(&turn, input, refused));
            }
        };
        if blocks.is_empty() {
            process.router.unregister(&session);
            return Ok(TurnEnd::Finished {
                result: None,
                usage: Vec::new(),
            });
        }
        let answer = send_prompt(&process, &session, blocks);
        let mut flight = InFlight {
            turn: &turn,
            process: &process,
            session: &session,
            sink,
            events,
            translator: translator_for(&turn),
        };
        let Some(answered) = self.follow(&mut flight, answer, &over_quota).await? else {
            return Ok(TurnEnd::Cancelled);
        };
        process.router.unregister(&session);
        self.touch_session(&turn.thread_id);
        flight.translator.close(sink).await?;
        if let Some(workspace) = workspace
            && let Err(over) = workspace.finish(sink).await?
        {
            self.health.breached(|b| &mut b.quota);
            return Err(Stop::Failed(over));
        }
        if let Some(limit) = process.forks_refused() {
            self.health.breached(|b| &mut b.processes);
            return Err(Stop::Failed(limit));
        }
        let relayed = metered.map(Metering::end);
        self.turn_end(answered, &turn, input, &process, sink, relayed)
            .await
    }

    /// A turn that failed before its prompt went out: its input waits for the thread's
    /// next prompt (unless the run is over on our side).
    fn not_prompted(&self, turn: &Turn, input: Vec<Message>, stop: Stop) -> Stop {
        if let Stop::Failed(_) = stop {
            self.keep_undelivered(&turn.thread_id, input);
        }
        stop
    }

    /// Follows the prompt to its answer: the agent's events handled as they come, a cancel
    /// sent on as `session/cancel`. `None`: the agent did not answer a cancel within
    /// [`CANCEL_WAIT`]; the workspace's quota breached or the process's exit fail the turn.
    async fn follow(
        &self,
        flight: &mut InFlight<'_>,
        mut answer: oneshot::Receiver<PromptResult>,
        over_quota: &CancellationToken,
    ) -> Result<Option<Answered>, Stop> {
        let (process, session, sink) = (flight.process, flight.session, flight.sink);
        let mut cancel_sent = false;
        let cancel_wait = tokio::time::sleep(Duration::from_secs(u64::MAX / 4));
        tokio::pin!(cancel_wait);
        loop {
            tokio::select! {
                biased;
                Some(event) = flight.events.recv() => {
                    self.on_event(event, &mut flight.translator, &flight.turn.cancel, sink).await?;
                }
                () = flight.turn.cancel.cancelled(), if !cancel_sent => {
                    cancel_sent = true;
                    send_cancel(process, session);
                    cancel_wait.as_mut().reset(tokio::time::Instant::now() + CANCEL_WAIT);
                }
                answer = &mut answer => {
                    drain(&mut flight.events, &mut flight.translator, sink).await?;
                    return Ok(Some(Answered { answer, cancel_sent }));
                }
                () = &mut cancel_wait => {
                    process.router.unregister(session);
                    flight.translator.close(sink).await?;
                    return Ok(None);
                }
                () = over_quota.cancelled() => {
                    send_cancel(process, session);
                    process.router.unregister(session);
                    flight.translator.close(sink).await?;
                    // The writer stops too, not only the run (a process of this thread
                    // alone; one shared by a principal's threads is stopped between
                    // turns, `workdir::watch_process_quota`).
                    if process.serves_one_thread() {
                        self.forget_process(process);
                        let process = Arc::clone(process);
                        tokio::spawn(async move { process.stop().await });
                    }
                    self.health.breached(|b| &mut b.quota);
                    let quota = self.workspaces.as_ref().and_then(|w| w.config().quota).unwrap_or(0);
                    return Err(Stop::Failed(workdir::quota_error(quota)));
                }
                () = process.exited.cancelled() => {
                    process.router.unregister(session);
                    self.health.exited(process);
                    self.forget_process(process);
                    flight.translator.close(sink).await?;
                    return Err(Stop::Failed(exited(process)));
                }
            }
        }
    }

    /// Handles one thing the agent sent about the session while its prompt runs.
    async fn on_event(
        &self,
        event: SessionEvent,
        translator: &mut UpdateTranslator,
        cancel: &CancellationToken,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        match event {
            SessionEvent::Update { subagent, update } => {
                translator.apply(subagent.as_deref(), &update, sink).await?;
            }
            SessionEvent::Permission(request, responder) => {
                self.permission(*request, responder, translator, cancel, sink)
                    .await?;
            }
            SessionEvent::Elicitation(request, responder) => {
                elicitation(*request, responder, translator, sink).await?;
            }
            SessionEvent::FrontendCall {
                name,
                arguments,
                reply,
            } => {
                // The agent's own tool_call for this MCP call (if it sent one) is held
                // back: the call appears once, under that id.
                let tool_call_id = translator
                    .claim_frontend(&name)
                    .unwrap_or_else(|| format!("mcp-{}", uuid::Uuid::new_v4()));
                translator.close(sink).await?;
                let answer = sink
                    .call_client_tool(ClientToolCall {
                        tool_call_id,
                        name,
                        arguments,
                    })
                    .await?;
                let _ = reply.send(answer);
            }
            SessionEvent::ShowUi {
                component,
                props,
                reply,
            } => {
                let verdict = sink.show_ui(&component, props).await?;
                let _ = reply.send(verdict);
            }
        }
        Ok(())
    }

    /// How the turn ended, from the prompt's answer: by its stop reason (with the turn's
    /// token usage), or failed.
    async fn turn_end(
        &self,
        answered: Answered,
        turn: &Turn,
        input: Vec<Message>,
        process: &Arc<AcpProcess>,
        sink: &EventSink,
        relayed: Option<crate::egress::ModelUsage>,
    ) -> Result<TurnEnd, Stop> {
        match answered.answer {
            Ok(Ok(response)) => {
                self.health.turn_ok();
                let usage = note_usage(&response, relayed, turn, sink).await?;
                by_stop_reason(response.stop_reason, answered.cancel_sent, usage)
            }
            Ok(Err(error)) => Err(Stop::Failed(
                self.prompt_failed(error, turn, input, process).await,
            )),
            Err(_) => Err(Stop::Failed(AgentError::Failed {
                code: "AGENT_EXITED".to_owned(),
                message: {
                    if exited_meanwhile(process).await {
                        self.health.exited(process);
                    }
                    process.exit_report()
                },
            })),
        }
    }

    /// Why the agent's error answer to the prompt fails the turn: it wants credentials
    /// (refused before it took the prompt: the input goes with the next one), its process
    /// died, or the agent's own error.
    async fn prompt_failed(
        &self,
        error: agent_client_protocol::Error,
        turn: &Turn,
        input: Vec<Message>,
        process: &Arc<AcpProcess>,
    ) -> AgentError {
        if error.code == ErrorCode::AUTH_REQUIRED {
            self.keep_undelivered(&turn.thread_id, input);
            self.auth_required(process, &error.message, true)
        } else if exited_meanwhile(process).await {
            self.health.exited(process);
            self.forget_process(process);
            exited(process)
        } else {
            AgentError::Failed {
                code: "AGENT_ERROR".to_owned(),
                message: error.message,
            }
        }
    }
}

/// The translator of `turn`: it starts from the thread's files and used tool-call ids, and
/// knows the turn's frontend tools.
fn translator_for(turn: &Turn) -> UpdateTranslator {
    let files = turn.document["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let frontend: Vec<String> = turn.tools.iter().map(|t| t.name.clone()).collect();
    UpdateTranslator::default()
        .with_files(files)
        .with_frontend_tools(frontend)
        .with_used_ids(turn.tool_call_ids.clone())
}

/// Sends the prompt from a task of its own (the turn goes on handling events meanwhile);
/// the answer arrives on the returned channel.
fn send_prompt(
    process: &AcpProcess,
    session: &str,
    blocks: Vec<ContentBlock>,
) -> oneshot::Receiver<PromptResult> {
    let prompt = PromptRequest::new(session.to_owned(), blocks);
    let connection = process.connection.clone();
    let (done_tx, done) = oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(connection.send_request(prompt).block_task().await);
    });
    done
}

/// Sends `session/cancel` for `session` (a failure to send is only logged).
fn send_cancel(process: &AcpProcess, session: &str) {
    let cancel = CancelNotification::new(session.to_owned());
    if let Err(error) = process.connection.send_notification(cancel) {
        tracing::debug!(%error, "session/cancel not sent");
    }
}

/// After the prompt's answer: the updates still queued are translated, and the requests
/// still queued refused (the turn is over).
async fn drain(
    events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    translator: &mut UpdateTranslator,
    sink: &EventSink,
) -> Result<(), SinkClosed> {
    while let Ok(event) = events.try_recv() {
        match event {
            SessionEvent::Update { subagent, update } => {
                translator.apply(subagent.as_deref(), &update, sink).await?;
            }
            SessionEvent::Permission(_, responder) => {
                let _ = responder.respond(router::cancelled());
            }
            SessionEvent::Elicitation(_, responder) => {
                let _ =
                    responder.respond(CreateElicitationResponse::new(ElicitationAction::Cancel));
            }
            SessionEvent::FrontendCall { reply, .. } => {
                let _ = reply.send(ToolAnswer::Error("the turn is over".to_owned()));
            }
            SessionEvent::ShowUi { reply, .. } => {
                let _ = reply.send(Err("the turn is over".to_owned()));
            }
        }
    }
    Ok(())
}

/// A turn's count of what its process's relays read; ended (and its count dropped) with the
/// turn however it ends.
struct Metering {
    exits: Arc<super::exits::AgentExits>,
    id: Option<u64>,
}

impl Metering {
    fn begin(exits: &Arc<super::exits::AgentExits>, sink: &EventSink) -> Metering {
        Metering {
            exits: exits.clone(),
            id: Some(exits.begin(sink)),
        }
    }

    /// What the relays billed in the turn.
    fn end(mut self) -> crate::egress::ModelUsage {
        self.id
            .take()
            .map(|id| self.exits.end(id))
            .unwrap_or_default()
    }
}

impl Drop for Metering {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.exits.end(id);
        }
    }
}

/// The end of a turn the agent answered, by its stop reason (a turn cancelled on our side
/// ends cancelled whatever the reason, but for a refusal).
fn by_stop_reason(
    reason: StopReason,
    cancel_sent: bool,
    usage: Vec<TokenUsage>,
) -> Result<TurnEnd, Stop> {
    match reason {
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

/// The error of a turn whose process exited.
fn exited(process: &AcpProcess) -> AgentError {
    AgentError::Failed {
        code: "AGENT_EXITED".to_owned(),
        message: process.exit_report(),
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
