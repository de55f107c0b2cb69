//! Warm starts at start-up: each agent is told once to make ahead what it keeps warm
//! (`Agent::warm_up`), with the threads it asked for (`Agent::warm_threads`): its most
//! recently active threads that have an agent session, active within the age it gave,
//! newest first, read from the store's listing by activity. Those threads are loaded into
//! memory first (under the memory budget, as a run would load them), so their first run
//! after the restart does not wait for the store either.
//!
//! Not in a cluster: which node serves a thread is settled by its lease when a run comes,
//! so a node loading sessions for threads at start-up could load another node's; there
//! each agent is warmed up with no threads (its spares only).

use std::sync::Arc;

use crate::access::ThreadKey;
use crate::agent::Agent;
use crate::clock::now_ms;
use crate::store::ListScope;

use super::Runtime;

/// Rows read per agent beyond the count it asked for (threads without a session, or idle
/// for too long, are passed over).
const SLACK: usize = 16;

impl Runtime {
    /// Warms each agent up, from a task of its own (the store is read first).
    pub(in crate::runtime) fn spawn_warm_up(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let runtime = self.clone();
        handle.spawn(async move {
            let agents: Vec<(String, Arc<dyn Agent>)> = runtime
                .agents()
                .iter()
                .map(|(name, agent)| (name.clone(), agent.clone()))
                .collect();
            let clustered = runtime.options().cluster.is_some();
            for (name, agent) in agents {
                let recent = match agent.warm_threads() {
                    Some((count, within)) if count > 0 && !clustered => {
                        recent_threads(runtime.store(), &name, count, within).await
                    }
                    _ => Vec::new(),
                };
                for (key, _) in &recent {
                    if let Err(error) = runtime.load_thread(key).await {
                        tracing::debug!(?error, "a recent thread was not loaded ahead");
                    }
                }
                if runtime.is_draining() {
                    return;
                }
                let recent = recent
                    .into_iter()
                    .map(|(key, session)| (key.as_str().to_owned(), session))
                    .collect();
                agent.warm_up(recent);
            }
        });
    }
}

/// Up to `count` threads of `agent` with a session, active within `within`, newest first:
/// `(thread key, session id)`.
async fn recent_threads(
    store: &crate::store::Store,
    agent: &str,
    count: usize,
    within: std::time::Duration,
) -> Vec<(ThreadKey, String)> {
    let page = store
        .list_threads(
            count + SLACK,
            None,
            Some(agent.to_owned()),
            ListScope::default(),
        )
        .await;
    let page = match page {
        Ok(page) => page,
        Err(error) => {
            tracing::warn!(agent, %error, "cannot read the recent threads to warm up");
            return Vec::new();
        }
    };
    let since = now_ms() as i64 - within.as_millis() as i64;
    page.threads
        .into_iter()
        .filter(|row| row.updated_at >= since)
        .filter_map(|row| Some((row.key, row.session_id?)))
        .take(count)
        .collect()
}
