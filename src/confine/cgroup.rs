//! A control group per agent process, with memory, process-count and CPU limits, so one
//! principal's agent cannot take the machine from the others.
//!
//! The daemon makes the group (cgroup v2 where it was delegated a subtree, as systemd's
//! `Delegate=yes` does; else the v1 `memory`, `pids` and `cpu` hierarchies where they are
//! mounted and writable), the launcher joins it before anything of the agent runs (so no
//! child is forked outside it), and the daemon reads its counters when the agent exits to
//! say which limit it hit, then removes it. A few files per controller: written here
//! rather than with a crate whose systemd and D-Bus support the daemon does not use.
//!
//! Where neither version is writable, agents run without limits and the daemon says so at
//! start and in `check-config` ([`status`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

/// An agent process's limits (`[agents.sandbox] limits = {...}`); each has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Memory of the agent and everything it starts, in MiB.
    pub memory_mib: u64,
    /// Processes and threads, together.
    pub pids: u64,
    /// CPU time, in percent of one core (50: half of one, 200: two).
    pub cpu_percent: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_mib: 2048,
            pids: 512,
            cpu_percent: 100,
        }
    }
}

/// The hierarchy agents' groups are made in.
#[derive(Debug, Clone)]
enum Hierarchy {
    /// One directory with the three controllers enabled for its children.
    V2(PathBuf),
    /// One directory per controller: memory, pids, cpu.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
    },
}

/// Where the daemon makes its agents' groups, found (and prepared) once.
fn hierarchy() -> &'static Result<Hierarchy, String> {
    static FOUND: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    FOUND.get_or_init(find)
}

/// What limits agents would get on this host, asked without making or moving anything
/// (for the start-up warning and `check-config`): `Ok` names the version, `Err` says why
/// none.
pub fn status() -> Result<&'static str, String> {
    let writable = |dir: &Path| {
        nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
            .map_err(|e| format!("{} is not writable by the daemon: {e}", dir.display()))
    };
    match locate()? {
        Place::V2(own) => writable(&own).map(|()| "cgroup v2"),
        Place::V1(parents) => {
            for parent in &parents {
                writable(parent)?;
            }
            Ok("cgroup v1")
        }
    }
}

/// This process's group in each hierarchy: `(controllers, path)` from `/proc/self/cgroup`.
fn own_groups() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            Some((controllers.to_owned(), path.to_owned()))
        })
        .collect()
}

/// Where the daemon's own groups are: its v2 group, or its v1 memory, pids and cpu groups.
enum Place {
    V2(PathBuf),
    V1([PathBuf; 3]),
}

const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

fn locate() -> Result<Place, String> {
    let root = Path::new("/sys/fs/cgroup");
    let groups = own_groups();
    if root.join("cgroup.controllers").exists()
        && let Some((_, path)) = groups.iter().find(|(c, _)| c.is_empty())
    {
        return Ok(Place::V2(root.join(path.trim_start_matches('/'))));
    }
    let dir_of = |controller: &str| -> Result<PathBuf, String> {
        let (mount, path) = groups
            .iter()
            .find(|(c, _)| c.split(',').any(|c| c == controller))
            .ok_or_else(|| {
                format!("no cgroup v2 delegation and no cgroup v1 {controller} controller")
            })?;
        Ok(root.join(mount).join(path.trim_start_matches('/')))
    };
    Ok(Place::V1([
        dir_of(V1_CONTROLLERS[0])?,
        dir_of(V1_CONTROLLERS[1])?,
        dir_of(V1_CONTROLLERS[2])?,
    ]))
}

