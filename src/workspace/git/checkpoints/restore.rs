//! Putting a workspace back as a checkpoint holds it: the checkpoint's files and symlinks
//! written back, everything else removed. Nothing is followed: a symlink where a directory
//! or file of the checkpoint belongs is removed, never written through. The thread's agent
//! is stopped first (the caller's part), so nothing races the writes.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::OFlag;

use super::Checkpoints;
use crate::workspace::WorkspaceError;
use crate::workspace::tree::{TREE_ENTRIES, Tree, remove_tree};

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
        remove_unrecorded(&tree, &recorded)?;
        let contents = self.blobs(&repo, &recorded)?;
        let mut written = 0;
        for (entry, content) in recorded.values().zip(contents) {
            if write_entry(&tree, entry, &content)? {
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
        remove_tree(&tree.path(&rel))?;
    }
    Ok(())
}

/// Writes one entry back unless it is already as recorded; whether it was written.
fn write_entry(tree: &Tree, entry: &Recorded, content: &[u8]) -> Result<bool, WorkspaceError> {
    let path = tree.path(&entry.path);
    make_parents(tree, &entry.path)?;
    let symlink = entry.mode == 0o120000;
    let current = fs::symlink_metadata(&path).ok();
    if let Some(meta) = &current {
        let same_kind = if symlink {
            meta.file_type().is_symlink()
        } else {
            meta.is_file() && (meta.permissions().mode() & 0o111 != 0) == (entry.mode & 0o111 != 0)
        };
        if same_kind && unchanged(tree, &path, symlink, content) {
            return Ok(false);
        }
        remove_tree(&path)?;
    }
    if symlink {
        std::os::unix::fs::symlink(OsStr::from_bytes(content), &path)?;
        return Ok(true);
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if entry.mode & 0o111 != 0 {
            0o755
        } else {
            0o644
        })
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&path)?;
    file.write_all(content)?;
    Ok(true)
}

/// Whether the entry at `path` already holds `content`.
fn unchanged(tree: &Tree, path: &Path, symlink: bool, content: &[u8]) -> bool {
    if symlink {
        return fs::read_link(path).is_ok_and(|target| target.as_os_str().as_bytes() == content);
    }
    let Ok(file) = tree.open(path, false) else {
        return false;
    };
    let mut now = Vec::with_capacity(content.len());
    file.take(content.len() as u64 + 1)
        .read_to_end(&mut now)
        .is_ok_and(|_| now == content)
}

/// Makes the directories above `rel`, each a real directory: whatever else stands there
/// (a file, a symlink) is removed first.
fn make_parents(tree: &Tree, rel: &Path) -> Result<(), WorkspaceError> {
    let mut at = PathBuf::new();
    let parents: Vec<_> = rel
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    for component in parents {
        at.push(component);
        let path = tree.path(&at);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => remove_tree(&path)?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err.into()),
        }
        fs::create_dir(&path)?;
    }
    Ok(())
}
