//! Comparing a workspace with what it was: snapshots around a turn, and the changes against
//! a template or an empty source.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use similar::{ChangeTag, TextDiff};

use super::tree::{Content, TEXT_TOTAL_CAP, TREE_ENTRIES, Tree, line_count};
use super::{ChangedFile, Changes, WorkspaceError};

/// How close to a snapshot a file's mtime makes its stamp untrustworthy.
const RACY_WINDOW: Duration = Duration::from_secs(2);
/// How long one line diff may take before it settles for a coarser answer.
const DIFF_TIMEOUT: Duration = Duration::from_millis(500);

/// One file a turn changed, from [`Snapshot::changed`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FileChange {
    /// Relative, `/`-separated.
    pub path: String,
    pub added: u64,
    pub removed: u64,
}

/// Regular files of a workspace before a turn: length, mtime, ctime and inode of each, and
/// the text of each text file (valid UTF-8 without NUL) up to 256 KiB, 16 MiB in all. A
/// `.git` at the top is left out, and so are symlinks and special files.
///
/// [`Snapshot::changed`] reports, sorted by path, each file whose stamp moved (or, for a
/// text file modified within 2 s before the picture, whose text differs) and whose content
/// is not the same: with both texts known, the lines of a line diff; a new file counts its
/// lines as added and a deleted one its old lines as removed. A binary side counts as no
/// lines (binary to binary is listed with 0 and 0). Where a side's text is unknown (over
/// 256 KiB, or past the 16 MiB) a modified file is listed with 0 and 0, and a new or
/// deleted one counts 0 lines. Past 200,000 entries the picture is partial: files beyond it
/// are not compared and not reported as new.
#[derive(Debug, Default)]
pub struct Snapshot {
    files: BTreeMap<Vec<u8>, Seen>,
    complete: bool,
}

impl Snapshot {
    /// A picture of `dir`. A missing workspace is pictured as empty (all its files are new
    /// afterwards); an unreadable one as unknown (nothing is reported new).
    pub fn take(dir: &Path) -> Snapshot {
        let tree = match Tree::workspace(dir) {
            Ok(tree) => tree,
            Err(WorkspaceError::NotFound) => {
                return Snapshot {
                    files: BTreeMap::new(),
                    complete: true,
                };
            }
            Err(_) => return Snapshot::default(),
        };
        let mut budget = TEXT_TOTAL_CAP;
        let mut files = BTreeMap::new();
        let racy_since = SystemTime::now() - RACY_WINDOW;
        let walked = tree.walk(TREE_ENTRIES, true, |rel, meta| {
            if meta.is_file() {
                let content = tree.content(rel, meta.len(), &mut budget);
                let seen = Seen {
                    stamp: Stamp::of(meta),
                    racy: meta.modified().map_or(true, |at| at >= racy_since),
                    content,
                };
                files.insert(rel.as_os_str().as_bytes().to_vec(), seen);
            }
            Ok(())
        });
        Snapshot {
            files,
            complete: walked.is_ok(),
        }
    }

