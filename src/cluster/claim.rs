//! Taking a thread's lease: [`Cluster::claim`], one transaction on the lease's row that
//! takes a free lease, renews this process's own, takes over a lapsed one, or names the
//! live node that holds it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Transaction};

use super::{Claim, Cluster, ClusterError, Owner};
use crate::sync::lock;

/// A lease's row as a claim finds it, locked for the claim's transaction.
struct Found {
    node: String,
    epoch: i64,
    /// Milliseconds left on it, by the database's clock (negative: lapsed).
    left: i64,
}

impl Cluster {
    /// Takes `key`'s lease if nobody else holds it live; see [`Claim`].
    pub async fn claim(&self, key: &str) -> Result<Claim, ClusterError> {
        if self.left.load(Ordering::SeqCst) {
            return Err(ClusterError::Left);
        }
        loop {
            let claim = self
                .with_client(async |c| self.claim_once(c, key).await)
                .await?;
            if let Some(claim) = claim {
                return Ok(claim);
            }
        }
    }

    /// One attempt at `key`'s lease; `None` when another node took it first (ask again).
    async fn claim_once(
        &self,
        c: &mut Client,
        key: &str,
    ) -> Result<Option<Claim>, tokio_postgres::Error> {
        // Read under the connection, which claims and renewals share: the fence is as the
        // last of them left it.
        let held = self.fence.held(key).filter(|h| !h.lost).map(|h| h.epoch);
        let tx = c.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT node, epoch, expires_at - agui_now_ms() FROM leases
                 WHERE thread_key = $1 FOR UPDATE",
                &[&key],
            )
            .await?;
        let claim = match row {
            None => self.take_free(&tx, key).await?,
            Some(row) => {
                let found = Found {
                    node: row.get(0),
                    epoch: row.get(1),
                    left: row.get(2),
                };
                Some(self.take_found(&tx, key, found, held).await?)
            }
        };
        tx.commit().await?;
        if let Some(Claim::Mine { epoch, .. }) = &claim {
            // Still under the connection: no renewal can see the key half-held.
            if held != Some(*epoch) {
                self.fence.hold(key, *epoch);
            }
            lock(&self.renewed).insert(key.to_owned(), Instant::now());
        }
        Ok(claim)
    }

    /// A lease with no row yet: this node's at epoch 1; `None` when another node inserted
    /// the row meanwhile.
    async fn take_free(
        &self,
        tx: &Transaction<'_>,
        key: &str,
    ) -> Result<Option<Claim>, tokio_postgres::Error> {
        let inserted = tx
            .execute(
                "INSERT INTO leases (thread_key, node, epoch, expires_at)
                 VALUES ($1, $2, 1, agui_now_ms() + $3)
                 ON CONFLICT (thread_key) DO NOTHING",
                &[&key, &self.node, &self.ttl_ms()],
            )
            .await?;
        Ok((inserted > 0).then_some(Claim::Mine {
            epoch: 1,
            taken_over: false,
        }))
    }

    /// A lease's row found: renewed when this process holds it at its epoch; taken over
    /// (the epoch bumped) when it is this node's otherwise, lapsed, or an earlier process's
    /// at this node's address; else another live node's.
    async fn take_found(
        &self,
        tx: &Transaction<'_>,
        key: &str,
        found: Found,
        held: Option<i64>,
    ) -> Result<Claim, tokio_postgres::Error> {
        let (me, ttl) = (self.node.as_str(), self.ttl_ms());
        if found.node == me && held == Some(found.epoch) {
            tx.execute(
                "UPDATE leases SET expires_at = agui_now_ms() + $2
                 WHERE thread_key = $1",
                &[&key, &ttl],
            )
            .await?;
            return Ok(Claim::Mine {
                epoch: found.epoch,
                taken_over: false,
            });
        }
        if found.node == me
            || found.left <= 0
            || previous_self(tx, &found.node, &self.config.advertise).await?
        {
            let epoch = found.epoch + 1;
            tx.execute(
                "UPDATE leases SET node = $2, epoch = $3,
                     expires_at = agui_now_ms() + $4
                 WHERE thread_key = $1",
                &[&key, &me, &epoch, &ttl],
            )
            .await?;
            return Ok(Claim::Mine {
                epoch,
                taken_over: true,
            });
        }
        let row = tx
            .query_opt(
                "SELECT address, cert FROM nodes WHERE id = $1",
                &[&found.node],
            )
            .await?;
        let (address, cert) = row.map(|r| (r.get(0), r.get(1))).unwrap_or_default();
        Ok(Claim::Elsewhere(Owner {
            node: found.node,
            address,
            cert,
            expires_in: Duration::from_millis(found.left.max(0) as u64),
        }))
    }
}

/// Whether `node` is an earlier process at this node's own address: it is gone, since
/// this process now serves that address.
async fn previous_self(
    tx: &Transaction<'_>,
    node: &str,
    address: &str,
) -> Result<bool, tokio_postgres::Error> {
    let row = tx
        .query_opt("SELECT address FROM nodes WHERE id = $1", &[&node])
        .await?;
    Ok(row.is_some_and(|r| r.get::<_, String>(0) == address))
}
