//! Git sources: a worktree per workspace on a branch of its own, its base commit in a file
//! beside it, and what changed since.
//!
//! The worktree's own `.git` file and the base file are in the agent's reach, so neither
//! tells where the repository is: that is the configured one. Git runs inside a worktree
//! only with `--git-dir` set to the repository's record of it (found by its `gitdir`), with
//! submodules, external diff drivers and text conversion off.
//!
//! Git never runs a program an agent could have written: the repository may be in an
//! agent's `sandbox.write`, so its hooks and config are the agent's to plant. Every git
//! command here gets, on its command line (which outranks every config file), hooks from
//! an empty place, no fsmonitor, pager, editor, askpass, credential helper, external diff,
//! automatic gc or transport, and each filter driver the repository's config names
//! emptied; a repository whose config includes another file is refused, since what an
//! include pulls in cannot be seen ahead ([`Neutral`]).

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::compare::{self, DiffText};
use super::tree::{self, Content, TEXT_TOTAL_CAP, Tree};
use super::{ChangedFile, Changes, WorkspaceError};

pub(super) mod checkpoints;
mod neutral;
pub(super) use neutral::Neutral;
pub use neutral::protected_paths;

/// The file beside `dir` that records its base commit: `<dir>.base`.
pub(super) fn base_path(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?;
    let mut base = name.to_os_string();
    base.push(".base");
    Some(dir.with_file_name(base))
}

/// Makes the worktree `dir` at `reference` unless it is made (see `made`).
pub(super) fn prepare(
    repo: &Path,
    reference: Option<&str>,
    dir: &Path,
) -> Result<(), WorkspaceError> {
    if made(dir)? {
        return Ok(());
    }
    let dir = std::path::absolute(dir)?;
    let repo = Repo::open(repo)?;
    let commit = resolve_commit(&repo, reference.unwrap_or("HEAD"))?;
    add_worktree(&repo, &dir, &commit)?;
    write_base(&dir, &commit)
}

/// A fork of the worktree `from` (made): a new worktree at `to` from `from`'s HEAD, its
/// files replaced by `from`'s, with `from`'s base commit.
pub(super) fn fork(
    repo: &Path,
    source: &Tree,
    from: &Path,
    to: &Path,
) -> Result<(), WorkspaceError> {
    if made(to)? {
        return Ok(());
    }
    let from = std::path::absolute(from)?;
    let to = std::path::absolute(to)?;
    let repo = Repo::open(repo)?;
    let admin = admin_dir(&repo, &from)?;
    let head = stdout_line(run(
        in_worktree(&admin, &from).args(["rev-parse", "--verify", "HEAD^{commit}"]),
        "rev-parse HEAD",
    )?);
    let base = read_base(&from)?.unwrap_or_else(|| head.clone());
    add_worktree(&repo, &to, &head)?;
    let filled = replace_files(source, &to);
    if filled.is_err() {
        let _ = discard(&repo, &to);
    }
    filled?;
    write_base(&to, &base)
}

/// Deletes the worktree `dir`, prunes the repository's record of it, deletes its branch and
/// its base file; absent parts are fine.
pub(super) fn remove(repo: &Path, dir: &Path) -> Result<(), WorkspaceError> {
    let dir = std::path::absolute(dir)?;
    discard(&Repo::open(repo)?, &dir)?;
    if let Some(base) = base_path(&dir) {
        tree::remove_tree(&base)?;
    }
    Ok(())
}

/// Changes of the worktree `dir` against its base commit.
pub(super) fn changes(
    repo: &Path,
    workspace: &Tree,
    dir: &Path,
    max_diff: usize,
) -> Result<Changes, WorkspaceError> {
    let dir = std::path::absolute(dir)?;
    let base = read_base(&dir)?.ok_or_else(|| {
        WorkspaceError::Git("no base commit is recorded for this workspace".to_owned())
    })?;
    let admin = admin_dir(&Repo::open(repo)?, &dir)?;
    let mut files = tracked_changes(&admin, &dir, workspace, &base)?;
    let mut diff = DiffText::new(max_diff);
    let (text, cut) = run_capped(diff_command(&admin, &dir, &base, &["--no-color"]), max_diff)?;
    diff.push(&String::from_utf8_lossy(&text));
    if cut {
        diff.cut();
    }
    files.extend(untracked_changes(&admin, &dir, workspace, &mut diff)?);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let (text, truncated) = diff.finish();
    Ok(Changes {
        base: "git".to_owned(),
        files,
        diff: Some(text),
        truncated,
    })
}

