//! An ACP agent's processes and open sessions: which process a thread's session goes to,
//! starting one when its pool has room, and the reaper that stops idle processes and
//! closes idle sessions.
//!
//! Processes are pooled per [`PoolKey`]: never two principals on one process, and, where
//! each thread has a workspace of its own and the agent is confined, never two threads
//! (the process's Landlock rules name the one workspace it may write). A session no turn
//! has used for `session_ttl` is closed (`session/close` when the agent offers it, and on
//! a per-thread process the process stopped); the thread's next turn loads it again, so
//! memory follows the threads in use, not the threads ever used.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agent_client_protocol::v1::schema::{CloseSessionRequest, Implementation, PromptCapabilities};
use tokio::time::Instant;

use super::launch::{Launch, PoolKey};
use super::process::{AcpProcess, Busy};
use super::{Inner, lock};
use crate::agent::AgentError;
use crate::confine::Confinement;
use crate::workspace::Unit;

/// How long a `session/close` or `session/delete` may take before the daemon goes on.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A thread's live session.
#[derive(Clone)]
pub(super) struct Bound {
    pub(super) process: Arc<AcpProcess>,
    pub(super) session: String,
    /// When a turn last began or ended on it.
    pub(super) used: Instant,
}

/// The agent's pooled processes, a room of their own: which are live, the lock that keeps
/// two starts from racing for one pool's room, whether the reaper runs, and what the last
/// process started said of the agent.
#[derive(Default)]
pub(super) struct ProcessPool {
    live: Mutex<Vec<Arc<AcpProcess>>>,
    spawning: tokio::sync::Mutex<()>,
    reaper: AtomicBool,
    /// What the agent takes in a prompt, from its last successful `initialize` (`None`
    /// until a process of it has started).
    prompt_capabilities: Mutex<Option<PromptCapabilities>>,
    /// Who the agent says it is (`agentInfo`), from the same answer.
    agent_info: Mutex<Option<Implementation>>,
}

impl ProcessPool {
    /// The live processes (the dead ones are let go).
    pub(super) fn alive(&self) -> Vec<Arc<AcpProcess>> {
        let mut live = lock(&self.live);
        live.retain(|p| p.is_alive());
        live.clone()
    }

    /// The processes as they are, the dead among them (a look changes nothing: the reaper
    /// stops and forgets a process that died).
    pub(super) fn snapshot(&self) -> Vec<Arc<AcpProcess>> {
        lock(&self.live).clone()
    }

    /// Every process, taken out (at shutdown).
    pub(super) fn drain(&self) -> Vec<Arc<AcpProcess>> {
        lock(&self.live).drain(..).collect()
    }

    pub(super) fn prompt_capabilities(&self) -> Option<PromptCapabilities> {
        lock(&self.prompt_capabilities).clone()
    }

    pub(super) fn agent_info(&self) -> Option<Implementation> {
        lock(&self.agent_info).clone()
    }

    fn remove(&self, process: &Arc<AcpProcess>) {
        lock(&self.live).retain(|p| !Arc::ptr_eq(p, process));
    }

    /// A process of pool `key` for a new session without starting one: an idle one, else
    /// the least busy once the pool is full (`size`).
    fn pick(&self, key: &PoolKey, size: usize) -> Option<Busy> {
        let mut live = lock(&self.live);
        live.retain(|p| p.is_alive());
        let pool = live.iter().filter(|p| p.in_pool(key));
        // Marked used as it is handed out: the reaper does not stop it under the session
        // about to be made on it.
        if let Some(idle) = pool.clone().find(|p| p.active.load(Ordering::SeqCst) == 0) {
            return Some(Busy::new(idle.clone()));
        }
        if pool.clone().count() >= size
            && let Some(least) = pool.min_by_key(|p| p.active.load(Ordering::SeqCst))
        {
            return Some(Busy::new(least.clone()));
        }
        None
    }

    /// Adds `process`; `true` the first time, when the reaper is to be started.
    fn join(&self, process: Arc<AcpProcess>) -> bool {
        lock(&self.live).push(process);
        !self.reaper.swap(true, Ordering::SeqCst)
    }

    /// What a process that started says of the agent.
    fn learn(&self, process: &AcpProcess) {
        *lock(&self.prompt_capabilities) = Some(process.capabilities().prompt_capabilities.clone());
        *lock(&self.agent_info) = process.initialized.agent_info.clone();
    }

