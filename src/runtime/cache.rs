//! The threads in memory, a room of their own: looked up, created, inserted and discarded;
//! the memory budget they are held under (least recently used leave first); and the stall
//! check over their journals' readers. Loading from the store and the cluster's leases
//! are the runtime's (`lease.rs`), over this room.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::access::ThreadKey;
use crate::clock::now_ms;
use crate::runtime::journal::JournalLimits;
use crate::runtime::thread::{Stored, Thread, new_thread};
use crate::runtime::{LoadError, Runtime, memory};
use crate::sync::lock;

pub(in crate::runtime) struct Threads {
    by_key: Mutex<HashMap<ThreadKey, Arc<Thread>>>,
    /// Bytes held against the memory budget (shared with every thread's journal, queue and
    /// the fleet's history).
    meter: Arc<memory::Meter>,
    /// What retained data may hold: the budget less what is set aside for the process.
    retained_limit: usize,
    /// Threads kept in memory at most.
    bound: usize,
    epoch: u64,
    journal: JournalLimits,
    /// Origin of the stall check's clock (tokio's, so paused-time tests can drive it).
    clock_origin: tokio::time::Instant,
}

impl Threads {
    pub(in crate::runtime) fn new(
        options: &crate::runtime::RuntimeOptions,
        epoch: u64,
        meter: Arc<memory::Meter>,
    ) -> Threads {
        Threads {
            by_key: Mutex::default(),
            meter,
            retained_limit: memory::retained_limit(options.memory_budget, options.memory_reserved),
            bound: options.max_threads_in_memory,
            epoch,
            journal: options.journal,
            clock_origin: tokio::time::Instant::now(),
        }
    }

    /// The thread `id` in memory, marked used now.
    pub(in crate::runtime) fn get(&self, id: &ThreadKey) -> Option<Arc<Thread>> {
        let thread = self.peek(id)?;
        thread.last_used.store(now_ms(), Ordering::Relaxed);
        Some(thread)
    }

    /// The thread `id` in memory, its last use left as it was.
    pub(in crate::runtime) fn peek(&self, id: &ThreadKey) -> Option<Arc<Thread>> {
        lock(&self.by_key).get(id).cloned()
    }

    /// `read` of the thread `id` in memory, under the map's lock (no reference to the
    /// thread is taken: an eviction meanwhile sees it as idle as it is).
    pub(in crate::runtime) fn read<R>(
        &self,
        id: &ThreadKey,
        read: impl FnOnce(&Thread) -> R,
    ) -> Option<R> {
        lock(&self.by_key).get(id).map(|thread| read(thread))
    }

    /// Every thread in memory.
    pub(in crate::runtime) fn all(&self) -> Vec<Arc<Thread>> {
        lock(&self.by_key).values().cloned().collect()
    }

    /// The keys of every thread in memory.
    pub(in crate::runtime) fn keys(&self) -> Vec<ThreadKey> {
        lock(&self.by_key).keys().cloned().collect()
    }

    pub(in crate::runtime) fn meter(&self) -> &Arc<memory::Meter> {
        &self.meter
    }

    /// Bytes held against the memory budget.
    pub(in crate::runtime) fn memory_in_use(&self) -> usize {
        self.meter.get()
    }

    /// What retained data may hold: the budget less what is set aside for the process.
    pub(in crate::runtime) fn retained_limit(&self) -> usize {
        self.retained_limit
    }

    pub(in crate::runtime) fn new_thread(
        &self,
        id: &ThreadKey,
        agent: &str,
        stored: Option<Stored>,
        session_id: Option<String>,
    ) -> Thread {
        new_thread(
            id,
            agent,
            self.epoch,
            self.journal,
            stored,
            session_id,
            self.meter.clone(),
        )
    }

