//! How one agent process is started: which pool it belongs to (a principal, and a thread
//! where each thread's workspace is confined on its own), its command line, environment,
//! working directory and, when confined, its [`Policy`].
//!
//! A confined process may write only its workspace (the thread's, or every workspace of
//! its principal) and its principal's agent home (`<data dir>/homes/<agent>/<principal>`,
//! where `HOME` and `TMPDIR` point), read and execute the system's paths and the ones the
//! agent's `sandbox` adds, all without the daemon's secrets ([`crate::confine::carve`]),
//! and connect to the agent's `sandbox.connect` ports and the frontend-tools MCP port.
//! Its environment is a minimal base plus the agent's `env`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::exits::AgentExits;
use super::forward::{self, Forwarding, Route, Ways};
use super::{AcpConfig, McpHost};
use crate::confine::cgroup::Cgroup;
use crate::confine::{self, Confinement, Policy};
use crate::workspace::{Unit, Workspaces};

/// What the daemon lends its agents: where their homes and workspaces live, how to start
/// a confined process, and what they must never read.
#[derive(Debug, Clone)]
pub struct AgentHost {
    pub data_dir: PathBuf,
    /// The executable that confines and starts an agent (the daemon's own).
    pub launcher: PathBuf,
    /// Files and directories no agent may read (the data directory, key and token files).
    pub secrets: Vec<PathBuf>,
    /// Serves the browser's tools to the agent over MCP (`None`: never offered).
    pub mcp: Option<Arc<dyn McpHost>>,
    /// Serves confined agents' egress proxies and model relays (`None`: a confined agent
    /// reaches only its loopback ports).
    pub gateway: Option<Arc<dyn crate::egress::Gateway>>,
    /// Counts their decisions and the tokens their relays read.
    pub egress_metrics: Option<crate::metrics::EgressMetrics>,
}

impl AgentHost {
    /// A host on `data_dir` whose launcher is this executable.
    pub fn new(data_dir: &Path) -> AgentHost {
        AgentHost {
            data_dir: data_dir.to_owned(),
            launcher: std::env::current_exe().unwrap_or_else(|_| "agui-serve".into()),
            secrets: vec![data_dir.to_owned()],
            mcp: None,
            gateway: None,
            egress_metrics: None,
        }
    }
}

/// The pool a process belongs to: no process serves two principals, nor, where each
/// thread's workspace is confined on its own, two threads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PoolKey {
    pub(super) principal: String,
    pub(super) thread: Option<String>,
}

/// The variables a confined agent gets from the daemon's environment (besides `HOME`,
/// `TMPDIR` and the agent's `env`).
const PASSED_ENV: [&str; 6] = ["PATH", "LANG", "LC_ALL", "TZ", "TERM", "USER"];

/// One process to start.
pub(super) struct Launch {
    pub(super) program: PathBuf,
    pub(super) args: Vec<String>,
    /// The whole environment (`None`: the daemon's, as it is).
    pub(super) env: Option<BTreeMap<String, String>>,
    pub(super) cwd: Option<PathBuf>,
    /// The launcher makes its own session (and so its process group); else the daemon
    /// starts the agent in a process group of its own.
    pub(super) own_session: bool,
    /// The control group the launcher joins (confined, where the host has one to give).
    pub(super) cgroup: Option<Arc<Cgroup>>,
    /// The daemon's end of the port forwarder (a network namespace of its own), served
    /// once the process is started.
    pub(super) forward: Option<Forwarding>,
    /// What its relays and proxy report (confined only).
    pub(super) exits: Option<Arc<AgentExits>>,
}

