//! Namespaces of the launcher's own (`landlock` mode; `bwrap` makes its own): network, IPC
//! and UTS. The agent gets a loopback and nothing else, so the only ways out are the ports its
//! forwarder listens on (`forward.rs`), each handed to the daemon, which decides.
//!
//! A launcher with `CAP_SYS_ADMIN` (a root daemon) unshares the network alone; any other
//! first unshares a user namespace in which it maps only its own user and group, which
//! gives it the capability over the new network namespace and over nothing of the host's.
//! The launcher drops every capability before it confines itself (`confine.rs`), so the
//! agent keeps none of them.

use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use socket2::{Domain, Protocol, Socket, Type};

/// Moves this (single-threaded) process into new network, IPC and UTS namespaces, its
/// loopback up: SysV IPC and the host name are the agent's own too.
pub(super) fn enter() -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot make the agent's network: {e}");
    let own = CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS;
    match unshare(own) {
        Ok(()) => {}
        Err(Errno::EPERM) => {
            let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
            unshare(CloneFlags::CLONE_NEWUSER | own).map_err(|e| {
                fail(&format!(
                    "{e} (unprivileged user namespaces are off: run the daemon as root, or allow them)"
                ))
            })?;
            std::fs::write("/proc/self/setgroups", "deny").map_err(|e| fail(&e))?;
            std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).map_err(|e| fail(&e))?;
            std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).map_err(|e| fail(&e))?;
        }
        Err(error) => return Err(fail(&error)),
    }
    loopback_up().map_err(|e| fail(&format!("loopback: {e}")))
}

/// Whether a launcher of this daemon can make a network namespace: it runs as root, or the
/// kernel lets anyone make a user namespace.
pub fn available() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let number = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    number("/proc/sys/user/max_user_namespaces").is_some_and(|n| n > 0)
        && number("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|n| n == 1)
}

/// `AF_NETLINK`, `NETLINK_ROUTE`, and what the request below is made of
/// (`linux/netlink.h`, `linux/rtnetlink.h`, `linux/if.h`).
const AF_NETLINK: i32 = 16;
const NETLINK_ROUTE: i32 = 0;
const RTM_NEWLINK: u16 = 16;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const IFF_UP: u32 = 1;
/// A new namespace's loopback is always its first interface.
const LOOPBACK_INDEX: i32 = 1;

/// Sets the loopback up with one route-netlink request (what `ip link set lo up` sends),
/// and reads the kernel's acknowledgement.
fn loopback_up() -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut socket = Socket::new(
        Domain::from(AF_NETLINK),
        Type::RAW,
        Some(Protocol::from(NETLINK_ROUTE)),
    )?;
    socket.write_all(&link_up_request(LOOPBACK_INDEX))?;
    let mut answer = [0u8; 256];
    let read = socket.read(&mut answer)?;
    acknowledged(&answer[..read])
}

/// `RTM_NEWLINK` for interface `index`: flags `IFF_UP`, change `IFF_UP`, an answer wanted.
fn link_up_request(index: i32) -> Vec<u8> {
    let mut message = Vec::with_capacity(32);
    // struct nlmsghdr: length, type, flags, sequence, port.
    message.extend(32u32.to_ne_bytes());
    message.extend(RTM_NEWLINK.to_ne_bytes());
    message.extend((NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    message.extend(1u32.to_ne_bytes());
    message.extend(0u32.to_ne_bytes());
    // struct ifinfomsg: family (AF_UNSPEC) and padding, type, index, flags, change.
    message.extend([0u8, 0u8]);
    message.extend(0u16.to_ne_bytes());
    message.extend(index.to_ne_bytes());
    message.extend(IFF_UP.to_ne_bytes());
    message.extend(IFF_UP.to_ne_bytes());
    message
}

/// Whether `answer` is an `NLMSG_ERROR` whose error is 0 (the acknowledgement).
fn acknowledged(answer: &[u8]) -> std::io::Result<()> {
    let field = |at: usize, len: usize| answer.get(at..at + len);
    let kind = field(4, 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let error = field(16, 4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (kind, error) {
        (Some(NLMSG_ERROR), Some(0)) => Ok(()),
        (Some(NLMSG_ERROR), Some(error)) => Err(std::io::Error::from_raw_os_error(-error)),
        _ => Err(std::io::Error::other("no acknowledgement from the kernel")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_a_link_message_for_the_interface() {
        let request = link_up_request(1);
        assert_eq!(request.len(), 32);
        assert_eq!(
            u32::from_ne_bytes(request[..4].try_into().expect("4 bytes")),
            32
        );
        assert_eq!(u16::from_ne_bytes([request[4], request[5]]), RTM_NEWLINK);
        assert_eq!(
            i32::from_ne_bytes(request[20..24].try_into().expect("4 bytes")),
            1
        );
        let mut ack = vec![0u8; 36];
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert!(acknowledged(&ack).is_ok());
        ack[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(
            acknowledged(&ack).expect_err("an error").raw_os_error(),
            Some(1)
        );
        assert!(acknowledged(&[]).is_err());
    }
}
