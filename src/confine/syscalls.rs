//! The system-call filter every confined agent runs under: seccomp, compiled by
//! `seccompiler` (no BPF of ours), installed by the launcher after Landlock and before the
//! agent's `exec`, inherited by everything the agent starts.
//!
//! It closes what Landlock does not mediate. Every refusal is `EPERM` (an agent sees a
//! refused call, never a kill that looks like a crash):
//! - sockets only of the families and protocols an agent needs: UNIX, IPv4 and IPv6 with
//!   TCP, UDP or ICMP over stream or datagram sockets (MPTCP, whose connections Landlock's
//!   TCP rules do not see, SCTP, DCCP, raw sockets and the rest refused), and route
//!   netlink; `socketpair` only for UNIX;
//! - no set-user-ID or set-group-ID bit set by `chmod` and friends;
//! - `prlimit64`, `setpriority`, `sched_setaffinity`, `sched_setscheduler`,
//!   `sched_setparam`, `sched_setattr` and `ioprio_set` only on the caller itself (pid 0),
//!   so no agent lowers another's limits, priority or CPUs, or the daemon's;
//! - no SysV IPC (shared memory, message queues, semaphores: the kernel's IPC namespace is
//!   the daemon's unless `bwrap` gave a new one);
//! - no `ptrace`, `process_vm_*`, `pidfd_getfd`, `kcmp`, `kexec_*`, `bpf`,
//!   `perf_event_open`, `userfaultfd`, `io_uring_*` (its operations would pass this
//!   filter), keyrings, mounts, `setns`, and no new namespace by `clone` or `unshare`
//!   (`clone3`, whose flags a filter cannot read, answers `ENOSYS`, so the C library falls
//!   back to `clone`);
//! - with `listen` off (`Filter::listen`), no listening socket at all: `listen` on an
//!   unbound TCP socket binds a port past Landlock's bind rule.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What the filter lets through beyond its fixed rules.
#[derive(Debug, Clone, Copy)]
pub(super) struct Filter {
    /// Whether `listen` is allowed (the agent has ports to bind, or a network of its own).
    pub(super) listen: bool,
}

/// Refused whatever their arguments.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_process_madvise,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_syslog,
    libc::SYS_fanotify_init,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

/// Allowed only on the caller itself: their first argument (a pid) must be 0.
const ON_SELF: &[libc::c_long] = &[
    libc::SYS_prlimit64,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
];

/// The flags that make a namespace.
const NAMESPACES: [libc::c_int; 8] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    0x80, // CLONE_NEWTIME
];

/// x86-64's x32 system calls are the same numbers with this bit set (each refused number
/// is refused with it too), and a range of their own, refused whole.
#[cfg(target_arch = "x86_64")]
const X32: libc::c_long = 0x4000_0000;

impl Filter {
    /// Installs the filter on this process (which must have `no_new_privs`, as Landlock
    /// set it): every later `exec` keeps it.
    pub(super) fn install(self) -> Result<(), String> {
        let fail = |e: seccompiler::Error| format!("cannot install the system-call filter: {e}");
        let (refuse, no_clone3) = self.programs().map_err(fail)?;
        seccompiler::apply_filter(&refuse).map_err(fail)?;
        seccompiler::apply_filter(&no_clone3).map_err(fail)
    }