impl Launch {
    /// The command for a process of `key`, confined as `confinement` says (`thread_dir`:
    /// the one workspace a process of a thread's own may write, its thread's or a spare's;
    /// `mcp_port`: the frontend-tools endpoint's, which a confined agent may connect to).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: &AcpConfig,
        host: &AgentHost,
        workspaces: Option<&Workspaces>,
        home: &Path,
        key: &PoolKey,
        thread_dir: Option<&Path>,
        confinement: Confinement,
        mcp_port: Option<u16>,
        exits: Arc<AgentExits>,
    ) -> Result<Launch, String> {
        let (program, args) = config
            .command
            .split_first()
            .ok_or_else(|| "empty command".to_owned())?;
        if confinement == Confinement::None {
            return Ok(Launch {
                program: program.into(),
                args: args.to_vec(),
                env: Some(unconfined_env(config)),
                cwd: config.cwd.clone(),
                own_session: false,
                cgroup: None,
                forward: None,
                exits: None,
            });
        }
        std::fs::create_dir_all(home.join("tmp"))
            .map_err(|e| format!("cannot make the agent home {}: {e}", home.display()))?;
        let writable = writable_dir(config, host, workspaces, key, thread_dir)?;
        std::fs::create_dir_all(&writable)
            .map_err(|e| format!("cannot make {}: {e}", writable.display()))?;
        let mut policy = policy(config, host, &writable, home, program, mcp_port);
        let cgroup = match Cgroup::create(config.sandbox.limits) {
            Ok(group) => Some(Arc::new(group)),
            // Said once at start (`AcpBackend::new`) and by `check-config`.
            Err(why) => {
                tracing::debug!(%why, "agent started without memory, process or CPU limits");
                None
            }
        };
        let mut env = confined_env(config, home);
        let ways = LaunchWays {
            config,
            env: &mut env,
            exits: &exits,
        };
        let forwarding = own_network(host, &mut policy, confinement, cgroup.clone(), ways)?;
        let joins = cgroup.as_ref().map(|g| g.procs_files()).unwrap_or_default();
        let forward_socket = forwarding.as_ref().map(|f| f.path().to_owned());
        let (launcher, words) = confined_command(
            confinement,
            host,
            &policy,
            joins,
            forward_socket.as_deref(),
            program,
            args,
        )?;
        Ok(Launch {
            program: launcher,
            args: words,
            env: Some(env),
            cwd: Some(writable),
            own_session: confine::starts_own_session(confinement),
            cgroup,
            forward: forwarding,
            exits: Some(exits),
        })
    }
}

/// Where the egress proxy listens in an agent's network, or the first free port after it.
const PROXY_PORT: u16 = 3128;
/// Where the first model relay listens, or the first free port after it (the next relay
/// after that).
const RELAY_PORT: u16 = 4180;

/// What the ways out need of the launch: the agent's relays and rules, its environment to
/// tell it where they are, and what they report to.
struct LaunchWays<'a> {
    config: &'a AcpConfig,
    env: &'a mut BTreeMap<String, String>,
    exits: &'a Arc<AgentExits>,
}

