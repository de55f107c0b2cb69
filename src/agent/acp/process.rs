//! One ACP agent process: spawned in its own process group, connected with the official
//! SDK over its stdio, initialized, and serving any number of sessions.
//!
//! The SDK's dispatch loop never waits on us: `session/update` notifications and
//! `session/request_permission` requests are routed by session id into per-session
//! channels (the permission's responder travels with it and is answered later by the
//! session's turn). Stopping: stdin EOF, then SIGTERM to the group, then SIGKILL.

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use agent_client_protocol::v1::schema::{
    InitializeRequest, InitializeResponse, RequestPermissionRequest, RequestPermissionResponse,
};
use agent_client_protocol::{Agent, ByteStreams, Client, UntypedMessage};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use crate::agent::AgentError;
use crate::config::AcpConfig;

/// The connection to an agent, as the SDK hands it out.
pub(super) type Connection = agent_client_protocol::v1::ConnectionTo<Agent>;
/// A permission request's answer slot.
pub(super) type PermissionResponder =
    agent_client_protocol::v1::Responder<RequestPermissionResponse>;

/// Bytes of stderr kept for error reports.
const STDERR_TAIL: usize = 4096;
/// How long spawning and `initialize` may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Something the agent sent about one session.
pub(super) enum SessionEvent {
    /// The `update` of a `session/update` notification, as JSON.
    Update(Value),
    /// A `session/request_permission` request (as JSON) and where to answer it.
    Permission(Value, Box<PermissionResponder>),
    /// A `tools/call` on the session's MCP endpoint for a frontend tool.
    FrontendCall {
        name: String,
        arguments: String,
        reply: oneshot::Sender<crate::agent::ToolAnswer>,
    },
}

/// Routes agent messages to sessions.
#[derive(Default)]
pub(super) struct Router {
    sessions: Mutex<HashMap<String, mpsc::UnboundedSender<SessionEvent>>>,
}

impl Router {
    pub(super) fn register(&self, session: &str) -> mpsc::UnboundedReceiver<SessionEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.sessions).insert(session.to_owned(), tx);
        rx
    }

    /// Hands an event to the session's turn; `false` when no turn is listening.
    pub(super) fn deliver(&self, session: &str, event: SessionEvent) -> bool {
        let target = lock(&self.sessions).get(session).cloned();
        target.is_some_and(|tx| tx.send(event).is_ok())
    }

    pub(super) fn unregister(&self, session: &str) {
        lock(&self.sessions).remove(session);
    }

    fn notify(&self, message: UntypedMessage) {
        if message.method != "session/update" {
            tracing::debug!(method = %message.method, "agent notification ignored");
            return;
        }
        let session = message.params["sessionId"].as_str().unwrap_or_default();
        let update = message.params.get("update").cloned().unwrap_or(Value::Null);
        let target = lock(&self.sessions).get(session).cloned();
        match target {
            Some(tx) => {
                let _ = tx.send(SessionEvent::Update(update));
            }
            None => tracing::debug!(session, "update for a session with no turn dropped"),
        }
    }

    fn permission(&self, request: RequestPermissionRequest, responder: PermissionResponder) {
        let value = serde_json::to_value(&request).unwrap_or(Value::Null);
        let session = request.session_id.to_string();
        let target = lock(&self.sessions).get(&session).cloned();
        let undelivered = match target {
            Some(tx) => tx
                .send(SessionEvent::Permission(value, Box::new(responder)))
                .err(),
            None => {
                let _ = responder.respond(cancelled());
                None
            }
        };
        if let Some(mpsc::error::SendError(SessionEvent::Permission(_, responder))) = undelivered {
            let _ = responder.respond(cancelled());
        }
    }
}

/// The "cancelled" permission outcome.
pub(super) fn cancelled() -> RequestPermissionResponse {
    serde_json::from_value(json!({"outcome": {"outcome": "cancelled"}}))
        .unwrap_or_else(|_| unreachable_cancelled())
}

#[allow(clippy::panic)]
fn unreachable_cancelled() -> RequestPermissionResponse {
    // The literal above is the schema's own example; it always parses.
    panic!("the cancelled permission outcome does not parse")
}