    /// Lets go of what the memory budget does not cover: while over it, threads in order of
    /// least recent use each give up the retained frames of their finished runs, and an
    /// idle one (nobody but the map holds it) leaves memory as well (it reloads from the
    /// store). The thread whose run just ended is the most recently used: its frames, the
    /// ones a client cut near the end reattaches to, go last.
    /// Cheap when under the budget.
    pub(in crate::runtime) fn enforce_budget(&self) {
        let budget = self.retained_limit;
        let meter = &self.meter;
        if meter.get() <= budget {
            return;
        }
        // Down to the low-water mark, so the scan below is paid once per sixteenth of the
        // budget rather than once per run that ends over it.
        let target = low_water(budget);
        tracing::debug!(held = meter.get(), budget, target, "over the memory budget");
        // Lock order: the map, then a thread's state (nothing takes the map under a state
        // lock). Holding the map, nobody takes a new reference to a thread meanwhile.
        let mut threads = lock(&self.by_key);
        let mut by_use: Vec<(u64, &ThreadKey, &Arc<Thread>)> = threads
            .iter()
            .map(|(id, t)| (t.last_used.load(Ordering::Relaxed), id, t))
            .collect();
        by_use.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        // (A retired thread's bytes leave the meter when it is dropped, in `retire`.)
        let mut held = meter.get();
        let mut gone = Vec::new();
        for (_, id, thread) in by_use {
            if held <= target {
                break;
            }
            {
                // Under the state lock, so a run cannot start on the thread meanwhile.
                let state = lock(&thread.state);
                if state.live.is_none() {
                    held = held.saturating_sub(thread.journal.release());
                }
            }
            if Arc::strong_count(thread) == 1 {
                held = held.saturating_sub(thread.cached_bytes());
                gone.push(id.clone());
            }
        }
        retire(&mut threads, gone);
    }

    /// A thread's run ended: its share of the budget is brought up to date and the budget
    /// enforced.
    pub(in crate::runtime) fn run_ended(&self, thread: &Thread) {
        // Its frames are the freshest: they are what a client cut near the end reattaches to.
        thread.last_used.store(now_ms(), Ordering::Relaxed);
        thread.account();
        self.enforce_budget();
    }

    /// The disconnect grace after a run ended is over: its frames leave memory unless a new
    /// run is live, and so does the thread itself when it is idle and larger than a
    /// sixteenth of the budget.
    pub(in crate::runtime) fn grace_over(&self, thread: &Arc<Thread>) {
        {
            let state = lock(&thread.state);
            if state.live.is_some() {
                return;
            }
            thread.journal.release();
        }
        if thread.cached_bytes() > self.retained_limit / 16 {
            let mut threads = lock(&self.by_key);
            // Held by the map and by the caller only: nobody else uses it.
            if threads
                .get(&thread.key)
                .is_some_and(|t| Arc::ptr_eq(t, thread) && Arc::strong_count(t) == 2)
                && let Some(evicted) = threads.remove(&thread.key)
            {
                evicted.retired.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Inserts `thread` unless one with its id is already there; returns the one in place
    /// and whether it is `thread`. Evicts idle threads beyond the in-memory bound.
    pub(in crate::runtime) fn insert(&self, thread: Thread) -> (Arc<Thread>, bool) {
        let mut threads = lock(&self.by_key);
        let mut inserted = false;
        let kept = threads
            .entry(thread.key.clone())
            .or_insert_with(|| {
                inserted = true;
                Arc::new(thread)
            })
            .clone();
        let bound = self.bound;
        if threads.len() > bound {
            // Down to the low-water mark, least recently used first: the scan is paid once
            // per sixteenth of the bound in new threads, not once per new thread.
            let excess = threads.len() - low_water(bound);
            let mut idle = idle_by_use(&threads);
            if idle.len() > excess {
                idle.select_nth_unstable(excess);
                idle.truncate(excess);
            }
            let gone = idle.into_iter().map(|(_, id)| id.to_owned()).collect();
            retire(&mut threads, gone);
        }
        (kept, inserted)
    }

    /// Discards a thread `created` by a request that ends up refused, unless it has been
    /// used meanwhile (a run, a message): a refusal leaves nothing behind, and never takes
    /// away another request's thread.
    pub(in crate::runtime) fn discard_if_pristine(&self, thread: &Arc<Thread>, created: bool) {
        if created && lock(&thread.state).is_pristine() {
            self.discard(thread);
        }
    }

    /// Removes `thread` from memory (if it is still the one there) and retires it.
    pub(in crate::runtime) fn discard(&self, thread: &Arc<Thread>) {
        let mut threads = lock(&self.by_key);
        if threads
            .get(&thread.key)
            .is_some_and(|t| Arc::ptr_eq(t, thread))
        {
            threads.remove(&thread.key);
        }
        thread.retired.store(true, Ordering::SeqCst);
    }

    /// Cuts, in every thread someone holds, the readers that took nothing for `stall`
    /// (see [`crate::runtime::Journal::cut_stalled`]).
    fn cut_stalled(&self, stall: Duration) {
        let threads: Vec<Arc<Thread>> = lock(&self.by_key)
            .values()
            .filter(|t| Arc::strong_count(t) > 1)
            .cloned()
            .collect();
        let now = tokio::time::Instant::now()
            .duration_since(self.clock_origin)
            .as_millis() as u64;
        for thread in threads {
            thread.journal.cut_stalled(now, stall);
        }
    }

    /// Checks every thread's registered readers a few times per stall timeout and cuts the
    /// ones that took nothing for it. One task for all streams; it ends with the room.
    pub(in crate::runtime) fn spawn_stall_check(self: &Arc<Threads>, stall: Duration) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let threads = Arc::downgrade(self);
        handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(threads) = threads.upgrade() else {
                    return;
                };
                threads.cut_stalled(stall);
            }
        });
    }
}

