//! Several daemons on one PostgreSQL database: node registry and thread leases.
//!
//! Each thread is owned by one node at a time through a row of `leases` (thread key, node,
//! epoch, expiry, all time read off the database's clock, `agui_now_ms()`). A node takes
//! the lease of a thread when it loads the thread into memory ([`Cluster::claim`]): a thread
//! nobody holds, or whose lease has expired, or that this process already holds. Taking a
//! lease from another holder bumps its epoch, so every write the earlier holder still has
//! queued is refused by the store's fence (see [`crate::store::Fence`]), and the caller
//! recovers the thread (its live runs become `interrupted`) before loading it. A lease
//! another live node holds is answered with that node's address ([`Owner`]) so the request
//! can be forwarded there.
//!
//! The runtime renews the leases of the threads it holds in memory every third of the
//! lease lifetime ([`Cluster::renew`]); a lease found gone (taken after this node failed to
//! renew it, e.g. while paused) is reported lost, and the runtime cancels the thread's run
//! and drops the thread. A thread that left memory is simply no longer renewed; its lease
//! lapses.
//!
//! The node's id in the database is its name plus a fresh suffix per process, so a
//! restarted node never mistakes its predecessor's leases for its own: it takes them over
//! like any other expired or orphaned lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::store::Fence;
use crate::sync::lock;

mod claim;

/// Where a cluster node is, and how it takes part.
#[derive(Clone)]
pub struct ClusterConfig {
    /// The PostgreSQL connection string (it may hold a password: never logged).
    pub url: String,
    /// This node's name (`--node-id`).
    pub node_name: String,
    /// How other nodes reach this one (`--advertise-url`), e.g. `http://10.0.0.5:8443`.
    pub advertise: String,
    /// How long a lease lasts without renewal (`--lease-ttl`).
    pub lease_ttl: Duration,
    /// The certificate this node serves HTTPS with (DER), published for the other nodes to
    /// pin; `None` for plain HTTP. Filled in at start-up, not configured.
    pub cert: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection string may hold a password.
        f.debug_struct("ClusterConfig")
            .field("url", &"(redacted)")
            .field("node_name", &self.node_name)
            .field("advertise", &self.advertise)
            .field("lease_ttl", &self.lease_ttl)
            .field("cert", &self.cert.as_ref().map(Vec::len))
            .finish()
    }
}

/// Another node that holds a thread's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its id (name and process suffix).
    pub node: String,
    /// Its advertised address (`http(s)://host:port`).
    pub address: String,
    /// The certificate it serves HTTPS with (DER), if it published one: requests to it
    /// accept exactly that certificate.
    pub cert: Option<Vec<u8>>,
    /// Time left on its lease when asked.
    pub expires_in: Duration,
}

/// The outcome of [`Cluster::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This node holds the lease. `taken_over`: it was another holder's (or a previous
    /// process's), so the thread must be recovered before it is loaded.
    Mine { epoch: i64, taken_over: bool },
    /// Another live node holds it.
    Elsewhere(Owner),
}

/// Why the cluster layer failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("cannot reach the cluster database: {0}")]
    Connect(tokio_postgres::Error),
    #[error("{0}")]
    Config(String),
    #[error("the cluster database did not answer in time")]
    Timeout,
    #[error("this node has left the cluster (shutting down)")]
    Left,
}

/// One node's view of the cluster: its identity, its database connection for leases, and
/// the fence it shares with the store.
pub struct Cluster {
    config: ClusterConfig,
    node: String,
    fence: Fence,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    /// When each held lease was last claimed or renewed by this process (local clock): a
    /// lease not renewed for a whole lifetime may have been taken.
    renewed: Mutex<HashMap<String, Instant>>,
    /// When long-lapsed leases were last swept away.
    swept: Mutex<Instant>,
    /// This node has given its leases back (shutdown): it takes none any more.
    left: AtomicBool,
}

/// How often a renewal also removes leases that lapsed an hour ago.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("node", &self.node).finish()
    }
}

impl Cluster {
    /// The id of this process as a node: its name and a fresh suffix.
    pub fn process_id(name: &str) -> String {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        format!("{name}~{}", &suffix[..12])
    }