/// A network namespace of the agent's own (made by bwrap, or by the launcher): loopback
/// only, where a listening socket reaches no one else; its ports forwarded to the daemon
/// (the daemon's end, when there are any): the host's loopback ports it may reach, the
/// egress proxy (always, so that a refusal is answered, named and counted) and each model
/// relay, whose addresses its environment is given. Under bwrap the daemon's socket is
/// bound into the sandbox's `/tmp`; the launcher's own forwarder reaches it where it is,
/// before Landlock applies.
fn own_network(
    host: &AgentHost,
    policy: &mut Policy,
    confinement: Confinement,
    group: Option<Arc<Cgroup>>,
    ways: LaunchWays<'_>,
) -> Result<Option<Forwarding>, String> {
    policy.listen = true;
    policy.own_network = confinement == Confinement::Landlock;
    let mut routes: HashMap<u16, Route> = policy
        .connect
        .iter()
        .map(|port| (*port, Route::Loopback(*port)))
        .collect();
    let gateway = match (&host.gateway, ways.config.relays.is_empty()) {
        (Some(gateway), _) => Some(gateway.clone()),
        (None, true) => None,
        (None, false) => return Err("model relays need the daemon's gateway".to_owned()),
    };
    if gateway.is_some() {
        let mut taken: BTreeSet<u16> = policy.connect.iter().chain(&policy.bind).copied().collect();
        let mut free = |from: u16| {
            let port = (from..=u16::MAX)
                .find(|p| !taken.contains(p))
                .unwrap_or(from);
            taken.insert(port);
            port
        };
        let proxy = free(PROXY_PORT);
        routes.insert(proxy, Route::Proxy(ways.config.egress.clone()));
        let address = format!("http://127.0.0.1:{proxy}");
        for name in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            ways.env.insert(name.to_owned(), address.clone());
        }
        // The relays and the forwarded ports are on the loopback: not through the proxy.
        for name in ["NO_PROXY", "no_proxy"] {
            ways.env
                .insert(name.to_owned(), "127.0.0.1,localhost,::1".to_owned());
        }
        for relay in &ways.config.relays {
            let port = free(RELAY_PORT);
            routes.insert(port, Route::Relay(relay.clone()));
            ways.env.insert(
                relay.base_url_env.clone(),
                format!("http://127.0.0.1:{port}"),
            );
            if let Some(name) = &relay.placeholder_env {
                ways.env
                    .insert(name.clone(), crate::egress::PLACEHOLDER.to_owned());
            }
        }
    }
    if routes.is_empty() {
        return Ok(None);
    }
    let mut ports: Vec<u16> = routes.keys().copied().collect();
    ports.sort_unstable();
    // Landlock's connect rules name every forwarded port.
    policy.connect = ports.clone();
    let served = gateway.map(|gateway| Ways {
        gateway,
        exits: ways.exits.clone(),
    });
    let forwarding = Forwarding::bind(&host.data_dir.join("run"), routes, served, group)?;
    // The launcher hands it to the forwarder and keeps it from the agent.
    ways.env.insert(
        confine::forward::KEY_ENV.to_owned(),
        forwarding.key().to_owned(),
    );
    let socket = match confinement {
        Confinement::Bwrap => forward::INSIDE.into(),
        _ => forwarding.path().to_owned(),
    };
    policy.forward = Some(confine::forward::Forward { socket, ports });
    Ok(Some(forwarding))
}

/// The directory a confined process of `key` may write and works in: its thread's
/// workspace (`thread_dir`) or its principal's, or (no workspaces) the agent's `cwd` when
/// that holds none of the daemon's secrets.
fn writable_dir(
    config: &AcpConfig,
    host: &AgentHost,
    workspaces: Option<&Workspaces>,
    key: &PoolKey,
    thread_dir: Option<&Path>,
) -> Result<PathBuf, String> {
    let Some(workspaces) = workspaces else {
        let dir = config
            .cwd
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .ok_or_else(|| "no working directory".to_owned())?;
        if confine::carve(std::slice::from_ref(&dir), &host.secrets) != [dir.clone()] {
            return Err(format!(
                "its working directory {} holds or lies in the daemon's data directory, keys or home; give it [agents.workspace] instead",
                dir.display()
            ));
        }
        return Ok(dir);
    };
    Ok(match (thread_dir, workspaces.config().unit) {
        (Some(dir), Unit::Thread) => dir.to_owned(),
        _ => workspaces.principal_dir(&key.principal),
    })
}

/// The daemon's own variables an unconfined agent does not get: its configuration and
/// token (`AGUI_*`), systemd's credentials and notification socket, socket activation.
const DAEMONS_OWN_ENV: [&str; 6] = [
    "CREDENTIALS_DIRECTORY",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
];

/// An unconfined process's environment: the daemon's, less the daemon's own variables
/// ([`DAEMONS_OWN_ENV`] and every `AGUI_*`: the master token among them), then the agent's
/// `env`.
fn unconfined_env(config: &AcpConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| !k.starts_with("AGUI_") && !DAEMONS_OWN_ENV.contains(&k.as_str()))
        .collect();
    env.extend(config.env.clone());
    env
}

/// A confined process's environment: [`PASSED_ENV`] from the daemon's, `HOME` and `TMPDIR`
/// in its agent home, then the agent's `env`.
fn confined_env(config: &AcpConfig, home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for name in PASSED_ENV {
        if let Ok(value) = std::env::var(name) {
            env.insert(name.to_owned(), value);
        }
    }
    env.entry("PATH".to_owned())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
    env.insert("HOME".to_owned(), home.display().to_string());
    env.insert("TMPDIR".to_owned(), home.join("tmp").display().to_string());
    env.extend(config.env.clone());
    env
}

