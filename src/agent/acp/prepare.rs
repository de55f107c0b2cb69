//! Sessions loaded ahead: a thread's stored session loaded (`session/load`, or resumed)
//! on the process its turn will use before the turn asks for it.
//!
//! Started when a run on a thread whose session is not live is admitted (`Agent::prepare`:
//! the load overlaps the rest of the run's set-up, its commit, `RUN_STARTED` and the pump's
//! start), and at start-up for the agent's `preload_sessions` most recently active threads
//! (active within `session_ttl`, newest first; `Agent::warm_up`). The thread's turn waits
//! for a load in flight, then finds the session live, bound outside a turn: its run is
//! told what a load in the turn would have told it (`loaded` or `resumed`, the session's
//! modes and options, then set back to the thread's mode and options). A load the agent
//! refuses is not tried again: the turn starts a new session, as it would have after its
//! own load was refused; one that could not be tried (no process) leaves nothing behind and
//! the turn tries as it would have. A session loaded ahead that no turn uses is closed
//! after `session_ttl`, like any other.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tokio::time::Instant;

use super::bind::Announce;
use super::pool::Bound;
use super::process::AcpProcess;
use super::settings::SessionSettings;
use super::{Inner, Stop, lock};
use crate::agent::Turn;

/// Loads in flight, by thread key.
#[derive(Default)]
pub(super) struct Preparing {
    loads: std::sync::Mutex<HashMap<String, Load>>,
    next: std::sync::atomic::AtomicU64,
    /// Threads whose stored session the agent would not load or resume ahead, until
    /// their turn reads it.
    refused: std::sync::Mutex<HashSet<String>>,
}

/// How a load ahead went.
enum Loaded {
    /// The session is live on the process: how it came, its modes and options.
    Live(Arc<AcpProcess>, &'static str, SessionSettings),
    /// The agent answered that it cannot load or resume it.
    Refused,
    /// It could not be tried (no workspace, no process, a timeout, the agent stopping).
    Untried,
}

/// A load in flight.
struct Load {
    /// Tells this load from a later one of the same thread.
    n: u64,
    /// Turns true once the load is over (the session live, or not).
    done: watch::Receiver<bool>,
}

impl Inner {
    /// Loads the stored session `stored` of thread `thread_key` ahead of its turn, unless
    /// it is live or already being loaded. Returns at once.
    pub(super) fn prepare(self: &Arc<Self>, thread_key: &str, stored: &str) {
        if self.stopped.is_cancelled() {
            return;
        }
        if self.bindings.live(thread_key).is_some() {
            return;
        }
        let (done_tx, done) = watch::channel(false);
        let n = self.preparing.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut loads = lock(&self.preparing.loads);
            if loads.contains_key(thread_key) {
                return;
            }
            loads.insert(thread_key.to_owned(), Load { n, done });
        }
        let (inner, thread, stored) = (self.clone(), thread_key.to_owned(), stored.to_owned());
        self.tasks.spawn(async move {
            let loaded = tokio::select! {
                loaded = inner.load_ahead(&thread, &stored) => loaded,
                () = inner.stopped.cancelled() => Loaded::Untried,
            };
            // Still wanted unless the thread was deleted meanwhile.
            let wanted = {
                let mut loads = lock(&inner.preparing.loads);
                let ours = loads.get(&thread).is_some_and(|load| load.n == n);
                if ours {
                    loads.remove(&thread);
                }
                ours && !inner.stopped.is_cancelled()
            };
            if let (Loaded::Refused, true) = (&loaded, wanted) {
                lock(&inner.preparing.refused).insert(thread.clone());
            }
            if let Loaded::Live(process, how, settings) = loaded {
                if wanted {
                    inner.remember(&thread, &process, &stored);
                    let announce = Announce {
                        how,
                        settings: Some(settings),
                        changes: Vec::new(),
                        restore: true,
                    };
                    inner.bindings.bound_outside(&thread, announce);
                } else {
                    let bound = Bound {
                        process,
                        session: stored,
                        used: Instant::now(),
                    };
                    inner.close_session(bound, false).await;
                }
            }
            let _ = done_tx.send(true);
        });
    }

    /// Waits for a load of the turn's thread, if one is in flight (a cancel of the turn
    /// ends the wait).
    pub(super) async fn prepared(&self, turn: &Turn) -> Result<(), Stop> {
        let done = lock(&self.preparing.loads)
            .get(&turn.thread_id)
            .map(|load| load.done.clone());
        let Some(mut done) = done else {
            return Ok(());
        };
        tokio::select! {
            // The sender gone (the load's task ended without a word) is as good as done.
            _ = done.wait_for(|done| *done) => Ok(()),
            () = turn.cancel.cancelled() => Err(Stop::Closed),
        }
    }

    /// A thread was deleted: a load in flight is no longer wanted.
    pub(super) fn forget_load(&self, thread_key: &str) {
        lock(&self.preparing.loads).remove(thread_key);
        lock(&self.preparing.refused).remove(thread_key);
    }

    /// Whether the agent refused to load the thread's session ahead (once: the mark goes).
    pub(super) fn load_refused(&self, thread_key: &str) -> bool {
        lock(&self.preparing.refused).remove(thread_key)
    }

    /// The load itself: the thread's workspace, the process its turn would use, the
    /// session restored there.
    async fn load_ahead(self: &Arc<Self>, thread: &str, stored: &str) -> Loaded {
        let Ok(cwd) = self.workdir(thread).await else {
            return Loaded::Untried;
        };
        let Ok(busy) = self.acquire(&self.key_for(thread)).await else {
            return Loaded::Untried;
        };
        let process = busy.0.clone();
        let (mcp_servers, mcp_handle) = self.mcp_servers(&process).await;
        let cancel = self.stopped.child_token();
        let restored = self
            .restore(
                &cancel,
                &process,
                stored,
                &cwd,
                &mcp_servers,
                mcp_handle.as_ref(),
            )
            .await;
        if let Ok(Some((how, settings))) = restored {
            tracing::info!(agent = %self.name, session = %stored, "session loaded ahead of its turn");
            return Loaded::Live(process, how, settings);
        }
        if let (Some(handle), Some(bridge)) = (&mcp_handle, self.mcp.get().cloned().flatten()) {
            bridge.release(handle);
        }
        match restored {
            Ok(_) => Loaded::Refused,
            Err(_) => Loaded::Untried,
        }
    }
}
