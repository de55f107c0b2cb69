//! Workspaces: the working directory each thread of an ACP agent runs in.
//!
//! Every thread gets a directory of its own (with [`Unit::Principal`], all threads of a
//! principal share one), made from the agent's [`Source`] before the agent's first
//! `session/new` and passed as that session's `cwd`. Its path is a pure function of agent,
//! principal and thread ([`Workspaces::dir_for`]), or the spare workspace the thread
//! adopted ([`Workspaces::resolve`]), so a restarted daemon finds the same directory again; a fork copies it ([`Workspaces::fork`]) and deleting the thread removes
//! it ([`Workspaces::remove`]). Under the configured root:
//!
//! ```text
//! <root>/<agent>/<principal>/threads/<thread>        a workspace (Unit::Thread)
//! <root>/<agent>/<principal>/threads/<thread>.base   its base commit, for a git source
//! <root>/<agent>/<principal>/shared                  the workspace of Unit::Principal
//! <root>/<agent>/<principal>/threads/.<thread>.*     a workspace being built, or a leftover
//! <root>/<agent>/<principal>/threads/_spare.<hex>    a workspace made ahead of its thread
//! <root>/<agent>/<principal>/threads/<thread>.at     the spare workspace the thread adopted
//! ```
//!
//! A thread whose agent session was made ahead (a spare, `spare.rs`) keeps the workspace
//! made for that session: [`Workspaces::resolve`] finds it from the thread's record.
//!
//! Principal and thread names become single path segments: up to 32 characters of
//! `[A-Za-z0-9._-]` from the name (never a leading `.` or `-`), then `-` and the first 16
//! bytes of the SHA-256 of the exact name in hex, so distinct names never share a directory.
//! The empty principal (the operator) is `_operator`, which no hashed name can be.
//!
//! Collaborators: the runtime prepares, forks and removes workspaces as threads come and go,
//! and compares [`usage`] with the quota; the HTTP layer serves [`list`], [`read`] and
//! [`Workspaces::changes`]; a turn takes a [`Snapshot`] before it starts and asks it
//! afterwards which files changed. For git sources `git` runs as a child process.
//!
//! Everything under a principal directory is in reach of that principal's agent, so nothing
//! read from there is trusted: paths are resolved beneath the canonical workspace and files
//! opened with `O_NOFOLLOW` (and, where `/proc` is mounted, checked again through the open
//! descriptor), trees are walked without following symlinks, a base file yields a commit id
//! and nothing else, and git runs with the repository's own record of a worktree
//! (`--git-dir`) instead of the `.git` file inside it, with submodules ignored.
//!
//! Not here: the agent's sandbox (giving its process access to the principal directory),
//! enforcing the quota (only measured here), and anything async: every function does blocking
//! std I/O and runs child processes to completion, so callers put it on
//! `tokio::task::spawn_blocking`.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

mod compare;
mod git;
mod spare;
mod tree;

pub use compare::{FileChange, Snapshot};
pub use git::checkpoints::{Checkpoint, CheckpointChange, Checkpoints, Listed};
pub use git::protected_paths as git_protected_paths;
pub use tree::{Entry, EntryKind, list, read, usage};

/// What a new workspace is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An empty directory.
    Empty,
    /// A copy of this directory: files with their permissions, directories, symlinks as
    /// symlinks.
    Template(PathBuf),
    /// A `git worktree` of this repository on a branch of its own (`agui/ws-<hash>`), checked
    /// out at `reference` (HEAD when `None`).
    Git {
        repo: PathBuf,
        reference: Option<String>,
    },
}

impl Source {
    /// `"empty"`, `"template:/abs/dir"`, `"git:/abs/repo"` or `"git:/abs/repo@REF"`. The ref
    /// is what follows the last `@`, so a repository path with an `@` in it needs an explicit
    /// ref (`git:/srv/a@b/repo@HEAD`). Relative paths are refused.
    pub fn parse(text: &str) -> Result<Source, String> {
        if text == "empty" {
            return Ok(Source::Empty);
        }
        if let Some(path) = text.strip_prefix("template:") {
            return Ok(Source::Template(absolute_source_path("template", path)?));
        }
        if let Some(rest) = text.strip_prefix("git:") {
            let (path, reference) = match rest.rsplit_once('@') {
                Some((path, reference)) => (path, Some(check_reference(reference)?)),
                None => (rest, None),
            };
            let repo = absolute_source_path("git", path)?;
            return Ok(Source::Git { repo, reference });
        }
        Err(format!(
            "unknown workspace source {text:?}: expected \"empty\", \"template:/path\" or \
             \"git:/path[@ref]\""
        ))
    }
}