    /// The two programs: the refusals (`EPERM`), and `clone3` answered `ENOSYS`.
    fn programs(self) -> Result<(BpfProgram, BpfProgram), seccompiler::Error> {
        let arch: TargetArch = std::env::consts::ARCH.try_into()?;
        let refuse = SeccompFilter::new(
            self.rules()?,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )?;
        let clone3 = SeccompFilter::new(
            with_x32(vec![(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?;
        Ok((refuse.try_into()?, clone3.try_into()?))
    }

    /// Each filtered call and the rules under which it is refused (any rule refuses; an
    /// empty list refuses always).
    fn rules(self) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::Error> {
        let mut rules: Vec<(libc::c_long, Vec<SeccompRule>)> = Vec::new();
        for call in REFUSED {
            rules.push((*call, Vec::new()));
        }
        for call in ON_SELF {
            rules.push((*call, vec![rule(&[(0, ne(0))])?]));
        }
        // `setpriority(which, who, prio)`: a process group or a user (who = 0 is the
        // caller's own, which holds the daemon) is another process.
        rules.push((
            libc::SYS_setpriority,
            vec![rule(&[(0, ne(0))])?, rule(&[(1, ne(0))])?],
        ));
        // `ioprio_set(which, who, ioprio)`: only IOPRIO_WHO_PROCESS (1) of the caller.
        rules.push((
            libc::SYS_ioprio_set,
            vec![rule(&[(0, ne(1))])?, rule(&[(1, ne(0))])?],
        ));
        let namespace_flags = NAMESPACES
            .iter()
            .map(|flag| rule(&[(0, bit(*flag as u64))]))
            .collect::<Result<Vec<_>, _>>()?;
        rules.push((libc::SYS_clone, namespace_flags.clone()));
        rules.push((libc::SYS_unshare, namespace_flags));
        rules.push((libc::SYS_socket, socket_rules()?));
        // No set-user-ID or set-group-ID bit: the agent runs as the daemon's user, root
        // perhaps, and such a file of its would run as that user for anyone.
        for (call, mode_arg) in [
            (libc::SYS_chmod, 1),
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (libc::SYS_fchmodat2, 2),
        ] {
            rules.push((
                call,
                vec![
                    rule(&[(mode_arg, bit(libc::S_ISUID as u64))])?,
                    rule(&[(mode_arg, bit(libc::S_ISGID as u64))])?,
                ],
            ));
        }
        rules.push((
            libc::SYS_socketpair,
            vec![rule(&[(0, ne(libc::AF_UNIX as u64))])?],
        ));
        if !self.listen {
            rules.push((libc::SYS_listen, Vec::new()));
        }
        let mut rules = with_x32(rules);
        // x32's own calls (512 to 547: `ptrace`, `process_vm_*`, `recvmsg`, ... with x32
        // structures) would pass under numbers of their own: none is allowed.
        #[cfg(target_arch = "x86_64")]
        for call in 512..=547 {
            rules.insert(call | X32, Vec::new());
        }
        Ok(rules)
    }
}

/// `socket(domain, type, protocol)` is refused for a family other than UNIX, IPv4, IPv6
/// and netlink; for IPv4 and IPv6 with a type other than stream or datagram (SCTP and
/// DCCP come as other types), or a protocol other than the default, TCP, UDP or ICMP; for
/// netlink with a protocol other than route (0).
fn socket_rules() -> Result<Vec<SeccompRule>, seccompiler::Error> {
    let families = [
        libc::AF_UNIX,
        libc::AF_INET,
        libc::AF_INET6,
        libc::AF_NETLINK,
    ];
    let other_family: Vec<(u8, Cmp)> = families.iter().map(|f| (0, ne(*f as u64))).collect();
    let inet_protocols = |family: libc::c_int, icmp: libc::c_int| {
        let mut conditions = vec![(0, eq(family as u64))];
        for protocol in [0, libc::IPPROTO_TCP, libc::IPPROTO_UDP, icmp] {
            conditions.push((2, ne(protocol as u64)));
        }
        conditions
    };
    let mut rules = vec![
        rule(&other_family)?,
        rule(&inet_protocols(libc::AF_INET, libc::IPPROTO_ICMP))?,
        rule(&inet_protocols(libc::AF_INET6, libc::IPPROTO_ICMPV6))?,
        rule(&[(0, eq(libc::AF_NETLINK as u64)), (2, ne(0))])?,
    ];
    // The type's low four bits (the rest are SOCK_NONBLOCK and SOCK_CLOEXEC).
    let stream_or_datagram = [libc::SOCK_STREAM as u64, libc::SOCK_DGRAM as u64];
    for family in [libc::AF_INET, libc::AF_INET6] {
        for kind in (0..16u64).filter(|k| !stream_or_datagram.contains(k)) {
            rules.push(rule(&[
                (0, eq(family as u64)),
                (1, (SeccompCmpOp::MaskedEq(0xf), kind)),
            ])?);
        }
    }
    Ok(rules)
}

/// A comparison of one 32-bit argument.
type Cmp = (SeccompCmpOp, u64);

fn ne(value: u64) -> Cmp {
    (SeccompCmpOp::Ne, value)
}

fn eq(value: u64) -> Cmp {
    (SeccompCmpOp::Eq, value)
}

/// Whether the argument has `flag` set.
fn bit(flag: u64) -> Cmp {
    (SeccompCmpOp::MaskedEq(flag), flag)
}

/// A rule: all of `conditions` (argument index, comparison) hold.
fn rule(conditions: &[(u8, Cmp)]) -> Result<SeccompRule, seccompiler::Error> {
    let conditions = conditions
        .iter()
        .map(|(arg, (op, value))| {
            SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, op.clone(), *value)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SeccompRule::new(conditions)?)
}

/// The rules by call number, each also under its x32 number on x86-64.
fn with_x32(rules: Vec<(libc::c_long, Vec<SeccompRule>)>) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut map = BTreeMap::new();
    for (call, call_rules) in rules {
        #[cfg(target_arch = "x86_64")]
        map.insert(call | X32, call_rules.clone());
        map.insert(call, call_rules);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_programs_compile_with_and_without_listen() {
        for listen in [false, true] {
            let (refuse, clone3) = Filter { listen }.programs().expect("programs");
            assert!(refuse.len() > REFUSED.len(), "{}", refuse.len());
            assert!(!clone3.is_empty());
        }
    }
}
