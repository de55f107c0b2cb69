//! Spares: a new thread's first prompt without the agent's start-up. Per principal, up to
//! `spares` spares are kept ready, each a process already initialized and (with
//! `spare_session`, the default) a session already made with the `cwd`, `mcpServers`, mode
//! and config options a `session/new` for a new thread would get. A new thread's first turn
//! takes one and goes straight to `session/prompt`; the keeper task makes its replacement
//! in the background.
//!
//! Where a spare lives is where its thread's session would (`pool.rs`):
//! - a pool of one thread (each thread its own workspace, the agent confined): a process
//!   started outside the pools, confined to a spare workspace made for it
//!   (`workspace/spare.rs`). The thread that takes it adopts that workspace (its record is
//!   written and synced before the session is used, so the thread keeps it across
//!   restarts) and the process joins the thread's pool;
//! - a pool shared by a principal's threads: a session made ahead on a process of that pool
//!   (acquired as a new session's would be, within `pool_size`), in the directory its
//!   thread will work in (a spare workspace where each thread has its own, else the shared
//!   one). There a spare without a session only keeps a process of the pool started: it is
//!   never taken.
//!
//! Whose: the operator's from the start, any other principal's from its first turn on (the
//! daemon does not know a principal before it sees one), for at most `spare_principals`
//! principals (the most recently seen). A principal with no turn for `spare_ttl` has its
//! spares stopped (a spare's own process stopped, a session made ahead closed and deleted,
//! an unadopted workspace removed); they are made again at its next turn. A spare is not a
//! run: it takes no admission slot and counts against no limit of its principal; its
//! process is shown among the agent's idle processes. One spare is made at a time per
//! agent, and none while a turn that took one still runs (for 10 s at most: starting an
//! agent takes CPU that turn should have); after a failure the next try waits (5 s,
//! doubling up to 5 min). With `spares = 0` (the default) nothing is made and no task
//! started.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::NewSessionRequest;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::bind::{Announce, session_answer};
use super::launch::PoolKey;
use super::pool::{Bound, Taken};
use super::process::{AcpProcess, Busy};
use super::settings::{SessionSettings, StateChange};
use super::{Inner, Stop, lock};
use crate::agent::AgentError;
use crate::workspace::{Unit, Workspaces};

/// How long at most a taken spare's replacement waits for the turn that took it.
const DEFER_MOST: Duration = Duration::from_secs(10);
/// The first wait after a failed spare, doubled after each further failure.
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between tries.
const RETRY_MOST: Duration = Duration::from_secs(300);

/// An agent's spares, by principal.
#[derive(Default)]
pub(super) struct Spares {
    stock: Mutex<HashMap<String, Stock>>,
    /// Wakes the keeper: a spare taken or made, a principal seen.
    wake: Arc<Notify>,
    /// Whether the keeper runs.
    keeper: AtomicBool,
    /// Whether a spare is being made (one at a time).
    making: AtomicBool,
    /// Threads whose turn that took a spare still runs, and since when: no spare is made
    /// meanwhile (for at most [`DEFER_MOST`]), so making one does not slow that turn down.
    taking: Mutex<HashMap<String, Instant>>,
}

/// One principal's spares.
struct Stock {
    ready: Vec<Spare>,
    /// The principal's last turn (the start, for the operator's).
    seen: Instant,
    /// No spare is made before this (after a failure).
    retry_at: Option<Instant>,
    failures: u32,
}

/// A spare ready for a new thread.
pub(super) struct Spare {
    process: Arc<AcpProcess>,
    /// Its process is in a pool already (one its principal's threads share); else its own
    /// until a thread takes it.
    pooled: bool,
    session: Option<Made>,
    /// The spare workspace made for it (each thread its own workspace).
    workspace: Option<PathBuf>,
}

/// A session made ahead.
struct Made {
    id: String,
    /// Its modes and options as the agent made them.
    settings: SessionSettings,
    /// What setting the agent's session defaults changed in the state.
    changes: Vec<StateChange>,
}

