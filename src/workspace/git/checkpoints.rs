//! Checkpoints of a workspace: the daemon's own bare repository per thread, under a
//! directory of the daemon's (the data directory, which no agent reaches), never the
//! workspace's `.git`. Written with `git fast-import` alone and read with `diff-tree`:
//! no checkout, no index, no filter, no hook, so nothing in the workspace (a
//! `.gitattributes`, a planted `.git/config`) runs or changes what is recorded. The files
//! are read beneath the workspace without following a symlink (a symlink is recorded as
//! one). Content-addressed: a file unchanged since the last checkpoint adds nothing.

use std::fmt::Write as _;
use std::fs::{self, Metadata};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::{bare_git, parse_name_status, parse_numstat, run, stdout_line};
use crate::workspace::WorkspaceError;
use crate::workspace::tree::{TREE_ENTRIES, Tree};

/// Settings for every git command on a checkpoint repository: nothing of the host's or the
/// user's configuration, and nothing that would run a program.
const SETTINGS: [&str; 6] = [
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.attributesFile=/dev/null",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.quotePath=false",
];

/// How many turns' checkpoints past the number kept accumulate before the oldest are let
/// go (and the store compacted) at once.
pub(in crate::workspace) const PRUNE_SLACK: usize = 10;

/// The largest file a checkpoint records. A larger one is left out (its bytes are not
/// read into memory), and putting a workspace back never removes a file this large: what
/// could not be recorded is not the checkpoint's to take away.
pub(in crate::workspace) const MAX_FILE: u64 = 64 * 1024 * 1024;

/// The checkpoint repositories under one directory, one per thread.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    root: PathBuf,
}

/// One checkpoint recorded: its commit and how many entries it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub commit: String,
    pub entries: usize,
}

/// A checkpoint as listed: its name, when it was recorded and what was said of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub commit: String,
    /// Seconds since the epoch.
    pub at: i64,
    /// The text recorded with it (`record`'s `about`).
    pub about: String,
}

/// A file that differs between two checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointChange {
    /// Relative, `/`-separated.
    pub path: String,
    /// `"added"`, `"modified"` or `"deleted"`.
    pub status: String,
    /// Lines added and removed; `None` for a binary file.
    pub added: Option<u64>,
    pub removed: Option<u64>,
}

impl Checkpoints {
    pub fn new(root: &Path) -> Checkpoints {
        Checkpoints {
            root: root.to_owned(),
        }
    }

    /// The repository of thread `thread` (its key): a name of fixed length whatever the key.
    fn repo(&self, thread: &str) -> PathBuf {
        let digest = Sha256::digest(thread.as_bytes());
        self.root
            .join(format!("{}.git", crate::hex::encode(&digest)))
    }

    fn git(&self, repo: &Path) -> Command {
        let mut cmd = bare_git();
        cmd.env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_DIR", repo)
            .env_remove("HOME");
        for setting in SETTINGS {
            cmd.arg("-c").arg(setting);
        }
        cmd.current_dir(repo);
        cmd
    }