/// A running agent process.
pub(super) struct AcpProcess {
    pub(super) connection: Connection,
    pub(super) router: Arc<Router>,
    /// The agent's `initialize` answer, as JSON.
    pub(super) capabilities: Value,
    pub(super) exited: CancellationToken,
    exit_status: Arc<Mutex<Option<String>>>,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    /// Turns in progress on this process.
    pub(super) active: AtomicUsize,
    last_used: Mutex<Instant>,
    pgid: Option<i32>,
    closing: CancellationToken,
}

impl AcpProcess {
    /// Spawns `config.command` and initializes an ACP v1 connection with it.
    pub(super) async fn spawn(
        name: &str,
        config: &AcpConfig,
    ) -> Result<Arc<AcpProcess>, AgentError> {
        let (program, args) = config
            .command
            .split_first()
            .ok_or_else(|| AgentError::Backend("empty command".to_owned()))?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(&config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &config.cwd {
            command.current_dir(cwd);
        }
        let mut child = command.spawn().map_err(|e| AgentError::Failed {
            code: "AGENT_UNAVAILABLE".to_owned(),
            message: format!("cannot start agent {name}: {e}"),
        })?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok());
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(AgentError::Backend("agent stdio unavailable".to_owned()));
        };

        let stderr_tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let tail = stderr_tail.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut tail = lock(&tail);
                tail.extend(&buf[..n]);
                while tail.len() > STDERR_TAIL {
                    tail.pop_front();
                }
            }
        });

        let router = Arc::new(Router::default());
        let exited = CancellationToken::new();
        let exit_status = Arc::new(Mutex::new(None));
        {
            let (exited, exit_status, router) =
                (exited.clone(), exit_status.clone(), router.clone());
            tokio::spawn(async move {
                let status = child.wait().await;
                *lock(&exit_status) = Some(match status {
                    Ok(status) => status.to_string(),
                    Err(e) => e.to_string(),
                });
                lock(&router.sessions).clear();
                exited.cancel();
            });
        }

        let closing = CancellationToken::new();
        let (hand_out, connection) = oneshot::channel();
        {
            let (notify, permit) = (router.clone(), router.clone());
            let closing = closing.clone();
            let name = name.to_owned();
            tokio::spawn(async move {
                let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
                let served = Client
                    .v1()
                    .name("agui-serve")
                    .on_receive_notification(
                        async move |message: UntypedMessage, _cx| {
                            notify.notify(message);
                            Ok(())
                        },
                        agent_client_protocol::on_receive_notification!(),
                    )
                    .on_receive_request(
                        async move |request: RequestPermissionRequest, responder, _cx| {
                            permit.permission(request, responder);
                            Ok(())
                        },
                        agent_client_protocol::on_receive_request!(),
                    )
                    .connect_with(transport, async move |cx: Connection| {
                        let _ = hand_out.send(cx);
                        closing.cancelled().await;
                        Ok(())
                    })
                    .await;
                if let Err(error) = served {
                    tracing::debug!(agent = %name, %error, "ACP connection ended");
                }
            });
        }
        let start = async {
            let connection = connection.await.map_err(|_| {
                AgentError::Backend("the agent connection closed at start".to_owned())
            })?;
            let init: InitializeRequest = serde_json::from_value(json!({
                "protocolVersion": 1,
                "clientCapabilities": {},
                "clientInfo": {"name": "agui-serve", "version": env!("CARGO_PKG_VERSION")}
            }))
            .map_err(|e| AgentError::Backend(e.to_string()))?;
            let response: InitializeResponse = connection
                .send_request(init)
                .block_task()
                .await
                .map_err(|e| AgentError::Backend(format!("initialize failed: {}", e.message)))?;
            Ok::<_, AgentError>((connection, response))
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(START_TIMEOUT, start) => outcome
                .unwrap_or_else(|_| Err(AgentError::Backend("the agent did not initialize in time".to_owned()))),
            () = exited.cancelled() => Err(AgentError::Backend("the agent exited during initialize".to_owned())),
        };
        let process = |connection, capabilities| AcpProcess {
            connection,
            router,
            capabilities,
            exited: exited.clone(),
            exit_status: exit_status.clone(),
            stderr_tail: stderr_tail.clone(),
            active: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            pgid,
            closing: closing.clone(),
        };
        match outcome {
            Ok((connection, response)) => {
                let capabilities = serde_json::to_value(&response).unwrap_or(Value::Null);
                tracing::info!(agent = %name, pid = pgid, "ACP agent started");
                Ok(Arc::new(process(connection, capabilities)))
            }
            Err(error) => {
                closing.cancel();
                if let Some(pgid) = pgid {
                    signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                }
                let tail = String::from_utf8_lossy(
                    &lock(&stderr_tail).iter().copied().collect::<Vec<_>>(),
                )
                .into_owned();
                Err(match error {
                    AgentError::Backend(message) if !tail.trim().is_empty() => {
                        AgentError::Backend(format!("{message}: {}", last_lines(&tail)))
                    }
                    other => other,
                })
            }
        }
    }

    /// Whether the agent advertises `capability` (a JSON pointer into its capabilities).
    pub(super) fn can(&self, pointer: &str) -> bool {
        self.capabilities
            .pointer(pointer)
            .is_some_and(|v| v.as_bool().unwrap_or(!v.is_null()))
    }

    pub(super) fn is_alive(&self) -> bool {
        !self.exited.is_cancelled()
    }

    pub(super) fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    pub(super) fn idle_for(&self) -> Duration {
        lock(&self.last_used).elapsed()
    }

    /// Why the process is gone, with the end of its stderr.
    pub(super) fn exit_report(&self) -> String {
        let status = lock(&self.exit_status)
            .clone()
            .unwrap_or_else(|| "unknown status".to_owned());
        let tail =
            String::from_utf8_lossy(&lock(&self.stderr_tail).iter().copied().collect::<Vec<_>>())
                .into_owned();
        if tail.trim().is_empty() {
            format!("the agent process exited ({status})")
        } else {
            format!("the agent process exited ({status}): {}", last_lines(&tail))
        }
    }

    /// Stops the process: stdin EOF, then SIGTERM to its group, then SIGKILL.
    pub(super) async fn stop(&self) {
        self.closing.cancel();
        if tokio::time::timeout(Duration::from_secs(1), self.exited.cancelled())
            .await
            .is_ok()
        {
            return;
        }
        if let Some(pgid) = self.pgid {
            signal_group(pgid, nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(Duration::from_secs(2), self.exited.cancelled())
                .await
                .is_ok()
            {
                return;
            }
            signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(1), self.exited.cancelled()).await;
        }
    }
}

