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
//!
//! This file holds `AcpBackend`, the state its parts share (`Inner`) and its [`Agent`]
//! face. A turn runs in `turn.rs`, on the session `bind.rs` finds or makes, with the prompt
//! `prompt.rs` builds; `permission.rs` answers the agent's permission requests.

mod bind;
mod bindings;
mod config;
mod elicit;
mod exits;
mod forward;
mod forwarded;
mod health;
mod launch;
mod mcp;
mod parts;
mod permission;
mod pool;
mod prepare;
mod process;
mod prompt;
mod router;
mod sessions;
mod settings;
mod spares;
mod steer;
mod transcript;
mod translate;
mod turn;
mod usage;
mod workdir;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    Agent, AgentError, AgentEvent, AgentState, AgentStatus, BoxFuture, EventSink, Processes,
    SessionError, SessionPage, SinkClosed, Turn, TurnEnd,
};
use crate::confine::Confinement;
use crate::protocol::InputError;
use crate::protocol::input::{Message, RunAgentInput};
use crate::sync::lock;
use crate::workspace::Workspaces;
pub use config::{AcpConfig, FrontendMcp, Permissions, Warm, check_session_defaults};
use forwarded::Settings;
pub use launch::AgentHost;
pub use mcp::{FrontendTools, McpEndpoint, McpHost, McpListener};
use translate::UpdateTranslator;

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
    /// Its processes (`pool.rs`).
    pool: pool::ProcessPool,
    /// Which session each thread is bound to (`bindings.rs`).
    bindings: bindings::Bindings,
    /// Spares ready for new threads, by principal (`spares.rs`).
    spares: spares::Spares,
    /// Sessions being loaded ahead of their turns (`prepare.rs`).
    preparing: prepare::Preparing,
    /// What warm starts run in the background (the spares' keeper, spares being made,
    /// sessions loaded ahead): each watches `stopped`, and shutdown waits for them.
    tasks: TaskTracker,
    health: health::Health,
    /// Its processes' egress decisions (`exits.rs`).
    egress: Arc<crate::egress::Counters>,
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
            Ok(confinement) => {
                tracing::info!(
                    agent = name,
                    confinement = confinement.as_str(),
                    "agent confined"
                );
                if !crate::confine::network_namespaces() {
                    tracing::error!(
                        agent = name,
                        "the agent cannot have a network of its own here (run the daemon as root, or allow unprivileged user namespaces): it will not start"
                    );
                }
                if let Err(why) = crate::confine::cgroup::status() {
                    tracing::warn!(
                        agent = name,
                        %why,
                        "no control group for the agent's processes: no memory, process or CPU limits"
                    );
                }
            }
            Err(why) => tracing::error!(agent = name, %why, "the agent will not be started"),
        }
        AcpBackend {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                workspaces: config.workspace.clone().map(|w| {
                    Workspaces::new(name, w)
                        .with_checkpoints(&host.data_dir.join("checkpoints").join(name))
                }),
                confinement,
                host,
                config,
                pool: pool::ProcessPool::default(),
                bindings: bindings::Bindings::default(),
                spares: spares::Spares::default(),
                preparing: prepare::Preparing::default(),
                tasks: TaskTracker::new(),
                health: health::Health::default(),
                egress: Arc::default(),
                stopped: CancellationToken::new(),
                mcp: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// Number of running agent processes (spares' included).
    pub fn process_count(&self) -> usize {
        let spares = self.inner.spare_processes().len();
        self.inner.pool.alive().len() + spares
    }

    /// Spares ready for new threads now, every principal's.
    pub fn spares_ready(&self) -> usize {
        self.inner.spares_ready()
    }
}

