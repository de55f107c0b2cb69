//! An ACP agent's own sessions outside turns: `session/list`, a session imported as a new
//! thread (`session/load`, its replay read as the transcript), a thread's session forked for
//! a new thread (`session/fork`).

use std::sync::Arc;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::{
    CreateElicitationResponse, ElicitationAction, ForkSessionRequest, ListSessionsRequest,
    LoadSessionRequest,
};

use super::Inner;
use super::bind::Announce;
use super::process::Busy;
use super::router::{self, SessionEvent};
use super::transcript::transcript_of;
use crate::agent::{AgentError, SessionError, SessionPage, SessionSummary, ToolAnswer};
use crate::protocol::input::Message;

impl Inner {
    /// `session/list` in this agent's working directory.
    pub(super) async fn list_sessions(
        self: &Arc<Self>,
        cursor: Option<String>,
    ) -> Result<SessionPage, SessionError> {
        let operator = self.key_for("");
        let busy = self.acquire(&operator).await.map_err(could_not_start)?;
        let process = busy.0.clone();
        if process.capabilities().session_capabilities.list.is_none() {
            return Err(SessionError::unsupported("does not list its sessions"));
        }
        let request = ListSessionsRequest::new()
            .cwd(self.shared_dir())
            .cursor(cursor);
        let listed = process
            .connection
            .send_request(request)
            .block_task()
            .await
            .map_err(|e| refused("session/list", &e))?;
        Ok(SessionPage {
            sessions: listed
                .sessions
                .into_iter()
                .map(|s| SessionSummary {
                    session_id: s.session_id.to_string(),
                    cwd: s.cwd.display().to_string(),
                    title: s.title,
                    updated_at: s.updated_at,
                })
                .collect(),
            next_cursor: listed.next_cursor,
        })
    }

    /// Loads the agent's session `session_id` for the new thread `thread_id`: its replay
    /// becomes the thread's transcript, and the session stays live for the thread.
    pub(super) async fn import_session(
        self: &Arc<Self>,
        thread_id: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, SessionError> {
        let holder = self.bindings.holder_of(session_id);
        if let Some(thread) = holder {
            return Err(SessionError::InUse(format!(
                "session {session_id:?} is live on thread {thread:?}"
            )));
        }
        let cwd = self.workdir(thread_id).await.map_err(could_not_start)?;
        let busy = self
            .acquire(&self.key_for(thread_id))
            .await
            .map_err(could_not_start)?;
        let process = busy.0.clone();
        if !process.capabilities().load_session {
            return Err(SessionError::unsupported(
                "cannot load its sessions (no loadSession)",
            ));
        }
        let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
        if let Some(handle) = &mcp_handle {
            handle.set_session(session_id);
        }
        let mut replay = process.router.register(session_id);
        let load = LoadSessionRequest::new(session_id.to_owned(), cwd).mcp_servers(mcp_servers);
        let loaded = process.connection.send_request(load).block_task().await;
        process.router.unregister(session_id);
        loaded.map_err(|e| refused("session/load", &e))?;
        // The agent replays the history before it answers, so all of it is here.
        let mut updates = Vec::new();
        while let Ok(event) = replay.try_recv() {
            match event {
                SessionEvent::Update {
                    subagent: None,
                    update,
                } => updates.push(update),
                SessionEvent::Update { .. } => {}
                SessionEvent::Permission(_, responder) => {
                    let _ = responder.respond(router::cancelled());
                }
                SessionEvent::Elicitation(_, responder) => {
                    let _ = responder
                        .respond(CreateElicitationResponse::new(ElicitationAction::Cancel));
                }
                SessionEvent::FrontendCall { reply, .. } => {
                    let _ = reply.send(ToolAnswer::Error("no run is waiting".to_owned()));
                }
                SessionEvent::ShowUi { reply, .. } => {
                    let _ = reply.send(Err("no run is showing anything".to_owned()));
                }
            }
        }
        self.health.session_ok();
        self.remember(thread_id, &process, session_id);
        self.bindings
            .bound_outside(thread_id, Announce::how("imported"));
        tracing::info!(session = %session_id, updates = updates.len(), "ACP session imported");
        Ok(transcript_of(&updates))
    }

    /// `session/fork` of thread `thread_id`'s session for the new thread `new_thread_id`.
    pub(super) async fn fork_session(
        self: &Arc<Self>,
        thread_id: &str,
        stored: Option<&str>,
        new_thread_id: &str,
    ) -> Result<String, SessionError> {
        let live = self.bindings.live(thread_id);
        let (busy, source) = match live {
            Some(bound) => (Busy::new(bound.process), bound.session),
            None => {
                let Some(stored) = stored else {
                    return Err(SessionError::NotFound(
                        "the thread has no agent session to fork yet".to_owned(),
                    ));
                };
                (
                    self.acquire(&self.key_for(thread_id))
                        .await
                        .map_err(could_not_start)?,
                    stored.to_owned(),
                )
            }
        };
        let process = busy.0.clone();
        if process.capabilities().session_capabilities.fork.is_none() {
            return Err(SessionError::unsupported("cannot fork sessions"));
        }
        self.fork_workspace(thread_id, new_thread_id)
            .await
            .map_err(SessionError::Failed)?;
        let cwd = self.workdir(new_thread_id).await.map_err(could_not_start)?;
        let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
        let fork = ForkSessionRequest::new(source, cwd).mcp_servers(mcp_servers);
        let forked = process
            .connection
            .send_request(fork)
            .block_task()
            .await
            .map_err(|e| refused("session/fork", &e))?;
        let session = forked.session_id.to_string();
        if let Some(handle) = &mcp_handle {
            handle.set_session(&session);
        }
        if process.in_pool(&self.key_for(new_thread_id)) {
            self.remember(new_thread_id, &process, &session);
        } else {
            // The fork was made on the source thread's process, which may not write the
            // new thread's workspace: the new thread's first turn loads it on its own.
            if let Some(bridge) = self.mcp.get().cloned().flatten() {
                bridge.unbind(&session);
            }
        }
        self.bindings
            .bound_outside(new_thread_id, Announce::how("forked"));
        tracing::info!(session = %session, "ACP session forked");
        Ok(session)
    }
}

/// A session operation that failed because no agent process could be had.
fn could_not_start(error: AgentError) -> SessionError {
    SessionError::Failed(error.to_string())
}

/// A session operation the agent answered with an error.
fn refused(method: &str, error: &agent_client_protocol::Error) -> SessionError {
    if error.code == ErrorCode::RESOURCE_NOT_FOUND {
        SessionError::NotFound(format!("the agent has no such session ({})", error.message))
    } else {
        SessionError::Failed(format!("{method} failed: {}", error.message))
    }
}