    /// The processes with no session busy for `ttl`, but those in `kept`.
    fn idle(&self, ttl: Duration, kept: &[Arc<AcpProcess>]) -> Vec<Arc<AcpProcess>> {
        lock(&self.live)
            .iter()
            .filter(|p| {
                p.active.load(Ordering::SeqCst) == 0
                    && p.idle_for() >= ttl
                    && !kept.iter().any(|s| Arc::ptr_eq(s, p))
            })
            .cloned()
            .collect()
    }
}

/// What a new thread took from its principal's spares (`spares.rs`).
pub(super) enum Taken {
    /// A session, now the thread's live one (announced by its first turn); the process
    /// counts the turn.
    Session(Busy),
    /// A process alone, in the thread's pool: the turn makes the session.
    Process(Busy),
}

impl Inner {
    /// The pool of the thread `thread_key` (a scoped key: see [`crate::access::scoped_key`]).
    pub(super) fn key_for(&self, thread_key: &str) -> PoolKey {
        let (principal, _) = crate::access::split_key(thread_key);
        PoolKey {
            principal: principal.to_owned(),
            thread: self.pool_per_thread().then(|| thread_key.to_owned()),
        }
    }

    /// Whether each thread has a pool of its own: each has its own workspace and the agent
    /// is confined.
    pub(super) fn pool_per_thread(&self) -> bool {
        self.workspaces
            .as_ref()
            .is_some_and(|w| w.config().unit == Unit::Thread)
            && self
                .confinement
                .as_ref()
                .is_ok_and(|c| *c != Confinement::None)
    }

    /// The agent home of `principal`: settings and session files of its processes.
    pub(super) fn home(&self, principal: &str) -> std::path::PathBuf {
        self.host
            .data_dir
            .join("homes")
            .join(crate::workspace::name_segment(&self.name))
            .join(crate::workspace::name_segment(principal))
    }

    pub(super) fn remember(&self, thread: &str, process: &Arc<AcpProcess>, session: &str) {
        let bound = Bound {
            process: process.clone(),
            session: session.to_owned(),
            used: Instant::now(),
        };
        self.bindings.bind(thread, bound);
    }

    /// Marks the thread's session used now (a turn began or ended on it).
    pub(super) fn touch_session(&self, thread: &str) {
        self.bindings.touch(thread);
    }

    pub(super) fn forget_process(&self, process: &Arc<AcpProcess>) {
        self.bindings.forget_process(process);
        self.pool.remove(process);
    }

    /// A process of pool `key` for a new session: an idle one, a new one while the pool
    /// has room, else the least busy. It counts as busy from the moment it is chosen (the
    /// guard), so a burst of new threads spreads over the pool instead of all choosing the
    /// same process before any of them has made its session.
    pub(super) async fn acquire(self: &Arc<Self>, key: &PoolKey) -> Result<Busy, AgentError> {
        let _spawning = self.pool.spawning.lock().await;
        if let Some(busy) = self.pool.pick(key, self.config.pool_size) {
            return Ok(busy);
        }
        let thread_dir = match &key.thread {
            Some(thread) => self.thread_dir(thread).await,
            None => None,
        };
        let process = self.spawn_process(key, thread_dir.as_deref()).await?;
        let busy = Busy::new(process.clone());
        self.join_pool(process);
        Ok(busy)
    }

