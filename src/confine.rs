//! Confinement of agent processes: what an ACP agent (and everything it starts) may read,
//! write and connect to.
//!
//! The daemon never restricts itself. It starts an agent through its own executable as a
//! launcher: `agui-serve __confine POLICY -- PROGRAM ARGS...`. The launcher, a fresh
//! single-threaded process, joins the agent's control group ([`cgroup`]), closes every
//! descriptor but stdio, starts the port forwarder where the agent has a network of its
//! own ([`forward`]), drops its capabilities, sets `no_new_privs`, applies a Landlock
//! ruleset built from `POLICY` (JSON) and the system-call filter (`syscalls.rs`) to itself
//! and `exec`s the agent, which inherits both and passes them on to its children. So no
//! code runs between `fork` and `exec` in the daemon, and none of it needs `unsafe`.
//!
//! A [`Policy`] holds paths the agent may read and execute, paths it may read and write,
//! the TCP ports it may connect to and bind, and whether the kernel must enforce all of it.
//! [`system_read_paths`] are the system's read-only paths; [`carve`] removes the daemon's
//! secrets from them (a Landlock rule only ever grants, so a secret under `/etc` is kept
//! out by granting `/etc`'s other entries instead of `/etc`). Landlock also keeps a
//! confined process from tracing, reading `/proc/PID/environ` of, or signalling a process
//! outside its domain (the daemon), and from connecting to abstract UNIX sockets made
//! outside it.
//!
//! Both modes give the agent a network of its own: a loopback, the forwarder's ports on it,
//! nothing else; a way to another host is the egress proxy's or a model relay's, which the
//! daemon serves behind the forwarder. What Landlock mode is not: a mount namespace.
//! Pathname UNIX sockets stay reachable where the file rules allow them; `bwrap` mode
//! (user, mount, PID, IPC and UTS namespaces as well; see `docs/workspaces.md`) closes
//! those.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub mod cgroup;
pub mod forward;
mod netns;
mod syscalls;

pub use netns::available as network_namespaces;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

/// The launcher's first argument.
pub const LAUNCH: &str = "__confine";

/// The newest Landlock ABI the rules are written for.
const ABI_WANTED: ABI = ABI::V6;

/// How an agent's processes are confined (`confinement` in an agent's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Confinement {
    /// Landlock (file system, TCP ports, signals, abstract sockets), `no_new_privs`, a
    /// minimal environment, no inherited descriptor but stdio.
    Landlock,
    /// Landlock inside `bwrap`: also a mount, PID and IPC namespace. The default where
    /// bwrap works.
    Bwrap,
    /// None: the agent runs as the daemon's user with the daemon's environment (less the
    /// daemon's own variables: its token, its configuration) and its own `env`.
    None,
}

impl Confinement {
    pub fn as_str(self) -> &'static str {
        match self {
            Confinement::Landlock => "landlock",
            Confinement::Bwrap => "bwrap",
            Confinement::None => "none",
        }
    }
}

/// What an agent's config adds to a confined agent's reach (`[agents.sandbox]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sandbox {
    /// Read and execute (a toolchain, the agent's own install).
    pub read: Vec<PathBuf>,
    /// Read and write, besides the workspace and the agent home.
    pub write: Vec<PathBuf>,
    /// Ports on the host's loopback the agent may connect to (a model server of the
    /// operator's, say): each is forwarded into the agent's own network. Other hosts are
    /// reached through a model relay or the egress proxy.
    pub connect: Vec<u16>,
    /// TCP ports the agent may bind.
    pub bind: Vec<u16>,
    /// Memory, processes and CPU of each agent process (its control group).
    pub limits: cgroup::Limits,
}

/// Whether an agent started with `confinement` calls `setsid` itself (the launcher does,
/// so it must not be started as a process group's leader).
pub fn starts_own_session(confinement: Confinement) -> bool {
    confinement != Confinement::None
}

