//! A turn's session: the thread's live one (bound by an earlier turn, or outside any turn:
//! imported, forked, loaded ahead, a spare's; see [`Announce`]), a spare's session made
//! ahead (`spares.rs`), its stored one loaded (`session/load`) or resumed
//! (`session/resume`) on a process, or a new one (`session/new`); and the MCP servers a
//! session is given.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::{
    LoadSessionRequest, McpServer, NewSessionRequest, ResumeSessionRequest,
};
use tokio_util::sync::CancellationToken;

use super::pool::{Bound, Taken};
use super::process::{AcpProcess, Busy};
use super::settings::{SessionSettings, StateChange, show_changes, show_session_settings};
use super::{FrontendMcp, Inner, Stop, mcp};
use crate::agent::{AgentError, EventSink, Turn};

/// How long `session/new`, `session/load` or `session/resume` may take (a real agent's
/// start of a session takes seconds; one that hangs must not hold the run).
const SESSION_WAIT: Duration = Duration::from_secs(120);

/// The answer to a session request of a turn, unless the turn is cancelled first (the run
/// ends as cancelled) or the agent takes longer than [`SESSION_WAIT`].
pub(super) async fn session_answer<T>(
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

/// What the first turn on a session bound outside a turn tells its run: how the session
/// came, its modes and options, what was already set on it, and whether to set it back to
/// the thread's mode and options.
pub(super) struct Announce {
    pub(super) how: &'static str,
    /// The session's modes and options as the agent reported them (`None`: not shown).
    pub(super) settings: Option<SessionSettings>,
    /// State changes already made on the session (a spare's session defaults).
    pub(super) changes: Vec<StateChange>,
    /// A loaded session: set it back to the mode and options the thread's state shows.
    pub(super) restore: bool,
}

impl Announce {
    /// Only how the session came (imported, forked).
    pub(super) fn how(how: &'static str) -> Announce {
        Announce {
            how,
            settings: None,
            changes: Vec::new(),
            restore: false,
        }
    }
}

impl Inner {
    /// The thread's session: live (or being loaded ahead), a spare's, loaded from an
    /// earlier process, or new.
    pub(super) async fn session_for(
        self: &Arc<Self>,
        turn: &Turn,
        sink: &EventSink,
    ) -> Result<(Busy, String), Stop> {
        self.saw_principal(crate::access::split_key(&turn.thread_id).0);
        self.prepared(turn).await?;
        if let Some((process, session)) = self.live_session(turn, sink).await? {
            return Ok((Busy::new(process), session));
        }
        // A new thread: a spare's session (or process), made before the request came.
        let mut spare_process = None;
        if turn.session_id.is_none() {
            match self.take_spare(&turn.thread_id).await {
                Some(Taken::Session(busy)) => {
                    if let Some((_, session)) = self.live_session(turn, sink).await? {
                        return Ok((busy, session));
                    }
                }
                Some(Taken::Process(busy)) => spare_process = Some(busy),
                None => {}
            }
        }
        let cwd = self.workdir(&turn.thread_id).await?;
        if let Some(busy) = spare_process {
            let process = busy.0.clone();
            let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
            let session = self
                .new_session(turn, sink, &process, &cwd, mcp_servers, mcp_handle.as_ref())
                .await?;
            return Ok((busy, session));
        }
        let busy = self.acquire(&self.key_for(&turn.thread_id)).await?;
        let process = busy.0.clone();
        let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
        // A load ahead that the agent refused is not tried again.
        let refused = self.load_refused(&turn.thread_id);
        if let Some(stored) = turn.session_id.as_ref().filter(|_| !refused) {
            let restored = self
                .restore(
                    &turn.cancel,
                    &process,
                    stored,
                    &cwd,
                    &mcp_servers,
                    mcp_handle.as_ref(),
                )
                .await?;
            if let Some((how, settings)) = restored {
                sink.set_session(stored, how).await?;
                self.remember(&turn.thread_id, &process, stored);
                show_session_settings(&settings, sink).await?;
                self.restore_settings(turn, &settings, &process, stored, sink)
                    .await?;
                return Ok((busy, stored.clone()));
            }
        }
        let session = self
            .new_session(turn, sink, &process, &cwd, mcp_servers, mcp_handle.as_ref())
            .await?;
        Ok((busy, session))
    }

    /// The thread's session when it is live on a running process. A session that was
    /// bound outside a turn (imported, forked, loaded ahead, a spare's) is announced on its
    /// first turn.
    async fn live_session(
        &self,
        turn: &Turn,
        sink: &EventSink,
    ) -> Result<Option<(Arc<AcpProcess>, String)>, Stop> {
        // Looked up and marked used at once, so the reaper cannot take it in between.
        let live = self.bindings.take_up(&turn.thread_id);
        let Some(Bound {
            process, session, ..
        }) = live
        else {
            return Ok(None);
        };
        if !process.is_alive() {
            return Ok(None);
        }
        let outside = self.bindings.take_announce(&turn.thread_id);
        if let Some(announce) = outside {
            sink.set_session(&session, announce.how).await?;
            if let Some(settings) = &announce.settings {
                show_session_settings(settings, sink).await?;
            }
            show_changes(announce.changes, sink).await?;
            if let (true, Some(settings)) = (announce.restore, &announce.settings) {
                self.restore_settings(turn, settings, &process, &session, sink)
                    .await?;
            }
        }
        Ok(Some((process, session)))
    }

    /// The stored session `stored` taken up on `process`, as the agent offers: how it came
    /// (`loaded`, `resumed`) and its mode and options as the agent reports them, or `None`
    /// when it could not be (a new session follows). `cancel` ends the wait.
    pub(super) async fn restore(
        &self,
        cancel: &CancellationToken,
        process: &AcpProcess,
        stored: &str,
        cwd: &Path,
        mcp_servers: &[McpServer],
        mcp_handle: Option<&mcp::McpHandle>,
    ) -> Result<Option<(&'static str, SessionSettings)>, Stop> {
        let capabilities = process.capabilities();
        if capabilities.load_session {
            self.load(cancel, process, stored, cwd, mcp_servers, mcp_handle)
                .await
        } else if capabilities.session_capabilities.resume.is_some() {
            self.resume(cancel, process, stored, cwd, mcp_servers, mcp_handle)
                .await
        } else {
            tracing::info!("the agent can neither load nor resume sessions; starting a new one");
            Ok(None)
        }
    }

    /// `session/load` of `stored`; the replay is history we already hold: swallowed.
    async fn load(
        &self,
        cancel: &CancellationToken,
        process: &AcpProcess,
        stored: &str,
        cwd: &Path,
        mcp_servers: &[McpServer],
        mcp_handle: Option<&mcp::McpHandle>,
    ) -> Result<Option<(&'static str, SessionSettings)>, Stop> {
        let replay = process.router.register(stored);
        if let Some(handle) = mcp_handle {
            handle.set_session(stored);
        }
        let load =
            LoadSessionRequest::new(stored.to_owned(), cwd).mcp_servers(mcp_servers.to_vec());
        let request = process.connection.send_request(load).block_task();
        let loaded = session_answer(cancel, "session/load", request).await;
        process.router.unregister(stored);
        drop(replay);
        match loaded? {
            Ok(loaded) => {
                self.health.session_ok();
                tracing::info!(session = %stored, "ACP session loaded");
                Ok(Some((
                    "loaded",
                    SessionSettings {
                        modes: loaded.modes,
                        config_options: loaded.config_options,
                    },
                )))
            }
            Err(error) => {
                tracing::warn!(session = %stored, error = %error.message, "session/load failed; starting a new session");
                Ok(None)
            }
        }
    }

    /// `session/resume` of `stored`.
    async fn resume(
        &self,
        cancel: &CancellationToken,
        process: &AcpProcess,
        stored: &str,
        cwd: &Path,
        mcp_servers: &[McpServer],
        mcp_handle: Option<&mcp::McpHandle>,
    ) -> Result<Option<(&'static str, SessionSettings)>, Stop> {
        if let Some(handle) = mcp_handle {
            handle.set_session(stored);
        }
        let resume =
            ResumeSessionRequest::new(stored.to_owned(), cwd).mcp_servers(mcp_servers.to_vec());
        let request = process.connection.send_request(resume).block_task();
        match session_answer(cancel, "session/resume", request).await? {
            Ok(resumed) => {
                self.health.session_ok();
                tracing::info!(session = %stored, "ACP session resumed");
                Ok(Some((
                    "resumed",
                    SessionSettings {
                        modes: resumed.modes,
                        config_options: resumed.config_options,
                    },
                )))
            }
            Err(error) => {
                tracing::warn!(session = %stored, error = %error.message, "session/resume failed; starting a new session");
                Ok(None)
            }
        }
    }

    /// `session/new` for the thread; its modes and options go to the state.
    async fn new_session(
        &self,
        turn: &Turn,
        sink: &EventSink,
        process: &Arc<AcpProcess>,
        cwd: &Path,
        mcp_servers: Vec<McpServer>,
        mcp_handle: Option<&mcp::McpHandle>,
    ) -> Result<String, Stop> {
        let new = NewSessionRequest::new(cwd).mcp_servers(mcp_servers);
        let request = process.connection.send_request(new).block_task();
        let created = session_answer(&turn.cancel, "session/new", request)
            .await?
            .map_err(|error| {
                if error.code == ErrorCode::AUTH_REQUIRED {
                    self.auth_required(process, &error.message, false)
                } else {
                    AgentError::Failed {
                        code: "AGENT_ERROR".to_owned(),
                        message: format!("session/new failed: {}", error.message),
                    }
                }
            })?;
        self.health.session_ok();
        let session = created.session_id.to_string();
        if let Some(handle) = mcp_handle {
            handle.set_session(&session);
        }
        let how = if turn.session_id.is_some() {
            "new (earlier session could not be restored)"
        } else {
            "new"
        };
        sink.set_session(&session, how).await?;
        let settings = SessionSettings {
            modes: created.modes,
            config_options: created.config_options,
        };
        show_session_settings(&settings, sink).await?;
        self.remember(&turn.thread_id, process, &session);
        self.apply_defaults(&settings, process, &session, sink)
            .await?;
        Ok(session)
    }

    /// The `mcpServers` to give a session: the frontend-tools endpoint when the agent takes
    /// MCP servers over HTTP.
    pub(super) async fn mcp_servers(
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
    pub(super) async fn bridge(&self) -> Option<Arc<mcp::McpBridge>> {
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
}
