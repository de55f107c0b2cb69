//! Putting a workspace back as a checkpoint holds it: the checkpoint's files and symlinks
//! written back, everything else removed. Nothing is followed: a symlink where a directory
//! or file of the checkpoint belongs is removed, never written through, and every write
//! and removal is made from a directory handle opened beneath the workspace's
//! (`beneath.rs`), so an agent still at work in it cannot lead one elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use super::Checkpoints;
use super::beneath::{Beneath, Standing, holds, remove_at, standing, write_at};
use crate::workspace::WorkspaceError;
use crate::workspace::tree::{TREE_ENTRIES, Tree};

/// One entry of a checkpoint: its mode, its blob and its path.
struct Recorded {
    mode: u32,
    blob: String,
    path: PathBuf,
}

impl Checkpoints {
    /// Puts workspace `dir` back as checkpoint `name` of `thread` holds it: each file
    /// (content and executable bit) and symlink of the checkpoint, and nothing else (a
    /// top-level `.git` is kept as it is). A file already as recorded is left untouched.
    /// How many entries were written.
    pub fn restore(&self, thread: &str, name: &str, dir: &Path) -> Result<usize, WorkspaceError> {
        super::checked_name(name)?;
        let tree = Tree::workspace(dir)?;
        let repo = self.repo(thread);
        let commit = self.resolve(&repo, name)?;
        let recorded = self.entries(&repo, &commit)?;
        let beneath = Beneath::open(dir)?;
        remove_unrecorded(&tree, &beneath, &recorded)?;
        let contents = self.blobs(&repo, &recorded)?;
        let mut written = 0;
        for (entry, content) in recorded.values().zip(contents) {
            if write_entry(&beneath, entry, &content)? {
                written += 1;
            }
        }
        Ok(written)
    }

    /// The files and symlinks of `commit`, by path.
    fn entries(
        &self,
        repo: &Path,
        commit: &str,
    ) -> Result<BTreeMap<PathBuf, Recorded>, WorkspaceError> {
        let listed = super::run(
            self.git(repo)
                .args(["ls-tree", "-r", "-z", "--full-tree"])
                .arg(commit),
            "ls-tree",
        )?;
        let mut out = BTreeMap::new();
        for record in listed.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let Some(tab) = record.iter().position(|b| *b == b'\t') else {
                continue;
            };
            let (head, path) = (&record[..tab], &record[tab + 1..]);
            let head = String::from_utf8_lossy(head);
            let mut words = head.split(' ');
            let (Some(mode), Some("blob"), Some(blob)) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let path = checked(path)?;
            let mode = u32::from_str_radix(mode, 8)
                .map_err(|_| WorkspaceError::Git(format!("ls-tree: mode {mode}")))?;
            out.insert(
                path.clone(),
                Recorded {
                    mode,
                    blob: blob.to_owned(),
                    path,
                },
            );
        }
        Ok(out)
    }

    /// The content of each entry's blob, in order, read by one `git cat-file --batch`.
    fn blobs(
        &self,
        repo: &Path,
        recorded: &BTreeMap<PathBuf, Recorded>,
    ) -> Result<Vec<Vec<u8>>, WorkspaceError> {
        let mut child = self
            .git(repo)
            .args(["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| WorkspaceError::Git(format!("cannot run git: {err}")))?;
        let mut input = child.stdin.take().expect("piped");
        let names: Vec<String> = recorded.values().map(|r| r.blob.clone()).collect();
        let feeder = std::thread::spawn(move || -> std::io::Result<()> {
            for name in names {
                writeln!(input, "{name}")?;
            }
            Ok(())
        });
        let mut reader = BufReader::new(child.stdout.take().expect("piped"));
        let mut out = Vec::with_capacity(recorded.len());
        for _ in 0..recorded.len() {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            let size: usize = header
                .split_whitespace()
                .nth(2)
                .and_then(|size| size.parse().ok())
                .ok_or_else(|| WorkspaceError::Git(format!("cat-file: {}", header.trim())))?;
            let mut content = vec![0; size + 1];
            reader.read_exact(&mut content)?;
            content.truncate(size);
            out.push(content);
        }
        let _ = feeder.join();
        child.wait()?;
        Ok(out)
    }
}

/// A path of a checkpoint, as a relative path with plain components only.
fn checked(path: &[u8]) -> Result<PathBuf, WorkspaceError> {
    let path = PathBuf::from(OsStr::from_bytes(path));
    let plain = path
        .components()
        .all(|component| matches!(component, Component::Normal(_)));
    if !plain || path.as_os_str().is_empty() {
        return Err(WorkspaceError::BadPath(format!(
            "a checkpoint holds the path {}",
            path.display()
        )));
    }
    Ok(path)
}

/// Removes what the checkpoint does not hold: files and symlinks not in it, directories
/// holding nothing of it, and whatever stands where a directory of it belongs.
fn remove_unrecorded(
    tree: &Tree,
    beneath: &Beneath,
    recorded: &BTreeMap<PathBuf, Recorded>,
) -> Result<(), WorkspaceError> {
    let dirs: BTreeSet<&Path> = recorded
        .keys()
        .flat_map(|path| path.ancestors().skip(1))
        .filter(|dir| !dir.as_os_str().is_empty())
        .collect();
    let mut doomed: Vec<PathBuf> = Vec::new();
    tree.walk(TREE_ENTRIES, true, |rel, meta| {
        if doomed.iter().any(|gone| rel.starts_with(gone)) {
            return Ok(());
        }
        let keep = if meta.is_dir() {
            dirs.contains(rel)
        } else if meta.is_file() && meta.len() > super::MAX_FILE && !dirs.contains(rel) {
            // Too large to have been recorded: not the checkpoint's to remove.
            !recorded.contains_key(rel)
        } else {
            recorded.contains_key(rel) && !dirs.contains(rel)
        };
        if !keep {
            doomed.push(rel.to_owned());
        }
        Ok(())
    })?;
    for rel in doomed {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        // A directory above it that is gone or no directory any more: nothing to remove
        // there (what stands in its place is dealt with as its own entry is written).
        if let Some(dir) = beneath.dir(parent, false)? {
            remove_at(&dir, name)?;
        }
    }
    Ok(())
}

/// Writes one entry back unless it is already as recorded; whether it was written.
fn write_entry(
    beneath: &Beneath,
    entry: &Recorded,
    content: &[u8],
) -> Result<bool, WorkspaceError> {
    let name = entry
        .path
        .file_name()
        .ok_or_else(|| WorkspaceError::BadPath(format!("{}", entry.path.display())))?;
    let parent = entry.path.parent().unwrap_or(Path::new(""));
    let dir = beneath
        .dir(parent, true)?
        .ok_or_else(|| WorkspaceError::BadPath(format!("{}", parent.display())))?;
    let symlink = entry.mode == 0o120000;
    let exec = entry.mode & 0o111 != 0;
    let same_kind = match standing(&dir, name)? {
        Standing::Symlink => symlink,
        Standing::File(executable) => !symlink && executable == exec,
        Standing::Nothing | Standing::Other => false,
    };
    if same_kind && holds(&dir, name, symlink, content) {
        return Ok(false);
    }
    write_at(&dir, name, symlink, exec, content)?;
    Ok(true)
}