/// `git diff` against the base, tree to working files, without anything configurable
/// running: no submodule walks, external drivers or text conversion.
const DIFF_ARGS: [&str; 5] = [
    "diff",
    "--no-renames",
    "--ignore-submodules=all",
    "--no-ext-diff",
    "--no-textconv",
];

fn diff_command(admin: &Admin, dir: &Path, base: &str, extra: &[&str]) -> Command {
    let mut cmd = in_worktree(admin, dir);
    cmd.args(DIFF_ARGS).args(extra).arg(base).arg("--");
    cmd
}

/// Tracked files that differ from the base: status and line counts from git, sizes from
/// the workspace (and, for deleted files, from the base).
fn tracked_changes(
    admin: &Admin,
    dir: &Path,
    workspace: &Tree,
    base: &str,
) -> Result<Vec<ChangedFile>, WorkspaceError> {
    let statuses = run(
        &mut diff_command(admin, dir, base, &["--name-status", "-z"]),
        "diff --name-status",
    )?;
    let numstat = run(
        &mut diff_command(admin, dir, base, &["--numstat", "-z"]),
        "diff --numstat",
    )?;
    let counts = parse_numstat(&numstat);
    let mut files = Vec::new();
    let mut deleted = Vec::new();
    for (status, path) in parse_name_status(&statuses) {
        let (added, removed) = counts.get(path).copied().unwrap_or((None, None));
        if status == "deleted" {
            deleted.push(files.len());
        }
        let size = fs::symlink_metadata(workspace.path(Path::new(OsStr::from_bytes(path))))
            .map_or(0, |meta| meta.len());
        files.push(changed_file(path, status, size, added, removed));
    }
    if !deleted.is_empty() {
        let sizes = base_sizes(admin, dir, base)?;
        for index in deleted {
            let file = &mut files[index];
            file.size = sizes.get(file.path.as_bytes()).copied().unwrap_or(0);
        }
    }
    Ok(files)
}

/// Untracked files (not ignored) as added, their text appended to `diff` as new files.
fn untracked_changes(
    admin: &Admin,
    dir: &Path,
    workspace: &Tree,
    diff: &mut DiffText,
) -> Result<Vec<ChangedFile>, WorkspaceError> {
    let untracked = run(
        in_worktree(admin, dir).args(["ls-files", "--others", "--exclude-standard", "-z"]),
        "ls-files --others",
    )?;
    let mut budget = TEXT_TOTAL_CAP;
    let mut files = Vec::new();
    for path in untracked.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let rel = Path::new(OsStr::from_bytes(path));
        let meta = fs::symlink_metadata(workspace.path(rel));
        let size = meta.as_ref().map_or(0, |meta| meta.len());
        let content = match meta {
            Ok(meta) if meta.is_file() => workspace.content(rel, size, &mut budget),
            _ => Content::Unknown,
        };
        let lines = content.text().map(tree::line_count);
        if let (Some(text), false) = (content.text(), diff.full()) {
            let name = String::from_utf8_lossy(path);
            diff.push(&compare::unified("", text, &name, "added"));
        }
        files.push(changed_file(path, "added", size, lines, lines.map(|_| 0)));
    }
    Ok(files)
}

/// Whether the worktree `dir` is made: its base file is written last. A directory without
/// one is half-made when it is empty or holds a worktree's `.git` file; any other (made from
/// another source before the configuration changed) is kept as it is.
fn made(dir: &Path) -> Result<bool, WorkspaceError> {
    if !super::made_dir(dir)? {
        return Ok(false);
    }
    if base_path(dir).is_some_and(|base| base.exists()) {
        return Ok(true);
    }
    let empty = fs::read_dir(dir)?.next().is_none();
    let link = fs::symlink_metadata(dir.join(".git")).is_ok_and(|meta| meta.is_file());
    Ok(!(empty || link))
}

/// Adds the worktree `dir` at `commit` on its branch, first discarding whatever a crash
/// left of an earlier attempt.
fn add_worktree(repo: &Repo, dir: &Path, commit: &str) -> Result<(), WorkspaceError> {
    discard(repo, dir)?;
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut cmd = in_repo(repo);
    cmd.args(["worktree", "add", "--quiet", "-b"])
        .arg(branch(dir))
        .arg(dir)
        .arg(commit);
    run(&mut cmd, "worktree add").map(drop)
}