    /// The files changed since the picture was taken (see [`Snapshot`]).
    pub fn changed(&self, dir: &Path) -> Vec<FileChange> {
        let tree = Tree::workspace(dir).ok();
        let mut now = BTreeMap::new();
        let mut complete = true;
        if let Some(tree) = &tree {
            let walked = tree.walk(TREE_ENTRIES, true, |rel, meta| {
                if meta.is_file() {
                    now.insert(rel.as_os_str().as_bytes().to_vec(), meta.clone());
                }
                Ok(())
            });
            complete = walked.is_ok();
        }
        let mut budget = TEXT_TOTAL_CAP;
        let mut out = Vec::new();
        for (key, old) in &self.files {
            let rel = Path::new(OsStr::from_bytes(key));
            let current = match (now.remove(key), &tree) {
                (Some(meta), _) => Some(meta),
                (None, Some(tree)) if !complete => fs::symlink_metadata(tree.path(rel))
                    .ok()
                    .filter(Metadata::is_file),
                _ => None,
            };
            let counts = match (current, &tree) {
                (Some(meta), Some(tree)) if Stamp::of(&meta) != old.stamp => {
                    let new = tree.content(rel, meta.len(), &mut budget);
                    modified_counts(&old.content, &new)
                }
                // The same stamp, but written so close to the picture that a later write
                // could have kept it: compared by content when the text was kept.
                (Some(meta), Some(tree)) if old.racy && old.content.text().is_some() => {
                    let new = tree.content(rel, meta.len(), &mut budget);
                    modified_counts(&old.content, &new)
                }
                (Some(_), _) => None,
                (None, _) => Some((0, old.content.lines().unwrap_or(0))),
            };
            if let Some((added, removed)) = counts {
                out.push(file_change(key, added, removed));
            }
        }
        if let (true, Some(tree)) = (self.complete, &tree) {
            for (key, meta) in now {
                let rel = Path::new(OsStr::from_bytes(&key));
                let lines = tree.content(rel, meta.len(), &mut budget).lines();
                out.push(file_change(&key, lines.unwrap_or(0), 0));
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

/// Changes against a template directory (see [`super::Workspaces::changes`]).
pub(super) fn template_changes(
    workspace: &Tree,
    template: &Tree,
    max_diff: usize,
) -> Result<Changes, WorkspaceError> {
    let mine = files_of(workspace)?;
    let theirs = files_of(template)?;
    let keys: BTreeSet<&Vec<u8>> = mine.keys().chain(theirs.keys()).collect();
    let mut budget = TEXT_TOTAL_CAP;
    let mut diff = DiffText::new(max_diff);
    let mut files = Vec::new();
    for key in keys {
        let rel = Path::new(OsStr::from_bytes(key));
        let path = String::from_utf8_lossy(key);
        let (status, size, old, new) = match (theirs.get(key), mine.get(key)) {
            (None, Some(meta)) => ("added", meta.len(), None, Some(meta)),
            (Some(meta), None) => ("deleted", meta.len(), Some(meta), None),
            (Some(old), Some(new)) => {
                if same_entry(template, workspace, rel, old, new)? {
                    continue;
                }
                ("modified", new.len(), Some(old), Some(new))
            }
            (None, None) => continue,
        };
        let mut text_of = |tree: &Tree, meta: Option<&Metadata>| match meta {
            Some(meta) if meta.is_file() => tree.content(rel, meta.len(), &mut budget),
            Some(_) => Content::Unknown,
            None => Content::Text(String::new()),
        };
        let before = text_of(template, old);
        let after = text_of(workspace, new);
        let counts = match (before.text(), after.text()) {
            (Some(before), Some(after)) => {
                if !diff.full() {
                    diff.push(&unified(before, after, &path, status));
                }
                Some(diff_counts(before, after))
            }
            _ => None,
        };
        files.push(ChangedFile {
            path: path.into_owned(),
            status: status.to_owned(),
            size,
            added: counts.map(|(added, _)| added),
            removed: counts.map(|(_, removed)| removed),
        });
    }
    let (text, truncated) = diff.finish();
    Ok(Changes {
        base: "template".to_owned(),
        files,
        diff: Some(text),
        truncated,
    })
}

/// Every file of the workspace as added (an empty source).
pub(super) fn empty_changes(workspace: &Tree) -> Result<Changes, WorkspaceError> {
    let mut budget = TEXT_TOTAL_CAP;
    let mut files = Vec::new();
    for (key, meta) in files_of(workspace)? {
        let rel = Path::new(OsStr::from_bytes(&key));
        let lines = if meta.is_file() {
            let content = workspace.content(rel, meta.len(), &mut budget);
            content.text().map(line_count)
        } else {
            None
        };
        files.push(ChangedFile {
            path: String::from_utf8_lossy(&key).into_owned(),
            status: "added".to_owned(),
            size: meta.len(),
            added: lines,
            removed: lines.map(|_| 0),
        });
    }
    Ok(Changes {
        base: "empty".to_owned(),
        files,
        diff: None,
        truncated: false,
    })
}

/// The regular files and symlinks of a tree, by relative path, a top `.git` left out.
fn files_of(tree: &Tree) -> Result<BTreeMap<Vec<u8>, Metadata>, WorkspaceError> {
    let mut files = BTreeMap::new();
    tree.walk(TREE_ENTRIES, true, |rel, meta| {
        if meta.is_file() || meta.file_type().is_symlink() {
            files.insert(rel.as_os_str().as_bytes().to_vec(), meta.clone());
        }
        Ok(())
    })?;
    Ok(files)
}

/// Whether `rel` is the same in both trees: symlinks by target; files by size and mtime,
/// or else byte by byte.
fn same_entry(
    a: &Tree,
    b: &Tree,
    rel: &Path,
    a_meta: &Metadata,
    b_meta: &Metadata,
) -> Result<bool, WorkspaceError> {
    let (a_kind, b_kind) = (a_meta.file_type(), b_meta.file_type());
    if a_kind.is_symlink() || b_kind.is_symlink() {
        return Ok(a_kind.is_symlink()
            && b_kind.is_symlink()
            && fs::read_link(a.path(rel)).ok() == fs::read_link(b.path(rel)).ok());
    }
    if a_meta.len() != b_meta.len() {
        return Ok(false);
    }
    if a_meta.mtime() == b_meta.mtime() && a_meta.mtime_nsec() == b_meta.mtime_nsec() {
        return Ok(true);
    }
    let mut a_file = a.open(&a.path(rel), false)?;
    let mut b_file = b.open(&b.path(rel), false)?;
    let (mut a_buf, mut b_buf) = (vec![0; 64 * 1024], vec![0; 64 * 1024]);
    loop {
        let n = read_full(&mut a_file, &mut a_buf)?;
        let m = read_full(&mut b_file, &mut b_buf)?;
        if a_buf[..n] != b_buf[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Lines added and removed from `old` to `new`.
pub(super) fn diff_counts(old: &str, new: &str) -> (u64, u64) {
    let diff = TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old, new);
    let (mut added, mut removed) = (0, 0);
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => added += 1,
            ChangeTag::Delete => removed += 1,
            ChangeTag::Equal => {}
        }
    }
    (added, removed)
}

/// A git-style unified diff of one file.
pub(super) fn unified(old: &str, new: &str, path: &str, status: &str) -> String {
    let diff = TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old, new);
    let a = if status == "added" {
        "/dev/null".to_owned()
    } else {
        format!("a/{path}")
    };
    let b = if status == "deleted" {
        "/dev/null".to_owned()
    } else {
        format!("b/{path}")
    };
    let body = diff.unified_diff().header(&a, &b).to_string();
    format!("diff --git a/{path} b/{path}\n{body}")
}

/// The stamp of a file: what a write or a replacement changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    inode: u64,
}

impl Stamp {
    fn of(meta: &Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
        }
    }
}

#[derive(Debug)]
struct Seen {
    stamp: Stamp,
    /// Modified within [`RACY_WINDOW`] of the picture: timestamps are coarse, so a write
    /// right after it may leave the stamp as it was.
    racy: bool,
    content: Content,
}

/// Lines added and removed in a file whose stamp moved; `None` when its content is the same.
fn modified_counts(old: &Content, new: &Content) -> Option<(u64, u64)> {
    if let (Content::Text(old), Content::Text(new)) = (old, new) {
        return (old != new).then(|| diff_counts(old, new));
    }
    match (old, new) {
        (Content::Text(_), Content::Binary) => old.lines().map(|lines| (0, lines)),
        (Content::Binary, Content::Text(_)) => new.lines().map(|lines| (lines, 0)),
        _ => Some((0, 0)),
    }
}

fn file_change(key: &[u8], added: u64, removed: u64) -> FileChange {
    FileChange {
        path: String::from_utf8_lossy(key).into_owned(),
        added,
        removed,
    }
}

/// A unified diff text growing up to a cap.
pub(super) struct DiffText {
    text: String,
    cap: usize,
    truncated: bool,
}

impl DiffText {
    pub(super) fn new(cap: usize) -> DiffText {
        DiffText {
            text: String::new(),
            cap,
            truncated: false,
        }
    }

    pub(super) fn full(&self) -> bool {
        self.truncated
    }

    /// Appends `piece`, or as much of it as fits (on a character boundary).
    pub(super) fn push(&mut self, piece: &str) {
        if self.truncated {
            return;
        }
        let room = self.cap.saturating_sub(self.text.len());
        if piece.len() <= room {
            self.text.push_str(piece);
            return;
        }
        let mut end = room;
        while !piece.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&piece[..end]);
        self.truncated = true;
    }

    pub(super) fn cut(&mut self) {
        self.truncated = true;
    }

    pub(super) fn finish(self) -> (String, bool) {
        (self.text, self.truncated)
    }
}
