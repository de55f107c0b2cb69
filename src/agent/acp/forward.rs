//! The daemon's end of a confined agent's port forwarder (`confine::forward`): a UNIX
//! socket per agent process (bound into a bwrap sandbox at [`INSIDE`]). Each connection
//! names, on its first line, the process's forwarding key (a secret only its forwarder
//! holds: see `confine::forward`) and the port the agent connected to in its own network;
//! a connection without the key is dropped (another agent that found the socket's path).
//! The port is a [`Route`]: a port on the host's loopback (connected to, bytes both ways), the
//! egress proxy or a model relay (served by the [`Gateway`]). Any other port is closed at
//! once. Served until the process exits; the socket file goes with it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::confine::cgroup::Cgroup;
use crate::egress::{Egress, Exits, Gateway, Relay};

/// What a port in the agent's network leads to.
#[derive(Debug, Clone)]
pub(super) enum Route {
    /// The same port on the host's loopback (`sandbox.connect`, the frontend-tools MCP).
    Loopback(u16),
    /// The egress proxy, under the agent's rules.
    Proxy(Arc<Egress>),
    /// A model relay.
    Relay(Arc<Relay>),
}

/// Where the proxy and the relays are served, and to whom they report.
#[derive(Clone)]
pub(super) struct Ways {
    pub(super) gateway: Arc<dyn Gateway>,
    pub(super) exits: Arc<dyn Exits>,
}

impl std::fmt::Debug for Ways {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ways")
            .field("who", self.exits.who())
            .finish()
    }
}

/// Where the daemon's end is, inside the sandbox (on its own `/tmp`).
pub(super) const INSIDE: &str = "/tmp/.agui-serve-forward.sock";

/// How long a connection may take to name its port.
const NAME_WAIT: Duration = Duration::from_secs(5);
/// Forwarded connections open at once, per agent process (each costs the daemon two
/// descriptors).
const MAX_CONNECTIONS: usize = 256;
/// Forwarded connections open at once, every agent's together: what the daemon keeps of
/// its descriptors for the agents, so that their connections never starve its own.
const MAX_ALL_CONNECTIONS: usize = 1024;

/// The daemon-wide slots of [`MAX_ALL_CONNECTIONS`].
fn all_slots() -> Arc<tokio::sync::Semaphore> {
    static SLOTS: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    SLOTS
        .get_or_init(|| Arc::new(tokio::sync::Semaphore::new(MAX_ALL_CONNECTIONS)))
        .clone()
}

/// A bound socket not yet served; its file is removed when it is dropped.
#[derive(Debug)]
pub(super) struct Forwarding {
    listener: Option<std::os::unix::net::UnixListener>,
    path: PathBuf,
    routes: Arc<HashMap<u16, Route>>,
    /// Serves the proxy and relay routes (none: only loopback routes are served).
    ways: Option<Ways>,
    /// The agent's control group, where there is one: only its processes are served.
    group: Option<Arc<Cgroup>>,
    /// What the forwarder says first on every connection.
    key: Arc<str>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl Forwarding {
    /// Binds a new socket under `run_dir` (made private) for `routes`.
    pub(super) fn bind(
        run_dir: &Path,
        routes: HashMap<u16, Route>,
        ways: Option<Ways>,
        group: Option<Arc<Cgroup>>,
    ) -> Result<Forwarding, String> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(run_dir)
            .map_err(|e| format!("cannot make {}: {e}", run_dir.display()))?;
        let path = run_dir.join(format!(
            "forward-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
        Ok(Forwarding {
            listener: Some(listener),
            path,
            routes: Arc::new(routes),
            ways,
            group,
            key: Arc::from(new_key()),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        })
    }

    /// The socket's path on the host.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The key the forwarder must present (handed to the launcher in its environment).
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Serves it until `stop`.
    pub(super) fn serve(mut self, stop: CancellationToken) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        tokio::spawn(async move {
            let listener = match tokio::net::UnixListener::from_std(listener) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::error!(%error, "cannot serve an agent's port forwarder");
                    return;
                }
            };
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            if !self.is_the_agents(&stream) {
                                tracing::warn!("a process outside the agent's sandbox reached its port forwarder");
                                continue;
                            }
                            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                                tracing::warn!(limit = MAX_CONNECTIONS, "an agent's forwarded connections are at their limit");
                                continue;
                            };
                            let Ok(all) = all_slots().try_acquire_owned() else {
                                tracing::warn!(limit = MAX_ALL_CONNECTIONS, "the agents' forwarded connections are at their limit");
                                continue;
                            };
                            let slot = (slot, all);
                            tokio::spawn(connection(stream, self.key.clone(), self.routes.clone(), self.ways.clone(), slot));
                        }
                        // Out of descriptors, say: the next accept may do better.
                        Err(error) => {
                            tracing::warn!(%error, "an agent's port forwarder could not accept");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                }
            }
            drop(self);
        });
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Forwarding {
    /// Whether the peer of `stream` is the agent's forwarder: a process in a network
    /// namespace not the daemon's (only a sandbox has one) and, where the agent has a
    /// control group, in it. Another agent that reaches the socket's path (pathname
    /// sockets pass Landlock) is not served.
    fn is_the_agents(&self, stream: &UnixStream) -> bool {
        let Some(pid) = stream.peer_cred().ok().and_then(|c| c.pid()) else {
            return false;
        };
        let netns = |of: &str| std::fs::read_link(format!("/proc/{of}/ns/net")).ok();
        let own_network = match (netns(&pid.to_string()), netns("self")) {
            (Some(theirs), Some(ours)) => theirs != ours,
            _ => false,
        };
        own_network && self.group.as_ref().is_none_or(|g| g.holds(pid))
    }
}

/// One forwarded connection: its port, then where that port leads.
async fn connection(
    mut inside: UnixStream,
    key: Arc<str>,
    routes: Arc<HashMap<u16, Route>>,
    ways: Option<Ways>,
    _slot: (
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    ),
) {
    let Ok(Some(port)) = tokio::time::timeout(NAME_WAIT, first_line(&mut inside, &key)).await
    else {
        return;
    };
    let route = routes.get(&port).cloned();
    match (route, ways) {
        (Some(Route::Loopback(port)), _) => {
            let Ok(mut outside) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
        }
        (Some(Route::Proxy(rules)), Some(ways)) => {
            ways.gateway.proxy(inside, rules, ways.exits).await;
        }
        (Some(Route::Relay(relay)), Some(ways)) => {
            ways.gateway.relay(inside, relay, ways.exits).await;
        }
        _ => tracing::warn!(port, "an agent asked for a port it may not reach"),
    }
}

/// A new forwarding key: 128 random bits, in hex.
fn new_key() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random generator");
    crate::hex::encode(&bytes)
}

/// The connection's first line, `KEY PORT` (at most 40 bytes with its newline): the port,
/// when the key is the process's.
async fn first_line(stream: &mut UnixStream, key: &str) -> Option<u16> {
    use subtle::ConstantTimeEq;
    let mut line = Vec::with_capacity(40);
    while line.len() < 40 {
        match stream.read_u8().await.ok()? {
            b'\n' => {
                let line = std::str::from_utf8(&line).ok()?;
                let (given, port) = line.split_once(' ')?;
                if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
                    tracing::warn!(
                        "a connection to an agent's forwarder without its key was dropped"
                    );
                    return None;
                }
                return port.parse().ok();
            }
            byte => line.push(byte),
        }
    }
    None
}