/// The command line that starts `program` under `policy`, joining the control groups
/// `joins` first: the launcher alone, or a launcher that only joins them, then bwrap, then
/// the launcher that confines.
fn confined_command(
    confinement: Confinement,
    host: &AgentHost,
    policy: &Policy,
    joins: Vec<PathBuf>,
    forward_socket: Option<&Path>,
    program: &str,
    args: &[String],
) -> Result<(PathBuf, Vec<String>), String> {
    if confinement != Confinement::Bwrap {
        let policy = Policy {
            cgroups: joins,
            ..policy.clone()
        };
        return confine::launch_command(&host.launcher, &policy, program, args);
    }
    let inner = confine::launch_command(&host.launcher, policy, program, args)?;
    let mut bwrap = confine::bwrap_args(policy, &host.secrets, &host.launcher);
    if let Some(socket) = forward_socket {
        bwrap.extend([
            "--bind".to_owned(),
            socket.display().to_string(),
            forward::INSIDE.to_owned(),
        ]);
    }
    bwrap.push("--".to_owned());
    bwrap.push(inner.0.display().to_string());
    bwrap.extend(inner.1);
    let bwrap_program = confine::bwrap_program().ok_or("bwrap is not installed")?;
    let outer = Policy {
        cgroups: joins,
        join_only: true,
        ..Policy::default()
    };
    confine::launch_command(
        &host.launcher,
        &outer,
        &bwrap_program.display().to_string(),
        &bwrap,
    )
}

/// The rules of a confined process that may write `writable` and `home`.
fn policy(
    config: &AcpConfig,
    host: &AgentHost,
    writable: &Path,
    home: &Path,
    program: &str,
    mcp_port: Option<u16>,
) -> Policy {
    let mut read = confine::system_read_paths();
    read.extend(config.sandbox.read.iter().cloned());
    // A git workspace's objects live in its repository.
    if let Some(crate::workspace::Source::Git { repo, .. }) =
        config.workspace.as_ref().map(|w| &w.source)
    {
        read.push(repo.clone());
    }
    // The agent's own program, wherever it lives (a path, or found on PATH).
    if let Some(found) = resolve(program)
        && let Ok(real) = std::fs::canonicalize(found)
    {
        read.push(real);
    }
    let mut write = vec![writable.to_owned(), home.to_owned()];
    // A git source's repository may be writable (to commit), all but what would make the
    // daemon's own git on it run the agent's code or start others' worktrees elsewhere.
    let mut kept_out = host.secrets.clone();
    if let Some(crate::workspace::Source::Git { repo, .. }) =
        config.workspace.as_ref().map(|w| &w.source)
    {
        kept_out.extend(crate::workspace::git_protected_paths(repo));
    }
    write.extend(confine::carve(&config.sandbox.write, &kept_out));
    let mut connect = config.sandbox.connect.clone();
    connect.extend(mcp_port);
    Policy {
        read: confine::carve(&read, &host.secrets),
        write,
        devices: confine::system_devices(),
        connect,
        bind: config.sandbox.bind.clone(),
        // `listen` binds a port of its own choosing past the bind rule: only an agent
        // given ports to bind may listen at all.
        listen: !config.sandbox.bind.is_empty(),
        cgroups: Vec::new(),
        join_only: false,
        forward: None,
        own_network: false,
    }
}

/// Whether `command` names something that can be started (for `/readyz`).
pub(super) fn startable(command: &[String]) -> bool {
    command
        .first()
        .is_some_and(|program| resolve(program).is_some())
}

/// Where `program` is: itself when it holds a `/`, else the first executable of that name
/// on `PATH`.
pub(super) fn resolve(program: &str) -> Option<std::path::PathBuf> {
    let executable = |path: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return executable(&path).then_some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
}