impl Agent for AcpBackend {
    fn processes(&self) -> Option<Processes> {
        let spares = self.inner.spare_processes();
        let processes = self.inner.pool.snapshot();
        let mut counts = Processes::default();
        for process in processes.iter().chain(&spares).filter(|p| p.is_alive()) {
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

    fn features(&self) -> crate::agent::Features {
        let input =
            self.inner
                .pool
                .prompt_capabilities()
                .as_ref()
                .map(|p| crate::agent::InputKinds {
                    image: p.image,
                    audio: p.audio,
                    file: p.embedded_context,
                });
        let made_by = self.inner.pool.agent_info().map(|info| {
            let name = info.title.clone().unwrap_or_else(|| info.name.clone());
            (name, Some(info.version.clone()).filter(|v| !v.is_empty()))
        });
        crate::agent::Features {
            kind: "acp",
            made_by,
            input,
            // Whether it shows reasoning, runs code or runs sub-agents is not in ACP's
            // `initialize`: left unknown.
            ..crate::agent::Features::default()
        }
    }

    fn check_new_messages(&self, new: &[(usize, &Message)]) -> Result<(), InputError> {
        let capabilities = self.inner.pool.prompt_capabilities();
        prompt::check_parts(new, capabilities.as_ref(), &self.inner.name)
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

    fn reach(&self) -> Option<serde_json::Value> {
        let config = &self.inner.config;
        if !matches!(&self.inner.confinement, Ok(c) if *c != Confinement::None) {
            return None;
        }
        let names = |rules: &[crate::egress::Rule]| -> Vec<String> {
            rules.iter().map(|r| r.text().to_owned()).collect()
        };
        Some(serde_json::json!({
            "relays": config.relays.iter().map(|r| r.host.clone()).collect::<Vec<_>>(),
            "egress": {
                "allow": names(&config.egress.allow),
                "deny": names(&config.egress.deny),
            },
            "loopbackPorts": config.sandbox.connect,
        }))
    }

    fn status(&self) -> AgentStatus {
        let found = self.inner.startable();
        let mut status = self.inner.health.status(found);
        status.egress = self.inner.egress.shown();
        if self.inner.config.warm.spares > 0 {
            status.spares = Some(self.inner.spares_ready());
        }
        status
    }

    fn forget_thread(&self, thread_id: &str) -> BoxFuture<()> {
        let inner = self.inner.clone();
        let thread_id = thread_id.to_owned();
        Box::pin(async move {
            inner.forget_load(&thread_id);
            let bound = inner.bindings.forget(&thread_id);
            if let Some(bound) = bound {
                inner.close_session(bound, true).await;
            }
            inner.remove_workspace(&thread_id).await;
        })
    }

    fn steer(&self, thread_key: &str, messages: Vec<Message>) -> BoxFuture<Result<(), String>> {
        let inner = self.inner.clone();
        let thread_key = thread_key.to_owned();
        Box::pin(async move { inner.steer(&thread_key, &messages).await })
    }

    fn let_session_go(&self, thread_key: &str) -> BoxFuture<()> {
        let inner = self.inner.clone();
        let thread_key = thread_key.to_owned();
        Box::pin(async move {
            inner.forget_load(&thread_key);
            if let Some(bound) = inner.bindings.forget(&thread_key) {
                inner.close_session(bound, false).await;
            }
        })
    }

    fn workspace(&self, thread_key: &str) -> Option<(PathBuf, Workspaces)> {
        let workspaces = self.inner.workspaces.as_ref()?;
        let (principal, thread) = crate::access::split_key(thread_key);
        // A stat and, for a thread on a spare's workspace, a read of its short record.
        Some((workspaces.resolve(principal, thread), workspaces.clone()))
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

    fn prepare(&self, thread_key: &str, session_id: &str) {
        self.inner.prepare(thread_key, session_id);
    }

    fn warm_threads(&self) -> Option<(usize, std::time::Duration)> {
        let count = self.inner.config.warm.preload_sessions;
        (count > 0).then_some((count, self.inner.config.session_ttl))
    }

    fn warm_up(&self, recent: Vec<(String, String)>) {
        self.inner.start_spares();
        for (thread, session) in recent {
            self.inner.prepare(&thread, &session);
        }
    }

    fn shutdown(&self) -> BoxFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.stopped.cancel();
            // Every warm-start task ends at `stopped` (a process it was starting is killed
            // with it); then nothing adds a spare or a session any more.
            inner.tasks.close();
            if tokio::time::timeout(WARM_TASKS_WAIT, inner.tasks.wait())
                .await
                .is_err()
            {
                tracing::warn!(agent = %inner.name, "warm-start tasks did not end in time");
            }
            let spares = inner.drain_spares();
            let processes = inner.pool.drain();
            inner.bindings.clear();
            // Concurrently: the whole stop sequence stays bounded whatever the pool size.
            let stops = futures_util::future::join_all(processes.iter().map(|p| p.stop()));
            let discards =
                futures_util::future::join_all(spares.into_iter().map(|s| inner.discard_spare(s)));
            tokio::join!(stops, discards);
            if let Some(bridge) = inner.mcp.get().cloned().flatten() {
                bridge.closed().await;
            }
        })
    }
}

/// How long shutdown waits for the warm-start tasks to end (they end at once: each
/// watches the agent's stop).
const WARM_TASKS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