/// Deletes `dir`, prunes the repository's records of missing worktrees, deletes the branch.
fn discard(repo: &Repo, dir: &Path) -> Result<(), WorkspaceError> {
    tree::remove_tree(dir)?;
    run(in_repo(repo).args(["worktree", "prune"]), "worktree prune")?;
    let branch = branch(dir);
    let exists = in_repo(repo)
        .args(["show-ref", "--verify", "--quiet"])
        .arg(format!("refs/heads/{branch}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(spawn_failed)?;
    if exists.success() {
        run(
            in_repo(repo).args(["branch", "-D"]).arg(&branch),
            "branch -D",
        )?;
    }
    Ok(())
}

/// The branch of the worktree at `dir` (absolute): `agui/ws-<hash of the path>`.
fn branch(dir: &Path) -> String {
    format!(
        "agui/ws-{}",
        crate::hex::short_hash(dir.as_os_str().as_bytes())
    )
}

fn resolve_commit(repo: &Repo, reference: &str) -> Result<String, WorkspaceError> {
    let mut cmd = in_repo(repo);
    cmd.args(["rev-parse", "--verify", "--end-of-options"])
        .arg(format!("{reference}^{{commit}}"));
    let out = run(&mut cmd, &format!("resolving {reference:?}"))?;
    let commit = stdout_line(out);
    if !is_commit_id(&commit) {
        return Err(WorkspaceError::Git(format!(
            "resolving {reference:?}: unexpected output {commit:?}"
        )));
    }
    Ok(commit)
}

/// Writes `<dir>.base` whole or not at all.
fn write_base(dir: &Path, commit: &str) -> Result<(), WorkspaceError> {
    let Some(base) = base_path(dir) else {
        return Err(WorkspaceError::BadPath(
            "the workspace directory has no name".to_owned(),
        ));
    };
    let part = super::part_path(dir, "base")?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&part)?;
    file.write_all(format!("{commit}\n").as_bytes())?;
    file.sync_all()?;
    drop(file);
    fs::rename(&part, &base)?;
    Ok(())
}

/// The base commit recorded beside `dir`, if any; anything but a commit id is refused.
fn read_base(dir: &Path) -> Result<Option<String>, WorkspaceError> {
    let Some(base) = base_path(dir) else {
        return Ok(None);
    };
    let nofollow = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nofollow.bits())
        .open(&base)
    {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    let mut text = String::new();
    file.take(128).read_to_string(&mut text)?;
    let commit = text.trim();
    if !is_commit_id(commit) {
        return Err(WorkspaceError::Git(
            "the recorded base commit is malformed".to_owned(),
        ));
    }
    Ok(Some(commit.to_owned()))
}

fn is_commit_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The repository's administrative directory of the worktree `dir` (absolute):
/// `<common dir>/worktrees/<id>`, the one whose `gitdir` names `dir/.git`.
fn admin_dir(repo: &Repo, dir: &Path) -> Result<Admin, WorkspaceError> {
    let common = std::path::absolute(repo.neutral.common())?;
    let mut wanted = vec![dir.join(".git")];
    if let Ok(real) = fs::canonicalize(dir) {
        wanted.push(real.join(".git"));
    }
    let worktrees = common.join("worktrees");
    for entry in fs::read_dir(&worktrees).into_iter().flatten().flatten() {
        let Ok(gitdir) = fs::read(entry.path().join("gitdir")) else {
            continue;
        };
        let gitdir = gitdir.strip_suffix(b"\n").unwrap_or(&gitdir);
        if wanted
            .iter()
            .any(|want| want.as_os_str().as_bytes() == gitdir)
        {
            return Ok(Admin {
                dir: entry.path(),
                neutral: repo.neutral.clone(),
            });
        }
    }
    Err(WorkspaceError::Git(format!(
        "the workspace is not a worktree of {}",
        repo.path.display()
    )))
}

/// Replaces the files of the new worktree `to` (all but its `.git`) with those of `source`.
fn replace_files(source: &Tree, to: &Path) -> Result<(), WorkspaceError> {
    for entry in fs::read_dir(to)? {
        let entry = entry?;
        if entry.file_name() != ".git" {
            tree::remove_tree(&entry.path())?;
        }
    }
    tree::copy_tree(source, to, true)
}

/// Sizes of the files in the base commit, by path.
fn base_sizes(
    admin: &Admin,
    dir: &Path,
    base: &str,
) -> Result<std::collections::HashMap<Vec<u8>, u64>, WorkspaceError> {
    let out = run(
        in_worktree(admin, dir)
            .args(["ls-tree", "-r", "-l", "-z", "--full-tree"])
            .arg(base),
        "ls-tree",
    )?;
    let mut sizes = std::collections::HashMap::new();
    for record in out.split(|b| *b == 0) {
        let Some(tab) = record.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let size = String::from_utf8_lossy(&record[..tab])
            .split_whitespace()
            .last()
            .and_then(|size| size.parse().ok())
            .unwrap_or(0);
        sizes.insert(record[tab + 1..].to_vec(), size);
    }
    Ok(sizes)
}

/// `--name-status -z`: status letter, NUL, path, NUL, ...
fn parse_name_status(out: &[u8]) -> Vec<(&'static str, &[u8])> {
    let mut fields = out.split(|b| *b == 0);
    let mut entries = Vec::new();
    while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
        let status = match status.first() {
            Some(b'A') => "added",
            Some(b'D') => "deleted",
            Some(_) => "modified",
            None => continue,
        };
        entries.push((status, path));
    }
    entries
}