    /// Adds a started process to the pools (its key says which), and starts the reaper.
    pub(super) fn join_pool(self: &Arc<Self>, process: Arc<AcpProcess>) {
        if self.pool.join(process) {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
    }

    /// Starts and initializes a process of pool `key` (`thread_dir`: the workspace a process
    /// of a thread's own may write), outside the pools: [`Inner::join_pool`] adds it.
    pub(super) async fn spawn_process(
        self: &Arc<Self>,
        key: &PoolKey,
        thread_dir: Option<&Path>,
    ) -> Result<Arc<AcpProcess>, AgentError> {
        let launch = self.launch(key, thread_dir).await?;
        let process = AcpProcess::spawn(&self.name, launch, key.clone())
            .await
            .inspect_err(|_| self.health.spawn_failed())?;
        // The one workspace the process writes: its thread's (a pool per thread) or its
        // principal's; an unconfined process of many threads has none of its own.
        let own = match (&self.workspaces, thread_dir) {
            (Some(w), Some(dir)) if self.pool_per_thread() => Some((w, dir.to_owned())),
            (Some(w), _) if w.config().unit == Unit::Principal => {
                Some((w, w.principal_dir(&key.principal)))
            }
            _ => None,
        };
        if let Some((workspaces, dir)) = own
            && workspaces.config().quota.is_some()
        {
            tokio::spawn(super::workdir::watch_process_quota(
                Arc::downgrade(self),
                Arc::downgrade(&process),
                workspaces.clone(),
                [dir, self.home(&key.principal)],
            ));
        }
        self.pool.learn(&process);
        Ok(process)
    }

    /// What a process of pool `key` reports its ways out to.
    fn exits(&self, key: &PoolKey) -> Arc<super::exits::AgentExits> {
        let who = crate::egress::Who {
            agent: self.name.clone(),
            principal: key.principal.clone(),
            thread: key.thread.clone(),
        };
        super::exits::AgentExits::new(who, self.egress.clone(), self.host.egress_metrics.clone())
    }

    /// How to start a process of pool `key`.
    async fn launch(
        self: &Arc<Self>,
        key: &PoolKey,
        thread_dir: Option<&Path>,
    ) -> Result<Launch, AgentError> {
        let unavailable = |message: String| AgentError::Failed {
            code: "AGENT_UNAVAILABLE".to_owned(),
            message: format!("cannot start agent {}: {message}", self.name),
        };
        let confinement = self.confinement.clone().map_err(unavailable)?;
        // A confined agent may connect only to the ports its rules name: the frontend-tools
        // endpoint must exist before it starts.
        let mcp_port = match confinement {
            Confinement::None => None,
            _ => self.bridge().await.map(|b| b.port()),
        };
        let home = self.home(&key.principal);
        let exits = self.exits(key);
        let (config, host, key) = (self.config.clone(), self.host.clone(), key.clone());
        let (workspaces, thread_dir) = (self.workspaces.clone(), thread_dir.map(Path::to_owned));
        tokio::task::spawn_blocking(move || {
            Launch::new(
                &config,
                &host,
                workspaces.as_ref(),
                &home,
                &key,
                thread_dir.as_deref(),
                confinement,
                mcp_port,
                exits,
            )
        })
        .await
        .map_err(|e| AgentError::Backend(format!("agent launch: {e}")))?
        .map_err(unavailable)
    }

    /// Closes the session of `thread` (already taken out of the map): `session/close` and,
    /// when `delete`, `session/delete`, each as the agent offers them and each bounded by
    /// [`CLOSE_WAIT`]; a process of that thread alone is stopped.
    pub(super) async fn close_session(&self, bound: Bound, delete: bool) {
        let Bound {
            process, session, ..
        } = bound;
        if let Some(bridge) = self.mcp.get().cloned().flatten() {
            bridge.unbind(&session);
        }
        if !process.is_alive() {
            return;
        }
        if process.serves_one_thread() {
            self.forget_process(&process);
            process.stop().await;
            return;
        }
        process.router.forget(&session);
        let sessions = &process.capabilities().session_capabilities;
        let close = sessions.close.is_some().then(|| {
            process
                .connection
                .send_request(CloseSessionRequest::new(session.clone()))
                .block_task()
        });
        if let Some(close) = close {
            match tokio::time::timeout(CLOSE_WAIT, close).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(error = %error.message, "session/close failed"),
                Err(_) => {
                    tracing::warn!(agent = %self.name, "session/close did not answer in time")
                }
            }
        }
        if delete && sessions.delete.is_some() {
            let request = agent_client_protocol::v1::schema::DeleteSessionRequest::new(session);
            let deleted = process.connection.send_request(request).block_task();
            match tokio::time::timeout(CLOSE_WAIT, deleted).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(error = %error.message, "session/delete failed"),
                Err(_) => {
                    tracing::warn!(agent = %self.name, "session/delete did not answer in time")
                }
            }
        }
    }

    /// Sessions no turn has used for `session_ttl`, taken out of the map.
    fn take_idle_sessions(&self) -> Vec<Bound> {
        self.bindings.take_idle(self.config.session_ttl)
    }
}

/// Stops processes idle for `idle_ttl` and closes sessions idle for `session_ttl`.
async fn reap(inner: Weak<Inner>) {
    loop {
        let (period, stopped) = match inner.upgrade() {
            Some(inner) => (
                (inner.config.idle_ttl.min(inner.config.session_ttl) / 4)
                    .clamp(Duration::from_millis(100), Duration::from_secs(30)),
                inner.stopped.clone(),
            ),
            None => return,
        };
        tokio::select! {
            () = stopped.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        for bound in inner.take_idle_sessions() {
            tracing::info!(agent = %inner.name, "closing an idle agent session");
            inner.close_session(bound, false).await;
        }
        // A process holding a spare session is kept for its spare (which has a TTL of its
        // own).
        let spares = inner.pooled_spare_processes();
        for process in inner.pool.idle(inner.config.idle_ttl, &spares) {
            tracing::info!(agent = %inner.name, "stopping an idle agent process");
            inner.forget_process(&process);
            process.stop().await;
        }
    }
}
