//! The live runs, by key: every AG-UI run id of their segments, in the owner's namespace
//! ([`crate::access::scoped_key`]). A run is registered when it starts and when an answer
//! opens a segment under a new id, and leaves under all of them when it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::runtime::{LiveRun, Phase};
use crate::sync::lock;

#[derive(Default)]
pub(in crate::runtime) struct LiveRuns {
    by_key: Mutex<HashMap<String, Arc<LiveRun>>>,
}

impl LiveRuns {
    pub(in crate::runtime) fn contains(&self, key: &str) -> bool {
        lock(&self.by_key).contains_key(key)
    }

    /// Whether `key` names a live run other than `run`.
    pub(in crate::runtime) fn names_another(&self, key: &str, run: &Arc<LiveRun>) -> bool {
        lock(&self.by_key)
            .get(key)
            .is_some_and(|other| !Arc::ptr_eq(other, run))
    }

    pub(in crate::runtime) fn get(&self, key: &str) -> Option<Arc<LiveRun>> {
        lock(&self.by_key).get(key).cloned()
    }

    pub(in crate::runtime) fn insert(&self, key: String, run: Arc<LiveRun>) {
        lock(&self.by_key).insert(key, run);
    }

    /// Takes `run` out under each of `keys` that still names it.
    pub(in crate::runtime) fn remove(
        &self,
        keys: impl IntoIterator<Item = String>,
        run: &Arc<LiveRun>,
    ) {
        let mut by_key = lock(&self.by_key);
        for key in keys {
            if by_key.get(&key).is_some_and(|r| Arc::ptr_eq(r, run)) {
                by_key.remove(&key);
            }
        }
    }

    /// Every live run (a run with several segments once per id).
    pub(in crate::runtime) fn all(&self) -> Vec<Arc<LiveRun>> {
        lock(&self.by_key).values().cloned().collect()
    }

    /// The live runs of id `run_id` in every namespace.
    pub(in crate::runtime) fn with_id(&self, run_id: &str) -> Vec<Arc<LiveRun>> {
        lock(&self.by_key)
            .iter()
            .filter(|(key, _)| crate::access::split_key(key).1 == run_id)
            .map(|(_, run)| run.clone())
            .collect()
    }

    /// Live runs parked on the client, each counted under its own id.
    pub(in crate::runtime) fn suspended(&self) -> usize {
        lock(&self.by_key)
            .iter()
            .filter(|(key, run)| {
                crate::access::split_key(key).1 == run.id && run.phase.get() == Phase::Suspended
            })
            .count()
    }
}
