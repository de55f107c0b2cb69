//! Fencing: which thread leases this node holds, and with which epoch.
//!
//! In a cluster (PostgreSQL store) each thread is owned by one node at a time through a
//! lease row (`leases`: thread key, node, epoch, expiry). The cluster layer records here
//! the epoch of every lease it holds; the store stamps each write for a thread with the
//! epoch it finds here at the moment the write is queued, and the database refuses the
//! write unless that lease is still this node's, with that epoch, and unexpired. A refused
//! write marks the thread lost here, which the pump reads after its commit barrier, so a
//! node that lost a thread can neither store nor announce anything more for it.
//!
//! The embedded SQLite store has one node and no leases: it has no fence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One lease as this node holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub epoch: i64,
    /// A write under this lease was refused (the lease expired and was taken, or renewal
    /// found it gone): nothing more may be announced for the thread on this node.
    pub lost: bool,
}

/// This node's leases, shared by the cluster layer (which takes, renews and gives them
/// up) and the store (which stamps and checks writes). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fence {
    node: Arc<str>,
    held: Arc<Mutex<HashMap<String, Held>>>,
}

impl Fence {
    /// No leases yet, for node `node`.
    pub fn new(node: &str) -> Fence {
        Fence {
            node: node.into(),
            held: Arc::default(),
        }
    }

    /// This node's id, as its lease rows name it.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        // Every mutation is a single insert, remove or field store.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that this node holds `key`'s lease with `epoch`.
    pub fn hold(&self, key: &str, epoch: i64) {
        self.lock()
            .insert(key.to_owned(), Held { epoch, lost: false });
    }

    /// Forgets `key` (its lease was given back).
    pub fn release(&self, key: &str) {
        self.lock().remove(key);
    }

    /// The lease held for `key`, if any.
    pub fn held(&self, key: &str) -> Option<Held> {
        self.lock().get(key).copied()
    }

    /// The epoch a write for `key` is stamped with: `None` when this node holds no lease
    /// for it (the write is refused).
    pub fn epoch(&self, key: &str) -> Option<i64> {
        self.held(key).map(|h| h.epoch)
    }

    /// Marks `key`'s lease (at `epoch`) lost: a write under it was refused.
    pub fn mark_lost(&self, key: &str, epoch: i64) {
        if let Some(held) = self.lock().get_mut(key)
            && held.epoch == epoch
        {
            held.lost = true;
        }
    }

    /// Whether `key`'s lease was found lost (or is not held at all).
    pub fn is_lost(&self, key: &str) -> bool {
        self.held(key).is_none_or(|h| h.lost)
    }

    /// Every key held, with its epoch (for renewal).
    pub fn snapshot(&self) -> Vec<(String, i64)> {
        self.lock()
            .iter()
            .filter(|(_, h)| !h.lost)
            .map(|(k, h)| (k.clone(), h.epoch))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_lease_stays_lost_until_taken_again() {
        let fence = Fence::new("n1");
        assert!(fence.is_lost("t"));
        fence.hold("t", 3);
        assert_eq!(fence.epoch("t"), Some(3));
        assert!(!fence.is_lost("t"));
        // A refusal stamped with an older epoch does not mark the newer holding lost.
        fence.mark_lost("t", 2);
        assert!(!fence.is_lost("t"));
        fence.mark_lost("t", 3);
        assert!(fence.is_lost("t"));
        assert!(fence.snapshot().is_empty());
        fence.hold("t", 4);
        assert!(!fence.is_lost("t"));
        fence.release("t");
        assert_eq!(fence.held("t"), None);
    }
}