impl Inner {
    /// At start-up: the operator's spares, when spares are configured.
    pub(super) fn start_spares(self: &Arc<Self>) {
        self.saw_principal("");
    }

    /// Notes a turn of `principal`: its spares are kept for `spare_ttl` from now (made, if
    /// it has none yet).
    pub(super) fn saw_principal(self: &Arc<Self>, principal: &str) {
        if self.config.warm.spares == 0 || self.stopped.is_cancelled() {
            return;
        }
        let (fresh, evicted) = {
            let mut stock = lock(&self.spares.stock);
            match stock.get_mut(principal) {
                Some(stock) => {
                    stock.seen = Instant::now();
                    (false, Vec::new())
                }
                None => {
                    // Past `spare_principals`, the least recently seen principal's go.
                    let mut evicted = Vec::new();
                    if stock.len() >= self.config.warm.spare_principals.max(1)
                        && let Some(oldest) = stock
                            .iter()
                            .min_by_key(|(_, s)| s.seen)
                            .map(|(p, _)| p.clone())
                        && let Some(gone) = stock.remove(&oldest)
                    {
                        evicted = gone.ready;
                    }
                    stock.insert(
                        principal.to_owned(),
                        Stock {
                            ready: Vec::new(),
                            seen: Instant::now(),
                            retry_at: None,
                            failures: 0,
                        },
                    );
                    (true, evicted)
                }
            }
        };
        if !evicted.is_empty() {
            let inner = self.clone();
            self.tasks.spawn(async move {
                for spare in evicted {
                    inner.discard_spare(spare).await;
                }
            });
        }
        if !self.spares.keeper.swap(true, Ordering::SeqCst) {
            let wake = self.spares.wake.clone();
            let stopped = self.stopped.clone();
            self.tasks.spawn(keep(Arc::downgrade(self), wake, stopped));
        }
        if fresh {
            self.spares.wake.notify_one();
        }
    }

    /// A spare for the new thread `thread_key`, if its principal has one ready: a session
    /// made ahead, bound to the thread, or a process of its own. `None` also when the
    /// thread has a workspace already (the spare waits for another thread).
    pub(super) async fn take_spare(self: &Arc<Self>, thread_key: &str) -> Option<Taken> {
        if self.config.warm.spares == 0 {
            return None;
        }
        let (principal, thread) = crate::access::split_key(thread_key);
        let spare = {
            let mut stock = lock(&self.spares.stock);
            let ready = &mut stock.get_mut(principal)?.ready;
            let at = ready
                .iter()
                .position(|s| s.process.is_alive() && (s.session.is_some() || !s.pooled))?;
            ready.remove(at)
        };
        if let (Some(dir), Some(workspaces)) = (&spare.workspace, self.workspaces.clone()) {
            let (p, t, d) = (principal.to_owned(), thread.to_owned(), dir.clone());
            let adopted = tokio::task::spawn_blocking(move || workspaces.adopt(&p, &t, &d)).await;
            if !matches!(adopted, Ok(Ok(()))) {
                tracing::debug!(agent = %self.name, "the thread has a workspace already; the spare waits for another");
                self.put_back(principal, spare).await;
                return None;
            }
        }
        // Its replacement waits for this turn.
        lock(&self.spares.taking).insert(thread_key.to_owned(), Instant::now());
        let Spare {
            process,
            pooled,
            session,
            ..
        } = spare;
        // Counted busy before it joins a pool, so the reaper never sees it idle.
        let busy = Busy::new(process.clone());
        if !pooled {
            process.assign(self.key_for(thread_key));
            self.join_pool(process.clone());
        }
        tracing::info!(agent = %self.name, session = session.is_some(), "a new thread takes a spare");
        Some(match session {
            Some(made) => {
                self.remember(thread_key, &process, &made.id);
                let announce = Announce {
                    how: "new",
                    settings: Some(made.settings),
                    changes: made.changes,
                    restore: false,
                };
                self.bindings.bound_outside(thread_key, announce);
                Taken::Session(busy)
            }
            None => Taken::Process(busy),
        })
    }