impl FromStr for Source {
    type Err = String;

    fn from_str(text: &str) -> Result<Source, String> {
        Source::parse(text)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Empty => f.write_str("empty"),
            Source::Template(dir) => write!(f, "template:{}", dir.display()),
            Source::Git { repo, reference } => {
                write!(f, "git:{}", repo.display())?;
                match reference {
                    Some(reference) => write!(f, "@{reference}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Who shares a workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// One workspace per thread.
    #[default]
    Thread,
    /// One workspace for all of a principal's threads.
    Principal,
}

/// One agent's `[agents.workspace]`.
#[derive(Clone, Debug)]
pub struct WorkspaceConfig {
    pub source: Source,
    /// Where the agent's workspaces live (the caller supplies `<data dir>/workspaces` when
    /// the operator gives none).
    pub root: PathBuf,
    /// Bytes a workspace may use; `None` is no quota.
    pub quota: Option<u64>,
    pub unit: Unit,
    /// How many turns' checkpoints each thread keeps, the newest (`checkpoints`; 0: none
    /// are taken, and nothing can be rewound).
    pub checkpoints: usize,
}

/// The turns' checkpoints a thread keeps unless its agent says otherwise.
pub const DEFAULT_CHECKPOINTS: usize = 100;

/// The workspaces of one agent.
#[derive(Clone, Debug)]
pub struct Workspaces {
    agent: String,
    config: WorkspaceConfig,
    /// Where each thread's checkpoints are kept, when they are.
    checkpoints: Option<Checkpoints>,
}

/// What changed in a workspace against its source.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Changes {
    /// `"git"`, `"template"` or `"empty"`.
    pub base: String,
    /// Sorted by path.
    pub files: Vec<ChangedFile>,
    /// A unified diff (git and template sources), at most the `max_diff` bytes asked for.
    pub diff: Option<String>,
    /// Whether `diff` was cut at `max_diff` bytes.
    pub truncated: bool,
}

/// One file of [`Changes`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChangedFile {
    /// Relative, `/`-separated.
    pub path: String,
    /// `"added"`, `"modified"` or `"deleted"`.
    pub status: String,
    /// Its size now; for a deleted file, its size in the source.
    pub size: u64,
    /// Lines added and removed; `None` when not known (binary, a symlink, or over the cap of
    /// text read).
    pub added: Option<u64>,
    pub removed: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A path refused: absolute, with `..` or a NUL, leading outside the workspace through
    /// a symlink, a symlink where a workspace should be, or the wrong kind of file (reading
    /// a directory is this, not `NotFound`). The message says which.
    #[error("bad path: {0}")]
    BadPath(String),
    /// The workspace, or the path asked for in it, does not exist.
    #[error("not found")]
    NotFound,
    /// A file over the cap asked for.
    #[error("the file is {size} bytes; at most {cap} can be read")]
    TooLarge { size: u64, cap: u64 },
    /// A walk met more entries than it may visit; nothing past them was counted.
    #[error("more than {cap} entries")]
    TooManyEntries { cap: u64 },
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// Git could not be run or failed (its stderr), or a worktree's records are not right.
    #[error("git: {0}")]
    Git(String),
}

impl Workspaces {
    pub fn new(agent: &str, config: WorkspaceConfig) -> Workspaces {
        Workspaces {
            agent: agent.to_owned(),
            config,
            checkpoints: None,
        }
    }

    /// The same, keeping each thread's checkpoints under `root` (a directory of the
    /// daemon's, out of every agent's reach).
    pub fn with_checkpoints(mut self, root: &Path) -> Workspaces {
        self.checkpoints = Some(Checkpoints::new(root));
        self
    }

    /// Where each thread's checkpoints are kept: only a workspace of its own is
    /// checkpointed (one a principal's threads share is not a thread's to put back).
    pub fn checkpoints(&self) -> Option<&Checkpoints> {
        (self.config.unit == Unit::Thread && self.config.checkpoints > 0)
            .then_some(self.checkpoints.as_ref())
            .flatten()
    }

    pub fn config(&self) -> &WorkspaceConfig {
        &self.config
    }

    /// The directory every workspace of `principal` lives under:
    /// `<root>/<agent>/<principal-dir>`. (The agent process of that principal gets
    /// read-write access to it.) An agent name that is already a plain path segment (the
    /// configuration allows no other) is used as it is.
    pub fn principal_dir(&self, principal: &str) -> PathBuf {
        let agent = if plain_segment(&self.agent) {
            self.agent.clone()
        } else {
            name_segment(&self.agent)
        };
        self.config.root.join(agent).join(name_segment(principal))
    }

    /// The workspace of one thread: for [`Unit::Thread`] `<principal_dir>/threads/<thread-dir>`,
    /// for [`Unit::Principal`] `<principal_dir>/shared`.
    pub fn dir_for(&self, principal: &str, thread: &str) -> PathBuf {
        let principal_dir = self.principal_dir(principal);
        match self.config.unit {
            Unit::Thread => principal_dir.join("threads").join(name_segment(thread)),
            Unit::Principal => principal_dir.join("shared"),
        }
    }

    /// Makes the workspace from the source unless it is there already. A copy is built
    /// beside it under a temporary name and renamed into place; a git worktree counts as
    /// made once its base file is written (last), and a half-made one is discarded and
    /// made again.
    pub fn prepare(&self, dir: &Path) -> Result<(), WorkspaceError> {
        refuse_symlinked_parent(dir)?;
        match &self.config.source {
            Source::Empty => build(dir, |_| Ok(())),
            Source::Template(template) => {
                let template = tree::Tree::template(template)?;
                build(dir, |part| tree::copy_tree(&template, part, false))
            }
            Source::Git { repo, reference } => git::prepare(repo, reference.as_deref(), dir),
        }
    }

    /// A fork's workspace: a copy of `from` (its current files) at `to`; for a git source a
    /// new worktree on its own branch starting from `from`'s HEAD with `from`'s working files
    /// copied over it, keeping `from`'s base commit. Nothing is done when `to` is made
    /// already (or is `from`, as with [`Unit::Principal`]); `from` missing is `NotFound`.
    pub fn fork(&self, from: &Path, to: &Path) -> Result<(), WorkspaceError> {
        if from == to {
            return Ok(());
        }
        refuse_symlinked_parent(to)?;
        let source = tree::Tree::workspace(from)?;
        let worktree = git::base_path(from).is_some_and(|base| base.exists());
        match &self.config.source {
            Source::Git { repo, .. } if worktree => git::fork(repo, &source, from, to),
            _ => build(to, |part| tree::copy_tree(&source, part, worktree)),
        }
    }

    /// Removes a workspace and what belongs to it; absent is fine. For a git source the
    /// directory is deleted, the repository's record of the worktree pruned
    /// (`git worktree prune`) and its branch deleted. With [`Unit::Principal`] the one
    /// directory serves every thread of the principal: remove it only with the principal.
    pub fn remove(&self, dir: &Path) -> Result<(), WorkspaceError> {
        refuse_symlinked_parent(dir)?;
        sweep_parts(dir);
        match &self.config.source {
            Source::Git { repo, .. } => git::remove(repo, dir),
            _ => {
                tree::remove_tree(dir)?;
                if let Some(base) = git::base_path(dir) {
                    tree::remove_tree(&base)?;
                }
                Ok(())
            }
        }
    }

    /// What changed against the source. Git: `git diff` against the base commit (numstat
    /// and name-status) plus untracked files, and the unified diff. Template: files added,
    /// modified and removed compared with the template directory (a file of the same size
    /// and mtime as the template's counts as unchanged; others are compared byte by byte),
    /// with a unified diff of the text files. Empty: every file as added. A `.git` at the
    /// top is left out. The diff is at most `max_diff` bytes, `truncated` saying when cut.
    pub fn changes(&self, dir: &Path, max_diff: usize) -> Result<Changes, WorkspaceError> {
        let workspace = tree::Tree::workspace(dir)?;
        match &self.config.source {
            Source::Git { repo, .. } => git::changes(repo, &workspace, dir, max_diff),
            Source::Template(template) => {
                let template = tree::Tree::template(template)?;
                compare::template_changes(&workspace, &template, max_diff)
            }
            Source::Empty => compare::empty_changes(&workspace),
        }
    }

    /// Whether the workspace `dir` and the agent home `home` (where its agent also writes)
    /// use more than the quota together (never without one). The quota fails closed: a
    /// tree that cannot be measured (too large to walk, a directory the agent made
    /// unreadable) counts as over; one not made yet counts as empty.
    pub fn over_quota(&self, dir: &Path, home: Option<&Path>) -> bool {
        let Some(quota) = self.config.quota else {
            return false;
        };
        let mut used: u64 = 0;
        for tree in std::iter::once(dir).chain(home) {
            match usage(tree) {
                Ok(bytes) => used = used.saturating_add(bytes),
                Err(WorkspaceError::NotFound) => {}
                Err(_) => return true,
            }
        }
        used > quota
    }
}

/// The segment of the operator, the empty principal.
const OPERATOR_SEGMENT: &str = "_operator";
/// The most characters of a name kept readable in its segment.
const READABLE_PREFIX: usize = 32;

/// `name` as one path segment, deterministic and without collisions (see the module doc).
pub fn name_segment(name: &str) -> String {
    if name.is_empty() {
        return OPERATOR_SEGMENT.to_owned();
    }
    let readable: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .skip_while(|c| matches!(c, '.' | '-'))
        .take(READABLE_PREFIX)
        .collect();
    let readable = if readable.is_empty() { "_" } else { &readable };
    format!("{readable}-{}", crate::hex::short_hash(name.as_bytes()))
}

/// Whether `name` can be a path segment as it is.
fn plain_segment(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn absolute_source_path(kind: &str, path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err(format!("the {kind} path is empty"));
    }
    if path.contains('\0') {
        return Err(format!("the {kind} path contains a NUL byte"));
    }
    if !Path::new(path).is_absolute() {
        return Err(format!(
            "the {kind} path {path:?} is relative; an absolute path is needed"
        ));
    }
    Ok(PathBuf::from(path))
}

fn check_reference(reference: &str) -> Result<String, String> {
    if reference.is_empty() {
        return Err("the git ref after '@' is empty".to_owned());
    }
    if reference.starts_with('-') {
        return Err(format!("the git ref {reference:?} starts with '-'"));
    }
    if reference
        .chars()
        .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(format!(
            "the git ref {reference:?} has a space or control character"
        ));
    }
    Ok(reference.to_owned())
}

/// The agent can write in the directory holding a workspace, so it could swap that for a
/// symlink; nothing is made, removed or read through one.
fn refuse_symlinked_parent(dir: &Path) -> Result<(), WorkspaceError> {
    let Some(parent) = dir.parent() else {
        return Err(WorkspaceError::BadPath(
            "the workspace directory has no parent".to_owned(),
        ));
    };
    match fs::symlink_metadata(parent) {
        Ok(meta) if meta.file_type().is_symlink() => Err(WorkspaceError::BadPath(
            "the parent of the workspace directory is a symlink".to_owned(),
        )),
        _ => Ok(()),
    }
}

/// Whether `dir` is a directory already; a symlink or a file there is refused.
fn made_dir(dir: &Path) -> Result<bool, WorkspaceError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(meta) if meta.file_type().is_symlink() => Err(WorkspaceError::BadPath(
            "the workspace directory is a symlink".to_owned(),
        )),
        Ok(_) => Err(WorkspaceError::BadPath(
            "the workspace path is not a directory".to_owned(),
        )),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Makes `dir` unless it exists: `fill` populates a fresh directory beside it, which is then
/// renamed into place, so `dir` is either absent or whole.
fn build(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), WorkspaceError>,
) -> Result<(), WorkspaceError> {
    if made_dir(dir)? {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    sweep_parts(dir);
    let part = part_path(dir, "part")?;
    fs::create_dir(&part)?;
    let built = fill(&part).and_then(|()| fs::rename(&part, dir).map_err(WorkspaceError::from));
    if let Err(err) = built {
        // Best effort: a leftover is swept by a later process.
        let _ = tree::remove_tree(&part);
        // Another call may have made it meanwhile.
        return match made_dir(dir) {
            Ok(true) => Ok(()),
            _ => Err(err),
        };
    }
    Ok(())
}

/// A fresh name beside `dir` for something being built: `.<name>.<tag>-<process>-<n>`.
fn part_path(dir: &Path, tag: &str) -> Result<PathBuf, WorkspaceError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(WorkspaceError::BadPath(
            "the workspace directory has no name".to_owned(),
        ));
    };
    let mut part = OsString::from(".");
    part.push(name);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    part.push(format!(".{tag}-{}-{n}", process_token()));
    Ok(parent.join(part))
}

/// Tells this process's temporary names from those a crashed one left (a pid alone repeats
/// across restarts in a container).
fn process_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        format!("p{:x}t{nanos:x}", std::process::id())
    })
}

/// Removes what other processes left half-built beside `dir`; errors are ignored.
fn sweep_parts(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return;
    };
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let fields: Vec<&str> = rest.split('-').collect();
        let leftover = matches!(fields.as_slice(), [tag, token, n]
            if ["part", "base"].contains(tag)
                && *token != process_token()
                && n.bytes().all(|b| b.is_ascii_digit()));
        if leftover {
            let _ = tree::remove_tree(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests;
