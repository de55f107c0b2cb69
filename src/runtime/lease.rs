//! The runtime's side of a cluster: a thread is in this node's memory only while this node
//! holds its lease (see [`crate::cluster`]).
//!
//! - [`Runtime::claim`] runs before a thread is loaded from the store or created: it takes
//!   the lease, recovers a thread taken over from another holder (its live runs become
//!   `interrupted`, as a restart does for a single daemon), or answers
//!   [`LoadError::Elsewhere`] with the owner to forward to.
//! - One task renews the leases of the threads in memory every third of the lifetime. A
//!   lease found lost ends the thread's run (`RUN_ERROR{code:"LEASE_LOST"}`) and takes the
//!   thread out of memory, so the next request claims it again (and is forwarded).
//! - The pump's commit barrier also asks [`Runtime::lease_lost`]: once a write for the
//!   thread was refused by the fence, nothing more is announced for it.

use super::{CancelReason, Runtime};
use crate::access::ThreadKey;
use crate::cluster::{Claim, Owner};
use crate::store::StoreError;
use crate::sync::lock;

/// Why a thread could not be loaded here.
#[derive(Debug)]
pub enum LoadError {
    /// The store failed (logged where it happened).
    Store,
    /// Another live node owns the thread.
    Elsewhere(Owner),
}

impl From<StoreError> for LoadError {
    fn from(error: StoreError) -> LoadError {
        tracing::error!(%error, "store failed while loading a thread");
        LoadError::Store
    }
}

impl Runtime {
    /// Takes `key`'s lease before the thread is loaded or created on this node (nothing to
    /// do without a cluster).
    pub(super) async fn claim(&self, key: &ThreadKey) -> Result<(), LoadError> {
        let Some(cluster) = &self.options().cluster else {
            return Ok(());
        };
        match cluster.claim(key.as_str()).await {
            Ok(Claim::Mine { taken_over, epoch }) => {
                if taken_over {
                    match self.store().recover_thread(key.as_str()).await {
                        Ok(runs) => {
                            tracing::info!(epoch, runs, "thread taken over from another holder");
                        }
                        Err(error) => {
                            // Taken over again (and recovered) by the next request.
                            cluster.forget(key.as_str());
                            return Err(error.into());
                        }
                    }
                }
                Ok(())
            }
            Ok(Claim::Elsewhere(owner)) => Err(LoadError::Elsewhere(owner)),
            Err(error) => {
                tracing::error!(%error, "thread lease could not be claimed");
                Err(LoadError::Store)
            }
        }
    }

    /// The other node that owns thread `key`, when the thread is not in this node's memory
    /// and another node holds its lease (always `None` without a cluster).
    pub async fn owner_elsewhere(&self, key: &ThreadKey) -> Option<Owner> {
        let cluster = self.options().cluster.as_ref()?;
        if self.threads().get(key).is_some() {
            return None;
        }
        match cluster.owner_elsewhere(key.as_str()).await {
            Ok(owner) => owner,
            Err(error) => {
                tracing::warn!(%error, "thread owner could not be looked up");
                None
            }
        }
    }

    /// Gives back every lease this node holds and removes it from the node list (the last
    /// step of a clean shutdown in a cluster).
    pub async fn release_leases(&self) {
        let Some(cluster) = &self.options().cluster else {
            return;
        };
        match cluster.leave().await {
            Ok(leases) => tracing::info!(leases, "left the cluster; thread leases given back"),
            Err(error) => {
                tracing::warn!(%error, "thread leases could not be given back; they lapse")
            }
        }
    }

    /// The other live nodes' addresses and certificates (empty without a cluster).
    pub async fn peers(&self) -> Vec<(String, Option<Vec<u8>>)> {
        let Some(cluster) = &self.options().cluster else {
            return Vec::new();
        };
        cluster.peers().await.unwrap_or_else(|error| {
            tracing::warn!(%error, "cluster nodes could not be listed");
            Vec::new()
        })
    }

    /// Whether a write for thread `key` was refused because this node lost its lease
    /// (always `false` without a cluster).
    pub(crate) fn lease_lost(&self, key: &ThreadKey) -> bool {
        self.options()
            .cluster
            .as_ref()
            .is_some_and(|cluster| cluster.fence().is_lost(key.as_str()))
    }

    /// Renews the leases of the threads in memory every third of the lease lifetime, and
    /// lets go of the threads whose lease was lost.
    pub(super) fn spawn_lease_renewal(&self) {
        let Some(cluster) = self.options().cluster.clone() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = self.downgrade();
        handle.spawn(async move {
            let mut tick = tokio::time::interval(cluster.lease_ttl() / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(runtime) = weak.upgrade() else {
                    return;
                };
                let keys: Vec<ThreadKey> = runtime.threads().keys();
                let texts: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
                runtime.adopt_orphans(&cluster).await;
                match cluster.renew(&texts).await {
                    Ok(_) => {
                        // Lost at this renewal, or earlier by a refused write: either way
                        // the thread is no longer this node's.
                        for key in keys {
                            if cluster.fence().is_lost(key.as_str()) {
                                runtime.let_go(&key);
                            }
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "thread leases could not be renewed");
                        // Past a whole lifetime without renewal another node may have
                        // taken them: stop acting for those threads.
                        for key in keys {
                            if cluster.may_have_lapsed(key.as_str())
                                && let Some(held) = cluster.fence().held(key.as_str())
                            {
                                cluster.fence().mark_lost(key.as_str(), held.epoch);
                                runtime.let_go(&key);
                            }
                        }
                    }
                }
            }
        });
    }

    /// Gives back the lease of a thread that was deleted (nothing to do without a cluster).
    pub(super) async fn release_lease(&self, key: &ThreadKey) {
        if let Some(cluster) = &self.options().cluster
            && let Err(error) = cluster.release(key.as_str()).await
        {
            tracing::warn!(%error, "the lease of a deleted thread could not be given back; it lapses");
        }
    }

    /// Takes over the threads a dead node left shown live (a few per renewal tick), so
    /// their runs are recorded `interrupted` without waiting for someone to ask for them.
    /// They are not loaded: their leases lapse again unless a request comes.
    async fn adopt_orphans(&self, cluster: &crate::cluster::Cluster) {
        if self.is_draining() {
            return;
        }
        let orphans = match cluster.orphans(16).await {
            Ok(orphans) => orphans,
            Err(error) => {
                tracing::warn!(%error, "threads left live by a dead node could not be listed");
                return;
            }
        };
        for key in orphans.into_iter().map(ThreadKey::stored) {
            if self.threads().get(&key).is_none() {
                // A failure is logged by `claim`; the next tick tries again.
                let _ = self.claim(&key).await;
            }
        }
    }

    /// This node lost `key`'s lease: its live run ends (`LEASE_LOST`) and the thread leaves
    /// memory, so the next request for it is claimed afresh.
    pub(super) fn let_go(&self, key: &ThreadKey) {
        let Some(thread) = self.threads().peek(key) else {
            return;
        };
        tracing::warn!("thread lease lost to another node");
        let live = lock(&thread.state).live.clone();
        if let Some(run) = live {
            run.cancel_with(CancelReason::LeaseLost);
        }
        self.threads().discard(&thread);
    }
}