    /// The turn of `thread_key` ended: a replacement of the spare it took may be made now.
    pub(super) fn turn_ended(&self, thread_key: &str) {
        if self.config.warm.spares > 0 && lock(&self.spares.taking).remove(thread_key).is_some() {
            self.spares.wake.notify_one();
        }
    }

    /// Spares ready now (every principal's).
    pub(super) fn spares_ready(&self) -> usize {
        lock(&self.spares.stock)
            .values()
            .map(|s| s.ready.iter().filter(|s| s.process.is_alive()).count())
            .sum()
    }

    /// The processes spares hold outside the pools.
    pub(super) fn spare_processes(&self) -> Vec<Arc<AcpProcess>> {
        lock(&self.spares.stock)
            .values()
            .flat_map(|s| s.ready.iter())
            .filter(|s| !s.pooled && s.process.is_alive())
            .map(|s| s.process.clone())
            .collect()
    }

    /// Pool processes a spare holds: not stopped for idleness.
    pub(super) fn pooled_spare_processes(&self) -> Vec<Arc<AcpProcess>> {
        lock(&self.spares.stock)
            .values()
            .flat_map(|s| s.ready.iter())
            .filter(|s| s.pooled)
            .map(|s| s.process.clone())
            .collect()
    }

    /// Every spare, taken out (at shutdown).
    pub(super) fn drain_spares(&self) -> Vec<Spare> {
        lock(&self.spares.stock)
            .drain()
            .flat_map(|(_, s)| s.ready)
            .collect()
    }

    /// Stops a spare nobody took: its own process stopped, its session closed and deleted,
    /// its workspace removed.
    pub(super) async fn discard_spare(&self, spare: Spare) {
        if let Some(made) = &spare.session {
            let bound = Bound {
                process: spare.process.clone(),
                session: made.id.clone(),
                used: Instant::now(),
            };
            if spare.pooled {
                self.close_session(bound, true).await;
            } else if let Some(bridge) = self.mcp.get().cloned().flatten() {
                bridge.unbind(&made.id);
            }
        }
        if !spare.pooled {
            spare.process.stop().await;
        }
        if let (Some(dir), Some(workspaces)) = (spare.workspace, self.workspaces.clone()) {
            remove_workspace(workspaces, dir).await;
        }
    }

    /// A spare the thread could not take goes back to its principal's stock (or is
    /// discarded when the stock is gone).
    async fn put_back(&self, principal: &str, spare: Spare) {
        let left = {
            let mut stock = lock(&self.spares.stock);
            match stock.get_mut(principal) {
                Some(stock) if !self.stopped.is_cancelled() => {
                    stock.ready.push(spare);
                    None
                }
                _ => Some(spare),
            }
        };
        if let Some(spare) = left {
            self.discard_spare(spare).await;
        }
    }