impl Runtime {
    /// The thread from memory, else from the store, else `None`. In a cluster, a thread
    /// that is not in memory is claimed first (see `lease.rs`); the lease of one that does
    /// not exist is kept for the request that creates it.
    pub(in crate::runtime) async fn load_thread(
        &self,
        id: &ThreadKey,
    ) -> Result<Option<Arc<Thread>>, LoadError> {
        let threads = self.threads();
        if let Some(thread) = threads.get(id) {
            if !self.lease_lost(id) {
                return Ok(Some(thread));
            }
            // Lost to another node since it was loaded: not this node's copy any more.
            self.let_go(id);
        }
        self.claim(id).await?;
        let Some(stored) = self.store().load_thread(id.as_str()).await? else {
            return Ok(None);
        };
        let rebuild = stored.row.rewound();
        let thread = threads.new_thread(
            id,
            &stored.row.agent,
            Some((stored.transcript, stored.state)),
            stored.row.session_id.clone(),
        );
        {
            let mut state = lock(&thread.state);
            state.queue = super::queue::restored(id, stored.queue, threads.meter());
            state.rebuild = rebuild;
        }
        let (thread, inserted) = threads.insert(thread);
        if inserted {
            thread.account();
            threads.enforce_budget();
        }
        Ok(Some(thread))
    }

    /// Bytes held against the memory budget.
    pub fn memory_in_use(&self) -> usize {
        self.threads().memory_in_use()
    }

    /// What retained data may hold: the budget less what is set aside for the process.
    pub fn retained_limit(&self) -> usize {
        self.threads().retained_limit()
    }
}

/// Where eviction stops once a bound is crossed: a sixteenth below it (the bound itself
/// when it is that small).
pub(in crate::runtime) fn low_water(bound: usize) -> usize {
    bound - bound / 16
}

/// The threads nobody but the map holds (no request, no stream, no run), with when each was
/// last used. Holding the map lock, nobody can take a new reference meanwhile, so a thread
/// removed from the map never exists twice in memory.
pub(in crate::runtime) fn idle_by_use(
    threads: &HashMap<ThreadKey, Arc<Thread>>,
) -> Vec<(u64, &ThreadKey)> {
    threads
        .iter()
        .filter(|(_, t)| Arc::strong_count(t) == 1)
        .map(|(id, t)| (t.last_used.load(Ordering::Relaxed), id))
        .collect()
}

/// Takes these threads out of memory (they reload from the store when next needed).
pub(in crate::runtime) fn retire(
    threads: &mut HashMap<ThreadKey, Arc<Thread>>,
    ids: Vec<ThreadKey>,
) {
    for id in ids {
        if let Some(evicted) = threads.remove(&id) {
            evicted.retired.store(true, Ordering::SeqCst);
        }
    }
}