/// `--numstat -z`: `added TAB removed TAB path NUL` (`-` for a binary file).
fn parse_numstat(out: &[u8]) -> std::collections::HashMap<&[u8], (Option<u64>, Option<u64>)> {
    let mut counts = std::collections::HashMap::new();
    for record in out.split(|b| *b == 0) {
        let mut parts = record.splitn(3, |b| *b == b'\t');
        let (Some(added), Some(removed), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let number = |field: &[u8]| std::str::from_utf8(field).ok()?.parse().ok();
        counts.insert(path, (number(added), number(removed)));
    }
    counts
}

fn changed_file(
    path: &[u8],
    status: &str,
    size: u64,
    added: Option<u64>,
    removed: Option<u64>,
) -> ChangedFile {
    ChangedFile {
        path: String::from_utf8_lossy(path).into_owned(),
        status: status.to_owned(),
        size,
        added,
        removed,
    }
}

/// `git` with a fixed environment: no prompts, untranslated messages, nothing inherited
/// that would point it at another repository or run a program.
fn bare_git() -> Command {
    let mut cmd = Command::new("git");
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .env("GIT_PAGER", "cat")
        .env("GIT_EDITOR", "false")
        .env("GIT_ASKPASS", "false")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .arg("--no-pager")
        .stdin(Stdio::null());
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_EXTERNAL_DIFF",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_PROXY_COMMAND",
        "GIT_ATTR_SOURCE",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The repository `repo`, with the settings that keep git on it from running a program.
struct Repo<'a> {
    path: &'a Path,
    neutral: Neutral,
}

impl Repo<'_> {
    fn open(path: &Path) -> Result<Repo<'_>, WorkspaceError> {
        Ok(Repo {
            path,
            neutral: Neutral::of(path)?,
        })
    }
}

/// A worktree's administrative directory in its repository, and the repository's settings.
struct Admin {
    dir: PathBuf,
    neutral: Neutral,
}

/// Git on the repository, its git directory named outright (no discovery from the path).
fn in_repo(repo: &Repo) -> Command {
    let mut cmd = bare_git();
    repo.neutral.apply(&mut cmd);
    cmd.env("GIT_DIR", repo.neutral.common())
        .current_dir(repo.path);
    cmd
}

/// Git in the worktree `dir` through its administrative directory `admin`.
fn in_worktree(admin: &Admin, dir: &Path) -> Command {
    let mut cmd = bare_git();
    admin.neutral.apply(&mut cmd);
    let mut git_dir = OsString::from("--git-dir=");
    git_dir.push(&admin.dir);
    let mut work_tree = OsString::from("--work-tree=");
    work_tree.push(dir);
    cmd.arg(git_dir)
        .arg(work_tree)
        .args(["-c", "core.quotePath=false"])
        .current_dir(dir);
    cmd
}

/// Runs `cmd` to completion: its stdout, or its stderr as the error.
fn run(cmd: &mut Command, what: &str) -> Result<Vec<u8>, WorkspaceError> {
    let out = cmd.output().map_err(spawn_failed)?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    Err(WorkspaceError::Git(if stderr.is_empty() {
        format!("{what}: {}", out.status)
    } else {
        format!("{what}: {stderr}")
    }))
}

/// Runs `cmd` keeping at most `cap` bytes of its stdout (stopping it there); whether it was
/// cut.
fn run_capped(mut cmd: Command, cap: usize) -> Result<(Vec<u8>, bool), WorkspaceError> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(spawn_failed)?;
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        stdout.take(cap as u64 + 1).read_to_end(&mut out)?;
    }
    let cut = out.len() > cap;
    if cut {
        out.truncate(cap);
        let _ = child.kill();
    }
    let status = child.wait()?;
    if !cut && !status.success() {
        return Err(WorkspaceError::Git(format!("diff: {status}")));
    }
    Ok((out, cut))
}

fn spawn_failed(err: io::Error) -> WorkspaceError {
    WorkspaceError::Git(format!("cannot run git: {err}"))
}

fn stdout_line(out: Vec<u8>) -> String {
    String::from_utf8_lossy(&out).trim().to_owned()
}