    /// Stops the spares of principals unseen for `spare_ttl` (their stock goes), and those
    /// whose process died.
    async fn expire_spares(&self) {
        let ttl = self.config.warm.spare_ttl;
        let gone: Vec<Spare> = {
            let mut stock = lock(&self.spares.stock);
            let mut gone = Vec::new();
            stock.retain(|_, stock| {
                let (alive, dead): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut stock.ready)
                    .into_iter()
                    .partition(|s| s.process.is_alive());
                stock.ready = alive;
                gone.extend(dead);
                if stock.seen.elapsed() >= ttl {
                    gone.append(&mut stock.ready);
                    return false;
                }
                true
            });
            gone
        };
        for spare in gone {
            tracing::info!(agent = %self.name, "stopping a spare");
            self.discard_spare(spare).await;
        }
    }

    /// Starts making a spare for a principal short of them, unless one is being made.
    fn fill_spares(self: &Arc<Self>) {
        if self.stopped.is_cancelled() || self.spares.making.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut taking = lock(&self.spares.taking);
            taking.retain(|_, at| at.elapsed() < DEFER_MOST);
            if !taking.is_empty() {
                return;
            }
        }
        let (wanted, now) = (self.config.warm.spares, Instant::now());
        let principal = lock(&self.spares.stock)
            .iter()
            .find(|(_, s)| s.ready.len() < wanted && s.retry_at.is_none_or(|at| at <= now))
            .map(|(principal, _)| principal.clone());
        let Some(principal) = principal else {
            return;
        };
        if self.spares.making.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = self.clone();
        self.tasks.spawn(async move {
            let made = tokio::select! {
                made = inner.make_spare(&principal) => Some(made),
                () = inner.stopped.cancelled() => None,
            };
            match made {
                Some(Ok(spare)) => inner.keep_spare(&principal, spare).await,
                Some(Err(error)) => {
                    tracing::warn!(agent = %inner.name, %error, "cannot make a spare");
                    if let Some(stock) = lock(&inner.spares.stock).get_mut(&principal) {
                        stock.failures += 1;
                        let wait = RETRY_FIRST
                            .saturating_mul(1 << (stock.failures - 1).min(8))
                            .min(RETRY_MOST);
                        stock.retry_at = Some(Instant::now() + wait);
                    }
                }
                None => {}
            }
            inner.spares.making.store(false, Ordering::SeqCst);
            inner.spares.wake.notify_one();
        });
    }

    /// A spare just made joins its principal's stock (or is discarded: the stock is gone).
    async fn keep_spare(&self, principal: &str, spare: Spare) {
        let left = {
            let mut stock = lock(&self.spares.stock);
            match stock.get_mut(principal) {
                Some(stock) if !self.stopped.is_cancelled() => {
                    stock.failures = 0;
                    stock.retry_at = None;
                    stock.ready.push(spare);
                    None
                }
                _ => Some(spare),
            }
        };
        if let Some(spare) = left {
            self.discard_spare(spare).await;
        }
    }

    /// Makes a spare for `principal`: its workspace (each thread its own), its process (its
    /// own for a pool of one thread, else one of the principal's pool) and, with
    /// `spare_session`, its session.
    async fn make_spare(self: &Arc<Self>, principal: &str) -> Result<Spare, AgentError> {
        let own_process = self.pool_per_thread();
        let session = self.config.warm.spare_session;
        let workspaces = self
            .workspaces
            .clone()
            .filter(|w| w.config().unit == Unit::Thread && (own_process || session));
        let workspace = match workspaces.clone() {
            Some(workspaces) => Some(spare_workspace(workspaces, principal).await?),
            None => None,
        };
        let made = self
            .make_spare_in(principal, own_process, workspace.clone())
            .await;
        if let (Err(_), Some(dir), Some(workspaces)) = (&made, workspace, workspaces) {
            remove_workspace(workspaces, dir).await;
        }
        made
    }

    async fn make_spare_in(
        self: &Arc<Self>,
        principal: &str,
        own_process: bool,
        workspace: Option<PathBuf>,
    ) -> Result<Spare, AgentError> {
        let key = PoolKey {
            principal: principal.to_owned(),
            thread: None,
        };
        let (process, _busy) = if own_process {
            let process = self.spawn_process(&key, workspace.as_deref()).await?;
            (process, None)
        } else {
            let busy = self.acquire(&key).await?;
            (busy.0.clone(), Some(busy))
        };
        let mut spare = Spare {
            process: process.clone(),
            pooled: !own_process,
            session: None,
            workspace,
        };
        if !self.config.warm.spare_session {
            return Ok(spare);
        }
        let cwd = match &spare.workspace {
            Some(dir) => dir.clone(),
            None => {
                self.workdir(&crate::access::scoped_key(principal, ""))
                    .await?
            }
        };
        match self.session_ahead(&process, &cwd).await {
            Ok(made) => {
                spare.session = Some(made);
                Ok(spare)
            }
            Err(error) => {
                if own_process {
                    process.stop().await;
                }
                Err(error)
            }
        }
    }

    /// `session/new` in `cwd` on `process` with no run to show it to, and the agent's
    /// session defaults set on it, as a new thread's first turn would.
    async fn session_ahead(
        &self,
        process: &Arc<AcpProcess>,
        cwd: &std::path::Path,
    ) -> Result<Made, AgentError> {
        let (mcp_servers, mcp_handle) = self.mcp_servers(process).await;
        let release = |handle: &Option<super::mcp::McpHandle>| {
            if let (Some(handle), Some(bridge)) = (handle, self.mcp.get().cloned().flatten()) {
                bridge.release(handle);
            }
        };
        let new = NewSessionRequest::new(cwd).mcp_servers(mcp_servers);
        let request = process.connection.send_request(new).block_task();
        let cancel: CancellationToken = self.stopped.child_token();
        let created = match session_answer(&cancel, "session/new", request).await {
            Ok(Ok(created)) => created,
            Ok(Err(error)) => {
                release(&mcp_handle);
                return Err(if error.code == ErrorCode::AUTH_REQUIRED {
                    self.auth_required(process, &error.message, false)
                } else {
                    AgentError::Failed {
                        code: "AGENT_ERROR".to_owned(),
                        message: format!("session/new failed: {}", error.message),
                    }
                });
            }
            Err(stop) => {
                release(&mcp_handle);
                return Err(stopped(stop));
            }
        };
        self.health.session_ok();
        let id = created.session_id.to_string();
        if let Some(handle) = &mcp_handle {
            handle.set_session(&id);
        }
        let settings = SessionSettings {
            modes: created.modes,
            config_options: created.config_options,
        };
        let mut changes = Vec::new();
        if let Err(stop) = self
            .set_defaults(&settings, process, &id, &mut changes)
            .await
        {
            let bound = Bound {
                process: process.clone(),
                session: id,
                used: Instant::now(),
            };
            self.close_session(bound, true).await;
            return Err(stopped(stop));
        }
        tracing::info!(agent = %self.name, session = %id, "spare session made");
        Ok(Made {
            id,
            settings,
            changes,
        })
    }
}