impl Drop for AcpProcess {
    fn drop(&mut self) {
        self.closing.cancel();
        if let Some(pgid) = self.pgid
            && !self.exited.is_cancelled()
        {
            signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn signal_group(pgid: i32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
}

/// The last few lines of `text`, on one line.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(5);
    lines[start..].join(" | ")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `command` names something that can be started (for `/readyz`).
pub(super) fn startable(command: &[String]) -> bool {
    let Some(program) = command.first() else {
        return false;
    };
    let executable = |path: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
    })
}

/// Counts a turn on a process for as long as it lives.
pub(super) struct Busy(pub(super) Arc<AcpProcess>);

impl Busy {
    pub(super) fn new(process: Arc<AcpProcess>) -> Busy {
        process.active.fetch_add(1, Ordering::SeqCst);
        process.touch();
        Busy(process)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cancelled_outcome_parses_with_the_pinned_schema() {
        let value = serde_json::to_value(cancelled()).expect("serializes");
        assert_eq!(value, json!({"outcome": {"outcome": "cancelled"}}));
    }

    #[test]
    fn startable_finds_programs_on_path_and_by_path() {
        assert!(startable(&["sh".to_owned()]));
        assert!(startable(&["/bin/sh".to_owned(), "-c".to_owned()]));
        assert!(!startable(&["/nonexistent/agent".to_owned()]));
        assert!(!startable(&["no-such-agent-binary-anywhere".to_owned()]));
        assert!(!startable(&[]));
    }
}