    /// Connects and registers this node; `fence` (made for [`Cluster::process_id`]) is the
    /// one the store stamps writes with. The store must be open (it creates the tables).
    pub async fn join(config: ClusterConfig, fence: Fence) -> Result<Cluster, ClusterError> {
        if config.lease_ttl < Duration::from_secs(1) {
            return Err(ClusterError::Config(
                "the lease lifetime must be at least 1s".to_owned(),
            ));
        }
        let node = fence.node().to_owned();
        let cluster = Cluster {
            fence,
            node,
            client: tokio::sync::Mutex::new(None),
            renewed: Mutex::default(),
            swept: Mutex::new(Instant::now()),
            left: AtomicBool::new(false),
            config,
        };
        cluster.heartbeat().await?;
        // Rows of processes gone for an hour that hold no lease any more.
        cluster
            .with_client(async |c| {
                c.execute(
                    "DELETE FROM nodes n WHERE heartbeat_at < agui_now_ms() - 3600000
                       AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node = n.id)",
                    &[],
                )
                .await
            })
            .await?;
        tracing::info!(node = %cluster.node, address = %cluster.config.advertise, "joined the cluster");
        if plain_beyond_loopback(&cluster.config.advertise) {
            tracing::warn!(
                address = %cluster.config.advertise,
                "this node is reached over plain HTTP beyond loopback: the other nodes send \
                 clients' credentials to whatever answers at that address; serve TLS \
                 between nodes (drop --no-tls) on any network but loopback"
            );
        }
        Ok(cluster)
    }

    /// This process's node id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The fence the store stamps this node's writes with.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// How long a lease lasts.
    pub fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    fn ttl_ms(&self) -> i64 {
        self.config.lease_ttl.as_millis() as i64
    }

    /// Runs `f` on the connection, connecting first if needed (and again after a lost
    /// connection). Claims and renewals run one at a time through it, so each sees the
    /// fence as the previous one left it. Bounded: a database that stops answering fails
    /// the call (and the connection is made afresh next time) instead of holding every
    /// claim and renewal behind it.
    async fn with_client<R>(
        &self,
        f: impl AsyncFnOnce(&mut tokio_postgres::Client) -> Result<R, tokio_postgres::Error>,
    ) -> Result<R, ClusterError> {
        let mut guard = self.client.lock().await;
        let limit = (self.config.lease_ttl / 2).max(Duration::from_secs(2));
        let outcome = tokio::time::timeout(limit, async {
            if guard.as_ref().is_none_or(|c| c.is_closed()) {
                *guard = Some(self.connect().await?);
            }
            let Some(client) = guard.as_mut() else {
                unreachable!("connected above")
            };
            Ok(f(client).await?)
        })
        .await;
        match outcome {
            Ok(result) => result,
            Err(_) => {
                *guard = None;
                Err(ClusterError::Timeout)
            }
        }
    }

    async fn connect(&self) -> Result<tokio_postgres::Client, ClusterError> {
        let mut config: tokio_postgres::Config = self.config.url.parse().map_err(|_| {
            ClusterError::Config("the store's connection string does not parse".to_owned())
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        // A claim waits on a lease row another node's batch holds for a moment at most.
        let options = format!(
            "{} -c lock_timeout=1500",
            config.get_options().unwrap_or("")
        );
        config.options(options.trim());
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(ClusterError::Connect)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "cluster database connection ended");
            }
        });
        Ok(client)
    }

    /// Registers (or refreshes) this node's row: its address and a heartbeat.
    pub async fn heartbeat(&self) -> Result<(), ClusterError> {
        let (node, address) = (self.node.clone(), self.config.advertise.clone());
        let cert = self.config.cert.clone();
        self.with_client(async move |c| {
            c.execute(
                "INSERT INTO nodes (id, address, started_at, heartbeat_at, cert)
                 VALUES ($1, $2, agui_now_ms(), agui_now_ms(), $3)
                 ON CONFLICT (id) DO UPDATE SET address = $2, heartbeat_at = agui_now_ms(),
                     cert = $3",
                &[&node, &address, &cert],
            )
            .await
            .map(|_| ())
        })
        .await
    }

    /// Threads shown live (`running` or `suspended`) whose lease has lapsed: their owner
    /// died or stopped. At most `limit`.
    pub async fn orphans(&self, limit: i64) -> Result<Vec<String>, ClusterError> {
        self.with_client(async |c| {
            let rows = c
                .query(
                    "SELECT l.thread_key FROM leases l JOIN threads t ON t.id = l.thread_key
                     WHERE l.expires_at < agui_now_ms() AND t.status <> 'idle'
                     ORDER BY l.expires_at LIMIT $1",
                    &[&limit],
                )
                .await?;
            Ok(rows.into_iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// Gives `key`'s lease back (its thread was deleted).
    pub async fn release(&self, key: &str) -> Result<(), ClusterError> {
        let me = self.node.as_str();
        self.with_client(async |c| {
            if let Some(held) = self.fence.held(key) {
                c.execute(
                    "DELETE FROM leases WHERE thread_key = $1 AND node = $2 AND epoch = $3",
                    &[&key, &me, &held.epoch],
                )
                .await?;
            }
            self.fence.release(key);
            lock(&self.renewed).remove(key);
            Ok(())
        })
        .await
    }

    /// Forgets this node's hold on `key` (a takeover whose recovery failed: the next claim
    /// takes it over again, and recovers again).
    pub fn forget(&self, key: &str) {
        self.fence.release(key);
        lock(&self.renewed).remove(key);
    }

    /// Renews the leases of `keys` (the threads this node holds in memory) and refreshes
    /// the heartbeat; forgets held leases not in `keys` that have lapsed. Returns the keys
    /// whose lease was found lost: another node took it.
    pub async fn renew(&self, keys: &[String]) -> Result<Vec<String>, ClusterError> {
        let (me, ttl, address) = (self.node.as_str(), self.ttl_ms(), &self.config.advertise);
        let sweep = {
            let mut last = lock(&self.swept);
            let due = last.elapsed() >= SWEEP_EVERY;
            if due {
                *last = Instant::now();
            }
            due
        };
        self.with_client(async |c| {
            // Read under the connection, which claims share: no claim is half done.
            let mut wanted: Vec<String> = Vec::new();
            let mut epochs: Vec<i64> = Vec::new();
            for key in keys {
                if let Some(held) = self.fence.held(key).filter(|h| !h.lost) {
                    wanted.push(key.clone());
                    epochs.push(held.epoch);
                }
            }
            c.execute(
                "UPDATE nodes SET heartbeat_at = agui_now_ms(), address = $2 WHERE id = $1",
                &[&me, address],
            )
            .await?;
            let rows = c
                .query(
                    "UPDATE leases l SET expires_at = agui_now_ms() + $3
                     FROM unnest($1::text[], $2::bigint[]) AS h(k, e)
                     WHERE l.thread_key = h.k AND l.epoch = h.e AND l.node = $4
                     RETURNING l.thread_key",
                    &[&wanted, &epochs, &ttl, &me],
                )
                .await?;
            if sweep {
                // Leases that lapsed long ago (threads nobody asked for since, ids that
                // never became threads): gone, so the table does not grow without bound.
                c.execute(
                    "DELETE FROM leases WHERE expires_at < agui_now_ms() - 3600000",
                    &[],
                )
                .await?;
            }
            let renewed: std::collections::HashSet<String> =
                rows.into_iter().map(|r| r.get(0)).collect();
            let now = Instant::now();
            let mut lost = Vec::new();
            let mut stamps = lock(&self.renewed);
            for (key, epoch) in wanted.iter().zip(&epochs) {
                if renewed.contains(key) {
                    stamps.insert(key.clone(), now);
                } else {
                    self.fence.mark_lost(key, *epoch);
                    lost.push(key.clone());
                }
            }
            // Leases of threads no longer in memory lapse: forget them once a whole
            // lifetime has passed since they were last claimed or renewed.
            let lifetime = self.config.lease_ttl;
            stamps.retain(|key, at| {
                let keep = keys.contains(key) || now.duration_since(*at) < lifetime;
                if !keep {
                    self.fence.release(key);
                }
                keep
            });
            Ok(lost)
        })
        .await
    }

    /// Gives back every lease of this process and removes its node row; returns how many
    /// leases. Nothing may be written for those threads afterwards (the fence forgets them).
    pub async fn leave(&self) -> Result<u64, ClusterError> {
        self.left.store(true, Ordering::SeqCst);
        let me = self.node.clone();
        let released = self
            .with_client(async move |c| {
                let n = c
                    .execute("DELETE FROM leases WHERE node = $1", &[&me])
                    .await?;
                c.execute("DELETE FROM nodes WHERE id = $1", &[&me]).await?;
                Ok(n)
            })
            .await?;
        for (key, _) in self.fence.snapshot() {
            self.fence.release(&key);
        }
        Ok(released)
    }

    /// The live owner of `key`'s lease when it is another node (no lease is taken).
    pub async fn owner_elsewhere(&self, key: &str) -> Result<Option<Owner>, ClusterError> {
        let (me, key) = (self.node.clone(), key.to_owned());
        self.with_client(async move |c| {
            let row = c
                .query_opt(
                    "SELECT l.node, COALESCE(n.address, ''), l.expires_at - agui_now_ms(), n.cert
                     FROM leases l LEFT JOIN nodes n ON n.id = l.node
                     WHERE l.thread_key = $1 AND l.node <> $2 AND l.expires_at > agui_now_ms()",
                    &[&key, &me],
                )
                .await?;
            Ok(row.map(|r| Owner {
                node: r.get(0),
                address: r.get(1),
                cert: r.get(3),
                expires_in: Duration::from_millis(r.get::<_, i64>(2).max(0) as u64),
            }))
        })
        .await
    }

    /// The addresses of the other nodes that have shown a sign of life within a lease
    /// lifetime.
    pub async fn peers(&self) -> Result<Vec<(String, Option<Vec<u8>>)>, ClusterError> {
        let (me, ttl) = (self.node.clone(), self.ttl_ms());
        self.with_client(async move |c| {
            let rows = c
                .query(
                    "SELECT address, cert FROM nodes
                     WHERE id <> $1 AND heartbeat_at > agui_now_ms() - $2 ORDER BY id",
                    &[&me, &ttl],
                )
                .await?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }

    /// Whether this node's leases may have lapsed: the last renewal of `key` is older than
    /// a lease lifetime (a paused process, an unreachable database).
    pub fn may_have_lapsed(&self, key: &str) -> bool {
        lock(&self.renewed)
            .get(key)
            .is_none_or(|at| at.elapsed() >= self.config.lease_ttl)
    }

    /// A secret shared by every node (created by the first that asks): `len` random bytes
    /// stored in the database under `name`.
    pub async fn shared_secret(&self, name: &str, len: usize) -> Result<Vec<u8>, ClusterError> {
        let mut fresh = vec![0u8; len];
        getrandom::fill(&mut fresh)
            .map_err(|e| ClusterError::Config(format!("no randomness: {e}")))?;
        let name = name.to_owned();
        self.with_client(async move |c| {
            c.execute(
                "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&name, &fresh],
            )
            .await?;
            let row = c
                .query_one("SELECT value FROM secrets WHERE name = $1", &[&name])
                .await?;
            Ok(row.get(0))
        })
        .await
    }
}

/// Whether `advertise` (`http(s)://HOST[:PORT]`) is plain HTTP to a host that is not a
/// loopback address (`localhost` counts as loopback).
fn plain_beyond_loopback(advertise: &str) -> bool {
    let Ok(uri) = advertise.parse::<http::Uri>() else {
        return false;
    };
    let host = uri
        .host()
        .unwrap_or("")
        .trim_start_matches('[')
        .trim_end_matches(']');
    uri.scheme_str() == Some("http")
        && host != "localhost"
        && host
            .parse::<std::net::IpAddr>()
            .map_or(true, |ip| !ip.is_loopback())
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_http_beyond_loopback_is_told_apart() {
        assert!(super::plain_beyond_loopback("http://10.0.0.5:8443"));
        assert!(super::plain_beyond_loopback("http://node-b.internal"));
        assert!(!super::plain_beyond_loopback("http://127.0.0.1:8443"));
        assert!(!super::plain_beyond_loopback("http://[::1]:8443"));
        assert!(!super::plain_beyond_loopback("http://localhost:8443"));
        assert!(!super::plain_beyond_loopback("https://10.0.0.5:8443"));
    }
}
