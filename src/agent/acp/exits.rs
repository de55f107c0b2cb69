//! What an agent process's ways out report ([`crate::egress::Exits`]): each decision of its
//! egress proxy (logged with whose it was, counted for the agent's status, the fleet and
//! the metrics) and the usage its model relays read in the model's answers, counted
//! against the turn in progress as it streams, so a token budget acts inside the turn.
//!
//! A process that serves several turns at once (one process for a principal's threads)
//! counts what its relays read against the earliest of them: the principal's day is
//! right, a thread's own count may not be. What a process spends with no turn in progress
//! (something it left running, a spare starting up) is counted against its next turn,
//! first thing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::agent::EventSink;
use crate::clock::now_ms;
use crate::egress::{Counters, Decision, Exits, ModelUsage, Who};
use crate::metrics::{AgentEgressMetrics, EgressMetrics};
use crate::sync::lock;

/// One agent process's reports.
pub(super) struct AgentExits {
    who: Who,
    counters: Arc<Counters>,
    metrics: Option<AgentEgressMetrics>,
    turns: Mutex<Vec<Metered>>,
    /// Billed while no turn was in progress: the next turn's, first thing.
    pending: Mutex<ModelUsage>,
    next: AtomicU64,
}

/// A turn in progress and what the relays billed in it.
struct Metered {
    id: u64,
    sink: EventSink,
    used: ModelUsage,
}

impl AgentExits {
    pub(super) fn new(
        who: Who,
        counters: Arc<Counters>,
        metrics: Option<EgressMetrics>,
    ) -> Arc<AgentExits> {
        let metrics = metrics.map(|m| m.agent(&who.agent));
        Arc::new(AgentExits {
            who,
            counters,
            metrics,
            turns: Mutex::default(),
            pending: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    /// A turn starts on the process: what the relays read counts against `sink`'s run
    /// until [`AgentExits::end`].
    pub(super) fn begin(&self, sink: &EventSink) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let earlier = std::mem::take(&mut *lock(&self.pending));
        lock(&self.turns).push(Metered {
            id,
            sink: sink.clone(),
            used: earlier,
        });
        if earlier.total_tokens > 0 {
            let sink = sink.clone();
            tokio::spawn(async move {
                let _ = sink.report_usage(earlier.total_tokens).await;
            });
        }
        id
    }

    /// The turn `id` ended: what the relays billed in it.
    pub(super) fn end(&self, id: u64) -> ModelUsage {
        let mut turns = lock(&self.turns);
        match turns.iter().position(|t| t.id == id) {
            Some(at) => turns.remove(at).used,
            None => ModelUsage::default(),
        }
    }
}

impl Exits for AgentExits {
    fn who(&self) -> &Who {
        &self.who
    }

    fn decided(&self, decision: Decision) {
        let Who {
            agent,
            principal,
            thread,
        } = &self.who;
        let thread = thread.as_deref().unwrap_or("");
        let (host, port, rule, bytes) = (
            &decision.host,
            decision.port,
            &decision.rule,
            decision.bytes,
        );
        if decision.allowed {
            tracing::info!(%agent, %principal, %thread, %host, port, bytes, %rule, "egress allowed");
        } else {
            tracing::warn!(%agent, %principal, %thread, %host, port, %rule, "egress denied");
        }
        if let Some(metrics) = &self.metrics {
            metrics.decided(decision.allowed, bytes);
        }
        self.counters.count(&decision, now_ms());
    }

    fn used(&self, usage: ModelUsage) {
        if let Some(metrics) = &self.metrics {
            metrics.billed(usage.total_tokens);
        }
        let sink = {
            let mut turns = lock(&self.turns);
            let Some(turn) = turns.first_mut() else {
                tracing::info!(agent = %self.who.agent, principal = %self.who.principal, tokens = usage.total_tokens, "model usage outside a turn: counted against the next");
                lock(&self.pending).add(&usage);
                return;
            };
            turn.used.add(&usage);
            turn.sink.clone()
        };
        if usage.total_tokens > 0 {
            tokio::spawn(async move {
                let _ = sink.report_usage(usage.total_tokens).await;
            });
        }
    }
}