    /// `git ARGS` on `repo`, fed what is written to its standard input (what it says on
    /// its standard error kept for the error).
    fn fed(&self, repo: &Path, args: &[&str]) -> Result<std::process::Child, WorkspaceError> {
        self.git(repo)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| WorkspaceError::Git(format!("cannot run git: {err}")))
    }

    /// The repository of `thread`, made when it is not there yet.
    fn open(&self, thread: &str) -> Result<PathBuf, WorkspaceError> {
        let repo = self.repo(thread);
        if !repo.join("HEAD").is_file() {
            fs::create_dir_all(&repo)?;
            fs::set_permissions(&repo, fs::Permissions::from_mode(0o700))?;
            // `GIT_DIR` names the directory made: `init` makes the repository there.
            run(
                self.git(&repo)
                    .args(["init", "--bare", "--quiet", "--template="]),
                "init",
            )?;
        }
        Ok(repo)
    }

    /// Records the files of workspace `dir` as checkpoint `name` of thread `thread` (a ref
    /// `refs/checkpoints/<name>`, a commit of its own with no parent, so letting go of an
    /// old one frees what only it held), with `about` (one line) said of it; a top-level
    /// `.git` is left out.
    pub fn record(
        &self,
        thread: &str,
        name: &str,
        dir: &Path,
        about: &str,
    ) -> Result<Checkpoint, WorkspaceError> {
        checked_name(name)?;
        let tree = Tree::workspace(dir)?;
        let repo = self.open(thread)?;
        let mut child = self.fed(&repo, &["fast-import", "--quiet", "--done"])?;
        let mut input = child.stdin.take().expect("piped");
        let message = format!("checkpoint {name}\n\n{}\n", about.replace('\n', " "));
        let written = write_stream(&tree, &mut input, name, &message);
        drop(input);
        let out = child.wait_with_output()?;
        let entries = written?;
        succeeded(&out, "fast-import")?;
        let commit = self.resolve(&repo, name)?;
        Ok(Checkpoint { commit, entries })
    }

    /// The commit of checkpoint `name`.
    fn resolve(&self, repo: &Path, name: &str) -> Result<String, WorkspaceError> {
        let out = run(
            self.git(repo)
                .args(["rev-parse", "--verify", "--quiet"])
                .arg(format!("refs/checkpoints/{name}^{{commit}}")),
            "rev-parse",
        )?;
        Ok(stdout_line(out))
    }

    /// The checkpoints of `thread`, oldest first (none: an empty list).
    pub fn list(&self, thread: &str) -> Result<Vec<Listed>, WorkspaceError> {
        let repo = self.repo(thread);
        if !repo.join("HEAD").is_file() {
            return Ok(Vec::new());
        }
        let out = run(
            self.git(&repo).args([
                "for-each-ref",
                "--sort=committerdate",
                "--sort=refname",
                "--format=%(refname:strip=2)%00%(objectname)%00%(committerdate:unix)%00%(contents:body)%00",
                "refs/checkpoints/",
            ]),
            "for-each-ref",
        )?;
        let text = String::from_utf8_lossy(&out);
        let mut fields = text.split('\0').map(|field| field.trim_matches('\n'));
        let mut listed = Vec::new();
        while let (Some(name), Some(commit), Some(at), Some(about)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        {
            if name.is_empty() {
                break;
            }
            listed.push(Listed {
                name: name.to_owned(),
                commit: commit.to_owned(),
                at: at.parse().unwrap_or(0),
                about: about.trim().to_owned(),
            });
        }
        Ok(listed)
    }

    /// What changed from checkpoint `from` to checkpoint `to` of `thread`, with line counts.
    pub fn changes(
        &self,
        thread: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<CheckpointChange>, WorkspaceError> {
        checked_name(from)?;
        checked_name(to)?;
        let repo = self.repo(thread);
        let diff = |format: &str| {
            run(
                self.git(&repo)
                    .args(["diff-tree", "-r", "-z", "--no-renames", format])
                    .arg(format!("refs/checkpoints/{from}"))
                    .arg(format!("refs/checkpoints/{to}")),
                "diff-tree",
            )
        };
        let (statuses, numstat) = (diff("--name-status")?, diff("--numstat")?);
        let counts = parse_numstat(&numstat);
        let out = parse_name_status(&statuses)
            .into_iter()
            .map(|(status, path)| {
                let (added, removed) = counts.get(path).copied().unwrap_or((None, None));
                CheckpointChange {
                    path: String::from_utf8_lossy(path).into_owned(),
                    status: status.to_owned(),
                    added,
                    removed,
                }
            })
            .collect();
        Ok(out)
    }

    /// Lets go of all but the newest `turns` turns' checkpoints of `thread` (a turn's are
    /// the one before it and its `-after`), and of what only they held, once there are
    /// [`PRUNE_SLACK`] more than that (so the store is compacted now and then, not after
    /// every turn). How many turns' were let go.
    pub fn keep_newest(&self, thread: &str, turns: usize) -> Result<usize, WorkspaceError> {
        let listed = self.list(thread)?;
        let names: std::collections::HashSet<&str> =
            listed.iter().map(|l| l.name.as_str()).collect();
        let before: Vec<&str> = listed
            .iter()
            .map(|l| l.name.as_str())
            .filter(|name| !name.ends_with("-after"))
            .collect();
        if before.len() <= turns + PRUNE_SLACK {
            return Ok(0);
        }
        let gone = &before[..before.len() - turns];
        let mut commands = String::new();
        for name in gone {
            let _ = writeln!(commands, "delete refs/checkpoints/{name}");
            let after = format!("{name}-after");
            if names.contains(after.as_str()) {
                let _ = writeln!(commands, "delete refs/checkpoints/{after}");
            }
        }
        let repo = self.repo(thread);
        // A store from before checkpoints stood alone chained them under this ref.
        if self
            .git(&repo)
            .args(["rev-parse", "--verify", "--quiet", "refs/agui/latest"])
            .output()
            .is_ok_and(|out| out.status.success())
        {
            commands.push_str("delete refs/agui/latest\n");
        }
        let mut child = self.fed(&repo, &["update-ref", "--stdin"])?;
        let mut input = child.stdin.take().expect("piped");
        input.write_all(commands.as_bytes())?;
        drop(input);
        succeeded(&child.wait_with_output()?, "update-ref")?;
        run(self.git(&repo).args(["gc", "--prune=now", "--quiet"]), "gc")?;
        Ok(gone.len())
    }

    /// Removes every checkpoint of `thread`.
    pub fn remove(&self, thread: &str) -> std::io::Result<()> {
        match fs::remove_dir_all(self.repo(thread)) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// A fed git command's failure, with what it said.
fn succeeded(out: &std::process::Output, what: &str) -> Result<(), WorkspaceError> {
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(WorkspaceError::Git(format!("{what}: {}", said.trim())))
}

/// A checkpoint's name: letters, digits, `-`, `_` and `.`, not starting with `.`.
fn checked_name(name: &str) -> Result<(), WorkspaceError> {
    let fine = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(WorkspaceError::BadPath(format!(
            "not a checkpoint name: {name:?}"
        )))
    }
}

/// Writes the fast-import stream of `tree` as commit `refs/checkpoints/<name>`: every file
/// and symlink as a blob, then the commit naming them all. The
/// number of entries recorded.
fn write_stream(
    tree: &Tree,
    out: &mut impl Write,
    name: &str,
    message: &str,
) -> Result<usize, WorkspaceError> {
    let mut files: Vec<(Vec<u8>, &'static str, usize)> = Vec::new();
    let mut mark = 0usize;
    tree.walk(TREE_ENTRIES, true, |rel, meta| {
        let Some(mode) = mode_of(meta) else {
            return Ok(());
        };
        let data = if meta.file_type().is_symlink() {
            fs::read_link(tree.path(rel))?
                .as_os_str()
                .as_bytes()
                .to_vec()
        } else {
            if meta.len() > MAX_FILE {
                return Ok(());
            }
            let mut bytes = Vec::new();
            tree.open(&tree.path(rel), false)?
                .take(MAX_FILE + 1)
                .read_to_end(&mut bytes)?;
            if bytes.len() as u64 > MAX_FILE {
                return Ok(());
            }
            bytes
        };
        mark += 1;
        write!(out, "blob\nmark :{mark}\ndata {}\n", data.len())?;
        out.write_all(&data)?;
        out.write_all(b"\n")?;
        files.push((rel.as_os_str().as_bytes().to_vec(), mode, mark));
        Ok(())
    })?;
    let now = crate::clock::now_ms() / 1000;
    let commit = mark + 1;
    write!(
        out,
        "commit refs/checkpoints/{name}\nmark :{commit}\ncommitter agui-serve <agui-serve@localhost> {now} +0000\ndata {}\n{message}",
        message.len()
    )?;
    out.write_all(b"deleteall\n")?;
    for (path, mode, mark) in &files {
        let mut line = format!("M {mode} :{mark} ");
        quote_path(path, &mut line);
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    write!(out, "\ndone\n")?;
    Ok(files.len())
}

/// The git mode of a regular file or symlink; `None` for anything else (a directory is
/// implied by its files; a device or FIFO is not recorded).
fn mode_of(meta: &Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        Some("120000")
    } else if kind.is_file() {
        Some(if meta.permissions().mode() & 0o111 != 0 {
            "100755"
        } else {
            "100644"
        })
    } else {
        None
    }
}

/// `path` as fast-import's C-style quoted string (any byte a name may hold: quotes,
/// backslashes, newlines, control characters and bytes past ASCII as octal escapes).
fn quote_path(path: &[u8], out: &mut String) {
    out.push('"');
    for &byte in path {
        match byte {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(byte)),
            _ => {
                let _ = write!(out, "\\{byte:03o}");
            }
        }
    }
    out.push('"');
}

mod beneath;
mod restore;

#[cfg(test)]
mod tests;
