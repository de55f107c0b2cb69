//! The way out of an agent's network namespace (`netns.rs`, or bwrap's): the namespace has
//! loopback only, and each loopback port the agent may reach on the host (`sandbox.connect`, the
//! frontend-tools endpoint) is listened on inside it by a **forwarder**, which hands every
//! connection to the daemon through a UNIX socket; the daemon connects to the same port on
//! the host's loopback, if the port is one it allows (`agent/acp/forward.rs`).
//!
//! The forwarder is the launcher's child (`agui-serve __forward FORWARD`), started inside
//! the namespaces before the launcher confines itself: it is outside the agent's Landlock
//! domain, so the agent can neither signal nor trace it, and it dies with the namespace.
//! It is blocking std code, a thread per connection and direction.
//!
//! The forwarder does not know what a port leads to: the daemon's end decides (a port on
//! the host's loopback, a model relay, the egress proxy).

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The forwarder's first argument.
pub const FORWARD: &str = "__forward";

/// The variable that hands the launcher its forwarding key: the launcher passes it to the
/// forwarder and takes it out of the agent's environment, so only the forwarder (outside
/// the agent's Landlock domain, whose `/proc` entries the agent cannot read) holds it.
pub const KEY_ENV: &str = "AGUI_FORWARD_KEY";

/// Where the daemon's end is, inside the sandbox, and the ports to listen on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    pub socket: PathBuf,
    pub ports: Vec<u16>,
}

/// The launcher's part: starts the forwarder and waits until it listens on every port.
pub(super) fn start(forward: &Forward) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot start the port forwarder: {e}");
    let exe = std::env::current_exe().map_err(|e| fail(&e))?;
    let spec = serde_json::to_string(forward).map_err(|e| fail(&e))?;
    let key = std::env::var(KEY_ENV).map_err(|_| fail(&"no forwarding key"))?;
    let mut child = std::process::Command::new(exe)
        .arg(FORWARD)
        .arg(spec)
        .env(KEY_ENV, key)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(&e))?;
    let stdout = child.stdout.take().ok_or_else(|| fail(&"no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| fail(&e))?;
    if line.trim() != "ready" {
        return Err(fail(&"it did not listen"));
    }
    // It lives as long as the namespace does; nothing waits for it.
    Ok(())
}

/// The forwarder's body (`agui-serve __forward FORWARD`): listens on each port on the
/// namespace's loopback, says `ready`, then forwards. Returns only on failure, with why.
pub fn serve(args: Vec<std::ffi::OsString>) -> String {
    let Some(spec) = args.first().and_then(|a| a.to_str()) else {
        return "the forwarder's ports are missing".to_owned();
    };
    let forward: Forward = match serde_json::from_str(spec) {
        Ok(forward) => forward,
        Err(error) => return format!("the forwarder's ports are invalid: {error}"),
    };
    let Ok(key) = std::env::var(KEY_ENV) else {
        return "the forwarder has no key".to_owned();
    };
    let mut listeners = Vec::new();
    for port in &forward.ports {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, *port)) {
            Ok(listener) => listeners.push((*port, listener)),
            Err(error) => return format!("cannot listen on 127.0.0.1:{port}: {error}"),
        }
        // `localhost` may resolve to ::1 first; where the namespace has it.
        if let Ok(listener) = TcpListener::bind((Ipv6Addr::LOCALHOST, *port)) {
            listeners.push((*port, listener));
        }
    }
    // Its ports are bound: nothing of the namespace's (or, for a root launcher making one
    // itself, the host's) capabilities is needed any more. It goes when the agent does.
    if let Err(error) = super::drop_capabilities() {
        return error;
    }
    if let Err(error) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        return format!("cannot tie the forwarder to the agent: {error}");
    }
    let mut out = std::io::stdout();
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return "the launcher did not wait for the forwarder".to_owned();
    }
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|(port, listener)| {
            let (socket, key) = (forward.socket.clone(), key.clone());
            std::thread::spawn(move || accept(port, &listener, &socket, &key))
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
    "the forwarder stopped".to_owned()
}

/// Hands each connection to `port` to the daemon at `socket`, with `key`.
fn accept(port: u16, listener: &TcpListener, socket: &std::path::Path, key: &str) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (socket, key) = (socket.to_owned(), key.to_owned());
        std::thread::spawn(move || {
            if let Err(error) = hand_over(port, conn, &socket, &key) {
                eprintln!("agui-serve forwarder: port {port}: {error}");
            }
        });
    }
}

/// One connection: the daemon is told the key and the port (a line), then bytes go both
/// ways until each side is done.
fn hand_over(
    port: u16,
    conn: TcpStream,
    socket: &std::path::Path,
    key: &str,
) -> std::io::Result<()> {
    let mut daemon = UnixStream::connect(socket)?;
    writeln!(daemon, "{key} {port}")?;
    let (mut conn_in, mut daemon_in) = (conn.try_clone()?, daemon.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut conn_in, &mut daemon_in);
        let _ = daemon_in.shutdown(Shutdown::Write);
    });
    let mut conn_out = conn;
    let _ = std::io::copy(&mut daemon, &mut conn_out);
    let _ = conn_out.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}
