//! One ACP agent process: spawned in its own process group, connected with the official
//! SDK over its stdio, initialized, and serving any number of sessions.
//!
//! The SDK's dispatch loop never waits on us: `session/update` notifications,
//! `session/request_permission` and `elicitation/create` requests are routed by session id
//! into per-session channels (a request's responder travels with it and is answered later
//! by the session's turn). A subagent's session (announced by a `subagent_update` on its
//! parent) is routed to its parent's channel. Stopping: stdin EOF, then SIGTERM to the
//! group, then SIGKILL.
//!
//! Everything is typed with the SDK's schema but `session/update`, which is taken as JSON:
//! an update variant this build does not know (the protocol adds them often) must still
//! reach the client as `CUSTOM acp.<variant>`, and a typed parse would reject the whole
//! notification instead.

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, ClientCapabilities, CreateElicitationRequest,
    ElicitationCapabilities, ElicitationFormCapabilities, Implementation, InitializeRequest,
    InitializeResponse, RequestPermissionRequest, SubagentCapabilities,
};
use agent_client_protocol::{Agent, ByteStreams, Client, UntypedMessage};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::oneshot;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use super::launch::{Launch, PoolKey};
use super::router::Router;
use crate::agent::AgentError;
use crate::sync::lock;

/// The connection to an agent, as the SDK hands it out.
pub(super) type Connection = agent_client_protocol::v1::ConnectionTo<Agent>;

/// Bytes of stderr kept for error reports.
const STDERR_TAIL: usize = 4096;
/// How long spawning and `initialize` may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running agent process.
pub(super) struct AcpProcess {
    pub(super) connection: Connection,
    pub(super) router: Arc<Router>,
    /// The agent's `initialize` answer.
    pub(super) initialized: InitializeResponse,
    pub(super) exited: CancellationToken,
    exit_status: Arc<Mutex<Option<String>>>,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    /// Turns in progress on this process.
    pub(super) active: AtomicUsize,
    /// The pool it belongs to (a spare's is its thread's once a thread takes it).
    key: Mutex<PoolKey>,
    last_used: Mutex<Instant>,
    pgid: Option<i32>,
    closing: CancellationToken,
    /// Its control group (memory, processes, CPU), read for a breach when it exits.
    cgroup: Option<Arc<crate::confine::cgroup::Cgroup>>,
    /// The forks its group had been refused when last asked ([`AcpProcess::forks_refused`]).
    forks_refused: AtomicU64,
    /// What its relays and proxy report to (confined only).
    pub(super) exits: Option<Arc<super::exits::AgentExits>>,
    /// The mode each of its sessions was last set to by the daemon (`session/set_mode`),
    /// so the same mode is never sent twice (a configured default, then a client's).
    pub(super) modes: Mutex<HashMap<String, String>>,
}

