//! Admission: who may start a run now. The daemon's run slots and each capped principal's,
//! the drain that refuses new runs, the start gate that makes the drain see every run it
//! did not refuse, and the tracker of the tasks shutdown waits for. Its state is its own;
//! the rest of the runtime asks it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use crate::access::Principal;
use crate::runtime::{Gauge, StartError};
use crate::sync::lock;

/// A live run's admission: a slot of the daemon's cap, and of its principal's.
pub(crate) struct Slot {
    _global: OwnedSemaphorePermit,
    _principal: Option<PrincipalSlot>,
}

/// One of a capped principal's run slots; given back on drop.
struct PrincipalSlot {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    owner: String,
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let mut counts = lock(&self.counts);
        if let Some(count) = counts.get_mut(&self.owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.owner);
            }
        }
    }
}

/// The start gate, held (shared) by a run start from its look at the drain until its pump
/// is spawned.
pub(in crate::runtime) type Gate<'a> = RwLockReadGuard<'a, ()>;

pub(in crate::runtime) struct Admission {
    capacity: usize,
    slots: Arc<Semaphore>,
    max_per_principal: usize,
    /// Live runs per capped principal (absent: none).
    per_principal: Arc<Mutex<HashMap<String, usize>>>,
    draining: AtomicBool,
    /// Held (shared) by a run start from its look at `draining` until its pump is spawned,
    /// and (exclusive) by `drain` to set it: once `drain` returns, every run either was
    /// refused or is among `tasks`, which shutdown then waits for.
    gate: RwLock<()>,
    /// Pumps, their watchers and the scheduler.
    tasks: TaskTracker,
}

impl Admission {
    pub(in crate::runtime) fn new(capacity: usize, max_per_principal: usize) -> Admission {
        Admission {
            capacity,
            slots: Arc::new(Semaphore::new(capacity)),
            max_per_principal,
            per_principal: Arc::default(),
            draining: AtomicBool::new(false),
            gate: RwLock::new(()),
            tasks: TaskTracker::new(),
        }
    }

    pub(in crate::runtime) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub(in crate::runtime) fn gauge(&self) -> Gauge {
        let capacity = self.capacity;
        Gauge {
            active: capacity - self.slots.available_permits().min(capacity),
            capacity,
        }
    }

    /// A run slot for `principal`: its own cap first (capped principals), then the
    /// daemon's.
    pub(in crate::runtime) fn admit(&self, principal: &Principal) -> Result<Slot, StartError> {
        if self.is_draining() {
            return Err(StartError::Draining);
        }
        let owner = if principal.is_capped() {
            let mut counts = lock(&self.per_principal);
            let count = counts.entry(principal.owner().to_owned()).or_insert(0);
            if *count >= self.max_per_principal {
                return Err(StartError::PrincipalBusy);
            }
            *count += 1;
            Some(PrincipalSlot {
                counts: self.per_principal.clone(),
                owner: principal.owner().to_owned(),
            })
        } else {
            None
        };
        let global = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| StartError::OverCapacity)?;
        Ok(Slot {
            _global: global,
            _principal: owner,
        })
    }

    /// The start gate, unless the runtime drains: the caller keeps it until its run's pump
    /// is spawned (see [`Admission::spawn`]), so `drain` never misses a run it did not
    /// refuse.
    pub(in crate::runtime) fn gate(&self) -> Result<Gate<'_>, StartError> {
        let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        if self.is_draining() {
            return Err(StartError::Draining);
        }
        Ok(gate)
    }

    /// Refuses new runs from now on; returns once no run start is between its look at the
    /// drain and its spawn.
    pub(in crate::runtime) fn drain(&self) {
        let _gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Runs `task` among the tasks shutdown waits for.
    pub(in crate::runtime) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// The tracker a run's watcher joins.
    pub(in crate::runtime) fn tasks(&self) -> TaskTracker {
        self.tasks.clone()
    }

    /// Waits until every tracked task ended or `deadline` passes; `true` when all ended.
    pub(in crate::runtime) async fn wait(&self, deadline: Instant) -> bool {
        self.tasks.close();
        let wait = self.tasks.wait();
        tokio::time::timeout_at(deadline.into(), wait).await.is_ok()
    }
}