/// What a confined agent may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Read and execute, beneath each.
    pub read: Vec<PathBuf>,
    /// Read, write, create, remove, beneath each.
    pub write: Vec<PathBuf>,
    /// Device files read and written (`/dev/null`, ...).
    pub devices: Vec<PathBuf>,
    /// TCP ports the agent may connect to (any address).
    pub connect: Vec<u16>,
    /// TCP ports the agent may bind.
    pub bind: Vec<u16>,
    /// Whether the agent may listen: it has ports to bind, or a network of its own (the
    /// system-call filter refuses `listen` otherwise, see `syscalls.rs`).
    #[serde(default)]
    pub listen: bool,
    /// The `cgroup.procs` files the launcher joins before anything else.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
    /// Only join the groups and start the program (the outer step before `bwrap`, whose
    /// inner launcher confines).
    #[serde(default)]
    pub join_only: bool,
    /// In a network namespace of its own: the loopback ports forwarded to the daemon.
    #[serde(default)]
    pub forward: Option<forward::Forward>,
    /// The launcher makes the network namespace itself (`landlock`; `bwrap` makes its own).
    #[serde(default)]
    pub own_network: bool,
}

/// What the running kernel enforces of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Support {
    /// File system rules (Landlock ABI 1).
    pub filesystem: bool,
    /// TCP port rules (ABI 4).
    pub network: bool,
    /// Signal and abstract-socket scoping (ABI 6).
    pub scope: bool,
}

/// Asks the kernel what Landlock enforces, without restricting this process.
pub fn support() -> Support {
    let creates =
        |ruleset: Result<Ruleset, landlock::RulesetError>| ruleset.and_then(|r| r.create()).is_ok();
    let hard = || Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    Support {
        filesystem: creates(hard().handle_access(AccessFs::from_all(ABI::V1))),
        network: creates(hard().handle_access(AccessNet::from_all(ABI::V4))),
        scope: creates(hard().scope(Scope::from_all(ABI::V6))),
    }
}

/// The confinement an agent gets for its `confinement` setting (`None`: the default,
/// `bwrap` where it works on this machine, else `landlock`), or why it cannot be had.
pub fn in_force(choice: Option<Confinement>) -> Result<Confinement, String> {
    let wanted = choice.unwrap_or_else(|| {
        if bwrap_works() {
            Confinement::Bwrap
        } else {
            Confinement::Landlock
        }
    });
    if wanted == Confinement::None {
        return Ok(wanted);
    }
    let support = support();
    if !support.filesystem {
        return Err(
            "the kernel does not enforce Landlock; set confinement = \"none\" to run the agent unconfined"
                .to_owned(),
        );
    }
    if !support.network || !support.scope {
        return Err(
            "the kernel's Landlock lacks TCP port rules (ABI 4) or signal scoping (ABI 6), so an agent could reach the daemon's ports or signal it; set confinement = \"none\" to run it unconfined"
                .to_owned(),
        );
    }
    if wanted == Confinement::Bwrap && bwrap_program().is_none() {
        return Err("confinement \"bwrap\" needs bwrap (Debian: bubblewrap)".to_owned());
    }
    Ok(wanted)
}

/// The system's paths an agent reads and executes: programs, libraries, configuration,
/// and `/proc` and `/sys` (another process's entries there stay closed: see the module
/// doc). Only those that exist.
pub fn system_read_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = [
        "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc",
        "/sys",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect();
    // `/etc/resolv.conf` and friends are often links into `/run`: name resolution needs
    // their targets.
    for link in ["/etc/resolv.conf", "/etc/hosts", "/etc/localtime"] {
        if let Ok(target) = std::fs::canonicalize(link)
            && !paths.iter().any(|p| target.starts_with(p))
        {
            paths.push(target);
        }
    }
    paths
}

/// The host's own secrets under the system's readable paths, those that exist: password
/// hashes, sudo rules, SSH host keys (readable to an agent of a root daemon otherwise).
pub fn host_secrets() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = [
        "/etc/shadow",
        "/etc/shadow-",
        "/etc/gshadow",
        "/etc/gshadow-",
        "/etc/sudoers",
        "/etc/sudoers.d",
        "/etc/ssl/private",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
        paths.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with("_key")),
        );
    }
    // Only those that exist: a missing one would take out its parent (see `carve`).
    paths.retain(|p| p.exists());
    paths
}