/// The error of a spare's step that stopped.
fn stopped(stop: Stop) -> AgentError {
    match stop {
        Stop::Failed(error) => error,
        Stop::Closed => AgentError::Backend("the agent is stopping".to_owned()),
    }
}

/// Makes a spare workspace of `principal` (blocking work on the blocking pool).
async fn spare_workspace(workspaces: Workspaces, principal: &str) -> Result<PathBuf, AgentError> {
    let dir = workspaces.spare_dir(principal);
    let made = dir.clone();
    tokio::task::spawn_blocking(move || workspaces.prepare(&made))
        .await
        .map_err(|e| AgentError::Backend(format!("workspace: {e}")))?
        .map_err(|e| AgentError::Failed {
            code: "WORKSPACE_UNAVAILABLE".to_owned(),
            message: format!("cannot make a spare workspace: {e}"),
        })?;
    Ok(dir)
}

/// Removes a spare workspace nobody adopted.
async fn remove_workspace(workspaces: Workspaces, dir: PathBuf) {
    let removed = tokio::task::spawn_blocking(move || workspaces.remove(&dir)).await;
    if !matches!(removed, Ok(Ok(()))) {
        tracing::warn!("cannot remove a spare workspace");
    }
}

/// The keeper: replaces taken spares, stops expired ones; first removes the spare
/// workspaces an earlier process left. Ends with the agent.
async fn keep(inner: Weak<Inner>, wake: Arc<Notify>, stopped: CancellationToken) {
    if let Some(workspaces) = inner.upgrade().and_then(|i| i.workspaces.clone()) {
        let swept = tokio::task::spawn_blocking(move || workspaces.sweep_spares()).await;
        if let Ok(n) = swept
            && n > 0
        {
            tracing::info!(
                removed = n,
                "removed spare workspaces an earlier process left"
            );
        }
    }
    loop {
        let period = match inner.upgrade() {
            Some(inner) => {
                (inner.config.warm.spare_ttl / 4).clamp(Duration::from_millis(100), DEFER_MOST)
            }
            None => return,
        };
        tokio::select! {
            () = stopped.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(period) => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.expire_spares().await;
        inner.fill_spares();
    }
}