fn find() -> Result<Hierarchy, String> {
    let parents = match locate()? {
        Place::V2(own) => return delegated_v2(&own),
        Place::V1(parents) => parents,
    };
    let [memory, pids, cpu] = parents.map(|parent| {
        remove_stale(&parent);
        let dir = parent.join(format!("agui-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map(|()| dir.clone())
            .map_err(|e| format!("cannot make {}: {e}", dir.display()))
    });
    Ok(Hierarchy::V1 {
        memory: memory?,
        pids: pids?,
        cpu: cpu?,
    })
}

/// Removes the v1 groups under `parent` of daemons no longer running (`agui-serve-PID`
/// with their agents' groups, empty once their processes are gone).
fn remove_stale(parent: &Path) {
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("agui-serve-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        for agent in std::fs::read_dir(entry.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if agent.path().is_dir() {
                let _ = std::fs::remove_dir(agent.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// Prepares the delegated v2 group `own`: the daemon moves into a leaf of its own (a group
/// with controllers for its children may hold no process), then the three controllers are
/// enabled for the agents' groups beside it.
fn delegated_v2(own: &Path) -> Result<Hierarchy, String> {
    let fail = |what: &str, e: std::io::Error| {
        format!(
            "cgroup v2 {} is not delegated to the daemon ({what}: {e})",
            own.display()
        )
    };
    let leaf = own.join("daemon");
    std::fs::create_dir_all(&leaf).map_err(|e| fail("mkdir", e))?;
    std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| fail("moving the daemon", e))?;
    std::fs::write(own.join("cgroup.subtree_control"), "+memory +pids +cpu")
        .map_err(|e| fail("enabling memory, pids, cpu", e))?;
    Ok(Hierarchy::V2(own.to_owned()))
}

/// A control file and the value written to it.
type Setting = (PathBuf, String);

/// One agent process's group; removed when dropped (once the process is gone).
#[derive(Debug)]
pub struct Cgroup {
    /// The group's directory in each hierarchy (one for v2).
    dirs: Vec<PathBuf>,
    limits: Limits,
}

impl Cgroup {
    /// Makes a group with `limits`, or says why none can be had.
    pub fn create(limits: Limits) -> Result<Cgroup, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("agent-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let hierarchy = hierarchy().as_ref().map_err(Clone::clone)?;
        let memory = (limits.memory_mib.saturating_mul(1 << 20)).to_string();
        let period: u64 = 100_000;
        let quota = limits.cpu_percent.max(1) * period / 100;
        let pids = limits.pids.max(1).to_string();
        // Each: the group's directories, its limits, and its swap limit (memory and swap
        // together at the memory limit), written where the kernel accounts swap.
        let (dirs, files, swap): (Vec<PathBuf>, Vec<Setting>, Setting) = match hierarchy {
            Hierarchy::V2(base) => {
                let dir = base.join(&name);
                let files = vec![
                    (dir.join("memory.max"), memory),
                    (dir.join("pids.max"), pids),
                    (dir.join("cpu.max"), format!("{quota} {period}")),
                ];
                let swap = (dir.join("memory.swap.max"), "0".to_owned());
                (vec![dir], files, swap)
            }
            Hierarchy::V1 {
                memory: m,
                pids: p,
                cpu: c,
            } => {
                let (m, p, c) = (m.join(&name), p.join(&name), c.join(&name));
                let swap = (m.join("memory.memsw.limit_in_bytes"), memory.clone());
                let files = vec![
                    (m.join("memory.limit_in_bytes"), memory),
                    (p.join("pids.max"), pids),
                    (c.join("cpu.cfs_period_us"), period.to_string()),
                    (c.join("cpu.cfs_quota_us"), quota.to_string()),
                ];
                (vec![m, p, c], files, swap)
            }
        };
        let group = Cgroup { dirs, limits };
        for dir in &group.dirs {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        }
        let swap = swap.0.exists().then_some(swap);
        for (file, value) in files.into_iter().chain(swap) {
            std::fs::write(&file, &value)
                .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        }
        Ok(group)
    }

    /// The files the launcher writes its pid to, to join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Whether process `pid` is in the group.
    pub fn holds(&self, pid: i32) -> bool {
        self.dirs.first().is_some_and(|dir| {
            std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .any(|line| line.trim().parse() == Ok(pid))
        })
    }

    /// Kills every process left in the group (one that left the agent's process group
    /// with `setsid` included): v2 kills it whole at once; v1 is asked until it is empty
    /// (forks meanwhile are bounded by its `pids`).
    pub fn kill_all(&self) {
        let Some(dir) = self.dirs.first() else {
            return;
        };
        if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for _ in 0..20 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The processes of the group the kernel killed at its memory limit.
    pub fn oom_kills(&self) -> u64 {
        self.counter(&["memory.events", "memory.oom_control"], "oom_kill ")
    }

    /// The forks the kernel refused at the group's process limit.
    pub fn forks_refused(&self) -> u64 {
        self.counter(&["pids.events"], "max ")
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Which limit the group hit, if any, in words.
    pub fn breach(&self) -> Option<String> {
        if self.oom_kills() > 0 {
            return Some(format!(
                "the agent hit its memory limit ({} MiB) and was killed",
                self.limits.memory_mib
            ));
        }
        let forks = self.forks_refused();
        (forks > 0).then(|| {
            format!(
                "the agent hit its process limit ({}): {forks} forks refused",
                self.limits.pids
            )
        })
    }

    /// The value after `key` in the first of `files` the group has (0 if none).
    fn counter(&self, files: &[&str], key: &str) -> u64 {
        let Some(file) = files
            .iter()
            .flat_map(|name| self.dirs.iter().map(move |d| d.join(name)))
            .find(|f| f.exists())
        else {
            return 0;
        };
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // Fails while a process is left in it; the stop kills the group first.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The launcher's part: moves this process into each group of `procs` (the files
/// [`Cgroup::procs_files`] named), before anything of the agent runs.
pub(super) fn join(procs: &[PathBuf]) -> Result<(), String> {
    for file in procs {
        std::fs::write(file, std::process::id().to_string())
            .map_err(|e| format!("cannot join the agent's cgroup {}: {e}", file.display()))?;
    }
    Ok(())
}