/// The device files an agent reads and writes.
pub fn system_devices() -> Vec<PathBuf> {
    [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect()
}

/// `roots` without `secrets`: a root that holds a secret is replaced by its entries,
/// recursively, leaving the secret (and only it) out; a root inside a secret is dropped.
/// Paths are compared canonicalized; a secret that does not exist (yet) is taken out by
/// its nearest existing ancestor, so it cannot appear later inside a granted directory;
/// `/` is never taken as a secret.
pub fn carve(roots: &[PathBuf], secrets: &[PathBuf]) -> Vec<PathBuf> {
    let secrets: Vec<PathBuf> = secrets
        .iter()
        .filter_map(|s| s.ancestors().find_map(|a| std::fs::canonicalize(a).ok()))
        .filter(|s| s.parent().is_some())
        .collect();
    let mut out = Vec::new();
    for root in roots {
        carve_one(root, &secrets, &mut out, 0);
    }
    out
}

fn carve_one(root: &Path, secrets: &[PathBuf], out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(real) = std::fs::canonicalize(root) else {
        return;
    };
    if secrets.iter().any(|s| real.starts_with(s)) {
        return;
    }
    if !secrets.iter().any(|s| s.starts_with(&real)) {
        out.push(root.to_owned());
        return;
    }
    // A secret lies beneath: grant the entries beside its path instead (bounded depth: a
    // secret is never deeper than a path's component count).
    let Ok(entries) = std::fs::read_dir(&real) else {
        return;
    };
    if depth > 64 {
        return;
    }
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        carve_one(&child, secrets, out, depth + 1);
    }
}

/// The launcher command for `program args` under `policy`: `(launcher, its arguments)`.
pub fn launch_command(
    launcher: &Path,
    policy: &Policy,
    program: &str,
    args: &[String],
) -> Result<(PathBuf, Vec<String>), String> {
    let policy = serde_json::to_string(policy).map_err(|e| format!("confinement policy: {e}"))?;
    let mut words = vec![
        LAUNCH.to_owned(),
        policy,
        "--".to_owned(),
        program.to_owned(),
    ];
    words.extend(args.iter().cloned());
    Ok((launcher.to_owned(), words))
}