impl AcpProcess {
    /// Spawns `launch` and initializes an ACP v1 connection with it.
    pub(super) async fn spawn(
        name: &str,
        launch: Launch,
        key: PoolKey,
    ) -> Result<Arc<AcpProcess>, AgentError> {
        let mut child = command(&launch).spawn().map_err(|e| AgentError::Failed {
            code: "AGENT_UNAVAILABLE".to_owned(),
            message: format!("cannot start agent {name}: {e}"),
        })?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok());
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(AgentError::Backend("agent stdio unavailable".to_owned()));
        };
        let stderr_tail = keep_stderr_tail(stderr);
        let router = Arc::new(Router::default());
        let (exited, exit_status) = watch_exit(child, router.clone(), launch.cgroup.clone());
        if let Some(forward) = launch.forward {
            forward.serve(exited.clone());
        }
        let closing = CancellationToken::new();
        let connection = connect(name, stdin, stdout, &router, closing.clone());
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(START_TIMEOUT, initialize(connection)) => outcome
                .unwrap_or_else(|_| Err(AgentError::Backend("the agent did not initialize in time".to_owned()))),
            () = exited.cancelled() => Err(AgentError::Backend("the agent exited during initialize".to_owned())),
        };
        let (connection, initialized) = match outcome {
            Ok(started) => started,
            Err(error) => return Err(start_failed(error, &closing, pgid, &stderr_tail)),
        };
        tracing::info!(agent = %name, pid = pgid, "ACP agent started");
        Ok(Arc::new(AcpProcess {
            connection,
            router,
            initialized,
            exited,
            exit_status,
            stderr_tail,
            active: AtomicUsize::new(0),
            key: Mutex::new(key),
            last_used: Mutex::new(Instant::now()),
            pgid,
            closing,
            cgroup: launch.cgroup.clone(),
            forks_refused: AtomicU64::new(0),
            exits: launch.exits.clone(),
            modes: Mutex::default(),
        }))
    }

    /// Whether it belongs to pool `key`.
    pub(super) fn in_pool(&self, key: &PoolKey) -> bool {
        *lock(&self.key) == *key
    }

    /// Whether it serves one thread alone.
    pub(super) fn serves_one_thread(&self) -> bool {
        lock(&self.key).thread.is_some()
    }

    /// Moves it into pool `key` (a spare taken by its thread).
    pub(super) fn assign(&self, key: PoolKey) {
        *lock(&self.key) = key;
    }

    /// What the agent said it can do in its `initialize` answer.
    pub(super) fn capabilities(&self) -> &AgentCapabilities {
        &self.initialized.agent_capabilities
    }

    /// The ways the agent offers to authenticate.
    pub(super) fn auth_methods(&self) -> &[AuthMethod] {
        &self.initialized.auth_methods
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

    /// Whether the kernel killed it (or one of its own) at its memory limit.
    pub(super) fn killed_at_memory_limit(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|g| g.oom_kills() > 0)
    }

    /// The error a turn ends with when a fork was refused at the process limit since the
    /// last time this was asked (the agent lives on: a fork bomb inside it is stopped).
    pub(super) fn forks_refused(&self) -> Option<AgentError> {
        let group = self.cgroup.as_ref()?;
        let refused = group.forks_refused();
        let before = self.forks_refused.swap(refused, Ordering::SeqCst);
        (refused > before).then(|| AgentError::Failed {
            code: "AGENT_LIMIT".to_owned(),
            message: format!(
                "the agent hit its process limit ({}): {} forks refused",
                group.limits().pids,
                refused - before
            ),
        })
    }

    /// Why the process is gone, with the end of its stderr.
    pub(super) fn exit_report(&self) -> String {
        let status = lock(&self.exit_status)
            .clone()
            .unwrap_or_else(|| "unknown status".to_owned());
        let tail =
            String::from_utf8_lossy(&lock(&self.stderr_tail).iter().copied().collect::<Vec<_>>())
                .into_owned();
        let breach = self.cgroup.as_ref().and_then(|group| group.breach());
        if let Some(breach) = &breach {
            tracing::warn!(pid = self.pgid, %breach, "agent limit reached");
        }
        let why = breach.map(|b| format!("{b}; ")).unwrap_or_default();
        if tail.trim().is_empty() {
            format!("{why}the agent process exited ({status})")
        } else {
            format!(
                "{why}the agent process exited ({status}): {}",
                last_lines(&tail)
            )
        }
    }

    /// Stops the process: stdin EOF, then SIGTERM to its group, then SIGKILL; whatever of
    /// its group (and of its control group) outlives it (a child it left behind, which
    /// could still write in its workspace) is killed last.
    pub(super) async fn stop(&self) {
        self.closing.cancel();
        let Some(pgid) = self.pgid else {
            return;
        };
        let exited =
            |wait| tokio::time::timeout(Duration::from_secs(wait), self.exited.cancelled());
        if exited(1).await.is_err() {
            signal_group(pgid, nix::sys::signal::Signal::SIGTERM);
            if exited(2).await.is_err() {
                signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = exited(1).await;
            }
        }
        signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
        if let Some(group) = self.cgroup.clone() {
            let _ = tokio::task::spawn_blocking(move || group.kill_all()).await;
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

/// The command that starts `launch`: its stdio piped, killed when dropped, in a process
/// group of its own unless the launcher makes its own session.
fn command(launch: &Launch) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&launch.program);
    command
        .args(&launch.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if !launch.own_session {
        command.process_group(0);
    }
    if let Some(env) = &launch.env {
        command.env_clear().envs(env);
    }
    if let Some(cwd) = &launch.cwd {
        command.current_dir(cwd);
    }
    command
}

/// Reads the process's stderr to its end, keeping the last [`STDERR_TAIL`] bytes.
fn keep_stderr_tail(mut stderr: ChildStderr) -> Arc<Mutex<VecDeque<u8>>> {
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
    stderr_tail
}

/// Waits for the process to exit: then what it left in its control group is killed, its
/// status is kept, its sessions' turns are let go and the returned token is cancelled.
fn watch_exit(
    mut child: Child,
    router: Arc<Router>,
    group: Option<Arc<crate::confine::cgroup::Cgroup>>,
) -> (CancellationToken, Arc<Mutex<Option<String>>>) {
    let exited = CancellationToken::new();
    let exit_status = Arc::new(Mutex::new(None));
    let (on_exit, status_slot) = (exited.clone(), exit_status.clone());
    tokio::spawn(async move {
        let status = child.wait().await;
        // What it left behind in its control group (a writer in a session of its own)
        // goes with it.
        if let Some(group) = group {
            let _ = tokio::task::spawn_blocking(move || group.kill_all()).await;
        }
        *lock(&status_slot) = Some(match status {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        });
        router.close_all();
        on_exit.cancel();
    });
    (exited, exit_status)
}

/// Serves the SDK's client connection over the process's stdio until `closing`: the
/// agent's notifications and requests go to `router`; the connection is handed out on the
/// returned channel once it is up.
fn connect(
    name: &str,
    stdin: ChildStdin,
    stdout: ChildStdout,
    router: &Arc<Router>,
    closing: CancellationToken,
) -> oneshot::Receiver<Connection> {
    let (hand_out, connection) = oneshot::channel();
    let (notify, permit, elicit) = (router.clone(), router.clone(), router.clone());
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
            .on_receive_request(
                async move |request: CreateElicitationRequest, responder, _cx| {
                    elicit.elicitation(request, responder);
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
    connection
}

/// `initialize` on the connection once it is up: the agent's answer.
async fn initialize(
    connection: oneshot::Receiver<Connection>,
) -> Result<(Connection, InitializeResponse), AgentError> {
    let connection = connection
        .await
        .map_err(|_| AgentError::Backend("the agent connection closed at start".to_owned()))?;
    // No `fs` and no `terminal`: the agent uses its own tools. Form elicitation is
    // offered (it becomes an interrupt or a tool call for the person at the
    // client), and subagents are welcome (their sessions come on this connection).
    // `_meta.terminal_output` asks agents that run commands themselves to stream the
    // output in their tool-call updates (the convention codex-acp and Zed share).
    let mut meta = serde_json::Map::new();
    meta.insert("terminal_output".to_owned(), serde_json::Value::Bool(true));
    let capabilities = ClientCapabilities::new()
        .elicitation(ElicitationCapabilities::new().form(ElicitationFormCapabilities::new()))
        .subagents(SubagentCapabilities::new())
        .meta(meta);
    let init = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(capabilities)
        .client_info(Implementation::new("agui-serve", env!("CARGO_PKG_VERSION")));
    let response: InitializeResponse = connection
        .send_request(init)
        .block_task()
        .await
        .map_err(|e| AgentError::Backend(format!("initialize failed: {}", e.message)))?;
    Ok((connection, response))
}

/// A start that failed: the connection closed, the process group killed, and the error
/// with the end of the agent's stderr.
fn start_failed(
    error: AgentError,
    closing: &CancellationToken,
    pgid: Option<i32>,
    stderr_tail: &Mutex<VecDeque<u8>>,
) -> AgentError {
    closing.cancel();
    if let Some(pgid) = pgid {
        signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
    }
    let tail = String::from_utf8_lossy(&lock(stderr_tail).iter().copied().collect::<Vec<_>>())
        .into_owned();
    match error {
        AgentError::Backend(message) if !tail.trim().is_empty() => {
            AgentError::Backend(format!("{message}: {}", last_lines(&tail)))
        }
        other => other,
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
    #[test]
    fn startable_finds_programs_on_path_and_by_path() {
        assert!(super::super::launch::startable(&["sh".to_owned()]));
        assert!(super::super::launch::startable(&[
            "/bin/sh".to_owned(),
            "-c".to_owned()
        ]));
        assert!(!super::super::launch::startable(&[
            "/nonexistent/agent".to_owned()
        ]));
        assert!(!super::super::launch::startable(&[
            "no-such-agent-binary-anywhere".to_owned()
        ]));
        assert!(!super::super::launch::startable(&[]));
    }
}