/// Whether `bwrap` is installed and can make its namespaces here (asked once: it starts
/// `true` in them).
pub fn bwrap_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let Some(bwrap) = bwrap_program() else {
            return false;
        };
        let truth = ["/usr/bin/true", "/bin/true"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("/bin/true");
        std::process::Command::new(bwrap)
            .args([
                "--unshare-user",
                "--unshare-net",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--die-with-parent",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                truth,
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// `bwrap`, when installed.
pub fn bwrap_program() -> Option<PathBuf> {
    ["/usr/bin/bwrap", "/usr/local/bin/bwrap"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// `bwrap`'s arguments for `policy` (the command follows them after `--`): new user,
/// network, mount, PID, IPC and UTS namespaces; the system read-only with fresh `/dev`,
/// `/proc`, `/tmp` and `/run`; what the fresh `/tmp` and `/run` hide of `launcher` and the
/// policy's readable paths bound back read-only; each secret hidden (an empty directory, or `/dev/null` for a file); the
/// policy's writable paths bound back on top. Landlock applies inside as well.
pub fn bwrap_args(policy: &Policy, secrets: &[PathBuf], launcher: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // `/run` holds the host's sockets (D-Bus, systemd, container engines), which pass
    // Landlock: a fresh one, the readable paths in it bound back.
    if Path::new("/run").is_dir() {
        args.extend(["--tmpfs".to_owned(), "/run".to_owned()]);
    }
    let text = |p: &Path| p.display().to_string();
    // A daemon or an agent run from a build under `/tmp` must still find its programs, and
    // name resolution its files under `/run`.
    let hidden = std::iter::once(launcher)
        .chain(policy.read.iter().map(PathBuf::as_path))
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.starts_with("/tmp") || p.starts_with("/run"));
    for path in hidden {
        args.extend(["--ro-bind".to_owned(), text(&path), text(&path)]);
    }
    // A secret named relative to the daemon's directory (`--config agui.toml`) is hidden
    // at its absolute path: `bwrap` refuses a relative mount point.
    let secrets = secrets
        .iter()
        .filter_map(|s| std::path::absolute(s).ok())
        .filter(|s| s.parent().is_some());
    for secret in secrets {
        if secret.is_dir() {
            args.extend(["--tmpfs".to_owned(), text(&secret)]);
        } else if secret.exists() {
            args.extend([
                "--ro-bind".to_owned(),
                "/dev/null".to_owned(),
                text(&secret),
            ]);
        }
    }
    for path in &policy.write {
        args.extend(["--bind".to_owned(), text(path), text(path)]);
    }
    args
}

/// The launcher's body (`agui-serve __confine POLICY -- PROGRAM ARGS...`, the arguments
/// after `__confine`): confines this process and `exec`s the program. Returns only on
/// failure, with why; the caller exits with status 126.
pub fn launch(args: Vec<OsString>) -> String {
    let mut args = args.into_iter();
    let Some(policy) = args.next().and_then(|p| p.into_string().ok()) else {
        return "the confinement policy is missing".to_owned();
    };
    let policy: Policy = match serde_json::from_str(&policy) {
        Ok(policy) => policy,
        Err(error) => return format!("the confinement policy is invalid: {error}"),
    };
    if args.next().is_none_or(|dash| dash != "--") {
        return "expected -- before the program".to_owned();
    }
    let Some(program) = args.next() else {
        return "the program is missing".to_owned();
    };
    if let Err(error) = cgroup::join(&policy.cgroups) {
        return error;
    }
    close_inherited();
    // A session of its own: no controlling terminal of the daemon's to type into (the
    // daemon started it as no group's leader for this; the session is its process group).
    if let Err(error) = nix::unistd::setsid() {
        return format!("cannot start a session: {error}");
    }
    use std::os::unix::process::CommandExt;
    if policy.join_only {
        // (bwrap's inner launcher still needs the forwarding key.)
        let error = std::process::Command::new(&program).args(args).exec();
        return format!("cannot start {}: {error}", Path::new(&program).display());
    }
    if policy.own_network
        && let Err(error) = netns::enter()
    {
        return error;
    }
    // The forwarder before the capabilities go: a port below 1024 in the agent's own
    // network namespace needs the namespace's capability to bind.
    if let Some(forward) = &policy.forward
        && let Err(error) = forward::start(forward)
    {
        return error;
    }
    if let Err(error) = drop_capabilities() {
        return error;
    }
    if let Err(error) = restrict(&policy) {
        return error;
    }
    let filter = syscalls::Filter {
        listen: policy.listen,
    };
    if let Err(error) = filter.install() {
        return error;
    }
    // The forwarding key is the forwarder's alone.
    let error = std::process::Command::new(&program)
        .args(args)
        .env_remove(forward::KEY_ENV)
        .exec();
    format!("cannot start {}: {error}", Path::new(&program).display())
}

/// Closes every descriptor above stderr (the daemon marks its own close-on-exec; this
/// also covers one a library leaked).
fn close_inherited() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is among them and already closed: EBADF.
        let _ = nix::unistd::close(fd);
    }
}

/// Gives up every capability, for good: a launcher running as root would otherwise pass
/// them to the agent (`CAP_SYS_PTRACE` reads another process's `/proc` entries past
/// Landlock, `CAP_SYS_ADMIN` mounts). The bounding set goes first, so an `exec` as root
/// cannot get them back. A process without capabilities has nothing to drop.
fn drop_capabilities() -> Result<(), String> {
    use caps::CapSet;
    let held = caps::read(None, CapSet::Permitted)
        .map_err(|e| format!("cannot read the capabilities: {e}"))?;
    if held.is_empty() {
        return Ok(());
    }
    for set in [
        CapSet::Bounding,
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| format!("cannot drop the capabilities: {e}"))?;
    }
    Ok(())
}

/// Applies `policy` to this process (and what it will exec). Fails unless the kernel
/// enforces the file system rules; TCP and scope rules apply where the kernel has them.
fn restrict(policy: &Policy) -> Result<(), String> {
    let fail = |e: landlock::RulesetError| format!("cannot confine the agent: {e}");
    let read = AccessFs::from_read(ABI_WANTED);
    let all = AccessFs::from_all(ABI_WANTED);
    let device = AccessFs::from_file(ABI_WANTED) & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(fail)?
        .handle_access(AccessNet::from_all(ABI_WANTED))
        .map_err(fail)?
        .scope(Scope::from_all(ABI_WANTED))
        .map_err(fail)?
        .create()
        .map_err(fail)?;
    let grants = [
        (&policy.read, read),
        (&policy.write, all),
        (&policy.devices, device),
    ];
    for (paths, access) in grants {
        for path in paths {
            // A path that vanished since the policy was made grants nothing.
            let Ok(fd) = PathFd::new(path) else { continue };
            let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(ABI_WANTED)
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(fail)?;
        }
    }
    for port in &policy.connect {
        ruleset = ruleset
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(fail)?;
    }
    for port in &policy.bind {
        ruleset = ruleset
            .add_rule(NetPort::new(*port, AccessNet::BindTcp))
            .map_err(fail)?;
    }
    let status = ruleset.restrict_self().map_err(fail)?;
    if status.ruleset == RulesetStatus::NotEnforced || !status.no_new_privs {
        return Err("the kernel does not enforce Landlock: the agent is not started".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agui-carve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_root_holding_a_secret_is_granted_around_it() {
        let root = dir("around");
        for path in ["a/secret", "a/other", "b"] {
            std::fs::create_dir_all(root.join(path)).expect("mkdir");
        }
        std::fs::write(root.join("a/file"), "x").expect("write");
        let granted = carve(std::slice::from_ref(&root), &[root.join("a/secret")]);
        let mut names: Vec<String> = granted
            .iter()
            .map(|p| p.strip_prefix(&root).expect("under").display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["a/file", "a/other", "b"]);
        // No secret beneath: the root itself; inside a secret: nothing.
        assert_eq!(
            carve(
                std::slice::from_ref(&root),
                &[PathBuf::from("/nonexistent")]
            ),
            std::slice::from_ref(&root)
        );
        assert!(carve(&[root.join("a/secret")], &[root.join("a")]).is_empty());
        // A secret not made yet is taken out by its nearest existing ancestor.
        let granted = carve(std::slice::from_ref(&root), &[root.join("b/later/key")]);
        let mut names: Vec<String> = granted
            .iter()
            .map(|p| p.strip_prefix(&root).expect("under").display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["a"]);
        // `/` as a secret (a daemon whose HOME is `/`) takes nothing away.
        assert_eq!(carve(std::slice::from_ref(&root), &["/".into()]), [root]);
    }

    #[test]
    fn a_secret_named_relative_to_the_daemon_s_directory_is_hidden_at_its_absolute_path() {
        let here = std::env::current_dir().expect("cwd");
        let name = format!("agui-relative-secret-{}.toml", std::process::id());
        std::fs::write(here.join(&name), "token = 'x'").expect("write");
        let args = bwrap_args(
            &Policy::default(),
            &[PathBuf::from(&name)],
            Path::new("/bin/x"),
        );
        std::fs::remove_file(here.join(&name)).expect("remove");
        let at = args
            .windows(3)
            .find(|w| w[0] == "--ro-bind" && w[1] == "/dev/null")
            .map(|w| w[2].clone());
        assert_eq!(at, Some(here.join(&name).display().to_string()));
    }

    #[test]
    fn the_launcher_command_round_trips_its_policy() {
        let policy = Policy {
            read: vec!["/usr".into()],
            write: vec!["/w".into()],
            devices: vec!["/dev/null".into()],
            connect: vec![443],
            bind: Vec::new(),
            listen: false,
            cgroups: Vec::new(),
            join_only: false,
            forward: None,
            own_network: true,
        };
        let (program, args) = launch_command(
            Path::new("/bin/agui-serve"),
            &policy,
            "agent",
            &["-x".into()],
        )
        .expect("command");
        assert_eq!(program, Path::new("/bin/agui-serve"));
        assert_eq!(args[0], LAUNCH);
        assert_eq!(
            serde_json::from_str::<Policy>(&args[1]).expect("policy"),
            policy
        );
        assert_eq!(&args[2..], ["--", "agent", "-x"]);
    }
}
